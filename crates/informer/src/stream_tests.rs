//! Informers against a simulated cluster over HTTPS: list, watch, reconnect, re-list,
//! resume without a list, and access errors as state.

use std::sync::Arc;
use std::time::Duration;

use crate::discovery;
use crate::source::{self, ClusterSource};
use crate::stream::{self, StreamConfig, StreamId, StreamState, SyncMethod, Update};
use fleetscope_model::ClusterName;
use fleetscope_sim::{Cluster, ClusterConfig, ListKind, SimServer, Verb, WatchListSupport};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(60);

struct Setup {
    server: SimServer,
    source: ClusterSource,
    /// The streams' [`StreamConfig::resumed_quiet`].
    resumed_quiet: Duration,
    /// How often a stream has told its resumed watch accepted and quiet.
    resumed: Arc<std::sync::atomic::AtomicUsize>,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let cluster = Cluster::new(ClusterConfig::new("inf"));
    cluster
        .store
        .create("namespaces", None, json!({"metadata": {"name": "a"}}))
        .unwrap();
    for i in 0..7 {
        cluster.store.create("configmaps", Some("a"), json!({"metadata": {"name": format!("cm-{i}"), "managedFields": [{"manager": "x"}]}})).unwrap();
    }
    let server = SimServer::start_local(cluster).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kc");
    let ctx = fleetscope_sim::Context {
        name: "inf".into(),
        server: server.url(),
        token: server.cluster().admin_token(),
        ca_pem: server.ca_pem().map(str::to_string),
    };
    fleetscope_sim::write_kubeconfig(&path, &[ctx]).unwrap();
    let source = source::resolve(&[path], &[]).unwrap().remove(0);
    Setup {
        server,
        source,
        resumed_quiet: StreamConfig::default().resumed_quiet,
        resumed: Arc::default(),
        _dir: dir,
    }
}

/// Starts a stream that lists (no streaming lists), watching from `resume` if given.
async fn start(
    s: &Setup,
    resource: &str,
    resume: Option<String>,
) -> (mpsc::Receiver<Update>, CancellationToken, Arc<StreamId>) {
    let start = stream::Start {
        watch_from: resume,
        floor: None,
    };
    start_after(s, resource, start, false, || {}).await
}

/// Resolves the type, runs `before` (to inject faults the informer alone should meet), then starts.
async fn start_after(
    s: &Setup,
    resource: &str,
    start: stream::Start,
    watch_list: bool,
    before: impl FnOnce(),
) -> (mpsc::Receiver<Update>, CancellationToken, Arc<StreamId>) {
    start_in_parts(s, resource, start, watch_list, 0, before).await
}

/// As `start_after`, a first list handed over in parts of `list_part` objects.
async fn start_in_parts(
    s: &Setup,
    resource: &str,
    start: stream::Start,
    watch_list: bool,
    list_part: usize,
    before: impl FnOnce(),
) -> (mpsc::Receiver<Update>, CancellationToken, Arc<StreamId>) {
    let client = source::connect(&s.source, Duration::from_secs(30), None)
        .await
        .unwrap()
        .client;
    let served = discovery::discover(&client).await.unwrap();
    let rt = discovery::resolve(&[resource.into()], &served)
        .resources
        .remove(0);
    before();
    let id = Arc::new(StreamId::new(ClusterName::from("inf"), rt));
    let (tx, rx) = mpsc::channel(1024);
    let cancel = CancellationToken::new();
    let config = StreamConfig {
        page_size: 3,
        backoff_start: Duration::from_millis(50),
        forbidden_retry: Duration::from_millis(200),
        watch_list,
        list_part,
        resumed_quiet: s.resumed_quiet,
        ..StreamConfig::default()
    };
    tokio::spawn(stream::run(
        client,
        id.clone(),
        Arc::new(crate::outage::Outage::new(ClusterName::from("inf"))),
        config,
        start,
        tx,
        stream::Steering {
            cancel: cancel.clone(),
            rewatch: None,
            resumed: Some(Arc::new({
                let resumed = s.resumed.clone();
                move || {
                    resumed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })),
        },
    ));
    (rx, cancel, id)
}

/// Waits for a condition the server reports (a readiness signal), within the patience bound.
async fn wait_until(cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached in time"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn next(rx: &mut mpsc::Receiver<Update>) -> Update {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("an update in time")
        .expect("stream alive")
}

/// The next update that is not a state change.
async fn next_data(rx: &mut mpsc::Receiver<Update>) -> Update {
    loop {
        match next(rx).await {
            Update::State { .. } => continue,
            other => return other,
        }
    }
}

/// Creates a configmap in namespace `a` and waits for the stream to hand it over.
async fn create_and_see(c: &Cluster, rx: &mut mpsc::Receiver<Update>, name: &str) {
    c.store
        .create("configmaps", Some("a"), json!({"metadata": {"name": name}}))
        .unwrap();
    assert!(matches!(next_data(rx).await, Update::Applied { object, .. } if object.name == name));
}

async fn wait_state(rx: &mut mpsc::Receiver<Update>, want: StreamState) -> Option<String> {
    loop {
        if let Update::State { state, error, .. } = next(rx).await
            && state == want
        {
            return error;
        }
    }
}

#[tokio::test]
async fn a_first_list_reads_the_watch_cache_then_watches_live_changes() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    let (mut rx, cancel, _) = start(&s, "configmaps", None).await;
    let Update::Listed {
        objects,
        resource_version,
        method,
        ..
    } = next_data(&mut rx).await
    else {
        panic!("first a list")
    };
    assert_eq!(objects.len(), 7);
    assert_eq!(resource_version, c.store.resource_version().to_string());
    assert_eq!(method, Some(SyncMethod::ListFromCache));
    assert_eq!(
        (c.lists_of(ListKind::Cache), c.lists_of(ListKind::Quorum)),
        (1, 0),
        "one unpaged read from the cache, nothing from storage"
    );
    let v: serde_json::Value = serde_json::from_str(&objects[0].json).unwrap();
    assert_eq!(
        (v["kind"].as_str(), v["apiVersion"].as_str()),
        (Some("ConfigMap"), Some("v1"))
    );
    assert!(v["metadata"].get("managedFields").is_none(), "pruned");
    wait_state(&mut rx, StreamState::Watching).await;
    let store = &s.server.cluster().store;
    store
        .create(
            "configmaps",
            Some("a"),
            json!({"metadata": {"name": "new"}}),
        )
        .unwrap();
    store.delete("configmaps", "a", "cm-0").unwrap();
    assert!(
        matches!(next_data(&mut rx).await, Update::Applied { object, .. } if object.name == "new")
    );
    assert!(
        matches!(next_data(&mut rx).await, Update::Deleted { object, .. } if object.name == "cm-0")
    );
    cancel.cancel();
}

#[tokio::test]
async fn dropped_watches_resume_without_a_list_and_410_relists() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    let (mut rx, cancel, _) = start(&s, "configmaps", None).await;
    assert!(matches!(next_data(&mut rx).await, Update::Listed { .. }));
    wait_state(&mut rx, StreamState::Watching).await;
    let lists = c.requests(Verb::List, "configmaps");
    let watches = c.requests(Verb::Watch, "configmaps");
    c.drop_watches();
    wait_until(|| c.requests(Verb::Watch, "configmaps") > watches).await;
    create_and_see(&c, &mut rx, "during-drop").await;
    assert_eq!(
        c.requests(Verb::List, "configmaps"),
        lists,
        "reconnected from the last resourceVersion, no LIST"
    );

    // History gone while the watch is down: 410 on reconnect, then a fresh list, a
    // consistent one from storage, in pages of 3.
    c.store.delete("configmaps", "a", "cm-1").unwrap();
    c.compact();
    c.reset_counters();
    c.expire_watches();
    let Update::Listed {
        objects, method, ..
    } = next_data(&mut rx).await
    else {
        panic!("a re-list")
    };
    assert!(
        !objects.iter().any(|o| o.name == "cm-1"),
        "the re-list no longer has the deleted object"
    );
    assert_eq!(method, Some(SyncMethod::ListConsistent));
    assert_eq!(
        (c.lists_of(ListKind::Cache), c.lists_of(ListKind::Quorum)),
        (0, 3),
        "after a 410, a consistent read in pages"
    );
    cancel.cancel();
}

#[tokio::test]
async fn a_streaming_list_holds_the_state_and_its_watch_goes_on() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    c.reset_counters();
    let (mut rx, cancel, _) =
        start_after(&s, "configmaps", stream::Start::default(), true, || {}).await;
    let Update::Listed {
        objects,
        resource_version,
        method,
        fallback,
        ..
    } = next_data(&mut rx).await
    else {
        panic!("first the state")
    };
    assert_eq!(objects.len(), 7);
    assert_eq!(resource_version, c.store.resource_version().to_string());
    assert_eq!((method, fallback), (Some(SyncMethod::WatchList), None));
    wait_state(&mut rx, StreamState::Watching).await;
    create_and_see(&c, &mut rx, "live").await;
    assert_eq!(c.requests_of(Verb::List), 0, "no LIST at all");
    assert_eq!(c.lists(ListKind::Streaming, "configmaps"), 1);
    assert_eq!(
        c.requests(Verb::Watch, "configmaps"),
        1,
        "the streaming list's watch carried the live change"
    );
    cancel.cancel();
}

#[tokio::test]
async fn a_server_that_refuses_or_ignores_streaming_lists_is_listed_instead() {
    // Refused; unknown (a server from before WatchList); ignored, found out by a
    // change before any end bookmark; ignored, found out by silence (a plain watch of a
    // quiet type sends nothing).
    for (support, change) in [
        (WatchListSupport::Refused, false),
        (WatchListSupport::Unknown, false),
        (WatchListSupport::Ignored, true),
        (WatchListSupport::Ignored, false),
    ] {
        let s = setup().await;
        let c = s.server.cluster().clone();
        c.set_watch_list(support);
        let config = StreamConfig {
            backoff_start: Duration::from_millis(50),
            // Long enough never to cut the change case short.
            watch_list_silence: if change {
                Duration::from_secs(60)
            } else {
                Duration::from_millis(300)
            },
            ..StreamConfig::default()
        };
        let (mut rx, cancel) = start_with(&s, "configmaps", config).await;
        // A server that ignores the request sends the objects as a plain watch does,
        // then whatever comes: here modifications, which no streaming list has before
        // its end bookmark (made until the stream has listed, so one reaches the watch
        // whenever it registers).
        let patching = CancellationToken::new();
        if change {
            let (c, patching) = (c.clone(), patching.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    c.store
                        .patch(
                            "configmaps",
                            "a",
                            "cm-2",
                            &json!({"metadata": {"labels": {"x": i.to_string()}}}),
                        )
                        .unwrap();
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                        _ = patching.cancelled() => return,
                    }
                }
            });
        }
        let Update::Listed {
            objects,
            method,
            fallback,
            ..
        } = next_data(&mut rx).await
        else {
            panic!("the state")
        };
        patching.cancel();
        assert_eq!(objects.len(), 7, "{support:?}");
        assert_eq!(method, Some(SyncMethod::ListFromCache), "{support:?}");
        let why = fallback.unwrap_or_default();
        let expected = match (support, change) {
            (WatchListSupport::Refused, _) => "WatchList feature gate",
            (WatchListSupport::Unknown, _) => "resourceVersionMatch is forbidden for watch",
            (_, true) => "a MODIFIED event before the initial events ended",
            _ => "sent nothing for",
        };
        assert!(why.contains(expected), "{support:?}: {why}");
        c.store
            .create(
                "configmaps",
                Some("a"),
                json!({"metadata": {"name": "live"}}),
            )
            .unwrap();
        // Modifications made before the patching stopped may come first.
        loop {
            if let Update::Applied { object, .. } = next_data(&mut rx).await
                && object.name == "live"
            {
                break;
            }
        }
        assert_eq!(c.lists_of(ListKind::Cache), 1, "{support:?}");
        assert_eq!(c.lists_of(ListKind::Quorum), 0, "{support:?}");
        cancel.cancel();
    }
}

#[tokio::test]
async fn a_list_after_a_changed_selection_is_never_older_than_what_is_held() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    // Held: the state after cm-0 and cm-1 were deleted. The cache trails by 2.
    c.store.delete("configmaps", "a", "cm-0").unwrap();
    c.store.delete("configmaps", "a", "cm-1").unwrap();
    let held = c.store.resource_version();
    c.set_cache_lag(2);
    for watch_list in [false, true] {
        c.reset_counters();
        let start = stream::Start {
            watch_from: None,
            floor: Some(held.to_string()),
        };
        let (mut rx, cancel, _) = start_after(&s, "configmaps", start, watch_list, || {}).await;
        let Update::Listed {
            objects,
            resource_version,
            ..
        } = next_data(&mut rx).await
        else {
            panic!("a list")
        };
        assert!(
            resource_version.parse::<u64>().unwrap() >= held,
            "listed at {resource_version}, held {held}"
        );
        assert!(
            !objects.iter().any(|o| o.name == "cm-0" || o.name == "cm-1"),
            "nothing deleted before what is held comes back"
        );
        assert_eq!(c.lists_of(ListKind::Quorum), 0, "served from the cache");
        cancel.cancel();
    }
    // With nothing held, the cache's older state is fine: the watch from it brings the rest.
    c.reset_counters();
    let (mut rx, cancel, _) = start(&s, "configmaps", None).await;
    let Update::Listed {
        objects,
        resource_version,
        ..
    } = next_data(&mut rx).await
    else {
        panic!("a list")
    };
    assert_eq!(resource_version, (held - 2).to_string());
    assert_eq!(objects.len(), 7, "the cache's state, before the deletes");
    for _ in 0..2 {
        assert!(matches!(next_data(&mut rx).await, Update::Deleted { .. }));
    }
    cancel.cancel();
}

#[tokio::test]
async fn resumes_from_a_saved_resource_version_without_listing() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    let from = c.store.resource_version().to_string();
    c.store
        .create(
            "configmaps",
            Some("a"),
            json!({"metadata": {"name": "after"}}),
        )
        .unwrap();
    c.reset_counters();
    let (mut rx, cancel, _) = start(&s, "configmaps", Some(from)).await;
    assert!(
        matches!(next_data(&mut rx).await, Update::Applied { object, .. } if object.name == "after")
    );
    assert_eq!(c.requests(Verb::List, "configmaps"), 0);
    cancel.cancel();
}

#[tokio::test]
async fn a_quiet_resumed_watch_counts_as_resumed_and_one_whose_version_is_gone_lists() {
    let mut s = setup().await;
    let c = s.server.cluster().clone();
    let resumed = || s.resumed.load(std::sync::atomic::Ordering::SeqCst);
    // Nothing changed since the stored resourceVersion: once the cluster accepts the
    // watch and it stays quiet, the stream tells it resumed, without a LIST.
    let from = c.store.resource_version().to_string();
    c.reset_counters();
    let (mut rx, cancel, _) = start(&s, "configmaps", Some(from)).await;
    wait_until(|| resumed() == 1).await;
    assert_eq!(c.requests(Verb::List, "configmaps"), 0);
    // Changes after it are followed as ever, and it is told once.
    create_and_see(&c, &mut rx, "later").await;
    assert_eq!(resumed(), 1);
    cancel.cancel();

    // The stored resourceVersion compacted away: the 410 and a list, never told
    // resumed (the quiet longer than the test's patience, so that a slow machine
    // cannot make it pass first).
    s.resumed_quiet = PATIENCE * 2;
    let gone = c.store.resource_version().to_string();
    c.store
        .create("configmaps", Some("a"), json!({"metadata": {"name": "x"}}))
        .unwrap();
    c.store.delete("configmaps", "a", "x").unwrap();
    c.compact();
    let (mut rx, cancel, _) = start(&s, "configmaps", Some(gone)).await;
    match next_data(&mut rx).await {
        Update::Listed { reason, .. } => assert_eq!(reason, stream::ListReason::Expired),
        other => panic!("a list after the 410, got {other:?}"),
    }
    assert_eq!(resumed(), 1);
    cancel.cancel();
}

#[tokio::test]
async fn forbidden_types_become_state_and_recover() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    c.set_denied(&c.admin_token(), "configmaps", true);
    let (mut rx, cancel, _) = start(&s, "configmaps", None).await;
    let why = wait_state(&mut rx, StreamState::Forbidden).await.unwrap();
    assert!(why.contains("forbidden"), "{why}");
    c.set_denied(&c.admin_token(), "configmaps", false);
    assert!(
        matches!(next_data(&mut rx).await, Update::Listed { .. }),
        "retries and recovers"
    );
    cancel.cancel();
}

#[tokio::test]
async fn stalled_and_failing_servers_are_retried() {
    // A 429 is the informer's to back off from and report, as a 500 is: the client
    // does not retry it unseen.
    for code in [500, 429] {
        let s = setup().await;
        let c = s.server.cluster().clone();
        let (mut rx, cancel, _) =
            start_after(&s, "configmaps", stream::Start::default(), false, || {
                c.fail_requests(code, fleetscope_sim::FailFor::Requests(2))
            })
            .await;
        wait_state(&mut rx, StreamState::Failed).await;
        let failed = std::time::Instant::now();
        assert!(
            matches!(next_data(&mut rx).await, Update::Listed { .. }),
            "{code}: backs off, then lists"
        );
        if code == 429 {
            // The simulator asks for a second (retryAfterSeconds, as an API server
            // does); the 50 ms backoff does not cut it short.
            assert!(
                failed.elapsed() >= Duration::from_millis(950),
                "{:?}",
                failed.elapsed()
            );
        }
        cancel.cancel();
    }
}

async fn start_with(
    s: &Setup,
    resource: &str,
    config: StreamConfig,
) -> (mpsc::Receiver<Update>, CancellationToken) {
    let client = source::connect(&s.source, Duration::from_secs(30), None)
        .await
        .unwrap()
        .client;
    let served = discovery::discover(&client).await.unwrap();
    let rt = discovery::resolve(&[resource.into()], &served)
        .resources
        .remove(0);
    let id = Arc::new(StreamId::new(ClusterName::from("inf"), rt));
    let (tx, rx) = mpsc::channel(1024);
    let cancel = CancellationToken::new();
    let outage = Arc::new(crate::outage::Outage::new(ClusterName::from("inf")));
    tokio::spawn(stream::run(
        client,
        id,
        outage,
        config,
        stream::Start::default(),
        tx,
        stream::Steering {
            cancel: cancel.clone(),
            rewatch: None,
            resumed: None,
        },
    ));
    (rx, cancel)
}

#[tokio::test]
async fn a_silent_watch_is_detected_and_replaced() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    let config = StreamConfig {
        watch_timeout: Duration::from_secs(1),
        idle_margin: Duration::from_millis(500),
        ..StreamConfig::default()
    };
    let (mut rx, cancel) = start_with(&s, "configmaps", config).await;
    assert!(matches!(next_data(&mut rx).await, Update::Listed { .. }));
    wait_state(&mut rx, StreamState::Watching).await;
    // The connection stays open but nothing arrives, not even the server's timeout end.
    c.freeze_watches(true);
    let watches = c.requests(Verb::Watch, "configmaps");
    wait_until(|| c.requests(Verb::Watch, "configmaps") > watches).await;
    c.freeze_watches(false);
    create_and_see(&c, &mut rx, "after-stall").await;
    // A watch request that is accepted and never answered is abandoned too.
    c.stall_next_watches(1);
    c.drop_watches();
    let watches = c.requests(Verb::Watch, "configmaps");
    wait_until(|| c.requests(Verb::Watch, "configmaps") >= watches + 2).await;
    c.release_stalls();
    cancel.cancel();
}

#[tokio::test]
async fn error_storms_back_off_without_a_relist_storm() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    let (mut rx, cancel, _) = start(&s, "configmaps", None).await;
    assert!(matches!(next_data(&mut rx).await, Update::Listed { .. }));
    wait_state(&mut rx, StreamState::Watching).await;
    // An event on the watch proves it is established before the fault.
    c.store
        .create(
            "configmaps",
            Some("a"),
            json!({"metadata": {"name": "before-storm"}}),
        )
        .unwrap();
    assert!(matches!(next_data(&mut rx).await, Update::Applied { .. }));
    let lists = c.requests(Verb::List, "configmaps");
    c.fail_requests(429, fleetscope_sim::FailFor::Requests(6));
    c.drop_watches();
    wait_state(&mut rx, StreamState::Failed).await;
    create_and_see(&c, &mut rx, "after-storm").await;
    assert_eq!(
        c.requests(Verb::List, "configmaps"),
        lists,
        "watches resumed from their resourceVersion: no re-list"
    );
    cancel.cancel();
}

#[tokio::test]
async fn malformed_objects_are_skipped_and_the_rest_kept() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    c.store
        .insert_raw(
            "configmaps",
            "a",
            "broken",
            r#"{"metadata":"not an object"}"#,
        )
        .unwrap();
    let (mut rx, cancel, _) = start(&s, "configmaps", None).await;
    let Update::Listed { objects, .. } = next_data(&mut rx).await else {
        panic!("a list")
    };
    assert_eq!(
        objects.len(),
        7,
        "the malformed one is skipped, the others kept"
    );
    wait_state(&mut rx, StreamState::Watching).await;
    c.store
        .insert_raw("configmaps", "a", "broken-too", r#"{"metadata":{}}"#)
        .unwrap();
    create_and_see(&c, &mut rx, "fine").await;
    cancel.cancel();
}

/// A [`crate::cluster::Report`] that ignores everything.
struct Quiet;

impl crate::cluster::Report for Quiet {
    fn connected(&self, _: &ClusterName, _: &str) {}
    fn discovered(&self, _: &ClusterName, _: Option<&str>, _: &[(String, String)]) {}
    fn failed(&self, _: &ClusterName, _: &str) {}
    fn stream_started(&self, _: &ClusterName, _: &fleetscope_model::ResourceType, _: bool) {}
    fn stream_stopped(&self, _: &ClusterName, _: &fleetscope_model::ResourceType) {}
}

/// Runs a cluster's loop until its stream watches; then `end` stops it (dropping the
/// source's sender, cancelling, or both) and the loop's last updates are returned.
async fn cluster_loop_ended_by(s: &Setup, cancel_too: bool) -> Vec<Update> {
    let (source_tx, source_rx) = tokio::sync::watch::channel(s.source.clone());
    let (tx, mut rx) = mpsc::channel(1024);
    let cancel = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let (_settings, config) =
        tokio::sync::watch::channel(Arc::new(crate::cluster::ClusterConfig {
            resources: vec!["configmaps".into()],
            ..Default::default()
        }));
    let run = tokio::spawn(crate::cluster::run(
        source_rx,
        config,
        Default::default(),
        tx,
        Arc::new(Quiet),
        tasks.clone(),
        cancel.clone(),
    ));
    wait_state(&mut rx, StreamState::Watching).await;
    // As the engine stops: it cancels, and its reconciler then drops every source.
    if cancel_too {
        cancel.cancel();
    }
    drop(source_tx);
    tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the loop ends")
        .unwrap();
    tasks.close();
    tasks.wait().await;
    let mut last = Vec::new();
    while let Ok(u) = rx.try_recv() {
        last.push(u);
    }
    last
}

#[tokio::test]
async fn a_stopping_engine_is_never_taken_for_a_cluster_leaving() {
    let s = setup().await;
    let gone = |updates: &[Update]| {
        updates
            .iter()
            .any(|u| matches!(u, Update::ClusterGone { .. }))
    };
    // The source's sender dropped alone: the cluster left the fleet.
    assert!(gone(&cluster_loop_ended_by(&s, false).await));
    // Cancelled and dropped together (the loop sees both at once, in either order):
    // a shutdown, whose stored objects and resume points must survive it.
    for round in 0..20 {
        assert!(
            !gone(&cluster_loop_ended_by(&s, true).await),
            "round {round}: a shutdown said the cluster left"
        );
    }
}

#[tokio::test]
async fn discovery_asks_for_group_versions_several_at_once() {
    let s = setup().await;
    let cluster = s.server.cluster().clone();
    let client = source::connect(&s.source, Duration::from_secs(30), None)
        .await
        .unwrap()
        .client;
    // Held documents are answered only once released: a discovery asking for one at a
    // time would never have two in flight.
    cluster.hold_group_versions(true);
    let discovering = tokio::spawn(async move {
        discovery::discover_all(&client, discovery::DISCOVERY_CONCURRENCY).await
    });
    wait_until(|| cluster.group_versions_in_flight() >= 2).await;
    cluster.hold_group_versions(false);
    let found = discovering.await.unwrap().unwrap();
    assert!(found.failed.is_empty(), "{:?}", found.failed);
    let names: Vec<String> = found.served.iter().map(|s| s.resource.name()).collect();
    for want in ["pods", "configmaps", "deployments.apps", "namespaces"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    // Each type once, from its group's preferred version.
    let mut unique = names.clone();
    unique.dedup();
    assert_eq!(unique, names);
}

#[tokio::test]
async fn a_first_streaming_list_is_handed_over_in_parts_as_it_arrives() {
    let s = setup().await;
    let (mut rx, cancel, _) =
        start_in_parts(&s, "configmaps", stream::Start::default(), true, 3, || {}).await;
    let mut names = Vec::new();
    let mut lists = Vec::new();
    for _ in 0..2 {
        let Update::ListPart { list, objects, .. } = next_data(&mut rx).await else {
            panic!("first the parts")
        };
        assert_eq!(objects.len(), 3);
        names.extend(objects.into_iter().map(|o| o.name));
        lists.push(list);
    }
    let Update::Listed {
        objects,
        parts,
        method,
        ..
    } = next_data(&mut rx).await
    else {
        panic!("then the rest")
    };
    names.extend(objects.into_iter().map(|o| o.name));
    assert_eq!(method, Some(SyncMethod::WatchList));
    assert_eq!(
        parts,
        Some(lists[0]),
        "the end names the list its parts belong to"
    );
    assert_eq!(lists[0], lists[1]);
    every_one_then_watching(&s, &mut rx, names).await;
    cancel.cancel();
}

/// `names` are the seven configmaps `setup` makes, each once; then the stream
/// watches and sees a change.
async fn every_one_then_watching(
    s: &Setup,
    rx: &mut mpsc::Receiver<Update>,
    mut names: Vec<String>,
) {
    names.sort();
    let want: Vec<String> = (0..7).map(|i| format!("cm-{i}")).collect();
    assert_eq!(names, want);
    wait_state(rx, StreamState::Watching).await;
    create_and_see(s.server.cluster(), rx, "live").await;
}

#[tokio::test]
async fn a_first_list_without_streaming_is_handed_over_in_parts_as_it_arrives() {
    let s = setup().await;
    // A server without streaming lists: the first list is a LIST, from the cache.
    let (mut rx, cancel, _) =
        start_in_parts(&s, "configmaps", stream::Start::default(), false, 3, || {}).await;
    let (mut names, mut lists) = (Vec::new(), Vec::new());
    let (rest, parts, method) = loop {
        match next_data(&mut rx).await {
            Update::ListPart { list, objects, .. } => {
                assert!(
                    objects.len() >= 3,
                    "a part holds at least list_part objects"
                );
                names.extend(objects.into_iter().map(|o| o.name));
                lists.push(list);
            }
            Update::Listed {
                objects,
                parts,
                method,
                ..
            } => break (objects, parts, method),
            other => panic!("parts, then the rest; not {other:?}"),
        }
    };
    assert!(!lists.is_empty(), "the list came in parts");
    assert!(lists.iter().all(|l| Some(*l) == parts), "one list's parts");
    assert_eq!(method, Some(SyncMethod::ListFromCache));
    names.extend(rest.into_iter().map(|o| o.name));
    every_one_then_watching(&s, &mut rx, names).await;
    cancel.cancel();
}

#[tokio::test]
async fn a_list_with_something_held_is_handed_over_whole() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    let (mut rx, cancel, _) =
        start_in_parts(&s, "configmaps", stream::Start::default(), true, 3, || {}).await;
    loop {
        if let Update::Listed { parts, .. } = next_data(&mut rx).await {
            assert!(parts.is_some(), "the first list came in parts");
            break;
        }
    }
    wait_state(&mut rx, StreamState::Watching).await;
    // A 410: the re-list, with the first list held, is applied whole (diffed against
    // what is held at its end), never in parts.
    c.expire_watches();
    match next_data(&mut rx).await {
        Update::Listed { objects, parts, .. } => {
            assert_eq!(parts, None);
            assert_eq!(objects.len(), 7);
        }
        other => panic!("a whole re-list, not {other:?}"),
    }
    cancel.cancel();
}

/// A history reader for configmaps over a fresh client of the simulated cluster.
async fn history_of(s: &Setup) -> crate::history::History {
    let client = source::connect(&s.source, Duration::from_secs(30), None)
        .await
        .unwrap()
        .client;
    let served = discovery::discover(&client).await.unwrap();
    let rt = discovery::resolve(&["configmaps".into()], &served)
        .resources
        .remove(0);
    let id = Arc::new(StreamId::new(ClusterName::from("inf"), rt));
    let config = StreamConfig {
        page_size: 3,
        ..StreamConfig::default()
    };
    crate::history::History::new(client, id, config)
}

#[tokio::test]
async fn a_history_read_is_the_state_at_its_position_then_every_change_after_it() {
    let s = setup().await;
    let c = s.server.cluster().clone();
    let history = history_of(&s).await;
    let from = c.store.resource_version().to_string();
    // Changes after the position, some undone again before the read: the read still
    // has each of them, in order.
    c.store.delete("configmaps", "a", "cm-1").unwrap();
    create_configmap(&c, "late");
    c.store.delete("configmaps", "a", "late").unwrap();
    let lists = c.lists_of(ListKind::Quorum);
    let (tx, mut rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let read = tokio::spawn({
        let (history, from, cancel) = (history.clone(), from.clone(), cancel.clone());
        async move { history.read(&from, tx, cancel).await }
    });
    let Update::Listed {
        objects,
        resource_version,
        ..
    } = next_data(&mut rx).await
    else {
        panic!("the state at the position first")
    };
    assert_eq!(resource_version, from, "listed at exactly the position");
    assert_eq!(objects.len(), 7, "cm-1 still there, late not yet");
    assert!(
        c.lists_of(ListKind::Quorum) > lists,
        "an exact read comes from storage"
    );
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match next_data(&mut rx).await {
            Update::Applied { object, .. } => seen.push(format!("+{}", object.name)),
            Update::Deleted { object, .. } => seen.push(format!("-{}", object.name)),
            _ => {}
        }
    }
    assert_eq!(seen, ["-cm-1", "+late", "-late"]);
    create_and_see(&c, &mut rx, "live").await;
    cancel.cancel();
    assert_eq!(read.await.unwrap(), crate::history::HistoryEnd::Cancelled);

    // A position the member no longer holds: expired, nothing sent.
    c.compact();
    let (tx, mut rx) = mpsc::channel(64);
    let end = history.read(&from, tx, CancellationToken::new()).await;
    assert_eq!(end, crate::history::HistoryEnd::Expired);
    assert!(rx.try_recv().is_err());
}

/// Creates a configmap in namespace `a`, with no stream to see it.
fn create_configmap(c: &Cluster, name: &str) {
    c.store
        .create("configmaps", Some("a"), json!({"metadata": {"name": name}}))
        .unwrap();
}
