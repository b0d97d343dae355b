//! fleetscope's persistence: every object of the index, each stream's resourceVersion,
//! the event log, the global revision and the set of clusters, so a restart serves at
//! once and resumes every watch without listing.
//!
//! Entry points:
//! - [`SledStore::open`]: opens (or creates) a data directory, holding its lock, and
//!   loads and verifies what it holds. A store that fails verification or has an
//!   unknown schema is moved aside and replaced by an empty one; it is never served.
//! - [`MemoryStore`]: the same contract in memory, with a switch that makes writes fail.
//! - [`Store::commit`]: one [`Batch`] applied atomically and durably: the objects,
//!   events and stream resourceVersions it carries are on disk together or not at all.
//!
//! Nothing else in fleetscope touches sled.

mod codec;
mod memory;
mod sled_store;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;

use fleetscope_model::{ClusterName, EventType, ObjectKey, ResourceType, Revision};

pub use codec::DecodeError;
pub use memory::MemoryStore;
pub use sled_store::{Opened, SledStore};

/// The layout version this build reads and writes.
pub const SCHEMA_VERSION: u64 = 1;

/// One object as stored: what the index needs to rebuild it without parsing the JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    /// Identity.
    pub key: ObjectKey,
    /// The revision of the change that produced this state.
    pub revision: Revision,
    /// The pruned object as JSON.
    pub json: String,
    /// metadata.labels.
    pub labels: Vec<(String, String)>,
    /// The uids of metadata.ownerReferences.
    pub owners: Vec<String>,
    /// Values of the configured field indexes, as (JSON path, value).
    pub fields: Vec<(String, String)>,
}

/// One event of the log, for resuming watches across restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// The revision the change was given.
    pub revision: Revision,
    /// What happened.
    pub kind: EventType,
    /// The object after the change; for a delete, its last state.
    pub object: ObjectRecord,
    /// The object before the change, when a filter needs it to see the transition.
    pub prev: Option<ObjectRecord>,
}

/// Where one stream (a resource type in a cluster) can resume its watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    /// The cluster.
    pub cluster: ClusterName,
    /// The resource type.
    pub resource: ResourceType,
    /// The cluster resourceVersion the stored objects are current to.
    pub resource_version: String,
}

/// Everything a store holds, verified.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The last revision applied.
    pub revision: Revision,
    /// Every object, in key order.
    pub objects: Vec<ObjectRecord>,
    /// The retained event log, in revision order.
    pub events: Vec<EventRecord>,
    /// Every stream that completed a list.
    pub streams: Vec<StreamRecord>,
    /// The clusters configured when the store was last written.
    pub clusters: Vec<ClusterName>,
    /// The field-index paths the stored objects' field values were read for.
    pub field_indexes: Option<Vec<String>>,
}

/// One atomic write: the effect of one or more applied index batches.
#[derive(Debug, Default)]
pub struct Batch {
    /// The revision the store is at after this batch.
    pub revision: Revision,
    /// Objects created or changed.
    pub upserts: Vec<ObjectRecord>,
    /// Objects deleted.
    pub deletes: Vec<ObjectKey>,
    /// Events to add to the log.
    pub events: Vec<EventRecord>,
    /// Revisions of logged events to drop (the log's trimmed head).
    pub drop_events: Range<u64>,
    /// Streams' new resume points.
    pub streams: Vec<StreamRecord>,
    /// Streams gone (their resource type vanished), by (cluster, resource name).
    pub drop_streams: Vec<(ClusterName, String)>,
    /// The configured clusters, when they changed.
    pub clusters: Option<Vec<ClusterName>>,
    /// The configured field-index paths, when they changed.
    pub field_indexes: Option<Vec<String>>,
}

impl Batch {
    /// True when the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty()
            && self.deletes.is_empty()
            && self.events.is_empty()
            && self.drop_events.is_empty()
            && self.streams.is_empty()
            && self.drop_streams.is_empty()
            && self.clusters.is_none()
            && self.field_indexes.is_none()
    }
}

/// What went wrong with a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another running fleetscope holds the data directory.
    #[error(
        "data directory {0} is in use by another running fleetscope (its lock is held); stop it or choose another --data-dir"
    )]
    Locked(PathBuf),
    /// The data directory path exists and is not a directory.
    #[error("data directory {0} is not a directory")]
    NotADirectory(PathBuf),
    /// A filesystem operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// What the store holds fails verification.
    #[error("store is damaged: {0}")]
    Damaged(String),
    /// The store was written by a build with another layout.
    #[error("store has schema version {found}; this build reads version {SCHEMA_VERSION}")]
    UnknownSchema {
        /// The version found.
        found: u64,
    },
    /// The storage engine refused a read or a write.
    #[error("storage engine: {0}")]
    Engine(String),
}

impl StoreError {
    /// Whether this is damage to the store's contents (to be moved aside), rather than
    /// an environment problem (lock, permissions, a path that is a file).
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            StoreError::Damaged(_) | StoreError::UnknownSchema { .. }
        )
    }
}

/// What [`Store::scan`] calls with each record: key, value.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'a;

/// One write of a [`Batch`]: keys to set (`Some`) or remove (`None`).
pub type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// A key-value store under fleetscope's record layout. Implementations provide the
/// three primitives; loading, verifying and committing are shared.
pub trait Store: Send + Sync {
    /// Visits every record in key order.
    fn scan(&self, visit: &mut Visit<'_>) -> Result<(), StoreError>;

    /// Applies writes atomically and durably.
    fn write(&self, writes: Writes) -> Result<(), StoreError>;

    /// Bytes the store takes on disk (0 in memory).
    fn size_on_disk(&self) -> u64;

    /// Loads and verifies everything: every record's checksum, every key against its
    /// record, the schema version.
    fn load(&self) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded::default();
        let mut schema = None;
        let mut revision = None;
        let damaged = |what: &str, key: &[u8], e: DecodeError| {
            StoreError::Damaged(format!(
                "{what} record {:?}: {e}",
                String::from_utf8_lossy(key)
            ))
        };
        self.scan(&mut |key, value| {
            if key == codec::META_SCHEMA {
                schema = Some(codec::decode_u64(value).map_err(|e| damaged("schema", key, e))?);
            } else if key == codec::META_REVISION {
                revision = Some(codec::decode_u64(value).map_err(|e| damaged("revision", key, e))?);
            } else if key == codec::META_CLUSTERS {
                loaded.clusters = codec::decode_names(value)
                    .map_err(|e| damaged("clusters", key, e))?
                    .into_iter()
                    .map(ClusterName::from)
                    .collect();
            } else if key == codec::META_FIELD_INDEXES {
                loaded.field_indexes =
                    Some(codec::decode_names(value).map_err(|e| damaged("field indexes", key, e))?);
            } else if key.starts_with(codec::OBJECT_PREFIX) {
                let o = codec::decode_object(value).map_err(|e| damaged("object", key, e))?;
                if codec::object_key(&o.key) != key {
                    return Err(StoreError::Damaged(format!(
                        "object record under {:?} is for {}",
                        String::from_utf8_lossy(key),
                        o.key
                    )));
                }
                loaded.objects.push(o);
            } else if key.starts_with(codec::EVENT_PREFIX) {
                let e = codec::decode_event(value).map_err(|e| damaged("event", key, e))?;
                if codec::event_key(e.revision) != key {
                    return Err(StoreError::Damaged(format!(
                        "event record under {:?} is for revision {}",
                        String::from_utf8_lossy(key),
                        e.revision
                    )));
                }
                loaded.events.push(e);
            } else if key.starts_with(codec::STREAM_PREFIX) {
                let s = codec::decode_stream(value).map_err(|e| damaged("stream", key, e))?;
                if codec::stream_key(&s.cluster, &s.resource.name()) != key {
                    return Err(StoreError::Damaged(format!(
                        "stream record under {:?} is for {}/{}",
                        String::from_utf8_lossy(key),
                        s.cluster,
                        s.resource.name()
                    )));
                }
                loaded.streams.push(s);
            } else {
                return Err(StoreError::Damaged(format!(
                    "unknown key {:?}",
                    String::from_utf8_lossy(key)
                )));
            }
            Ok(())
        })?;
        let empty = loaded.objects.is_empty()
            && loaded.events.is_empty()
            && loaded.streams.is_empty()
            && revision.is_none();
        match schema {
            Some(SCHEMA_VERSION) => {}
            Some(found) => return Err(StoreError::UnknownSchema { found }),
            None if empty => {}
            None => {
                return Err(StoreError::Damaged(
                    "records without a schema version".into(),
                ));
            }
        }
        loaded.revision = Revision(revision.unwrap_or(0));
        let newest = loaded
            .objects
            .iter()
            .map(|o| o.revision)
            .chain(loaded.events.iter().map(|e| e.revision))
            .max()
            .unwrap_or_default();
        if newest > loaded.revision {
            return Err(StoreError::Damaged(format!(
                "a record has revision {newest}, after the store's revision {}",
                loaded.revision
            )));
        }
        Ok(loaded)
    }

    /// Writes one batch atomically and durably.
    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        self.write(encode_batch(batch))
    }

    /// Marks a new, empty store with this build's schema version.
    fn initialise(&self) -> Result<(), StoreError> {
        self.write(vec![(
            codec::META_SCHEMA.to_vec(),
            Some(codec::encode_u64(SCHEMA_VERSION)),
        )])
    }
}

fn encode_batch(batch: &Batch) -> Writes {
    // Later writes to one key win; a map keeps exactly one write per key.
    let mut writes: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    for key in &batch.deletes {
        writes.insert(codec::object_key(key), None);
    }
    for o in &batch.upserts {
        writes.insert(codec::object_key(&o.key), Some(codec::encode_object(o)));
    }
    for r in batch.drop_events.clone() {
        writes.insert(codec::event_key(Revision(r)), None);
    }
    for e in &batch.events {
        writes.insert(codec::event_key(e.revision), Some(codec::encode_event(e)));
    }
    for (cluster, resource) in &batch.drop_streams {
        writes.insert(codec::stream_key(cluster, resource), None);
    }
    for s in &batch.streams {
        writes.insert(
            codec::stream_key(&s.cluster, &s.resource.name()),
            Some(codec::encode_stream(s)),
        );
    }
    if let Some(clusters) = &batch.clusters {
        writes.insert(
            codec::META_CLUSTERS.to_vec(),
            Some(codec::encode_names(
                &clusters.iter().map(ClusterName::as_str).collect::<Vec<_>>(),
            )),
        );
    }
    if let Some(paths) = &batch.field_indexes {
        writes.insert(
            codec::META_FIELD_INDEXES.to_vec(),
            Some(codec::encode_names(paths)),
        );
    }
    writes.insert(
        codec::META_REVISION.to_vec(),
        Some(codec::encode_u64(batch.revision.0)),
    );
    writes.into_iter().collect()
}

#[cfg(test)]
mod tests;
