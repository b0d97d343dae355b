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
