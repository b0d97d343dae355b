//! Which clusters this replica holds, decided again whenever the ring, the configured
//! clusters or the clusters' sync state change: those it owns by the assignment, and
//! (make-before-break) those it owned until every new owner publishes them ready on
//! its Lease. The held clusters are what the engine runs; the ready ones are published
//! on this replica's Lease with its address; a configured cluster that no live
//! replica publishes ready is reported unowned.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fleetscope_model::FleetError;
use fleetscope_model::fleet::Gate;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::SourceSet;
use fleetscope_ring::assign;
use fleetscope_ring::lease::Member;
use fleetscope_ring::member::{MembershipConfig, View};
use fleetscope_ring::vocabulary::{
    ADDRESS, CLUSTERS, HELD, LEAVING, READY, UNOWNED, leaving, ready_of,
};

/// The clusters of `clusters` that `config.identity` owns `now` by the assignment,
/// with `config.replication` owners each; none while it is fenced.
pub fn owned(
    view: &View,
    now: Instant,
    config: &MembershipConfig,
    clusters: &[String],
) -> Vec<String> {
    if view.fenced(now, config.lease_duration) {
        return Vec::new();
    }
    let members: Vec<String> = view.members(now).into_iter().map(|m| m.identity).collect();
    clusters
        .iter()
        .filter(|c| {
            assign::owners(c, &members, config.replication).contains(&config.identity.as_str())
        })
        .cloned()
        .collect()
}

/// The members clusters are assigned over: the live ones that are not leaving.
pub fn assignable(members: &[Member]) -> Vec<String> {
    members
        .iter()
        .filter(|m| !leaving(m))
        .map(|m| m.identity.clone())
        .collect()
}

/// What `identity` holds next: every configured cluster it owns, and every one it
/// holds now and no longer owns until each of its owners publishes it ready. A
/// cluster no longer configured is let go at once.
pub fn hold(
    identity: &str,
    replication: usize,
    members: &[Member],
    configured: &[String],
    held: &BTreeSet<String>,
) -> BTreeSet<String> {
    let ids = assignable(members);
    configured
        .iter()
        .filter(|c| {
            let owners = assign::owners(c, &ids, replication);
            if owners.contains(&identity) {
                return true;
            }
            let handed_over = !owners.is_empty()
                && owners.iter().all(|o| {
                    members
                        .iter()
                        .any(|m| m.identity == *o && ready_of(m).contains(c.as_str()))
                });
            held.contains(*c) && !handed_over
        })
        .cloned()
        .collect()
}

/// The configured clusters no live member publishes ready.
pub fn unowned(members: &[Member], configured: &[String]) -> Vec<String> {
    configured
        .iter()
        .filter(|c| !members.iter().any(|m| ready_of(m).contains(c.as_str())))
        .cloned()
        .collect()
}

/// The shard as this replica sees it, for metrics and status.
#[derive(Debug, Clone, Default)]
pub struct ShardStatus {
    /// The ring's name.
    pub ring: String,
    /// This replica's identity.
    pub identity: String,
    /// Whether this replica is fenced (its Lease not renewed within its duration).
    pub fenced: bool,
    /// The live members, by identity.
    pub members: Vec<String>,
    /// The clusters this replica owns by the assignment.
    pub owned: BTreeSet<String>,
    /// The clusters this replica holds (owned, and handed over but not yet taken up).
    pub held: BTreeSet<String>,
    /// The configured clusters no live replica publishes ready.
    pub unowned: Vec<String>,
    /// Clusters taken up or let go since start.
    pub moves: u64,
    /// Lease renewals that failed since start.
    pub renew_failures: u64,
}

/// The ring's members `now`, counting this replica while it is not fenced (its own
/// renewal may not have come back through the watch yet), with what it publishes.
fn members_now(
    view: &View,
    now: Instant,
    config: &MembershipConfig,
    published: &BTreeMap<String, String>,
) -> Vec<Member> {
    let mut members: Vec<Member> = view
        .members(now)
        .into_iter()
        .filter(|m| m.identity != config.identity)
        .collect();
    if !view.fenced(now, config.lease_duration) {
        members.push(Member {
            identity: config.identity.clone(),
            annotations: published.clone(),
        });
    }
    members.sort_by(|a, b| a.identity.cmp(&b.identity));
    members
}

/// What the owner loop reads and writes.
pub struct Owner {
    /// The ring and this replica.
    pub config: MembershipConfig,
    /// The address published on the Lease.
    pub advertise: String,
    /// The ring as seen (from `fleetscope_ring::member::run`).
    pub view: watch::Receiver<View>,
    /// Every configured cluster.
    pub desired: watch::Receiver<SourceSet>,
    /// The clusters the engine runs: this replica's held ones.
    pub held: watch::Sender<SourceSet>,
    /// What the Lease publishes.
    pub published: watch::Sender<BTreeMap<String, String>>,
    /// The clusters the engine holds synced, when asked (and, given a moment, whose
    /// streams were all confirmed current since).
    pub synced: Box<dyn Fn(Option<std::time::Instant>) -> BTreeSet<String> + Send + Sync>,
    /// Makes every stream of the engine resume its watch at once, confirming it
    /// current (after a gap, so that quiet clusters need not wait for a change).
    pub rewatch: Box<dyn Fn() + Send + Sync>,
    /// Where the shard's status goes.
    pub status: watch::Sender<ShardStatus>,
    /// Set when this replica shuts down: it publishes that it is leaving.
    pub leaving: CancellationToken,
}

/// What the owner carries from one decision to the next.
struct Decisions {
    /// The clusters held.
    held: BTreeSet<String>,
    /// Clusters taken up or let go since start.
    moves: u64,
    /// Whether nothing has been decided yet.
    first: bool,
    /// When each cluster was first seen without a ready owner.
    unowned_since: BTreeMap<String, Instant>,
    /// The clusters logged as having no ready owner.
    reported: BTreeSet<String>,
    started: Instant,
    /// When the loop last turned: it turns at least every second, and a longer gap
    /// means the process did not run (stopped, or starved).
    last_turn: Instant,
    /// Since a gap: a cluster is ready again only once its streams are confirmed
    /// current after this moment.
    barrier: Option<Instant>,
}

impl Owner {
    /// Decides again every renew period and whenever the ring or the configured
    /// clusters change, until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.renew_period.min(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let mut d = Decisions {
            held: BTreeSet::new(),
            moves: 0,
            first: true,
            unowned_since: BTreeMap::new(),
            reported: BTreeSet::new(),
            started,
            last_turn: started,
            barrier: None,
        };
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                r = self.view.changed() => if r.is_err() { return },
                r = self.desired.changed() => if r.is_err() { return },
                _ = self.leaving.cancelled(), if !self.published.borrow().contains_key(LEAVING) => {}
                _ = stop.cancelled() => return,
            }
            self.turn(&mut d, Instant::now());
        }
    }

    /// One decision at `now`: what to hold, what the Lease publishes, which clusters
    /// nobody serves, and the shard's status.
    fn turn(&mut self, d: &mut Decisions, now: Instant) {
        self.after_a_gap(d, now);
        let view = self.view.borrow_and_update().clone();
        if d.first
            && (!view.observed.listed
                || view.fenced(now, self.config.lease_duration)
                || now.saturating_duration_since(d.started) < self.config.renew_period * 2)
        {
            // Nothing is decided before this replica holds its Lease and has seen
            // the ring's, and replicas starting together have had two renew periods
            // to see each other: it would take clusters the others hold or are
            // about to, and sync them for nothing.
            return;
        }
        let desired = self.desired.borrow_and_update().clone();
        let configured: Vec<String> = desired.clusters.iter().map(|c| c.name.clone()).collect();
        let fenced = view.fenced(now, self.config.lease_duration);
        self.decide(d, &view, now, &configured, fenced);
        self.announce(d, &desired);
        let (members, unowned) = self.publish(d, &view, now, &configured);
        self.report_unowned(d, &unowned, now);
        let ids = assignable(&members);
        let owned = configured
            .iter()
            .filter(|c| {
                !fenced
                    && assign::owners(c, &ids, self.config.replication)
                        .contains(&self.config.identity.as_str())
            })
            .cloned()
            .collect();
        self.status.send_replace(ShardStatus {
            ring: self.config.ring.clone(),
            identity: self.config.identity.clone(),
            fenced,
            members: members.iter().map(|m| m.identity.clone()).collect(),
            owned,
            held: d.held.clone(),
            unowned,
            moves: d.moves,
            renew_failures: view.renew_failures,
        });
    }

    /// After a gap longer than the lease duration, what this replica holds may be
    /// stale: its streams list again to confirm it, and its clusters are ready again
    /// only once they have.
    fn after_a_gap(&mut self, d: &mut Decisions, now: Instant) {
        let gap = now.saturating_duration_since(d.last_turn);
        d.last_turn = now;
        if gap > self.config.lease_duration {
            tracing::warn!(ring = %self.config.ring, gap = ?gap, "this replica did not run for longer than its lease duration (stopped, or starved): its clusters are ready again only once their streams are current, each listed again now to confirm it");
            d.barrier = Some(now);
            (self.rewatch)();
        }
    }

    /// Decides what to hold next, and counts the moves.
    fn decide(
        &self,
        d: &mut Decisions,
        view: &View,
        now: Instant,
        configured: &[String],
        fenced: bool,
    ) {
        let members = members_now(view, now, &self.config, &self.published.borrow());
        let next: BTreeSet<String> = if fenced || self.leaving.is_cancelled() {
            // A fenced replica decides nothing: it keeps what it holds (answering
            // for none of it) until it renews. A leaving one serves what it holds
            // until it stops, and keeps it in its store for its return.
            d.held
                .iter()
                .filter(|c| configured.contains(c))
                .cloned()
                .collect()
        } else {
            hold(
                &self.config.identity,
                self.config.replication,
                &members,
                configured,
                &d.held,
            )
        };
        for c in next.difference(&d.held) {
            tracing::info!(ring = %self.config.ring, cluster = %c, "taking up the cluster");
        }
        for c in d.held.difference(&next) {
            tracing::info!(ring = %self.config.ring, cluster = %c, "letting the cluster go: its owners hold it ready");
        }
        if !d.first {
            d.moves += (next.symmetric_difference(&d.held).count()) as u64;
        }
        d.held = next;
    }

    /// Gives the engine the clusters held (the first decision even when it holds
    /// nothing: the engine starts on it).
    fn announce(&self, d: &mut Decisions, desired: &SourceSet) {
        let set = SourceSet {
            clusters: desired
                .clusters
                .iter()
                .filter(|c| d.held.contains(&c.name))
                .cloned()
                .collect(),
            loaded_at: desired.loaded_at,
            error: desired.error.clone(),
        };
        if std::mem::take(&mut d.first) {
            self.held.send_replace(set);
        } else {
            self.held.send_if_modified(|s| {
                let changed = *s != set;
                *s = set;
                changed
            });
        }
    }

    /// Publishes on the Lease the address, the configured, held and ready clusters,
    /// whether this replica is leaving, and the clusters nobody serves as it sees
    /// the ring; returns the members as they stand with what it publishes now, and
    /// the clusters nobody serves.
    fn publish(
        &self,
        d: &mut Decisions,
        view: &View,
        now: Instant,
        configured: &[String],
    ) -> (Vec<Member>, Vec<String>) {
        let synced = (self.synced)(d.barrier.map(Instant::into_std));
        if d.barrier.is_some() && d.held.iter().all(|c| synced.contains(c)) {
            tracing::info!(ring = %self.config.ring, "every cluster held is current again after the pause");
            d.barrier = None;
        }
        let ready: Vec<&str> = d
            .held
            .iter()
            .filter(|c| synced.contains(*c))
            .map(String::as_str)
            .collect();
        let held: Vec<&str> = d.held.iter().map(String::as_str).collect();
        let mut annotations = BTreeMap::from([
            (ADDRESS.to_string(), self.advertise.clone()),
            (CLUSTERS.to_string(), configured.join(",")),
            (READY.to_string(), ready.join(",")),
            (HELD.to_string(), held.join(",")),
        ]);
        if self.leaving.is_cancelled() {
            annotations.insert(LEAVING.to_string(), "true".to_string());
        }
        let members = members_now(view, now, &self.config, &annotations);
        let unowned = unowned(&members, configured);
        annotations.insert(UNOWNED.to_string(), unowned.join(","));
        self.published.send_if_modified(|p| {
            let changed = *p != annotations;
            *p = annotations;
            changed
        });
        (members, unowned)
    }

    /// Logs a cluster once it has had no ready owner for a lease duration (a move or
    /// a start takes a sync), and again when it has one.
    fn report_unowned(&self, d: &mut Decisions, unowned: &[String], now: Instant) {
        d.unowned_since.retain(|c, _| unowned.contains(c));
        for c in unowned {
            d.unowned_since.entry(c.clone()).or_insert(now);
        }
        let patience = self.config.lease_duration;
        for (c, since) in &d.unowned_since {
            let waited = now.saturating_duration_since((*since).max(d.started));
            if waited >= patience && d.reported.insert(c.clone()) {
                tracing::warn!(ring = %self.config.ring, cluster = %c, waited = ?waited, "the cluster has no ready owner: no replica serves it");
            }
        }
        let (ring, unowned_since) = (&self.config.ring, &d.unowned_since);
        d.reported.retain(|c| {
            let still = unowned_since.contains_key(c);
            if !still {
                tracing::info!(%ring, cluster = %c, "the cluster has a ready owner again");
            }
            still
        });
    }
}

/// Waits until every cluster `status` shows held is published ready by another live
/// member (this replica's clusters handed over), or there is no other member that
/// could take them.
pub async fn handed_over(
    mut status: watch::Receiver<ShardStatus>,
    mut view: watch::Receiver<View>,
) {
    loop {
        let done = {
            let s = status.borrow_and_update();
            let others: Vec<Member> = view
                .borrow_and_update()
                .members(Instant::now())
                .into_iter()
                .filter(|m| m.identity != s.identity)
                .collect();
            others.iter().all(leaving)
                || s.held
                    .iter()
                    .all(|c| others.iter().any(|m| ready_of(m).contains(c.as_str())))
        };
        if done {
            return;
        }
        tokio::select! {
            r = status.changed() => if r.is_err() { return },
            r = view.changed() => if r.is_err() { return },
        }
    }
}

/// Closed while this replica has not renewed its Lease within the lease duration: it
/// then must not answer as an owner it may no longer be.
pub struct Fence {
    /// The ring as seen.
    pub view: watch::Receiver<View>,
    /// The ring's name, for the error.
    pub ring: String,
    /// How long a renewal holds.
    pub lease_duration: Duration,
}

impl Gate for Fence {
    fn check(&self) -> Result<(), FleetError> {
        let view = self.view.borrow();
        if view.fenced(Instant::now(), self.lease_duration) {
            let why = view
                .renew_error
                .as_deref()
                .map_or_else(String::new, |e| format!(" (last renewal: {e})"));
            return Err(FleetError::Unavailable(format!(
                "this replica of ring {} has not renewed its Lease within {:?}{why}: it answers for no cluster until it renews; retry (a router sends the request to the clusters' owners)",
                self.ring, self.lease_duration
            )));
        }
        Ok(())
    }

    fn closing(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let view = self.view.clone();
        let duration = self.lease_duration;
        Box::pin(async move {
            // A renewal only moves the deadline later: sleep to the one known, then
            // look again.
            loop {
                let Some(at) = view.borrow().renewed_at else {
                    return;
                };
                let deadline = at + duration;
                if Instant::now() >= deadline {
                    return;
                }
                tokio::time::sleep_until(deadline).await;
            }
        })
    }
}

/// A fence over `view`, shared.
pub fn fence(view: watch::Receiver<View>, config: &MembershipConfig) -> Arc<dyn Gate> {
    Arc::new(Fence {
        view,
        ring: config.ring.clone(),
        lease_duration: config.lease_duration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, ready: &[&str]) -> Member {
        Member {
            identity: id.into(),
            annotations: BTreeMap::from([(READY.to_string(), ready.join(","))]),
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("cluster-{i}")).collect()
    }

    #[test]
    fn a_replica_holds_what_it_owns_and_what_its_new_owner_has_not_yet_made_ready() {
        let clusters = names(30);
        let before = [member("a", &[]), member("b", &[])];
        let a_owns = hold("a", 1, &before, &clusters, &BTreeSet::new());
        assert!(!a_owns.is_empty() && a_owns.len() < 30);
        // c joins: what it now owns stays with a until c publishes it ready.
        let joined = [member("a", &[]), member("b", &[]), member("c", &[])];
        let c_owns = hold("c", 1, &joined, &clusters, &BTreeSet::new());
        let a_keeps = hold("a", 1, &joined, &clusters, &a_owns);
        assert_eq!(
            a_keeps, a_owns,
            "nothing is let go before it is ready elsewhere"
        );
        let ready: Vec<&str> = c_owns.iter().map(String::as_str).collect();
        let synced = [member("a", &[]), member("b", &[]), member("c", &ready)];
        let a_after = hold("a", 1, &synced, &clusters, &a_owns);
        assert!(a_after.is_subset(&a_owns));
        assert!(a_after.is_disjoint(&c_owns));
        let moved: BTreeSet<String> = a_owns.difference(&a_after).cloned().collect();
        assert!(moved.is_subset(&c_owns), "a gives up only what c took");
    }

    #[test]
    fn a_leaving_member_is_assigned_nothing_and_keeps_serving_until_taken_over() {
        let clusters = names(20);
        let mut leaving_a = member("a", &[]);
        leaving_a
            .annotations
            .insert(LEAVING.to_string(), "true".to_string());
        let held_by_a: BTreeSet<String> = clusters.iter().cloned().collect();
        let members = [leaving_a.clone(), member("b", &[])];
        assert_eq!(hold("a", 1, &members, &clusters, &held_by_a), held_by_a);
        assert_eq!(
            hold("b", 1, &members, &clusters, &BTreeSet::new()).len(),
            20,
            "b owns everything while a leaves"
        );
        let all: Vec<&str> = clusters.iter().map(String::as_str).collect();
        let members = [leaving_a, member("b", &all)];
        assert!(hold("a", 1, &members, &clusters, &held_by_a).is_empty());
    }

    #[test]
    fn a_cluster_no_member_publishes_ready_is_unowned_and_one_no_longer_configured_goes() {
        let clusters = names(3);
        let members = [member("a", &["cluster-0"]), member("b", &["cluster-2"])];
        assert_eq!(unowned(&members, &clusters), ["cluster-1"]);
        let held: BTreeSet<String> = clusters.iter().cloned().collect();
        let fewer = &clusters[..1];
        assert!(hold("a", 2, &members, fewer, &held).len() <= 1);
    }
}
