//! Objects as fleetscope keeps them: pruned, with apiVersion and kind filled in, and
//! the fields the index needs lifted out. One malformed object is an error for that
//! object alone.

use fleetscope_model::ResourceType;
use fleetscope_model::raw::{Members, Text, write_str};
use fleetscope_model::selector::field_in_json;
use std::borrow::Cow;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

pub mod list;

/// What to remove from every object before it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruning {
    /// Drop `metadata.managedFields` (default true).
    pub managed_fields: bool,
    /// Annotations to drop (default: `kubectl.kubernetes.io/last-applied-configuration`).
    pub annotations: Vec<String>,
    /// JSON paths whose values are read from each kept object in the same pass, for
    /// the index's field indexes (none by default). They do not change what is kept.
    pub field_indexes: Vec<String>,
}

impl Default for Pruning {
    fn default() -> Self {
        Self {
            managed_fields: true,
            annotations: vec![LAST_APPLIED.into()],
            field_indexes: Vec::new(),
        }
    }
}

/// kubectl's record of an object as last applied: pruned by default, and always from
/// Secrets, whose values it holds.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl Pruning {
    /// The annotations pruned: [`LAST_APPLIED`] unless `keep_last_applied` is false,
    /// and `more`.
    pub fn annotations_with(last_applied: bool, more: &[String]) -> Vec<String> {
        let mut all: Vec<String> = last_applied
            .then(|| LAST_APPLIED.to_string())
            .into_iter()
            .collect();
        for a in more {
            if !all.contains(a) {
                all.push(a.clone());
            }
        }
        all
    }
}

/// An object from a cluster, pruned and ready to index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedObject {
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// metadata.uid.
    pub uid: String,
    /// metadata.resourceVersion.
    pub resource_version: String,
    /// The pruned JSON, apiVersion and kind first.
    pub json: String,
    /// metadata.labels.
    pub labels: Vec<(String, String)>,
    /// The uids of metadata.ownerReferences.
    pub owners: Vec<String>,
    /// The values of [`Pruning::field_indexes`] the object has, as (JSON path, value).
    pub fields: Vec<(String, String)>,
}

/// Why an object from a cluster was not kept.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    /// Not JSON, or not an object.
    #[error("not a JSON object: {0}")]
    NotAnObject(String),
    /// metadata.name is missing or empty.
    #[error("metadata.name is missing")]
    NoName,
    /// A key appears twice in the object or its metadata: readers differ on which
    /// one counts (the first, the last), so the object is not kept.
    #[error("the key {0:?} appears twice")]
    DuplicateKey(String),
}

/// Prunes one object given as JSON text.
pub fn prune(raw: &str, rt: &ResourceType, pruning: &Pruning) -> Result<PrunedObject, PruneError> {
    let pruner = Pruner::new(rt, pruning);
    let mut scratch = String::with_capacity(raw.len());
    prune_with(&pruner, &mut scratch, raw)
}

/// Prunes one object with `scratch` as working space (kept for the next).
fn prune_with(
    pruner: &Pruner<'_>,
    scratch: &mut String,
    raw: &str,
) -> Result<PrunedObject, PruneError> {
    let mut de = serde_json::Deserializer::from_str(raw);
    ObjectSeed {
        pruner,
        out: scratch,
    }
    .deserialize(&mut de)
    .and_then(|o| de.end().map(|()| o))
    .map_err(|e| PruneError::NotAnObject(e.to_string()))?
}

/// One watch event, read in one pass: an object event's object pruned as it is read.
#[derive(Debug)]
pub enum WatchEvent<'a> {
    /// `ADDED`, `MODIFIED` or `DELETED`, with the object as kept (or why it was not).
    Object {
        /// The event's type.
        kind: ObjectEvent,
        /// The object.
        object: Result<PrunedObject, PruneError>,
    },
    /// Any other type (`BOOKMARK`, `ERROR`, unknown), with its object as raw JSON.
    Other {
        /// The event's type.
        kind: Cow<'a, str>,
        /// The object, unread.
        object: &'a RawValue,
    },
}

/// The type of an object event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectEvent {
    /// Created (or, in a watch from now, present at its start).
    Added,
    /// Changed.
    Modified,
    /// Deleted: the object's last state.
    Deleted,
}

impl ObjectEvent {
    /// The type as the API server writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectEvent::Added => "ADDED",
            ObjectEvent::Modified => "MODIFIED",
            ObjectEvent::Deleted => "DELETED",
        }
    }

    fn of(kind: &str) -> Option<Self> {
        match kind {
            "ADDED" => Some(ObjectEvent::Added),
            "MODIFIED" => Some(ObjectEvent::Modified),
            "DELETED" => Some(ObjectEvent::Deleted),
            _ => None,
        }
    }
}

/// Reads the watch events of one resource type, each in one pass, reusing its working
/// space from event to event.
pub struct EventReader<'p> {
    pruner: Pruner<'p>,
    scratch: String,
}

impl<'p> EventReader<'p> {
    /// A reader for events of `rt`, pruned with `pruning`.
    pub fn new(rt: &ResourceType, pruning: &'p Pruning) -> Self {
        Self {
            pruner: Pruner::new(rt, pruning),
            scratch: String::new(),
        }
    }

    /// Reads one event line. Fails when the line is not a watch event (a JSON object
    /// with a string `type` and an `object`).
    pub fn read<'a>(&mut self, line: &'a str) -> Result<WatchEvent<'a>, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(line);
        let event = EventSeed {
            pruner: &self.pruner,
            out: &mut self.scratch,
        }
        .deserialize(&mut de)?;
        de.end()?;
        Ok(event)
    }
}

/// A watch event: `type` first (as the API server writes it) lets its object be pruned
/// as it is read; an object before its type is taken raw and pruned after.
struct EventSeed<'s, 'p> {
    pruner: &'s Pruner<'p>,
    out: &'s mut String,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_, '_> {
    type Value = WatchEvent<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EventSeed<'_, '_> {
    type Value = WatchEvent<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a watch event: a JSON object with type and object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut kind: Option<Cow<'de, str>> = None;
        let mut pruned: Option<Result<PrunedObject, PruneError>> = None;
        let mut raw: Option<&'de RawValue> = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match key.0.as_ref() {
                "type" => kind = Some(map.next_value::<Text<'de>>()?.0),
                "object" if kind.as_deref().and_then(ObjectEvent::of).is_some() => {
                    pruned = Some(map.next_value_seed(ObjectSeed {
                        pruner: self.pruner,
                        out: &mut *self.out,
                    })?);
                }
                "object" => raw = Some(map.next_value::<&'de RawValue>()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let kind = kind.ok_or_else(|| A::Error::missing_field("type"))?;
        match (ObjectEvent::of(&kind), pruned, raw) {
            (Some(k), Some(object), _) => Ok(WatchEvent::Object { kind: k, object }),
            (Some(k), None, Some(raw)) => Ok(WatchEvent::Object {
                kind: k,
                object: prune_with(self.pruner, self.out, raw.get()),
            }),
            (None, _, Some(object)) => Ok(WatchEvent::Other { kind, object }),
            _ => Err(A::Error::missing_field("object")),
        }
    }
}

/// What every object of one resource type is pruned with.
struct Pruner<'p> {
    pruning: &'p Pruning,
    /// `{"apiVersion":…,"kind":…`: how every kept object begins.
    prefix: String,
}

impl<'p> Pruner<'p> {
    fn new(rt: &ResourceType, pruning: &'p Pruning) -> Self {
        let mut prefix = String::from("{\"apiVersion\":");
        write_str(&mut prefix, &rt.api_version());
        prefix.push_str(",\"kind\":");
        write_str(&mut prefix, &rt.kind);
        Self { pruning, prefix }
    }
}

/// What a visitor answers for a JSON value that is not an object: the value is
/// consumed, and the answer is `$answer` of what the value is (`"a number"`) — for a
/// field named `$what`, an error for this value alone.
macro_rules! not_an_object {
    ($what:literal) => {
        not_an_object!(|is: &str| Err(PruneError::NotAnObject(format!(
            concat!($what, " is {}"),
            is
        ))));
    };
    ($answer:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(($answer)("a boolean"))
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(($answer)("a number"))
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(($answer)("a number"))
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(($answer)("a number"))
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(($answer)("a string"))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(($answer)("null"))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(($answer)("an array"))
        }
    };
}

/// One object, pruned as it is read. `out` is scratch space, reused from object to
/// object; the kept JSON is copied out of it at its exact length.
struct ObjectSeed<'s, 'p> {
    pruner: &'s Pruner<'p>,
    out: &'s mut String,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, '_> {
    type Value = Result<PrunedObject, PruneError>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, '_> {
    type Value = Result<PrunedObject, PruneError>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object")
    }
    not_an_object!("the object");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let out = self.out;
        out.clear();
        out.push_str(&self.pruner.prefix);
        let mut found = Found::default();
        let mut metadata: Option<Result<(), PruneError>> = None;
        let mut keys: Vec<Cow<'de, str>> = Vec::new();
        let mut duplicate: Option<String> = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if keys.contains(&key.0) {
                duplicate.get_or_insert_with(|| key.0.to_string());
            } else {
                keys.push(key.0.clone());
            }
            match key.0.as_ref() {
                // Filled in from the resource type.
                "apiVersion" | "kind" => {
                    map.next_value::<IgnoredAny>()?;
                }
                "metadata" if metadata.is_none() => {
                    out.push_str(",\"metadata\":");
                    metadata = Some(map.next_value_seed(MetadataSeed {
                        pruning: self.pruner.pruning,
                        out: &mut *out,
                        found: &mut found,
                    })?);
                }
                _ => {
                    let value = map.next_value::<&'de RawValue>()?;
                    out.push(',');
                    write_member(out, &key.0, value.get());
                }
            }
        }
        out.push('}');
        let done = || {
            if let Some(key) = duplicate {
                return Err(PruneError::DuplicateKey(key));
            }
            metadata.ok_or_else(|| PruneError::NotAnObject("metadata is missing".into()))??;
            if found.name.is_empty() {
                return Err(PruneError::NoName);
            }
            // At its exact length: the scratch space keeps its capacity for the next.
            let json = out.as_str().to_owned();
            let fields = self
                .pruner
                .pruning
                .field_indexes
                .iter()
                .filter_map(|p| Some((p.clone(), field_in_json(&json, p)?)))
                .collect();
            Ok(PrunedObject {
                namespace: found.namespace,
                name: found.name,
                uid: found.uid,
                resource_version: found.resource_version,
                json,
                labels: found.labels,
                owners: found.owners,
                fields,
            })
        };
        Ok(done())
    }
}

/// An object's `metadata`, written to `out` without the pruned members while the
/// fields the index needs are read into `found`.
struct MetadataSeed<'s> {
    pruning: &'s Pruning,
    out: &'s mut String,
    found: &'s mut Found,
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = Result<(), PruneError>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = Result<(), PruneError>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("metadata, an object")
    }
    not_an_object!("metadata");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let out = self.out;
        out.push('{');
        let mut first = true;
        let mut keys: Vec<Cow<'de, str>> = Vec::new();
        let mut duplicate: Option<String> = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if keys.contains(&key.0) {
                duplicate.get_or_insert_with(|| format!("metadata.{}", key.0));
            } else {
                keys.push(key.0.clone());
            }
            let kept_annotations;
            let value = match key.0.as_ref() {
                "managedFields" if self.pruning.managed_fields => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                "annotations" => {
                    let value = map.next_value::<&'de RawValue>()?;
                    match prune_annotations(value, self.pruning) {
                        Annotations::Unchanged => value.get(),
                        Annotations::Empty => continue,
                        Annotations::Pruned(text) => {
                            kept_annotations = text;
                            &kept_annotations
                        }
                    }
                }
                field => {
                    let value = map.next_value::<&'de RawValue>()?;
                    self.found.read(field, value);
                    value.get()
                }
            };
            if !first {
                out.push(',');
            }
            first = false;
            write_member(out, &key.0, value);
        }
        out.push('}');
        Ok(match duplicate {
            Some(key) => Err(PruneError::DuplicateKey(key)),
            None => Ok(()),
        })
    }
}

/// The metadata fields a kept object carries besides its JSON. A value of the wrong
/// JSON type reads as absent (a label that is not a string is not indexed).
#[derive(Default)]
struct Found {
    name: String,
    namespace: String,
    uid: String,
    resource_version: String,
    labels: Vec<(String, String)>,
    owners: Vec<String>,
}

impl Found {
    fn read(&mut self, field: &str, value: &RawValue) {
        let text = |v: &RawValue| string_of(v.get()).map_or_else(String::new, Cow::into_owned);
        match field {
            "name" => self.name = text(value),
            "namespace" => self.namespace = text(value),
            "uid" => self.uid = text(value),
            "resourceVersion" => self.resource_version = text(value),
            "labels" => {
                if let Ok(labels) = serde_json::from_str::<Members<'_>>(value.get()) {
                    self.labels = labels
                        .0
                        .iter()
                        .filter_map(|(k, v)| {
                            Some((k.to_string(), string_of(v.get())?.into_owned()))
                        })
                        .collect();
                }
            }
            "ownerReferences" => {
                if let Ok(refs) = serde_json::from_str::<Vec<OwnerUid<'_>>>(value.get()) {
                    self.owners = refs
                        .into_iter()
                        .filter_map(|r| Some(r.0?.into_owned()))
                        .collect();
                }
            }
            _ => {}
        }
    }
}

/// What pruning left of `metadata.annotations`.
enum Annotations {
    /// Nothing pruned (or not an object: kept as it came).
    Unchanged,
    /// None left after pruning (or none there): the field is left out.
    Empty,
    /// Some pruned: the rest, as JSON text.
    Pruned(String),
}

fn prune_annotations(value: &RawValue, pruning: &Pruning) -> Annotations {
    let Ok(members) = serde_json::from_str::<Members<'_>>(value.get()) else {
        return Annotations::Unchanged;
    };
    let pruned = |k: &str| pruning.annotations.iter().any(|a| a == k);
    if members.0.is_empty() {
        return Annotations::Empty;
    }
    if !members.0.iter().any(|(k, _)| pruned(k)) {
        return Annotations::Unchanged;
    }
    let mut text = String::with_capacity(value.get().len());
    text.push('{');
    for (k, v) in members.0.iter().filter(|(k, _)| !pruned(k)) {
        if text.len() > 1 {
            text.push(',');
        }
        write_member(&mut text, k, v.get());
    }
    if text.len() == 1 {
        return Annotations::Empty;
    }
    text.push('}');
    Annotations::Pruned(text)
}

/// Writes one object member, `"key":value`, its value given as JSON text.
fn write_member(out: &mut String, key: &str, value: &str) {
    write_str(out, key);
    out.push(':');
    out.push_str(value);
}

/// The text of a JSON string, given as the raw JSON the parser has already checked;
/// `None` if it is not a string. Without escapes, it is what lies between the quotes.
fn string_of(raw: &str) -> Option<Cow<'_, str>> {
    match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(text) if !text.contains('\\') => Some(Cow::Borrowed(text)),
        _ => serde_json::from_str::<Text<'_>>(raw).ok().map(|t| t.0),
    }
}

/// The uid of an owner reference; `None` for one without a string uid, or for any
/// other JSON value (which spoils nothing else in the list).
struct OwnerUid<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for OwnerUid<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = OwnerUid<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an owner reference")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut uid = None;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    if key.0 == "uid" {
                        uid = string_of(map.next_value::<&'de RawValue>()?.get());
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(OwnerUid(uid))
            }
            not_an_object!(|_: &str| OwnerUid(None));
        }
        d.deserialize_any(Visit)
    }
}

#[cfg(test)]
mod tests;
