//! A Watch's producer: the initial objects (if asked), the streams sent anew, then
//! every change after the start from the index's feed, each checked against what
//! the subscriber may see ([`Grant`]) and, for a Watch that follows member
//! positions, against where its stream stands ([`Positions`]); cluster freshness
//! changes as events; a new policy put in force at the revision the subscriber has
//! reached; a subscriber that falls behind ended with a resumable error.

use std::collections::HashMap;
use std::sync::Arc;

use fleetscope_index::{Event, FeedError, Index, Query, State, Subscription, transition};
use fleetscope_model::fleet::{Freshness, WatchEvent};
use fleetscope_model::{ClusterName, EventType, FleetError, Revision};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::evaluate::Evaluator;
use super::grant::Grant;
use super::outlet::Outlet;
use super::positions::{Follow, POSITIONS_EVERY, Positions, Told};
use crate::status::{ClusterFreshness, FreshnessChange, StatusTable};
use crate::view::event_object;

/// One subscriber's producer.
pub(super) struct Producer {
    pub(super) outlet: Outlet,
    pub(super) grant: Grant,
    pub(super) positions: Positions,
    pub(super) eval: Evaluator,
    pub(super) index: Arc<Index>,
    pub(super) status: StatusTable,
    pub(super) statuses: broadcast::Receiver<FreshnessChange>,
    /// Each cluster's freshness for the watched type, as the Watch stood at its start
    /// or was last told.
    pub(super) told: HashMap<ClusterName, (Freshness, String)>,
    /// The query for the initial state (drawing on the clusters selected at start).
    pub(super) initial: Option<Query>,
    pub(super) cancel: CancellationToken,
}

impl Producer {
    /// Runs until the subscriber goes, is ended, or the engine stops.
    pub(super) async fn run(mut self, subscription: Subscription) {
        let Subscription { snapshot, mut feed } = subscription;
        if !self.start(snapshot, feed.reached()).await {
            return;
        }
        // Positions that move without a change (the member's bookmarks) are told
        // now and then, once the subscriber has every change before them.
        let mut moved = tokio::time::interval(POSITIONS_EVERY);
        moved.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let go_on = tokio::select! {
                _ = self.cancel.cancelled() => false,
                _ = moved.tick(), if self.positions.reports() || self.positions.catching_up() => {
                    self.tick(feed.reached()).await
                }
                Some((cluster, caught)) = self.positions.next_caught() => {
                    let told = self.positions.caught(&cluster, caught, feed.reached(), &self.grant.resource().name());
                    self.history_told(cluster, told, feed.reached()).await
                }
                _ = self.outlet.closed() => false,
                r = feed.next() => match r {
                    Ok(events) => self.changes(&events, feed.reached()).await,
                    Err(e @ FeedError::Behind { reached, .. }) => {
                        self.outlet.end_behind(e.to_string(), reached).await;
                        false
                    }
                    Err(e @ FeedError::Expired { oldest, .. }) => {
                        self.outlet.end(FleetError::OutOfRange {
                            message: e.to_string(),
                            reason: fleetscope_model::fleet::reason::REVISION_COMPACTED,
                            oldest: Some(oldest),
                        }).await;
                        false
                    }
                    Err(FeedError::Closed) => false,
                },
                _ = self.grant.policy_changed() => {
                    self.grant.take_policy(&self.index);
                    // Idle and caught up: in force at once.
                    self.grant.maybe_switch(feed.reached(), &self.eval, &self.outlet).await
                }
                c = self.statuses.recv() => match c {
                    Ok(c) => self.cluster_changed(c, feed.reached()).await,
                    Err(_) => true,
                },
            };
            if !go_on {
                return;
            }
        }
    }

    /// What comes before the live changes: a position checked against its member,
    /// the initial objects and their end, the streams sent anew, and (for a Watch
    /// that reports them) where every stream stands. False once the subscriber is
    /// gone or ended.
    async fn start(&mut self, snapshot: Arc<State>, reached: Revision) -> bool {
        if let Some(error) = self
            .positions
            .beyond_members(self.grant.resource(), &self.cancel)
            .await
        {
            self.outlet.end(error).await;
            return false;
        }
        if let Some(initial) = self.initial.take() {
            if !self
                .eval
                .send_objects(&snapshot, initial, &self.grant, &self.outlet)
                .await
            {
                return false;
            }
            let at = snapshot.revision();
            let end = WatchEvent::InitialEventsEnd {
                revision: at,
                token: String::new(),
            };
            if !self.outlet.send(end).await {
                return false;
            }
            self.outlet.reach(at);
        } else {
            self.outlet.reach(reached);
        }
        for cluster in self.positions.take_resets() {
            if !self.reset(cluster, snapshot.clone()).await {
                return false;
            }
        }
        if self.positions.reports() {
            if !self.positions.positioned() {
                // From the snapshot the Watch starts at: every selected stream it has.
                let grant = &mut self.grant;
                let name = grant.resource().name();
                self.positions
                    .track_from(&snapshot, &name, |c| grant.selects(c));
            }
            let positions = self.positions.all();
            let revision = reached.max(snapshot.revision());
            if !self
                .outlet
                .send(WatchEvent::Positions {
                    positions,
                    revision,
                })
                .await
            {
                return false;
            }
        }
        true
    }

    /// Delivers a batch of changes from the feed, which has reached `reached`. False
    /// once the subscriber is gone or ended.
    async fn changes(&mut self, events: &[Arc<Event>], reached: Revision) -> bool {
        let Some(kinds) = self.eval.transitions(events).await else {
            return false;
        };
        for (e, kind) in events.iter().zip(kinds) {
            // Changes after a new policy's snapshot are checked against it.
            let before = Revision(e.revision.0.saturating_sub(1));
            if !self
                .grant
                .maybe_switch(before, &self.eval, &self.outlet)
                .await
            {
                return false;
            }
            let cluster = &e.object.key.cluster;
            if self.positions.follows() && self.grant.selects(cluster) {
                match self.positions.follow(e) {
                    Follow::Deliver => {}
                    Follow::Skip => continue,
                    Follow::Left => {
                        self.outlet
                            .end(FleetError::Unavailable(format!(
                                "cluster {cluster} left this replica: follow it where it is served now"
                            )))
                            .await;
                        return false;
                    }
                    Follow::Reset => {
                        if !self.reset(cluster.clone(), self.index.snapshot()).await {
                            return false;
                        }
                        continue;
                    }
                }
            }
            if let Some(ev) = self.event(e, kind) {
                if !self.outlet.send(ev).await {
                    return false;
                }
                if self.positions.reports() {
                    self.positions.told(cluster);
                }
            }
        }
        if !self
            .grant
            .maybe_switch(reached, &self.eval, &self.outlet)
            .await
        {
            return false;
        }
        // The position moves past changes that did not match too.
        self.outlet.reach(reached);
        true
    }

    /// What a change means to this subscriber, if anything, given what it means to
    /// its filter (`kind`, from [`Evaluator::transitions`]).
    fn event(&mut self, e: &Event, kind: Option<EventType>) -> Option<WatchEvent> {
        let key = &e.object.key;
        if !self.grant.admits(&key.cluster, &key.namespace) {
            return None;
        }
        let kind = kind?;
        Some(WatchEvent::Object {
            kind,
            object: self.grant.show(event_object(e, self.eval.projection)),
            revision: e.revision,
            // A change of no position of its own (a re-list's) leaves the stream's
            // position unknown until the re-list's last.
            position: self
                .positions
                .reports()
                .then(|| e.position.clone().unwrap_or_else(|| Arc::from(""))),
        })
    }

    /// Sends one cluster's stream anew from `snapshot`: the reset, its objects, and
    /// where it stands; what the snapshot holds is then the subscriber's. False once
    /// the subscriber is gone.
    async fn reset(&mut self, cluster: ClusterName, snapshot: Arc<State>) -> bool {
        let resource = self.grant.resource().name();
        tracing::debug!(%cluster, %resource, "a Watch's stream sent anew");
        if !self
            .outlet
            .send(WatchEvent::Reset {
                cluster: cluster.clone(),
            })
            .await
        {
            return false;
        }
        let query = self.positions.reset_query(&cluster);
        if !self
            .eval
            .send_objects(&snapshot, query, &self.grant, &self.outlet)
            .await
        {
            return false;
        }
        let position = self.positions.restarted(&cluster, &snapshot, &resource);
        self.outlet
            .send(WatchEvent::ResetEnd {
                cluster,
                position,
                revision: snapshot.revision(),
            })
            .await
    }

    /// Now and then: streams carried by their history that meet this replica's are
    /// handed over, and positions that moved without a change are told. False once
    /// the subscriber is gone.
    async fn tick(&mut self, reached: Revision) -> bool {
        let resource = self.grant.resource().name();
        let snapshot = self.index.snapshot();
        self.positions.meet_all(&snapshot, reached, &resource);
        if !self.positions.reports() {
            return true;
        }
        let moved = self.positions.moved(&snapshot, reached, &resource);
        moved.is_empty()
            || self
                .outlet
                .send(WatchEvent::Positions {
                    positions: moved,
                    revision: reached,
                })
                .await
    }

    /// Acts on what a history read told about `cluster`'s stream: sends the changes
    /// the subscriber's filter and grant let through and hands the stream over where
    /// it meets this replica's, or sends it anew. False once the subscriber is gone.
    async fn history_told(&mut self, cluster: ClusterName, told: Told, reached: Revision) -> bool {
        match told {
            Told::Nothing => true,
            Told::Reset => self.reset(cluster, self.index.snapshot()).await,
            Told::Changes(events, by_content) => {
                for e in &events {
                    let kind = transition(&self.eval.query, e);
                    if let Some(ev) = self.event(e, kind)
                        && !self.outlet.send(ev).await
                    {
                        return false;
                    }
                }
                let resource = self.grant.resource().name();
                let snapshot = self.index.snapshot();
                self.positions
                    .meet(&cluster, &snapshot, reached, by_content, &resource);
                true
            }
        }
    }

    /// Tells the subscriber of a cluster's change of freshness, when it concerns the
    /// watched type and the subscriber sees the cluster. False once it is gone.
    async fn cluster_changed(&mut self, change: FreshnessChange, reached: Revision) -> bool {
        // What the change means for this Watch's type: a change of other types'
        // streams is none of its business.
        let Some(c) = self.as_watched(change) else {
            return true;
        };
        if !self.grant.cluster_changed(&c.cluster) {
            return true;
        }
        self.outlet
            .send(WatchEvent::ClusterStatus {
                cluster: c,
                revision: reached,
            })
            .await
    }

    /// A cluster's change of freshness as it concerns the watched type, if it changes
    /// what this Watch was last told of (or would have been, at its start).
    fn as_watched(&mut self, change: FreshnessChange) -> Option<ClusterFreshness> {
        let resource = self.grant.resource().name();
        let watched = change
            .by_type
            .as_ref()
            .and_then(|types| types.get(&resource).cloned());
        let c = change.overall;
        let c = match (watched, self.status.cluster(&c.cluster)) {
            // Its stream as it stood at the change.
            (Some(watched), _) => watched,
            (None, Some(status)) => {
                let (freshness, stale_since, message) = status.freshness(Some(&resource));
                ClusterFreshness {
                    cluster: c.cluster,
                    freshness,
                    stale_since,
                    message,
                }
            }
            // Gone from the fleet: said as it is.
            (None, None) => c,
        };
        let now = (c.freshness, c.message.clone());
        if self.told.get(&c.cluster) == Some(&now) {
            return None;
        }
        self.told.insert(c.cluster.clone(), now);
        Some(c)
    }
}
