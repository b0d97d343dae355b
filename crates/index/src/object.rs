//! What the index holds of an object: its pruned JSON once, plus the few values the
//! secondary indexes need, shared between objects that carry the same ones.

use std::borrow::Cow;
use std::sync::Arc;

use fleetscope_model::selector::{Fields, Labels, field_in_json, metadata_json};
use fleetscope_model::{
    Location, ObjectKey, ObjectState, PackedJson, Revision, StoredJson, StoredView,
};
use imbl::OrdSet;

use crate::terms::{
    AllLabels, Interner, LabelSet, LocationOf, MAX_INDEXED_LABELS, PackedLabels, Terms, Uid,
};

/// Makes restored objects as the index holds them, sharing what they repeat through an
/// interner of its own: one maker per thread that makes them.
pub(crate) struct Maker {
    /// Whether the index holds objects compressed.
    compress: bool,
    pub(crate) interner: Interner,
    pub(crate) dictionaries: Dictionaries,
    /// The type whose dictionary was last adopted: objects come in key order, type
    /// first, and those of one type share one dictionary.
    adopted: Option<Arc<str>>,
    /// How many it made held compressed.
    pub(crate) compressed: u64,
    /// The newest revision of those it made.
    pub(crate) newest: Revision,
}

impl Maker {
    /// Two makers that work side by side, sharing the locations they make.
    pub(crate) fn pair(compress: bool) -> [Self; 2] {
        let alongside = Arc::default();
        [(); 2].map(|()| {
            let mut maker = Self::new(compress);
            maker.interner.alongside = Some(Arc::clone(&alongside));
            maker
        })
    }

    fn new(compress: bool) -> Self {
        Self {
            compress,
            interner: Interner::default(),
            dictionaries: Dictionaries::default(),
            adopted: None,
            compressed: 0,
            newest: Revision::default(),
        }
    }

    /// `input` as the index holds it, its JSON `packed` when given (as a snapshot
    /// stored it), with `revision`.
    pub(crate) fn make(
        &mut self,
        mut input: ObjectState,
        revision: Revision,
        packed: Option<triomphe::Arc<PackedJson>>,
    ) -> ObjectRef {
        self.newest = self.newest.max(revision);
        let packed = match packed.map(|p| self.held(&input.key.resource, p)) {
            Some(Body::Packed(p)) => Some(p),
            Some(Body::Text(text)) => {
                input.json = text;
                None
            }
            None => None,
        };
        Object::restored(input, revision, packed, &mut self.interner)
    }

    /// Makes an object from a record read in place, as a snapshot's chunk holds it.
    pub(crate) fn make_viewed(&mut self, view: &StoredView<'_>) -> ObjectRef {
        self.newest = self.newest.max(view.revision);
        let body = match view.json {
            StoredJson::Text(text) => Body::Text(fleetscope_model::Json::from(text)),
            StoredJson::Packed {
                dictionary,
                len,
                bytes,
            } => {
                // Its bytes in an allocation made here, among the index's.
                let packed = PackedJson::stored(dictionary.clone(), len, bytes.into());
                self.held(view.resource, triomphe::Arc::new(packed))
            }
        };
        Object::viewed(view, body, &mut self.interner)
    }

    /// How an object of `resource` stored compressed (`packed`) is held.
    fn held(&mut self, resource: &str, packed: triomphe::Arc<PackedJson>) -> Body {
        if !self.compress {
            // Held as text where the index does not compress.
            return Body::Text(fleetscope_model::Json::from(unpacked(&packed)));
        }
        // The objects of one type share the dictionary they were stored with, and the
        // index compresses others of that type against it too.
        if self.adopted.as_deref() != Some(resource) {
            let resource: Arc<str> = Arc::from(resource);
            self.dictionaries.adopt(&resource, packed.dictionary());
            self.adopted = Some(resource);
        }
        self.compressed += 1;
        Body::Packed(packed)
    }

    /// Takes in what `other` made alongside: what it shares, its dictionaries, its
    /// counts.
    pub(crate) fn absorb(&mut self, other: Maker) {
        self.interner.absorb(other.interner);
        self.dictionaries.absorb(other.dictionaries);
        self.compressed += other.compressed;
        self.newest = self.newest.max(other.newest);
    }
}

/// Each resource type's dictionary: the JSON of the first object of that type held
/// compressed. Objects of one type share most of their text with it.
#[derive(Debug, Default)]
pub(crate) struct Dictionaries(
    std::collections::HashMap<Arc<str>, Arc<[u8]>, foldhash::fast::RandomState>,
);

impl Dictionaries {
    /// The dictionary objects of `resource` like `json` are compressed against (made
    /// from `json` when the type has none yet); `None` when such an object is not
    /// compressed.
    pub(crate) fn of(&mut self, resource: &Arc<str>, json: &str) -> Option<Arc<[u8]>> {
        // A dictionary's reach is the compressor's window; an object far larger than
        // its dictionary gains little from it.
        const MOST: usize = 64 << 10;
        // A dictionary lives as long as the process: a Secret's would keep its values
        // in memory after it was changed or deleted. Secrets are held as text.
        if json.len() < PackedJson::LEAST || json.len() > MOST || &**resource == "secrets" {
            return None;
        }
        Some(
            self.0
                .entry(resource.clone())
                .or_insert_with(|| Arc::from(json.as_bytes()))
                .clone(),
        )
    }

    /// `json` compressed against its type's dictionary; `None` when it is not worth
    /// it or does not shrink.
    fn pack(&mut self, resource: &Arc<str>, json: &str) -> Option<triomphe::Arc<PackedJson>> {
        let dictionary = self.of(resource, json)?;
        PackedJson::pack(&dictionary, json).map(triomphe::Arc::new)
    }

    /// Takes the dictionaries of the types that have none here.
    pub(crate) fn absorb(&mut self, other: Dictionaries) {
        for (resource, dictionary) in other.0 {
            self.0.entry(resource).or_insert(dictionary);
        }
    }

    /// Takes `dictionary` as the one `resource`'s objects are compressed against,
    /// unless the type has one (a restored index's, read back with the objects
    /// compressed against it).
    pub(crate) fn adopt(&mut self, resource: &Arc<str>, dictionary: &Arc<[u8]>) {
        if !self.0.contains_key(resource) {
            self.0.insert(resource.clone(), dictionary.clone());
        }
    }
}

/// What an object is made of besides its JSON, its strings borrowed.
struct Parts<'a, S> {
    location: Arc<Location>,
    name: &'a str,
    labels: Labelled,
    owners: &'a [S],
    fields: &'a [(S, S)],
}

/// An object's labels: a set the index shares and indexes, or more than it indexes of
/// one object, the object's own.
enum Labelled {
    Indexed(LabelSet),
    Unindexed(PackedLabels),
}

/// An object held by the index, shared by the index's sets, snapshots and events: an
/// `Arc` without weak references, a word smaller per object.
pub type ObjectRef = triomphe::Arc<Object>;

/// An object's JSON as the index holds it: the same size as the text's handle alone.
#[derive(Debug, Clone)]
enum Body {
    /// The text, shared with every answer and event that carries it.
    Text(fleetscope_model::Json),
    /// Compressed against a dictionary of its type.
    Packed(triomphe::Arc<PackedJson>),
}

/// The text of a packed JSON. The bytes were compressed from UTF-8 text here, or read
/// back from a record whose checksum held: neither step fails, and an empty text
/// stands in should either.
pub(crate) fn unpacked(p: &PackedJson) -> String {
    p.text().unwrap_or_default()
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Text(json) => json.len(),
            Body::Packed(p) => p.text_len(),
        }
    }

    fn json(&self) -> fleetscope_model::Json {
        match self {
            Body::Text(json) => json.clone(),
            Body::Packed(p) => fleetscope_model::Json::from(unpacked(p)),
        }
    }

    fn text(&self) -> Cow<'_, str> {
        match self {
            Body::Text(json) => Cow::Borrowed(json.as_str()),
            Body::Packed(p) => Cow::Owned(unpacked(p)),
        }
    }

    fn into_text(self) -> Text {
        match self {
            Body::Text(json) => Text::Shared(json),
            Body::Packed(p) => Text::Made(unpacked(&p)),
        }
    }
}

/// An object's JSON read from the index: the text it holds, shared, or the text made
/// from its compressed form.
#[derive(Debug)]
pub(crate) enum Text {
    /// The text the index holds.
    Shared(fleetscope_model::Json),
    /// Made from the compressed form.
    Made(String),
}

impl std::ops::Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Text::Shared(json) => json.as_str(),
            Text::Made(text) => text,
        }
    }
}

impl PartialEq for Body {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Body::Text(a), Body::Text(b)) => a == b,
            // Compressing is deterministic: one text against one dictionary gives
            // the same bytes.
            (Body::Packed(a), Body::Packed(b)) if Arc::ptr_eq(a.dictionary(), b.dictionary()) => {
                a.text_len() == b.text_len() && a.bytes() == b.bytes()
            }
            _ => self.len() == other.len() && self.text() == other.text(),
        }
    }
}

impl Eq for Body {}

/// An object held by the index.
#[derive(Debug)]
pub struct Object {
    /// Identity.
    pub key: ObjectKey,
    /// The revision of the change that produced this state.
    pub revision: Revision,
    /// The pruned object as JSON, with apiVersion and kind: held as text when made,
    /// compressed in place once settled ([`Object::pack`]). Either form reads as the
    /// same text, of the same length; the lock is held only to read the length or to
    /// take or swap the handle. (The record fits 80 bytes with its count.)
    body: parking_lot::RwLock<Body>,
    terms: Arc<Terms>,
    /// The uid of the object's owner, when it has exactly one (most have).
    owner: Option<Uid>,
}

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
            && self.revision == other.revision
            && self.terms == other.terms
            && self.owner == other.owner
            && self.same_json(other)
    }
}

impl Eq for Object {}

/// Reads the top-level `metadata` and stops there: the rest of the object (usually
/// most of it, as `metadata` comes early) is not scanned.
struct MetaOnly<'a, 'b>(&'b mut Option<MetaFields<'a>>);

impl<'de, 'b> serde::de::DeserializeSeed<'de> for MetaOnly<'de, 'b> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, 'b> serde::de::Visitor<'de> for MetaOnly<'de, 'b> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "metadata" {
                *self.0 = Some(map.next_value()?);
                return Ok(());
            }
            map.next_value::<serde::de::IgnoredAny>()?;
        }
        Ok(())
    }
}

#[derive(serde::Deserialize, Default)]
struct MetaFields<'a> {
    #[serde(default, borrow, rename = "uid")]
    uid: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "resourceVersion")]
    resource_version: Option<Cow<'a, str>>,
}

/// metadata.uid and metadata.resourceVersion of an object's JSON, read in one pass that
/// stops after `metadata`; empty when absent.
pub fn uid_and_resource_version(json: &str) -> (String, String) {
    use serde::de::DeserializeSeed;
    let mut found = None;
    // Stopping early leaves the document unfinished, which the deserializer reports
    // as an error after the values were read: what was found is what counts.
    let _ = MetaOnly(&mut found).deserialize(&mut serde_json::Deserializer::from_str(json));
    let m = found.unwrap_or_default();
    (
        m.uid.map(Cow::into_owned).unwrap_or_default(),
        m.resource_version.map(Cow::into_owned).unwrap_or_default(),
    )
}

impl fleetscope_model::StoredObject for Object {
    fn key(&self) -> &ObjectKey {
        &self.key
    }
    fn revision(&self) -> Revision {
        self.revision
    }
    fn json(&self) -> impl std::ops::Deref<Target = str> + '_ {
        self.body().into_text()
    }
    fn labels(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        match &self.terms.unindexed {
            Some(packed) => AllLabels::Packed(packed, 0),
            None => AllLabels::Indexed(self.terms.labels.iter()),
        }
    }
    fn owners(&self) -> impl ExactSizeIterator<Item = &str> {
        self.owners().iter().map(|u| &**u)
    }
    fn fields(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.terms.fields.iter().map(|(p, v)| (&**p, &**v))
    }
}

impl Object {
    /// About how many bytes the object takes in an answer: its JSON, its key's parts,
    /// and room for its uid, resourceVersion, revision and framing. Pages are cut by it.
    pub fn wire_size(&self) -> usize {
        self.json_len()
            + self.key.resource.len()
            + self.key.cluster.as_str().len()
            + self.key.namespace.len()
            + self.key.name.len()
            + 96
    }

    /// Whether `other` carries the same label, owner and field values.
    pub(crate) fn same_terms(&self, other: &Object) -> bool {
        (Arc::ptr_eq(&self.terms, &other.terms) || self.terms == other.terms)
            && self.owner == other.owner
    }

    /// An object held outside any index (a member's history read for one
    /// subscriber), as the index would hold it, with `revision`.
    pub fn detached(input: ObjectState, revision: Revision) -> ObjectRef {
        Self::from_input(input, revision, &mut Interner::default())
    }

    /// An object as the index holds it, its JSON as text.
    pub(crate) fn from_input(
        input: ObjectState,
        revision: Revision,
        interner: &mut Interner,
    ) -> ObjectRef {
        Self::restored(input, revision, None, interner)
    }

    /// An object as the index holds it, its JSON `packed` when given (as a snapshot
    /// stored it; `input.json` is then not read), as text otherwise.
    pub(crate) fn restored(
        input: ObjectState,
        revision: Revision,
        packed: Option<triomphe::Arc<PackedJson>>,
        interner: &mut Interner,
    ) -> ObjectRef {
        let labels = if input.labels.len() > MAX_INDEXED_LABELS {
            Labelled::Unindexed(PackedLabels::new(input.labels))
        } else {
            let mut labels = input.labels;
            labels.sort_unstable();
            Labelled::Indexed(interner.labels(&labels))
        };
        let location = interner.location(input.key.location());
        Self::assemble(
            Parts {
                location,
                name: &input.key.name,
                labels,
                owners: &input.owners,
                fields: &input.fields,
            },
            match packed {
                Some(packed) => Body::Packed(packed),
                None => Body::Text(input.json),
            },
            revision,
            interner,
        )
    }

    /// An object as the index holds it, made from a record read in place (`view`),
    /// its JSON held as `body`.
    fn viewed(view: &StoredView<'_>, body: Body, interner: &mut Interner) -> ObjectRef {
        let labels = if view.labels.len() > MAX_INDEXED_LABELS {
            Labelled::Unindexed(PackedLabels::new(
                view.labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ))
        } else if view.labels.is_sorted() {
            // As a snapshot stores them: the index's own, sorted.
            Labelled::Indexed(interner.labels(view.labels))
        } else {
            let mut labels = view.labels.to_vec();
            labels.sort_unstable();
            Labelled::Indexed(interner.labels(&labels))
        };
        let location = interner.location_of(LocationOf {
            resource: view.resource,
            cluster: view.cluster,
            namespace: view.namespace,
        });
        Self::assemble(
            Parts {
                location,
                name: view.name,
                labels,
                owners: view.owners,
                fields: view.fields,
            },
            body,
            view.revision,
            interner,
        )
    }

    /// An object as the index holds it, of `parts` (strings borrowed from whoever
    /// holds them) and its JSON.
    fn assemble<S: AsRef<str>>(
        parts: Parts<'_, S>,
        body: Body,
        revision: Revision,
        interner: &mut Interner,
    ) -> ObjectRef {
        let (labels, unindexed) = match parts.labels {
            Labelled::Indexed(labels) => (labels, None),
            // Held packed and found by a scan; in the label index only as one of the
            // objects whose labels it does not hold.
            Labelled::Unindexed(packed) => {
                let unindexed: LabelSet = Arc::from([(Arc::from(""), Arc::from(""))]);
                (unindexed, Some(packed))
            }
        };
        // A sole owner, as most objects have, is the object's own: no list to make.
        let (owner, owners): (Option<Uid>, Box<[Uid]>) = match parts.owners {
            [sole] => (Some(interner.uid(sole.as_ref())), Box::default()),
            many => (
                None,
                many.iter().map(|u| interner.uid(u.as_ref())).collect(),
            ),
        };
        let terms = Terms {
            labels,
            unindexed,
            fields: parts
                .fields
                .iter()
                .map(|(p, v)| (interner.get(p.as_ref()), Arc::from(v.as_ref())))
                .collect(),
            owners,
        };
        // The name in an allocation of its own made now, among the index's, rather than
        // wherever its producer made it, among what it has since freed.
        let key = ObjectKey::in_location(parts.location, Arc::from(parts.name));
        ObjectRef::new(Self {
            // Shared with whoever made the input (the ingest, the store's load), not copied.
            body: parking_lot::RwLock::new(body),
            key,
            revision,
            // Labels past the cap are the object's own: not kept by the interner.
            terms: if terms.unindexed.is_some() {
                Arc::new(terms)
            } else {
                interner.terms(terms)
            },
            owner,
        })
    }

    /// Whether the object carries more labels than the label index takes of one
    /// object ([`MAX_INDEXED_LABELS`]): they are held, served and matched by a scan.
    pub fn labels_unindexed(&self) -> bool {
        self.terms.unindexed.is_some()
    }

    /// The same state, stamped with another revision (a delete carries the last state).
    pub(crate) fn restamped(&self, revision: Revision) -> Self {
        Self {
            key: self.key.clone(),
            revision,
            body: parking_lot::RwLock::new(self.body()),
            terms: self.terms.clone(),
            owner: self.owner.clone(),
        }
    }

    /// The JSON's handle, taken under the lock and held without it.
    fn body(&self) -> Body {
        self.body.read().clone()
    }

    /// Holds the JSON compressed against its type's dictionary, when it is held as
    /// text and compressing is worth it; returns whether it compressed. Every holder
    /// of the object (the index's sets, snapshots, the event log) sees the change at
    /// once; what it reads is the same.
    pub(crate) fn pack(&self, dictionaries: &mut Dictionaries) -> bool {
        let Body::Text(text) = self.body() else {
            return false;
        };
        let Some(packed) = dictionaries.pack(&self.key.resource, &text) else {
            return false;
        };
        *self.body.write() = Body::Packed(packed);
        true
    }

    /// Whether an input describes this same state (so applying it changes nothing).
    pub(crate) fn same_as(&self, input: &ObjectState) -> bool {
        let body = self.body();
        body.len() == input.json.len() && *body.text() == *input.json
    }

    /// The pruned object as JSON, with apiVersion and kind: the text the index holds,
    /// shared, or one made from its compressed form.
    pub fn json(&self) -> fleetscope_model::Json {
        self.body().json()
    }

    /// The JSON as [`Object::json`] gives it, and whether it was made from the
    /// compressed form (so it is not the text the object holds).
    pub(crate) fn json_made(&self) -> (fleetscope_model::Json, bool) {
        let body = self.body();
        (body.json(), matches!(body, Body::Packed(_)))
    }

    /// Whether `other` holds the same JSON.
    pub fn same_json(&self, other: &Object) -> bool {
        std::ptr::eq(self, other) || self.body() == other.body()
    }

    /// The length of the JSON.
    pub fn json_len(&self) -> usize {
        self.body.read().len()
    }

    /// The JSON as held compressed, when it is.
    pub(crate) fn packed(&self) -> Option<triomphe::Arc<PackedJson>> {
        match &*self.body.read() {
            Body::Packed(p) => Some(p.clone()),
            Body::Text(_) => None,
        }
    }

    /// Whether the JSON is held compressed.
    pub fn json_compressed(&self) -> bool {
        matches!(*self.body.read(), Body::Packed(_))
    }

    /// metadata.labels, sorted by key.
    pub fn labels(&self) -> &[(Arc<str>, Arc<str>)] {
        &self.terms.labels
    }

    /// The uids of metadata.ownerReferences.
    pub fn owners(&self) -> &[Uid] {
        match &self.owner {
            Some(uid) => std::slice::from_ref(uid),
            None => &self.terms.owners,
        }
    }

    /// The uid of the object's owner, when it has exactly one.
    pub(crate) fn sole_owner(&self) -> Option<&Uid> {
        self.owner.as_ref()
    }

    /// Values of the configured field indexes, as (JSON path, value).
    pub fn fields(&self) -> &[(Arc<str>, Arc<str>)] {
        &self.terms.fields
    }

    /// metadata.uid, read from the JSON; empty when absent.
    pub fn uid(&self) -> String {
        self.uid_and_resource_version().0
    }

    /// metadata.resourceVersion in its cluster, read from the JSON; empty when absent.
    pub fn resource_version(&self) -> String {
        self.uid_and_resource_version().1
    }

    /// metadata.uid and metadata.resourceVersion, read from the JSON in one pass.
    pub fn uid_and_resource_version(&self) -> (String, String) {
        uid_and_resource_version(&self.body().text())
    }

    /// `apiVersion`, `kind` and `metadata` alone, as JSON (for the metadata projection);
    /// read at any nesting depth of the rest of the object.
    pub fn metadata_json(&self) -> fleetscope_model::Json {
        let body = self.body();
        metadata_json(&body.text()).map_or_else(|| body.json(), fleetscope_model::Json::from)
    }

    /// The value of a field path: from the key or a field index when possible, else
    /// read from the JSON, at any nesting depth.
    pub fn field_value(&self, path: &str) -> Option<Cow<'_, str>> {
        match path {
            "metadata.name" => return Some(Cow::Borrowed(&self.key.name)),
            "metadata.namespace" => return Some(Cow::Borrowed(&self.key.namespace)),
            _ => {}
        }
        if let Some((_, v)) = self.terms.fields.iter().find(|(p, _)| **p == *path) {
            return Some(Cow::Borrowed(v));
        }
        field_in_json(&self.body().text(), path).map(Cow::Owned)
    }
}

impl Labels for Object {
    fn label(&self, key: &str) -> Option<&str> {
        if let Some(packed) = &self.terms.unindexed {
            return packed.get(key);
        }
        let labels = &self.terms.labels;
        labels
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*labels[i].1)
    }
}

impl Fields for Object {
    fn field(&self, path: &str) -> Option<Cow<'_, str>> {
        self.field_value(path)
    }
}

/// An object as a member of the index's ordered sets: ordered and found by its key, so
/// a set of entries is also a map from key to object.
#[derive(Debug, Clone)]
pub(crate) struct Entry(pub ObjectRef);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

impl std::borrow::Borrow<ObjectKey> for Entry {
    fn borrow(&self) -> &ObjectKey {
        &self.0.key
    }
}

/// Adds distinct items in order so that the leaves they fill end up full. The set's
/// B-tree splits a full leaf in half, so items appended one after another would leave
/// every leaf they pass through half empty. Every other item goes in first, leaving
/// leaves half full of those, each spanning twice as many places; the rest then fill
/// the places each leaf already spans, and no leaf splits again.
pub(crate) fn insert_in_order<A: Ord + Clone>(
    set: &mut OrdSet<A>,
    items: impl Iterator<Item = A> + Clone,
) {
    for a in items.clone().step_by(2) {
        set.insert(a);
    }
    for a in items.skip(1).step_by(2) {
        set.insert(a);
    }
}
