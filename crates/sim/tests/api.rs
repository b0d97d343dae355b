//! The simulator's API behaviour over HTTP: paging, resourceVersion semantics,
//! selectors, watches, writes, auth, counters and every injected fault.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Api, Next, start};
use fleetscope_sim::{
    ClusterConfig, FailFor, ListKind, SimServer, Verb, WatchListSupport, Workload, WorkloadSpec,
};
use http::{Method, StatusCode};
use serde_json::{Value, json};

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

async fn with_configmaps(n: usize) -> (SimServer, Api) {
    let server = start(ClusterConfig::new("api")).await;
    let store = &server.cluster().store;
    store
        .create("namespaces", None, json!({"metadata": {"name": "a"}}))
        .unwrap();
    store
        .create("namespaces", None, json!({"metadata": {"name": "b"}}))
        .unwrap();
    for i in 0..n {
        let ns = if i % 2 == 0 { "a" } else { "b" };
        let labels = json!({"app": if i % 3 == 0 { "web" } else { "db" }, "idx": i.to_string()});
        store
            .create(
                "configmaps",
                Some(ns),
                json!({"metadata": {"name": format!("cm-{i:03}"), "labels": labels}}),
            )
            .unwrap();
    }
    let api = Api::new(&server);
    (server, api)
}

#[tokio::test]
async fn paging_reads_one_snapshot_while_writes_continue() {
    let (server, api) = with_configmaps(50).await;
    let store = &server.cluster().store;
    let first = api.get("/api/v1/configmaps?limit=7").await.json();
    let rv = first["metadata"]["resourceVersion"].clone();
    assert_eq!(first["metadata"]["remainingItemCount"], 43);
    let mut seen = names(&first);
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let mut i = 0;
    loop {
        // Writes between pages must not show in this list.
        store
            .create(
                "configmaps",
                Some("a"),
                json!({"metadata": {"name": format!("late-{i}")}}),
            )
            .unwrap();
        store
            .delete("configmaps", "b", &format!("cm-{:03}", 2 * i + 1))
            .unwrap();
        i += 1;
        let page = api
            .get(&format!("/api/v1/configmaps?limit=7&continue={token}"))
            .await
            .json();
        assert_eq!(
            page["metadata"]["resourceVersion"], rv,
            "every page is at the first page's resourceVersion"
        );
        seen.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(t) => token = t.to_string(),
            None => {
                assert!(page["metadata"].get("remainingItemCount").is_none());
                break;
            }
        }
    }
    assert_eq!(seen.len(), 50);
    assert_eq!(
        seen.iter().collect::<BTreeSet<_>>().len(),
        50,
        "no duplicates"
    );
    // Cluster-wide order is namespace/name, as etcd keys sort.
    assert!(
        seen[..25]
            .iter()
            .all(|n| n.ends_with(['0', '2', '4', '6', '8']))
    );
}

#[tokio::test]
async fn resource_version_semantics_follow_the_api_documentation() {
    let (server, api) = with_configmaps(4).await;
    let store = &server.cluster().store;
    let before = store.resource_version();
    store.delete("configmaps", "a", "cm-000").unwrap();
    let now = store.resource_version();

    let exact = api
        .get(&format!(
            "/api/v1/configmaps?resourceVersion={before}&resourceVersionMatch=Exact"
        ))
        .await
        .json();
    assert_eq!(names(&exact).len(), 4, "Exact reads the past");
    assert_eq!(exact["metadata"]["resourceVersion"], before.to_string());
    let not_older = api
        .get(&format!(
            "/api/v1/configmaps?resourceVersion={before}&resourceVersionMatch=NotOlderThan"
        ))
        .await
        .json();
    assert_eq!(names(&not_older).len(), 3);
    assert_eq!(not_older["metadata"]["resourceVersion"], now.to_string());
    let any = api
        .get("/api/v1/configmaps?resourceVersion=0&limit=1")
        .await
        .json();
    assert_eq!(
        names(&any).len(),
        3,
        "resourceVersion=0 is served from cache and ignores limit"
    );
    assert!(any["metadata"].get("continue").is_none());
    let legacy = api
        .get(&format!(
            "/api/v1/configmaps?resourceVersion={before}&limit=10"
        ))
        .await
        .json();
    assert_eq!(
        names(&legacy).len(),
        4,
        "a resourceVersion with limit and no match is Exact"
    );

    let future = api
        .get(&format!(
            "/api/v1/configmaps?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            now + 100
        ))
        .await;
    assert_eq!(future.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        future.json()["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    for bad in [
        "/api/v1/configmaps?resourceVersionMatch=Exact",
        "/api/v1/configmaps?resourceVersion=0&resourceVersionMatch=Exact",
        "/api/v1/configmaps?resourceVersion=1&resourceVersionMatch=Sometimes",
    ] {
        let r = api.get(bad).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(r.json()["reason"], "Invalid");
    }
    for bad in [
        "/api/v1/configmaps?resourceVersion=abc",
        "/api/v1/configmaps?limit=x",
        "/api/v1/configmaps?continue=not-a-token",
        "/api/v1/configmaps?limit=1&continue=eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJ4In0&resourceVersion=5",
    ] {
        let r = api.get(bad).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["kind"], "Status");
    }
}

#[tokio::test]
async fn label_and_field_selectors_in_full_syntax() {
    let (_server, api) = with_configmaps(12).await;
    let count = |q: &'static str| {
        let api = &api;
        async move {
            names(
                &api.get(&format!("/api/v1/configmaps?labelSelector={q}"))
                    .await
                    .json(),
            )
            .len()
        }
    };
    assert_eq!(count("app%3Dweb").await, 4);
    assert_eq!(count("app%3D%3Dweb").await, 4);
    assert_eq!(count("app%21%3Dweb").await, 8);
    assert_eq!(count("idx%20in%20(1,2,3)").await, 3);
    assert_eq!(count("idx%20notin%20(1,2,3)").await, 9);
    assert_eq!(count("app").await, 12);
    assert_eq!(count("%21app").await, 0);
    assert_eq!(count("app%3Dweb,idx%20in%20(0,3,4)").await, 2);
    let r = api
        .get("/api/v1/configmaps?labelSelector=app%20in%20web")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.json()["message"].as_str().unwrap().contains("position"));

    let field = names(
        &api.get(
            "/api/v1/configmaps?fieldSelector=metadata.namespace%3Db,metadata.name%21%3Dcm-001",
        )
        .await
        .json(),
    );
    assert_eq!(field.len(), 5);
    let r = api
        .get("/api/v1/configmaps?fieldSelector=spec.nodeName%3Dx")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json()["message"],
        "field label not supported: spec.nodeName"
    );
}

#[tokio::test]
async fn pod_field_selectors_cover_phase_and_node() {
    let server = start(ClusterConfig::new("pods")).await;
    Workload::populate(server.cluster(), &WorkloadSpec::new(500, 3)).unwrap();
    let api = Api::new(&server);
    let all = names(&api.get("/api/v1/pods").await.json()).len();
    let running = names(
        &api.get("/api/v1/pods?fieldSelector=status.phase%3DRunning")
            .await
            .json(),
    )
    .len();
    assert_eq!(all, running);
    let node0 = names(
        &api.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-0")
            .await
            .json(),
    )
    .len();
    let not_node0 = names(
        &api.get("/api/v1/pods?fieldSelector=spec.nodeName%21%3Dnode-0")
            .await
            .json(),
    )
    .len();
    assert!(node0 > 0);
    assert_eq!(node0 + not_node0, all);
}

#[tokio::test]
async fn limit_with_a_selector_pages_without_remaining_count() {
    let (_server, api) = with_configmaps(30).await;
    let mut got = Vec::new();
    let mut url = "/api/v1/configmaps?limit=4&labelSelector=app%3Dweb".to_string();
    loop {
        let page = api.get(&url).await.json();
        assert!(
            page["metadata"].get("remainingItemCount").is_none(),
            "unknown with a selector"
        );
        got.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(t) => {
                url = format!("/api/v1/configmaps?limit=4&labelSelector=app%3Dweb&continue={t}")
            }
            None => break,
        }
    }
    assert_eq!(got.len(), 10);
}

#[tokio::test]
async fn watch_sends_initial_events_with_the_end_bookmark() {
    let (server, api) = with_configmaps(5).await;
    let mut events = api
        .watch("/api/v1/namespaces/a/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
        .await
        .unwrap();
    for _ in 0..3 {
        let e = events.event().await;
        assert_eq!(e["type"], "ADDED");
        assert_eq!(e["object"]["kind"], "ConfigMap", "watch objects carry kind");
    }
    let end = events.event().await;
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(
        end["object"]["metadata"]["resourceVersion"],
        server.cluster().store.resource_version().to_string()
    );
    server
        .cluster()
        .store
        .create(
            "configmaps",
            Some("a"),
            json!({"metadata": {"name": "new"}}),
        )
        .unwrap();
    server
        .cluster()
        .store
        .create(
            "configmaps",
            Some("b"),
            json!({"metadata": {"name": "elsewhere"}}),
        )
        .unwrap();
    server
        .cluster()
        .store
        .delete("configmaps", "a", "new")
        .unwrap();
    assert_eq!(events.event().await["type"], "ADDED");
    assert_eq!(
        events.event().await["type"],
        "DELETED",
        "the other namespace's object is not seen"
    );

    let bad = api
        .watch("/api/v1/configmaps?watch=1&sendInitialEvents=true")
        .await
        .err()
        .unwrap();
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad = api
        .watch("/api/v1/configmaps?watch=1&resourceVersion=1&resourceVersionMatch=NotOlderThan")
        .await
        .err()
        .unwrap();
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad = api
        .watch(
            "/api/v1/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        )
        .await
        .err()
        .unwrap();
    assert_eq!(
        bad.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "allowWatchBookmarks is required"
    );
}

#[tokio::test]
async fn watch_without_a_version_starts_with_synthetic_adds() {
    let (server, api) = with_configmaps(4).await;
    let mut events = api
        .watch("/api/v1/configmaps?watch=true&resourceVersion=0")
        .await
        .unwrap();
    for _ in 0..4 {
        assert_eq!(events.event().await["type"], "ADDED");
    }
    server
        .cluster()
        .store
        .patch("configmaps", "a", "cm-000", &json!({"data": {"x": "1"}}))
        .unwrap();
    assert_eq!(events.event().await["type"], "MODIFIED");
}

#[tokio::test]
async fn watch_applies_selectors_to_transitions() {
    let (server, api) = with_configmaps(3).await;
    let store = &server.cluster().store;
    let rv = store.resource_version();
    let mut events = api
        .watch(&format!(
            "/api/v1/configmaps?watch=1&resourceVersion={rv}&labelSelector=app%3Dweb"
        ))
        .await
        .unwrap();
    store
        .patch(
            "configmaps",
            "b",
            "cm-001",
            &json!({"metadata": {"labels": {"app": "web"}}}),
        )
        .unwrap();
    store
        .patch("configmaps", "b", "cm-001", &json!({"data": {"k": "v"}}))
        .unwrap();
    store
        .patch(
            "configmaps",
            "b",
            "cm-001",
            &json!({"metadata": {"labels": {"app": "db"}}}),
        )
        .unwrap();
    store
        .patch("configmaps", "a", "cm-002", &json!({"data": {"k": "v"}}))
        .unwrap();
    store.delete("configmaps", "a", "cm-000").unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        let e = events.event().await;
        got.push((
            e["type"].as_str().unwrap().to_string(),
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        ));
    }
    assert_eq!(
        got,
        [
            ("ADDED", "cm-001"),
            ("MODIFIED", "cm-001"),
            ("DELETED", "cm-001"),
            ("DELETED", "cm-000")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
}

#[tokio::test]
async fn watch_resumes_from_a_version_with_every_change_after_it() {
    let (server, api) = with_configmaps(2).await;
    let store = &server.cluster().store;
    let rv = store.resource_version();
    for i in 0..5 {
        store
            .create(
                "configmaps",
                Some("a"),
                json!({"metadata": {"name": format!("r{i}")}}),
            )
            .unwrap();
    }
    let mut events = api
        .watch(&format!("/api/v1/configmaps?watch=1&resourceVersion={rv}"))
        .await
        .unwrap();
    let mut last = rv;
    for i in 0..5 {
        let e = events.event().await;
        assert_eq!(e["object"]["metadata"]["name"], format!("r{i}"));
        let this: u64 = e["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(this > last, "in resourceVersion order");
        last = this;
    }
}

#[tokio::test]
async fn watch_ends_at_its_timeout_and_the_server_ends_unbounded_watches() {
    let mut config = ClusterConfig::new("lifetime");
    config.watch_lifetime = (Duration::from_millis(300), Duration::from_millis(301));
    let server = start(config).await;
    let api = Api::new(&server);
    let mut events = api
        .watch("/api/v1/configmaps?watch=1&resourceVersion=1")
        .await
        .unwrap();
    assert!(
        matches!(events.next().await, Next::End),
        "the server ends a watch without timeoutSeconds"
    );
    let mut events = api
        .watch("/api/v1/configmaps?watch=1&resourceVersion=1&timeoutSeconds=1")
        .await
        .unwrap();
    assert!(matches!(events.next().await, Next::End));
}

#[tokio::test]
async fn writes_over_http_behave_as_kubernetes() {
    let (_server, api) = with_configmaps(0).await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}, "data": {"a": "1"}});
    let created = api
        .send(
            Method::POST,
            "/api/v1/namespaces/a/configmaps",
            &[],
            Some(cm.clone()),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let created = created.json();
    assert_eq!(created["kind"], "ConfigMap");
    assert!(created["metadata"]["uid"].is_string());
    let dup = api
        .send(
            Method::POST,
            "/api/v1/namespaces/a/configmaps",
            &[],
            Some(cm),
        )
        .await;
    assert_eq!(
        (dup.status, dup.json()["reason"].clone()),
        (StatusCode::CONFLICT, json!("AlreadyExists"))
    );

    let mut update = created.clone();
    update["data"]["a"] = json!("2");
    let updated = api
        .send(
            Method::PUT,
            "/api/v1/namespaces/a/configmaps/w",
            &[],
            Some(update.clone()),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK);
    let stale = api
        .send(
            Method::PUT,
            "/api/v1/namespaces/a/configmaps/w",
            &[],
            Some(update),
        )
        .await;
    assert_eq!(
        (stale.status, stale.json()["reason"].clone()),
        (StatusCode::CONFLICT, json!("Conflict"))
    );

    for ct in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let patched = api
            .send(
                Method::PATCH,
                "/api/v1/namespaces/a/configmaps/w",
                &[("content-type", ct)],
                Some(json!({"metadata": {"labels": {"p": "y"}}})),
            )
            .await;
        assert_eq!(patched.status, StatusCode::OK, "{ct}");
        assert_eq!(patched.json()["metadata"]["labels"]["p"], "y");
    }
    let json_patch = api
        .send(
            Method::PATCH,
            "/api/v1/namespaces/a/configmaps/w",
            &[("content-type", "application/json-patch+json")],
            Some(json!([{"op": "add", "path": "/metadata/labels/j", "value": "z"}])),
        )
        .await;
    assert_eq!(json_patch.status, StatusCode::OK);
    assert_eq!(json_patch.json()["metadata"]["labels"]["j"], "z");
    let apply = api
        .send(
            Method::PATCH,
            "/api/v1/namespaces/a/configmaps/w",
            &[("content-type", "application/apply-patch+yaml")],
            Some(json!({})),
        )
        .await;
    assert_eq!(apply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let deleted = api
        .send(
            Method::DELETE,
            "/api/v1/namespaces/a/configmaps/w",
            &[],
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(
        api.get("/api/v1/namespaces/a/configmaps/w").await.status,
        StatusCode::NOT_FOUND
    );

    let garbage = api
        .send(
            Method::POST,
            "/api/v1/namespaces/a/configmaps",
            &[],
            Some(json!("nope")),
        )
        .await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    let no_ns = api
        .send(
            Method::POST,
            "/api/v1/namespaces/zz/configmaps",
            &[],
            Some(json!({"metadata": {"name": "x"}})),
        )
        .await;
    assert_eq!(no_ns.status, StatusCode::NOT_FOUND);
    let wrong_method = api.send(Method::PUT, "/api/v1/configmaps", &[], None).await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn forbidden_resource_types_do_not_affect_others() {
    let (server, api) = with_configmaps(2).await;
    let token = server.cluster().admin_token();
    server.cluster().set_denied(&token, "configmaps", true);
    let r = api.get("/api/v1/namespaces/a/configmaps").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json()["message"],
        "configmaps is forbidden: User \"api-admin\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"a\""
    );
    let w = api.watch("/api/v1/configmaps?watch=1").await.err().unwrap();
    assert_eq!(w.status, StatusCode::FORBIDDEN);
    assert_eq!(api.get("/api/v1/namespaces").await.status, StatusCode::OK);
    server.cluster().set_denied(&token, "configmaps", false);
    assert_eq!(api.get("/api/v1/configmaps").await.status, StatusCode::OK);
}

#[tokio::test]
async fn request_counters_are_readable_in_process_and_at_metrics() {
    let (server, api) = with_configmaps(1).await;
    let c = server.cluster();
    c.reset_counters();
    api.get("/api/v1/configmaps").await;
    api.get("/api/v1/configmaps").await;
    api.get("/api/v1/namespaces/a/configmaps/cm-000").await;
    let mut w = api
        .watch("/api/v1/configmaps?watch=1&timeoutSeconds=1")
        .await
        .unwrap();
    w.rest().await;
    api.get("/apis").await;
    assert_eq!(c.requests(Verb::List, "configmaps"), 2);
    assert_eq!(c.requests(Verb::Get, "configmaps"), 1);
    assert_eq!(c.requests(Verb::Watch, "configmaps"), 1);
    assert_eq!(c.requests_of(Verb::Discovery), 1);
    let metrics = api.with_token(None).get("/metrics").await;
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        text.contains("sim_requests_total{verb=\"LIST\",resource=\"configmaps\"} 2"),
        "{text}"
    );
}

#[tokio::test]
async fn table_output_for_kubectl() {
    let server = start(ClusterConfig::new("table")).await;
    Workload::populate(server.cluster(), &WorkloadSpec::new(100, 1)).unwrap();
    let api = Api::new(&server);
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let t = api
        .send(
            Method::GET,
            "/api/v1/pods?limit=500",
            &[("accept", accept)],
            None,
        )
        .await
        .json();
    assert_eq!(t["kind"], "Table");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(&cols[..5], ["Name", "Ready", "Status", "Restarts", "Age"]);
    let row = &t["rows"][0];
    assert_eq!(row["cells"][1], "1/1");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert!(row["object"]["metadata"]["namespace"].is_string());
}

// ---- faults ----

#[tokio::test]
async fn drop_watches_cuts_live_connections() {
    let (server, api) = with_configmaps(1).await;
    let mut events = api
        .watch("/api/v1/configmaps?watch=1&resourceVersion=1")
        .await
        .unwrap();
    assert_eq!(events.event().await["type"], "ADDED", "the stream is live");
    server.cluster().drop_watches();
    assert!(
        matches!(events.next().await, Next::Broken),
        "cut, not ended cleanly"
    );
}

#[tokio::test]
async fn expire_watches_sends_410_then_ends() {
    let (server, api) = with_configmaps(1).await;
    let rv = server.cluster().store.resource_version();
    let mut events = api
        .watch(&format!("/api/v1/configmaps?watch=1&resourceVersion={rv}"))
        .await
        .unwrap();
    // A change proves the watch is registered before the fault.
    server
        .cluster()
        .store
        .create("configmaps", Some("a"), json!({"metadata": {"name": "x"}}))
        .unwrap();
    assert_eq!(events.event().await["type"], "ADDED");
    server.cluster().expire_watches();
    let rest = events.rest().await;
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0]["type"], "ERROR");
    assert_eq!(rest[0]["object"]["code"], 410);
}

#[tokio::test]
async fn stalled_watch_is_accepted_and_never_answered() {
    let (server, api) = with_configmaps(1).await;
    server.cluster().stall_next_watches(1);
    let stalled = {
        let api = api.with_token(Some(&server.cluster().admin_token()));
        tokio::spawn(async move { api.try_get("/api/v1/configmaps?watch=1").await })
    };
    // Other requests are answered meanwhile, and the stall is counted as a watch.
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    while server.cluster().requests(Verb::Watch, "configmaps") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled watch never arrived"
        );
        tokio::task::yield_now().await;
        api.get("/api/v1/namespaces").await;
    }
    assert!(!stalled.is_finished(), "no answer while stalled");
    server.cluster().release_stalls();
    let outcome = tokio::time::timeout(common::PATIENCE, stalled)
        .await
        .expect("released")
        .expect("task");
    assert!(
        outcome.is_err(),
        "the connection closed without any answer: {outcome:?}"
    );
    let mut normal = api
        .watch("/api/v1/configmaps?watch=1&resourceVersion=1&timeoutSeconds=1")
        .await
        .unwrap();
    assert_eq!(
        normal.event().await["type"],
        "ADDED",
        "the next watch is served"
    );
}

#[tokio::test]
async fn frozen_watch_keeps_its_connection_and_sends_nothing() {
    let (server, api) = with_configmaps(1).await;
    let rv = server.cluster().store.resource_version();
    let mut events = api
        .watch(&format!("/api/v1/configmaps?watch=1&resourceVersion={rv}"))
        .await
        .unwrap();
    server
        .cluster()
        .store
        .create(
            "configmaps",
            Some("a"),
            json!({"metadata": {"name": "before"}}),
        )
        .unwrap();
    assert_eq!(events.event().await["object"]["metadata"]["name"], "before");
    server.cluster().freeze_watches(true);
    server
        .cluster()
        .store
        .create(
            "configmaps",
            Some("a"),
            json!({"metadata": {"name": "during"}}),
        )
        .unwrap();
    let silent = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
    assert!(silent.is_err(), "nothing arrives while frozen");
    server.cluster().freeze_watches(false);
    assert_eq!(
        events.event().await["object"]["metadata"]["name"],
        "during",
        "thawed, it carries on"
    );
}

#[tokio::test]
async fn injected_500_and_429_storms_end() {
    let (server, api) = with_configmaps(1).await;
    server.cluster().fail_requests(429, FailFor::Requests(2));
    let r = api.get("/api/v1/configmaps").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers.get("retry-after").unwrap(), "1");
    assert_eq!(r.json()["reason"], "TooManyRequests");
    assert_eq!(
        api.get("/api/v1/configmaps").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(api.get("/api/v1/configmaps").await.status, StatusCode::OK);
    server
        .cluster()
        .fail_requests(500, FailFor::Duration(Duration::from_secs(3600)));
    let r = api.get("/api/v1/configmaps").await;
    assert_eq!(
        (r.status, r.json()["reason"].clone()),
        (StatusCode::INTERNAL_SERVER_ERROR, json!("InternalError"))
    );
    server.cluster().clear_failures();
    assert_eq!(api.get("/api/v1/configmaps").await.status, StatusCode::OK);
}

#[tokio::test]
async fn offline_refuses_connections_and_online_serves_the_same_state() {
    let (server, api) = with_configmaps(3).await;
    let mut events = api
        .watch("/api/v1/configmaps?watch=1&resourceVersion=1")
        .await
        .unwrap();
    server.go_offline().await;
    // Whatever was in flight arrives; then the stream ends or breaks.
    while let Next::Event(_) = events.next().await {}
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let refused = client
        .get(format!("{}/version", server.url()).parse().unwrap())
        .await;
    assert!(refused.is_err(), "connection refused while offline");
    server.come_online().await.unwrap();
    assert_eq!(names(&api.get("/api/v1/configmaps").await.json()).len(), 3);
}

#[tokio::test]
async fn restart_keeps_or_resets_the_resource_version_sequence() {
    let (server, api) = with_configmaps(3).await;
    for i in 0..10 {
        server
            .cluster()
            .store
            .patch(
                "configmaps",
                "a",
                "cm-000",
                &json!({"data": {"i": i.to_string()}}),
            )
            .unwrap();
    }
    let before = server.cluster().store.resource_version();
    server.restart(false).await.unwrap();
    let list = api.get("/api/v1/configmaps").await.json();
    assert_eq!(list["metadata"]["resourceVersion"], before.to_string());
    let ok = api
        .watch(&format!(
            "/api/v1/configmaps?watch=1&resourceVersion={before}&timeoutSeconds=1"
        ))
        .await;
    assert!(ok.is_ok(), "history survives a plain restart");

    server.restart(true).await.unwrap();
    let after = server.cluster().store.resource_version();
    assert!(
        after < before,
        "renumbered from a fresh sequence: {after} < {before}"
    );
    let list = api.get("/api/v1/configmaps").await.json();
    assert_eq!(names(&list).len(), 3);
    let future = api
        .watch(&format!(
            "/api/v1/configmaps?watch=1&resourceVersion={before}"
        ))
        .await
        .err()
        .unwrap();
    assert_eq!(
        future.status,
        StatusCode::GATEWAY_TIMEOUT,
        "a resourceVersion from before the reset is too large"
    );
}

#[tokio::test]
async fn compaction_on_demand_expires_watch_resumes() {
    let (server, api) = with_configmaps(2).await;
    let rv = server.cluster().store.resource_version();
    server
        .cluster()
        .store
        .create("configmaps", Some("a"), json!({"metadata": {"name": "x"}}))
        .unwrap();
    server.cluster().compact();
    let mut events = api
        .watch(&format!("/api/v1/configmaps?watch=1&resourceVersion={rv}"))
        .await
        .unwrap();
    let e = events.event().await;
    assert_eq!(
        (e["type"].clone(), e["object"]["reason"].clone()),
        (json!("ERROR"), json!("Expired"))
    );
}

#[tokio::test]
async fn bounded_history_expires_old_versions() {
    let mut config = ClusterConfig::new("short");
    config.history = 5;
    let server = start(config).await;
    let store = &server.cluster().store;
    store
        .create("namespaces", None, json!({"metadata": {"name": "a"}}))
        .unwrap();
    let rv = store.resource_version();
    for i in 0..10 {
        store
            .create(
                "configmaps",
                Some("a"),
                json!({"metadata": {"name": format!("c{i}")}}),
            )
            .unwrap();
    }
    let api = Api::new(&server);
    let r = api
        .get(&format!(
            "/api/v1/configmaps?resourceVersion={rv}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(r.status, StatusCode::GONE);
}

#[tokio::test]
async fn the_watch_cache_may_trail_storage_and_lists_are_counted_by_how_they_were_served() {
    let (server, api) = with_configmaps(4).await;
    let c = server.cluster();
    c.reset_counters();
    let before = c.store.resource_version();
    c.set_cache_lag(2);
    c.store.delete("configmaps", "a", "cm-000").unwrap();
    c.store.delete("configmaps", "a", "cm-002").unwrap();
    let now = c.store.resource_version();

    // resourceVersion=0: the cache, two changes behind, limit ignored.
    let cached = api
        .get("/api/v1/configmaps?resourceVersion=0&limit=1")
        .await
        .json();
    assert_eq!(cached["metadata"]["resourceVersion"], before.to_string());
    assert_eq!(
        names(&cached).len(),
        4,
        "the cache has not seen the deletes"
    );
    // Not older than a version the cache holds: the cache's own state.
    let not_older = api
        .get(&format!(
            "/api/v1/configmaps?resourceVersion={before}&resourceVersionMatch=NotOlderThan"
        ))
        .await
        .json();
    assert_eq!(not_older["metadata"]["resourceVersion"], before.to_string());
    // Newer than the cache: it catches up first, never answering older.
    let caught_up = api
        .get(&format!(
            "/api/v1/configmaps?resourceVersion={now}&resourceVersionMatch=NotOlderThan"
        ))
        .await
        .json();
    assert_eq!(caught_up["metadata"]["resourceVersion"], now.to_string());
    assert_eq!(names(&caught_up).len(), 2);
    // A consistent read and a paged read with a version go to storage.
    let quorum = api.get("/api/v1/configmaps").await.json();
    assert_eq!(quorum["metadata"]["resourceVersion"], now.to_string());
    api.get(&format!("/api/v1/configmaps?resourceVersion={now}&limit=1"))
        .await;
    let mut stream = api
        .watch("/api/v1/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
        .await
        .unwrap();
    let mut added = 0;
    loop {
        let e = stream.event().await;
        if e["type"] == "BOOKMARK" {
            break;
        }
        added += 1;
    }
    assert_eq!(added, 2);
    assert_eq!(c.lists_of(ListKind::Cache), 3);
    assert_eq!(c.lists_of(ListKind::Quorum), 2);
    assert_eq!(c.lists(ListKind::Streaming, "configmaps"), 1);
    assert!(c.list_bytes_of(ListKind::Streaming) > 0);
    assert!(c.list_bytes_of(ListKind::Cache) > c.list_bytes_of(ListKind::Streaming));
    let text = String::from_utf8(api.with_token(None).get("/metrics").await.body.to_vec()).unwrap();
    for line in [
        "sim_list_requests_total{kind=\"cache\",resource=\"configmaps\"} 3",
        "sim_list_requests_total{kind=\"quorum\",resource=\"configmaps\"} 2",
        "sim_list_requests_total{kind=\"streaming\",resource=\"configmaps\"} 1",
        "sim_list_response_bytes_total{kind=\"streaming\",resource=\"configmaps\"} ",
        "sim_response_bytes_total{verb=\"LIST\"} ",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

#[tokio::test]
async fn a_server_without_watch_list_refuses_it_or_ignores_it() {
    let (server, api) = with_configmaps(3).await;
    let c = server.cluster();
    let streaming = "/api/v1/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1";
    c.set_watch_list(WatchListSupport::Refused);
    let refused = api.watch(streaming).await.err().unwrap();
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("WatchList feature gate"),
        "{}",
        refused.json()
    );
    c.set_watch_list(WatchListSupport::Ignored);
    let mut ignored = api.watch(streaming).await.unwrap();
    let events = ignored.rest().await;
    assert_eq!(events.len(), 3, "synthetic ADDEDs only: {events:?}");
    assert!(events.iter().all(|e| e["type"] == "ADDED"));
    assert_eq!(c.lists_of(ListKind::Streaming), 0);
}

#[tokio::test]
async fn a_distant_cluster_answers_after_its_latency() {
    let server = start(ClusterConfig::new("far")).await;
    let api = Api::new(&server);
    server.cluster().set_latency(Duration::from_millis(300));
    let asked = std::time::Instant::now();
    assert_eq!(api.get("/api/v1/namespaces").await.status, StatusCode::OK);
    assert!(asked.elapsed() >= Duration::from_millis(300));
    server.cluster().set_latency(Duration::ZERO);
    assert_eq!(server.cluster().latency(), Duration::ZERO);
}

#[tokio::test]
async fn held_group_version_documents_wait_until_released_and_are_counted_in_flight() {
    let server = start(ClusterConfig::new("held")).await;
    let cluster = server.cluster().clone();
    cluster.hold_group_versions(true);
    let ask = |path: &'static str| {
        let api = Api::new(&server);
        tokio::spawn(async move { api.get(path).await })
    };
    let (core, apps) = (ask("/api/v1"), ask("/apis/apps/v1"));
    // The root documents are not held.
    assert_eq!(Api::new(&server).get("/apis").await.status, StatusCode::OK);
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while cluster.group_versions_in_flight() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "both documents in flight"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!core.is_finished() && !apps.is_finished());
    cluster.hold_group_versions(false);
    for reply in [core.await.unwrap(), apps.await.unwrap()] {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json()["kind"], "APIResourceList");
    }
    assert_eq!(cluster.group_versions_in_flight(), 0);
}
