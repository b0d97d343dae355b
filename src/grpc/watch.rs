//! One Watch subscriber's producer: backlog then live from the event log, the cluster
//! filter evaluated per event against the live fleet, filter transitions, bookmarks.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetscope_index::{FeedError, transition};
use fleetscope_model::{ClusterFilter, ClusterName, Revision};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::convert::{event_type, freshness_proto, object_proto, timestamp};
use crate::proto;
use crate::status::StatusTable;

/// One Watch subscriber's producer.
pub(crate) struct WatchJob {
    pub(crate) query: fleetscope_index::Query,
    pub(crate) projection: proto::Projection,
    pub(crate) filter: ClusterFilter,
    /// Labels of the clusters seen, kept after a cluster leaves (its DELETEDs are
    /// matched with the labels it had).
    pub(crate) labels: BTreeMap<ClusterName, BTreeMap<String, String>>,
    /// Whether the filter selects each cluster seen, decided once per cluster (its
    /// labels do not change while it is in the fleet; a status change decides again).
    pub(crate) selected: std::collections::HashMap<ClusterName, bool>,
    pub(crate) status: StatusTable,
    /// The query for the initial state (drawing on the clusters selected at start).
    pub(crate) initial: Option<fleetscope_index::Query>,
    pub(crate) interval: Duration,
    pub(crate) statuses: broadcast::Receiver<crate::status::FreshnessChange>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tx: mpsc::Sender<Result<proto::WatchEvent, Status>>,
}

impl WatchJob {
    /// Whether the filter selects a cluster, by the labels it has (or had).
    fn selects(&mut self, cluster: &ClusterName) -> bool {
        if self.filter.is_everything() {
            return true;
        }
        if let Some(&yes) = self.selected.get(cluster) {
            return yes;
        }
        if !self.labels.contains_key(cluster)
            && let Some(c) = self.status.cluster(cluster)
        {
            self.labels.insert(c.name, c.labels);
        }
        let none = BTreeMap::new();
        let labels = self.labels.get(cluster).unwrap_or(&none);
        let yes = self.filter.matches(cluster, labels);
        self.selected.insert(cluster.clone(), yes);
        yes
    }

    /// Sends what a change means to this subscriber; false once the client is gone.
    async fn deliver(&mut self, e: &fleetscope_index::Event) -> bool {
        if !self.selects(&e.object.key.cluster) {
            return true;
        }
        match transition(&self.query, e) {
            Some(t) => {
                let ev = proto::WatchEvent {
                    r#type: event_type(t) as i32,
                    object: Some(object_proto(&e.object, self.projection)),
                    revision: e.revision.0,
                    cluster: None,
                };
                self.send(ev).await
            }
            None => true,
        }
    }

    async fn send(&self, e: proto::WatchEvent) -> bool {
        self.tx.send(Ok(e)).await.is_ok()
    }

    fn marker(t: proto::EventType, revision: Revision) -> proto::WatchEvent {
        proto::WatchEvent {
            r#type: t as i32,
            object: None,
            revision: revision.0,
            cluster: None,
        }
    }

    pub(crate) async fn run(mut self, sub: fleetscope_index::Subscription) {
        let fleetscope_index::Subscription { snapshot, mut feed } = sub;
        if let Some(initial) = self.initial.take() {
            for o in snapshot.matching(&initial, None) {
                let e = proto::WatchEvent {
                    r#type: proto::EventType::Added as i32,
                    object: Some(object_proto(o, self.projection)),
                    revision: o.revision.0,
                    cluster: None,
                };
                if !self.send(e).await {
                    return;
                }
            }
            if !self
                .send(Self::marker(
                    proto::EventType::InitialEventsEnd,
                    snapshot.revision(),
                ))
                .await
            {
                return;
            }
        }
        drop(snapshot);
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.tx.closed() => return,
                r = feed.next() => match r {
                    Ok(events) => {
                        for e in &events {
                            if !self.deliver(e).await {
                                return;
                            }
                        }
                    }
                    Err(e @ FeedError::Behind { .. }) => {
                        let _ = self.tx.send(Err(Status::resource_exhausted(e.to_string()))).await;
                        return;
                    }
                    Err(e @ FeedError::Expired { .. }) => {
                        let _ = self.tx.send(Err(Status::out_of_range(e.to_string()))).await;
                        return;
                    }
                    Err(FeedError::Closed) => return,
                },
                c = self.statuses.recv() => {
                    if let Ok(c) = &c {
                        // A cluster added (again) may have other labels: decide anew.
                        if let Some(now) = self.status.cluster(&c.cluster) {
                            self.labels.insert(now.name, now.labels);
                        }
                        self.selected.remove(&c.cluster);
                    }
                    if let Ok(c) = c
                        && self.selects(&c.cluster)
                    {
                        let cluster = proto::ClusterFreshness {
                            cluster: c.cluster.to_string(),
                            freshness: freshness_proto(c.freshness) as i32,
                            stale_since: c.stale_since.map(timestamp),
                            message: c.message,
                        };
                        let ev = proto::WatchEvent { r#type: proto::EventType::ClusterStatus as i32, object: None, revision: feed.reached().0, cluster: Some(cluster) };
                        if !self.send(ev).await {
                            return;
                        }
                    }
                }
                _ = ticks.tick() => {
                    if !self.send(Self::marker(proto::EventType::Bookmark, feed.reached())).await {
                        return;
                    }
                }
            }
        }
    }
}
