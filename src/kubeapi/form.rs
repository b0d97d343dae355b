//! What form of answer a client asks for in `Accept`, as an API server reads it: the
//! first entry it can serve, skipping those it cannot (protobuf, YAML), so that a
//! client asking for protobuf first gets JSON. Besides the objects themselves:
//! kubectl's server-side printing (`as=Table`), metadata-only answers
//! (`as=PartialObjectMetadata` / `PartialObjectMetadataList`, for client-go's
//! metadata informers and kube-rs' `metadata_watcher`) and aggregated discovery
//! (`as=APIGroupDiscoveryList`).

use fleetscope_model::fleet::FleetObject;
use serde_json::{Value, json};

/// The form of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The objects as JSON.
    Object,
    /// A `meta.k8s.io/v1` `Table`.
    Table,
    /// `PartialObjectMetadata` (one object, a watch's events) or
    /// `PartialObjectMetadataList` (a list).
    Metadata,
    /// Aggregated discovery, `apidiscovery.k8s.io` at this version (`v2`, `v2beta1`).
    Discovery(&'static str),
}

/// The first form `accept` names that fleetscope serves; the objects when none.
pub fn of(accept: Option<&str>) -> Form {
    accept
        .unwrap_or("")
        .split(',')
        .find_map(entry)
        .unwrap_or(Form::Object)
}

/// The form of one `Accept` entry, if it is JSON in a form served.
fn entry(entry: &str) -> Option<Form> {
    let mut parts = entry.split(';').map(str::trim);
    let media = parts.next()?.to_ascii_lowercase();
    if !matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
        return None;
    }
    let (mut r#as, mut g, mut v) = ("", "", "");
    for p in parts {
        match p.split_once('=') {
            Some(("as", x)) => r#as = x,
            Some(("g", x)) => g = x,
            Some(("v", x)) => v = x,
            _ => {}
        }
    }
    match (r#as, g, v) {
        ("", _, _) => Some(Form::Object),
        ("Table", "meta.k8s.io", "v1" | "v1beta1") => Some(Form::Table),
        ("PartialObjectMetadata" | "PartialObjectMetadataList", "meta.k8s.io", "v1") => {
            Some(Form::Metadata)
        }
        ("APIGroupDiscoveryList", "apidiscovery.k8s.io", "v2") => Some(Form::Discovery("v2")),
        ("APIGroupDiscoveryList", "apidiscovery.k8s.io", "v2beta1") => {
            Some(Form::Discovery("v2beta1"))
        }
        _ => None,
    }
}

/// `object` as `PartialObjectMetadata`: its metadata alone.
pub fn metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object["metadata"],
    })
}

/// How a list is written in its form: the text before its first object (an open
/// `items` or `rows` array), each object's text, then [`Writing::close`] with the
/// list's `metadata` (JSON's members have no order). A server writes a page whole
/// ([`Writing::whole`]); a router as its objects come.
pub struct Writing {
    /// The list's text up to its first object.
    pub head: String,
    /// One object's text.
    pub item: Box<dyn Fn(&FleetObject) -> String + Send>,
}

impl Writing {
    /// A list of `kind` and `api_version` whose items are written by `item`.
    pub fn items(
        kind: &str,
        api_version: &str,
        item: impl Fn(&FleetObject) -> String + Send + 'static,
    ) -> Self {
        let head = json!({"kind": kind, "apiVersion": api_version}).to_string();
        Self {
            head: format!("{},\"items\":[", &head[..head.len() - 1]),
            item: Box::new(item),
        }
    }

    /// A `PartialObjectMetadataList` of the objects `as_json` makes.
    pub fn metadata(as_json: impl Fn(&FleetObject) -> Value + Send + 'static) -> Self {
        Self::items("PartialObjectMetadataList", "meta.k8s.io/v1", move |o| {
            metadata(&as_json(o)).to_string()
        })
    }

    /// The list of `objects`, whole, with `metadata`.
    pub fn whole(&self, objects: &[FleetObject], metadata: &Value) -> String {
        let size: usize = objects.iter().map(|o| o.json.len() + 96).sum();
        let mut out = String::with_capacity(self.head.len() + size + 64);
        out.push_str(&self.head);
        for (i, o) in objects.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&(self.item)(o));
        }
        out.push_str(&Self::close(metadata));
        out
    }

    /// What closes a list after its objects: the array, and the list's `metadata`.
    pub fn close(metadata: &Value) -> String {
        format!("],\"metadata\":{metadata}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetscope_model::{ClusterName, ObjectKey, Revision};

    #[test]
    fn the_first_entry_served_decides_and_protobuf_is_passed_over() {
        assert_eq!(of(None), Form::Object);
        assert_eq!(of(Some("application/json")), Form::Object);
        assert_eq!(
            of(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            )),
            Form::Table
        );
        // client-go's metadata informer asks for protobuf first.
        assert_eq!(
            of(Some(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
            )),
            Form::Metadata
        );
        assert_eq!(
            of(Some("application/vnd.kubernetes.protobuf, */*")),
            Form::Object
        );
        // kubectl's discovery.
        assert_eq!(
            of(Some(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            )),
            Form::Discovery("v2")
        );
        // A form not served falls through to the next entry.
        assert_eq!(
            of(Some(
                "application/json;as=Unknown;g=x;v=v9,application/json"
            )),
            Form::Object
        );
        let o = json!({"kind": "Pod", "metadata": {"name": "a"}, "spec": {"x": 1}});
        assert_eq!(
            metadata(&o),
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a"}})
        );
        let object = FleetObject {
            key: ObjectKey::new("pods", &ClusterName::from("c"), "", "a"),
            revision: Revision(1),
            uid: String::new(),
            resource_version: String::new(),
            json: o.to_string().into(),
        };
        let writing = Writing::metadata(|o| serde_json::from_str(&o.json).unwrap());
        let text = writing.whole(&[object], &json!({"resourceVersion": "3"}));
        let l: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(l["kind"], "PartialObjectMetadataList");
        assert_eq!(l["metadata"]["resourceVersion"], "3");
        assert_eq!(l["items"][0]["metadata"]["name"], "a");
        assert!(l["items"][0].get("spec").is_none());
    }
}
