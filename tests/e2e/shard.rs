//! Replica membership through real Leases: `OwnLease` and `follow` against a
//! simulated coordination cluster over HTTP, as against a kube-apiserver: Leases
//! created and replaced with their `resourceVersion`, a lost race answered by a
//! conflict and never by an overwrite, a release seen by the other replicas at once,
//! every change reaching a follower by its watch.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetscope_ring::lease::{self, LeaseError, Observed, OwnLease};
use fleetscope_ring::leases::Leases;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::sync::watch;

use crate::common;
use common::PATIENCE;

const RING: &str = "fleet";
const DURATION: Duration = Duration::from_secs(15);

/// The ring's Lease key, as the replicas derive it from the page token key file
/// [`Replica::start`] writes.
fn ring_key() -> fleetscope_ring::seal::LeaseKey {
    fleetscope::config::flags::lease_key(&fleetscope::grpc::TokenKey::new(&[7u8; 32]))
}

fn identities(o: &Observed) -> Vec<String> {
    o.alive(tokio::time::Instant::now())
        .into_iter()
        .map(|m| m.identity)
        .collect()
}

async fn wait_for(observed: &mut watch::Receiver<Observed>, want: &[&str]) -> Observed {
    let found = tokio::time::timeout(PATIENCE, observed.wait_for(|o| identities(o) == want))
        .await
        .map(|r| r.map(|o| o.clone()));
    match found {
        Ok(Ok(o)) => o,
        _ => panic!(
            "never saw exactly {want:?}; last seen {:?}",
            identities(&observed.borrow())
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hold_their_leases_lose_races_without_overwriting_and_leave_at_once() {
    let (fleet, _dir, kubeconfig) = common::fleet_with_kubeconfig(1, 0).await;
    let client = common::kube_client(&kubeconfig, "sim-1").await;
    // The Leases as the replicas reach them, and as anyone else may read and write them.
    let api = Leases::new(client.clone(), "default");
    let raw: Api<Lease> = Api::namespaced(client, "default");
    let (tx, mut observed) = watch::channel(Observed::new(RING, DURATION, ring_key()));
    let stop = tokio_util::sync::CancellationToken::new();
    let follower = tokio::spawn(lease::follow(api.clone(), RING.into(), tx, stop.clone()));

    let published = |address: &str| {
        BTreeMap::from([("fleetscope.io/address".to_string(), address.to_string())])
    };
    let mut a = OwnLease::new(api.clone(), RING, "fleetscope-0", DURATION, ring_key());
    let mut b = OwnLease::new(api.clone(), RING, "fleetscope-1", DURATION, ring_key());
    a.renew(&published("10.0.0.1:50051")).await.unwrap();
    b.renew(&published("10.0.0.2:50051")).await.unwrap();
    let seen = wait_for(&mut observed, &["fleetscope-0", "fleetscope-1"]).await;
    let members = seen.alive(tokio::time::Instant::now());
    assert_eq!(
        members[0].annotations["fleetscope.io/address"], "10.0.0.1:50051",
        "what a replica publishes reaches the others"
    );

    // The Lease as client-go writes it.
    let written = raw.get(a.name()).await.unwrap();
    let spec = written.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("fleetscope-0"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    assert!(spec.renew_time.is_some() && spec.acquire_time.is_some());
    assert_eq!(
        written.metadata.labels.as_ref().unwrap()[fleetscope_ring::vocabulary::RING_LABEL],
        RING
    );

    // Another writer (a person, a tool) replaces the Lease in between: the next
    // write carries a stale resourceVersion and loses, leaving the other's write in
    // place; the write after it reads first and holds.
    let mut edited = raw.get(a.name()).await.unwrap();
    edited
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert("edited".into(), "by-hand".into());
    raw.replace(a.name(), &Default::default(), &edited)
        .await
        .unwrap();
    let lost = a.renew(&published("10.0.0.1:50051")).await.unwrap_err();
    assert!(matches!(lost, LeaseError::Conflict { .. }), "{lost}");
    let kept = raw.get(a.name()).await.unwrap();
    assert_eq!(
        kept.metadata.labels.as_ref().unwrap()["edited"],
        "by-hand",
        "a lost race overwrites nothing"
    );
    a.renew(&published("10.0.0.1:50051")).await.unwrap();

    // A second process given the same identity finds the Lease held by another
    // instance and renewed within its duration: it says so and writes nothing.
    let mut twin = OwnLease::new(api.clone(), RING, "fleetscope-0", DURATION, ring_key());
    let before = raw.get(a.name()).await.unwrap();
    let refused = twin.renew(&published("10.0.0.9:50051")).await.unwrap_err();
    assert!(
        matches!(refused, LeaseError::HeldByAnother { .. })
            && refused.to_string().contains("--shard-identity"),
        "{refused}"
    );
    let after = raw.get(a.name()).await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the twin wrote nothing"
    );
    a.renew(&published("10.0.0.1:50051")).await.unwrap();

    // Released: the holder is cleared, and the follower counts the replica gone at
    // once, long before its duration.
    b.release().await.unwrap();
    wait_for(&mut observed, &["fleetscope-0"]).await;
    let released = raw.get(b.name()).await.unwrap().spec.unwrap();
    assert_eq!(released.holder_identity, None);
    // Taken up again: a transition.
    b.renew(&published("10.0.0.2:50051")).await.unwrap();
    wait_for(&mut observed, &["fleetscope-0", "fleetscope-1"]).await;
    let again = raw.get(b.name()).await.unwrap().spec.unwrap();
    assert_eq!(again.lease_transitions, Some(1));

    // A deleted Lease leaves the ring too.
    raw.delete(a.name(), &Default::default()).await.unwrap();
    wait_for(&mut observed, &["fleetscope-1"]).await;

    stop.cancel();
    follower.await.unwrap();
    fleet.shutdown().await;
}

fn cluster_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("cluster-{i}")).collect()
}

struct Running {
    config: fleetscope_ring::member::MembershipConfig,
    view: watch::Receiver<fleetscope_ring::member::View>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn member(api: &Leases, identity: &str, replication: usize) -> Running {
    use fleetscope_ring::member::{self, MembershipConfig, View};
    let config = MembershipConfig {
        ring: RING.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_period: Duration::from_millis(300),
        replication,
        key: ring_key(),
    };
    let (_published_tx, published) = watch::channel(BTreeMap::new());
    let (tx, view) = watch::channel(View::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(member::run(
        api.clone(),
        config.clone(),
        published,
        tx,
        stop.clone(),
    ));
    Running {
        config,
        view,
        stop,
        task,
    }
}

impl Running {
    fn owned(&self, clusters: &[String]) -> Vec<String> {
        fleetscope::shard::owner::owned(
            &self.view.borrow(),
            tokio::time::Instant::now(),
            &self.config,
            clusters,
        )
    }

    async fn until(&mut self, what: &str, cond: impl Fn(&Self) -> bool) {
        common::eventually(what, async || {
            if cond(self) {
                return true;
            }
            // The view changes as Leases are renewed and seen; fencing is judged by
            // the clock, so the wait also wakes on its own (and, once the member has
            // stopped, nothing changes but the clock).
            let _ = tokio::time::timeout(Duration::from_millis(100), self.view.changed()).await;
            false
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_split_the_clusters_take_over_a_leaver_s_and_a_cut_off_one_is_fenced() {
    let (fleet, _dir, kubeconfig) = common::fleet_with_kubeconfig(1, 0).await;
    let client = common::kube_client(&kubeconfig, "sim-1").await;
    let api = Leases::new(client, "default");
    let clusters = cluster_names(40);
    let mut a = member(&api, "fleetscope-0", 1);
    let mut b = member(&api, "fleetscope-1", 1);
    let both = |r: &Running| r.view.borrow().members(tokio::time::Instant::now()).len() == 2;
    a.until("a sees both", both).await;
    b.until("b sees both", both).await;
    // Each cluster has exactly one owner, and both replicas agree on it.
    let (mine, theirs) = (a.owned(&clusters), b.owned(&clusters));
    assert!(
        !mine.is_empty() && !theirs.is_empty(),
        "{mine:?} {theirs:?}"
    );
    let mut all: Vec<String> = mine.iter().chain(&theirs).cloned().collect();
    all.sort();
    let mut want = clusters.clone();
    want.sort();
    assert_eq!(all, want, "every cluster owned once");

    // b leaves (its Lease released): a owns everything at once, well within the
    // lease duration.
    b.stop.cancel();
    b.task.await.unwrap();
    a.until("a takes b's clusters", |r| r.owned(&clusters).len() == 40)
        .await;

    // With two owners per cluster, a lone replica owns every cluster once more.
    let mut c = member(&api, "fleetscope-2", 2);
    c.until("c sees a and itself", both).await;
    assert_eq!(c.owned(&clusters).len(), 40, "two owners each: c owns all");

    // The coordination cluster goes away: renewals fail, and once the lease duration
    // has passed since the last one, c is fenced and owns nothing; back, it is not.
    let coordination = &fleet.servers()[0];
    coordination.go_offline().await;
    c.until("c is fenced", |r| r.owned(&clusters).is_empty())
        .await;
    assert!(c.view.borrow().renew_failures > 0);
    coordination.come_online().await.unwrap();
    c.until("c serves again", |r| r.owned(&clusters).len() == 40)
        .await;

    for r in [a, c] {
        r.stop.cancel();
        r.task.await.unwrap();
    }
    fleet.shutdown().await;
}

/// One `serve` replica of the ring `RING` as a process of its own.
struct Replica {
    server: common::process::Server,
    metrics: String,
    identity: String,
    /// The address it publishes on its Lease.
    advertise: String,
}

impl Replica {
    fn start(kubeconfig: &std::path::Path, identity: &str, log: &std::path::Path) -> Self {
        Self::start_with(kubeconfig, identity, log, &[])
    }

    /// [`Replica::start`] with more arguments.
    fn start_with(
        kubeconfig: &std::path::Path,
        identity: &str,
        log: &std::path::Path,
        more: &[&str],
    ) -> Self {
        let metrics = format!("127.0.0.1:{}", common::process::free_port());
        let port = common::process::free_port();
        let advertise = format!("127.0.0.1:{port}");
        let key = kubeconfig.with_file_name("page-token.key");
        if !key.exists() {
            std::fs::write(&key, [7u8; 32]).unwrap();
        }
        let key = key.display().to_string();
        let mut args = vec![
            "--shard-page-token-key-file",
            &key,
            "--resources",
            "configmaps",
            "--no-persist",
            "--metrics-listen",
            &metrics,
            "--shard-ring",
            RING,
            "--shard-coordination",
            "sim-1",
            "--shard-identity",
            identity,
        ];
        // Short leases and its own address, unless asked otherwise.
        for (flag, value) in [
            ("--shard-advertise", advertise.as_str()),
            ("--shard-lease-duration", "3s"),
            ("--shard-renew-period", "500ms"),
        ] {
            if !more.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(more);
        let server = common::process::Server::start_at(port, kubeconfig, &args, log, &[]);
        // Listening before anything else picks a free port: none can be given this one.
        listening(port, log);
        Self {
            server,
            metrics,
            identity: identity.into(),
            advertise,
        }
    }

    async fn client(
        &self,
    ) -> Option<fleetscope::proto::fleet_client::FleetClient<tonic::transport::Channel>> {
        fleetscope::proto::fleet_client::FleetClient::connect(self.server.url())
            .await
            .ok()
    }

    /// The clusters this replica holds synced, or `None` while it does not answer.
    async fn synced(&self) -> Option<Vec<String>> {
        let answer = self
            .client()
            .await?
            .list_clusters(fleetscope::proto::ListClustersRequest::default())
            .await
            .ok()?
            .into_inner();
        Some(
            answer
                .clusters
                .into_iter()
                .filter(|c| c.freshness == fleetscope::proto::Freshness::Synced as i32)
                .map(|c| c.name)
                .collect(),
        )
    }

    /// How many configmaps this replica counts, or the code it answers with.
    async fn count(&self) -> Result<u64, tonic::Code> {
        self.counted().await.map_err(|s| s.code())
    }

    /// How many configmaps this replica counts, or the status it answers with.
    async fn counted(&self) -> Result<u64, tonic::Status> {
        let mut client = self
            .client()
            .await
            .ok_or_else(|| tonic::Status::unavailable("no connection"))?;
        client
            .count(fleetscope::proto::CountRequest {
                query: Some(fleetscope::proto::Query {
                    resource: "configmaps".into(),
                    ..Default::default()
                }),
                group_by: vec![],
            })
            .await
            .map(|r| r.into_inner().total)
    }

    /// The lists this replica's streams made of their clusters, when scraped.
    async fn lists(&self) -> Option<f64> {
        let text = common::scrape(&self.metrics).await?;
        Some(
            text.lines()
                .filter(|l| l.starts_with("fleetscope_relists_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    /// A metric's value, when scraped.
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = common::scrape(&self.metrics).await?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

/// The `clusters` that `identity` alone owns among `members` (replication 1).
fn assigned(clusters: &[String], members: &[String], identity: &str) -> Vec<String> {
    clusters
        .iter()
        .filter(|c| fleetscope_ring::assign::owners(c, members, 1) == [identity])
        .cloned()
        .collect()
}

/// Waits until each of `replicas` holds synced exactly the clusters the ring's
/// assignment over them gives it (every cluster once, and no other: moves done).
async fn split(replicas: &[&Replica], clusters: &[String], log: &std::path::Path) {
    let members: Vec<String> = replicas.iter().map(|r| r.identity.clone()).collect();
    let want: Vec<Vec<String>> = members
        .iter()
        .map(|m| assigned(clusters, &members, m))
        .collect();
    let what = format!("the replicas hold their assignment {want:?}");
    common::eventually(common::with_log(what, log), async || {
        let mut held = Vec::new();
        for r in replicas {
            let mut synced = r.synced().await.unwrap_or_default();
            synced.sort();
            held.push(synced);
        }
        if held == want { Ok(()) } else { Err(held) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_replicas_share_the_clusters_hand_them_over_and_are_fenced_without_their_lease() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(6, 20).await;
    let log = dir.path().join("replicas.log");
    let clusters: Vec<String> = (1..=6).map(|i| format!("sim-{i}")).collect();
    let total = common::truth(&fleet, "configmaps").len() as u64;
    let mut a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let c = Replica::start(&kubeconfig, "replica-c", &log);

    // Three replicas: every cluster held by exactly one, none unowned, and the counts
    // of the three add up to the fleet's.
    split(&[&a, &b, &c], &clusters, &log).await;
    common::eventually(
        "the counts add up, three members, none unowned",
        async || {
            let mut sum = 0;
            for r in [&a, &b, &c] {
                sum += r.count().await.unwrap_or(0);
            }
            let members = c.metric("fleetscope_shard_members").await;
            let unowned = c.metric("fleetscope_shard_unowned_clusters").await;
            if sum == total && members == Some(3.0) && unowned == Some(0.0) {
                Ok(())
            } else {
                Err(format!(
                    "counts add up to {sum} of {total}; members {members:?}, unowned {unowned:?}"
                ))
            }
        },
    )
    .await;

    // SIGKILL: a's clusters are taken up by the others once its Lease expires.
    a.server.kill();
    split(&[&b, &c], &clusters, &log).await;

    // SIGTERM: b hands its clusters over to c before it stops, and its Lease is
    // released (c is the only member at once, not after the lease duration).
    let mut b = b;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &b.server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::task::spawn_blocking(move || {
        let status = b.server.child.wait();
        (b, status)
    })
    .await
    .unwrap();
    assert!(status.1.unwrap().success(), "b stops cleanly");
    assert_eq!(
        c.synced().await.map(|s| s.len()),
        Some(6),
        "c holds every cluster synced when b has stopped"
    );
    common::eventually("c sees b gone", async || {
        c.metric("fleetscope_shard_members").await == Some(1.0)
    })
    .await;
    assert!(
        c.metric("fleetscope_shard_moves_total")
            .await
            .unwrap_or(0.0)
            > 0.0
    );
    assert_eq!(c.count().await, Ok(total));

    // The coordination cluster goes away: once its lease duration has passed without
    // a renewal, c answers for no cluster (UNAVAILABLE, retryable); back, it does.
    fleet.servers()[0].go_offline().await;
    common::eventually("c fenced", async || match c.count().await {
        Err(tonic::Code::Unavailable) => Ok(()),
        other => Err(other),
    })
    .await;
    // The gauge follows at the replica's next look at its Lease (a renew period).
    common::eventually("c reports itself fenced", async || {
        c.metric("fleetscope_shard_fenced").await == Some(1.0)
    })
    .await;
    assert!(
        c.metric("fleetscope_shard_lease_renew_failures_total")
            .await
            .unwrap_or(0.0)
            > 0.0
    );
    // Fenced, it reports no cluster as current: each says why.
    let fenced = c
        .client()
        .await
        .unwrap()
        .list_clusters(fleetscope::proto::ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(!fenced.clusters.is_empty());
    for cl in &fenced.clusters {
        assert_ne!(
            cl.freshness,
            fleetscope::proto::Freshness::Synced as i32,
            "{cl:?}"
        );
        assert!(cl.last_error.contains("lease"), "{cl:?}");
    }
    fleet.servers()[0].come_online().await.unwrap();
    common::eventually("c answers again", async || c.count().await == Ok(total)).await;
    drop(c);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_given_the_same_identity_serves_nothing_and_says_why() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 5).await;
    let log = dir.path().join("twins.log");
    let clusters: Vec<String> = (1..=2).map(|i| format!("sim-{i}")).collect();
    let total = common::truth(&fleet, "configmaps").len() as u64;
    let first = Replica::start(&kubeconfig, "twin", &log);
    split(&[&first], &clusters, &log).await;
    let second = Replica::start(&kubeconfig, "twin", &log);
    // The second holds no Lease: it answers for nothing, saying why, until the first
    // stops renewing; the first serves on.
    common::eventually(
        "the twin says why it serves nothing",
        async || match second.counted().await {
            Err(s)
                if s.code() == tonic::Code::Unavailable
                    && s.message().contains("--shard-identity") =>
            {
                Ok(())
            }
            other => Err(other),
        },
    )
    .await;
    assert_eq!(second.metric("fleetscope_shard_fenced").await, Some(1.0));
    // What it reports of itself says so too, not that it is loading a store.
    let clusters = second
        .client()
        .await
        .unwrap()
        .list_clusters(fleetscope::proto::ListClustersRequest::default())
        .await
        .unwrap_err();
    assert!(
        clusters.message().contains("--shard-identity"),
        "{clusters:?}"
    );
    assert_eq!(first.count().await, Ok(total));
    assert_eq!(first.metric("fleetscope_shard_fenced").await, Some(0.0));
    // The first is killed: once its Lease has gone a duration without renewal, the
    // second takes it and serves the fleet.
    drop(first);
    common::eventually(common::with_log("the twin takes over", &log), async || {
        second.count().await == Ok(total)
    })
    .await;
    drop(second);
    fleet.shutdown().await;
}

/// Waits (up to [`PATIENCE`]) until something listens on loopback `port`: a process
/// started on it has bound it, so no later free port can be this one.
fn listening(port: u16, log: &std::path::Path) {
    let what = format!("something listens on {port}");
    common::eventually_blocking(common::with_log(what, log), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// A `fleetscope router` process over the ring `RING`, killed when dropped.
struct RouterProcess {
    child: std::process::Child,
    port: u16,
}

impl RouterProcess {
    fn start(kubeconfig: &std::path::Path, log_path: &std::path::Path) -> Self {
        // The replicas' lease duration (see Replica::start).
        Self::start_with(kubeconfig, log_path, &["--shard-lease-duration", "3s"])
    }

    /// [`RouterProcess::start`] with more arguments.
    fn start_with(kubeconfig: &std::path::Path, log_path: &std::path::Path, more: &[&str]) -> Self {
        let port = common::process::free_port();
        let log = log_path;
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = std::process::Command::new(common::process::BIN)
            .args(["router", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--shard-ring", RING, "--shard-coordination", "sim-1"])
            .args(more)
            .arg("--shard-page-token-key-file")
            .arg(kubeconfig.with_file_name("page-token.key"))
            .env(
                "RUST_LOG",
                std::env::var("E2E_RUST_LOG")
                    .unwrap_or_else(|_| "info,fleetscope::router=debug".into()),
            )
            .stdout(std::process::Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        listening(port, log);
        Self { child, port }
    }

    async fn client(
        &self,
    ) -> fleetscope::proto::fleet_client::FleetClient<tonic::transport::Channel> {
        let url = format!("http://127.0.0.1:{}", self.port);
        common::eventually("the router listens", async || {
            fleetscope::proto::fleet_client::FleetClient::connect(url.clone()).await
        })
        .await
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn configmaps_query() -> fleetscope::proto::Query {
    fleetscope::proto::Query {
        resource: "configmaps".into(),
        ..Default::default()
    }
}

/// `clusters` simulated clusters (`sim-1`…) of `per` configmaps each, served by one
/// replica behind one router, the router seeing the replica serve them all.
struct OneReplica {
    fleet: fleetscope_sim::SimFleet,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    log: std::path::PathBuf,
    clusters: Vec<String>,
    replica: Replica,
    router: RouterProcess,
}

async fn one_replica(clusters: usize, per: usize) -> OneReplica {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(clusters, per).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=clusters).map(|i| format!("sim-{i}")).collect();
    let replica = Replica::start(&kubeconfig, "replica-a", &log);
    let router = RouterProcess::start(&kubeconfig, &log);
    split(&[&replica], &clusters, &log).await;
    routers_see(&[&router], clusters.len(), 1).await;
    OneReplica {
        fleet,
        dir,
        kubeconfig,
        log,
        clusters,
        replica,
        router,
    }
}

/// Every configmap listed through `routers`, a page of `limit` from each in turn.
async fn list_through(
    routers: &[&RouterProcess],
    limit: u32,
) -> Result<Vec<(String, String, String)>, tonic::Status> {
    list_marked_through(routers, limit)
        .await
        .map(|(out, _)| out)
}

/// [`list_through`], and whether any page said it is partial (a cluster drawn on not
/// synced, its objects missing or old).
async fn list_marked_through(
    routers: &[&RouterProcess],
    limit: u32,
) -> Result<(Vec<(String, String, String)>, bool), tonic::Status> {
    let mut partial = false;
    let mut out = Vec::new();
    // After each page: how many it said follow, and how many came so far.
    let mut said = Vec::new();
    let mut token = String::new();
    for turn in 0.. {
        let mut client = routers[turn % routers.len()].client().await;
        let page = client
            .list(fleetscope::proto::ListRequest {
                query: Some(configmaps_query()),
                limit,
                page_token: token,
                keep_snapshot: false,
            })
            .await?
            .into_inner();
        assert!(page.items.len() <= limit as usize);
        out.extend(
            page.items
                .into_iter()
                .map(|o| (o.cluster, o.namespace, o.name)),
        );
        said.push((page.remaining_item_count, out.len()));
        partial |= page.partial;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    // Every page's remainder is exact: what followed it.
    for (remaining, so_far) in said {
        assert_eq!(remaining as usize, out.len() - so_far, "{out:?}");
    }
    Ok((out, partial))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routers_serve_the_ring_s_fleet_whole_and_say_which_clusters_nobody_serves() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(6, 15).await;
    // A seventh context no replica can reach: configured, never ready.
    let mut kc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kubeconfig).unwrap()).unwrap();
    kc["clusters"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
        "name": "unreachable", "cluster": {"server": "http://127.0.0.1:1"}}));
    kc["contexts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
        "name": "unreachable", "context": {"cluster": "unreachable", "user": "sim-1"}}));
    std::fs::write(&kubeconfig, kc.to_string()).unwrap();
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=6).map(|i| format!("sim-{i}")).collect();
    // Enough configmaps in every cluster for lists of many pages.
    for cl in &clusters {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(common::kube_client(&kubeconfig, cl).await, "team-1");
        for i in 0..6 {
            let cm = serde_json::from_value(
                serde_json::json!({"metadata": {"name": format!("extra-{i}")}}),
            )
            .unwrap();
            api.create(&Default::default(), &cm).await.unwrap();
        }
    }
    let truth = common::truth(&fleet, "configmaps");
    assert!(truth.len() >= 40, "{}", truth.len());
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let c = Replica::start(&kubeconfig, "replica-c", &log);
    let one = RouterProcess::start(&kubeconfig, &log);
    let two = RouterProcess::start(&kubeconfig, &log);
    let mut with_unreachable = clusters.clone();
    with_unreachable.push("unreachable".into());
    with_unreachable.sort();
    // The assignment counts the unreachable cluster too; it is never ready anywhere.
    split(&[&a, &b, &c], &clusters, &log).await;

    // ListClusters: every served cluster with its owner, and the one nobody serves.
    let listed = common::eventually(
        common::with_log("the router lists every cluster", &log),
        async || {
            let answer = one
                .client()
                .await
                .list_clusters(fleetscope::proto::ListClustersRequest::default())
                .await
                .map(tonic::Response::into_inner);
            if let Ok(a) = &answer
                && a.clusters
                    .iter()
                    .map(|c| c.name.clone())
                    .collect::<Vec<_>>()
                    == with_unreachable
                && a.clusters.iter().all(|c| {
                    c.name == "unreachable"
                        || c.freshness == fleetscope::proto::Freshness::Synced as i32
                })
            {
                Ok(answer.unwrap())
            } else {
                Err(answer)
            }
        },
    )
    .await;
    let mut holders = Vec::new();
    for r in [&a, &b, &c] {
        holders.push((r.identity.clone(), r.synced().await.unwrap_or_default()));
    }
    for cl in &listed.clusters {
        if cl.name == "unreachable" {
            assert_eq!(cl.freshness, fleetscope::proto::Freshness::Error as i32);
            assert!(
                cl.owners.is_empty() && cl.last_error.contains("no replica"),
                "{cl:?}"
            );
            continue;
        }
        let (holder, _) = holders
            .iter()
            .find(|(_, synced)| synced.contains(&cl.name))
            .unwrap();
        assert_eq!(cl.owners.first(), Some(holder), "{cl:?}");
        assert_eq!(cl.freshness, fleetscope::proto::Freshness::Synced as i32);
    }
    // The CLI through a router shows each cluster's owners, in -o wide and -o json.
    let server = format!("127.0.0.1:{}", one.port);
    let cli = |output: &str| {
        let out = std::process::Command::new(common::process::BIN)
            .args(["clusters", "-o", output, "--server", &server])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let wide = cli("wide");
    let mut lines = wide.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header[..3], ["CLUSTER", "FRESHNESS", "OWNERS"], "{wide}");
    for line in lines {
        let cells: Vec<&str> = line.split_whitespace().collect();
        let cl = listed.clusters.iter().find(|c| c.name == cells[0]).unwrap();
        let owners = if cl.owners.is_empty() {
            "<none>".to_string()
        } else {
            cl.owners.join(",")
        };
        assert_eq!(cells[2], owners, "{wide}");
    }
    let json: serde_json::Value = serde_json::from_str(&cli("json")).unwrap();
    for c in json["clusters"].as_array().unwrap() {
        let cl = listed
            .clusters
            .iter()
            .find(|l| c["name"] == *l.name)
            .unwrap();
        assert_eq!(c["owners"], serde_json::json!(cl.owners), "{c}");
    }

    // Count sums the replicas', by cluster too, and says a drawn-on cluster is missing.
    let count = one
        .client()
        .await
        .count(fleetscope::proto::CountRequest {
            query: Some(configmaps_query()),
            group_by: vec!["cluster".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(count.total as usize, truth.len());
    for g in &count.groups {
        let want = truth.keys().filter(|(c, _, _)| *c == g.key[0]).count();
        assert_eq!(g.count as usize, want, "{g:?}");
    }
    assert_eq!(count.groups.len(), 6);
    assert!(
        count.partial,
        "the unreachable cluster is drawn on and missing"
    );

    // List: pages of 7 merged in key order across replicas, continued on the other
    // router each time, is the fleet's truth exactly, each object once.
    let listed = list_through(&[&one, &two], 7).await.unwrap();
    let want: Vec<(String, String, String)> = truth.keys().cloned().collect();
    assert_eq!(listed, want, "every object once, in key order");

    // Get reaches each cluster's replica.
    for (cl, ns, name) in truth.keys().step_by(truth.len() / 6) {
        let got = two
            .client()
            .await
            .get(fleetscope::proto::GetRequest {
                resource: "configmaps".into(),
                cluster: cl.clone(),
                namespace: ns.clone(),
                name: name.clone(),
                projection: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let o = got.object.unwrap();
        assert_eq!((&o.cluster, &o.name), (cl, name));
    }
    let missing = one
        .client()
        .await
        .get(fleetscope::proto::GetRequest {
            resource: "configmaps".into(),
            cluster: "no-such".into(),
            namespace: "x".into(),
            name: "y".into(),
            projection: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let types = one
        .client()
        .await
        .list_resource_types(fleetscope::proto::ListResourceTypesRequest {})
        .await
        .unwrap()
        .into_inner();
    let cm = types
        .resource_types
        .iter()
        .find(|t| t.name == "configmaps")
        .unwrap();
    assert_eq!(cm.total as usize, truth.len());

    // Watch through a router: the initial objects of every replica, one end marker,
    // then changes as they happen; a revision is no position through a router (a
    // position token is).
    let mut watching = two
        .client()
        .await
        .watch(fleetscope::proto::WatchRequest {
            query: Some(configmaps_query()),
            send_initial_events: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut initial = Vec::new();
    let end = loop {
        let e = tokio::time::timeout(PATIENCE, watching.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match fleetscope::proto::EventType::try_from(e.r#type).unwrap() {
            fleetscope::proto::EventType::Added => {
                let o = e.object.unwrap();
                initial.push((o.cluster, o.namespace, o.name));
            }
            fleetscope::proto::EventType::InitialEventsEnd => break e,
            _ => {}
        }
    };
    initial.sort();
    assert_eq!(initial, want, "every object once before the end marker");
    // The end marker carries where the subscriber stands, as the proto says: a Watch
    // resumed from it continues after the initial objects.
    assert!(!end.position_token.is_empty(), "{end:?}");
    let mut resumed = two
        .client()
        .await
        .watch(fleetscope::proto::WatchRequest {
            query: Some(configmaps_query()),
            resume_token: end.position_token.clone(),
            ..Default::default()
        })
        .await
        .expect("a Watch resumes from the end marker's token")
        .into_inner();
    // Positions no member can have are refused: another type, a cluster the query
    // does not name, a resourceVersion that is not one.
    let at = |cluster: &str, resource: &str, rv: &str| fleetscope::proto::StreamPosition {
        cluster: cluster.into(),
        resource: resource.into(),
        resource_version: rv.into(),
    };
    for (clusters, position) in [
        (vec![], at("sim-1", "pods", "5")),
        (vec![], at("sim-1", "configmaps", "abc")),
        (vec![], at("sim-1", "configmaps", "-1")),
        (vec!["sim-1".to_string()], at("sim-2", "configmaps", "5")),
    ] {
        let refused = two
            .client()
            .await
            .watch(fleetscope::proto::WatchRequest {
                query: Some(fleetscope::proto::Query {
                    clusters,
                    ..configmaps_query()
                }),
                resume_token: end.position_token.clone(),
                resume_positions: vec![position.clone()],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::InvalidArgument,
            "{position:?}: {refused:?}"
        );
        assert!(
            refused.message().contains("resume_positions[0]"),
            "{refused:?}"
        );
    }
    let sim2: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(common::kube_client(&kubeconfig, "sim-2").await, "team-1");
    sim2.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "watched"}})).unwrap(),
    )
    .await
    .unwrap();
    loop {
        let e = tokio::time::timeout(PATIENCE, watching.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(o) = e.object
            && o.name == "watched"
        {
            assert_eq!(e.r#type, fleetscope::proto::EventType::Added as i32);
            assert_eq!(o.cluster, "sim-2");
            break;
        }
    }
    // The Watch resumed from the end marker's token sees the same change, and no
    // initial object again.
    loop {
        let e = tokio::time::timeout(PATIENCE, resumed.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(o) = e.object {
            assert_eq!(
                (e.r#type, o.cluster.as_str(), o.name.as_str()),
                (
                    fleetscope::proto::EventType::Added as i32,
                    "sim-2",
                    "watched"
                ),
                "only the change after the token"
            );
            break;
        }
    }
    let from_revision = one
        .client()
        .await
        .watch(fleetscope::proto::WatchRequest {
            query: Some(configmaps_query()),
            since_revision: 5,
            ..Default::default()
        })
        .await;
    let refused = match from_revision {
        Err(s) => s,
        Ok(r) => r.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    let want: Vec<(String, String, String)> =
        common::truth(&fleet, "configmaps").into_keys().collect();

    // A list begun before a replica is killed cannot continue its snapshot from the
    // clusters' new owner: OUT_OF_RANGE saying so, never a page with a gap.
    let mut client = one.client().await;
    let first = client
        .list(fleetscope::proto::ListRequest {
            query: Some(configmaps_query()),
            limit: 3,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut a = a;
    a.server.kill();
    split(&[&b, &c], &clusters, &log).await;
    let next = client
        .list(fleetscope::proto::ListRequest {
            query: None,
            limit: 3,
            page_token: first.next_page_token,
            keep_snapshot: false,
        })
        .await;
    // Every replica is drawn on by a list of every cluster, the killed one too.
    let moved = next.unwrap_err();
    assert_eq!(moved.code(), tonic::Code::OutOfRange, "{moved:?}");
    assert!(moved.message().contains("moved"), "{}", moved.message());
    // (The Watch goes on across the kill: see
    // a_watch_through_the_routers_stays_exact_across_killed_replicas_and_routers.)
    drop(watching);
    // Once the new owners publish the clusters ready, a list through the routers is
    // whole again.
    common::eventually("whole again", async || {
        let again = list_through(&[&two, &one], 7).await;
        if again.as_ref().ok() == Some(&want) {
            Ok(())
        } else {
            Err(again)
        }
    })
    .await;
    drop((b, c, one, two));
    fleet.shutdown().await;
}

/// Waits until each of `routers` serves `clusters` clusters, each with `owners`
/// owners: the routers' view of the ring's Leases has caught up.
async fn routers_see(routers: &[&RouterProcess], clusters: usize, owners: usize) {
    for router in routers {
        let what = format!("a router sees {owners} owner(s) of each cluster");
        common::eventually(what, async || {
            let answer = router
                .client()
                .await
                .list_clusters(fleetscope::proto::ListClustersRequest::default())
                .await;
            if let Ok(a) = &answer
                && a.get_ref().clusters.len() == clusters
                && a.get_ref()
                    .clusters
                    .iter()
                    .all(|c| c.owners.len() == owners)
            {
                Ok(())
            } else {
                Err(answer)
            }
        })
        .await;
    }
}

/// What a subscriber through the routers was sent: the objects it holds, and every
/// way the stream went wrong (a change twice or out of order in its cluster).
#[derive(Default, Debug)]
struct Seen {
    objects: BTreeMap<(String, String, String), String>,
    /// Each cluster's last member position received.
    last: BTreeMap<String, u64>,
    changes: usize,
    resets: usize,
    resumes: usize,
    violations: Vec<String>,
    /// The last position token received, and each cluster's position after it: where
    /// the next Watch resumes, also one started anew on this record.
    token: String,
    after: BTreeMap<String, fleetscope::proto::StreamPosition>,
    /// The clusters between a `RESET` and its `RESET_END`.
    resetting: std::collections::BTreeSet<String>,
    /// Whether the initial objects are still coming.
    initial: bool,
    /// Each `CLUSTER_STATUS` received: the cluster, its freshness, the message.
    statuses: Vec<(String, i32, String)>,
}

/// Follows every configmap through the routers at `ports`, as a client should: from
/// the initial objects, keeping the last position token and the positions after it,
/// and resuming with them on the next router on any error.
async fn subscribe(
    ports: Vec<u16>,
    seen: std::sync::Arc<std::sync::Mutex<Seen>>,
    stop: tokio_util::sync::CancellationToken,
) {
    subscribe_to(configmaps_query(), ports, seen, stop).await
}

/// [`subscribe`] to `query`.
async fn subscribe_to(
    query: fleetscope::proto::Query,
    ports: Vec<u16>,
    seen: std::sync::Arc<std::sync::Mutex<Seen>>,
    stop: tokio_util::sync::CancellationToken,
) {
    use fleetscope::proto::{EventType, WatchRequest};
    let mut turn = 0usize;
    while !stop.is_cancelled() {
        let port = ports[turn % ports.len()];
        turn += 1;
        let Ok(mut client) = fleetscope::proto::fleet_client::FleetClient::connect(format!(
            "http://127.0.0.1:{port}"
        ))
        .await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let request = {
            let mut s = seen.lock().unwrap();
            if s.token.is_empty() {
                // Nothing to resume from: all over again.
                s.objects.clear();
                s.last.clear();
                s.initial = true;
            }
            s.resetting.clear();
            WatchRequest {
                query: Some(query.clone()),
                send_initial_events: s.token.is_empty(),
                resume_token: s.token.clone(),
                resume_positions: s.after.values().cloned().collect(),
                ..Default::default()
            }
        };
        let Ok(stream) = client.watch(request).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        loop {
            let e = tokio::select! {
                _ = stop.cancelled() => return,
                e = stream.message() => e,
            };
            let Ok(Some(e)) = e else { break };
            let mut s = seen.lock().unwrap();
            let t = EventType::try_from(e.r#type).unwrap_or(EventType::Unspecified);
            if !e.position_token.is_empty() {
                s.token = e.position_token.clone();
                s.after.clear();
            }
            if let Some(p) = &e.position {
                s.after.insert(p.cluster.clone(), p.clone());
                if matches!(
                    t,
                    EventType::Added | EventType::Modified | EventType::Deleted
                ) && let Ok(n) = p.resource_version.parse::<u64>()
                {
                    if let Some(last) = s.last.get(&p.cluster)
                        && n <= *last
                    {
                        let v = format!("{} at {n} after {last}: {:?}", p.cluster, e.object);
                        s.violations.push(v);
                    }
                    s.last.insert(p.cluster.clone(), n);
                }
            }
            // Every change carries its position, but the initial objects and those
            // between RESET and RESET_END: a change of no position could be a re-list
            // taken for changes.
            if matches!(
                t,
                EventType::Added | EventType::Modified | EventType::Deleted
            ) && !s.initial
                && let Some(o) = &e.object
                && !s.resetting.contains(&o.cluster)
                && e.position
                    .as_ref()
                    .is_none_or(|p| p.resource_version.is_empty())
            {
                let v = format!(
                    "{t:?} of {}/{} with no position outside a reset",
                    o.cluster, o.name
                );
                s.violations.push(v);
            }
            match t {
                EventType::InitialEventsEnd => s.initial = false,
                EventType::ClusterStatus => {
                    if let Some(c) = e.cluster {
                        s.statuses.push((c.cluster, c.freshness, c.message));
                    }
                }
                EventType::Added | EventType::Modified => {
                    let o = e.object.unwrap();
                    s.changes += 1;
                    s.objects
                        .insert((o.cluster, o.namespace, o.name), o.resource_version);
                }
                EventType::Deleted => {
                    let o = e.object.unwrap();
                    s.changes += 1;
                    s.objects.remove(&(o.cluster, o.namespace, o.name));
                }
                EventType::Reset => {
                    let cluster = e.position.unwrap().cluster;
                    s.resets += 1;
                    s.objects.retain(|(c, _, _), _| *c != cluster);
                    s.last.remove(&cluster);
                    s.resetting.insert(cluster);
                }
                EventType::ResetEnd => {
                    let p = e.position.unwrap();
                    s.resetting.remove(&p.cluster);
                    if let Ok(n) = p.resource_version.parse::<u64>() {
                        s.last.insert(p.cluster, n);
                    }
                }
                _ => {}
            }
        }
        seen.lock().unwrap().resumes += 1;
    }
}

/// What a subscriber ended with: its resumes and resets.
#[derive(Debug)]
struct Ended {
    resumes: usize,
    resets: usize,
}

/// Waits until the subscriber `name` holds exactly what `truth` gives (asked again
/// each turn), with no change twice or out of order on the way, and says so.
async fn until_truth(
    name: &str,
    seen: &std::sync::Arc<std::sync::Mutex<Seen>>,
    truth: impl Fn() -> BTreeMap<(String, String, String), String>,
    log: &std::path::Path,
) -> Ended {
    let what = common::with_log(format!("{name} reaches the truth"), log);
    common::eventually(what, async || {
        let truth = truth();
        {
            let s = seen.lock().unwrap();
            assert!(
                s.violations.is_empty(),
                "{name}: {:?}; log: {}",
                s.violations,
                std::fs::read_to_string(log).unwrap_or_default()
            );
            if s.objects == truth {
                eprintln!(
                    "{name}: {} objects, {} changes, {} resumes, {} resets",
                    truth.len(),
                    s.changes,
                    s.resumes,
                    s.resets
                );
                return Ok(Ended {
                    resumes: s.resumes,
                    resets: s.resets,
                });
            }
            Err(format!(
                "{} held, {} true; stale {:?}; missing {:?}; extra {:?}",
                s.objects.len(),
                truth.len(),
                s.objects
                    .iter()
                    .filter(|(k, v)| truth.get(*k).is_some_and(|t| t != *v))
                    .map(|(k, v)| (k, v, &truth[k]))
                    .take(5)
                    .collect::<Vec<_>>(),
                truth
                    .keys()
                    .filter(|k| !s.objects.contains_key(*k))
                    .take(5)
                    .collect::<Vec<_>>(),
                s.objects
                    .keys()
                    .filter(|k| !truth.contains_key(*k))
                    .take(5)
                    .collect::<Vec<_>>(),
            ))
        }
    })
    .await
}

/// Configmaps changing in every cluster ([`churn`]), and what has been made.
struct Churning {
    made: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Churning {
    fn start(kubeconfig: &std::path::Path, clusters: &[String]) -> Self {
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(churn(
            kubeconfig.to_path_buf(),
            clusters.to_vec(),
            made.clone(),
            stop.clone(),
        ));
        Self { made, stop, task }
    }

    /// Waits until `n` more changes were made and `seen` has received some.
    async fn progress(&self, seen: &std::sync::Arc<std::sync::Mutex<Seen>>, n: usize) {
        use std::sync::atomic::Ordering;
        let from = self.made.load(Ordering::Relaxed);
        let received = seen.lock().unwrap().changes;
        common::eventually(format!("{n} changes made and some received"), async || {
            if self.made.load(Ordering::Relaxed) >= from + n
                && seen.lock().unwrap().changes > received
            {
                Ok(())
            } else {
                Err(format!(
                    "{} made since {from}; {:?}",
                    self.made.load(Ordering::Relaxed),
                    seen.lock().unwrap()
                ))
            }
        })
        .await;
    }

    /// Stops the changes.
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// Creates, modifies and deletes configmaps in every cluster until stopped,
/// counting the changes made.
async fn churn(
    kubeconfig: std::path::PathBuf,
    clusters: Vec<String>,
    made: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: tokio_util::sync::CancellationToken,
) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let mut apis = Vec::new();
    for c in &clusters {
        let api: Api<ConfigMap> =
            Api::namespaced(common::kube_client(&kubeconfig, c).await, "team-1");
        apis.push(api);
    }
    let mut i = 0usize;
    while !stop.is_cancelled() {
        let api = &apis[i % apis.len()];
        let name = format!("churn-{}", (i / apis.len()) % 5);
        // Its parity label changes with each change, in and out of a selector.
        let parity = if i.is_multiple_of(2) { "even" } else { "odd" };
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"parity": parity}}, "data": {"i": i.to_string()}}))
        .unwrap();
        // Each name is created, modified and deleted in turn.
        let done = match (i / (apis.len() * 5)) % 3 {
            0 => api.create(&Default::default(), &cm).await.map(|_| ()),
            1 => {
                let patch = kube::api::Patch::Merge(&cm);
                (api.patch(&name, &Default::default(), &patch).await).map(|_| ())
            }
            _ => api.delete(&name, &Default::default()).await.map(|_| ()),
        };
        match done {
            Ok(()) => {
                made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => panic!("churn: {e}"),
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_through_the_routers_stays_exact_across_killed_replicas_and_routers() {
    use std::sync::Arc;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(4, 10).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=4).map(|i| format!("sim-{i}")).collect();
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let c = Replica::start(&kubeconfig, "replica-c", &log);
    let one = RouterProcess::start(&kubeconfig, &log);
    let two = RouterProcess::start(&kubeconfig, &log);
    split(&[&a, &b, &c], &clusters, &log).await;
    routers_see(&[&one, &two], clusters.len(), 1).await;

    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let subscriber = tokio::spawn(subscribe(
        vec![two.port, one.port],
        seen.clone(),
        stop.clone(),
    ));
    let churning = Churning::start(&kubeconfig, &clusters);
    let progress = |n: usize| churning.progress(&seen, n);
    progress(20).await;

    // The router the subscriber is on is killed: it resumes on the other.
    drop(two);
    progress(20).await;
    // A replica is killed: its clusters go on from their new owners, which list
    // them afresh after the subscriber's position and carry it there by the
    // members' history: every change, no reset.
    let mut a = a;
    a.server.kill();
    split(&[&b, &c], &clusters, &log).await;
    progress(20).await;
    // A replica stops (SIGTERM): it hands its clusters over first.
    let mut b = b;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &b.server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    split(&[&c], &clusters, &log).await;
    progress(20).await;
    assert_eq!(
        seen.lock().unwrap().resets,
        0,
        "no cluster sent anew while its member holds the history"
    );

    // A replica joins, and the one holding more clusters is killed after its
    // members compacted their history past what the subscriber has: those clusters
    // alone are sent anew, each with an explicit reset.
    let d = Replica::start(&kubeconfig, "replica-d", &log);
    split(&[&c, &d], &clusters, &log).await;
    progress(20).await;
    let members = [c.identity.clone(), d.identity.clone()];
    let held_by = |r: &Replica| assigned(&clusters, &members, &r.identity);
    let (mut victim, survivor) = if held_by(&c).len() >= held_by(&d).len() {
        (c, d)
    } else {
        (d, c)
    };
    let lost = held_by(&victim);
    compact_behind_subscribers(&fleet, &lost).await;
    victim.server.kill();
    thaw(&fleet, &lost);
    split(&[&survivor], &clusters, &log).await;
    progress(20).await;
    churning.stop().await;

    // Once the changes stop, the subscriber holds exactly the clusters' truth.
    let ended = until_truth(
        "subscriber",
        &seen,
        || common::truth(&fleet, "configmaps"),
        &log,
    )
    .await;
    assert!(ended.resumes >= 1, "it resumed across the router killed");
    assert_eq!(
        ended.resets,
        lost.len(),
        "exactly the clusters whose history was gone ({lost:?}) were sent anew; log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    stop.cancel();
    subscriber.await.unwrap();
    let _ = b.server.child.wait();
    drop((survivor, one));
    fleet.shutdown().await;
}

/// The simulated cluster named `name`.
fn sim<'f>(fleet: &'f fleetscope_sim::SimFleet, name: &str) -> &'f fleetscope_sim::Cluster {
    fleet
        .servers()
        .iter()
        .map(|s| s.cluster())
        .find(|c| c.name() == name)
        .unwrap()
}

/// Freezes every watch of the `clusters` (nothing more reaches their owner, so no
/// subscriber's position passes the resourceVersion they stand at now), waits for
/// the churn to change each of them past it, then compacts their history: every
/// position a subscriber holds for them is gone. [`thaw`] lets the watches go on.
async fn compact_behind_subscribers(fleet: &fleetscope_sim::SimFleet, clusters: &[String]) {
    for name in clusters {
        let c = sim(fleet, name);
        c.freeze_watches(true);
        let frozen_at = c.store.resource_version();
        common::eventually("a change after the freeze", async || {
            c.store.resource_version() > frozen_at
        })
        .await;
        c.compact();
    }
}

/// Lets the watches [`compact_behind_subscribers`] froze go on.
fn thaw(fleet: &fleetscope_sim::SimFleet, clusters: &[String]) {
    for name in clusters {
        sim(fleet, name).freeze_watches(false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_where_its_cluster_went_away_and_came_back_misses_no_delete() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::Arc;
    let OneReplica {
        fleet,
        dir: _dir,
        kubeconfig,
        log,
        clusters,
        replica: a,
        router,
    } = one_replica(4, 10).await;

    let configmaps_in = async |cluster: &str| -> Api<ConfigMap> {
        Api::namespaced(common::kube_client(&kubeconfig, cluster).await, "team-1")
    };
    let named = |name: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    };
    for cluster in &clusters {
        let api = configmaps_in(cluster).await;
        for name in ["gone-while-elsewhere", "changed-while-elsewhere"] {
            api.create(&Default::default(), &named(name)).await.unwrap();
        }
    }

    // A subscriber takes every configmap from the one replica, then goes away with
    // its positions (as a client does between two runs).
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let subscriber = tokio::spawn(subscribe(vec![router.port], seen.clone(), stop.clone()));
    let truth = || common::truth(&fleet, "configmaps");
    until_truth("subscriber", &seen, truth, &log).await;
    // The first token, sent with the end of the initial objects, holds where each
    // cluster stands.
    common::eventually("a position token", async || {
        !seen.lock().unwrap().token.is_empty()
    })
    .await;
    stop.cancel();
    subscriber.await.unwrap();
    let changes = seen.lock().unwrap().changes;

    // A second replica takes some of the clusters, and while it holds them an object
    // of each is deleted, one modified and one created.
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    split(&[&a, &b], &clusters, &log).await;
    let members = [a.identity.clone(), b.identity.clone()];
    let moved = assigned(&clusters, &members, &b.identity);
    assert!(!moved.is_empty(), "the second replica takes a cluster");
    for cluster in &moved {
        let api = configmaps_in(cluster).await;
        api.delete("gone-while-elsewhere", &Default::default())
            .await
            .unwrap();
        let patch = serde_json::json!({"data": {"changed": "while elsewhere"}});
        let patch = kube::api::Patch::Merge(&patch);
        (api.patch("changed-while-elsewhere", &Default::default(), &patch)
            .await)
            .unwrap();
        api.create(&Default::default(), &named("made-while-elsewhere"))
            .await
            .unwrap();
    }
    // The second replica has them all before it goes.
    common::eventually("the router serves the changes", async || {
        let want: Vec<_> = truth().into_keys().collect();
        let mut listed = list_through(&[&router], 500).await.unwrap_or_default();
        listed.sort();
        listed == want
    })
    .await;

    // It stops and hands the clusters back to the first, which lists them afresh.
    let mut b = b;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &b.server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    split(&[&a], &clusters, &log).await;
    let _ = b.server.child.wait();

    // The subscriber comes back with positions the first replica's log holds from
    // before the clusters left it: it is carried by the members' history, so it is
    // sent the delete, the modification and the creation, and no cluster anew.
    let stop = tokio_util::sync::CancellationToken::new();
    let subscriber = tokio::spawn(subscribe(vec![router.port], seen.clone(), stop.clone()));
    let ended = until_truth("the resumed subscriber", &seen, truth, &log).await;
    let resumed = seen.lock().unwrap().changes - changes;
    assert_eq!(
        resumed,
        3 * moved.len(),
        "the three changes in each moved cluster, and nothing sent again: {:?}; log: {}",
        seen.lock().unwrap(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(
        ended.resets,
        0,
        "no cluster sent anew while its member holds the history; log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    stop.cancel();
    subscriber.await.unwrap();
    drop((a, router));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_owners_a_killed_replica_costs_a_routed_watch_no_reset_and_no_list() {
    use std::sync::Arc;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(4, 10).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=4).map(|i| format!("sim-{i}")).collect();
    let rf2 = ["--shard-replication", "2"];
    let replicas = [
        Replica::start_with(&kubeconfig, "replica-a", &log, &rf2),
        Replica::start_with(&kubeconfig, "replica-b", &log, &rf2),
        Replica::start_with(&kubeconfig, "replica-c", &log, &rf2),
    ];
    let one = RouterProcess::start(&kubeconfig, &log);
    let two = RouterProcess::start(&kubeconfig, &log);
    // Every cluster synced by both its owners.
    let members: Vec<String> = replicas.iter().map(|r| r.identity.clone()).collect();
    common::eventually(common::with_log("two owners each", &log), async || {
        let mut whole = true;
        for r in &replicas {
            let mut synced = r.synced().await.unwrap_or_default();
            synced.sort();
            let want: Vec<String> = clusters
                .iter()
                .filter(|c| {
                    fleetscope_ring::assign::owners(c, &members, 2).contains(&r.identity.as_str())
                })
                .cloned()
                .collect();
            whole &= synced == want;
        }
        whole
    })
    .await;
    // ... and both routers see both owners of every cluster.
    routers_see(&[&one, &two], clusters.len(), 2).await;

    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let subscriber = tokio::spawn(subscribe(
        vec![one.port, two.port],
        seen.clone(),
        stop.clone(),
    ));
    let churning = Churning::start(&kubeconfig, &clusters);
    let progress = |n: usize| churning.progress(&seen, n);
    progress(30).await;
    let [a, b, c] = replicas;
    let lists_before = (b.lists().await.unwrap(), c.lists().await.unwrap());
    // The replica serving the most clusters is killed: the other owner of each serves
    // them at once, from where the subscriber stands.
    let mut a = a;
    a.server.kill();
    // Before its Lease expires, a List through the routers (paged, each page from
    // the other router) still answers every cluster, from each one's other owner.
    let listed = list_through(&[&one, &two], 7)
        .await
        .expect("a List with one owner of every cluster killed");
    let listed: std::collections::BTreeSet<&str> =
        listed.iter().map(|(c, _, _)| c.as_str()).collect();
    assert_eq!(
        listed.len(),
        clusters.len(),
        "every cluster listed: {listed:?}"
    );
    progress(30).await;
    // The survivors are each other's second owner now: once they hold every cluster
    // twice over, the kill has been absorbed.
    common::eventually("b and c absorb a's clusters", async || {
        b.synced().await.map(|s| s.len()) == Some(4) && c.synced().await.map(|s| s.len()) == Some(4)
    })
    .await;
    progress(30).await;
    churning.stop().await;
    let ended = until_truth(
        "subscriber",
        &seen,
        || common::truth(&fleet, "configmaps"),
        &log,
    )
    .await;
    assert_eq!(
        ended.resets, 0,
        "a second owner held every cluster's history"
    );
    // The clusters the survivors held already were not listed again; those each took
    // up as a new second owner were (once each, by that replica).
    let lists_after = (b.lists().await.unwrap(), c.lists().await.unwrap());
    eprintln!("lists before the kill {lists_before:?}, after {lists_after:?}");
    let taken_up = |r: &Replica| {
        let survivors = ["replica-b".to_string(), "replica-c".to_string()];
        clusters
            .iter()
            .filter(|cl| {
                !fleetscope_ring::assign::owners(cl, &members, 2).contains(&r.identity.as_str())
                    && fleetscope_ring::assign::owners(cl, &survivors, 2)
                        .contains(&r.identity.as_str())
            })
            .count() as f64
    };
    assert_eq!(
        (
            lists_after.0 - lists_before.0,
            lists_after.1 - lists_before.1
        ),
        (taken_up(&b), taken_up(&c)),
        "only the clusters newly owned were listed"
    );
    stop.cancel();
    subscriber.await.unwrap();
    drop((b, c, one, two));
    fleet.shutdown().await;
}

/// The configmaps of the simulated fleet `where` selects, by (cluster, namespace,
/// name), with their resourceVersions.
fn truth_where(
    fleet: &fleetscope_sim::SimFleet,
    select: impl Fn(&str, &fleetscope_sim::store::StoredObject) -> bool,
) -> BTreeMap<(String, String, String), String> {
    let mut out = BTreeMap::new();
    for s in fleet.servers() {
        let snap = s
            .cluster()
            .store
            .snapshot("configmaps", fleetscope_sim::store::ReadAt::Latest)
            .unwrap();
        let cluster = s.cluster().name().to_string();
        for o in snap.objects.values() {
            if select(&cluster, o) {
                out.insert(
                    (cluster.clone(), o.namespace.clone(), o.name.clone()),
                    o.rv.to_string(),
                );
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_watches_stay_exact_while_the_ring_grows_and_shrinks_under_churn() {
    use std::sync::Arc;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(8, 6).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=8).map(|i| format!("sim-{i}")).collect();
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let c = Replica::start(&kubeconfig, "replica-c", &log);
    let one = RouterProcess::start(&kubeconfig, &log);
    let two = RouterProcess::start(&kubeconfig, &log);
    split(&[&a, &b, &c], &clusters, &log).await;
    routers_see(&[&one, &two], clusters.len(), 1).await;

    // Subscribers of everything, one cluster, a label selector, one namespace.
    let query = |clusters: &[&str], labels: &str, namespaces: &[&str]| fleetscope::proto::Query {
        resource: "configmaps".into(),
        clusters: clusters.iter().map(|c| c.to_string()).collect(),
        label_selector: labels.into(),
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    type Select = Box<dyn Fn(&str, &fleetscope_sim::store::StoredObject) -> bool>;
    let subscribers: Vec<(fleetscope::proto::Query, Select)> = vec![
        (query(&[], "", &[]), Box::new(|_, _| true)),
        (query(&["sim-2"], "", &[]), Box::new(|c, _| c == "sim-2")),
        (
            query(&[], "parity=even", &[]),
            Box::new(|_, o| o.labels.iter().any(|(k, v)| k == "parity" && v == "even")),
        ),
        (
            query(&[], "", &["team-1"]),
            Box::new(|_, o| o.namespace == "team-1"),
        ),
    ];
    let stop = tokio_util::sync::CancellationToken::new();
    let mut running = Vec::new();
    for (i, (q, select)) in subscribers.into_iter().enumerate() {
        let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
        let ports = if i % 2 == 0 {
            vec![one.port, two.port]
        } else {
            vec![two.port, one.port]
        };
        let task = tokio::spawn(subscribe_to(q, ports, seen.clone(), stop.clone()));
        running.push((seen, select, task));
    }
    let seen_all = running[0].0.clone();
    let churning = Churning::start(&kubeconfig, &clusters);
    let progress = |n: usize| churning.progress(&seen_all, n);
    progress(40).await;

    // 3 → 4: the fourth replica takes about a quarter of the clusters, and nothing
    // else moves; none is ever left without a ready owner on the way.
    let three: Vec<String> = ["replica-a", "replica-b", "replica-c"]
        .map(String::from)
        .to_vec();
    let four: Vec<String> = ["replica-a", "replica-b", "replica-c", "replica-d"]
        .map(String::from)
        .to_vec();
    let moving: Vec<&String> = clusters
        .iter()
        .filter(|cl| {
            fleetscope_ring::assign::owners(cl, &three, 1)
                != fleetscope_ring::assign::owners(cl, &four, 1)
        })
        .collect();
    assert!(
        moving
            .iter()
            .all(|cl| fleetscope_ring::assign::owners(cl, &four, 1) == ["replica-d"]),
        "only clusters d takes move"
    );
    let d = Replica::start(&kubeconfig, "replica-d", &log);
    split(&[&a, &b, &c, &d], &clusters, &log).await;
    eprintln!(
        "3 → 4 moved {} of {} clusters",
        moving.len(),
        clusters.len()
    );
    progress(40).await;
    // 4 → 3: d stops (SIGTERM) and hands its clusters back.
    let mut d = d;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &d.server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    split(&[&a, &b, &c], &clusters, &log).await;
    progress(40).await;
    churning.stop().await;

    for (i, (seen, select, _)) in running.iter().enumerate() {
        let name = format!("subscriber {i}");
        let ended = until_truth(&name, seen, || truth_where(&fleet, select), &log).await;
        // Every move is made before the old owner lets go, and the members hold the
        // history: no cluster is ever sent anew.
        assert_eq!(ended.resets, 0, "{name}");
    }
    stop.cancel();
    for (_, _, task) in running {
        task.await.unwrap();
    }
    let _ = d.server.child.wait();
    drop((a, b, c, one, two));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_paused_past_its_lease_never_serves_what_it_missed_as_current_and_confirms_its_quiet_clusters()
 {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(4, 6).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=4).map(|i| format!("sim-{i}")).collect();
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let one = RouterProcess::start(&kubeconfig, &log);
    split(&[&a, &b], &clusters, &log).await;
    routers_see(&[&one], clusters.len(), 1).await;
    let members = ["replica-a".to_string(), "replica-b".to_string()];
    let of_a: Vec<String> = clusters
        .iter()
        .filter(|c| fleetscope_ring::assign::owners(c, &members, 1) == ["replica-a"])
        .cloned()
        .collect();
    assert!(!of_a.is_empty());

    let signal = |sig: &str, pid: u32| {
        let sent = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    };
    let server = |name: &str| {
        fleet
            .servers()
            .iter()
            .find(|s| s.cluster().name() == name)
            .unwrap()
    };
    // a stops (SIGSTOP); its clusters (but the coordination cluster) change at once,
    // their watches frozen first: a's connections stay open and bring nothing. Once
    // a's lease has expired, b takes them up, listing what they hold now.
    signal("-STOP", a.server.child.id());
    let stale: Vec<String> = of_a.iter().filter(|c| *c != "sim-1").cloned().collect();
    assert!(!stale.is_empty(), "{of_a:?}");
    for c in &stale {
        server(c).cluster().freeze_watches(true);
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(common::kube_client(&kubeconfig, c).await, "team-1");
        for i in 0..3 {
            let cm = serde_json::from_value(
                serde_json::json!({"metadata": {"name": format!("while-stopped-{i}")}}),
            )
            .unwrap();
            api.create(&Default::default(), &cm).await.unwrap();
        }
    }
    common::eventually("b takes a's clusters", async || {
        b.synced().await.map(|s| s.len()) == Some(4)
    })
    .await;
    let truth: Vec<(String, String, String)> =
        common::truth(&fleet, "configmaps").into_keys().collect();
    common::eventually("whole through b", async || {
        list_through(&[&one], 50).await.ok().as_ref() == Some(&truth)
    })
    .await;

    // a continues and renews its Lease: it is a member again, but what it holds of
    // those clusters is what it held before it stopped. Through the router every
    // answer is the truth (from b) or retryable, never a's stale copy.
    signal("-CONT", a.server.child.id());
    common::eventually("a renews", async || {
        a.metric("fleetscope_shard_fenced").await == Some(0.0)
            && a.metric("fleetscope_shard_members").await == Some(2.0)
    })
    .await;
    let mut answers = 0;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while answers < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{answers} whole answers within {PATIENCE:?}"
        );
        match list_marked_through(&[&one], 50).await {
            // Said to be partial (a's clusters not confirmed yet): honest, not whole.
            Ok((_, true)) => {}
            Ok((listed, false)) => {
                assert_eq!(
                    listed, truth,
                    "an answer from a's copy, stale since it stopped"
                );
                answers += 1;
            }
            Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // a confirms each of its streams itself (a consistent list, diffed against what
    // it holds) and takes its clusters back: no change, no bookmark, and its watches
    // still frozen, so that nothing but its own list can confirm them.
    split(&[&a, &b], &clusters, &log).await;
    common::eventually("whole again", async || {
        list_through(&[&one], 50).await.ok().as_ref() == Some(&truth)
    })
    .await;
    let confirmed = common::scrape(&a.metrics).await.unwrap_or_default();
    assert!(
        confirmed
            .lines()
            .any(|l| l.starts_with("fleetscope_relists_total{")
                && l.contains("reason=\"confirm\"")
                && !l.ends_with(" 0")),
        "a confirmed no stream by a list: {confirmed}"
    );
    // Thawed, and changed: a serves the change.
    for c in &stale {
        server(c).cluster().freeze_watches(false);
    }
    for c in &of_a {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(common::kube_client(&kubeconfig, c).await, "team-1");
        let cm =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "after"}})).unwrap();
        api.create(&Default::default(), &cm).await.unwrap();
    }
    let truth: Vec<(String, String, String)> =
        common::truth(&fleet, "configmaps").into_keys().collect();
    common::eventually("whole again", async || {
        list_through(&[&one], 50).await.ok().as_ref() == Some(&truth)
    })
    .await;
    drop((a, b, one));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_edited_to_garbage_or_raced_leave_the_ring_whole() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(6, 4).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=6).map(|i| format!("sim-{i}")).collect();
    let mut replicas = vec![
        Replica::start(&kubeconfig, "replica-a", &log),
        Replica::start(&kubeconfig, "replica-b", &log),
        Replica::start(&kubeconfig, "replica-c", &log),
    ];
    let one = RouterProcess::start(&kubeconfig, &log);
    split(&[&replicas[0], &replicas[1], &replicas[2]], &clusters, &log).await;
    routers_see(&[&one], clusters.len(), 1).await;
    let total = common::truth(&fleet, "configmaps").len() as u64;
    let leases: Api<Lease> =
        Api::namespaced(common::kube_client(&kubeconfig, "sim-1").await, "default");

    // A Lease of the ring made by hand, full of garbage: a holder nobody runs, an
    // address that is none, clusters claimed ready that it does not hold.
    let bogus: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{RING}-bogus"),
            "labels": {"fleetscope.io/ring": RING},
            "annotations": {
                "fleetscope.io/address": "not an address",
                "fleetscope.io/ready": "sim-1,,%%%,sim-99",
                "fleetscope.io/held": "\u{0}garbage",
                "fleetscope.io/instance": "?"
            }
        },
        "spec": {"holderIdentity": "bogus", "leaseDurationSeconds": 3,
                 "renewTime": "2020-01-01T00:00:00.000000Z"}
    }))
    .unwrap();
    leases.create(&Default::default(), &bogus).await.unwrap();
    // A ghost written once, claiming to live two billion seconds and every cluster
    // ready: counted for the ring's own lease duration at most, then dead.
    let ghost: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{RING}-ghost"),
            "labels": {"fleetscope.io/ring": RING},
            "annotations": {"fleetscope.io/address": "", "fleetscope.io/ready": clusters.join(",")}
        },
        "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 2_000_000_000}
    }))
    .unwrap();
    leases.create(&Default::default(), &ghost).await.unwrap();
    // A copy of replica-a's identity under another name, with replica-b's address:
    // a Lease counts only under the name the ring gives its identity.
    let copy: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{RING}-replica-aaa"),
            "labels": {"fleetscope.io/ring": RING},
            "annotations": {"fleetscope.io/address": replicas[1].advertise, "fleetscope.io/ready": clusters.join(",")}
        },
        "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 2_000_000_000}
    }))
    .unwrap();
    leases.create(&Default::default(), &copy).await.unwrap();
    let written = tokio::time::Instant::now();
    // replica-a's own Lease edited to garbage: its annotations and duration.
    let name = format!("{RING}-replica-a");
    let mut own = leases.get(&name).await.unwrap();
    own.metadata.annotations = Some(
        [
            ("fleetscope.io/address", "::::"),
            ("fleetscope.io/ready", ",,,"),
            ("fleetscope.io/instance", "not-its-own"),
            ("fleetscope.io/leaving", "maybe"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    if let Some(spec) = own.spec.as_mut() {
        spec.lease_duration_seconds = Some(0);
    }
    leases
        .replace(&name, &Default::default(), &own)
        .await
        .unwrap();

    // Races under load: replica-b's Lease changed under it again and again (each
    // change makes its next renewal a conflict, never an overwrite).
    let raced = format!("{RING}-replica-b");
    for i in 0..20 {
        let mut l = leases.get(&raced).await.unwrap();
        l.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("touched".into(), i.to_string());
        let _ = leases.replace(&raced, &Default::default(), &l).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Nothing crashes, and the ring is whole again: every replica holds its share,
    // every configmap is counted through the router.
    for r in &mut replicas {
        r.server.assert_running(&log);
    }
    split(&[&replicas[0], &replicas[1], &replicas[2]], &clusters, &log).await;
    common::eventually(common::with_log("whole again", &log), async || {
        let counted = one
            .client()
            .await
            .count(fleetscope::proto::CountRequest {
                query: Some(configmaps_query()),
                group_by: vec![],
            })
            .await;
        if let Ok(c) = &counted
            && c.get_ref().total == total
            && !c.get_ref().partial
        {
            Ok(())
        } else {
            Err(counted)
        }
    })
    .await;
    // Past the ring's lease duration from the ghost's write, every replica counts the
    // three of them alone: neither the ghost nor the copy is a member.
    common::eventually("three members as each replica counts them", async || {
        let mut members = Vec::new();
        for r in &replicas {
            members.push(common::sample(&r.metrics, "fleetscope_shard_members").await);
        }
        if written.elapsed() > Duration::from_secs(4) && members.iter().all(|m| *m == Some(3)) {
            Ok(())
        } else {
            Err(members)
        }
    })
    .await;
    // Every cluster listed through the router, by its real owner.
    let listed = one
        .client()
        .await
        .list_clusters(fleetscope::proto::ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.clusters.len(), clusters.len(), "{listed:?}");
    // replica-a's Lease is its own again.
    let own = leases.get(&name).await.unwrap();
    let annotations = own.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("fleetscope.io/address").map(String::as_str),
        Some(replicas[0].advertise.as_str()),
        "{annotations:?}"
    );
    drop((replicas, one));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordination_cluster_s_expiring_exec_credential_is_renewed_ahead_of_expiry() {
    use std::os::unix::fs::PermissionsExt;
    let (fleet, dir, _) = common::fleet_with_kubeconfig(1, 0).await;
    let log = dir.path().join("router.log");
    // The coordination cluster's user runs a plugin that counts its runs and gives
    // the cluster's token, expiring in 65 s: it is run again about 10 s after start.
    let runs = dir.path().join("runs");
    let mut contexts = fleet.contexts();
    let token = contexts[0].token.clone();
    let plugin = dir.path().join("credential.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\necho run >> {runs}\nexp=$(date -u -d '+65 seconds' +%Y-%m-%dT%H:%M:%SZ)\nprintf '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{token}\",\"expirationTimestamp\":\"%s\"}}}}' \"$exp\"\n",
            runs = runs.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    contexts.truncate(1);
    let mut kc = fleetscope_sim::kubeconfig(&contexts);
    kc["users"][0]["user"] = serde_json::json!({
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": plugin.display().to_string(),
            "interactiveMode": "Never",
        }
    });
    let kubeconfig = dir.path().join("exec.kubeconfig");
    std::fs::write(&kubeconfig, kc.to_string()).unwrap();
    std::fs::write(kubeconfig.with_file_name("page-token.key"), [7u8; 32]).unwrap();
    let one = RouterProcess::start(&kubeconfig, &log);
    let count = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    common::eventually(
        common::with_log("the credential renewed", &log),
        async || count() >= 2,
    )
    .await;
    // The router reads the ring's Leases with it, before and after (no replica runs:
    // it says it has read them and found none).
    common::eventually("the router says no replica published one yet", async || {
        let answer = one
            .client()
            .await
            .list_clusters(fleetscope::proto::ListClustersRequest::default())
            .await;
        match &answer {
            Err(s) if s.message().contains("no replica has published one yet") => Ok(()),
            _ => Err(answer),
        }
    })
    .await;
    drop(one);
    fleet.shutdown().await;
}

/// Kills a process group when dropped: whatever a script left running.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        // Signalled directly: procps-ng 4.0.2's kill misreads a process group
        // (`kill -KILL -999999` signals group 9, `-1`-like ones everything).
        if let Some(group) = i32::try_from(self.0)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// A four-digit prefix `p` other than `not` such that ports `p1` to `pN` are free,
/// below the ephemeral range (from 32768).
fn free_prefix(n: u16, not: u16) -> u16 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos()
        ^ std::process::id();
    (0..1200u16)
        .map(|i| 2000 + (seed as u16 % 1200 + i) % 1200)
        .filter(|p| *p != not)
        .find(|p| (1..=n).all(|i| std::net::TcpListener::bind(("127.0.0.1", p * 10 + i)).is_ok()))
        .expect("free ports below the ephemeral range")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_on_one_machine_runs_as_docs_scaling_md_writes_it() {
    use std::os::unix::process::CommandExt;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/scaling.md")).unwrap();
    let from = doc
        .find("Three replicas and two routers on one machine")
        .expect("docs/scaling.md shows a ring on one machine");
    let block = &doc[from..];
    let block = &block[block.find("```sh\n").unwrap() + "```sh\n".len()..];
    let block = &block[..block.find("```").unwrap()];
    // As written, with its files in a directory of its own and this build as
    // `fleetscope`.
    let dir = tempfile::tempdir().unwrap();
    // Its ports (5005N for replicas, 5006N for routers) moved below the ephemeral
    // range, where no other test's processes are given one, to ports free now.
    let replicas = free_prefix(3, 0);
    let routers = free_prefix(2, replicas);
    let script = block
        .replace("/tmp/", &format!("{}/", dir.path().display()))
        .replace("5005", &replicas.to_string())
        .replace("5006", &routers.to_string());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(common::process::BIN, bin.join("fleetscope")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = dir.path().join("out");
    let log = dir.path().join("log");
    let mut sh = std::process::Command::new("sh")
        .arg("-ec")
        .arg(&script)
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let _group = Group(sh.id());
    let what = common::with_log("the script ends", &log);
    let status =
        common::eventually_within(2 * PATIENCE, what, async || sh.try_wait().unwrap()).await;
    let printed = std::fs::read_to_string(&out).unwrap();
    assert!(
        status.success(),
        "the script failed ({status}): {printed}; log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Replica 1 lists what it holds; the router lists every cluster (-o wide) and
    // counts each one's configmaps.
    for i in 1..=6 {
        let name = format!("sim-{i}");
        let rows = printed.lines().filter(|l| l.starts_with(&*name)).count();
        assert!(
            rows >= 2,
            "{name} listed and counted through a router: {printed}"
        );
    }

    // `get -w` through a router: what is there, then each change as it comes.
    let kubeconfig = dir.path().join("fleet.kubeconfig");
    let configmaps = |cluster: &str| {
        let kubeconfig = kubeconfig.clone();
        let cluster = cluster.to_string();
        async move {
            kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
                common::kube_client(&kubeconfig, &cluster).await,
                "default",
            )
        }
    };
    let made = |name: &str| {
        serde_json::from_value::<k8s_openapi::api::core::v1::ConfigMap>(
            serde_json::json!({"metadata": {"name": name}}),
        )
        .unwrap()
    };
    configmaps("sim-2")
        .await
        .create(&Default::default(), &made("before-the-watch"))
        .await
        .unwrap();
    let mut get = std::process::Command::new(common::process::BIN)
        .args(["get", "configmaps", "-n", "default", "-w", "-o", "name"])
        .args(["--server", &format!("127.0.0.1:{routers}1")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("get.err")).unwrap())
        .spawn()
        .unwrap();
    let lines = {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let out = get.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        rx
    };
    let printed = |name: &str| {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(name) => return,
                Ok(_) => {}
                Err(e) => panic!(
                    "get -w never printed {name} ({e}); stderr: {}",
                    std::fs::read_to_string(dir.path().join("get.err")).unwrap_or_default()
                ),
            }
        }
    };
    printed("configmap/before-the-watch");
    configmaps("sim-3")
        .await
        .create(&Default::default(), &made("while-watched"))
        .await
        .unwrap();
    printed("configmap/while-watched");
    let _ = get.kill();
    let _ = get.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_costs_a_routed_request_the_replica_timeout_then_its_next_holder_answers()
{
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(3, 10).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=3).map(|i| format!("sim-{i}")).collect();
    // Two owners of every cluster, and a lease far longer than anything waited for
    // here: a stopped replica stays a member throughout.
    let more = [
        "--shard-replication",
        "2",
        "--shard-lease-duration",
        "120s",
        "--shard-renew-period",
        "1s",
    ];
    let a = Replica::start_with(&kubeconfig, "replica-a", &log, &more);
    let b = Replica::start_with(&kubeconfig, "replica-b", &log, &more);
    let router = RouterProcess::start_with(
        &kubeconfig,
        &log,
        &["--shard-lease-duration", "120s", "--replica-timeout", "1s"],
    );
    routers_see(&[&router], clusters.len(), 2).await;
    let total = common::truth(&fleet, "configmaps").len() as u64;
    let count = async || {
        let mut request = tonic::Request::new(fleetscope::proto::CountRequest {
            query: Some(configmaps_query()),
            group_by: vec![],
        });
        // Well under the lease: only a fall-back to the next holder answers in time.
        request.set_timeout(Duration::from_secs(20));
        router
            .client()
            .await
            .count(request)
            .await
            .map(tonic::Response::into_inner)
    };
    common::eventually("whole before the stop", async || {
        count().await.map(|c| c.total).ok() == Some(total)
    })
    .await;
    // Each replica stopped in turn: every cluster is answered by its other owner.
    for stopped in [&a, &b] {
        let pid = stopped.server.child.id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap();
        assert!(status.success());
        for _ in 0..3 {
            let answer = count().await.expect("answered by the next holders");
            assert_eq!((answer.total, answer.partial), (total, false), "{answer:?}");
        }
        let status = std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }
    drop((a, b, router));
    fleet.shutdown().await;
}

/// A Lease as anyone with write access to the ring's namespace may write it.
fn forged_lease(name: &str, holder: &str, annotations: serde_json::Value) -> Lease {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": {"fleetscope.io/ring": RING},
            "annotations": annotations,
        },
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 2_000_000_000}
    }))
    .unwrap()
}

/// Asks `router` for a Count of every configmap and the ring's clusters.
async fn whole_answers(
    router: &RouterProcess,
) -> Result<
    (
        fleetscope::proto::CountResponse,
        fleetscope::proto::ListClustersResponse,
    ),
    tonic::Status,
> {
    let mut c = router.client().await;
    let count = c
        .count(fleetscope::proto::CountRequest {
            query: Some(configmaps_query()),
            group_by: vec![],
        })
        .await?
        .into_inner();
    let clusters = c
        .list_clusters(fleetscope::proto::ListClustersRequest::default())
        .await?
        .into_inner();
    Ok((count, clusters))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_written_by_anyone_but_the_ring_move_nothing_and_a_router_with_another_key_says_so()
{
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(4, 3).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=4).map(|i| format!("sim-{i}")).collect();
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let router = RouterProcess::start(&kubeconfig, &log);
    split(&[&a, &b], &clusters, &log).await;
    routers_see(&[&router], clusters.len(), 1).await;
    let total = common::truth(&fleet, "configmaps").len() as u64;
    let moves = |r: &Replica| {
        let metrics = r.metrics.clone();
        async move { common::sample(&metrics, "fleetscope_shard_moves").await }
    };
    let moved_before = (moves(&a).await, moves(&b).await);
    let leases: Api<Lease> =
        Api::namespaced(common::kube_client(&kubeconfig, "sim-1").await, "default");

    // A ghost written once: alive "two billion seconds", every cluster ready, and
    // clusters nobody configured, as the ring's and as unowned.
    let phantoms: Vec<String> = (0..2000).map(|i| format!("phantom-{i}")).collect();
    let ghost = forged_lease(
        &format!("{RING}-ghost"),
        "ghost",
        serde_json::json!({
            "fleetscope.io/address": "",
            "fleetscope.io/ready": clusters.join(","),
            "fleetscope.io/clusters": phantoms.join(","),
            "fleetscope.io/unowned": phantoms.join(","),
            "fleetscope.io/signed-at": u64::MAX.to_string(),
            "fleetscope.io/signature": "AAAA",
        }),
    );
    leases.create(&Default::default(), &ghost).await.unwrap();
    // replica-a's own Lease rewritten, again and again, by someone without the key:
    // its readiness claimed for every cluster, replica-b's address, another
    // instance of its identity (which a real twin would be).
    let own = format!("{RING}-replica-a");
    let forge_own = async {
        let started = tokio::time::Instant::now();
        let mut written = 0;
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(mut l) = leases.get(&own).await {
                let annotations = l.metadata.annotations.get_or_insert_with(Default::default);
                annotations.insert("fleetscope.io/address".into(), b.advertise.clone());
                annotations.insert("fleetscope.io/ready".into(), clusters.join(","));
                annotations.insert("fleetscope.io/instance".into(), "twin".into());
                if leases.replace(&own, &Default::default(), &l).await.is_ok() {
                    written += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        written
    };
    // Meanwhile, and for three lease durations, every answer through the router is
    // whole: every cluster listed, every configmap counted, nothing partial.
    let watch_answers = async {
        let started = tokio::time::Instant::now();
        let mut asked = 0;
        while started.elapsed() < Duration::from_secs(10) {
            let (count, listed) = whole_answers(&router).await.unwrap_or_else(|e| {
                panic!(
                    "the router failed while Leases were forged: {e:?}; log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
            let names: Vec<&str> = listed.clusters.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, clusters, "{listed:?}");
            assert!(
                count.total == total && !count.partial,
                "an answer was not whole while Leases were forged: {count:?}"
            );
            asked += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        asked
    };
    let (written, asked) = tokio::join!(forge_own, watch_answers);
    assert!(
        written > 5 && asked > 20,
        "forged {written} times, asked {asked} times"
    );
    // No replica took up or let go a cluster, and none was fenced or stopped.
    assert_eq!((moves(&a).await, moves(&b).await), moved_before);
    for r in [&a, &b] {
        assert_eq!(
            common::sample(&r.metrics, "fleetscope_shard_fenced").await,
            Some(0)
        );
        assert_eq!(
            common::sample(&r.metrics, "fleetscope_shard_members").await,
            Some(2)
        );
    }

    // A router given another key than the replicas' takes none of their Leases, and
    // says so, retryably, instead of reading the fleet as empty.
    let other_key = dir.path().join("other.key");
    std::fs::write(&other_key, [9u8; 32]).unwrap();
    let other_dir = dir.path().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other_kubeconfig = other_dir.join("kubeconfig");
    std::fs::copy(&kubeconfig, &other_kubeconfig).unwrap();
    std::fs::copy(&other_key, other_dir.join("page-token.key")).unwrap();
    let wrong = RouterProcess::start(&other_kubeconfig, &log);
    let what = "a router with another key says why it serves nothing";
    let refused = common::eventually(what, async || match whole_answers(&wrong).await {
        Err(s) if s.message().contains("not taken") => Ok(s),
        other => Err(other),
    })
    .await;
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("--shard-page-token-key-file"),
        "{refused:?}"
    );
    drop((a, b, router, wrong));
    fleet.shutdown().await;
}

/// What a poller of a router saw: answers whole, answers partial, and every answer
/// that left a cluster out while claiming to be whole, or failed.
#[derive(Default, Debug)]
struct Answers {
    whole: usize,
    partial: usize,
    violations: Vec<String>,
}

/// Asks `router` for a Count and ListClusters until `stop`, checking each answer
/// against the fleet's `total` configmaps and `clusters`.
async fn poll_answers(
    router: &RouterProcess,
    total: u64,
    clusters: &[String],
    stop: tokio_util::sync::CancellationToken,
) -> Answers {
    let mut seen = Answers::default();
    while !stop.is_cancelled() {
        match whole_answers(router).await {
            Err(e) => seen.violations.push(format!("failed: {e:?}")),
            Ok((count, listed)) => {
                let names: Vec<&str> = listed.clusters.iter().map(|c| c.name.as_str()).collect();
                if names != clusters {
                    seen.violations
                        .push(format!("ListClusters left clusters out: {names:?}"));
                }
                let missing: Vec<&str> = count
                    .clusters
                    .iter()
                    .filter(|c| c.freshness != fleetscope::proto::Freshness::Synced as i32)
                    .map(|c| c.cluster.as_str())
                    .collect();
                if count.partial {
                    seen.partial += 1;
                    if missing.is_empty() {
                        seen.violations
                            .push(format!("partial without a cluster not current: {count:?}"));
                    }
                } else if count.total == total {
                    seen.whole += 1;
                } else {
                    seen.violations
                        .push(format!("{} of {total}, partial=false", count.total));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_between_owners_or_in_a_coordination_outage_is_reported_unserved_never_left_out()
{
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(6, 3).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=6).map(|i| format!("sim-{i}")).collect();
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let mut c = Replica::start(&kubeconfig, "replica-c", &log);
    let router = RouterProcess::start(&kubeconfig, &log);
    split(&[&a, &b, &c], &clusters, &log).await;
    routers_see(&[&router], clusters.len(), 1).await;
    let total = common::truth(&fleet, "configmaps").len() as u64;
    let stop = tokio_util::sync::CancellationToken::new();
    let faults = async {
        // A kill: c's clusters are between owners until its Lease expires and the
        // others take them up.
        c.server.kill();
        split(&[&a, &b], &clusters, &log).await;
        routers_see(&[&router], clusters.len(), 1).await;
        // The coordination cluster away past the lease: every replica fenced, every
        // Lease expired by the router's clock.
        let coordination = &fleet.servers()[0];
        coordination.go_offline().await;
        let what = "the router reports every cluster unserved during the outage";
        common::eventually(what, async || {
            matches!(whole_answers(&router).await, Ok((count, _))
                if count.partial && count.total == 0 && count.clusters.len() == clusters.len())
        })
        .await;
        coordination.come_online().await.unwrap();
        split(&[&a, &b], &clusters, &log).await;
        routers_see(&[&router], clusters.len(), 1).await;
        stop.cancel();
    };
    let (seen, ()) = tokio::join!(
        poll_answers(&router, total, &clusters, stop.clone()),
        faults
    );
    assert!(
        seen.violations.is_empty(),
        "{} answers left clusters out or failed (of {} whole, {} partial), first: {:?}",
        seen.violations.len(),
        seen.whole,
        seen.partial,
        seen.violations.first()
    );
    assert!(seen.partial > 0, "{seen:?}");
    // And once the faults are over, whole again: every object, every cluster current.
    let what = "the router answers whole once the faults are over";
    common::eventually(what, async || {
        matches!(whole_answers(&router).await, Ok((count, listed))
            if !count.partial && count.total == total && listed.clusters.len() == clusters.len())
    })
    .await;
    drop((a, b, c, router));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_interrupted_by_a_kill_costs_a_routed_watch_no_repeat_and_no_lost_delete() {
    use std::sync::Arc;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(4, 8).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=4).map(|i| format!("sim-{i}")).collect();
    let mut a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let router = RouterProcess::start(&kubeconfig, &log);
    split(&[&a, &b], &clusters, &log).await;
    routers_see(&[&router], clusters.len(), 1).await;
    let members = [a.identity.clone(), b.identity.clone()];
    let of_a = assigned(&clusters, &members, &a.identity);
    assert!(!of_a.is_empty());

    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let subscriber = tokio::spawn(subscribe(vec![router.port], seen.clone(), stop.clone()));
    let churning = Churning::start(&kubeconfig, &clusters);
    let progress = |n: usize| churning.progress(&seen, n);
    progress(10).await;
    for round in 0..3 {
        // a is killed: b takes its clusters up.
        a.server.kill();
        split(&[&b], &clusters, &log).await;
        progress(10).await;
        // a returns and takes them back; b lets them go as soon as a holds them
        // ready, and a is killed right then, before the router has moved.
        a = Replica::start(&kubeconfig, "replica-a", &log);
        common::eventually(
            format!("round {round}: a takes its clusters back"),
            async || {
                let held_by_b = b.synced().await.unwrap_or_default();
                of_a.iter().any(|c| !held_by_b.contains(c))
            },
        )
        .await;
        a.server.kill();
        split(&[&b], &clusters, &log).await;
        progress(10).await;
    }
    churning.stop().await;
    // While a's clusters were followed from no replica (a killed, its Lease not yet
    // expired), the subscriber was told so, and told again when they were served.
    {
        use fleetscope::proto::Freshness;
        let s = seen.lock().unwrap();
        for c in &of_a {
            let of_c: Vec<&(String, i32, String)> =
                s.statuses.iter().filter(|(n, _, _)| n == c).collect();
            let stale = of_c
                .iter()
                .position(|(_, f, _)| *f == Freshness::Stale as i32);
            let again = of_c.iter().rposition(|(_, f, m)| {
                *f == Freshness::Synced as i32 && m.contains("served again")
            });
            assert!(
                stale.is_some() && again.is_some() && stale < again,
                "{c}: statuses {of_c:?}"
            );
        }
    }
    // Once the changes stop, the subscriber holds exactly the clusters' truth: no
    // change repeated or out of order, none of no position outside a reset, and no
    // delete lost.
    until_truth(
        "subscriber",
        &seen,
        || common::truth(&fleet, "configmaps"),
        &log,
    )
    .await;
    stop.cancel();
    subscriber.await.unwrap();
    drop((a, b, router));
    fleet.shutdown().await;
}

/// TCP connections established to the local `port`, as the kernel lists them.
fn established_to(port: u16) -> usize {
    let wanted = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local address, remote address, state (01: established).
            f.len() > 3 && f[1].ends_with(&wanted) && f[3] == "01"
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_s_thousand_watches_through_a_router_leave_room_for_everyone_else() {
    let OneReplica {
        fleet,
        dir: _dir,
        kubeconfig: _,
        log: _,
        clusters,
        replica: a,
        router,
    } = one_replica(2, 3).await;
    let total = common::truth(&fleet, "configmaps").len() as u64;
    // One caller's 1,000 Watches (its limit) of as many queries, over two
    // connections to the router: each a stream from the router to the replica for
    // as long as it runs (Watches of one query would share one).
    let url = format!("http://127.0.0.1:{}", router.port);
    let mut channels = Vec::new();
    for _ in 0..2 {
        channels.push(
            tonic::transport::Endpoint::from_shared(url.clone())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    let mut watches = Vec::new();
    for i in 0..1000 {
        let mut c = fleetscope::proto::fleet_client::FleetClient::new(channels[i % 2].clone());
        let mut stream = c
            .watch(fleetscope::proto::WatchRequest {
                query: Some(fleetscope::proto::Query {
                    label_selector: format!("!absent-{i}"),
                    ..configmaps_query()
                }),
                send_initial_events: true,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("watch {i}: {e:?}"))
            .into_inner();
        // Started: its initial objects come, then their end.
        loop {
            let e = tokio::time::timeout(PATIENCE, stream.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if e.r#type == fleetscope::proto::EventType::InitialEventsEnd as i32 {
                break;
            }
        }
        watches.push(stream);
    }
    // Everyone else's calls, many at once, are answered whole.
    let mut other = router.client().await;
    // The router carries them on several connections to the replica (at most
    // 100 calls each), not on one a caller could fill.
    let port: u16 = a.advertise.rsplit_once(':').unwrap().1.parse().unwrap();
    let connections = established_to(port);
    assert!(
        connections >= 10,
        "the router's connections to the replica: {connections}"
    );
    let counts = (0..300).map(|_| {
        let mut c = other.clone();
        async move {
            c.count(fleetscope::proto::CountRequest {
                query: Some(configmaps_query()),
                group_by: vec![],
            })
            .await
        }
    });
    for answer in futures::future::join_all(counts).await {
        let answer = answer.unwrap().into_inner();
        assert!(
            answer.total == total && !answer.partial,
            "a call starved by one caller's Watches: {answer:?}"
        );
    }
    let got = other
        .list_clusters(fleetscope::proto::ListClustersRequest::default())
        .await
        .unwrap();
    assert_eq!(got.into_inner().clusters.len(), clusters.len());
    drop(watches);
    drop((a, router));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_s_watches_of_one_query_through_a_router_read_one_stream_and_each_stays_exact() {
    use std::sync::{Arc, Mutex};
    let OneReplica {
        fleet,
        dir: _dir,
        kubeconfig,
        log,
        clusters,
        replica: a,
        router,
    } = one_replica(2, 3).await;
    let churning = Churning::start(&kubeconfig, &clusters);
    // Six subscribers, each from its initial objects, then resuming from its tokens.
    let stop = tokio_util::sync::CancellationToken::new();
    let seen: Vec<Arc<Mutex<Seen>>> = (0..6).map(|_| Arc::default()).collect();
    let mut tasks: Vec<_> = seen
        .iter()
        .map(|s| tokio::spawn(subscribe(vec![router.port], s.clone(), stop.clone())))
        .collect();
    // And six more Watches from now.
    let from_now: Vec<Arc<Mutex<BTreeMap<String, usize>>>> =
        (0..6).map(|_| Arc::default()).collect();
    for counted in &from_now {
        let mut client = router.client().await;
        let mut stream = client
            .watch(fleetscope::proto::WatchRequest {
                query: Some(configmaps_query()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let (counted, stop) = (counted.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let e = tokio::select! {
                    () = stop.cancelled() => return,
                    e = stream.message() => e,
                };
                let Ok(Some(e)) = e else { return };
                if let Some(o) = e.object {
                    *counted.lock().unwrap().entry(o.cluster).or_default() += 1;
                }
            }
        }));
    }
    for s in &seen {
        churning.progress(s, 20).await;
    }
    // Once their initial objects are sent, all twelve read one stream from the
    // replica: the router's.
    let what = common::with_log("the replica serves the router one Watch for all", &log);
    common::eventually(what, async || {
        match common::sample(&a.metrics, "fleetscope_watch_subscribers").await {
            Some(1) => Ok(()),
            other => Err(other),
        }
    })
    .await;
    churning.progress(&seen[0], 40).await;
    churning.stop().await;
    let truth = || common::truth(&fleet, "configmaps");
    for (i, s) in seen.iter().enumerate() {
        until_truth(&format!("subscriber {i}"), s, truth, &log).await;
    }
    // The Watches from now received changes of every cluster.
    for counted in &from_now {
        let counted = counted.lock().unwrap();
        assert!(
            clusters
                .iter()
                .all(|c| counted.get(c).is_some_and(|n| *n > 0)),
            "a Watch from now: {counted:?}"
        );
    }
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    drop((a, router));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_has_its_own_metrics_readiness_and_limits() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(3, 2).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=3).map(|i| format!("sim-{i}")).collect();
    let metrics = format!("127.0.0.1:{}", common::process::free_port());
    let kube_api = format!("127.0.0.1:{}", common::process::free_port());
    // Before any replica runs, the router is live and not ready, and says why.
    std::fs::write(kubeconfig.with_file_name("page-token.key"), [7u8; 32]).unwrap();
    let router = RouterProcess::start_with(
        &kubeconfig,
        &log,
        &[
            "--shard-lease-duration",
            "3s",
            "--metrics-listen",
            &metrics,
            "--kube-api-listen",
            &kube_api,
            "--grpc-max-watches-per-caller",
            "2",
        ],
    );
    let not_ready =
        common::eventually(
            "/readyz says no replica published",
            async || match common::http_get(&metrics, "/readyz").await {
                Some((503, body)) if body.contains("no replica has published one yet") => Ok(body),
                other => Err(other),
            },
        )
        .await;
    assert!(
        not_ready.contains("no replica has published one yet"),
        "{not_ready}"
    );
    assert_eq!(
        common::http_get(&metrics, "/livez").await.map(|(c, _)| c),
        Some(200)
    );
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    split(&[&a, &b], &clusters, &log).await;
    routers_see(&[&router], clusters.len(), 1).await;
    assert_eq!(
        common::http_get(&metrics, "/readyz").await.map(|(c, _)| c),
        Some(200)
    );
    // Its per-caller limit: a third Watch of one caller is refused.
    let mut c = router.client().await;
    let watch = || fleetscope::proto::WatchRequest {
        query: Some(configmaps_query()),
        ..Default::default()
    };
    let first = c.watch(watch()).await.unwrap();
    let second = c.watch(watch()).await.unwrap();
    let third = c.watch(watch()).await.map(|_| ()).unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third:?}");
    // Its series: the ring as it sees it, each replica's calls, its gRPC server's.
    let text = common::scrape(&metrics).await.unwrap();
    let value = |series: &str| common::sample_in(&text, series);
    assert_eq!(value("fleetscope_router_members"), Some(2.0), "{text}");
    assert_eq!(
        value("fleetscope_router_clusters_unserved"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        value("fleetscope_router_leases_refused"),
        Some(0.0),
        "{text}"
    );
    for replica in ["replica-a", "replica-b"] {
        let calls = text
            .lines()
            .find(|l| {
                l.starts_with("fleetscope_router_replica_request_duration_seconds_count{")
                    && l.contains(&format!("replica=\"{replica}\""))
            })
            .unwrap_or_else(|| panic!("no calls of {replica}: {text}"));
        assert!(!calls.ends_with(" 0"), "{calls}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("fleetscope_router_replica_calls_open{") && !l.ends_with(" 0")),
        "the open Watches hold their places: {text}"
    );
    assert!(
        text.contains("fleetscope_grpc_server_handled_total"),
        "{text}"
    );
    // The Kubernetes API over the ring's fleet: every configmap, each annotated with
    // its cluster.
    let (code, body) = common::http_get(&kube_api, "/clusters/*/api/v1/configmaps")
        .await
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(
        (code, items.len()),
        (200, common::truth(&fleet, "configmaps").len()),
        "{body}"
    );
    assert!(
        items.iter().all(|o| {
            let m = &o["metadata"];
            let cluster = m["annotations"]["fleetscope.io/cluster"]
                .as_str()
                .unwrap_or("?");
            m["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("{cluster}:")))
        }),
        "{body}"
    );
    // It holds no store, and says so (each replica keeps its own).
    let store = c
        .get_store(fleetscope::proto::GetStoreRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        !store.persisted && store.router_of_ring == RING,
        "{store:?}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleetscope"))
        .args([
            "store",
            "--server",
            &format!("http://127.0.0.1:{}", router.port),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && said.contains("a router (of ring")
            && said.contains("holds no store"),
        "{out:?}"
    );
    drop((first, second));
    drop((a, b, router));
    fleet.shutdown().await;
}

/// Quorum reads (consistent and exact lists) the simulated clusters served.
fn quorum_lists(fleet: &fleetscope_sim::SimFleet) -> u64 {
    fleet
        .servers()
        .iter()
        .map(|s| s.cluster().lists_of(fleetscope_sim::ListKind::Quorum))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_from_one_old_position_read_each_member_once_and_a_position_past_it_is_refused() {
    use fleetscope::proto::{EventType, StreamPosition, WatchRequest};
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 3).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=2).map(|i| format!("sim-{i}")).collect();
    let mut a = Replica::start(&kubeconfig, "replica-a", &log);
    let router = RouterProcess::start(&kubeconfig, &log);
    split(&[&a], &clusters, &log).await;
    routers_see(&[&router], clusters.len(), 1).await;
    // A subscriber's position: the end of its initial objects.
    let mut first = router
        .client()
        .await
        .watch(WatchRequest {
            query: Some(configmaps_query()),
            send_initial_events: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let token = loop {
        let e = tokio::time::timeout(PATIENCE, first.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if e.r#type == EventType::InitialEventsEnd as i32 && !e.position_token.is_empty() {
            break e.position_token;
        }
    };
    drop(first);
    // Changes after it; then the clusters move to a replica that took them up with a
    // list made after those changes: a resume from the position reads the members'
    // history.
    for c in &clusters {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(common::kube_client(&kubeconfig, c).await, "team-1");
        for i in 0..2 {
            let cm = serde_json::from_value(
                serde_json::json!({"metadata": {"name": format!("after-{i}")}}),
            )
            .unwrap();
            api.create(&Default::default(), &cm).await.unwrap();
        }
    }
    a.server.kill();
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    split(&[&b], &clusters, &log).await;
    routers_see(&[&router], clusters.len(), 1).await;

    // 30 subscribers resume from that one position at once: each gets the 4
    // changes, and each member's history is read about once, not 30 times.
    let before = quorum_lists(&fleet);
    let resume = |after: Vec<StreamPosition>| WatchRequest {
        query: Some(configmaps_query()),
        resume_token: token.clone(),
        resume_positions: after,
        ..Default::default()
    };
    let resumes = (0..30).map(|_| {
        let router = &router;
        let request = resume(Vec::new());
        async move {
            let mut s = router
                .client()
                .await
                .watch(request)
                .await
                .unwrap()
                .into_inner();
            let mut changes = 0;
            while changes < 4 {
                let e = tokio::time::timeout(PATIENCE, s.message())
                    .await
                    .expect("the changes in time")
                    .unwrap()
                    .expect("the stream goes on");
                if e.r#type == EventType::Added as i32 {
                    changes += 1;
                }
                assert_ne!(e.r#type, EventType::Reset as i32, "the history was there");
            }
        }
    });
    futures::future::join_all(resumes).await;
    // Shared while in progress: a subscriber that comes after a read has ended starts
    // another, so a few reads per member, never one per subscriber (60 here).
    let read = quorum_lists(&fleet) - before;
    assert!(
        read <= 5 * clusters.len() as u64,
        "{read} quorum reads of the members for 30 resumes from one position"
    );

    // A position past what its member has given is refused, not taken as muting it.
    let mut c = router.client().await;
    let far = resume(vec![StreamPosition {
        cluster: "sim-1".into(),
        resource: "configmaps".into(),
        resource_version: "999999999".into(),
    }]);
    let refused = match c.watch(far).await {
        Err(s) => s,
        Ok(s) => {
            let mut s = s.into_inner();
            loop {
                match tokio::time::timeout(PATIENCE, s.message()).await.unwrap() {
                    Err(status) => break status,
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("the stream ended without refusing the position"),
                }
            }
        }
    };
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("999999999"), "{refused:?}");
    drop((a, b, router));
    fleet.shutdown().await;
}

/// What a chaos poller saw of one router: answers, those partial, the dishonest ones,
/// and the longest each cluster was listed unserved.
#[derive(Default, Debug)]
struct Honesty {
    answers: usize,
    partial: usize,
    violations: Vec<String>,
    unserved_for: BTreeMap<String, Duration>,
}

/// Asks `router` for ListClusters and a Count until `stop`: every cluster is always
/// listed; a Count is partial exactly when a cluster it draws on is not current; and
/// how long each cluster stays listed as served by nobody.
async fn poll_honesty(
    router: &RouterProcess,
    clusters: &[String],
    stop: tokio_util::sync::CancellationToken,
) -> Honesty {
    let mut seen = Honesty::default();
    let mut since: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    while !stop.is_cancelled() {
        match whole_answers(router).await {
            Err(e) => seen.violations.push(format!("failed: {e:?}")),
            Ok((count, listed)) => {
                seen.answers += 1;
                let names: Vec<&str> = listed.clusters.iter().map(|c| c.name.as_str()).collect();
                if names != clusters {
                    seen.violations
                        .push(format!("ListClusters left clusters out: {names:?}"));
                }
                let now = tokio::time::Instant::now();
                for c in &listed.clusters {
                    let unserved = c.owners.is_empty();
                    if unserved {
                        let from = *since.entry(c.name.clone()).or_insert(now);
                        let longest = seen.unserved_for.entry(c.name.clone()).or_default();
                        *longest = (*longest).max(now - from);
                    } else {
                        since.remove(&c.name);
                    }
                }
                let stale = count
                    .clusters
                    .iter()
                    .any(|c| c.freshness != fleetscope::proto::Freshness::Synced as i32);
                if count.partial {
                    seen.partial += 1;
                }
                if count.partial != stale || count.clusters.len() != clusters.len() {
                    seen.violations.push(format!(
                        "partial={} with clusters {:?}",
                        count.partial,
                        count
                            .clusters
                            .iter()
                            .map(|c| (c.cluster.clone(), c.freshness))
                            .collect::<Vec<_>>()
                    ));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_hostile_leases_kills_pauses_interrupted_hand_backs_and_a_greedy_caller_leave_every_answer_honest_and_every_watch_exact()
 {
    use std::sync::Arc;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(4, 6).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=4).map(|i| format!("sim-{i}")).collect();
    let mut a = Replica::start(&kubeconfig, "replica-a", &log);
    let b = Replica::start(&kubeconfig, "replica-b", &log);
    let mut c = Replica::start(&kubeconfig, "replica-c", &log);
    let one = RouterProcess::start(&kubeconfig, &log);
    let two = RouterProcess::start(&kubeconfig, &log);
    split(&[&a, &b, &c], &clusters, &log).await;
    routers_see(&[&one, &two], clusters.len(), 1).await;
    let leases: Api<Lease> =
        Api::namespaced(common::kube_client(&kubeconfig, "sim-1").await, "default");

    let stop = tokio_util::sync::CancellationToken::new();
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let other = Arc::new(std::sync::Mutex::new(Seen::default()));
    let subscribers = [
        tokio::spawn(subscribe(
            vec![one.port, two.port],
            seen.clone(),
            stop.clone(),
        )),
        tokio::spawn(subscribe(vec![two.port], other.clone(), stop.clone())),
    ];
    let churning = Churning::start(&kubeconfig, &clusters);
    let polled = tokio_util::sync::CancellationToken::new();
    let faults = async {
        let progress = |n: usize| churning.progress(&seen, n);
        progress(10).await;
        // A ghost and a forged edit of a's own Lease.
        let ghost = forged_lease(
            &format!("{RING}-ghost"),
            "ghost",
            serde_json::json!({
                "fleetscope.io/address": "",
                "fleetscope.io/ready": clusters.join(","),
                "fleetscope.io/clusters": "phantom-1,phantom-2",
            }),
        );
        leases.create(&Default::default(), &ghost).await.unwrap();
        let own = format!("{RING}-replica-a");
        if let Ok(mut l) = leases.get(&own).await {
            let annotations = l.metadata.annotations.get_or_insert_with(Default::default);
            annotations.insert("fleetscope.io/ready".into(), clusters.join(","));
            annotations.insert("fleetscope.io/address".into(), b.advertise.clone());
            let _ = leases.replace(&own, &Default::default(), &l).await;
        }
        progress(10).await;
        // A kill, and the replica back.
        c.server.kill();
        split(&[&a, &b], &clusters, &log).await;
        c = Replica::start(&kubeconfig, "replica-c", &log);
        split(&[&a, &b, &c], &clusters, &log).await;
        progress(10).await;
        // A pause past the lease.
        let pid = b.server.child.id().to_string();
        assert!(
            std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status()
                .unwrap()
                .success()
        );
        split(&[&a, &c], &clusters, &log).await;
        assert!(
            std::process::Command::new("kill")
                .args(["-CONT", &pid])
                .status()
                .unwrap()
                .success()
        );
        split(&[&a, &b, &c], &clusters, &log).await;
        progress(10).await;
        // A hand-back interrupted: a killed, back, and killed as the others let its
        // clusters go; then back for good.
        let members = [a.identity.clone(), b.identity.clone(), c.identity.clone()];
        let of_a = assigned(&clusters, &members, &a.identity);
        a.server.kill();
        split(&[&b, &c], &clusters, &log).await;
        a = Replica::start(&kubeconfig, "replica-a", &log);
        common::eventually("a's clusters handed back", async || {
            let mut held = b.synced().await.unwrap_or_default();
            held.extend(c.synced().await.unwrap_or_default());
            of_a.iter().any(|x| !held.contains(x))
        })
        .await;
        a.server.kill();
        split(&[&b, &c], &clusters, &log).await;
        a = Replica::start(&kubeconfig, "replica-a", &log);
        split(&[&a, &b, &c], &clusters, &log).await;
        progress(10).await;
        // A greedy caller: 300 Watches on one router.
        let mut greedy = Vec::new();
        for _ in 0..300 {
            let mut client = one.client().await;
            if let Ok(s) = client
                .watch(fleetscope::proto::WatchRequest {
                    query: Some(configmaps_query()),
                    ..Default::default()
                })
                .await
            {
                greedy.push(s.into_inner());
            }
        }
        progress(10).await;
        drop(greedy);
        churning.stop().await;
        polled.cancel();
    };
    let (honesty, ()) = tokio::join!(poll_honesty(&two, &clusters, polled.clone()), faults);
    assert!(
        honesty.violations.is_empty(),
        "{} dishonest answers of {}, first: {:?}",
        honesty.violations.len(),
        honesty.answers,
        honesty.violations.first()
    );
    // No cluster went unserved longer than the lease (3 s) and a sync, with room.
    let longest = honesty
        .unserved_for
        .values()
        .max()
        .copied()
        .unwrap_or_default();
    assert!(
        longest < Duration::from_secs(15),
        "a cluster unserved for {longest:?}: {:?}",
        honesty.unserved_for
    );
    for (name, s) in [("subscriber", &seen), ("other", &other)] {
        until_truth(name, s, || common::truth(&fleet, "configmaps"), &log).await;
    }
    stop.cancel();
    for s in subscribers {
        s.await.unwrap();
    }
    drop((a, b, c, one, two));
    fleet.shutdown().await;
}

/// A replica's Lease giving an address where another server answers (the address
/// reused, `--shard-advertise` wrong): a router reads that server's answers for
/// nobody, and reports the replica's clusters unreached, saying why, instead of
/// serving another fleet's objects as theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_takes_answers_only_from_the_replica_the_lease_names() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(4, 3).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=4).map(|i| format!("sim-{i}")).collect();
    // Another fleet, its clusters named as the ring's, served by a plain server.
    let (other, _other_dir, other_kubeconfig) = common::fleet_with_kubeconfig(4, 3).await;
    for s in other.servers() {
        for i in 0..5 {
            s.cluster()
                .store
                .create(
                    "configmaps",
                    Some("default"),
                    serde_json::json!({"metadata": {"name": format!("elsewhere-{i}")}}),
                )
                .unwrap();
        }
    }
    let impostor = common::process::Server::start(
        &other_kubeconfig,
        &["--resources", "configmaps", "--no-persist"],
        &log,
    );
    common::wait_serving(&impostor.url()).await;
    let elsewhere = format!("127.0.0.1:{}", impostor.port);
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    let c = Replica::start_with(
        &kubeconfig,
        "replica-c",
        &log,
        &["--shard-advertise", &elsewhere],
    );
    split(&[&a, &c], &clusters, &log).await;
    let members = ["replica-a".to_string(), "replica-c".to_string()];
    let misplaced = assigned(&clusters, &members, "replica-c");
    assert!(!misplaced.is_empty(), "replica-c holds a cluster");
    let router = RouterProcess::start(&kubeconfig, &log);
    let truth = truth_where(&fleet, |cluster, _| !misplaced.iter().any(|m| m == cluster));
    assert_ne!(
        common::truth(&other, "configmaps").len(),
        common::truth(&fleet, "configmaps").len(),
        "the other fleet is another fleet"
    );
    // Every answer, once the router has taken both Leases, counts replica-a's clusters
    // whole and replica-c's as unreached, naming the server that answered instead.
    let honest = |count: &fleetscope::proto::CountResponse,
                  listed: &fleetscope::proto::ListClustersResponse| {
        let unreached: Vec<&str> = listed
            .clusters
            .iter()
            .filter(|c| {
                c.freshness == fleetscope::proto::Freshness::Error as i32
                    && c.last_error.contains("answers as no replica")
                    && c.last_error.contains(&elsewhere)
            })
            .map(|c| c.name.as_str())
            .collect();
        count.partial && count.total == truth.len() as u64 && unreached == misplaced
    };
    let what = "the router says replica-c's clusters are unreached";
    common::eventually(
        common::with_log(what, &log),
        async || match whole_answers(&router).await {
            Ok((count, listed)) if honest(&count, &listed) => Ok(()),
            other => Err(other),
        },
    )
    .await;
    for _ in 0..20 {
        let (count, listed) = whole_answers(&router).await.unwrap();
        assert!(
            honest(&count, &listed),
            "an answer read another server as replica-c: {count:?} {listed:?}"
        );
    }
    // A Get of one of replica-c's objects: unavailable, never the other fleet's.
    let (cluster, namespace, name) = common::truth(&fleet, "configmaps")
        .into_keys()
        .find(|(cluster, _, _)| misplaced.contains(cluster))
        .unwrap();
    let got = router
        .client()
        .await
        .get(fleetscope::proto::GetRequest {
            resource: "configmaps".into(),
            cluster,
            namespace,
            name,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(got.code(), tonic::Code::Unavailable, "{got:?}");
    assert!(got.message().contains("replica-c"), "{got:?}");
    drop((a, c, router, impostor));
    fleet.shutdown().await;
    other.shutdown().await;
}

/// `request` as the caller holding `token` sends it.
fn as_caller<T>(token: &str, request: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(request);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// How many clusters `replica` holds synced, asked as the caller holding `token`.
async fn synced_as(replica: &Replica, token: &str) -> Option<usize> {
    let listed = replica
        .client()
        .await?
        .list_clusters(as_caller(
            token,
            fleetscope::proto::ListClustersRequest::default(),
        ))
        .await
        .ok()?
        .into_inner();
    Some(
        listed
            .clusters
            .iter()
            .filter(|c| c.freshness == fleetscope::proto::Freshness::Synced as i32)
            .count(),
    )
}

/// Waits until `cond` holds of the fleet's quorum (exact) lists since `before`.
async fn until_quorum_lists(
    fleet: &fleetscope_sim::SimFleet,
    before: u64,
    what: &str,
    cond: impl Fn(u64) -> bool,
) -> u64 {
    common::eventually(what, async || {
        let made = quorum_lists(fleet) - before;
        if cond(made) {
            Ok(made)
        } else {
            Err(format!("{made} exact lists of the members"))
        }
    })
    .await
}

/// Reads `stream` until it has added each of `names` in each of `clusters` (as a
/// change, or anew after an explicit reset).
async fn added_in(
    stream: &mut tonic::Streaming<fleetscope::proto::WatchEvent>,
    clusters: &[String],
    names: &[&str],
) {
    let mut missing: std::collections::BTreeSet<(String, String)> = clusters
        .iter()
        .flat_map(|c| names.iter().map(move |n| (c.clone(), n.to_string())))
        .collect();
    while !missing.is_empty() {
        let e = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .unwrap_or_else(|_| panic!("never added: {missing:?}"))
            .unwrap()
            .expect("the stream goes on");
        if e.r#type == fleetscope::proto::EventType::Added as i32
            && let Some(o) = e.object
        {
            missing.remove(&(o.cluster, o.name));
        }
    }
}

/// A caller's Watch starting from old positions in many clusters reads the members'
/// histories a few at a time (the rest wait their turn), and another caller's reads
/// start meanwhile: no caller makes a replica hammer the members, or waits on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_s_history_reads_run_a_few_at_a_time_and_leave_another_caller_room() {
    use fleetscope::proto::{StreamPosition, WatchRequest};
    const READS_PER_CALLER: u64 = 4;
    let n = 6;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(n, 3).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=n).map(|i| format!("sim-{i}")).collect();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        common::tokens_file(&[("alice-token", "alice", &[]), ("bob-token", "bob", &[])]),
    )
    .unwrap();
    // Two positions in each member's history, both older than any list the replica
    // makes: before two changes, and between them.
    let mut positions: [Vec<StreamPosition>; 2] = Default::default();
    for s in fleet.servers() {
        let store = &s.cluster().store;
        for (i, at) in positions.iter_mut().enumerate() {
            at.push(StreamPosition {
                cluster: s.cluster().name().to_string(),
                resource: "configmaps".into(),
                resource_version: store.resource_version().to_string(),
            });
            store
                .create(
                    "configmaps",
                    Some("team-1"),
                    serde_json::json!({"metadata": {"name": format!("after-{i}")}}),
                )
                .unwrap();
        }
    }
    let tokens_arg = tokens.display().to_string();
    let a = Replica::start_with(
        &kubeconfig,
        "replica-a",
        &log,
        &["--tokens-file", &tokens_arg],
    );
    common::eventually(
        common::with_log("the replica syncs its clusters", &log),
        async || synced_as(&a, "alice-token").await == Some(n),
    )
    .await;
    // From here on the members hold every new watch request unanswered: a history
    // read, once it has listed, waits there; the replica's own watches run on.
    for s in fleet.servers() {
        s.cluster().stall_next_watches(2);
    }
    let watch = |token: &'static str, at: Vec<StreamPosition>| {
        let a = &a;
        async move {
            a.client()
                .await
                .unwrap()
                .watch(as_caller(
                    token,
                    WatchRequest {
                        query: Some(configmaps_query()),
                        start_positions: at,
                        ..Default::default()
                    },
                ))
                .await
                .unwrap()
                .into_inner()
        }
    };
    let before = quorum_lists(&fleet);
    // alice starts from the first position in all six clusters: four reads, no more.
    let mut alice = watch("alice-token", positions[0].clone()).await;
    until_quorum_lists(&fleet, before, "alice's first reads", |m| {
        m >= READS_PER_CALLER
    })
    .await;
    // bob, from the second position in two clusters: his reads start at once.
    let mut bob = watch("bob-token", positions[1][..2].to_vec()).await;
    let made =
        until_quorum_lists(&fleet, before, "bob's reads", |m| m >= READS_PER_CALLER + 2).await;
    assert_eq!(
        made,
        READS_PER_CALLER + 2,
        "alice's reads past her four waited, bob's did not"
    );
    // Released: alice's other reads take their turn, and both get every change.
    for s in fleet.servers() {
        s.cluster().release_stalls();
    }
    until_quorum_lists(&fleet, before, "alice's waiting reads", |m| {
        m >= n as u64 + 2
    })
    .await;
    added_in(&mut alice, &clusters, &["after-0", "after-1"]).await;
    let bob_clusters: Vec<String> = positions[1][..2]
        .iter()
        .map(|p| p.cluster.clone())
        .collect();
    added_in(&mut bob, &bob_clusters, &["after-1"]).await;
    drop(a);
    fleet.shutdown().await;
}

/// A router configured by a file alone (`router --config FILE`, the keys `serve`'s
/// file has, plus `router.*`): it serves the ring, `config check --for router` reads
/// the file as the router does, and the file, followed, is reloaded when it changes;
/// a file that no longer resolves keeps the settings in force and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_runs_from_its_configuration_file_and_follows_it() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 3).await;
    let log = dir.path().join("ring.log");
    let clusters: Vec<String> = (1..=2).map(|i| format!("sim-{i}")).collect();
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    split(&[&a], &clusters, &log).await;
    let port = common::process::free_port();
    let metrics = format!("127.0.0.1:{}", common::process::free_port());
    let file = dir.path().join("router.yaml");
    let config = |timeout: &str| {
        format!(
            "kubeconfigs: [{kubeconfig}]\nlisten: 127.0.0.1:{port}\nmetricsListen: {metrics}\n\
             sharding:\n  ring: {RING}\n  coordination: sim-1\n  leaseDuration: 3s\n  pageTokenKeyFile: {key}\n\
             router:\n  replicaTimeout: {timeout}\n",
            kubeconfig = kubeconfig.display(),
            key = kubeconfig.with_file_name("page-token.key").display(),
        )
    };
    common::replace(&file, &config("2s"));

    // `config check --for router` reads it as the router will.
    let check = |path: &std::path::Path| {
        std::process::Command::new(common::process::BIN)
            .args(["config", "check", "--for", "router"])
            .arg(path)
            .env_remove("FLEETSCOPE_CONFIG")
            .output()
            .unwrap()
    };
    let checked = check(&file);
    let out = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{checked:?}");
    assert!(
        out.contains("router.replicaTimeout")
            && out.contains("2s")
            && out.contains(&format!("routes to ring {RING}")),
        "{out}"
    );
    let misspelt = dir.path().join("misspelt.yaml");
    std::fs::write(
        &misspelt,
        config("2s").replace("replicaTimeout", "replicaTimout"),
    )
    .unwrap();
    let refused = check(&misspelt);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("router.replicaTimout"),
        "{err}"
    );

    // The router, from the file alone.
    let child = std::process::Command::new(common::process::BIN)
        .args(["router", "--config"])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap(),
        )
        .spawn()
        .unwrap();
    listening(port, &log);
    let router = RouterProcess { child, port };
    routers_see(&[&router], clusters.len(), 1).await;
    assert!(
        common::scrape(&metrics)
            .await
            .is_some_and(|m| m.contains("fleetscope_router_members 1")),
        "the file's metrics listener serves the router's metrics"
    );
    let mut c = router.client().await;
    let reloads = |r: &fleetscope::proto::ListClustersResponse| {
        r.inputs
            .iter()
            .find(|i| i.name == "config")
            .map(|i| (i.reloads, i.error.clone()))
    };
    let before = reloads(&common::list_clusters(&mut c).await)
        .expect("the file is an input of the router")
        .0;

    // Changed: reloaded (the new timeout applies at the next restart).
    common::replace(&file, &config("3s"));
    common::wait_for_clusters(&mut c, "the reload", |r| {
        reloads(r).is_some_and(|(n, e)| n > before && e.is_empty())
    })
    .await;
    // Misspelt: the settings in force stay, the router serves on, and says why.
    common::replace(
        &file,
        &config("3s").replace("replicaTimeout", "replicaTimout"),
    );
    let r = common::wait_for_clusters(&mut c, "the reload error", |r| {
        reloads(r).is_some_and(|(_, e)| e.contains("router.replicaTimout"))
    })
    .await;
    assert!(
        reloads(&r).unwrap().1.contains("did you mean"),
        "{:?}",
        reloads(&r)
    );
    let total = common::truth(&fleet, "configmaps").len() as u64;
    let (count, _) = whole_answers(&router).await.unwrap();
    assert!(count.total == total && !count.partial, "{count:?}");
    // Fixed: the error clears.
    common::replace(&file, &config("3s"));
    common::wait_for_clusters(&mut c, "the error cleared", |r| {
        reloads(r).is_some_and(|(_, e)| e.is_empty())
    })
    .await;
    drop((a, router));
    fleet.shutdown().await;
}

/// Two replicas of `clusters` simulated clusters of `objects` each and a router whose
/// Kubernetes API is on `kube_api`, every cluster served through it.
struct KubeRing {
    fleet: fleetscope_sim::SimFleet,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    log: std::path::PathBuf,
    clusters: Vec<String>,
    kube_api: String,
    a: Replica,
    b: Replica,
    router: RouterProcess,
}

impl KubeRing {
    async fn start(clusters: usize, objects: usize) -> Self {
        let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(clusters, objects).await;
        let log = dir.path().join("ring.log");
        let clusters: Vec<String> = (1..=clusters).map(|i| format!("sim-{i}")).collect();
        let kube_api = format!("127.0.0.1:{}", common::process::free_port());
        let a = Replica::start(&kubeconfig, "replica-a", &log);
        let b = Replica::start(&kubeconfig, "replica-b", &log);
        let router = RouterProcess::start_with(
            &kubeconfig,
            &log,
            &[
                "--shard-lease-duration",
                "3s",
                "--kube-api-listen",
                &kube_api,
            ],
        );
        split(&[&a, &b], &clusters, &log).await;
        routers_see(&[&router], clusters.len(), 1).await;
        Self {
            fleet,
            dir,
            kubeconfig,
            log,
            clusters,
            kube_api,
            a,
            b,
            router,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_rs_reflector_through_a_router_holds_the_fleet_across_a_killed_replica_without_listing_again()
 {
    let KubeRing {
        fleet,
        dir: _dir,
        kubeconfig,
        log,
        clusters,
        kube_api,
        a,
        b,
        router,
    } = KubeRing::start(3, 10).await;
    // kube-rs, unchanged, on the fleet's path of the router: its list's and its
    // events' resourceVersions are the router's positions.
    let reflector = crate::kube_api::Reflector::start(&format!("http://{kube_api}/clusters/*"));
    let truth = || -> std::collections::BTreeSet<String> {
        common::truth(&fleet, "configmaps")
            .into_keys()
            .map(|(c, ns, name)| format!("{c}/{ns}/{c}:{name}"))
            .collect()
    };
    let reaches_truth = async |what: &str| reflector.reaches(what, &log, truth).await;
    reaches_truth("the reflector holds the fleet through the router").await;
    let churning = Churning::start(&kubeconfig, &clusters);
    common::eventually("changes are made", async || {
        let made = churning.made.load(std::sync::atomic::Ordering::Relaxed);
        if made >= 20 { Ok(()) } else { Err(made) }
    })
    .await;
    // A replica is killed under the churn: its clusters go on from the other.
    let mut a = a;
    a.server.kill();
    split(&[&b], &clusters, &log).await;
    common::eventually("more changes are made", async || {
        let made = churning.made.load(std::sync::atomic::Ordering::Relaxed);
        if made >= 60 { Ok(()) } else { Err(made) }
    })
    .await;
    // The router is killed and another takes its address: the reflector's watch
    // breaks and resumes there from the position it held.
    drop(router);
    let router = RouterProcess::start_with(
        &kubeconfig,
        &log,
        &[
            "--shard-lease-duration",
            "3s",
            "--kube-api-listen",
            &kube_api,
        ],
    );
    routers_see(&[&router], clusters.len(), 1).await;
    common::eventually("changes are made after the router", async || {
        let made = churning.made.load(std::sync::atomic::Ordering::Relaxed);
        if made >= 100 { Ok(()) } else { Err(made) }
    })
    .await;
    churning.stop().await;
    reaches_truth("the reflector holds the fleet after the replica and the router were killed")
        .await;
    assert_eq!(
        reflector.lists(),
        1,
        "the reflector listed again: its watch did not resume from the router's position"
    );
    reflector.task.abort();
    drop((b, router));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_w_through_a_router_misses_and_repeats_nothing_across_a_replica_killed_and_restarted()
 {
    if !common::kubectl_installed() {
        eprintln!("kubectl is not on the PATH: nothing checked");
        return;
    }
    let KubeRing {
        fleet,
        dir,
        kubeconfig,
        log,
        clusters,
        kube_api,
        a,
        b,
        router,
    } = KubeRing::start(2, 20).await;
    let k = common::Kubectl::at(dir.path().join("fleetscope.kubeconfig"));
    let grpc = format!("http://127.0.0.1:{}", router.port);
    crate::kube_api::kubeconfig(&k.kubeconfig, &grpc, &format!("http://{kube_api}"));
    // Every event of team-1's configmaps: its type, the object's name and the change
    // that made it (the churn writes its number in data.i).
    let mut watch = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args([
            "get",
            "configmaps",
            "-n",
            "team-1",
            "-w",
            "--output-watch-events",
        ])
        .args([
            "-o",
            "jsonpath={.type} {.object.metadata.name} {.object.data.i}{\"\\n\"}",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let lines: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let out = std::io::BufReader::new(watch.stdout.take().unwrap());
    let into = lines.clone();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for l in out.lines().map_while(Result::ok) {
            into.lock().unwrap().push(l);
        }
    });
    // What the events say the namespace holds: name → data.i.
    let folded = || -> BTreeMap<String, String> {
        let mut held = BTreeMap::new();
        for l in lines.lock().unwrap().iter() {
            let mut w = l.split(' ');
            let (t, name, i) = (
                w.next().unwrap_or(""),
                w.next().unwrap_or(""),
                w.next().unwrap_or(""),
            );
            match t {
                "DELETED" => {
                    held.remove(name);
                }
                _ => {
                    held.insert(name.to_string(), i.to_string());
                }
            }
        }
        held
    };
    let truth = || -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for s in fleet.servers() {
            let latest = fleetscope_sim::store::ReadAt::Latest;
            let snap = s.cluster().store.snapshot("configmaps", latest).unwrap();
            for o in snap.objects.values().filter(|o| o.namespace == "team-1") {
                let v: serde_json::Value = serde_json::from_slice(o.body.as_ref()).unwrap();
                let i = v["data"]["i"].as_str().unwrap_or("").to_string();
                out.insert(format!("{}:{}", s.cluster().name(), o.name), i);
            }
        }
        out
    };
    let holds_truth = async |what: &str| {
        common::eventually(common::with_log(what, &log), async || {
            let (held, truth) = (folded(), truth());
            if held == truth {
                Ok(())
            } else {
                Err(format!("{held:?} against {truth:?}"))
            }
        })
        .await;
    };
    holds_truth("kubectl lists team-1 through the router").await;
    // kubectl's own printing through the router: a Table, written as the objects come.
    let printed = k.ok(&["get", "configmaps", "-n", "team-1"]);
    let header: Vec<&str> = printed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["CLUSTER", "NAME", "DATA", "AGE"], "{printed}");
    assert_eq!(printed.lines().count(), truth().len() + 1, "{printed}");
    let names = k.ok(&["get", "configmaps", "-A", "-o", "name"]);
    assert_eq!(
        names.lines().count(),
        common::truth(&fleet, "configmaps").len()
    );
    let churning = Churning::start(&kubeconfig, &clusters);
    let made = |n: usize| {
        let made = &churning.made;
        async move {
            common::eventually(format!("{n} changes made"), async || {
                let m = made.load(std::sync::atomic::Ordering::Relaxed);
                if m >= n { Ok(()) } else { Err(m) }
            })
            .await;
        }
    };
    made(20).await;
    // A replica is killed and started again under the churn.
    let mut a = a;
    a.server.kill();
    split(&[&b], &clusters, &log).await;
    made(40).await;
    let a = Replica::start(&kubeconfig, "replica-a", &log);
    split(&[&a, &b], &clusters, &log).await;
    made(60).await;
    churning.stop().await;
    holds_truth("kubectl's events add up to team-1's truth").await;
    let lines = lines.lock().unwrap().clone();
    let mut seen = std::collections::BTreeSet::new();
    let repeated: Vec<&String> = lines.iter().filter(|l| !seen.insert(*l)).collect();
    assert!(repeated.is_empty(), "events repeated: {repeated:?}");
    assert!(
        watch.try_wait().unwrap().is_none(),
        "kubectl's watch ended: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let _ = watch.kill();
    let _ = watch.wait();
    drop((a, b, router));
    fleet.shutdown().await;
}
