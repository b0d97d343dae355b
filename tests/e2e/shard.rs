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

    // A second writer of the same Lease (a zombie of the same identity) renews in
    // between: the first's next write carries a stale resourceVersion and loses,
    // leaving the other's write in place; the write after it reads first and holds.
    let mut zombie = OwnLease::new(api.clone(), RING, "fleetscope-0", DURATION);
    zombie.renew(&published("10.0.0.9:50051")).await.unwrap();
    let lost = a.renew(&published("10.0.0.1:50051")).await.unwrap_err();
    assert!(matches!(lost, LeaseError::Conflict { .. }), "{lost}");
    let kept = api.get(a.name()).await.unwrap();
    assert_eq!(
        kept.metadata.annotations.as_ref().unwrap()["fleetscope.io/address"],
        "10.0.0.9:50051",
        "a lost race overwrites nothing"
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
