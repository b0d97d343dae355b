//! A Watch's filter, evaluated on the engine's query threads as List and Count are,
//! not on the async workers: the initial objects a page at a time, and the live
//! events of a costly filter (a field selector, or many label terms) a batch at a
//! time. So many Watches with heavy filters take their turn with the queries and
//! never hold up another client's call.

use std::sync::Arc;

use fleetscope_index::{Event, Query, State, transition};
use fleetscope_model::fleet::{Projection, WatchEvent};
use fleetscope_model::{EventType, ObjectKey};
use tokio_util::sync::CancellationToken;

use super::grant::Grant;
use super::outlet::Outlet;
use crate::view::fleet_object;

/// Objects of the initial state evaluated per turn on a query thread.
const INITIAL_PAGE: usize = 1024;

/// Whether evaluating `query` against each live event is worth a query thread: a
/// field selector (which may read the object's JSON), or more than a few label terms.
fn costly(query: &Query) -> bool {
    !query.fields.is_empty() || query.labels.requirements().len() > 8
}

/// A Watch's filter and how its objects are shown, with the threads it runs on.
pub(super) struct Evaluator {
    /// The filter on live events (every cluster: the producer checks each event's
    /// cluster against the live fleet and the policy in force).
    pub(super) query: Arc<Query>,
    /// Whether `query`'s live evaluation runs on a query thread.
    costly: bool,
    /// The engine's query threads' places.
    pool: Arc<tokio::sync::Semaphore>,
    cancel: CancellationToken,
    /// What of each object the subscriber is sent.
    pub(super) projection: Projection,
}

impl Evaluator {
    /// `query` evaluated on `pool`'s threads until `cancel`.
    pub(super) fn new(
        query: Query,
        projection: Projection,
        pool: Arc<tokio::sync::Semaphore>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            costly: costly(&query),
            query: Arc::new(query),
            pool,
            cancel,
            projection,
        }
    }

    /// What each event means to the filter: evaluated here when that is cheap, on a
    /// query thread when the filter is costly. `None` once the engine stops.
    pub(super) async fn transitions(
        &self,
        events: &[Arc<Event>],
    ) -> Option<Vec<Option<EventType>>> {
        if !self.costly {
            return Some(events.iter().map(|e| transition(&self.query, e)).collect());
        }
        let (query, events) = (self.query.clone(), events.to_vec());
        self.on_pool(move || events.iter().map(|e| transition(&query, e)).collect())
            .await
    }

    /// Sends the objects of `snapshot` that `query` selects, as `Added` and as
    /// `grant` shows them, a page per turn of a query thread. False once the
    /// subscriber is gone.
    pub(super) async fn send_objects(
        &self,
        snapshot: &Arc<State>,
        query: Query,
        grant: &Grant,
        outlet: &Outlet,
    ) -> bool {
        let query = Arc::new(query);
        let mut after: Option<ObjectKey> = None;
        loop {
            let (state, query, from, projection) = (
                snapshot.clone(),
                query.clone(),
                after.take(),
                self.projection,
            );
            let Some(page) = self
                .on_pool(move || {
                    state
                        .matching(&query, from.as_ref())
                        .take(INITIAL_PAGE)
                        .map(|o| (fleet_object(o, projection), o.revision))
                        .collect::<Vec<_>>()
                })
                .await
            else {
                return false;
            };
            let more = page.len() == INITIAL_PAGE;
            for (object, revision) in page {
                after = Some(object.key.clone());
                let e = WatchEvent::Object {
                    kind: EventType::Added,
                    object: grant.show(object),
                    revision,
                    position: None,
                };
                if !outlet.send(e).await {
                    return false;
                }
            }
            if !more {
                return true;
            }
        }
    }

    /// Runs `work` on one of the engine's query threads, once one is free; `None`
    /// when the engine stops first.
    async fn on_pool<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let place = tokio::select! {
            p = self.pool.clone().acquire_owned() => p.ok()?,
            _ = self.cancel.cancelled() => return None,
        };
        tokio::task::spawn_blocking(move || {
            let _place = place;
            work()
        })
        .await
        .ok()
    }
}
