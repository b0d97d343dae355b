//! The simulator answers as the real kube-apiserver captured in `tests/fixtures/` did:
//! it is seeded with the very objects the capture held, each captured request is
//! replayed, and the answers are compared field by field once the values only a
//! server can choose (uids, resourceVersions, timestamps, managedFields) are masked.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use base64::Engine;
use common::{Api, fixture, fixture_lines, start};
use fleetscope_sim::{ClusterConfig, SimServer, Token};
use http::{Method, StatusCode};
use serde_json::{Value, json};

/// Masks what only a server chooses, so two servers' answers compare equal.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, val) in map {
                let masked = match k.as_str() {
                    "managedFields" => continue,
                    "uid" | "resourceVersion" | "creationTimestamp" if val.is_string() => {
                        json!(format!("<{k}>"))
                    }
                    "continue" => decode_continue(val),
                    "message" => json!(mask_digits(val.as_str().unwrap_or_default())),
                    _ => normalize(val),
                };
                out.insert(k.clone(), masked);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn mask_digits(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

/// A continue token decoded, with its resourceVersion masked unless it is -1.
fn decode_continue(v: &Value) -> Value {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(v.as_str().unwrap())
        .unwrap();
    let mut token: Value = serde_json::from_slice(&raw).unwrap();
    if token["rv"] != json!(-1) {
        token["rv"] = json!("<rv>");
    }
    token
}

/// Strips what a client must not send on create.
fn as_input(item: &Value) -> Value {
    let mut v = item.clone();
    let meta = v["metadata"].as_object_mut().unwrap();
    for k in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "selfLink",
    ] {
        meta.remove(k);
    }
    v
}

async fn seeded() -> (SimServer, Api) {
    let mut config = ClusterConfig::new("fixtures");
    config.bookmark_interval = Duration::from_millis(200);
    let mut nobody = Token::new("nobody-token", "realk8s-nobody");
    nobody.denied.insert("pods".into());
    config.tokens.push(nobody);
    let server = start(config).await;
    let store = &server.cluster().store;
    for ns in ["fixtures", "demo"] {
        store
            .create("namespaces", None, json!({"metadata": {"name": ns}}))
            .unwrap();
    }
    // cm-1..cm-4 in full from the two pages, cm-5 from the label selector capture.
    let mut configmaps: Vec<Value> = Vec::new();
    for f in [
        "list-configmaps-page1.json",
        "list-configmaps-page2.json",
        "list-configmaps-labelselector.json",
    ] {
        for item in fixture(f)["items"].as_array().unwrap() {
            if !configmaps
                .iter()
                .any(|c| c["metadata"]["name"] == item["metadata"]["name"])
            {
                configmaps.push(item.clone());
            }
        }
    }
    configmaps.sort_by_key(|c| c["metadata"]["name"].as_str().unwrap().to_string());
    for cm in &configmaps {
        store
            .create("configmaps", Some("fixtures"), as_input(cm))
            .unwrap();
    }
    store
        .create("configmaps", Some("fixtures"), json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----"}}))
        .unwrap();
    for item in fixture("list-deployments.json")["items"]
        .as_array()
        .unwrap()
    {
        store
            .create("deployments.apps", Some("demo"), as_input(item))
            .unwrap();
    }
    for item in fixture("list-pods.json")["items"].as_array().unwrap() {
        store.create("pods", Some("demo"), as_input(item)).unwrap();
    }
    let api = Api::new(&server);
    (server, api)
}

async fn assert_matches(api: &Api, path: &str, capture: &str, code: StatusCode) {
    let reply = api.get(path).await;
    assert_eq!(
        reply.status,
        code,
        "{path}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        normalize(&reply.json()),
        normalize(&fixture(capture)),
        "{path} differs from {capture}"
    );
}

#[tokio::test]
async fn lists_match_the_captures() {
    let (_server, api) = seeded().await;
    assert_matches(
        &api,
        "/api/v1/namespaces/fixtures/configmaps?limit=2",
        "list-configmaps-page1.json",
        StatusCode::OK,
    )
    .await;
    let page1 = api
        .get("/api/v1/namespaces/fixtures/configmaps?limit=2")
        .await
        .json();
    let token = page1["metadata"]["continue"].as_str().unwrap();
    assert_matches(
        &api,
        &format!("/api/v1/namespaces/fixtures/configmaps?limit=2&continue={token}"),
        "list-configmaps-page2.json",
        StatusCode::OK,
    )
    .await;
    assert_matches(
        &api,
        "/api/v1/namespaces/fixtures/configmaps?labelSelector=tier%3Dt1",
        "list-configmaps-labelselector.json",
        StatusCode::OK,
    )
    .await;
    assert_matches(
        &api,
        "/api/v1/namespaces/fixtures/configmaps?fieldSelector=metadata.name%3Dcm-3",
        "list-configmaps-fieldselector.json",
        StatusCode::OK,
    )
    .await;
    assert_matches(
        &api,
        "/apis/apps/v1/namespaces/demo/deployments",
        "list-deployments.json",
        StatusCode::OK,
    )
    .await;
    assert_matches(
        &api,
        "/api/v1/namespaces/demo/pods",
        "list-pods.json",
        StatusCode::OK,
    )
    .await;
}

#[tokio::test]
async fn metadata_only_list_matches_the_capture() {
    let (_server, api) = seeded().await;
    let reply = api
        .send(
            Method::GET,
            "/api/v1/namespaces/fixtures/configmaps",
            &[(
                "accept",
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            )],
            None,
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        normalize(&reply.json()),
        normalize(&fixture("list-configmaps-metadata-only.json"))
    );
}

#[tokio::test]
async fn errors_match_the_captures_exactly() {
    let (server, api) = seeded().await;
    assert_matches(
        &api,
        "/api/v1/namespaces/fixtures/configmaps/nope",
        "get-notfound.json",
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_matches(
        &api,
        "/api/v1/namespaces/fixtures/widgets",
        "get-unknown-resource.json",
        StatusCode::NOT_FOUND,
    )
    .await;
    let nobody = api.with_token(Some("nobody-token"));
    let reply = nobody.get("/api/v1/pods").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(
        reply.json(),
        fixture("forbidden.json"),
        "a 403 is byte-for-byte the captured Status"
    );
    for token in [Some("unknown-token"), None] {
        let reply = api.with_token(token).get("/api/v1/pods").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.json(), fixture("unauthorized.json"));
    }

    // Expired resourceVersion and continue token, after compaction.
    let page1 = api
        .get("/api/v1/namespaces/fixtures/configmaps?limit=2")
        .await
        .json();
    let rv = page1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    server
        .cluster()
        .store
        .create(
            "configmaps",
            Some("fixtures"),
            json!({"metadata": {"name": "later"}}),
        )
        .unwrap();
    server.cluster().compact();
    let reply = api
        .get(&format!(
            "/api/v1/namespaces/fixtures/configmaps?resourceVersion={rv}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(reply.status, StatusCode::GONE);
    assert_eq!(reply.json(), fixture("list-410-expired-rv.json"));
    let reply = api
        .get(&format!(
            "/api/v1/namespaces/fixtures/configmaps?limit=2&continue={token}"
        ))
        .await;
    assert_eq!(reply.status, StatusCode::GONE);
    assert_eq!(
        reply.json(),
        fixture("list-410-expired-continue.json"),
        "same Status, same fresh token"
    );
}

#[tokio::test]
async fn discovery_matches_the_captures() {
    let (_server, api) = seeded().await;
    let version = api.get("/version").await.json();
    let keys = |v: &Value| {
        v.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(keys(&version), keys(&fixture("version.json")));

    let api_doc = api.get("/api").await.json();
    assert_eq!(keys(&api_doc), keys(&fixture("discovery-api.json")));
    assert_eq!(api_doc["versions"], json!(["v1"]));

    // Every resource the simulator serves is described as the real server describes it.
    let entry = |doc: &Value, name: &str| -> Value {
        let mut e = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing"));
        let o = e.as_object_mut().unwrap();
        o.remove("storageVersionHash");
        o.remove("singularName");
        e
    };
    for (path, capture, names) in [
        (
            "/api/v1",
            "discovery-api-v1.json",
            &[
                "pods",
                "configmaps",
                "services",
                "nodes",
                "secrets",
                "namespaces",
                "pods/status",
            ][..],
        ),
        (
            "/apis/apps/v1",
            "discovery-apis-apps-v1.json",
            &["deployments", "replicasets", "deployments/status"][..],
        ),
    ] {
        let real = fixture(capture);
        let sim = api.get(path).await.json();
        assert_eq!(keys(&sim), keys(&real), "{path}");
        assert_eq!(sim["groupVersion"], real["groupVersion"]);
        for name in names {
            assert_eq!(entry(&sim, name), entry(&real, name), "{path} {name}");
        }
    }
    // A custom group is listed and described like a built-in one.
    let groups = api.get("/apis").await.json();
    let real_groups = fixture("discovery-apis.json");
    assert_eq!(keys(&groups), keys(&real_groups));
    let apps = |doc: &Value| {
        doc["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "apps")
            .cloned()
            .unwrap()
    };
    assert_eq!(apps(&groups), apps(&real_groups));
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "stable.example.com")
    );
    let crd = api.get("/apis/stable.example.com/v1").await.json();
    assert_eq!(
        keys(&crd),
        keys(&fixture("discovery-apis-batch-v1beta1.json"))
    );
    assert_eq!(crd["resources"][0]["kind"], "CronTab");
}

#[tokio::test]
async fn watch_with_bookmarks_matches_the_capture() {
    let (server, api) = seeded().await;
    let list = api
        .get("/api/v1/namespaces/fixtures/configmaps")
        .await
        .json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut events = api
        .watch(&format!("/api/v1/namespaces/fixtures/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=2"))
        .await
        .unwrap();
    let store = &server.cluster().store;
    store
        .create(
            "configmaps",
            Some("fixtures"),
            json!({"metadata": {"name": "cm-new"}, "data": {"a": "b"}}),
        )
        .unwrap();
    store
        .patch(
            "configmaps",
            "fixtures",
            "cm-new",
            &json!({"metadata": {"labels": {"touched": "yes"}}}),
        )
        .unwrap();
    store.delete("configmaps", "fixtures", "cm-2").unwrap();
    let got = events.rest().await;
    let real = fixture_lines("watch-configmaps-bookmarks.jsonl");
    // The three changes match exactly; then bookmarks, shaped exactly as captured, carry the last resourceVersion.
    assert_eq!(
        got[..3].iter().map(normalize).collect::<Vec<_>>(),
        real[..3].iter().map(normalize).collect::<Vec<_>>()
    );
    assert!(
        got.len() >= 4,
        "at least one bookmark before the timeout ends the stream: {got:?}"
    );
    let last_rv = got[2]["object"]["metadata"]["resourceVersion"].clone();
    for b in &got[3..] {
        assert_eq!(normalize(b), normalize(&real[3]));
        assert_eq!(b["object"]["metadata"]["resourceVersion"], last_rv);
    }
}

#[tokio::test]
async fn watch_from_a_compacted_version_matches_the_410_capture() {
    let (server, api) = seeded().await;
    server.cluster().compact();
    let mut events = api
        .watch("/api/v1/namespaces/fixtures/configmaps?watch=1&resourceVersion=1")
        .await
        .unwrap();
    let got = events.rest().await;
    let real = fixture_lines("watch-410-too-old.jsonl");
    assert_eq!(got.len(), 1);
    assert_eq!(normalize(&got[0]), normalize(&real[0]));
    let oldest = server.cluster().store.oldest_resource_version();
    assert_eq!(
        got[0]["object"]["message"],
        format!("too old resource version: 1 ({oldest})")
    );
}
