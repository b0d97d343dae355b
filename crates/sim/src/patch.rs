//! The patch types of `PATCH`: JSON patch (RFC 6902, with the `json-patch` crate),
//! JSON merge patch (RFC 7386) and strategic merge patch, as kubectl sends them for
//! `patch --type=json|merge|strategic`, `apply`, `edit`, `label`, `annotate` and
//! `scale`.
//!
//! The strategic merge patch follows the apiserver for the built-in types' lists
//! that merge by key (containers and volumes by name, container ports by
//! containerPort, service ports by port, volume mounts by mountPath, conditions by
//! type, owner references by uid, …) and its directives: `$patch: replace|delete`,
//! `$retainKeys`, `$deleteFromPrimitiveList/…` and `$setElementOrder/…`. Other lists
//! are replaced, as for types without patch metadata.

use serde_json::{Map, Value};

use crate::status::ApiError;
use crate::store::merge_patch;

/// A patch's kind, by its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
}

impl PatchKind {
    /// The kind of a `Content-Type`, or a 415 naming what is accepted.
    pub fn of(content_type: &str) -> Result<Self, ApiError> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// Applies `patch` of `kind` to `target`.
pub fn apply(kind: PatchKind, target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    match kind {
        PatchKind::Merge => {
            merge_patch(target, patch);
            Ok(())
        }
        PatchKind::Strategic => {
            strategic(target, patch, "");
            Ok(())
        }
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("the JSON patch is not valid: {e}")))?;
            json_patch::patch(target, &ops).map_err(|e| {
                ApiError::unprocessable(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })
        }
    }
}

/// The key a list of objects merges by, by its field name (and, for `ports`, by what
/// its elements carry).
fn merge_key(field: &str, elements: &[&Value]) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "secrets"
        | "resourceClaims" => "name",
        "ownerReferences" => "uid",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" => "type",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        "ports" if elements.iter().any(|e| e.get("containerPort").is_some()) => "containerPort",
        "ports" => "port",
        _ => return None,
    })
}

fn strategic(target: &mut Value, patch: &Value, _field: &str) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch.clone();
        replaced.remove("$patch");
        *target = Value::Object(replaced);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(map) = target.as_object_mut() else {
        return;
    };
    for (key, value) in patch {
        if key == "$patch" || key.starts_with("$setElementOrder/") || key == "$retainKeys" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (map.get_mut(field), value) {
                list.retain(|v| !gone.contains(v));
            }
            continue;
        }
        match value {
            Value::Null => {
                map.remove(key);
            }
            Value::Object(_) => {
                strategic(map.entry(key.clone()).or_insert(Value::Null), value, key)
            }
            Value::Array(items) => {
                let current = map.entry(key.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(current, items, key);
            }
            other => {
                map.insert(key.clone(), other.clone());
            }
        }
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        map.retain(|k, _| keep.contains(&k.as_str()));
    }
}

fn merge_list(current: &mut Value, items: &[Value], field: &str) {
    let elements: Vec<&Value> = items
        .iter()
        .chain(current.as_array().into_iter().flatten())
        .collect();
    let all_objects = !items.is_empty() && items.iter().all(Value::is_object);
    let key = merge_key(field, &elements).filter(|_| all_objects);
    let (Some(key), Value::Array(list)) = (key, &mut *current) else {
        // No merge key: the list is replaced (directives dropped).
        *current = Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .cloned()
                .collect(),
        );
        return;
    };
    for item in items {
        let id = item.get(key);
        let at = id.and_then(|id| list.iter().position(|e| e.get(key) == Some(id)));
        match (item.get("$patch").and_then(Value::as_str), at) {
            (Some("delete"), Some(i)) => {
                list.remove(i);
            }
            (Some("delete"), None) => {}
            (_, Some(i)) => strategic(&mut list[i], item, field),
            (_, None) => {
                let mut added = Value::Null;
                strategic(&mut added, item, field);
                list.push(added);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(kind: PatchKind, mut target: Value, patch: Value) -> Value {
        apply(kind, &mut target, &patch).unwrap();
        target
    }

    #[test]
    fn strategic_merges_lists_by_key_and_follows_directives() {
        let deploy = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": "web:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "sidecar", "image": "side:1"}
        ]}}}, "metadata": {"finalizers": ["a", "b"]}});
        let out = patched(
            PatchKind::Strategic,
            deploy.clone(),
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "web"}, {"name": "sidecar"}],
                "containers": [{"name": "web", "image": "web:2", "env": [{"name": "B", "value": "2"}]}]
            }}}, "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        let containers = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(
            containers.as_array().unwrap().len(),
            2,
            "merged by name, not replaced"
        );
        assert_eq!(containers[0]["image"], "web:2");
        assert_eq!(containers[0]["env"].as_array().unwrap().len(), 2);
        assert_eq!(containers[1]["image"], "side:1");
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        assert!(
            out["spec"]["template"]["spec"]
                .get("$setElementOrder/containers")
                .is_none()
        );
        let out = patched(
            PatchKind::Strategic,
            deploy,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}}}),
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        let out = patched(
            PatchKind::Strategic,
            json!({"data": {"a": "1", "b": "2"}}),
            json!({"data": {"$patch": "replace", "c": "3"}}),
        );
        assert_eq!(out["data"], json!({"c": "3"}));
        let out = patched(
            PatchKind::Strategic,
            json!({"spec": {"a": 1, "b": 2}}),
            json!({"spec": {"$retainKeys": ["b"], "b": 3}}),
        );
        assert_eq!(out["spec"], json!({"b": 3}));
        let out = patched(
            PatchKind::Strategic,
            json!({"spec": {"args": ["x", "y"]}}),
            json!({"spec": {"args": ["z"]}}),
        );
        assert_eq!(
            out["spec"]["args"],
            json!(["z"]),
            "lists without a merge key are replaced"
        );
    }

    #[test]
    fn json_patch_and_merge_patch() {
        let out = patched(
            PatchKind::Json,
            json!({"spec": {"replicas": 1}, "metadata": {"labels": {"a": "b"}}}),
            json!([{"op": "replace", "path": "/spec/replicas", "value": 3}, {"op": "remove", "path": "/metadata/labels/a"}]),
        );
        assert_eq!(
            out,
            json!({"spec": {"replicas": 3}, "metadata": {"labels": {}}})
        );
        let e = apply(
            PatchKind::Json,
            &mut json!({}),
            &json!([{"op": "remove", "path": "/nope"}]),
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        let e = apply(PatchKind::Json, &mut json!({}), &json!({"op": "x"})).unwrap_err();
        assert_eq!(e.code, 400);
        let out = patched(
            PatchKind::Merge,
            json!({"a": [1, 2], "b": 1}),
            json!({"a": [3], "b": null}),
        );
        assert_eq!(out, json!({"a": [3]}));
        assert!(PatchKind::of("application/apply-patch+yaml").is_err());
        assert_eq!(
            PatchKind::of("application/json-patch+json; charset=utf-8").unwrap(),
            PatchKind::Json
        );
    }
}
