//! An object's state as fleetscope takes it in and keeps it.

use crate::{Json, ObjectKey};

/// One object's state: its identity, its pruned JSON and the values the index finds
/// it by. The one shape of an object from ingest to disk and back: a change carries
/// it into the index, the store writes it (with the revision the index gave it, as
/// `fleetscope_store::ObjectRecord`) and reads it back for a restart, and a Watch
/// moved onto another replica is caught up with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectState {
    /// Identity.
    pub key: ObjectKey,
    /// The pruned object as JSON, with apiVersion and kind: made once, where the
    /// object is taken in or read back, and shared from there by the index, the
    /// event log and the store's replay, never copied again.
    pub json: Json,
    /// metadata.labels.
    pub labels: Vec<(String, String)>,
    /// The uids of metadata.ownerReferences.
    pub owners: Vec<String>,
    /// Values of the configured field indexes, as (JSON path, value).
    pub fields: Vec<(String, String)>,
}

/// An object as a store's record holds it, read where it lies (a snapshot's chunk):
/// what the index makes its object from without an allocation for each part first.
#[derive(Debug, Clone, Copy)]
pub struct StoredView<'a> {
    /// The key's resource type.
    pub resource: &'a str,
    /// The key's cluster.
    pub cluster: &'a str,
    /// The key's namespace; empty for cluster-scoped objects.
    pub namespace: &'a str,
    /// The key's name.
    pub name: &'a str,
    /// The revision of the change that produced this state.
    pub revision: crate::Revision,
    /// The pruned JSON, as text or compressed.
    pub json: StoredJson<'a>,
    /// metadata.labels, as stored.
    pub labels: &'a [(&'a str, &'a str)],
    /// The uids of metadata.ownerReferences.
    pub owners: &'a [&'a str],
    /// Values of the configured field indexes, as (JSON path, value).
    pub fields: &'a [(&'a str, &'a str)],
}

/// An object's JSON as a record holds it.
#[derive(Debug, Clone, Copy)]
pub enum StoredJson<'a> {
    /// As text.
    Text(&'a str),
    /// Compressed against `dictionary` (the record's, for the object's type); `len`
    /// is the text's length ([`crate::PackedJson::stored`]).
    Packed {
        /// The dictionary.
        dictionary: &'a std::sync::Arc<[u8]>,
        /// The text's length.
        len: u32,
        /// The compressed bytes.
        bytes: &'a [u8],
    },
}

/// Objects a store has read and verified, held as it stores them, in key order, each
/// key once: visited in place.
pub trait StoredRun: Send + Sync + std::fmt::Debug {
    /// How many objects it holds.
    fn len(&self) -> usize;

    /// Whether it holds none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `each` with every object, in key order.
    fn visit(&self, each: &mut dyn FnMut(&StoredView<'_>));
}
