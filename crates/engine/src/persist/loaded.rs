//! What a loaded store gives the engine: the index's restored state (the retained
//! events before the snapshot read only once the index asks), and what the persister
//! continuing the store starts from.

use fleetscope_index::{Restored, RestoredEvent, RestoredObject, RestoredRun};
use fleetscope_model::{ObjectState, Revision};
use fleetscope_store::{EventRecord, Loaded, ObjectRecord, Run, SnapshotMeta};

/// An event's object (event records hold their JSON as text).
fn to_input(o: ObjectRecord) -> (ObjectState, Revision) {
    (o.state, o.revision)
}

/// What the index is rebuilt from: the objects as the snapshot held them, compressed
/// or as text.
pub fn restored(loaded: &mut Loaded) -> Restored {
    Restored {
        revision: loaded.revision,
        objects: std::mem::take(&mut loaded.objects)
            .into_runs()
            .into_iter()
            .map(|run| match run {
                Run::Records(records) => RestoredRun::Objects(
                    records
                        .into_iter()
                        .map(|o| RestoredObject {
                            state: o.state,
                            revision: o.revision,
                            packed: o.packed,
                        })
                        .collect(),
                ),
                // Its objects are made where the chunk holds them.
                Run::Chunk(chunk) => RestoredRun::Stored(Box::new(chunk)),
                // And so are those no change touched.
                Run::Patched(patched) => RestoredRun::Stored(Box::new(patched)),
            })
            .collect(),
        events: std::mem::take(&mut loaded.events)
            .into_iter()
            .map(to_restored)
            .collect(),
        earlier: Some(earlier_read(std::mem::take(&mut loaded.earlier_events))),
        positions: Vec::new(),
    }
}

/// An event as the index restores it.
fn to_restored(e: EventRecord) -> RestoredEvent {
    RestoredEvent {
        revision: e.revision,
        kind: e.kind,
        object: to_input(e.object),
        prev: e.prev.map(to_input),
    }
}

/// Reads the retained events a load held undecoded, once the index asks. They were
/// verified at load, so failing now is the storage changing under the process: the
/// log then starts after them, and a watch resuming from before is told to list.
fn earlier_read(earlier: fleetscope_store::EarlierEvents) -> fleetscope_index::EarlierEvents {
    Box::new(move |keep| match earlier.decode_newest(keep) {
        Ok(events) => events.into_iter().map(to_restored).collect(),
        Err(e) => {
            tracing::error!(error = %e, "the retained events before the store's snapshot could not be read: watches resume only from after it");
            Vec::new()
        }
    })
}

/// What a loaded store holds, for the persister that continues it.
pub struct Continued {
    /// The held objects' JSON bytes.
    pub held_json: usize,
    /// The persisted event records: first and last revision and bytes, oldest first.
    pub records: Vec<(u64, u64, usize)>,
    /// The current snapshot.
    pub snapshot: Option<SnapshotMeta>,
    /// Bytes of the change log after the snapshot.
    pub change_log: usize,
    /// The store's revision.
    pub revision: Revision,
}

impl Continued {
    /// Read off a loaded store, before its objects and events are taken.
    pub fn of(loaded: &Loaded) -> Self {
        Self {
            held_json: loaded.objects.json_bytes(),
            records: loaded.event_records.clone(),
            snapshot: loaded.snapshot,
            change_log: loaded.change_log_bytes as usize,
            revision: loaded.revision,
        }
    }
}
