//! A first sync as gentle as an API server allows: simulated clusters → the real engine
//! and server → a real gRPC client. No list reads storage; a server without streaming
//! lists is listed from its watch cache instead, and each stream says which it got;
//! discovery is off the critical path (built-in types start at once, a kept discovery
//! answer starts the rest).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{Harness, PATIENCE, test_config};
use fleetscope::proto::{self, CountRequest, Query, StreamState, SyncMethod};
use fleetscope_sim::{FleetSpec, ListKind, Verb, WatchListSupport};
use serde_json::json;

const TYPES: [&str; 3] = ["pods", "configmaps", "deployments.apps"];

/// How many objects of a type the clusters hold now.
fn truth(h: &Harness, id: &str) -> u64 {
    common::truth(&h.fleet, id).len() as u64
}

/// Waits until the index holds what the clusters hold of `resource`.
async fn holds_all(h: &Harness, resource: &str, id: &str) {
    let mut c = h.client().await;
    common::eventually(format!("the index holds every {resource}"), async || {
        let want = truth(h, id);
        let got = c
            .count(CountRequest {
                query: Some(Query {
                    resource: resource.into(),
                    ..Default::default()
                }),
                group_by: vec![],
            })
            .await
            .map(|r| r.into_inner().total);
        if got.as_ref().is_ok_and(|&n| n == want && n > 0) {
            Ok(())
        } else {
            Err(format!("the index holds {got:?}, the clusters {want}"))
        }
    })
    .await;
}

#[tokio::test]
async fn a_first_sync_reads_no_list_from_storage_and_each_stream_says_how_it_synced() {
    let mut h = Harness::start_with(
        FleetSpec::numbered(3, 40, 0.0),
        test_config(&TYPES),
        common::service_config(),
    )
    .await;
    h.stop_node().await;
    // sim-2 refuses streaming lists, as an API server without the WatchList feature;
    // sim-3's watch cache trails its storage.
    h.cluster(1).set_watch_list(WatchListSupport::Refused);
    h.cluster(2).set_cache_lag(5);
    for s in h.fleet.servers() {
        s.cluster().reset_counters();
    }
    h.start_node(test_config(&TYPES), common::service_config(), None, &[])
        .await;
    h.synced().await;
    for (resource, id) in [
        ("pods", "pods"),
        ("configmaps", "configmaps"),
        ("deployments.apps", "deployments.apps"),
    ] {
        holds_all(&h, resource, id).await;
    }
    let clusters = h
        .wait_clusters(|cs| {
            cs.iter().all(|c| {
                c.streams.len() == TYPES.len()
                    && c.streams.iter().all(|s| {
                        s.state() == StreamState::Watching
                            && s.sync_method() != SyncMethod::Unspecified
                    })
            })
        })
        .await;
    for c in &clusters {
        for s in &c.streams {
            if c.name == "sim-2" {
                assert_eq!(s.sync_method(), SyncMethod::ListFromCache, "{s:?}");
                assert!(
                    s.watch_list_fallback.contains("WatchList feature gate"),
                    "{s:?}"
                );
            } else {
                assert_eq!(s.sync_method(), SyncMethod::WatchList, "{c:?}");
                assert_eq!(s.watch_list_fallback, "", "{s:?}");
            }
        }
    }
    for (i, s) in h.fleet.servers().iter().enumerate() {
        let c = s.cluster();
        assert_eq!(
            c.lists_of(ListKind::Quorum),
            0,
            "cluster {i}: no list from storage"
        );
        let (lists, streamed) = if i == 1 { (3, 0) } else { (0, 3) };
        assert_eq!(c.lists_of(ListKind::Cache), lists, "cluster {i}");
        assert_eq!(c.requests_of(Verb::List), lists, "cluster {i}");
        assert_eq!(c.lists_of(ListKind::Streaming), streamed, "cluster {i}");
    }
    // The simulator's metrics page says the same.
    let text = h.cluster(1).metrics_text();
    assert!(
        text.contains("sim_list_requests_total{kind=\"cache\",resource=\"pods\"} 1"),
        "{text}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn built_in_types_sync_while_discovery_fails() {
    let mut h = Harness::start_with(
        FleetSpec::numbered(2, 30, 0.0),
        test_config(&TYPES),
        common::service_config(),
    )
    .await;
    h.stop_node().await;
    for s in h.fleet.servers() {
        s.cluster().fail_discovery(true);
        s.cluster().reset_counters();
    }
    h.start_node(test_config(&TYPES), common::service_config(), None, &[])
        .await;
    for (resource, id) in [
        ("pods", "pods"),
        ("configmaps", "configmaps"),
        ("deployments.apps", "deployments.apps"),
    ] {
        holds_all(&h, resource, id).await;
    }
    // Discovery was asked and failed; the streams did not wait for it.
    for s in h.fleet.servers() {
        assert!(s.cluster().requests_of(Verb::Discovery) > 0);
    }
    h.wait_clusters(|cs| {
        cs.iter().all(|c| {
            c.last_error.contains("discovery")
                && c.streams.len() == TYPES.len()
                && c.streams.iter().all(|s| s.state() == StreamState::Watching)
        })
    })
    .await;
    // Discovery answers again: the cluster is whole, its streams undisturbed.
    let streamed: u64 = h
        .fleet
        .servers()
        .iter()
        .map(|s| s.cluster().lists_of(ListKind::Streaming))
        .sum();
    for s in h.fleet.servers() {
        s.cluster().fail_discovery(false);
    }
    h.synced().await;
    let after: u64 = h
        .fleet
        .servers()
        .iter()
        .map(|s| s.cluster().lists_of(ListKind::Streaming) + s.cluster().requests_of(Verb::List))
        .sum();
    assert_eq!(
        after, streamed,
        "discovery confirmed the streams: no list again"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_kept_discovery_answer_starts_a_custom_type_while_discovery_fails() {
    let data = tempfile::tempdir().unwrap();
    let mut h = Harness::start_persistent(
        FleetSpec::numbered(1, 20, 0.0),
        test_config(&["pods"]),
        data.path(),
    )
    .await;
    common::add_widgets(h.cluster(0), &["w"]);
    // Discovery is asked again every 500 ms: wait for an answer that has widgets (it
    // is kept in the store as it arrives).
    let cluster = fleetscope_model::ClusterName::from("sim-1");
    common::eventually("widgets discovered", async || {
        h.engine
            .status_for_tests()
            .cluster(&cluster)
            .is_some_and(|c| c.served.iter().any(|s| s.resource.plural == "widgets"))
    })
    .await;
    h.stop_node().await;
    h.cluster(0).fail_discovery(true);
    h.start_node(
        test_config(&["pods", "widgets"]),
        common::service_config(),
        Some(data.path()),
        &[],
    )
    .await;
    holds_all(&h, "widgets.example.com", "widgets.example.com").await;
    holds_all(&h, "pods", "pods").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_custom_type_named_by_group_version_and_resource_syncs_while_discovery_fails() {
    let mut h = Harness::start_with(
        FleetSpec::numbered(1, 20, 0.0),
        test_config(&["pods"]),
        common::service_config(),
    )
    .await;
    h.stop_node().await;
    common::add_widgets(h.cluster(0), &["w1", "w2"]);
    // A full discovery fails at its root; one group version's document is served.
    h.cluster(0).fail_discovery(true);
    h.start_node(
        test_config(&["pods", "example.com/v1/widgets"]),
        common::service_config(),
        None,
        &[],
    )
    .await;
    holds_all(&h, "widgets.example.com", "widgets.example.com").await;
    holds_all(&h, "pods", "pods").await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_aggregated_api_that_is_down_keeps_its_types_and_the_cluster_synced() {
    let h = Harness::start_with(
        FleetSpec::numbered(1, 40, 0.0),
        test_config(&TYPES),
        common::service_config(),
    )
    .await;
    h.synced().await;
    holds_all(&h, "deployments.apps", "deployments.apps").await;
    // apps/v1's discovery document fails, as an aggregated API's does when its server
    // is down; discovery runs every 500 ms: let it run several rounds.
    let c = h.cluster(0);
    c.fail_group_version("apps/v1", true);
    let before = c.requests_of(Verb::Discovery);
    common::eventually("thirty more discoveries", async || {
        c.requests_of(Verb::Discovery) >= before + 30
    })
    .await;
    let clusters = h
        .wait_clusters(|cs| cs.iter().all(|c| c.streams.len() == TYPES.len()))
        .await;
    assert_eq!(
        clusters[0].freshness(),
        proto::Freshness::Synced,
        "{:?}",
        clusters[0]
    );
    holds_all(&h, "deployments.apps", "deployments.apps").await;
    // Its stream goes on: a change made now is collected.
    c.store
        .create(
            "deployments.apps",
            Some("team-0"),
            json!({"metadata": {"name": "made-while-down"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
        )
        .unwrap();
    holds_all(&h, "deployments.apps", "deployments.apps").await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_resumes_across_a_sigkill_while_only_the_kept_discovery_answer_knows_its_type()
{
    use common::process::Server;
    use common::subscriber::Subscriber;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 20).await;
    let sim = fleet.servers()[0].cluster().clone();
    common::add_widgets(&sim, &["w1", "w2", "w3"]);
    let data = dir.path().join("data");
    // `wd` is the short name only discovery gives: neither the built-in types nor the
    // stored stream (its type, without names) resolve it.
    let args = ["--resources", "wd", "--data-dir", data.to_str().unwrap()];
    let log = dir.path().join("serve.log");
    let widgets = || common::truth(&fleet, "widgets.example.com");
    let mut server = Server::start(&kubeconfig, &args, &log);
    let mut sub = Subscriber {
        initial: true,
        resource: Some("widgets.example.com".into()),
        ..Default::default()
    };
    let mut stream = sub.watch(&server.url()).await.unwrap();
    // Objects are visible once durable, and the discovery answer that named their type
    // was kept no later than they were.
    sub.converge(&mut stream, &widgets()).await;

    // Killed; discovery fails from now on; widgets change while it is down.
    server.kill();
    sub.drain(&mut stream).await;
    sim.fail_discovery(true);
    sim.store
        .create(
            "widgets.example.com",
            Some("team-0"),
            json!({"metadata": {"name": "made-while-down"}}),
        )
        .unwrap();
    sim.store
        .delete("widgets.example.com", "team-0", "w1")
        .unwrap();
    let server = Server::start(&kubeconfig, &args, &log);
    let mut stream = sub.watch(&server.url()).await.unwrap();
    sub.converge(&mut stream, &widgets()).await;
    assert!(sub.state.keys().any(|(_, _, n)| n == "made-while-down"));
    let w1 = ("sim-1".to_string(), "team-0".to_string(), "w1".to_string());
    assert_eq!(sub.deleted.get(&w1), Some(&1));
    assert!(
        sim.requests_of(Verb::Discovery) > 0,
        "discovery was asked, and failed"
    );
    drop(server);
    fleet.shutdown().await;
}

/// A cluster removed at run time takes its kept discovery answer with it: the store
/// holds answers for the clusters in the fleet only, not until the next start.
#[tokio::test]
async fn a_cluster_removed_at_run_time_leaves_no_discovery_answer_in_the_store() {
    use fleetscope::engine::{Engine, SourceSet, Stored};
    let fleet = fleetscope_sim::SimFleet::start(&FleetSpec::numbered(2, 10, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let sources = fleetscope::sources::resolve(&[kubeconfig], &[]).unwrap();
    let data = dir.path().join("data");
    let opened = fleetscope_store::SledStore::open(&data).unwrap();
    let (desired, rx) = tokio::sync::watch::channel(SourceSet::of(sources.clone()));
    let engine = Engine::start_live(
        rx,
        test_config(&["pods"]),
        Some(Stored {
            store: std::sync::Arc::new(opened.store),
            loaded: opened.loaded,
        }),
    );
    let discovered = |name: &str| {
        engine
            .status_for_tests()
            .cluster(&fleetscope_model::ClusterName::from(name))
            .is_some_and(|c| !c.served.is_empty())
    };
    common::eventually("both discovered", async || {
        discovered("sim-1") && discovered("sim-2")
    })
    .await;
    desired.send_replace(SourceSet::of(
        sources.into_iter().filter(|s| s.name == "sim-1").collect(),
    ));
    let gone = fleetscope_model::ClusterName::from("sim-2");
    common::eventually("sim-2 left", async || {
        engine.status_for_tests().cluster(&gone).is_none()
    })
    .await;
    engine.shutdown(Duration::from_secs(10)).await;
    drop(engine);
    // What the store holds, read as it is on disk (not through a start, which drops
    // the answers of clusters no longer configured).
    let kept: Vec<String> = fleetscope_store::SledStore::open(&data)
        .unwrap()
        .loaded
        .discovery
        .iter()
        .map(|d| d.cluster.to_string())
        .collect();
    assert_eq!(kept, ["sim-1"]);
}

/// Streams that wait on discovery (`*`, nothing kept) have it ask for several group
/// versions at once; the types it finds then sync.
#[tokio::test]
async fn discovery_that_streams_wait_on_asks_for_several_group_versions_at_once() {
    use fleetscope::engine::Engine;
    let fleet = fleetscope_sim::SimFleet::start(&FleetSpec::numbered(1, 10, 0.0))
        .await
        .unwrap();
    let cluster = fleet.servers()[0].cluster().clone();
    // Held documents are answered only once released: a discovery asking for one at a
    // time would never have two in flight.
    cluster.hold_group_versions(true);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let engine = Engine::start(
        fleetscope::sources::resolve(&[kubeconfig], &[]).unwrap(),
        test_config(&["*"]),
    );
    common::eventually("two group versions asked for at once", async || {
        cluster.group_versions_in_flight() >= 2
    })
    .await;
    cluster.hold_group_versions(false);
    let name = fleetscope_model::ClusterName::from("sim-1");
    common::eventually("every type synced", async || {
        engine.status_for_tests().cluster(&name).is_some_and(|c| {
            c.freshness(None).0 == fleetscope::status::Freshness::Synced
                && c.streams.keys().any(|r| r == "deployments.apps")
        })
    })
    .await;
    engine.shutdown(Duration::from_secs(10)).await;
}

/// A SIGKILL between the parts of a first list: what was durable of it is kept without
/// a resume point, so the next start lists again and replaces what it holds. A
/// subscriber resuming from its last revision hears of each change once: the objects
/// it had, never again; one deleted while `serve` was down, as DELETED; the rest, as
/// ADDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_between_the_parts_of_a_first_list_loses_and_repeats_nothing() {
    use common::process::Server;
    use common::subscriber::Subscriber;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 10).await;
    let sim = fleet.servers()[0].cluster().clone();
    sim.store
        .create("namespaces", None, json!({"metadata": {"name": "many"}}))
        .unwrap();
    for i in 0..20_000 {
        sim.store
            .create(
                "configmaps",
                Some("many"),
                json!({"metadata": {"name": format!("cm-{i:05}")}, "data": {"i": i.to_string()}}),
            )
            .unwrap();
    }
    let truth = || common::truth(&fleet, "configmaps");
    let total = truth().len();
    let log = dir.path().join("serve.log");
    // Kill as soon as the subscriber holds part of the list; a list that completed
    // first (a fast machine) is tried again in a new data directory.
    for attempt in 0..5 {
        let data = dir.path().join(format!("data-{attempt}"));
        let args = [
            "--resources",
            "configmaps",
            "--list-part",
            "1",
            "--data-dir",
            data.to_str().unwrap(),
            // A debug-build subscriber reading a whole list's events is not to be
            // ended for slowness.
            "--subscriber-buffer",
            "1000000",
        ];
        let mut server = Server::start(&kubeconfig, &args, &log);
        let mut sub = Subscriber {
            initial: true,
            ..Default::default()
        };
        let mut stream = sub.watch(&server.url()).await.unwrap();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while sub.state.is_empty() {
            match tokio::time::timeout_at(deadline, stream.message()).await {
                Ok(Ok(Some(e))) => sub.apply(&e),
                other => panic!("no object in time: {other:?}"),
            }
        }
        server.kill();
        sub.drain(&mut stream).await;
        if sub.state.len() == total || sub.last.is_none() {
            // The list ended before the kill, or the subscriber has no position.
            continue;
        }
        // While it is down: one object it holds is deleted, one is created.
        let (_, _, held) = sub.state.keys().next().unwrap().clone();
        sim.store.delete("configmaps", "many", &held).unwrap();
        sim.store
            .create(
                "configmaps",
                Some("many"),
                json!({"metadata": {"name": "made-while-down"}}),
            )
            .unwrap();
        let before = sub.state.clone();
        let added_before = sub.events;
        let server = Server::start(&kubeconfig, &args, &log);
        let mut stream = sub.watch(&server.url()).await.unwrap();
        sub.converge(&mut stream, &truth()).await;
        let gone = ("sim-1".to_string(), "many".to_string(), held);
        assert_eq!(sub.deleted.get(&gone), Some(&1));
        assert_eq!(sub.deleted.len(), 1, "nothing else was deleted");
        // Each object it did not have came once; the ones it had, never again.
        assert_eq!(
            sub.events - added_before,
            1 + (truth().len() - (before.len() - 1)),
            "{} objects held before the kill, {} now",
            before.len(),
            truth().len()
        );
        drop(server);
        fleet.shutdown().await;
        return;
    }
    panic!("the kill never landed between the parts of the first list");
}

/// A cluster whose API server accepts and never answers its discovery does not hold
/// readiness back beyond the engine's patience: the server reports SERVING, the other
/// cluster is served, and the hung one reads as syncing until it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cluster_does_not_hold_readiness_back() {
    let mut h = Harness::start_with(
        FleetSpec::numbered(2, 40, 0.0),
        test_config(&["configmaps"]),
        common::service_config(),
    )
    .await;
    h.stop_node().await;
    // sim-2's discovery documents are held: started again, it never finishes
    // discovering.
    h.cluster(1).hold_group_versions(true);
    let mut config = test_config(&["configmaps"]);
    config.ready_patience = Duration::from_millis(500);
    h.start_node(config, common::service_config(), None, &[])
        .await;
    common::wait_serving(&h.url()).await;
    let clusters = common::list_clusters(&mut h.client().await).await.clusters;
    let hung = clusters.iter().find(|c| c.name == "sim-2").unwrap();
    assert_ne!(hung.freshness(), proto::Freshness::Synced, "{hung:?}");
    assert!(h.cluster(1).group_versions_in_flight() > 0, "{hung:?}");
    h.cluster(1).hold_group_versions(false);
    h.synced().await;
    h.shutdown().await;
}
