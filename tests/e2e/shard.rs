//! Replica membership through real Leases: `OwnLease` and `follow` against a
//! simulated coordination cluster over HTTP, as against a kube-apiserver: Leases
//! created and replaced with their `resourceVersion`, a lost race answered by a
//! conflict and never by an overwrite, a release seen by the other replicas at once,
//! every change reaching a follower by its watch.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetscope::shard::lease::{self, LeaseError, Observed, OwnLease};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::sync::watch;

use crate::common;
use common::PATIENCE;

const RING: &str = "fleet";
const DURATION: Duration = Duration::from_secs(15);

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
    let api: Api<Lease> = Api::namespaced(client, "default");
    let (tx, mut observed) = watch::channel(Observed::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let follower = tokio::spawn(lease::follow(api.clone(), RING.into(), tx, stop.clone()));

    let published = |address: &str| {
        BTreeMap::from([("fleetscope.io/address".to_string(), address.to_string())])
    };
    let mut a = OwnLease::new(api.clone(), RING, "fleetscope-0", DURATION);
    let mut b = OwnLease::new(api.clone(), RING, "fleetscope-1", DURATION);
    a.renew(&published("10.0.0.1:50051")).await.unwrap();
    b.renew(&published("10.0.0.2:50051")).await.unwrap();
    let seen = wait_for(&mut observed, &["fleetscope-0", "fleetscope-1"]).await;
    let members = seen.alive(tokio::time::Instant::now());
    assert_eq!(
        members[0].annotations["fleetscope.io/address"], "10.0.0.1:50051",
        "what a replica publishes reaches the others"
    );

    // The Lease as client-go writes it.
    let written = api.get(a.name()).await.unwrap();
    let spec = written.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("fleetscope-0"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    assert!(spec.renew_time.is_some() && spec.acquire_time.is_some());
    assert_eq!(
        written.metadata.labels.as_ref().unwrap()[lease::RING_LABEL],
        RING
    );

    // Another writer (a person, a tool) replaces the Lease in between: the next
    // write carries a stale resourceVersion and loses, leaving the other's write in
    // place; the write after it reads first and holds.
    let mut edited = api.get(a.name()).await.unwrap();
    edited
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert("edited".into(), "by-hand".into());
    api.replace(a.name(), &Default::default(), &edited)
        .await
        .unwrap();
    let lost = a.renew(&published("10.0.0.1:50051")).await.unwrap_err();
    assert!(matches!(lost, LeaseError::Conflict { .. }), "{lost}");
    let kept = api.get(a.name()).await.unwrap();
    assert_eq!(
        kept.metadata.labels.as_ref().unwrap()["edited"],
        "by-hand",
        "a lost race overwrites nothing"
    );
    a.renew(&published("10.0.0.1:50051")).await.unwrap();

    // A second process given the same identity finds the Lease held by another
    // instance and renewed within its duration: it says so and writes nothing.
    let mut twin = OwnLease::new(api.clone(), RING, "fleetscope-0", DURATION);
    let before = api.get(a.name()).await.unwrap();
    let refused = twin.renew(&published("10.0.0.9:50051")).await.unwrap_err();
    assert!(
        matches!(refused, LeaseError::HeldByAnother { .. })
            && refused.to_string().contains("--shard-identity"),
        "{refused}"
    );
    let after = api.get(a.name()).await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the twin wrote nothing"
    );
    a.renew(&published("10.0.0.1:50051")).await.unwrap();

    // Released: the holder is cleared, and the follower counts the replica gone at
    // once, long before its duration.
    b.release().await.unwrap();
    wait_for(&mut observed, &["fleetscope-0"]).await;
    let released = api.get(b.name()).await.unwrap().spec.unwrap();
    assert_eq!(released.holder_identity, None);
    // Taken up again: a transition.
    b.renew(&published("10.0.0.2:50051")).await.unwrap();
    wait_for(&mut observed, &["fleetscope-0", "fleetscope-1"]).await;
    let again = api.get(b.name()).await.unwrap().spec.unwrap();
    assert_eq!(again.lease_transitions, Some(1));

    // A deleted Lease leaves the ring too.
    api.delete(a.name(), &Default::default()).await.unwrap();
    wait_for(&mut observed, &["fleetscope-1"]).await;

    stop.cancel();
    follower.await.unwrap();
    fleet.shutdown().await;
}

fn cluster_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("cluster-{i}")).collect()
}

struct Running {
    config: fleetscope::shard::member::MembershipConfig,
    view: watch::Receiver<fleetscope::shard::member::View>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn member(api: &Api<Lease>, identity: &str, replication: usize) -> Running {
    use fleetscope::shard::member::{self, MembershipConfig, View};
    let config = MembershipConfig {
        ring: RING.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_period: Duration::from_millis(300),
        replication,
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
        self.view
            .borrow()
            .owned(tokio::time::Instant::now(), &self.config, clusters)
    }

    async fn until(&mut self, what: &str, cond: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !cond(self) {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            // The view changes as Leases are renewed and seen; fencing is judged by
            // the clock, so the wait also wakes on its own.
            let waited =
                tokio::time::timeout(Duration::from_millis(100), self.view.changed()).await;
            if let Ok(Err(_)) = waited {
                // The member has stopped: nothing will change but the clock.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_split_the_clusters_take_over_a_leaver_s_and_a_cut_off_one_is_fenced() {
    let (fleet, _dir, kubeconfig) = common::fleet_with_kubeconfig(1, 0).await;
    let client = common::kube_client(&kubeconfig, "sim-1").await;
    let api: Api<Lease> = Api::namespaced(client, "default");
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
}

impl Replica {
    fn start(kubeconfig: &std::path::Path, identity: &str, log: &std::path::Path) -> Self {
        let metrics = format!("127.0.0.1:{}", common::process::free_port());
        let server = common::process::Server::start(
            kubeconfig,
            &[
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
                "--shard-lease-duration",
                "3s",
                "--shard-renew-period",
                "500ms",
            ],
            log,
        );
        Self {
            server,
            metrics,
            identity: identity.into(),
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

    /// A metric's value, when scraped.
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = common::scrape(&self.metrics).await?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

/// Waits until each of `replicas` holds synced exactly the clusters the ring's
/// assignment over them gives it (every cluster once, and no other: moves done).
async fn split(replicas: &[&Replica], clusters: &[String], log: &std::path::Path) {
    let members: Vec<String> = replicas.iter().map(|r| r.identity.clone()).collect();
    let want: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            clusters
                .iter()
                .filter(|c| fleetscope::shard::assign::owners(c, &members, 1) == [m.as_str()])
                .cloned()
                .collect()
        })
        .collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut held = Vec::new();
        for r in replicas {
            let mut synced = r.synced().await.unwrap_or_default();
            synced.sort();
            held.push(synced);
        }
        if held == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replicas never held their assignment {want:?}; last {held:?}; log: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut sum = 0;
        for r in [&a, &b, &c] {
            sum += r.count().await.unwrap_or(0);
        }
        let members = c.metric("fleetscope_shard_members").await;
        let unowned = c.metric("fleetscope_shard_unowned_clusters").await;
        if sum == total && members == Some(3.0) && unowned == Some(0.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "counts add up to {sum} of {total}; members {members:?}, unowned {unowned:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

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
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while c.metric("fleetscope_shard_members").await != Some(1.0) {
        assert!(tokio::time::Instant::now() < deadline, "c sees b gone");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match c.count().await {
            Err(tonic::Code::Unavailable) => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "c never fenced; it answers {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.metric("fleetscope_shard_fenced").await, Some(1.0));
    assert!(
        c.metric("fleetscope_shard_lease_renew_failures_total")
            .await
            .unwrap_or(0.0)
            > 0.0
    );
    fleet.servers()[0].come_online().await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while c.count().await != Ok(total) {
        assert!(tokio::time::Instant::now() < deadline, "c answers again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match second.counted().await {
            Err(s)
                if s.code() == tonic::Code::Unavailable
                    && s.message().contains("--shard-identity") =>
            {
                break;
            }
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "the twin never said why it serves nothing: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(second.metric("fleetscope_shard_fenced").await, Some(1.0));
    assert_eq!(first.count().await, Ok(total));
    assert_eq!(first.metric("fleetscope_shard_fenced").await, Some(0.0));
    // The first is killed: once its Lease has gone a duration without renewal, the
    // second takes it and serves the fleet.
    drop(first);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while second.count().await != Ok(total) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the twin never took over; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(second);
    fleet.shutdown().await;
}
