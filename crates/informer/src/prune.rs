//! Objects as fleetscope keeps them: pruned, with apiVersion and kind filled in, and
//! the fields the index needs lifted out. One malformed object is an error for that
//! object alone.

use fleetscope_model::ResourceType;
use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// What to remove from every object before it is kept.
#[derive(Debug, Clone)]
pub struct Pruning {
    /// Drop `metadata.managedFields` (default true).
    pub managed_fields: bool,
    /// Annotations to drop (default: `kubectl.kubernetes.io/last-applied-configuration`).
    pub annotations: Vec<String>,
}

impl Default for Pruning {
    fn default() -> Self {
        Self {
            managed_fields: true,
            annotations: vec!["kubectl.kubernetes.io/last-applied-configuration".into()],
        }
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
}

/// Prunes one object given as JSON text. Only `metadata` is decoded; every other
/// top-level field is copied through as raw JSON text.
pub fn prune(raw: &str, rt: &ResourceType, pruning: &Pruning) -> Result<PrunedObject, PruneError> {
    let fields: BTreeMap<Cow<'_, str>, &RawValue> =
        serde_json::from_str(raw).map_err(|e| PruneError::NotAnObject(e.to_string()))?;
    let meta_raw = fields
        .get("metadata")
        .ok_or_else(|| PruneError::NotAnObject("metadata is missing".into()))?;
    let mut meta: Map<String, Value> = serde_json::from_str(meta_raw.get())
        .map_err(|_| PruneError::NotAnObject("metadata is not an object".into()))?;
    if pruning.managed_fields {
        meta.remove("managedFields");
    }
    if let Some(Value::Object(ann)) = meta.get_mut("annotations") {
        for a in &pruning.annotations {
            ann.remove(a);
        }
        if ann.is_empty() {
            meta.remove("annotations");
        }
    }
    let text = |m: &Map<String, Value>, k: &str| {
        m.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let name = text(&meta, "name");
    if name.is_empty() {
        return Err(PruneError::NoName);
    }
    let labels = meta
        .get("labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let owners = meta
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    // apiVersion and kind first, as Kubernetes writes them; list items lack them.
    let mut json = Vec::with_capacity(raw.len());
    json.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut json, &rt.api_version())
        .map_err(|e| PruneError::NotAnObject(e.to_string()))?;
    json.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut json, &rt.kind)
        .map_err(|e| PruneError::NotAnObject(e.to_string()))?;
    json.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut json, &meta).map_err(|e| PruneError::NotAnObject(e.to_string()))?;
    for (key, value) in &fields {
        if matches!(key.as_ref(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        json.push(b',');
        serde_json::to_writer(&mut json, key.as_ref())
            .map_err(|e| PruneError::NotAnObject(e.to_string()))?;
        json.push(b':');
        json.extend_from_slice(value.get().as_bytes());
    }
    json.push(b'}');
    let json = String::from_utf8(json).map_err(|e| PruneError::NotAnObject(e.to_string()))?;
    Ok(PrunedObject {
        namespace: text(&meta, "namespace"),
        name,
        uid: text(&meta, "uid"),
        resource_version: text(&meta, "resourceVersion"),
        json,
        labels,
        owners,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> ResourceType {
        ResourceType {
            group: String::new(),
            version: "v1".into(),
            plural: "pods".into(),
            kind: "Pod".into(),
            namespaced: true,
        }
    }

    #[test]
    fn prunes_managed_fields_and_last_applied_and_fills_type() {
        let raw = r#"{"metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"7","labels":{"app":"web"},
            "ownerReferences":[{"uid":"rs-1","kind":"ReplicaSet"}],
            "managedFields":[{"manager":"kubectl"}],
            "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}","keep":"me"}},"spec":{}}"#;
        let p = prune(raw, &pods(), &Pruning::default()).unwrap();
        let v: Value = serde_json::from_str(&p.json).unwrap();
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["apiVersion"], "v1");
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(
            v["metadata"]["annotations"],
            serde_json::json!({"keep": "me"})
        );
        assert_eq!(
            (
                p.name.as_str(),
                p.namespace.as_str(),
                p.resource_version.as_str()
            ),
            ("p", "n", "7")
        );
        assert_eq!(p.labels, [("app".to_string(), "web".to_string())]);
        assert_eq!(p.owners, ["rs-1"]);
        assert!(
            p.json
                .starts_with(r#"{"apiVersion":"v1","kind":"Pod","metadata""#)
        );
    }

    #[test]
    fn malformed_objects_are_errors_not_panics() {
        for raw in [
            "nope",
            "[1]",
            r#"{"metadata":"x"}"#,
            r#"{"metadata":{}}"#,
            r#"{"spec":{}}"#,
        ] {
            assert!(prune(raw, &pods(), &Pruning::default()).is_err(), "{raw}");
        }
    }
}
