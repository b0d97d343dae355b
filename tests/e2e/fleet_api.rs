//! The Fleet API end to end: simulated clusters on loopback → informers → the index →
//! the real gRPC server → a real gRPC client.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Harness, PATIENCE, test_config};
use fleetscope::grpc::ServiceConfig;
use fleetscope::proto::{
    self, CountRequest, EventType, GetRequest, ListRequest, Query, WatchEvent, WatchRequest,
};
use fleetscope_sim::FleetSpec;
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::{Code, Streaming};

fn query(resource: &str) -> Query {
    Query {
        resource: resource.into(),
        ..Default::default()
    }
}

async fn next_event(stream: &mut Streaming<WatchEvent>) -> WatchEvent {
    tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("an event in time")
        .expect("stream open")
        .expect("no error")
}

/// A watch of every object of a type, from now.
async fn watch_all(
    c: &mut fleetscope::proto::fleet_client::FleetClient<tonic::transport::Channel>,
    resource: &str,
) -> Streaming<WatchEvent> {
    watch_query(c, query(resource)).await
}

/// One simulated cluster of 100 objects, configmaps collected, and every Watch
/// subscriber buffering at most 16 events.
async fn start_with_small_subscriber_buffers() -> Harness {
    let mut config = test_config(&["configmaps"]);
    config.index.subscriber_buffer = 16;
    Harness::start_with(
        FleetSpec::numbered(1, 100, 0.0),
        config,
        common::service_config(),
    )
    .await
}

/// Runs `change` while the cluster's watches are cut, then expires its history and
/// drops the watches: only a re-list can tell what changed.
fn while_history_expires(cluster: &fleetscope_sim::Cluster, change: impl FnOnce()) {
    cluster.freeze_watches(true);
    change();
    cluster.compact();
    cluster.freeze_watches(false);
    cluster.drop_watches();
}

/// A watch of the objects a query selects, from now, without initial events.
async fn watch_query(
    c: &mut fleetscope::proto::fleet_client::FleetClient<tonic::transport::Channel>,
    q: Query,
) -> Streaming<WatchEvent> {
    c.watch(WatchRequest {
        query: Some(q),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// The next event that is not a bookmark or a cluster status.
async fn next_change(stream: &mut Streaming<WatchEvent>) -> WatchEvent {
    loop {
        let e = next_event(stream).await;
        if !matches!(e.r#type(), EventType::Bookmark | EventType::ClusterStatus) {
            return e;
        }
    }
}

#[tokio::test]
async fn merged_list_across_clusters_with_selectors_and_consistent_paging() {
    let h = Harness::start(3, 400).await;
    h.synced().await;
    let mut c = h.client().await;
    let pods_per_cluster: Vec<usize> = (0..3).map(|i| h.cluster(i).store.count("pods")).collect();
    let total: usize = pods_per_cluster.iter().sum();

    // Paging walks one snapshot while the clusters keep changing.
    let first = c
        .list(ListRequest {
            query: Some(query("pods")),
            limit: 50,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    let revision = first.revision;
    assert_eq!(first.remaining_item_count as usize, total - 50);
    let mut seen: Vec<(String, String, String)> = first
        .items
        .iter()
        .map(|o| (o.cluster.clone(), o.namespace.clone(), o.name.clone()))
        .collect();
    let mut token = first.next_page_token;
    let mut i = 0;
    while !token.is_empty() {
        h.cluster(i % 3)
            .store
            .create(
                "pods",
                Some("team-0"),
                json!({"metadata": {"name": format!("late-{i}")}, "spec": {}}),
            )
            .unwrap();
        i += 1;
        let page = c
            .list(ListRequest {
                query: None,
                limit: 50,
                page_token: token,
                keep_snapshot: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            page.revision, revision,
            "every page reads the first page's snapshot"
        );
        seen.extend(
            page.items
                .iter()
                .map(|o| (o.cluster.clone(), o.namespace.clone(), o.name.clone())),
        );
        token = page.next_page_token;
    }
    assert_eq!(seen.len(), total);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "ordered by cluster, namespace, name, without duplicates"
    );
    assert!(seen.iter().all(|(_, _, n)| !n.starts_with("late-")));

    // Label, field and cluster selectors.
    let web = c
        .list(ListRequest {
            query: Some(Query {
                label_selector: "app=web".into(),
                ..query("pods")
            }),
            limit: 5000,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!web.items.is_empty());
    for o in &web.items {
        let v: serde_json::Value = serde_json::from_str(&o.json).unwrap();
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert_eq!(
            (v["kind"].as_str(), v["apiVersion"].as_str()),
            (Some("Pod"), Some("v1")),
            "list items carry their type"
        );
    }
    let on_node = c
        .list(ListRequest {
            query: Some(Query {
                field_selector: "spec.nodeName=node-1,status.phase=Running".into(),
                clusters: vec!["sim-2".into()],
                ..query("pods")
            }),
            limit: 5000,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        on_node
            .items
            .iter()
            .all(|o| o.cluster == "sim-2" && o.json.contains("\"nodeName\":\"node-1\""))
    );
    let globbed = c
        .list(ListRequest {
            query: Some(Query {
                clusters: vec!["sim-[13]".into()],
                ..query("deployments.apps")
            }),
            limit: 5000,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    let clusters: BTreeSet<String> = globbed.items.iter().map(|o| o.cluster.clone()).collect();
    assert_eq!(
        clusters,
        BTreeSet::from(["sim-1".to_string(), "sim-3".to_string()])
    );
    assert_eq!(
        globbed.clusters.len(),
        2,
        "freshness of each cluster drawn on"
    );
    assert!(!globbed.partial);

    // Metadata-only projection.
    let meta = c
        .list(ListRequest {
            query: Some(Query {
                projection: proto::Projection::Metadata as i32,
                ..query("pods")
            }),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    let v: serde_json::Value = serde_json::from_str(&meta.items[0].json).unwrap();
    assert!(v.get("spec").is_none() && v["metadata"]["name"].is_string());
    h.shutdown().await;
}

#[tokio::test]
async fn get_count_and_bad_requests() {
    let h = Harness::start(2, 300).await;
    h.synced().await;
    let mut c = h.client().await;
    let some = c
        .list(ListRequest {
            query: Some(query("pods")),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner()
        .items
        .remove(0);
    let got = c
        .get(GetRequest {
            cluster: some.cluster.clone(),
            resource: "Pod".into(),
            namespace: some.namespace.clone(),
            name: some.name.clone(),
            projection: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.object.unwrap().uid, some.uid);
    assert_eq!(got.cluster.unwrap().freshness(), proto::Freshness::Synced);
    // Without a cluster: said to be required, not "no cluster named \"\"".
    let e = c
        .get(GetRequest {
            cluster: String::new(),
            resource: "pods".into(),
            namespace: some.namespace.clone(),
            name: some.name.clone(),
            projection: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().starts_with("cluster is required"),
        "{}",
        e.message()
    );
    let missing = c
        .get(GetRequest {
            cluster: "sim-1".into(),
            resource: "pods".into(),
            namespace: "team-0".into(),
            name: "nope".into(),
            projection: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    let counts = c
        .count(CountRequest {
            query: Some(query("pods")),
            group_by: vec!["cluster".into(), "label:app".into()],
        })
        .await
        .unwrap()
        .into_inner();
    let expected: usize = (0..2).map(|i| h.cluster(i).store.count("pods")).sum();
    assert_eq!(counts.total as usize, expected);
    assert_eq!(
        counts.groups.iter().map(|g| g.count).sum::<u64>(),
        counts.total
    );
    assert!(counts.groups.iter().all(|g| g.key.len() == 2));

    let unknown = c
        .list(ListRequest {
            query: Some(query("pdos")),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(
        unknown.message().contains("did you mean pods"),
        "{}",
        unknown.message()
    );
    let bad = c
        .list(ListRequest {
            query: Some(Query {
                label_selector: "app in web".into(),
                ..query("pods")
            }),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("position 7"), "{}", bad.message());
    let bad = c
        .list(ListRequest {
            query: Some(Query {
                field_selector: "status.phase".into(),
                ..query("pods")
            }),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let bad = c
        .list(ListRequest {
            query: None,
            limit: 1,
            page_token: "garbage".into(),
            keep_snapshot: false,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let bad = c
        .count(CountRequest {
            query: Some(query("pods")),
            group_by: vec!["colour".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let bad = c
        .list(ListRequest {
            query: Some(Query {
                clusters: vec!["sim-[".into()],
                ..query("pods")
            }),
            limit: 1,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    // A query names one type: a pattern or an impossible name is refused, not
    // answered with some type.
    for (resource, says) in [
        ("*", "not a pattern"),
        ("%%%", "not allowed"),
        ("a/b/c/d", "4 parts"),
    ] {
        let bad = c
            .count(CountRequest {
                query: Some(query(resource)),
                group_by: Vec::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument, "{resource}: {bad}");
        assert!(bad.message().contains(says), "{resource}: {bad}");
    }
    for selector in ["status..phase=Running", ".status=x", "status.=x"] {
        let bad = c
            .count(CountRequest {
                query: Some(Query {
                    field_selector: selector.into(),
                    ..query("pods")
                }),
                group_by: Vec::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument, "{selector}: {bad}");
    }
    h.shutdown().await;
}

/// Pages are cut by bytes as well as by count: 300 configmaps of 20 KB each (6 MB)
/// are listed, with the server's default limit, by a client that accepts gRPC's
/// default 4 MiB messages, in more than one page and whole.
#[tokio::test]
async fn list_pages_stay_under_the_default_grpc_message_size() {
    let h = Harness::start(1, 0).await;
    h.synced().await;
    let store = &h.cluster(0).store;
    let big = "x".repeat(20_000);
    for i in 0..300 {
        store
            .create(
                "configmaps",
                Some("team-0"),
                json!({"metadata": {"name": format!("big-{i:03}")}, "data": {"blob": big}}),
            )
            .unwrap();
    }
    h.wait_count(query("configmaps"), store.count("configmaps") as u64)
        .await;
    // A default client: at most 4 MiB per message.
    let mut c = h.client().await;
    let (mut names, mut pages, mut token) = (BTreeSet::new(), 0, String::new());
    loop {
        let page = c
            .list(ListRequest {
                query: Some(query("configmaps")),
                limit: 0,
                page_token: token,
                keep_snapshot: false,
            })
            .await
            .unwrap_or_else(|e| panic!("page {pages}: {e}"))
            .into_inner();
        assert!(!page.items.is_empty());
        pages += 1;
        names.extend(page.items.into_iter().map(|o| o.name));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert!(pages >= 2, "{pages} pages");
    assert_eq!(names.len(), store.count("configmaps"));
    h.shutdown().await;
}

#[tokio::test]
async fn watch_sends_initial_state_then_live_transitions_in_order_and_resumes() {
    let h = Harness::start(2, 200).await;
    h.synced().await;
    let mut c = h.client().await;
    let q = Query {
        label_selector: "stage=live".into(),
        ..query("configmaps")
    };
    let store = &h.cluster(0).store;
    store
        .create(
            "configmaps",
            Some("team-0"),
            json!({"metadata": {"name": "w0", "labels": {"stage": "live"}}}),
        )
        .unwrap();
    h.wait_count(q.clone(), 1).await;
    let mut stream = c
        .watch(WatchRequest {
            query: Some(q.clone()),
            since_revision: 0,
            send_initial_events: true,
            bookmark_interval: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = next_event(&mut stream).await;
    assert_eq!(
        (first.r#type(), first.object.as_ref().unwrap().name.as_str()),
        (EventType::Added, "w0")
    );
    let end = next_event(&mut stream).await;
    assert_eq!(end.r#type(), EventType::InitialEventsEnd);

    store
        .create(
            "configmaps",
            Some("team-0"),
            json!({"metadata": {"name": "w1", "labels": {"stage": "live"}}}),
        )
        .unwrap();
    store
        .patch(
            "configmaps",
            "team-0",
            "w1",
            &json!({"metadata": {"labels": {"stage": "done"}}}),
        )
        .unwrap();
    store
        .patch("configmaps", "team-0", "w0", &json!({"data": {"k": "v"}}))
        .unwrap();
    store.delete("configmaps", "team-0", "w0").unwrap();
    let mut got = Vec::new();
    let mut last = end.revision;
    for _ in 0..4 {
        let e = next_change(&mut stream).await;
        assert!(e.revision > last, "revision order");
        last = e.revision;
        got.push((e.r#type(), e.object.unwrap().name));
    }
    assert_eq!(
        got,
        [
            (EventType::Added, "w1".to_string()),
            (EventType::Deleted, "w1".into()),
            (EventType::Modified, "w0".into()),
            (EventType::Deleted, "w0".into())
        ],
        "an object that stops matching is a DELETED for this subscriber"
    );

    // Resume from a revision: exactly the changes after it.
    let mut resumed = c
        .watch(WatchRequest {
            query: Some(q.clone()),
            since_revision: end.revision,
            send_initial_events: false,
            bookmark_interval: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for (t, name) in &got {
        let e = next_change(&mut resumed).await;
        assert_eq!((&e.r#type(), &e.object.unwrap().name), (t, name));
    }
    let future = c
        .watch(WatchRequest {
            query: Some(q),
            since_revision: u64::MAX / 2,
            send_initial_events: false,
            bookmark_interval: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(future.code(), Code::OutOfRange);
    let info = error_info(&future);
    assert_eq!(info.reason, "REVISION_IN_FUTURE");
    h.shutdown().await;
}

#[tokio::test]
async fn watch_from_a_revision_older_than_the_log_is_out_of_range() {
    let mut config = test_config(&["configmaps"]);
    config.index.log_retention = 5;
    let h = Harness::start_with(
        FleetSpec::numbered(1, 100, 0.0),
        config,
        common::service_config(),
    )
    .await;
    h.synced().await;
    for i in 0..10 {
        h.cluster(0)
            .store
            .create(
                "configmaps",
                Some("team-0"),
                json!({"metadata": {"name": format!("x{i}")}}),
            )
            .unwrap();
    }
    h.wait_count(
        Query {
            namespaces: vec!["team-0".into()],
            field_selector: "metadata.name=x9".into(),
            ..query("configmaps")
        },
        1,
    )
    .await;
    let mut c = h.client().await;
    let e = c
        .watch(WatchRequest {
            query: Some(query("configmaps")),
            since_revision: 1,
            send_initial_events: false,
            bookmark_interval: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);
    assert!(e.message().contains("list again"), "{}", e.message());
    // A program reads where the log starts from the status's details, not its text.
    let info = error_info(&e);
    assert_eq!(info.reason, "REVISION_COMPACTED");
    let oldest: u64 = info.metadata["oldest_revision"].parse().unwrap();
    assert!(oldest > 1, "{oldest}");
    assert!(e.message().contains(&oldest.to_string()), "{}", e.message());
    h.shutdown().await;
}

#[tokio::test]
async fn deletes_missed_while_a_watch_was_expired_reach_subscribers() {
    let h = Harness::start(1, 200).await;
    h.synced().await;
    let mut c = h.client().await;
    let q = Query {
        namespaces: vec!["team-0".into()],
        ..query("configmaps")
    };
    let mut stream = watch_query(&mut c, q).await;
    let cluster = h.cluster(0);
    let victims: Vec<String> = cluster
        .store
        .snapshot("configmaps", fleetscope_sim::store::ReadAt::Latest)
        .unwrap()
        .objects
        .values()
        .filter(|o| o.namespace == "team-0")
        .map(|o| o.name.clone())
        .take(2)
        .collect();
    assert_eq!(victims.len(), 2);
    while_history_expires(cluster, || {
        for v in &victims {
            cluster.store.delete("configmaps", "team-0", v).unwrap();
        }
    });
    let mut deleted = BTreeSet::new();
    while deleted.len() < 2 {
        let e = next_change(&mut stream).await;
        assert_eq!(e.r#type(), EventType::Deleted);
        deleted.insert(e.object.unwrap().name);
    }
    assert_eq!(deleted, victims.into_iter().collect());
    h.shutdown().await;
}

#[tokio::test]
async fn a_relist_larger_than_the_subscriber_buffer_reaches_a_live_subscriber_whole() {
    let h = start_with_small_subscriber_buffers().await;
    h.synced().await;
    let mut c = h.client().await;
    let q = Query {
        namespaces: vec!["team-0".into()],
        ..query("configmaps")
    };
    let mut stream = watch_query(&mut c, q).await;
    // Sixty objects created while the watch is cut and history expires: the re-list
    // applies them as one batch, far larger than the subscriber's buffer of 16.
    let cluster = h.cluster(0);
    let created: BTreeSet<String> = (0..60).map(|i| format!("bulk-{i:02}")).collect();
    while_history_expires(cluster, || {
        for name in &created {
            cluster
                .store
                .create(
                    "configmaps",
                    Some("team-0"),
                    json!({"metadata": {"name": name}, "data": {"k": "v"}}),
                )
                .unwrap();
        }
    });
    let mut added = BTreeSet::new();
    while added.len() < created.len() {
        let e = next_change(&mut stream).await;
        assert_eq!(e.r#type(), EventType::Added);
        added.insert(e.object.unwrap().name);
    }
    assert_eq!(added, created);
    h.shutdown().await;
}

#[tokio::test]
async fn a_cluster_going_offline_is_stale_then_catches_up() {
    let h = Harness::start(2, 200).await;
    h.synced().await;
    let mut c = h.client().await;
    let server = &h.fleet.servers()[1];
    server.go_offline().await;
    let clusters = h
        .wait_clusters(|cs| {
            cs.iter()
                .any(|c| c.name == "sim-2" && c.freshness() == proto::Freshness::Stale)
        })
        .await;
    assert!(
        clusters
            .iter()
            .any(|c| c.name == "sim-1" && c.freshness() == proto::Freshness::Synced),
        "the other cluster is unaffected"
    );
    let list = c
        .list(ListRequest {
            query: Some(query("configmaps")),
            limit: 5000,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(list.partial, "an answer drawing on a stale cluster says so");
    assert!(
        list.items.iter().any(|o| o.cluster == "sim-2"),
        "its objects stay, marked stale"
    );
    let stale = list.clusters.iter().find(|f| f.cluster == "sim-2").unwrap();
    assert_eq!(stale.freshness(), proto::Freshness::Stale);
    assert!(stale.stale_since.is_some());

    server
        .cluster()
        .store
        .create(
            "configmaps",
            Some("team-0"),
            json!({"metadata": {"name": "while-away"}}),
        )
        .unwrap();
    server.come_online().await.unwrap();
    h.synced().await;
    h.wait_count(
        Query {
            clusters: vec!["sim-2".into()],
            field_selector: "metadata.name=while-away".into(),
            ..query("configmaps")
        },
        1,
    )
    .await;
    h.shutdown().await;
}

#[tokio::test]
async fn forbidden_type_is_status_while_others_sync() {
    let spec = FleetSpec::numbered(1, 200, 0.0);
    let h = Harness::start_with(
        spec,
        test_config(&["pods", "configmaps"]),
        common::service_config(),
    )
    .await;
    let cluster = h.cluster(0);
    cluster.set_denied(&cluster.admin_token(), "pods", true);
    let clusters = h
        .wait_clusters(|cs| {
            cs[0]
                .streams
                .iter()
                .any(|s| s.resource == "pods" && s.state() == proto::StreamState::Forbidden)
                && cs[0].streams.iter().any(|s| {
                    s.resource == "configmaps" && s.state() == proto::StreamState::Watching
                })
        })
        .await;
    let pods = clusters[0]
        .streams
        .iter()
        .find(|s| s.resource == "pods")
        .unwrap();
    assert!(pods.last_error.contains("forbidden"), "{}", pods.last_error);
    cluster.set_denied(&cluster.admin_token(), "pods", false);
    h.synced().await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_slow_subscriber_is_ended_without_slowing_a_fast_one() {
    let h = start_with_small_subscriber_buffers().await;
    h.synced().await;
    let mut c = h.client().await;
    let mut fast = watch_all(&mut c, "configmaps").await;
    let mut slow = watch_all(&mut c, "configmaps").await;
    let payload = "x".repeat(64 * 1024);
    // Produce in chunks smaller than the buffer, each once the fast subscriber has the last:
    // the fast one is never more than a chunk behind; the one that never reads falls behind.
    let (chunks, chunk) = (25, 8);
    for k in 0..chunks {
        for j in 0..chunk {
            let i = k * chunk + j;
            h.cluster(0).store.create("configmaps", Some("team-0"), json!({"metadata": {"name": format!("burst-{i:03}")}, "data": {"blob": payload}})).unwrap();
        }
        for j in 0..chunk {
            let e = next_change(&mut fast).await;
            assert_eq!(
                e.object.unwrap().name,
                format!("burst-{:03}", k * chunk + j)
            );
        }
    }
    // The slow one, read only now, finds its stream ended with a resumable error.
    let mut last = 0;
    let outcome = tokio::time::timeout(PATIENCE, async {
        loop {
            match slow.next().await {
                Some(Ok(e)) => last = e.revision.max(last),
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .unwrap();
    let status = outcome.expect("ended with an error");
    assert_eq!(status.code(), Code::ResourceExhausted);
    // Where to resume, for a program: the last revision the stream delivered.
    let info = error_info(&status);
    assert_eq!(info.domain, "fleetscope.io");
    assert!(
        ["WATCH_BEHIND", "WATCH_STALLED"].contains(&info.reason.as_str()),
        "{info:?}"
    );
    assert_eq!(info.metadata["resume_from"], last.to_string(), "{info:?}");
    {
        use tonic_types::StatusExt as _;
        assert!(status.get_details_retry_info().is_some());
    }
    assert!(
        status.message().contains("since_revision="),
        "{}",
        status.message()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn list_clusters_and_resource_types_report_every_stream() {
    let h = Harness::start(2, 200).await;
    h.synced().await;
    let mut c = h.client().await;
    let clusters = c
        .list_clusters(proto::ListClustersRequest {
            clusters: vec!["sim-2".into()],
        })
        .await
        .unwrap()
        .into_inner()
        .clusters;
    assert_eq!(clusters.len(), 1);
    let sim2 = &clusters[0];
    assert!(sim2.server.starts_with("https://127.0.0.1:"));
    assert!(sim2.kubernetes_version.starts_with("v1."));
    let pods = sim2.streams.iter().find(|s| s.resource == "pods").unwrap();
    assert_eq!(pods.object_count as usize, h.cluster(1).store.count("pods"));
    assert!(!pods.resource_version.is_empty());
    let types = c
        .list_resource_types(proto::ListResourceTypesRequest {})
        .await
        .unwrap()
        .into_inner()
        .resource_types;
    let names: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["configmaps", "deployments.apps", "pods"]);
    let deploy = types.iter().find(|t| t.name == "deployments.apps").unwrap();
    assert_eq!(
        (
            deploy.kind.as_str(),
            deploy.group.as_str(),
            deploy.clusters.len()
        ),
        ("Deployment", "apps", 2)
    );
    h.shutdown().await;
}

/// A configured name the cluster does not serve is a NOT_FOUND stream row saying why,
/// and the cluster, synced for what it serves, says it too rather than reading clean.
#[tokio::test]
async fn a_configured_type_no_cluster_serves_is_said_not_silent() {
    let h = Harness::start_with(
        FleetSpec::numbered(1, 20, 0.0),
        test_config(&["configmaps", "widgets.example.com"]),
        common::service_config(),
    )
    .await;
    h.synced().await;
    let mut c = h.client().await;
    let cluster = c
        .list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .clusters
        .remove(0);
    assert_eq!(cluster.freshness(), proto::Freshness::Synced);
    assert!(
        cluster
            .last_error
            .contains("configured but not collected: widgets.example.com (the cluster serves no such resource type)"),
        "{cluster:#?}"
    );
    let row = cluster
        .streams
        .iter()
        .find(|s| s.resource == "widgets.example.com")
        .unwrap();
    assert_eq!(row.state(), proto::StreamState::NotFound);
    assert!(
        row.last_error.contains("serves no such resource type"),
        "{row:?}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn bookmarks_carry_the_current_revision() {
    let h = Harness::start_with(
        FleetSpec::numbered(1, 100, 0.0),
        test_config(&["configmaps"]),
        ServiceConfig {
            bookmark_interval: Duration::from_millis(50),
            ..common::service_config()
        },
    )
    .await;
    h.synced().await;
    let mut c = h.client().await;
    let mut stream = watch_all(&mut c, "configmaps").await;
    let revision = h.engine.index_for_tests().snapshot().revision().0;
    let b = loop {
        let e = next_event(&mut stream).await;
        if e.r#type() == EventType::Bookmark {
            break e;
        }
    };
    assert!(b.revision >= revision);
    h.shutdown().await;
}

#[tokio::test]
async fn custom_resources_that_appear_later_are_collected_and_dropped_when_gone() {
    let h = Harness::start_with(
        FleetSpec::numbered(1, 100, 0.0),
        test_config(&["*"]),
        common::service_config(),
    )
    .await;
    h.synced().await;
    let mut c = h.client().await;
    let before = c
        .list_resource_types(proto::ListResourceTypesRequest {})
        .await
        .unwrap()
        .into_inner()
        .resource_types;
    assert!(
        before
            .iter()
            .any(|t| t.name == "crontabs.stable.example.com"),
        "`*` takes custom types"
    );
    assert!(
        !before.iter().any(|t| t.name == "secrets"),
        "`*` leaves Secrets out"
    );

    let store = &h.cluster(0).store;
    common::add_widgets(h.cluster(0), &["w"]);
    common::eventually("the new type collected", async || {
        let r = c
            .count(CountRequest {
                query: Some(query("widgets")),
                group_by: vec![],
            })
            .await;
        if r.as_ref().is_ok_and(|r| r.get_ref().total == 1) {
            Ok(())
        } else {
            Err(r)
        }
    })
    .await;
    store.remove_resource("widgets.example.com");
    // Once no cluster serves it, the type is unknown again: NOT_FOUND, and not listed.
    common::eventually("the vanished type no longer answered", async || {
        let r = c
            .count(fleetscope::proto::CountRequest {
                query: Some(query("widgets.example.com")),
                group_by: vec![],
            })
            .await;
        if r.as_ref().is_err_and(|e| e.code() == tonic::Code::NotFound) {
            Ok(())
        } else {
            Err(r)
        }
    })
    .await;
    let listed = c
        .list_resource_types(fleetscope::proto::ListResourceTypesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .resource_types
            .iter()
            .all(|t| !t.name.contains("widgets")),
        "{listed:?}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn an_in_cluster_source_outside_a_cluster_is_reported_not_fatal() {
    let engine = fleetscope::engine::Engine::start(
        vec![fleetscope::sources::ClusterSource::in_cluster("home")],
        test_config(&["pods"]),
    );
    let status = common::eventually("a status for the in-cluster source", async || {
        let s = engine.status_for_tests().cluster(&"home".into()).unwrap();
        s.error.is_some().then_some(s)
    })
    .await;
    assert!(status.error.unwrap().contains("in-cluster"));
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn scopes_narrow_a_type_to_a_namespace_and_selectors_server_side() {
    let mut config = test_config(&["pods", "configmaps"]);
    config.scopes = vec![
        fleetscope::engine::Scope::parse(
            "pods:namespace=team-1;labels=app=web;fields=status.phase=Running",
        )
        .unwrap(),
    ];
    let h = Harness::start_with(
        FleetSpec::numbered(1, 800, 0.0),
        config,
        common::service_config(),
    )
    .await;
    h.synced().await;
    let snapshot = h
        .cluster(0)
        .store
        .snapshot("pods", fleetscope_sim::store::ReadAt::Latest)
        .unwrap();
    let expected = snapshot
        .objects
        .values()
        .filter(|o| {
            o.namespace == "team-1"
                && o.labels.iter().any(|(k, v)| k == "app" && v == "web")
                && o.fields
                    .iter()
                    .any(|(k, v)| k == "status.phase" && v == "Running")
        })
        .count();
    assert!(expected > 0);
    h.wait_count(query("pods"), expected as u64).await;
    let all_configmaps = h.cluster(0).store.count("configmaps");
    h.wait_count(query("configmaps"), all_configmaps as u64)
        .await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_object_nested_two_hundred_levels_deep_is_matched_and_projected_correctly() {
    let h = Harness::start(1, 20).await;
    h.synced().await;
    let mut inner = json!({"leaf": "bottom"});
    for _ in 0..200 {
        inner = json!({"a": inner});
    }
    let store = &h.cluster(0).store;
    let created = store
        .create(
            "configmaps",
            Some("team-0"),
            json!({"metadata": {"name": "deep"}, "data": {"nested": inner.to_string()}, "spec": inner}),
        )
        .unwrap();
    let uid = created.uid.clone();
    let mut c = h.client().await;
    let list = |selector: String, projection: proto::Projection| {
        let mut c = c.clone();
        async move {
            c.list(ListRequest {
                query: Some(Query {
                    field_selector: selector,
                    projection: projection as i32,
                    ..query("configmaps")
                }),
                limit: 1000,
                page_token: String::new(),
                keep_snapshot: false,
            })
            .await
            .unwrap()
            .into_inner()
            .items
        }
    };
    let found = common::eventually("the uid matches", async || {
        let found = list(format!("metadata.uid={uid}"), proto::Projection::Full).await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "deep");
    // `!=` does not match it, and a path at the bottom of the nesting is read.
    let others = list(format!("metadata.uid!={uid}"), proto::Projection::Full).await;
    assert!(others.iter().all(|o| o.name != "deep"));
    assert!(!others.is_empty());
    let bottom = format!("spec.{}leaf=bottom", "a.".repeat(200));
    let found = list(bottom, proto::Projection::Full).await;
    assert_eq!(
        found.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(),
        ["deep"]
    );
    // The metadata projection carries the metadata alone.
    let meta = list(format!("metadata.uid={uid}"), proto::Projection::Metadata).await;
    let v: serde_json::Value = serde_json::from_str(&meta[0].json).unwrap();
    assert_eq!(v["metadata"]["uid"], uid.as_str());
    assert_eq!(v["kind"], "ConfigMap");
    assert!(v.get("spec").is_none() && v.get("data").is_none(), "{v}");
    // Counting by a deep field reads it too.
    let counts = c
        .count(CountRequest {
            query: Some(query("configmaps")),
            group_by: vec![format!("field:spec.{}leaf", "a.".repeat(200))],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        counts
            .groups
            .iter()
            .any(|g| g.key == ["bottom"] && g.count == 1),
        "{:?}",
        counts.groups
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_selector_picks_clusters_by_their_labels_and_bad_ones_are_refused() {
    use common::process::Server;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(3, 30).await;
    let log = dir.path().join("serve.log");
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--cluster-label",
            "sim-1:env=prod,region=eu",
            "--cluster-label",
            "sim-2:env=prod,region=us",
            "--cluster-label",
            "sim-3:env=dev",
        ],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let mut c = fleetscope::proto::fleet_client::FleetClient::connect(server.url())
        .await
        .unwrap();
    common::wait_for_clusters(&mut c, "synced", |r| {
        r.clusters.len() == 3
            && r.clusters
                .iter()
                .all(|c| c.freshness == proto::Freshness::Synced as i32)
    })
    .await;
    let clusters_of = |selector: &str| {
        let mut c = c.clone();
        let selector = selector.to_string();
        async move {
            let r = c
                .count(proto::CountRequest {
                    query: Some(proto::Query {
                        resource: "configmaps".into(),
                        cluster_selector: selector,
                        ..Default::default()
                    }),
                    group_by: vec!["cluster".into()],
                })
                .await?
                .into_inner();
            Ok::<_, tonic::Status>(
                r.groups
                    .into_iter()
                    .map(|g| g.key[0].clone())
                    .collect::<Vec<_>>(),
            )
        }
    };
    assert_eq!(clusters_of("env=prod").await.unwrap(), ["sim-1", "sim-2"]);
    assert_eq!(clusters_of("env=prod,region!=us").await.unwrap(), ["sim-1"]);
    assert_eq!(clusters_of("env in (dev)").await.unwrap(), ["sim-3"]);
    assert_eq!(clusters_of("!region").await.unwrap(), ["sim-3"]);
    assert!(clusters_of("env=staging").await.unwrap().is_empty());
    let e = clusters_of("env in (prod").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().starts_with("query.cluster_selector"),
        "{}",
        e.message()
    );
    let many: Vec<String> = (0..300).map(|i| format!("r{i}")).collect();
    let e = clusters_of(&format!("region in ({})", many.join(",")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("256"), "{}", e.message());
    // A bracketed index is no field path, as the API server says too.
    let e = c
        .count(proto::CountRequest {
            query: Some(proto::Query {
                resource: "configmaps".into(),
                field_selector: "spec.containers[0].name=x".into(),
                ..Default::default()
            }),
            group_by: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("spec.containers.0.name"),
        "{}",
        e.message()
    );
    drop(server);
    fleet.shutdown().await;
}

/// The `google.rpc.ErrorInfo` a status carries.
fn error_info(status: &tonic::Status) -> tonic_types::ErrorInfo {
    use tonic_types::StatusExt as _;
    status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"))
}
