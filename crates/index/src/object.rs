//! What the index holds of an object: its pruned JSON once, plus the few fields the
//! secondary indexes need.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use fleetscope_model::selector::{Fields, Labels, json_path, scalar_text};
use fleetscope_model::{ObjectKey, Revision};

/// Shares the strings many objects repeat (resource names, namespaces, label keys and
/// values) so each is held once. Bounded: past its capacity, new strings are not shared.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    strings: std::collections::HashSet<Arc<str>>,
}

impl Interner {
    const CAPACITY: usize = 200_000;

    pub(crate) fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(s) {
            return shared.clone();
        }
        let fresh: Arc<str> = Arc::from(s);
        if self.strings.len() < Self::CAPACITY {
            self.strings.insert(fresh.clone());
        }
        fresh
    }
}

/// An object as it arrives from a cluster, pruned, ready to index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInput {
    /// Identity.
    pub key: ObjectKey,
    /// metadata.uid.
    pub uid: String,
    /// metadata.resourceVersion in its cluster.
    pub resource_version: String,
    /// The pruned object as JSON, with apiVersion and kind.
    pub json: Bytes,
    /// metadata.labels.
    pub labels: Vec<(String, String)>,
    /// The uids of metadata.ownerReferences.
    pub owners: Vec<String>,
    /// Values of the configured field indexes, as (JSON path, value).
    pub fields: Vec<(String, String)>,
}

/// An object held by the index.
#[derive(Debug, PartialEq, Eq)]
pub struct Object {
    /// Identity.
    pub key: ObjectKey,
    /// metadata.uid.
    pub uid: Arc<str>,
    /// metadata.resourceVersion in its cluster.
    pub resource_version: Arc<str>,
    /// The revision of the change that produced this state.
    pub revision: Revision,
    /// The pruned object as JSON, with apiVersion and kind.
    pub json: Bytes,
    /// metadata.labels, sorted by key.
    pub labels: Box<[(Arc<str>, Arc<str>)]>,
    /// The uids of metadata.ownerReferences.
    pub owners: Box<[Arc<str>]>,
    /// Values of the configured field indexes, as (JSON path, value).
    pub fields: Box<[(Arc<str>, Arc<str>)]>,
}

impl Object {
    pub(crate) fn from_input(
        input: ObjectInput,
        revision: Revision,
        interner: &mut Interner,
    ) -> Self {
        let mut labels: Vec<(Arc<str>, Arc<str>)> = input
            .labels
            .into_iter()
            .map(|(k, v)| (interner.get(&k), interner.get(&v)))
            .collect();
        labels.sort();
        let key = ObjectKey {
            resource: interner.get(&input.key.resource),
            cluster: input.key.cluster,
            namespace: interner.get(&input.key.namespace),
            name: input.key.name,
        };
        Self {
            key,
            uid: Arc::from(input.uid),
            resource_version: Arc::from(input.resource_version),
            revision,
            json: input.json,
            labels: labels.into_boxed_slice(),
            owners: input.owners.into_iter().map(Arc::from).collect(),
            fields: input
                .fields
                .into_iter()
                .map(|(p, v)| (Arc::from(p), Arc::from(v)))
                .collect(),
        }
    }

    /// Whether an input describes this same state (so applying it changes nothing).
    pub(crate) fn same_as(&self, input: &ObjectInput) -> bool {
        *self.resource_version == *input.resource_version && self.json == input.json
    }

    /// The object decoded; `None` if the stored JSON does not parse (never expected).
    pub fn value(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.json).ok()
    }

    /// The value of a field path: from the key or a field index when possible, else
    /// from the JSON (parsed into `parsed` once and reused).
    pub fn field_value<'a>(
        &'a self,
        path: &str,
        parsed: &'a mut Option<Option<serde_json::Value>>,
    ) -> Option<Cow<'a, str>> {
        match path {
            "metadata.name" => return Some(Cow::Borrowed(&self.key.name)),
            "metadata.namespace" => return Some(Cow::Borrowed(&self.key.namespace)),
            _ => {}
        }
        if let Some((_, v)) = self.fields.iter().find(|(p, _)| **p == *path) {
            return Some(Cow::Borrowed(v));
        }
        parsed
            .get_or_insert_with(|| self.value())
            .as_ref()
            .and_then(|v| json_path(v, path))
            .and_then(scalar_text)
    }
}

impl Labels for Object {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.labels[i].1)
    }
}

/// An object with its lazily parsed JSON, for field selectors over any path.
pub(crate) struct FieldView<'a> {
    pub object: &'a Object,
    pub parsed: std::cell::RefCell<Option<Option<serde_json::Value>>>,
}

impl Fields for FieldView<'_> {
    fn field(&self, path: &str) -> Option<Cow<'_, str>> {
        let mut parsed = self.parsed.borrow_mut();
        self.object
            .field_value(path, &mut parsed)
            .map(|c| Cow::Owned(c.into_owned()))
    }
}
