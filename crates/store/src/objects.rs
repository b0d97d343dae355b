//! The objects a load gives: the current snapshot's chunks, verified and left as they
//! are stored until the index makes its objects from them, with the change log after
//! the snapshot replayed onto them.

use std::sync::Arc;

use fleetscope_model::{
    ClusterName, EventType, ObjectKey, StoredJson, StoredObject, StoredRun, StoredView,
};

use crate::codec::{self, DecodeError, Dictionaries, PlainChunk};
use crate::{EventRecord, ObjectRecord, SnapshotMeta, Store, StoreError, Writes};

/// Every object a load gives, in key order, each key once: runs of records, and
/// snapshot chunks whose objects are read in place when they are made.
#[derive(Debug, Default)]
pub struct Objects(Vec<Run>);

/// A run of [`Objects`].
#[derive(Debug)]
pub enum Run {
    /// Objects as records: ones the change log changed, or given so.
    Records(Vec<ObjectRecord>),
    /// A snapshot's chunk the change log left as it was.
    Chunk(StoredChunk),
    /// A snapshot's chunk with the change log's changes to keys within it laid over it.
    Patched(PatchedChunk),
}

impl Run {
    fn len(&self) -> usize {
        match self {
            Run::Records(records) => records.len(),
            Run::Chunk(chunk) => chunk.len(),
            Run::Patched(patched) => patched.len(),
        }
    }
}

impl Objects {
    /// How many objects.
    pub fn len(&self) -> usize {
        self.0.iter().map(Run::len).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|r| r.len() == 0)
    }

    /// The length of their JSON.
    pub fn json_bytes(&self) -> usize {
        self.0
            .iter()
            .map(|r| match r {
                Run::Records(records) => records.iter().map(ObjectRecord::json_len).sum(),
                Run::Chunk(chunk) => chunk.json_bytes,
                Run::Patched(patched) => patched.json_bytes,
            })
            .sum()
    }

    /// The runs, in key order.
    pub fn runs(&self) -> &[Run] {
        &self.0
    }

    /// The runs, in key order.
    pub fn into_runs(self) -> Vec<Run> {
        self.0
    }

    /// Every object as a record, chunks read out.
    pub fn to_records(&self) -> Vec<ObjectRecord> {
        let mut out = Vec::with_capacity(self.len());
        for run in &self.0 {
            match run {
                Run::Records(records) => out.extend(records.iter().cloned()),
                Run::Chunk(chunk) => out.extend(chunk.records()),
                Run::Patched(patched) => out.extend(patched.records()),
            }
        }
        out
    }

    /// Every object as a record, chunks read out.
    pub fn into_records(self) -> Vec<ObjectRecord> {
        let mut out = Vec::with_capacity(self.len());
        for run in self.0 {
            match run {
                Run::Records(records) => out.extend(records),
                Run::Chunk(chunk) => out.extend(chunk.records()),
                Run::Patched(patched) => out.extend(patched.records()),
            }
        }
        out
    }
}

impl From<Vec<ObjectRecord>> for Objects {
    /// Records in key order, each key once.
    fn from(records: Vec<ObjectRecord>) -> Self {
        Self(vec![Run::Records(records)])
    }
}

/// One chunk of a snapshot, read and verified whole (checksum, form, every object,
/// key order), its objects left where they lie: the index makes its objects from
/// them in place, with no record of each made and dropped first.
#[derive(Debug)]
pub struct StoredChunk {
    plain: PlainChunk,
    /// The snapshot's dictionaries, which its compressed objects are read against.
    dictionaries: Arc<Dictionaries>,
    count: usize,
    ends: Option<(ObjectKey, ObjectKey)>,
    json_bytes: usize,
}

impl StoredChunk {
    /// A chunk's record, read and verified.
    pub(crate) fn read(
        record: &[u8],
        dictionaries: Arc<Dictionaries>,
    ) -> Result<Self, DecodeError> {
        let plain = PlainChunk::open(record)?;
        let summary = plain.read(&dictionaries, |_| {})?;
        let key = |[resource, cluster, namespace, name]: [&str; 4]| {
            ObjectKey::new(resource, &ClusterName::from(cluster), namespace, name)
        };
        let (count, json_bytes) = (summary.count, summary.json_bytes);
        let ends = summary.ends.map(|(first, last)| (key(first), key(last)));
        Ok(Self {
            plain,
            dictionaries,
            count,
            ends,
            json_bytes,
        })
    }

    /// Its objects as records.
    pub fn records(&self) -> Vec<ObjectRecord> {
        // Verified when it was read: it reads the same again.
        self.plain.records(&self.dictionaries).unwrap_or_default()
    }

    /// Its first and last key.
    fn ends(&self) -> Option<(&ObjectKey, &ObjectKey)> {
        self.ends.as_ref().map(|(first, last)| (first, last))
    }
}

/// A chunk of `records` (in key order), as a snapshot stores it, each JSON as text.
#[cfg(test)]
pub(crate) fn chunk_of(records: &[ObjectRecord]) -> StoredChunk {
    let mut w = codec::ChunkWriter::new();
    for o in records {
        w.push(o, None);
    }
    StoredChunk::read(&w.seal(), Arc::default()).expect("a chunk as written reads back")
}

impl StoredRun for StoredChunk {
    fn len(&self) -> usize {
        self.count
    }

    fn visit(&self, each: &mut dyn FnMut(&StoredView<'_>)) {
        // Verified when it was read: it reads the same again.
        let _ = self.plain.read(&self.dictionaries, each);
    }
}

/// A snapshot's chunk with the last change of the change log to each key within its
/// range laid over it: the objects no change touched are read in place, as from a
/// chunk left as it was, and only the changed ones are records. A log of changes
/// spread over many chunks so costs a record per change, not one per object of every
/// chunk it touches.
#[derive(Debug)]
pub struct PatchedChunk {
    chunk: StoredChunk,
    /// The last change to each key within the chunk's range, in key order: the state
    /// it left (`None`: deleted).
    changes: Vec<(ObjectKey, Option<ObjectRecord>)>,
    count: usize,
    json_bytes: usize,
}

/// One object of a [`PatchedChunk`]: read in place, or a change's record.
enum Patched<'v, 'a> {
    Stored(&'v StoredView<'a>),
    Changed(&'v ObjectRecord),
}

impl PatchedChunk {
    /// `chunk` with `changes` (keys within its first and last, in key order) laid
    /// over it.
    fn new(chunk: StoredChunk, changes: Vec<(ObjectKey, Option<ObjectRecord>)>) -> Self {
        let mut patched = Self {
            chunk,
            changes,
            count: 0,
            json_bytes: 0,
        };
        let (mut count, mut json_bytes) = (0, 0);
        patched.walk(|o| {
            count += 1;
            json_bytes += match o {
                Patched::Stored(view) => match view.json {
                    StoredJson::Text(text) => text.len(),
                    StoredJson::Packed { len, .. } => len as usize,
                },
                Patched::Changed(record) => record.json_len(),
            };
        });
        (patched.count, patched.json_bytes) = (count, json_bytes);
        patched
    }

    /// Calls `each` with every object in key order: the chunk's, a changed key's
    /// taken from its change (none for a delete).
    fn walk(&self, mut each: impl FnMut(Patched<'_, '_>)) {
        let mut changes = self.changes.iter().peekable();
        // Verified when it was read: it reads the same again.
        let _ = self.chunk.plain.read(&self.chunk.dictionaries, |view| {
            let key = [view.resource, view.cluster, view.namespace, view.name];
            while let Some((_, state)) = changes.next_if(|(k, _)| key_parts(k) < key) {
                if let Some(record) = state {
                    each(Patched::Changed(record));
                }
            }
            match changes.next_if(|(k, _)| key_parts(k) == key) {
                Some((_, Some(record))) => each(Patched::Changed(record)),
                Some((_, None)) => {}
                None => each(Patched::Stored(view)),
            }
        });
        for record in changes.filter_map(|(_, state)| state.as_ref()) {
            each(Patched::Changed(record));
        }
    }

    /// Its objects as records.
    fn records(&self) -> Vec<ObjectRecord> {
        let (mut out, mut last) = (Vec::with_capacity(self.count), None);
        // Compressed objects share one empty text (an allocation each otherwise).
        let empty = fleetscope_model::Json::default();
        self.walk(|o| {
            out.push(match o {
                Patched::Stored(view) => codec::record_of(view, &mut last, &empty),
                Patched::Changed(record) => record.clone(),
            })
        });
        out
    }
}

/// A key's parts, in the order keys are ordered by.
fn key_parts(k: &ObjectKey) -> [&str; 4] {
    [&k.resource, k.cluster.as_str(), &k.namespace, &k.name]
}

impl StoredRun for PatchedChunk {
    fn len(&self) -> usize {
        self.count
    }

    fn visit(&self, each: &mut dyn FnMut(&StoredView<'_>)) {
        self.walk(|o| match o {
            Patched::Stored(view) => each(view),
            Patched::Changed(record) => view_record(record, each),
        });
    }
}

/// Calls `each` with a view of `record`.
fn view_record(record: &ObjectRecord, each: &mut dyn FnMut(&StoredView<'_>)) {
    let state = &record.state;
    let labels: Vec<(&str, &str)> = record.labels().collect();
    let owners: Vec<&str> = record.owners().collect();
    let fields: Vec<(&str, &str)> = record.fields().collect();
    let json = match &record.packed {
        Some(packed) => StoredJson::Packed {
            dictionary: packed.dictionary(),
            // A text's length fits 32 bits: it was packed from one.
            len: u32::try_from(packed.text_len()).unwrap_or(u32::MAX),
            bytes: packed.bytes(),
        },
        None => StoredJson::Text(state.json.as_str()),
    };
    let [resource, cluster, namespace, name] = key_parts(&state.key);
    each(&StoredView {
        resource,
        cluster,
        namespace,
        name,
        revision: record.revision,
        json,
        labels: &labels,
        owners: &owners,
        fields: &fields,
    });
}

/// The objects of the current snapshot (`snapshot`), from its decoded `chunks`,
/// checked whole and in order; the chunks of any other snapshot (one whose writing
/// was interrupted) are removed from `store`, whatever they held.
pub(crate) fn snapshot_objects<S: Store + ?Sized>(
    store: &S,
    snapshot: Option<SnapshotMeta>,
    chunks: Vec<crate::DecodedChunk>,
    mut dictionaries: crate::SnapshotDictionaries,
) -> Result<Vec<StoredChunk>, StoreError> {
    let current = snapshot.map(|s| s.id);
    let (mine, stale): (Vec<_>, Vec<_>) = chunks
        .into_iter()
        .partition(|((id, _), _)| Some(*id) == current);
    let numbers = current
        .and_then(|id| dictionaries.0.remove(&id))
        .map_or(0, |(numbers, _)| numbers.len());
    let stale_dictionaries: Writes = dictionaries
        .0
        .iter()
        .flat_map(|(id, (numbers, _))| {
            numbers
                .iter()
                .map(|n| (codec::dictionary_key(*id, *n), None))
        })
        .collect();
    if !stale.is_empty() || !stale_dictionaries.is_empty() {
        tracing::warn!(
            chunks = stale.len(),
            dictionaries = stale_dictionaries.len(),
            "removing the chunks of a snapshot whose writing was interrupted"
        );
        store.write(
            stale
                .iter()
                .map(|((id, i), _)| (codec::chunk_key(*id, *i), None))
                .chain(stale_dictionaries)
                .collect(),
        )?;
    }
    let Some(meta) = snapshot else {
        return Ok(Vec::new());
    };
    if numbers != meta.dictionaries as usize {
        return Err(StoreError::Damaged(format!(
            "snapshot {} has {numbers} of its {} dictionaries",
            meta.id, meta.dictionaries
        )));
    }
    if mine.len() != meta.chunks as usize
        || mine
            .iter()
            .enumerate()
            .any(|(n, ((_, i), _))| *i as usize != n)
    {
        return Err(StoreError::Damaged(format!(
            "snapshot {} has {} of its {} chunks",
            meta.id,
            mine.len(),
            meta.chunks
        )));
    }
    // Each chunk was checked in key order as it was read; here, each against the
    // one before.
    let chunks = mine
        .into_iter()
        .map(|((id, i), decoded)| {
            decoded.map_err(|e| StoreError::Damaged(format!("snapshot {id} chunk {i}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut ends = chunks.iter().filter_map(StoredChunk::ends);
    let in_order = ends.next().is_none_or(|(_, mut end)| {
        ends.all(|(first, last)| std::mem::replace(&mut end, last) < first)
    });
    if chunks.iter().map(StoredChunk::len).sum::<usize>() as u64 != meta.objects || !in_order {
        return Err(StoreError::Damaged(format!(
            "snapshot {} does not hold its {} objects in order",
            meta.id, meta.objects
        )));
    }
    Ok(chunks)
}

/// The snapshot's objects (its chunks, each in key order and all of them in order)
/// with the change log applied, in key order: a chunk the log did not change is
/// passed on as it is; one it did, with the changes to keys within it laid over it
/// ([`PatchedChunk`]); changes to keys between chunks as records.
pub(crate) fn replay(chunks: Vec<StoredChunk>, changes: &[&EventRecord]) -> Objects {
    let started = std::time::Instant::now();
    // The last change per key wins: the changes in key order, each key's in the
    // order they were made (a stable sort), then each key's last.
    let mut last: Vec<(&ObjectKey, Option<&ObjectRecord>)> = changes
        .iter()
        .map(|e| {
            let state = match e.kind {
                EventType::Deleted => None,
                _ => Some(&e.object),
            };
            (&e.object.state.key, state)
        })
        .collect();
    last.sort_by(|a, b| a.0.cmp(b.0));
    last.reverse();
    last.dedup_by(|later, earlier| later.0 == earlier.0);
    last.reverse();
    let keys = last.len();
    let mut changed = last.into_iter().peekable();
    let mut pending = Vec::new();
    // Records of the run being gathered: changes to keys between chunks.
    let mut records: Vec<ObjectRecord> = Vec::new();
    for chunk in chunks {
        let Some((first, end)) = chunk.ends() else {
            continue;
        };
        // The states of changes to keys before the chunk.
        while let Some((_, state)) = changed.next_if(|(k, _)| *k < first) {
            records.extend(state.cloned());
        }
        // The changes to keys within it (their records copied where it is patched).
        let within: Vec<(&ObjectKey, Option<&ObjectRecord>)> =
            std::iter::from_fn(|| changed.next_if(|(k, _)| *k <= end)).collect();
        if !records.is_empty() {
            pending.push(Pending::Run(Run::Records(std::mem::take(&mut records))));
        }
        pending.push(if within.is_empty() {
            Pending::Run(Run::Chunk(chunk))
        } else {
            Pending::Patch(chunk, within)
        });
    }
    records.extend(changed.filter_map(|(_, s)| s.cloned()));
    if !records.is_empty() {
        pending.push(Pending::Run(Run::Records(records)));
    }
    let gathered_in = started.elapsed();
    let patched = pending
        .iter()
        .filter(|p| matches!(p, Pending::Patch(..)))
        .count();
    let runs = patch_all(pending);
    tracing::debug!(
        changes = changes.len(),
        keys,
        patched,
        ?gathered_in,
        took = ?started.elapsed(),
        "change log replayed onto the snapshot"
    );
    Objects(runs)
}

/// A run of a replay, or a chunk and the changes to lay over it.
enum Pending<'c> {
    Run(Run),
    Patch(StoredChunk, Vec<(&'c ObjectKey, Option<&'c ObjectRecord>)>),
}

/// The runs of `pending`, in order: each chunk with changes patched (their records
/// copied, the chunk read whole), on as many threads as there are cores (up to
/// four), a stretch each.
fn patch_all(mut pending: Vec<Pending<'_>>) -> Vec<Run> {
    let patch = |part: Vec<Pending<'_>>| -> Vec<Run> {
        part.into_iter()
            .filter_map(|p| match p {
                Pending::Run(run) => Some(run),
                Pending::Patch(chunk, within) => {
                    let within = within
                        .into_iter()
                        .map(|(key, state)| (key.clone(), state.cloned()))
                        .collect();
                    let patched = PatchedChunk::new(chunk, within);
                    // A chunk whose every object was deleted holds none.
                    (patched.count > 0).then_some(Run::Patched(patched))
                }
            })
            .collect()
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    if threads < 2 || pending.len() < 2 * threads {
        return patch(pending);
    }
    let per = pending.len().div_ceil(threads);
    let mut parts = Vec::with_capacity(threads);
    while pending.len() > per {
        let rest = pending.split_off(per);
        parts.push(std::mem::replace(&mut pending, rest));
    }
    parts.push(pending);
    std::thread::scope(|s| {
        let patching: Vec<_> = parts
            .into_iter()
            .map(|part| s.spawn(move || patch(part)))
            .collect();
        patching
            .into_iter()
            .flat_map(|t| {
                t.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}
