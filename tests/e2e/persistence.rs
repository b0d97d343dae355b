//! Restarts over a sled store: simulated clusters → the real engine and server with a
//! data directory → a real gRPC client, stopped and started again over the same store.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;

use common::{Harness, PATIENCE, test_config};
use fleetscope::proto::{
    self, EventType, ListClustersRequest, ListRequest, Query, WatchEvent, WatchRequest,
};
use fleetscope_sim::store::ReadAt;
use fleetscope_sim::{FleetSpec, ListKind, Verb};
use futures::StreamExt;
use serde_json::json;
use tonic::Streaming;

const TYPES: [&str; 3] = ["pods", "configmaps", "deployments.apps"];

fn config() -> fleetscope::engine::EngineConfig {
    let mut c = test_config(&TYPES);
    c.restore_confirm = std::time::Duration::from_millis(300);
    // Small test fleets: let the persisted log hold every event of the test, and
    // write snapshots often, so restarts load a snapshot and replay the changes after it.
    c.persist.log_share = 100.0;
    c.persist.snapshot_share = 0.05;
    c.persist.snapshot_min_bytes = 0;
    c
}

fn query(resource: &str) -> Query {
    Query {
        resource: resource.into(),
        ..Default::default()
    }
}

/// Every object of a type, over gRPC, in pages of 500, and the newest page revision.
async fn listed(h: &Harness, resource: &str) -> (Vec<proto::Object>, u64) {
    let mut c = h.client().await;
    let mut out = Vec::new();
    let mut token = String::new();
    let mut revision = 0;
    loop {
        let page = c
            .list(ListRequest {
                query: Some(query(resource)),
                limit: 500,
                page_token: token,
                keep_snapshot: false,
            })
            .await
            .unwrap()
            .into_inner();
        revision = revision.max(page.revision);
        out.extend(page.items);
        if page.next_page_token.is_empty() {
            return (out, revision);
        }
        token = page.next_page_token;
    }
}

/// (cluster, namespace, name, resourceVersion) of every object of a type, over gRPC.
async fn served(h: &Harness, resource: &str) -> (BTreeSet<(String, String, String, String)>, u64) {
    let (objects, revision) = listed(h, resource).await;
    let keys = objects
        .into_iter()
        .map(|o| (o.cluster, o.namespace, o.name, o.resource_version))
        .collect();
    (keys, revision)
}

/// The same, as the simulated clusters hold it now.
fn truth(h: &Harness, resource: &str) -> BTreeSet<(String, String, String, String)> {
    common::truth(&h.fleet, resource)
        .into_iter()
        .map(|((cluster, namespace, name), rv)| (cluster, namespace, name, rv))
        .collect()
}

/// Waits until the index equals the clusters for every type.
async fn converged(h: &Harness) {
    for t in TYPES {
        common::eventually(format!("{t}: the index matches the clusters"), async || {
            served(h, t).await.0 == truth(h, t)
        })
        .await;
    }
}

/// Lists made, of any kind: LISTs and streaming lists (watches with initial events).
fn lists(h: &Harness) -> u64 {
    h.fleet
        .servers()
        .iter()
        .map(|s| s.cluster().requests_of(Verb::List) + s.cluster().lists_of(ListKind::Streaming))
        .sum()
}

async fn next_change(stream: &mut Streaming<WatchEvent>) -> WatchEvent {
    loop {
        let e = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("an event in time")
            .expect("stream open")
            .expect("no error");
        if !matches!(e.r#type(), EventType::Bookmark | EventType::ClusterStatus) {
            return e;
        }
    }
}

async fn watch_from(h: &Harness, resource: &str, since: u64) -> Streaming<WatchEvent> {
    h.client()
        .await
        .watch(WatchRequest {
            query: Some(query(resource)),
            since_revision: since,
            send_initial_events: false,
            bookmark_interval: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

fn freshness(clusters: &[proto::Cluster]) -> Vec<proto::Freshness> {
    clusters.iter().map(|c| c.freshness()).collect()
}

#[tokio::test]
async fn a_restart_serves_at_once_and_resumes_every_watch_without_listing() {
    let data = tempfile::tempdir().unwrap();
    let mut h =
        Harness::start_persistent(FleetSpec::numbered(2, 150, 0.0), config(), data.path()).await;
    h.synced().await;
    let before: Vec<_> = futures::future::join_all(TYPES.map(|t| served(&h, t))).await;
    h.stop_node().await;
    // Stopping had sled record where its pages are (a `snap.` file naming how far
    // into its log it reaches), so the next start reads that rather than the log.
    let recorded = fleetscope_store::SledStore::layout_recorded_through(data.path());
    assert!(recorded > Some(0), "recorded through {recorded:?}");
    let stored = fleetscope_store::SledStore::open(data.path())
        .unwrap()
        .loaded;
    assert!(stored.snapshot.is_some(), "a snapshot was written");
    drop(stored);
    for s in h.fleet.servers() {
        s.cluster().reset_counters();
    }

    h.start_node(config(), common::service_config(), Some(data.path()), &[])
        .await;
    // Served at once, from the store: the same objects, before any watch has caught up.
    for (t, (objects, revision)) in TYPES.iter().zip(&before) {
        let (now, now_revision) = served(&h, t).await;
        assert_eq!(&now, objects, "{t}");
        assert!(now_revision >= *revision, "revisions continue");
    }
    let first = h
        .client()
        .await
        .list_clusters(ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .clusters;
    assert!(
        freshness(&first)
            .iter()
            .all(|f| matches!(f, proto::Freshness::Restored | proto::Freshness::Synced)),
        "{first:#?}"
    );
    // Then every stream confirms its resumed watch, and none listed.
    h.synced().await;
    assert_eq!(
        lists(&h),
        0,
        "a restart with valid resourceVersions lists nothing"
    );
    let watches: u64 = h
        .fleet
        .servers()
        .iter()
        .map(|s| s.cluster().requests_of(Verb::Watch))
        .sum();
    assert!(watches >= 6, "every stream resumed its watch ({watches})");
    converged(&h).await;
    h.shutdown().await;
}

/// Stopping is never taken for a cluster leaving the fleet: over repeated clean
/// restarts of four clusters (each engine stop drops every cluster's source as it
/// cancels), every restart keeps every cluster's objects and resumes without a LIST.
#[tokio::test]
async fn repeated_clean_restarts_keep_every_cluster_and_never_list() {
    let data = tempfile::tempdir().unwrap();
    let mut h =
        Harness::start_persistent(FleetSpec::numbered(4, 20, 0.0), config(), data.path()).await;
    h.synced().await;
    let before: Vec<_> = futures::future::join_all(TYPES.map(|t| served(&h, t))).await;
    for round in 0..8 {
        h.stop_node().await;
        for s in h.fleet.servers() {
            s.cluster().reset_counters();
        }
        h.start_node(config(), common::service_config(), Some(data.path()), &[])
            .await;
        for (t, (objects, _)) in TYPES.iter().zip(&before) {
            assert_eq!(&served(&h, t).await.0, objects, "round {round}: {t}");
        }
        h.synced().await;
        assert_eq!(lists(&h), 0, "round {round}: a clean restart listed");
    }
    h.shutdown().await;
}

/// Changes made while fleetscope is down: two creates, one update, two deletes.
fn change_while_down(h: &Harness) -> Vec<(EventType, String)> {
    let store = &h.cluster(0).store;
    let existing: Vec<String> = store
        .snapshot("configmaps", ReadAt::Latest)
        .unwrap()
        .objects
        .values()
        .filter(|o| o.namespace == "team-0")
        .map(|o| o.name.clone())
        .take(3)
        .collect();
    assert_eq!(existing.len(), 3);
    let mut expected = Vec::new();
    for name in ["while-down-1", "while-down-2"] {
        store
            .create(
                "configmaps",
                Some("team-0"),
                json!({"metadata": {"name": name}, "data": {"k": "v"}}),
            )
            .unwrap();
        expected.push((EventType::Added, name.to_string()));
    }
    let mut changed = store
        .get("configmaps", "team-0", &existing[0])
        .unwrap()
        .value();
    changed["data"] = json!({"changed": "yes"});
    changed["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    store
        .update("configmaps", "team-0", &existing[0], changed)
        .unwrap();
    expected.push((EventType::Modified, existing[0].clone()));
    for name in &existing[1..] {
        store.delete("configmaps", "team-0", name).unwrap();
        expected.push((EventType::Deleted, name.clone()));
    }
    expected
}

async fn missed_changes_reach_a_resumed_watch(expire_history: bool) {
    let data = tempfile::tempdir().unwrap();
    let mut h =
        Harness::start_persistent(FleetSpec::numbered(1, 150, 0.0), config(), data.path()).await;
    h.synced().await;
    let (_, revision) = served(&h, "configmaps").await;
    h.stop_node().await;
    let expected = change_while_down(&h);
    if expire_history {
        h.cluster(0).compact();
    }
    for s in h.fleet.servers() {
        s.cluster().reset_counters();
    }
    h.start_node(config(), common::service_config(), Some(data.path()), &[])
        .await;
    // A watch from before the restart resumes after it.
    let mut stream = watch_from(&h, "configmaps", revision).await;
    converged(&h).await;
    let mut got = Vec::new();
    let mut last = revision;
    while got.len() < expected.len() {
        let e = next_change(&mut stream).await;
        assert!(e.revision > last, "in revision order");
        last = e.revision;
        got.push((e.r#type(), e.object.unwrap().name));
    }
    // A re-list applies its diff in key order; a resumed watch in the cluster's order.
    let mut sorted_got = got.clone();
    let mut sorted_expected = expected.clone();
    sorted_got.sort_by(|a, b| a.1.cmp(&b.1));
    sorted_expected.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(sorted_got, sorted_expected);
    if !expire_history {
        assert_eq!(
            got, expected,
            "a resumed watch replays in the cluster's order"
        );
    }
    let configmap_lists = h.cluster(0).requests(Verb::List, "configmaps")
        + h.cluster(0).lists(ListKind::Streaming, "configmaps");
    if expire_history {
        assert!(
            configmap_lists >= 1,
            "an expired resourceVersion leads to a re-list"
        );
    } else {
        assert_eq!(lists(&h), 0);
    }
    h.shutdown().await;
}

#[tokio::test]
async fn changes_made_while_down_reach_a_watch_resumed_from_before_the_restart() {
    missed_changes_reach_a_resumed_watch(false).await;
}

#[tokio::test]
async fn after_history_expired_the_relist_diff_reaches_a_resumed_watch() {
    missed_changes_reach_a_resumed_watch(true).await;
}

#[tokio::test]
async fn clusters_gone_from_the_configuration_are_deleted_at_start_unless_kept() {
    let data = tempfile::tempdir().unwrap();
    let mut h =
        Harness::start_persistent(FleetSpec::numbered(2, 100, 0.0), config(), data.path()).await;
    h.synced().await;
    let (all, revision) = served(&h, "configmaps").await;
    let of_sim_2 = all.iter().filter(|o| o.0 == "sim-2").count();
    assert!(of_sim_2 > 0);
    h.stop_node().await;

    // First kept: the objects stay, the cluster is reported as no longer configured.
    let mut keep = config();
    keep.keep_removed_clusters = true;
    h.start_node(
        keep,
        common::service_config(),
        Some(data.path()),
        &["sim-1"],
    )
    .await;
    assert_eq!(served(&h, "configmaps").await.0, all);
    let clusters = h
        .wait_clusters(|cs| cs.iter().any(|c| c.name == "sim-2"))
        .await;
    let gone = clusters.iter().find(|c| c.name == "sim-2").unwrap();
    assert_eq!(gone.freshness(), proto::Freshness::Stale);
    h.stop_node().await;

    // Then removed: subscribers resuming from before see every object as DELETED.
    h.start_node(
        config(),
        common::service_config(),
        Some(data.path()),
        &["sim-1"],
    )
    .await;
    let mut stream = watch_from(&h, "configmaps", revision).await;
    let mut deleted = 0;
    while deleted < of_sim_2 {
        let e = next_change(&mut stream).await;
        assert_eq!(e.r#type(), EventType::Deleted);
        assert_eq!(e.object.unwrap().cluster, "sim-2");
        deleted += 1;
    }
    let (now, _) = served(&h, "configmaps").await;
    assert!(now.iter().all(|o| o.0 == "sim-1"));
    assert_eq!(now.len(), all.len() - of_sim_2);
    h.stop_node().await;

    // And it stays removed across another restart.
    h.start_node(
        config(),
        common::service_config(),
        Some(data.path()),
        &["sim-1"],
    )
    .await;
    assert!(
        served(&h, "configmaps")
            .await
            .0
            .iter()
            .all(|o| o.0 == "sim-1")
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_store_that_cannot_write_shows_nothing_unwritten_and_catches_up() {
    use fleetscope_store::Store;
    let h = Harness::start(1, 100).await;
    let store = std::sync::Arc::new(fleetscope_store::MemoryStore::new());
    store.initialise().unwrap();
    // A full disk: every write fails.
    store.fail_writes(true);
    let sources = fleetscope::sources::resolve(std::slice::from_ref(&h.kubeconfig), &[]).unwrap();
    let engine = fleetscope::engine::Engine::start_with_store(
        sources,
        config(),
        store.clone(),
        fleetscope_store::Loaded::default(),
    );
    let held = |e: &fleetscope::engine::Engine| e.index_for_tests().snapshot().len();
    // The cluster's objects are gathered while the store refuses every write, and none
    // of them is visible: nothing is served before it is durable.
    let error = common::eventually(
        "the store refuses writes with objects pending",
        async || {
            let stats = engine.store_stats().unwrap();
            match &stats.last_error {
                Some(error) if stats.pending > 0 => Ok(error.clone()),
                _ => Err(stats),
            }
        },
    )
    .await;
    assert!(error.contains("No space left"), "{error}");
    assert_eq!(store.load().unwrap().objects.len(), 0);
    assert_eq!(held(&engine), 0, "nothing unwritten is visible");
    let empty = engine.index_for_tests().snapshot().revision();
    assert!(
        engine.persister().unwrap().recorded() > empty,
        "changes are staged beyond what is published"
    );
    // Space again: what gathered is written, then visible, and the store holds what
    // the index holds.
    store.fail_writes(false);
    common::eventually("what gathered is written", async || {
        let stats = engine.store_stats().unwrap();
        if stats.last_error.is_none() && stats.pending == 0 && held(&engine) > 0 {
            Ok(())
        } else {
            Err(stats)
        }
    })
    .await;
    assert!(engine.index_for_tests().snapshot().revision() > empty);
    engine.shutdown(std::time::Duration::from_secs(10)).await;
    let loaded = store.load().unwrap();
    assert_eq!(loaded.objects.len(), held(&engine));
    assert_eq!(
        loaded.revision,
        engine.index_for_tests().snapshot().revision()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_store_compacted_under_churn_restarts_whole_without_listing() {
    let data = tempfile::tempdir().unwrap();
    let mut cfg = config();
    // Compact whenever the file has grown by half since the last compaction.
    cfg.persist.compact_share = 0.0;
    cfg.persist.compact_min_bytes = 0;
    let mut h =
        Harness::start_persistent(FleetSpec::numbered(2, 100, 0.0), cfg.clone(), data.path()).await;
    h.synced().await;
    // Churn: configmaps created, changed and deleted until the store has compacted
    // at least twice.
    let store = &h.cluster(0).store;
    let mut round = 0;
    common::eventually("two compactions", async || {
        let stats = h.engine.store_stats();
        if stats.as_ref().unwrap().compactions >= 2 {
            return Ok(());
        }
        let name = format!("churn-{round}");
        let big = "x".repeat(4096);
        store
            .create(
                "configmaps",
                Some("team-0"),
                json!({"metadata": {"name": name}, "data": {"k": big}}),
            )
            .unwrap();
        if round >= 5 {
            store
                .delete("configmaps", "team-0", &format!("churn-{}", round - 5))
                .unwrap();
        }
        round += 1;
        if round % 20 == 0 {
            // Let the writer catch up between bursts.
            converged(&h).await;
        }
        Err(stats)
    })
    .await;
    converged(&h).await;
    // The store reports its compactions and size over the API.
    let store = h
        .client()
        .await
        .get_store(proto::GetStoreRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(store.persisted && store.compactions >= 2, "{store:?}");
    assert!(
        store.size_on_disk_bytes > 0 && store.flushes > 0,
        "{store:?}"
    );
    assert!(
        store.last_error.is_empty() && store.last_flush.is_some(),
        "{store:?}"
    );
    let before: Vec<_> = futures::future::join_all(TYPES.map(|t| served(&h, t))).await;
    h.stop_node().await;
    assert!(!data.path().join("db.next").exists() && !data.path().join("db.old").exists());
    for s in h.fleet.servers() {
        s.cluster().reset_counters();
    }
    h.start_node(cfg, common::service_config(), Some(data.path()), &[])
        .await;
    for (t, (objects, _)) in TYPES.iter().zip(&before) {
        assert_eq!(&served(&h, t).await.0, objects, "{t}");
    }
    h.synced().await;
    assert_eq!(lists(&h), 0, "the compacted store resumes every watch");
    converged(&h).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_stream_configured_to_select_differently_lists_again_and_drops_what_it_no_longer_selects()
{
    let data = tempfile::tempdir().unwrap();
    let mut h =
        Harness::start_persistent(FleetSpec::numbered(1, 150, 0.0), config(), data.path()).await;
    h.synced().await;
    let (_, revision) = served(&h, "configmaps").await;
    let outside = truth(&h, "configmaps")
        .into_iter()
        .filter(|(_, ns, _, _)| ns != "team-0")
        .count();
    assert!(outside > 0);
    h.stop_node().await;
    for s in h.fleet.servers() {
        s.cluster().reset_counters();
    }

    // The same types, configmaps now narrowed to one namespace.
    let mut narrowed = config();
    narrowed.scopes =
        vec![fleetscope::engine::Scope::parse("configmaps:namespace=team-0").unwrap()];
    h.start_node(narrowed, common::service_config(), Some(data.path()), &[])
        .await;
    // The narrowed stream lists (pods and deployments resume their watches); what
    // it no longer selects reaches a resumed Watch as DELETEDs.
    let mut stream = watch_from(&h, "configmaps", revision).await;
    let mut deleted = 0;
    while deleted < outside {
        let e = next_change(&mut stream).await;
        let kind = e.r#type();
        let object = e.object.unwrap();
        assert_eq!(kind, EventType::Deleted, "{}", object.name);
        assert_ne!(object.namespace, "team-0");
        deleted += 1;
    }
    h.synced().await;
    let want: BTreeSet<_> = truth(&h, "configmaps")
        .into_iter()
        .filter(|(_, ns, _, _)| ns == "team-0")
        .collect();
    assert_eq!(served(&h, "configmaps").await.0, want);
    assert_eq!(lists(&h), 1, "only the narrowed stream lists");
    h.shutdown().await;
}

/// The JSON of every object of a type, as served over gRPC, by (cluster, namespace, name).
async fn served_json(
    h: &Harness,
    resource: &str,
) -> std::collections::BTreeMap<(String, String, String), String> {
    let (objects, _) = listed(h, resource).await;
    objects
        .into_iter()
        .map(|o| ((o.cluster, o.namespace, o.name), o.json.to_string()))
        .collect()
}

/// Starts the node again on the store in `data` with `config`, and waits until it
/// has synced.
async fn restart_synced(
    h: &mut Harness,
    config: fleetscope::engine::EngineConfig,
    data: &std::path::Path,
) {
    h.start_node(config, common::service_config(), Some(data), &[])
        .await;
    h.synced().await;
}

/// Checks that the node serves exactly `expected` of each of [`TYPES`].
async fn serves(
    h: &Harness,
    expected: &[std::collections::BTreeMap<(String, String, String), String>],
) {
    for (t, objects) in TYPES.iter().zip(expected) {
        assert_eq!(&served_json(h, t).await, objects, "{t}");
    }
}

/// How many of the objects the node's index holds are held compressed, of how many.
fn held_compressed(h: &Harness) -> (usize, usize) {
    let held = h.engine.index_for_tests().snapshot();
    let compressed = held.iter().filter(|o| o.json_compressed()).count();
    (compressed, held.iter().count())
}

/// Objects held compressed (`--compress-objects`, each once settled) are served
/// exactly as held plainly:
/// restored from a store written plainly, changed live (each Watch event and `Get`
/// the changed text), and written back compressed, so that a restart holds them
/// compressed at once and a plain restart serves them unchanged.
#[tokio::test]
async fn objects_held_compressed_are_served_exactly_and_stored_compressed() {
    let compressed = || {
        let mut c = config();
        c.index.compress_objects = true;
        // A snapshot after every change: the store ends with one of this server's.
        c.persist.snapshot_share = 0.0;
        c
    };
    let as_text = || {
        let mut c = config();
        c.index.compress_objects = false;
        c
    };
    let data = tempfile::tempdir().unwrap();
    let mut h =
        Harness::start_persistent(FleetSpec::numbered(1, 150, 0.0), as_text(), data.path()).await;
    h.synced().await;
    let plain: Vec<_> = futures::future::join_all(TYPES.map(|t| served_json(&h, t))).await;
    assert!(plain.iter().all(|objects| !objects.is_empty()));
    h.stop_node().await;

    // Restored compressed from the store: every object's text as it was.
    restart_synced(&mut h, compressed(), data.path()).await;
    // Every state settled at once, as the packer would take them after their time.
    let index = h.engine.index_for_tests();
    let now = index.snapshot().revision();
    while !index.pack_settled(now, 1024) {}
    let (compressed_held, held) = held_compressed(&h);
    assert!(
        compressed_held * 10 >= held * 9,
        "nearly every object held compressed: {compressed_held} of {held}"
    );
    serves(&h, &plain).await;
    // Changed while held compressed: a Watch is sent each change's text, as Get is.
    let (_, revision) = served(&h, "configmaps").await;
    let mut stream = watch_from(&h, "configmaps", revision).await;
    let expected = change_while_down(&h);
    let mut c = h.client().await;
    for (kind, name) in &expected {
        let e = next_change(&mut stream).await;
        assert_eq!(
            (e.r#type(), &e.object.as_ref().unwrap().name),
            (*kind, name)
        );
        let sent = e.object.unwrap();
        let held = h
            .cluster(0)
            .store
            .get("configmaps", "team-0", name)
            .map(|o| o.value());
        let text: serde_json::Value = serde_json::from_str(&sent.json).unwrap();
        match kind {
            EventType::Deleted => assert!(held.is_none(), "{name}"),
            _ => {
                let held = held.unwrap();
                assert_eq!(text["data"], held["data"], "{name}");
                assert_eq!(
                    text["metadata"]["resourceVersion"],
                    held["metadata"]["resourceVersion"]
                );
            }
        }
        if *kind == EventType::Modified {
            let got = c
                .get(proto::GetRequest {
                    cluster: sent.cluster.clone(),
                    resource: "configmaps".into(),
                    namespace: sent.namespace.clone(),
                    name: sent.name.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(got.object.unwrap().json, sent.json);
        }
    }
    let changed: Vec<_> = futures::future::join_all(TYPES.map(|t| served_json(&h, t))).await;
    h.stop_node().await;

    // Its snapshot holds the objects compressed: a restart holds them so before any
    // has settled, and serves them as they were.
    restart_synced(&mut h, compressed(), data.path()).await;
    let (compressed_held, held) = held_compressed(&h);
    assert!(
        compressed_held * 10 >= held * 8,
        "most objects restored compressed: {compressed_held} of {held}"
    );
    serves(&h, &changed).await;
    h.stop_node().await;

    // A plain restart reads them back as text and serves every object as the
    // compressed server last did.
    restart_synced(&mut h, as_text(), data.path()).await;
    serves(&h, &changed).await;
    h.shutdown().await;
}
