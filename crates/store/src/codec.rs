//! Record encoding: length-prefixed fields behind a CRC-32 of the payload, so every
//! record read back is either exactly what was written or detected as damaged. The
//! large records (snapshot chunks and event runs) hold their payload LZ4-compressed,
//! behind its plain length; the checksum covers the bytes as stored.

use std::collections::HashMap;
use std::sync::Arc;

use fleetscope_model::{
    ClusterName, EventType, Location, ObjectKey, ObjectState, PackedJson, ResourceType, Revision,
    StoredJson, StoredObject, StoredView,
};

use crate::{
    DiscoveryRecord, EventRecord, ObjectRecord, ServedRecord, SnapshotMeta, StoredEvent,
    StreamRecord,
};

/// Why a record could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its checksum.
    #[error("record of {0} bytes is too short")]
    Short(usize),
    /// The checksum does not match the payload.
    #[error("checksum mismatch")]
    Checksum,
    /// The payload ends early or holds a value out of range.
    #[error("malformed record: {0}")]
    Malformed(&'static str),
}

pub(crate) const META_SCHEMA: &[u8] = b"m:schema";
pub(crate) const META_REVISION: &[u8] = b"m:revision";
pub(crate) const META_CLUSTERS: &[u8] = b"m:clusters";
pub(crate) const META_FIELD_INDEXES: &[u8] = b"m:field-indexes";
pub(crate) const META_SNAPSHOT: &[u8] = b"m:snapshot";
pub(crate) const DICTIONARY_PREFIX: &[u8] = b"a:";
pub(crate) const CHUNK_PREFIX: &[u8] = b"b:";
pub(crate) const EVENT_PREFIX: &[u8] = b"e:";
pub(crate) const STREAM_PREFIX: &[u8] = b"s:";
pub(crate) const DISCOVERY_PREFIX: &[u8] = b"d:";

/// `d:` cluster: what the cluster's discovery last answered.
pub(crate) fn discovery_key(cluster: &ClusterName) -> Vec<u8> {
    let mut k = DISCOVERY_PREFIX.to_vec();
    k.extend_from_slice(cluster.as_str().as_bytes());
    k
}

/// `b:`, the snapshot id and the chunk's index, big-endian: a snapshot's chunks in order.
pub(crate) fn chunk_key(snapshot: u64, index: u32) -> Vec<u8> {
    numbered_key(CHUNK_PREFIX, snapshot, index)
}

/// The snapshot id and chunk index of a chunk key.
pub(crate) fn parse_chunk_key(key: &[u8]) -> Option<(u64, u32)> {
    parse_numbered_key(CHUNK_PREFIX, key)
}

/// `a:`, the snapshot id and the dictionary's number, big-endian: a snapshot's
/// dictionaries, which scan before any chunk.
pub(crate) fn dictionary_key(snapshot: u64, index: u32) -> Vec<u8> {
    numbered_key(DICTIONARY_PREFIX, snapshot, index)
}

/// The snapshot id and number of a dictionary key.
pub(crate) fn parse_dictionary_key(key: &[u8]) -> Option<(u64, u32)> {
    parse_numbered_key(DICTIONARY_PREFIX, key)
}

/// `prefix`, a snapshot id and a number, big-endian, so they scan in order.
fn numbered_key(prefix: &[u8], snapshot: u64, index: u32) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&snapshot.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}

fn parse_numbered_key(prefix: &[u8], key: &[u8]) -> Option<(u64, u32)> {
    let rest = key.strip_prefix(prefix)?;
    if rest.len() != 12 {
        return None;
    }
    let id: [u8; 8] = rest[..8].try_into().ok()?;
    let index: [u8; 4] = rest[8..].try_into().ok()?;
    Some((u64::from_be_bytes(id), u32::from_be_bytes(index)))
}

/// `e:` and the revision, big-endian, so events scan in revision order.
pub(crate) fn event_key(revision: Revision) -> Vec<u8> {
    let mut k = EVENT_PREFIX.to_vec();
    k.extend_from_slice(&revision.0.to_be_bytes());
    k
}

/// The first revision of an event record's key.
pub(crate) fn parse_event_key(key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(EVENT_PREFIX)?;
    let bytes: [u8; 8] = rest.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// `s:` cluster NUL resource.
pub(crate) fn stream_key(cluster: &ClusterName, resource: &str) -> Vec<u8> {
    let mut k = STREAM_PREFIX.to_vec();
    k.extend_from_slice(cluster.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(resource.as_bytes());
    k
}

/// Builds a payload and seals it with its checksum.
#[derive(Default)]
pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub(crate) fn new() -> Self {
        Self(vec![0; 4])
    }

    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        // Strings longer than 4 GiB cannot come from a Kubernetes object.
        self.u32(u32::try_from(s.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(s.as_bytes());
        self
    }

    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        // Compressed texts and dictionaries are far below 4 GiB (objects are).
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(b);
        self
    }

    fn pairs<'p>(&mut self, pairs: impl ExactSizeIterator<Item = (&'p str, &'p str)>) -> &mut Self {
        self.u32(pairs.len() as u32);
        for (k, v) in pairs {
            self.str(k).str(v);
        }
        self
    }

    /// An object, its JSON as text (an event record's).
    fn object(&mut self, o: &impl StoredObject) -> &mut Self {
        self.key_of(o).str(&o.json()).terms_of(o)
    }

    /// An object of a snapshot's chunk: its JSON behind a tag, as text (0) or
    /// `packed` (1: the text's length, then the compressed bytes).
    fn chunk_object(&mut self, o: &impl StoredObject, packed: Option<&PackedJson>) -> &mut Self {
        self.key_of(o);
        match packed {
            Some(p) => self
                .u8(1)
                // A text's length fits 32 bits: it was packed from one.
                .u32(u32::try_from(p.text_len()).unwrap_or(u32::MAX))
                .bytes(p.bytes()),
            None => self.u8(0).str(&o.json()),
        };
        self.terms_of(o)
    }

    fn key_of(&mut self, o: &impl StoredObject) -> &mut Self {
        let key = o.key();
        self.str(&key.resource)
            .str(key.cluster.as_str())
            .str(&key.namespace)
            .str(&key.name)
            .u64(o.revision().0)
    }

    fn terms_of(&mut self, o: &impl StoredObject) -> &mut Self {
        self.pairs(o.labels());
        let owners = o.owners();
        self.u32(owners.len() as u32);
        for uid in owners {
            self.str(uid);
        }
        self.pairs(o.fields())
    }

    pub(crate) fn seal(mut self) -> Vec<u8> {
        let crc = crc32fast::hash(&self.0[4..]);
        self.0[..4].copy_from_slice(&crc.to_le_bytes());
        self.0
    }

    /// Seals the payload compressed: checksum, plain length, LZ4 block.
    pub(crate) fn seal_compressed(self) -> Vec<u8> {
        let plain = &self.0[4..];
        let compressed = lz4_flex::block::compress(plain);
        let mut w = Writer(Vec::with_capacity(8 + compressed.len()));
        w.0.extend_from_slice(&[0; 4]);
        // A record's payload is far below 4 GiB (chunks and runs are kilobytes).
        w.u32(u32::try_from(plain.len()).unwrap_or(u32::MAX));
        w.0.extend_from_slice(&compressed);
        w.seal()
    }
}

/// No record's payload is larger: a plain length above it is damage.
const MAX_PLAIN: usize = 256 << 20;

/// Opens a record sealed by [`Writer::seal_compressed`]: the checksum checked, the
/// payload decompressed.
pub(crate) fn unseal_compressed(record: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut r = Reader::open(record)?;
    let len = r.u32()? as usize;
    let src = r.0;
    // LZ4 expands at most 255-fold.
    if len > MAX_PLAIN || len > src.len().saturating_mul(255).saturating_add(16) {
        return Err(DecodeError::Malformed(
            "plain length does not fit the record",
        ));
    }
    let mut plain = vec![0; len];
    match lz4_flex::block::decompress_into(src, &mut plain) {
        Ok(n) if n == len => Ok(plain),
        _ => Err(DecodeError::Malformed(
            "compressed payload does not decompress",
        )),
    }
}

/// Reads a sealed payload after checking its checksum.
pub(crate) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn open(record: &'a [u8]) -> Result<Self, DecodeError> {
        if record.len() < 4 {
            return Err(DecodeError::Short(record.len()));
        }
        let (crc, payload) = record.split_at(4);
        if crc32fast::hash(payload).to_le_bytes() != crc {
            return Err(DecodeError::Checksum);
        }
        Ok(Self(payload))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Malformed("ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Malformed("not UTF-8"))
    }

    fn count(&mut self) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        // Each element takes at least four bytes: a larger count is damage, not a reason to allocate.
        if n > self.0.len() / 4 {
            return Err(DecodeError::Malformed("count exceeds the record"));
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    #[cfg(test)]
    fn object(&mut self) -> Result<ObjectRecord, DecodeError> {
        self.object_near(&mut None)
    }

    /// An object whose JSON is text (an event's), sharing `last`'s location when it
    /// is the same.
    fn object_near(
        &mut self,
        last: &mut Option<Arc<Location>>,
    ) -> Result<ObjectRecord, DecodeError> {
        let mut scratch = Scratch::default();
        let (key, revision, json) = self.head(Bodies::Text)?;
        self.terms(&mut scratch)?;
        let view = scratch.view(key, revision, json);
        Ok(record_of(&view, last, &fleetscope_model::Json::default()))
    }

    /// An object's key, revision and JSON (held as `bodies` says), read in place.
    fn head<'d>(
        &mut self,
        bodies: Bodies<'d>,
    ) -> Result<([&'a str; 4], Revision, StoredJson<'d>), DecodeError>
    where
        'a: 'd,
    {
        let key = [self.str()?, self.str()?, self.str()?, self.str()?];
        let revision = Revision(self.u64()?);
        let json = match bodies {
            Bodies::Text => StoredJson::Text(self.str()?),
            Bodies::Tagged(dictionaries) => match self.u8()? {
                0 => StoredJson::Text(self.str()?),
                1 => {
                    let len = self.u32()?;
                    let bytes = self.bytes()?;
                    let dictionary = dictionaries.get(key[0]).ok_or(DecodeError::Malformed(
                        "an object compressed against a dictionary the snapshot does not hold",
                    ))?;
                    StoredJson::Packed {
                        dictionary,
                        len,
                        bytes,
                    }
                }
                _ => return Err(DecodeError::Malformed("unknown form of an object's JSON")),
            },
        };
        Ok((key, revision, json))
    }

    /// An object's labels, owners and fields, read in place into `scratch`.
    fn terms(&mut self, scratch: &mut Scratch<'a>) -> Result<(), DecodeError> {
        scratch.labels.clear();
        scratch.owners.clear();
        scratch.fields.clear();
        for _ in 0..self.count()? {
            scratch.labels.push((self.str()?, self.str()?));
        }
        for _ in 0..self.count()? {
            scratch.owners.push(self.str()?);
        }
        for _ in 0..self.count()? {
            scratch.fields.push((self.str()?, self.str()?));
        }
        Ok(())
    }

    pub(crate) fn end(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed("trailing bytes"))
        }
    }
}

/// How a record holds each object's JSON.
#[derive(Clone, Copy)]
pub(crate) enum Bodies<'d> {
    /// As text: an event record, and a chunk of the layout before.
    Text,
    /// Behind a tag, as text or compressed against the snapshot's dictionary of the
    /// object's type.
    Tagged(&'d Dictionaries),
}

/// A snapshot's dictionaries, by resource type.
pub(crate) type Dictionaries = HashMap<String, Arc<[u8]>>;

/// Where an object's labels, owners and fields are read into, in place: reused from
/// one object to the next, so reading one allocates nothing.
#[derive(Default)]
struct Scratch<'a> {
    labels: Vec<(&'a str, &'a str)>,
    owners: Vec<&'a str>,
    fields: Vec<(&'a str, &'a str)>,
}

impl<'a> Scratch<'a> {
    fn view(&self, key: [&'a str; 4], revision: Revision, json: StoredJson<'a>) -> StoredView<'_> {
        let [resource, cluster, namespace, name] = key;
        StoredView {
            resource,
            cluster,
            namespace,
            name,
            revision,
            json,
            labels: &self.labels,
            owners: &self.owners,
            fields: &self.fields,
        }
    }
}

/// A record of the object `view`, sharing `last`'s location when it is the same (a
/// record holds objects in key order, so neighbours mostly share one), and `empty` as
/// the text of a compressed one (its JSON is `packed`).
pub(crate) fn record_of(
    view: &StoredView<'_>,
    last: &mut Option<Arc<Location>>,
    empty: &fleetscope_model::Json,
) -> ObjectRecord {
    let location = match last {
        Some(l)
            if *l.resource == *view.resource
                && l.cluster.as_str() == view.cluster
                && *l.namespace == *view.namespace =>
        {
            l.clone()
        }
        _ => {
            let fresh = Arc::new(Location {
                resource: view.resource.into(),
                cluster: ClusterName::from(view.cluster),
                namespace: view.namespace.into(),
            });
            *last = Some(fresh.clone());
            fresh
        }
    };
    let (json, packed) = match view.json {
        StoredJson::Text(text) => (fleetscope_model::Json::from(text), None),
        StoredJson::Packed {
            dictionary,
            len,
            bytes,
        } => (
            empty.clone(),
            Some(triomphe::Arc::new(PackedJson::stored(
                dictionary.clone(),
                len,
                bytes.into(),
            ))),
        ),
    };
    let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    ObjectRecord {
        revision: view.revision,
        state: ObjectState {
            key: ObjectKey::in_location(location, view.name.into()),
            json,
            labels: owned(view.labels),
            owners: view.owners.iter().map(|u| (*u).to_owned()).collect(),
            fields: owned(view.fields),
        },
        packed,
    }
}

/// A chunk's first word holds its object count in the low 24 bits (a chunk of a few
/// kilobytes holds a few hundred) and its form in the high 8: 0 for a chunk of the
/// layout before, every object's JSON as text; this for one whose JSON is tagged
/// ([`Bodies::Tagged`]).
const TAGGED_CHUNK: u32 = 1 << 24;

/// Builds one chunk of a snapshot: objects in key order behind one checksum.
pub(crate) struct ChunkWriter {
    w: Writer,
    count: u32,
}

impl ChunkWriter {
    pub(crate) fn new() -> Self {
        let mut w = Writer::new();
        w.u32(0);
        Self { w, count: 0 }
    }

    /// Adds an object, its JSON `packed` when given (against the dictionary of its
    /// type the snapshot holds), as text otherwise.
    pub(crate) fn push(&mut self, o: &impl StoredObject, packed: Option<&PackedJson>) {
        self.w.chunk_object(o, packed);
        self.count += 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.w.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(crate) fn seal(mut self) -> Vec<u8> {
        // A chunk is sealed once it passes a few kilobytes, each object taking at
        // least 28 bytes: its count stays far below the form's bits.
        let head = (self.count & (TAGGED_CHUNK - 1)) | TAGGED_CHUNK;
        self.w.0[4..8].copy_from_slice(&head.to_le_bytes());
        self.w.seal_compressed()
    }
}

/// A snapshot's chunk, its checksum checked and its payload decompressed: its
/// objects read in place, as often as needed.
#[derive(Debug)]
pub(crate) struct PlainChunk(Vec<u8>);

/// What reading a whole chunk found besides its objects.
#[derive(Debug)]
pub(crate) struct ChunkSummary<'a> {
    /// How many objects it holds.
    pub(crate) count: usize,
    /// The parts of its first and last key (`None` for an empty chunk).
    pub(crate) ends: Option<([&'a str; 4], [&'a str; 4])>,
    /// The length of its objects' JSON.
    pub(crate) json_bytes: usize,
}

impl PlainChunk {
    pub(crate) fn open(record: &[u8]) -> Result<Self, DecodeError> {
        unseal_compressed(record).map(Self)
    }

    /// Calls `each` with every object of the chunk, in order, any compressed ones
    /// against `dictionaries` (the snapshot's), checking the chunk whole: its form and
    /// count, each object, their key order, nothing after them.
    pub(crate) fn read(
        &self,
        dictionaries: &Dictionaries,
        mut each: impl FnMut(&StoredView<'_>),
    ) -> Result<ChunkSummary<'_>, DecodeError> {
        let mut r = Reader(&self.0);
        let head = r.u32()?;
        let bodies = match head & !(TAGGED_CHUNK - 1) {
            0 => Bodies::Text,
            TAGGED_CHUNK => Bodies::Tagged(dictionaries),
            _ => return Err(DecodeError::Malformed("unknown chunk form")),
        };
        let count = (head & (TAGGED_CHUNK - 1)) as usize;
        // Each object takes at least 28 bytes: a larger count is damage.
        if count > r.0.len() / 28 {
            return Err(DecodeError::Malformed("count exceeds the chunk"));
        }
        let mut scratch = Scratch::default();
        let (mut first, mut last): (Option<[&str; 4]>, Option<[&str; 4]>) = (None, None);
        let mut json_bytes = 0;
        for _ in 0..count {
            let (key, revision, json) = r.head(bodies)?;
            if last.is_some_and(|before| before >= key) {
                return Err(DecodeError::Malformed("objects out of key order"));
            }
            first.get_or_insert(key);
            last = Some(key);
            json_bytes += match json {
                StoredJson::Text(text) => text.len(),
                StoredJson::Packed { len, .. } => len as usize,
            };
            r.terms(&mut scratch)?;
            each(&scratch.view(key, revision, json));
        }
        r.end()?;
        Ok(ChunkSummary {
            count,
            ends: first.zip(last),
            json_bytes,
        })
    }

    /// The chunk's objects as records.
    pub(crate) fn records(
        &self,
        dictionaries: &Dictionaries,
    ) -> Result<Vec<ObjectRecord>, DecodeError> {
        let (mut out, mut last) = (Vec::new(), None);
        // Compressed objects share one empty text (an allocation each otherwise).
        let empty = fleetscope_model::Json::default();
        self.read(dictionaries, |view| {
            out.push(record_of(view, &mut last, &empty));
        })?;
        Ok(out)
    }
}

/// A snapshot's chunk as records: its objects, any compressed ones against
/// `dictionaries` (the snapshot's).
#[cfg(test)]
pub(crate) fn decode_chunk(
    record: &[u8],
    dictionaries: &Dictionaries,
) -> Result<Vec<ObjectRecord>, DecodeError> {
    PlainChunk::open(record)?.records(dictionaries)
}

/// A chunk and a snapshot record as the layout before wrote them (every object's JSON
/// as text; no dictionaries), to test that they are read.
#[cfg(test)]
pub(crate) fn layout_before(objects: &[ObjectRecord], s: &SnapshotMeta) -> (Vec<u8>, Vec<u8>) {
    let mut chunk = Writer::new();
    chunk.u32(objects.len() as u32);
    for o in objects {
        chunk.object(o);
    }
    let mut meta = Writer::new();
    meta.u64(s.id)
        .u64(s.revision.0)
        .u32(s.chunks)
        .u64(s.objects);
    (chunk.seal_compressed(), meta.seal())
}

/// A snapshot's dictionary: the resource type whose objects were compressed against
/// it, and its bytes.
pub(crate) fn encode_dictionary(resource: &str, dictionary: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.str(resource).bytes(dictionary);
    w.seal_compressed()
}

pub(crate) fn decode_dictionary(record: &[u8]) -> Result<(String, Arc<[u8]>), DecodeError> {
    let plain = unseal_compressed(record)?;
    let mut r = Reader(&plain);
    let resource = r.str()?.to_string();
    let dictionary = Arc::from(r.bytes()?);
    r.end()?;
    Ok((resource, dictionary))
}

#[cfg(test)]
pub(crate) fn encode_object(o: &ObjectRecord) -> Vec<u8> {
    let mut w = Writer::new();
    w.object(o);
    w.seal()
}

#[cfg(test)]
pub(crate) fn decode_object(record: &[u8]) -> Result<ObjectRecord, DecodeError> {
    let mut r = Reader::open(record)?;
    let o = r.object()?;
    r.end()?;
    Ok(o)
}

pub(crate) fn encode_snapshot(s: &SnapshotMeta) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(s.id)
        .u64(s.revision.0)
        .u32(s.chunks)
        .u64(s.objects)
        .u32(s.dictionaries);
    w.seal()
}

pub(crate) fn decode_snapshot(record: &[u8]) -> Result<SnapshotMeta, DecodeError> {
    let mut r = Reader::open(record)?;
    let s = SnapshotMeta {
        id: r.u64()?,
        revision: Revision(r.u64()?),
        chunks: r.u32()?,
        objects: r.u64()?,
        // A snapshot of the layout before has none (and no field for them).
        dictionaries: 0,
    };
    let s = if r.0.is_empty() {
        s
    } else {
        SnapshotMeta {
            dictionaries: r.u32()?,
            ..s
        }
    };
    r.end()?;
    Ok(s)
}

fn kind_code(kind: EventType) -> u8 {
    match kind {
        EventType::Added => 1,
        EventType::Modified => 2,
        EventType::Deleted => 3,
    }
}

impl Writer {
    fn event(&mut self, e: &impl StoredEvent) -> &mut Self {
        self.u64(e.revision().0)
            .u8(kind_code(e.kind()))
            .object(e.object());
        match e.prev() {
            Some(p) => self.u8(1).object(p),
            None => self.u8(0),
        }
    }
}

impl Reader<'_> {
    /// An event's kind, as [`kind_code`] wrote it.
    fn event_kind(&mut self) -> Result<EventType, DecodeError> {
        match self.u8()? {
            1 => Ok(EventType::Added),
            2 => Ok(EventType::Modified),
            3 => Ok(EventType::Deleted),
            _ => Err(DecodeError::Malformed("unknown event type")),
        }
    }

    /// A change log record's count of events.
    fn event_count(&mut self) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        // Each event takes at least 38 bytes: a larger count is damage.
        if n == 0 || n > self.0.len() / 38 {
            return Err(DecodeError::Malformed(
                "event count does not fit the record",
            ));
        }
        Ok(n)
    }

    /// Passes over an object as an event record holds it; returns its JSON's length.
    fn skip_object(&mut self) -> Result<usize, DecodeError> {
        for _ in 0..4 {
            self.bytes()?;
        }
        self.u64()?;
        let json = self.bytes()?.len();
        for pairs in [2, 1, 2] {
            for _ in 0..self.count()? * pairs {
                self.bytes()?;
            }
        }
        Ok(json)
    }

    /// An event, its objects sharing `last`'s location when it is the same (a
    /// record's events mostly come from one stream).
    fn event(
        &mut self,
        last: &mut Option<std::sync::Arc<Location>>,
    ) -> Result<EventRecord, DecodeError> {
        let revision = Revision(self.u64()?);
        let kind = self.event_kind()?;
        let object = self.object_near(last)?;
        let prev = match self.u8()? {
            0 => None,
            1 => Some(self.object_near(last)?),
            _ => return Err(DecodeError::Malformed("bad previous-state flag")),
        };
        Ok(EventRecord {
            revision,
            kind,
            object,
            prev,
        })
    }
}

/// Consecutive events in one record, keyed by the first one's revision: each encoded
/// from where it is held, nothing copied first. `None` for no events.
pub(crate) fn encode_events<E: StoredEvent>(
    events: impl IntoIterator<Item = E>,
) -> Option<(Revision, Revision, Vec<u8>)> {
    let mut w = Writer::new();
    // The count goes first; it is known at the end.
    w.u32(0);
    let mut n: u32 = 0;
    let mut range = None;
    for e in events {
        let r = e.revision();
        range = Some(range.map_or((r, r), |(first, _)| (first, r)));
        w.event(&e);
        n += 1;
    }
    w.0[4..8].copy_from_slice(&n.to_le_bytes());
    let (first, last) = range?;
    Some((first, last, w.seal_compressed()))
}

pub(crate) fn decode_events(record: &[u8]) -> Result<Vec<EventRecord>, DecodeError> {
    decode_plain_events(&unseal_compressed(record)?)
}

/// What a change log record holds, read without making its events: the first and
/// last revision, the events, and their JSON bytes (as [`EventRecord::json_bytes`]
/// counts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Skimmed {
    pub first: u64,
    pub last: u64,
    pub events: usize,
    pub json_bytes: usize,
}

/// Reads a change log record's checksum and layout as [`decode_events`] does, without
/// copying out its objects; returns what it holds and the record unsealed (for
/// [`decode_plain_events`]).
pub(crate) fn skim_events(record: &[u8]) -> Result<(Skimmed, Vec<u8>), DecodeError> {
    let plain = unseal_compressed(record)?;
    let mut r = Reader(&plain);
    let n = r.event_count()?;
    let (mut first, mut last, mut json_bytes) = (0, 0, 0);
    for i in 0..n {
        let revision = r.u64()?;
        if i == 0 {
            first = revision;
        } else if revision != last + 1 {
            return Err(DecodeError::Malformed("events out of sequence"));
        }
        last = revision;
        r.event_kind()?;
        json_bytes += r.skip_object()?;
        match r.u8()? {
            0 => {}
            1 => json_bytes += r.skip_object()?,
            _ => return Err(DecodeError::Malformed("bad previous-state flag")),
        }
    }
    r.end()?;
    let skimmed = Skimmed {
        first,
        last,
        events: n,
        json_bytes,
    };
    Ok((skimmed, plain))
}

/// The events of an unsealed change log record.
pub(crate) fn decode_plain_events(plain: &[u8]) -> Result<Vec<EventRecord>, DecodeError> {
    let mut r = Reader(plain);
    let n = r.event_count()?;
    let mut out: Vec<EventRecord> = Vec::with_capacity(n);
    let mut last = None;
    for _ in 0..n {
        let e = r.event(&mut last)?;
        if out.last().is_some_and(|l| l.revision.next() != e.revision) {
            return Err(DecodeError::Malformed("events out of sequence"));
        }
        out.push(e);
    }
    r.end()?;
    Ok(out)
}

/// Writes a resource type's parts.
fn write_resource<'w>(w: &'w mut Writer, rt: &ResourceType) -> &'w mut Writer {
    w.str(&rt.group)
        .str(&rt.version)
        .str(&rt.plural)
        .str(&rt.kind)
        .u8(u8::from(rt.namespaced))
}

/// Reads what [`write_resource`] wrote.
fn read_resource(r: &mut Reader<'_>) -> Result<ResourceType, DecodeError> {
    Ok(ResourceType {
        group: r.str()?.to_string(),
        version: r.str()?.to_string(),
        plural: r.str()?.to_string(),
        kind: r.str()?.to_string(),
        namespaced: r.u8()? != 0,
    })
}

pub(crate) fn encode_stream(s: &StreamRecord) -> Vec<u8> {
    let mut w = Writer::new();
    w.str(s.cluster.as_str());
    write_resource(&mut w, &s.resource)
        .str(&s.resource_version)
        .str(&s.selection);
    w.seal()
}

pub(crate) fn decode_stream(record: &[u8]) -> Result<StreamRecord, DecodeError> {
    let mut r = Reader::open(record)?;
    let cluster = ClusterName::from(r.str()?);
    let resource = read_resource(&mut r)?;
    let resource_version = r.str()?.to_string();
    let selection = r.str()?.to_string();
    r.end()?;
    Ok(StreamRecord {
        cluster,
        resource,
        resource_version,
        selection,
    })
}

pub(crate) fn encode_discovery(d: &DiscoveryRecord) -> Vec<u8> {
    let mut w = Writer::new();
    w.str(d.cluster.as_str()).u32(d.served.len() as u32);
    for s in &d.served {
        write_resource(&mut w, &s.resource)
            .u8(u8::from(s.watchable))
            .str(&s.singular)
            .u32(s.short_names.len() as u32);
        for n in &s.short_names {
            w.str(n);
        }
    }
    w.seal()
}

pub(crate) fn decode_discovery(record: &[u8]) -> Result<DiscoveryRecord, DecodeError> {
    let mut r = Reader::open(record)?;
    let cluster = ClusterName::from(r.str()?);
    let n = r.count()?;
    let mut served = Vec::with_capacity(n);
    for _ in 0..n {
        let resource = read_resource(&mut r)?;
        let watchable = r.u8()? != 0;
        let singular = r.str()?.to_string();
        let names = r.count()?;
        let mut short_names = Vec::with_capacity(names);
        for _ in 0..names {
            short_names.push(r.str()?.to_string());
        }
        served.push(ServedRecord {
            resource,
            watchable,
            short_names,
            singular,
        });
    }
    r.end()?;
    Ok(DiscoveryRecord { cluster, served })
}

pub(crate) fn encode_u64(v: u64) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(v);
    w.seal()
}

pub(crate) fn decode_u64(record: &[u8]) -> Result<u64, DecodeError> {
    let mut r = Reader::open(record)?;
    let v = r.u64()?;
    r.end()?;
    Ok(v)
}

pub(crate) fn encode_names<S: AsRef<str>>(names: &[S]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(names.len() as u32);
    for n in names {
        w.str(n.as_ref());
    }
    w.seal()
}

pub(crate) fn decode_names(record: &[u8]) -> Result<Vec<String>, DecodeError> {
    let mut r = Reader::open(record)?;
    let n = r.count()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(r.str()?.to_string());
    }
    r.end()?;
    Ok(out)
}
