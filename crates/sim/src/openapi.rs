//! The OpenAPI documents kubectl reads before it writes: `/openapi/v3` (an index of
//! group versions), `/openapi/v3/{api/v1 | apis/GROUP/VERSION}` and `/openapi/v2`.
//!
//! They describe every served type's paths and operations, each operation tagged
//! with `x-kubernetes-group-version-kind` and `x-kubernetes-action`, and the write
//! operations' query parameters (`dryRun`, `fieldManager`, `fieldValidation`), as the
//! apiserver's do. kubectl finds `fieldValidation` there and leaves validation to the
//! server; for strategic merge patches of built-in types it uses its own type
//! information, as it does when a schema is not published.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::resource::ResourceDef;

/// The group-version path of a type: `api/v1` or `apis/apps/v1`.
fn gv_path(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        format!("api/{}", def.version)
    } else {
        format!("apis/{}/{}", def.group, def.version)
    }
}

fn query(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string"}, "type": "string", "uniqueItems": true})
}

fn write_parameters() -> Vec<Value> {
    vec![
        query(
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
        ),
        query(
            "fieldManager",
            "A name associated with the actor or entity that is making these changes.",
        ),
        query(
            "fieldValidation",
            "How the server handles unknown or duplicate fields: Ignore, Warn or Strict.",
        ),
    ]
}

/// The paths of one type, keyed by path, each with its operations.
fn paths(def: &ResourceDef) -> Map<String, Value> {
    let gvk = json!({"group": def.group, "version": def.version, "kind": def.kind});
    let op = |action: &str, id: &str, writes: bool| {
        let mut o = json!({
            "operationId": format!("{id}{}", def.kind),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "responses": {"200": {"description": "OK"}, "401": {"description": "Unauthorized"}},
        });
        if writes {
            o["parameters"] = Value::Array(write_parameters());
        }
        o
    };
    let base = format!("/{}", gv_path(def));
    let (collection, item) = if def.namespaced {
        (
            format!("{base}/namespaces/{{namespace}}/{}", def.plural),
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", def.plural),
        )
    } else {
        (
            format!("{base}/{}", def.plural),
            format!("{base}/{}/{{name}}", def.plural),
        )
    };
    let mut out = Map::new();
    out.insert(
        collection,
        json!({"get": op("list", "list", false), "post": op("post", "create", true)}),
    );
    out.insert(
        item,
        json!({
            "get": op("get", "read", false),
            "put": op("put", "replace", true),
            "patch": op("patch", "patch", true),
            "delete": op("delete", "delete", true),
        }),
    );
    out
}

/// `/openapi/v3` (`rest` empty) or one group version's document; `None` for a group
/// version nothing is served at.
pub fn v3(defs: &[Arc<ResourceDef>], rest: &str) -> Option<Value> {
    let rest = rest
        .split('?')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/');
    if rest.is_empty() {
        let mut index = Map::new();
        for def in defs {
            let gv = gv_path(def);
            index.insert(
                gv.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", hash(defs, &gv))}),
            );
        }
        return Some(json!({"paths": index}));
    }
    let mut all = Map::new();
    for def in defs.iter().filter(|d| gv_path(d) == rest) {
        all.extend(paths(def));
    }
    if all.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": all,
        "components": {"schemas": {}},
    }))
}

/// `/openapi/v2`: every served type's paths.
pub fn v2(defs: &[Arc<ResourceDef>]) -> Value {
    let mut all = Map::new();
    for def in defs {
        all.extend(paths(def));
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": all,
        "definitions": {},
    })
}

/// A stable hash of a group version's types, for its document's URL.
fn hash(defs: &[Arc<ResourceDef>], gv: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for def in defs.iter().filter(|d| gv_path(d) == gv) {
        def.plural.hash(&mut h);
        def.kind.hash(&mut h);
    }
    format!("{:016X}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_names_each_group_version_and_each_document_its_paths() {
        let defs: Vec<Arc<ResourceDef>> = crate::resource::builtin()
            .into_iter()
            .map(Arc::new)
            .collect();
        let index = v3(&defs, "").unwrap();
        let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="));
        let doc = v3(&defs, "apis/apps/v1").unwrap();
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "Deployment"
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(v3(&defs, "apis/nope/v1").is_none());
        assert!(
            v2(&defs)["paths"]
                .as_object()
                .unwrap()
                .contains_key("/api/v1/nodes/{name}")
        );
    }
}
