//! fleetscope's persistence: every object of the index, each stream's resourceVersion,
//! the event log, the global revision and the set of clusters, so a restart serves at
//! once and resumes every watch without listing.
//!
//! Entry points:
//! - [`SledStore::open`]: opens (or creates) a data directory, holding its lock, and
//!   loads and verifies what it holds. A store that fails verification or has an
//!   unknown schema is moved aside and replaced by an empty one; it is never served.
//! - [`MemoryStore`]: the same contract in memory, with a switch that makes writes fail.
//! - [`Store::commit`]: one [`Batch`] applied atomically and durably: the events and
//!   stream resourceVersions it carries are on disk together or not at all.
//! - [`write_snapshot`] then [`Store::commit`] with `snapshot` set: every object
//!   at one revision, in chunks, made current atomically.
//!
//! Layout: the objects are a snapshot at some revision (large chunks, written once) plus
//! the events after it (the change log, replayed at load). The same events, with some
//! before the snapshot, are the log a `Watch` resumes from after a restart. Snapshots
//! are rewritten as the change log grows, so the store's size follows the objects held,
//! not the changes seen.
//!
//! Nothing else in fleetscope touches sled.

mod codec;
mod earlier;
mod memory;
mod objects;
mod sled_store;

use std::collections::BTreeMap;
use std::path::PathBuf;

use fleetscope_model::{
    ClusterName, EventType, ObjectKey, ObjectState, PackedJson, ResourceType, Revision,
    StoredObject,
};

pub use codec::DecodeError;
pub use earlier::EarlierEvents;
pub use memory::MemoryStore;
pub use objects::{Objects, PatchedChunk, Run, StoredChunk};
pub use sled_store::{Opened, SledStore};

/// The layout version this build writes. It reads this one and the one before
/// ([`SCHEMA_READ`]), whose snapshots hold every object's JSON as text; a store of
/// that version takes this one at its next snapshot.
pub const SCHEMA_VERSION: u64 = 4;

/// The oldest layout version this build reads.
pub const SCHEMA_READ: u64 = 3;

/// A snapshot chunk's target size before compression; also the size of a run of
/// events. sled keeps up to 16 records in a leaf and stores a leaf over 128 KiB as a
/// separate blob file, which it is slow to reclaim: records stay small enough (JSON
/// compresses 3–5 fold) that leaves stay inline.
pub const CHUNK_BYTES: usize = 12 << 10;

/// How much of a snapshot goes to the storage engine in one write.
const WRITE_BYTES: usize = 4 << 20;

/// One object as stored: its state, which the index rebuilds it from without parsing
/// the JSON, and the revision the index gave that state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    /// The revision of the change that produced this state.
    pub revision: Revision,
    /// The object's state; its `json` is empty when `packed` holds it.
    pub state: ObjectState,
    /// The JSON compressed against its type's dictionary, as a snapshot stores a
    /// compressed object: read back as it is held, not decompressed.
    pub packed: Option<triomphe::Arc<PackedJson>>,
}

impl ObjectRecord {
    /// A record of `state`, its JSON as text.
    pub fn new(revision: Revision, state: ObjectState) -> Self {
        Self {
            revision,
            state,
            packed: None,
        }
    }

    /// The length of the JSON.
    pub fn json_len(&self) -> usize {
        self.packed
            .as_ref()
            .map_or(self.state.json.len(), |p| p.text_len())
    }

    /// The JSON's text, made from its compressed form when it is held so; an empty
    /// text when that does not decompress (a record's checksum held, so it does).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match &self.packed {
            Some(p) => std::borrow::Cow::Owned(p.text().unwrap_or_default()),
            None => std::borrow::Cow::Borrowed(self.state.json.as_str()),
        }
    }
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

impl EventRecord {
    /// The JSON it carries: the object's, and the previous state's when there is one.
    pub fn json_bytes(&self) -> usize {
        self.object.json_len() + self.prev.as_ref().map_or(0, ObjectRecord::json_len)
    }
}

/// An event as the log writes it, read where it is held (the index's events, or an
/// [`EventRecord`]).
pub trait StoredEvent {
    /// What the event's object states are.
    type Object: StoredObject;
    /// The revision the change was given.
    fn revision(&self) -> Revision;
    /// What happened.
    fn kind(&self) -> EventType;
    /// The object after the change; for a delete, its last state.
    fn object(&self) -> &Self::Object;
    /// The object before the change, when kept.
    fn prev(&self) -> Option<&Self::Object>;
}

impl StoredEvent for &EventRecord {
    type Object = ObjectRecord;
    fn revision(&self) -> Revision {
        self.revision
    }
    fn kind(&self) -> EventType {
        self.kind
    }
    fn object(&self) -> &ObjectRecord {
        &self.object
    }
    fn prev(&self) -> Option<&ObjectRecord> {
        self.prev.as_ref()
    }
}

/// Consecutive events encoded as one record of the log (keyed by the first one's
/// revision), ready to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRun {
    first: Revision,
    last: Revision,
    record: Vec<u8>,
}

impl EventRun {
    /// Encodes consecutive events, each from where it is held; `None` for none.
    pub fn encode<E: StoredEvent>(events: impl IntoIterator<Item = E>) -> Option<Self> {
        codec::encode_events(events).map(|(first, last, record)| Self {
            first,
            last,
            record,
        })
    }

    /// The revision of the run's first event (its key in the log).
    pub fn first(&self) -> Revision {
        self.first
    }

    /// The revision of the run's last event.
    pub fn last(&self) -> Revision {
        self.last
    }
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
    /// What the stream's configuration selected and kept when it stored them.
    pub selection: String,
}

/// What a cluster's discovery last answered, kept so a restart starts its streams
/// before asking again (as kubectl keeps its discovery cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryRecord {
    /// The cluster.
    pub cluster: ClusterName,
    /// Every type it serves.
    pub served: Vec<ServedRecord>,
}

/// One type a cluster serves, as discovery gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRecord {
    /// The type.
    pub resource: ResourceType,
    /// Whether list and watch are both allowed.
    pub watchable: bool,
    /// Its short names.
    pub short_names: Vec<String>,
    /// Its singular name.
    pub singular: String,
}

/// Which snapshot is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotMeta {
    /// Its id (chunk keys carry it).
    pub id: u64,
    /// The revision the objects are at.
    pub revision: Revision,
    /// How many chunks.
    pub chunks: u32,
    /// How many objects.
    pub objects: u64,
    /// How many dictionaries its compressed objects were compressed against (one per
    /// resource type at most; dictionary keys carry the snapshot's id and a number).
    pub dictionaries: u32,
}

/// Everything a store holds, verified.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The last revision applied.
    pub revision: Revision,
    /// Every object, in key order: the snapshot with the later events replayed, the
    /// chunks those left unchanged as they are stored.
    pub objects: Objects,
    /// The current snapshot.
    pub snapshot: Option<SnapshotMeta>,
    /// Bytes of events after the snapshot (the change log).
    pub change_log_bytes: u64,
    /// The event log's records: first and last revision and JSON bytes, oldest first.
    pub event_records: Vec<(u64, u64, usize)>,
    /// The retained event log after `earlier_events`, in revision order: every event
    /// after the snapshot (the change log), and any before it in the same records.
    pub events: Vec<EventRecord>,
    /// The retained events before `events`, at or before the snapshot: verified, not
    /// yet decoded.
    pub earlier_events: EarlierEvents,
    /// Every stream that completed a list.
    pub streams: Vec<StreamRecord>,
    /// The clusters configured when the store was last written.
    pub clusters: Vec<ClusterName>,
    /// The field-index paths the stored objects' field values were read for.
    pub field_indexes: Option<Vec<String>>,
    /// What each cluster's discovery last answered.
    pub discovery: Vec<DiscoveryRecord>,
}

/// One atomic write: the effect of one or more applied index batches.
#[derive(Debug, Default)]
pub struct Batch {
    /// The revision the store is at after this batch.
    pub revision: Revision,
    /// A snapshot written by [`write_snapshot`] to make current, with the one it replaces.
    pub snapshot: Option<(SnapshotMeta, Option<SnapshotMeta>)>,
    /// Snapshots written by [`write_snapshot`] that are not to become current (a newer
    /// one already is): their chunks are removed.
    pub discard_snapshots: Vec<SnapshotMeta>,
    /// Events to add to the log, in consecutive runs: each run is one record, keyed by
    /// its first revision (the unit [`Batch::drop_events`] later removes).
    pub events: Vec<EventRun>,
    /// Event records to drop (the log's trimmed head), by their first revision.
    pub drop_events: Vec<u64>,
    /// Streams' new resume points.
    pub streams: Vec<StreamRecord>,
    /// Streams gone (their resource type vanished), by (cluster, resource name).
    pub drop_streams: Vec<(ClusterName, String)>,
    /// The configured clusters, when they changed.
    pub clusters: Option<Vec<ClusterName>>,
    /// The configured field-index paths, when they changed.
    pub field_indexes: Option<Vec<String>>,
    /// Clusters' new discovery answers.
    pub discovery: Vec<DiscoveryRecord>,
    /// Clusters whose discovery answer is to be forgotten (they left the fleet).
    pub drop_discovery: Vec<ClusterName>,
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
    #[error("{what} {path}: {cause}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// Why it failed (in the message, so not chained as a source too).
        cause: std::io::Error,
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

    /// The record under `key`, if there is one.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let mut found = None;
        self.scan(&mut |k, v| {
            if k == key {
                found = Some(v.to_vec());
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Bytes the store takes on disk (0 in memory).
    fn size_on_disk(&self) -> u64;

    /// Reclaims space held by removed records; returns the size on disk before and
    /// after, or `None` where there is nothing to reclaim (in memory).
    fn compact(&self) -> Result<Option<(u64, u64)>, StoreError> {
        Ok(None)
    }

    /// Has the storage engine record where everything is now, so that the next open
    /// reads that rather than the writes since it was last opened (a process stopping
    /// calls it last); returns how long writes waited, or `None` where there was
    /// nothing to record.
    fn checkpoint(&self) -> Result<Option<std::time::Duration>, StoreError> {
        Ok(None)
    }

    /// Loads and verifies everything: every record's checksum, every key against its
    /// record, the schema version, the snapshot's chunks and an unbroken change log
    /// after it, which is then replayed onto the snapshot. Chunks of an unfinished
    /// snapshot (a crash while writing one) are deleted.
    fn load(&self) -> Result<Loaded, StoreError> {
        let started = std::time::Instant::now();
        let mut scanned = Scanned::default();
        // The snapshot's chunks (read and verified whole, their objects left in place)
        // and the change log's records (decoded) are each taken by one of two threads
        // while the scan reads on. Dictionaries scan before any chunk.
        let mut dictionaries = SnapshotDictionaries::default();
        // The retained events at or before the snapshot are only verified now, and
        // decoded once asked for (the meta records scan after the events).
        let snapshot_at = self
            .get(codec::META_SNAPSHOT)?
            .and_then(|v| codec::decode_snapshot(&v).ok())
            .map(|s| s.revision.0);
        let (chunks, event_records) = std::thread::scope(|s| {
            let decoding = Decoding::start(s, snapshot_at);
            let scan = self.scan(&mut |key, value| {
                if let Some(id) = codec::parse_dictionary_key(key) {
                    dictionaries.take(id, key, value)?;
                } else if let Some(id) = codec::parse_chunk_key(key) {
                    let of_snapshot = dictionaries.of(id.0);
                    decoding.send(Coded::Chunk(id, of_snapshot), value.to_vec());
                } else if let Some(first) = codec::parse_event_key(key) {
                    decoding.send(Coded::Events(first), value.to_vec());
                } else {
                    return scanned.take(key, value);
                }
                Ok(())
            });
            let decoded = decoding.finish();
            scan.map(|()| decoded)
        })?;
        let scanned_in = started.elapsed();
        let Scanned {
            mut loaded,
            schema,
            revision,
        } = scanned;
        let empty = event_records.is_empty()
            && loaded.streams.is_empty()
            && chunks.is_empty()
            && revision.is_none();
        match schema {
            Some(SCHEMA_READ..=SCHEMA_VERSION) => {}
            Some(found) => return Err(StoreError::UnknownSchema { found }),
            None if empty => {}
            None => {
                return Err(StoreError::Damaged(
                    "records without a schema version".into(),
                ));
            }
        }
        loaded.revision = Revision(revision.unwrap_or(0));
        let base = objects::snapshot_objects(self, loaded.snapshot, chunks, dictionaries)?;
        let from = loaded.snapshot.map_or(Revision(0), |s| s.revision);
        let (events, earlier, records) = change_log_of(event_records, from.0)?;
        loaded.events = events;
        loaded.earlier_events = earlier;
        loaded.event_records = records;
        let changes: Vec<&EventRecord> =
            loaded.events.iter().filter(|e| e.revision > from).collect();
        unbroken(from, &changes, loaded.revision)?;
        loaded.change_log_bytes = changes.iter().map(|e| e.json_bytes() as u64).sum();
        tracing::debug!(
            snapshot_objects = base
                .iter()
                .map(fleetscope_model::StoredRun::len)
                .sum::<usize>(),
            changes = changes.len(),
            change_log_bytes = loaded.change_log_bytes,
            ?scanned_in,
            "store read: the snapshot, and the change log after it to replay"
        );
        loaded.objects = objects::replay(base, &changes);
        tracing::debug!(took = ?started.elapsed(), "store loaded");
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
    if let Some((new, old)) = &batch.snapshot {
        if let Some(old) = old {
            remove_snapshot(&mut writes, old);
        }
        writes.insert(
            codec::META_SNAPSHOT.to_vec(),
            Some(codec::encode_snapshot(new)),
        );
        // A store read in the layout before takes this one with its first snapshot.
        writes.insert(
            codec::META_SCHEMA.to_vec(),
            Some(codec::encode_u64(SCHEMA_VERSION)),
        );
    }
    for discarded in &batch.discard_snapshots {
        remove_snapshot(&mut writes, discarded);
    }
    for r in &batch.drop_events {
        writes.insert(codec::event_key(Revision(*r)), None);
    }
    for run in &batch.events {
        writes.insert(codec::event_key(run.first), Some(run.record.clone()));
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
    for cluster in &batch.drop_discovery {
        writes.insert(codec::discovery_key(cluster), None);
    }
    for d in &batch.discovery {
        writes.insert(
            codec::discovery_key(&d.cluster),
            Some(codec::encode_discovery(d)),
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

/// Removes a snapshot's chunks and dictionaries.
fn remove_snapshot(writes: &mut BTreeMap<Vec<u8>, Option<Vec<u8>>>, snapshot: &SnapshotMeta) {
    for i in 0..snapshot.chunks {
        writes.insert(codec::chunk_key(snapshot.id, i), None);
    }
    for i in 0..snapshot.dictionaries {
        writes.insert(codec::dictionary_key(snapshot.id, i), None);
    }
}

/// The change log's events decoded, those before them held undecoded, and each
/// record's first and last revision and bytes.
type EventRecords = (Vec<EventRecord>, EarlierEvents, Vec<(u64, u64, usize)>);

/// What a scan of the store found, before it is verified as a whole.
#[derive(Default)]
struct Scanned {
    loaded: Loaded,
    schema: Option<u64>,
    revision: Option<u64>,
}

/// A record the scan hands to the decoders, by its key: a snapshot's chunk (snapshot,
/// index), or a change log record (its first revision).
enum Coded {
    Chunk((u64, u32), std::sync::Arc<codec::Dictionaries>),
    Events(u64),
}

/// The dictionaries the scan read, by snapshot id; each snapshot's frozen once its
/// first chunk is handed to the decoders (all of them scan before any chunk).
#[derive(Default)]
struct SnapshotDictionaries(BTreeMap<u64, (Vec<u32>, std::sync::Arc<codec::Dictionaries>)>);

impl SnapshotDictionaries {
    /// Takes one dictionary record, checked.
    fn take(&mut self, (id, n): (u64, u32), key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let damaged = |why: String| {
            StoreError::Damaged(format!(
                "dictionary record {:?}: {why}",
                String::from_utf8_lossy(key)
            ))
        };
        let (resource, dictionary) =
            codec::decode_dictionary(value).map_err(|e| damaged(e.to_string()))?;
        let (numbers, of_snapshot) = self.0.entry(id).or_default();
        let Some(of_snapshot) = std::sync::Arc::get_mut(of_snapshot) else {
            return Err(damaged("read after the snapshot's chunks".into()));
        };
        if of_snapshot.insert(resource.clone(), dictionary).is_some() {
            return Err(damaged(format!("a second dictionary for {resource}")));
        }
        numbers.push(n);
        Ok(())
    }

    /// Snapshot `id`'s dictionaries, frozen.
    fn of(&mut self, id: u64) -> std::sync::Arc<codec::Dictionaries> {
        self.0.entry(id).or_default().1.clone()
    }
}

/// A snapshot chunk as read: its (snapshot, index) and the chunk verified or why not.
type DecodedChunk = ((u64, u32), Result<StoredChunk, DecodeError>);

/// A change log record as read: its key's first revision and its events, or the
/// record verified and held undecoded, or why not.
type DecodedEvents = (u64, Result<LogRecord, DecodeError>);

/// A change log record, decoded (with what it holds) or held for later.
enum LogRecord {
    Decoded(codec::Skimmed, Vec<EventRecord>),
    Held(earlier::Held),
}

/// A record decoded on a worker, with its place in the scan.
enum Decoded {
    Chunk(DecodedChunk),
    Events(DecodedEvents),
}

/// A record handed to the decoders, with its place in the scan.
type Numbered = (usize, Coded, Vec<u8>);

/// Records decoded on two threads as a scan hands them over, a batch at a time:
/// waking a worker for each record of a few kilobytes cost a restart's load about a
/// fifth more CPU.
struct Decoding<'scope> {
    to: std::sync::mpsc::SyncSender<Vec<Numbered>>,
    batch: std::cell::RefCell<Vec<Numbered>>,
    sent: std::cell::Cell<usize>,
    workers: Vec<std::thread::ScopedJoinHandle<'scope, Vec<(usize, Decoded)>>>,
}

impl<'scope> Decoding<'scope> {
    /// Records a batch holds.
    const BATCH: usize = 32;

    /// Starts the workers; change log records wholly at or before `snapshot_at` are
    /// held undecoded.
    fn start<'env>(s: &'scope std::thread::Scope<'scope, 'env>, snapshot_at: Option<u64>) -> Self {
        let (to, from) = std::sync::mpsc::sync_channel::<Vec<Numbered>>(4);
        let from = std::sync::Arc::new(std::sync::Mutex::new(from));
        let workers = (0..2)
            .map(|_| {
                let from = from.clone();
                s.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        let next = from.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(batch) = next else {
                            return done;
                        };
                        done.extend(
                            batch
                                .into_iter()
                                .map(|(n, coded, bytes)| (n, decode(coded, bytes, snapshot_at))),
                        );
                    }
                })
            })
            .collect();
        Self {
            to,
            batch: std::cell::RefCell::new(Vec::with_capacity(Self::BATCH)),
            sent: std::cell::Cell::new(0),
            workers,
        }
    }

    fn send(&self, coded: Coded, bytes: Vec<u8>) {
        let n = self.sent.get();
        self.sent.set(n + 1);
        let mut batch = self.batch.borrow_mut();
        batch.push((n, coded, bytes));
        if batch.len() == Self::BATCH {
            let full = std::mem::replace(&mut *batch, Vec::with_capacity(Self::BATCH));
            // Both workers gone (they panicked, which the scope then raises): nothing to do.
            let _ = self.to.send(full);
        }
    }

    /// Every record sent, decoded, in the order they were sent: the chunks, and the
    /// change log's records.
    fn finish(self) -> (Vec<DecodedChunk>, Vec<DecodedEvents>) {
        let last = self.batch.take();
        if !last.is_empty() {
            let _ = self.to.send(last);
        }
        drop(self.to);
        let mut done: Vec<(usize, Decoded)> = Vec::with_capacity(self.sent.get());
        for worker in self.workers {
            match worker.join() {
                Ok(part) => done.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        done.sort_unstable_by_key(|(n, _)| *n);
        let (mut chunks, mut events) = (Vec::new(), Vec::new());
        for (_, decoded) in done {
            match decoded {
                Decoded::Chunk(c) => chunks.push(c),
                Decoded::Events(e) => events.push(e),
            }
        }
        (chunks, events)
    }
}

/// One record decoded, or verified and held if it is a change log record wholly at
/// or before `snapshot_at`.
fn decode(coded: Coded, bytes: Vec<u8>, snapshot_at: Option<u64>) -> Decoded {
    match coded {
        Coded::Chunk(id, dictionaries) => {
            Decoded::Chunk((id, StoredChunk::read(&bytes, dictionaries)))
        }
        Coded::Events(first) => {
            let read = codec::skim_events(&bytes).and_then(|(skimmed, plain)| {
                if snapshot_at.is_some_and(|at| skimmed.last <= at) {
                    Ok(LogRecord::Held(earlier::Held::new(skimmed, bytes)))
                } else {
                    codec::decode_plain_events(&plain)
                        .map(|events| LogRecord::Decoded(skimmed, events))
                }
            });
            Decoded::Events((first, read))
        }
    }
}

impl Scanned {
    /// Takes one record other than a snapshot's chunk or a change log record (those
    /// go to [`Decoding`]): the schema, revision, snapshot, clusters or field indexes,
    /// a cluster's discovery or a stream's progress (each checked against its key);
    /// anything else is damage.
    fn take(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let damaged = |what: &str, e: DecodeError| {
            StoreError::Damaged(format!(
                "{what} record {:?}: {e}",
                String::from_utf8_lossy(key)
            ))
        };
        let loaded = &mut self.loaded;
        if key == codec::META_SCHEMA {
            self.schema = Some(codec::decode_u64(value).map_err(|e| damaged("schema", e))?);
        } else if key == codec::META_REVISION {
            self.revision = Some(codec::decode_u64(value).map_err(|e| damaged("revision", e))?);
        } else if key == codec::META_SNAPSHOT {
            loaded.snapshot =
                Some(codec::decode_snapshot(value).map_err(|e| damaged("snapshot", e))?);
        } else if key == codec::META_CLUSTERS {
            loaded.clusters = codec::decode_names(value)
                .map_err(|e| damaged("clusters", e))?
                .into_iter()
                .map(ClusterName::from)
                .collect();
        } else if key == codec::META_FIELD_INDEXES {
            loaded.field_indexes =
                Some(codec::decode_names(value).map_err(|e| damaged("field indexes", e))?);
        } else if key.starts_with(codec::DISCOVERY_PREFIX) {
            let d = codec::decode_discovery(value).map_err(|e| damaged("discovery", e))?;
            if codec::discovery_key(&d.cluster) != key {
                return Err(StoreError::Damaged(format!(
                    "discovery record under {:?} is for {}",
                    String::from_utf8_lossy(key),
                    d.cluster
                )));
            }
            loaded.discovery.push(d);
        } else if key.starts_with(codec::STREAM_PREFIX) {
            let s = codec::decode_stream(value).map_err(|e| damaged("stream", e))?;
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
    }
}

/// Checks that the change log after the snapshot's revision `from` runs unbroken to
/// the store's `revision`.
fn unbroken(
    from: Revision,
    changes: &[&EventRecord],
    revision: Revision,
) -> Result<(), StoreError> {
    let mut expect = from.0 + 1;
    for e in changes {
        if e.revision.0 != expect {
            return Err(StoreError::Damaged(format!(
                "the change log after revision {from} is missing revision {expect}"
            )));
        }
        expect += 1;
    }
    if expect - 1 != revision.0 {
        return Err(StoreError::Damaged(format!(
            "the change log ends at revision {}, the store is at {}",
            expect - 1,
            revision
        )));
    }
    Ok(())
}

/// The change log's events from its records, each checked against its key, those
/// wholly at or before `snapshot_at` held undecoded while every record before them is;
/// and the records' extents. Records that overlap are damage.
fn change_log_of(
    records: Vec<DecodedEvents>,
    snapshot_at: u64,
) -> Result<EventRecords, StoreError> {
    let mut earlier = EarlierEvents::default();
    let mut runs: Vec<Vec<EventRecord>> = Vec::new();
    let mut extents = Vec::with_capacity(records.len());
    for (first, read) in records {
        let read = read.map_err(|e| earlier::damaged_record(first, &e))?;
        let (events, skimmed) = match read {
            // Held only while every one before it is, and if the snapshot read
            // during the scan is the one read before it.
            LogRecord::Held(held) if runs.is_empty() && held.skimmed.last <= snapshot_at => {
                let skimmed = held.skimmed;
                earlier.0.push(held);
                (None, skimmed)
            }
            LogRecord::Held(held) => {
                let events = held.decode()?;
                (Some(events), held.skimmed)
            }
            LogRecord::Decoded(skimmed, events) => (Some(events), skimmed),
        };
        if skimmed.first != first {
            return Err(StoreError::Damaged(format!(
                "event record under revision {first} is for revision {}",
                skimmed.first
            )));
        }
        if extents
            .last()
            .is_some_and(|&(_, last, _)| last >= skimmed.first)
        {
            return Err(StoreError::Damaged("event records overlap".into()));
        }
        extents.push((skimmed.first, skimmed.last, skimmed.json_bytes));
        runs.extend(events);
    }
    Ok((runs.into_iter().flatten().collect(), earlier, extents))
}

#[cfg(test)]
mod tests;

/// Writes a snapshot of `objects` (in key order) under `id`, in chunks, each chunk
/// durable on its own; commit a [`Batch`] with `snapshot` set to make it current.
/// Until then (or after a crash) it is not read, and the next open deletes it. The
/// objects are encoded in place, whoever holds them; each one's JSON as `packed` gives
/// it compressed against its type's dictionary (written with the snapshot, one per
/// type: an object compressed against another is stored as text), as text otherwise.
pub fn write_snapshot<'a, O: StoredObject + 'a>(
    store: &dyn Store,
    id: u64,
    revision: Revision,
    objects: impl Iterator<Item = &'a O>,
    mut packed: impl FnMut(&O) -> Option<triomphe::Arc<PackedJson>>,
) -> Result<SnapshotMeta, StoreError> {
    let mut meta = SnapshotMeta {
        id,
        revision,
        chunks: 0,
        objects: 0,
        dictionaries: 0,
    };
    let mut dictionaries: BTreeMap<String, std::sync::Arc<[u8]>> = BTreeMap::new();
    // Chunks are written a few megabytes at a time.
    let mut writes: Writes = Vec::new();
    let mut pending = 0;
    let mut chunk = codec::ChunkWriter::new();
    for o in objects {
        let packed = packed(o).filter(|p| {
            let dictionary = dictionaries
                .entry(o.key().resource.to_string())
                .or_insert_with(|| p.dictionary().clone());
            std::sync::Arc::ptr_eq(dictionary, p.dictionary()) || **dictionary == **p.dictionary()
        });
        chunk.push(o, packed.as_deref());
        meta.objects += 1;
        if chunk.len() >= CHUNK_BYTES {
            let full = std::mem::replace(&mut chunk, codec::ChunkWriter::new()).seal();
            pending += full.len();
            writes.push((codec::chunk_key(id, meta.chunks), Some(full)));
            meta.chunks += 1;
            if pending >= WRITE_BYTES {
                store.write(std::mem::take(&mut writes))?;
                pending = 0;
            }
        }
    }
    if !chunk.is_empty() {
        writes.push((codec::chunk_key(id, meta.chunks), Some(chunk.seal())));
        meta.chunks += 1;
    }
    for (resource, dictionary) in &dictionaries {
        writes.push((
            codec::dictionary_key(id, meta.dictionaries),
            Some(codec::encode_dictionary(resource, dictionary)),
        ));
        meta.dictionaries += 1;
    }
    if !writes.is_empty() {
        store.write(writes)?;
    }
    Ok(meta)
}

impl StoredObject for ObjectRecord {
    fn key(&self) -> &ObjectKey {
        &self.state.key
    }
    fn revision(&self) -> Revision {
        self.revision
    }
    fn json(&self) -> impl std::ops::Deref<Target = str> + '_ {
        self.text()
    }
    fn labels(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.state
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
    fn owners(&self) -> impl ExactSizeIterator<Item = &str> {
        self.state.owners.iter().map(String::as_str)
    }
    fn fields(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.state
            .fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}
