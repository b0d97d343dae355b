//! Reading a field path out of JSON text without decoding the whole document: only the
//! members along the path are visited, everything else is skipped (serde_json skips a
//! value without recursing). A whole decode stops at serde_json's nesting limit of 128
//! levels, which would make an object nested deeper look as if every field were
//! missing; this reads the path at any depth.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The most segments a path may have: lookups recurse once per segment.
const MAX_SEGMENTS: usize = 512;

/// The scalar at a dotted `path` in the JSON document `json`, as [`super::json_path`]
/// and [`super::scalar_text`] read it from a decoded value: at each object a key that
/// contains dots itself is tried whole before the path is split; array elements are
/// named by index. `None` when the path is absent, names an object or an array, or the
/// text is not JSON.
pub fn field_in_json(json: &str, path: &str) -> Option<String> {
    if path.split('.').count() > MAX_SEGMENTS {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(json);
    // The recursion here is one level per path segment, bounded above; what is
    // skipped is skipped without recursion.
    de.disable_recursion_limit();
    At(path).deserialize(&mut de).ok().flatten()
}

/// Looks `0` up in the value it is given.
struct At<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for At<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for At<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.is_empty().then(|| v.to_string()))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(self.0.is_empty().then(|| v.to_string()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.0.is_empty().then(|| v.to_string()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.0.is_empty().then(|| v.to_string()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        // As serde_json writes the number a decoded value holds.
        Ok(self
            .0
            .is_empty()
            .then(|| serde_json::Number::from_f64(v).map(|n| n.to_string()))
            .flatten())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let path = self.0;
        let split = path.split_once('.');
        // The whole path as one key wins over its first segment, wherever each stands.
        let (mut whole, mut nested): (Option<Option<String>>, _) = (None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if path.is_empty() {
                map.next_value::<IgnoredAny>()?;
            } else if *key == *path {
                whole = Some(map.next_value_seed(At(""))?);
            } else if let Some((head, rest)) = split
                && *key == *head
            {
                nested = map.next_value_seed(At(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(whole.unwrap_or(nested))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (head, rest) = self.0.split_once('.').unwrap_or((self.0, ""));
        let wanted: Option<usize> = head.parse().ok().filter(|_| !self.0.is_empty());
        let mut found = None;
        let mut i = 0;
        loop {
            let item = if Some(i) == wanted {
                seq.next_element_seed(At(rest))?.map(|v| found = v)
            } else {
                seq.next_element::<IgnoredAny>()?.map(|_| ())
            };
            if item.is_none() {
                return Ok(found);
            }
            i += 1;
        }
    }
}

/// The document's `apiVersion`, `kind` and `metadata`, as a JSON object of their text
/// (absent members are `null`), read at any nesting depth of the rest.
pub fn metadata_json(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow, rename = "apiVersion")]
        api_version: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        kind: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        metadata: Option<&'a serde_json::value::RawValue>,
    }
    let head: Head<'_> = serde_json::from_str(json).ok()?;
    let text = |v: Option<&serde_json::value::RawValue>| v.map_or("null", |v| v.get()).to_string();
    Some(format!(
        r#"{{"apiVersion":{},"kind":{},"metadata":{}}}"#,
        text(head.api_version),
        text(head.kind),
        text(head.metadata)
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::selector::{json_path, scalar_text};

    fn decoded(json: &str, path: &str) -> Option<String> {
        let v: Value = serde_json::from_str(json).ok()?;
        json_path(&v, path)
            .and_then(scalar_text)
            .map(|c| c.into_owned())
    }

    #[test]
    fn reads_paths_as_a_decoded_value_does() {
        let doc = json!({
            "metadata": {"name": "p", "uid": "u-1", "labels": {"app.kubernetes.io/name": "web", "app": "x"}},
            "spec": {"nodeName": "n1", "replicas": 3, "ratio": 1.5, "paused": false, "none": null,
                     "containers": [{"name": "a"}, {"name": "b", "ports": [80, 443]}]},
            "a.b": "whole", "a": {"b": "nested"}
        })
        .to_string();
        for path in [
            "metadata.name",
            "metadata.uid",
            "metadata.labels.app.kubernetes.io/name",
            "metadata.labels.app",
            "spec.nodeName",
            "spec.replicas",
            "spec.ratio",
            "spec.paused",
            "spec.none",
            "spec.containers.1.name",
            "spec.containers.1.ports.0",
            "spec.containers.7.name",
            "spec.containers.x",
            "spec.containers",
            "spec",
            "a.b",
            "missing.path",
            "",
        ] {
            assert_eq!(field_in_json(&doc, path), decoded(&doc, path), "{path}");
        }
        assert_eq!(field_in_json(&doc, "a.b").as_deref(), Some("whole"));
        assert_eq!(field_in_json("not json", "a"), None);
    }

    /// An object nested `depth` levels below `spec`, with metadata before and after.
    fn deep(depth: usize) -> String {
        let mut inner = json!({"leaf": "bottom"});
        for _ in 0..depth {
            inner = json!({"a": inner});
        }
        let doc = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep", "uid": "u-9"}, "spec": inner, "status": {"phase": "Ready"}});
        // serde_json's own writer recurses fine; a decode of this fails past 128 levels.
        serde_json::to_string(&doc).unwrap()
    }

    #[test]
    fn an_object_nested_past_the_decoders_limit_is_read_correctly() {
        let doc = deep(200);
        assert!(
            serde_json::from_str::<Value>(&doc).is_err(),
            "too deep to decode"
        );
        assert_eq!(field_in_json(&doc, "metadata.uid").as_deref(), Some("u-9"));
        assert_eq!(
            field_in_json(&doc, "status.phase").as_deref(),
            Some("Ready")
        );
        let path = format!("spec.{}leaf", "a.".repeat(200));
        assert_eq!(field_in_json(&doc, &path).as_deref(), Some("bottom"));
        assert_eq!(
            field_in_json(&doc, "spec.a"),
            None,
            "an object is no scalar"
        );
        assert_eq!(
            metadata_json(&doc).unwrap(),
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep","uid":"u-9"}}"#
        );
    }

    #[test]
    fn a_path_of_too_many_segments_finds_nothing() {
        let path = "a.".repeat(MAX_SEGMENTS) + "b";
        assert_eq!(field_in_json(r#"{"a":1}"#, &path), None);
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|n| json!(n)),
            "[a-z.]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[ab.0-2]{1,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn agrees_with_decoding_on_any_document_and_path(doc in value(), path in "[ab.0-2]{0,7}") {
            let text = doc.to_string();
            prop_assert_eq!(field_in_json(&text, &path), decoded(&text, &path));
        }
    }
}
