//! Crash safety: `fleetscope serve` killed with SIGKILL at random moments while its
//! clusters change, fifty times. Before each restart the store is opened directly and
//! checked: every stream's stored objects are exactly its cluster's state at the
//! stored resourceVersion (never ahead of it, never behind). Each restart serves at
//! once, and the last one converges to the clusters.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::process::Server;
use common::{Churn, ChurnSpec, truth};
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{ListRequest, Query};
use fleetscope_sim::store::ReadAt;
use fleetscope_sim::{FleetSpec, SimFleet};

const RESTARTS: usize = 50;
const TYPES: &str = "configmaps,pods";

/// (namespace, name, resourceVersion).
type Versioned = (String, String, String);

fn serve(kubeconfig: &std::path::Path, data: &std::path::Path, log: &std::path::Path) -> Server {
    let data = data.to_str().unwrap();
    Server::start(
        kubeconfig,
        &[
            "--resources",
            TYPES,
            // Compact whenever the file has grown by half, so kills land in compactions too.
            "--compact-share",
            "0",
            "--compact-min-mib",
            "0",
            "--data-dir",
            data,
        ],
        log,
    )
}

/// Every object of a type as the server lists it: (cluster, namespace, name) → resourceVersion.
async fn listed(port: u16, resource: &str) -> Option<BTreeMap<(String, String, String), String>> {
    let mut c = FleetClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .ok()?;
    let mut out = BTreeMap::new();
    let mut token = String::new();
    loop {
        let page = c
            .list(ListRequest {
                query: Some(Query {
                    resource: resource.into(),
                    ..Default::default()
                }),
                limit: 1000,
                page_token: token,
                keep_snapshot: false,
            })
            .await
            .ok()?
            .into_inner();
        for o in page.items {
            out.insert((o.cluster, o.namespace, o.name), o.resource_version);
        }
        if page.next_page_token.is_empty() {
            return Some(out);
        }
        token = page.next_page_token;
    }
}

/// Opens the store as the killed process left it and checks each stream's objects
/// against its cluster's history at the stored resourceVersion; returns how many
/// streams of the churned type (configmaps) were checked.
fn check_store(data: &std::path::Path, fleet: &SimFleet) -> usize {
    let opened = fleetscope_store::SledStore::open(data).expect("the store opens after SIGKILL");
    assert!(
        opened.moved_aside.is_none(),
        "a SIGKILL must not damage the store: {:?}",
        opened.moved_aside
    );
    let loaded = opened.loaded;
    let mut held: BTreeMap<(String, String), BTreeSet<Versioned>> = BTreeMap::new();
    for r in &loaded.objects.to_records() {
        let o = &r.state;
        held.entry((o.key.cluster.to_string(), o.key.resource.to_string()))
            .or_default()
            .insert((
                o.key.namespace.to_string(),
                o.key.name.to_string(),
                // Compressed in a snapshot, as text in the change log.
                serde_json::from_str::<serde_json::Value>(&r.text()).unwrap()["metadata"]
                    ["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            ));
    }
    let mut checked = 0;
    for s in &loaded.streams {
        let server = fleet
            .servers()
            .iter()
            .find(|x| x.cluster().name() == s.cluster.as_str())
            .unwrap();
        let rv: u64 = s.resource_version.parse().unwrap();
        let Ok(snap) = server
            .cluster()
            .store
            .snapshot(&s.resource.name(), ReadAt::Exact(rv))
        else {
            continue; // history no longer reaches back that far
        };
        let expected: BTreeSet<Versioned> = snap
            .objects
            .values()
            .map(|o| (o.namespace.clone(), o.name.clone(), o.rv.to_string()))
            .collect();
        let got = held
            .remove(&(s.cluster.to_string(), s.resource.name()))
            .unwrap_or_default();
        assert_eq!(
            got,
            expected,
            "{}/{}: stored objects differ from the cluster at the stored resourceVersion {rv}",
            s.cluster,
            s.resource.name()
        );
        // The pods do not change: only a churned stream's check says anything.
        if s.resource.plural == "configmaps" {
            checked += 1;
        }
    }
    // Objects are never stored for a stream whose resume point is not.
    for (k, objects) in &held {
        let has_stream = loaded
            .streams
            .iter()
            .any(|s| s.cluster.as_str() == k.0 && s.resource.name() == k.1);
        assert!(
            has_stream || objects.is_empty(),
            "{k:?} has objects but no stream"
        );
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_under_write_load_fifty_times() {
    let fleet = SimFleet::start(&FleetSpec::numbered(2, 300, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");

    // Write load: about 500 changes a second per cluster.
    let churn = Churn::start(
        &fleet,
        &ChurnSpec {
            names: 150,
            bytes: 0,
            delete_every: 3,
            pause: Duration::from_millis(2),
        },
    );

    // A fixed seed: the kill moments vary across iterations and repeat across runs.
    let mut seed: u64 = 0x5eed_f1ee_75c0_9e01;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut checked = 0;
    for round in 0..RESTARTS {
        if round > 0 {
            checked += check_store(&data, &fleet);
        }
        let mut server = serve(&kubeconfig, &data, &log);
        // Serves: after the first round, at once from the store.
        common::eventually(format!("round {round}: served"), async || {
            server.assert_running(&log);
            matches!(listed(server.port, "pods").await, Some(pods) if round == 0 || !pods.is_empty())
        })
        .await;
        // The kill lands somewhere in the next 0–400 ms of ingest and writes.
        tokio::time::sleep(Duration::from_millis(next() % 400)).await;
        server.kill();
    }
    checked += check_store(&data, &fleet);
    // Two churned streams (one per cluster) after each of the kills: most of them
    // must be checkable (the simulated history reaches back to the stored point).
    assert!(
        checked >= RESTARTS,
        "churned streams were checked after the kills: {checked} of {}",
        2 * RESTARTS
    );

    // With the load stopped, one more start converges to the clusters.
    churn.stop().await;
    let last = serve(&kubeconfig, &data, &log);
    let port = last.port;
    for resource in ["configmaps", "pods"] {
        let want = truth(&fleet, resource);
        common::eventually(format!("{resource} converged"), async || {
            listed(port, resource).await.as_ref() == Some(&want)
        })
        .await;
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    let compactions = logged.matches("store compacted").count();
    let interrupted = logged.matches("removing an unfinished compaction").count()
        + logged.matches("finishing a compaction's switch").count();
    eprintln!("{compactions} compactions, {interrupted} interrupted by a kill");
    assert!(compactions > 0, "the runs compacted the store");
    fleet.shutdown().await;
}

/// A tmpfs of its own (root is needed to mount one: the test says so if it cannot),
/// unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(path: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(path).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "this test fills a small tmpfs and needs to mount one (as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(path.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .output();
    }
}

/// The store's error and the cluster's freshness, as a client reads them: the error
/// only when ListClusters and GetStore (read one after the other) both name it, empty
/// only when neither does (`None` while they disagree, at a change).
async fn store_state(port: u16) -> Option<(String, i32, String)> {
    let mut c = FleetClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .ok()?;
    let r = c
        .list_clusters(fleetscope::proto::ListClustersRequest::default())
        .await
        .ok()?
        .into_inner();
    let cluster = r.clusters.first()?;
    let store = c
        .get_store(fleetscope::proto::GetStoreRequest::default())
        .await
        .ok()?
        .into_inner();
    let agree = r.store_error == store.last_error
        && r.store_error.is_empty() == store.failing_since.is_none();
    agree.then(|| (r.store_error, cluster.freshness, cluster.last_error.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_makes_answers_stale_and_writes_resume_once_space_frees() {
    use fleetscope::proto::Freshness;
    let fleet = SimFleet::start(&FleetSpec::numbered(1, 100, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let disk = Tmpfs::mount(&dir.path().join("disk"), "3m");
    let data = dir.path().join("disk").join("data");
    let log = dir.path().join("serve.log");
    let args = [
        "--resources",
        "configmaps",
        "--data-dir",
        data.to_str().unwrap(),
    ];
    let mut server = Server::start(&kubeconfig, &args, &log);
    let churn = Churn::start(
        &fleet,
        &ChurnSpec {
            names: 400,
            bytes: 4096,
            delete_every: 9,
            pause: Duration::from_millis(2),
        },
    );
    // The disk fills: every answer says it is not current, none reads SYNCED.
    let (_, freshness, why) = common::eventually("the disk fills", async || {
        store_state(server.port)
            .await
            .filter(|(error, _, _)| !error.is_empty())
    })
    .await;
    assert_eq!(freshness, Freshness::Stale as i32, "{why}");
    assert!(why.contains("store"), "{why}");
    for _ in 0..10 {
        // The error's text may change between two reads (a write fails, then the
        // reopening): read until both calls tell the same.
        let (error, freshness, _) =
            common::eventually("ListClusters and GetStore agree", async || {
                store_state(server.port).await
            })
            .await;
        assert!(!error.is_empty(), "still full");
        assert_ne!(
            freshness,
            Freshness::Synced as i32,
            "never SYNCED while writes fail"
        );
        let mut c = FleetClient::connect(server.url()).await.unwrap();
        let page = c
            .list(ListRequest {
                query: Some(Query {
                    resource: "configmaps".into(),
                    ..Default::default()
                }),
                limit: 1,
                page_token: String::new(),
                keep_snapshot: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.partial, "a List says it is partial");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Space frees: writes resume by themselves, and answers are current again.
    disk.resize("64m");
    let freed = tokio::time::Instant::now();
    common::eventually(common::with_log("writes resume", &log), async || {
        matches!(store_state(server.port).await,
            Some((error, freshness, _)) if error.is_empty() && freshness == Freshness::Synced as i32)
    })
    .await;
    eprintln!(
        "writes resumed and answers were current {:?} after space freed",
        freed.elapsed()
    );
    churn.stop().await;
    let expected = truth(&fleet, "configmaps");
    common::eventually("converges", async || {
        listed(server.port, "configmaps").await.as_ref() == Some(&expected)
    })
    .await;
    // What it wrote after the stall is whole on disk: a SIGKILL and a restart serve it.
    server.kill();
    let server = Server::start(&kubeconfig, &args, &log);
    common::eventually("restarts whole", async || {
        listed(server.port, "configmaps").await.as_ref() == Some(&expected)
    })
    .await;
    drop(server);
    drop(disk);
    fleet.shutdown().await;
}
