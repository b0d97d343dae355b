//! A Watch on the wire: the fleet's events converted, with bookmarks added every
//! interval (carrying the revision the watch has reached, never ahead of an event
//! still to come), ended when the server shuts down.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use fleetscope_model::Revision;
use fleetscope_model::fleet::{Watch, WatchEvent};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::convert;
use super::status::status;
use fleetscope_proto as proto;

/// The stream type of `Watch`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

fn marker(t: proto::EventType, revision: Revision) -> proto::WatchEvent {
    proto::WatchEvent {
        r#type: t as i32,
        revision: revision.0,
        ..proto::WatchEvent::default()
    }
}

/// A stream position on the wire: one cluster's of the watched `resource`.
fn position(resource: &str, cluster: &str, rv: &str) -> proto::StreamPosition {
    proto::StreamPosition {
        cluster: cluster.to_string(),
        resource: resource.to_string(),
        resource_version: rv.to_string(),
    }
}

/// One event on the wire, of a Watch of `resource` (as its query names it).
pub(crate) fn event(e: WatchEvent, resource: &str) -> proto::WatchEvent {
    match e {
        WatchEvent::Object {
            kind,
            object,
            revision,
            position: at,
        } => proto::WatchEvent {
            r#type: convert::event_type(kind) as i32,
            position: at.map(|rv| position(resource, object.key.cluster.as_str(), &rv)),
            object: Some(convert::object(object)),
            revision: revision.0,
            ..proto::WatchEvent::default()
        },
        WatchEvent::InitialEventsEnd { revision, token } => proto::WatchEvent {
            position_token: token,
            ..marker(proto::EventType::InitialEventsEnd, revision)
        },
        WatchEvent::ClusterStatus { cluster, revision } => proto::WatchEvent {
            r#type: proto::EventType::ClusterStatus as i32,
            revision: revision.0,
            cluster: Some(convert::cluster_freshness(cluster)),
            ..proto::WatchEvent::default()
        },
        WatchEvent::Positions {
            positions,
            revision,
        } => proto::WatchEvent {
            r#type: proto::EventType::Bookmark as i32,
            revision: revision.0,
            positions: positions
                .iter()
                .map(|(c, rv)| position(resource, c.as_str(), rv))
                .collect(),
            ..proto::WatchEvent::default()
        },
        WatchEvent::Reset { cluster } => proto::WatchEvent {
            r#type: proto::EventType::Reset as i32,
            position: Some(position(resource, cluster.as_str(), "")),
            ..proto::WatchEvent::default()
        },
        WatchEvent::ResetEnd {
            cluster,
            position: rv,
            revision,
        } => proto::WatchEvent {
            r#type: proto::EventType::ResetEnd as i32,
            revision: revision.0,
            position: Some(position(resource, cluster.as_str(), &rv)),
            ..proto::WatchEvent::default()
        },
        WatchEvent::Bookmark { token } => proto::WatchEvent {
            r#type: proto::EventType::Bookmark as i32,
            position_token: token,
            ..proto::WatchEvent::default()
        },
    }
}

/// What ends a stream whose caller's credentials stop being valid while it runs (a
/// token revoked, a certificate expired): each call gives a future resolving, with the
/// status to end on, once they are no longer valid. The authentication layer puts
/// one in every request's extensions; a request without one is held to nothing more
/// than its start.
#[derive(Clone)]
pub struct Revocation(Arc<dyn Fn() -> futures::future::BoxFuture<'static, Status> + Send + Sync>);

impl Revocation {
    /// A revocation watched by `revoked`.
    pub fn new(
        revoked: impl Fn() -> futures::future::BoxFuture<'static, Status> + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(revoked))
    }

    /// Resolves, with the status to end on, once the credentials are no longer valid.
    pub fn revoked(&self) -> futures::future::BoxFuture<'static, Status> {
        (self.0)()
    }
}

impl std::fmt::Debug for Revocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Revocation")
    }
}

/// The Watch streams a service has open (in all and per caller) and has ended.
#[derive(Debug, Default)]
pub struct Subscribers {
    active: AtomicI64,
    ended: AtomicU64,
    /// Per caller: streams open, and admissions waiting for a place.
    by_caller: std::sync::Mutex<std::collections::HashMap<String, Places>>,
    /// Woken whenever a stream ends and frees its place.
    freed: tokio::sync::Notify,
}

/// One caller's streams.
#[derive(Debug, Default)]
struct Places {
    open: usize,
    waiting: usize,
}

/// How long an admission at the cap waits for a place: a client that ends its
/// streams and opens new ones at once (a reconnect) finds the places of the ones it
/// ended, whose teardown reaches the server a moment after.
const ADMIT_WAIT: Duration = Duration::from_secs(2);

/// The most admissions of one caller waiting for a place at once; more are refused
/// at once, so a caller at its cap cannot hold many requests in flight.
const MAX_WAITING: usize = 16;

impl Subscribers {
    /// Streams open now.
    pub fn active(&self) -> i64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Streams ended, for whatever reason, since start.
    pub fn ended(&self) -> u64 {
        self.ended.load(Ordering::Relaxed)
    }

    /// A place for one more stream of `caller`, if it has fewer than `max` open, or
    /// comes to have within [`ADMIT_WAIT`].
    pub async fn admit(self: &Arc<Self>, caller: &str, max: usize) -> Option<Joined> {
        let deadline = tokio::time::Instant::now() + ADMIT_WAIT;
        let mut waiting = false;
        let joined = loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the count is read, so a place freed in between wakes it.
            freed.as_mut().enable();
            match self.try_admit(caller, max, &mut waiting) {
                Some(joined) => break Some(joined),
                None if !waiting => return None,
                None => {}
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                break None;
            }
        };
        if waiting {
            let mut by_caller = self.by_caller.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = by_caller.get_mut(caller) {
                p.waiting = p.waiting.saturating_sub(1);
                if p.open == 0 && p.waiting == 0 {
                    by_caller.remove(caller);
                }
            }
        }
        joined
    }

    /// A place now, if there is one; otherwise, the admission waits (`waiting` set)
    /// unless too many of the caller's already do.
    fn try_admit(self: &Arc<Self>, caller: &str, max: usize, waiting: &mut bool) -> Option<Joined> {
        let mut by_caller = self.by_caller.lock().unwrap_or_else(|e| e.into_inner());
        let places = by_caller.entry(caller.to_string()).or_default();
        if places.open >= max {
            if !*waiting && places.waiting < MAX_WAITING {
                places.waiting += 1;
                *waiting = true;
            }
            return None;
        }
        places.open += 1;
        self.active.fetch_add(1, Ordering::Relaxed);
        Some(Joined {
            subscribers: self.clone(),
            caller: caller.to_string(),
        })
    }
}

/// One open stream, counted until dropped.
pub struct Joined {
    subscribers: Arc<Subscribers>,
    caller: String,
}

impl Drop for Joined {
    fn drop(&mut self) {
        let s = &self.subscribers;
        s.active.fetch_sub(1, Ordering::Relaxed);
        s.ended.fetch_add(1, Ordering::Relaxed);
        let mut by_caller = s.by_caller.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = by_caller.get_mut(&self.caller) {
            p.open = p.open.saturating_sub(1);
            if p.open == 0 && p.waiting == 0 {
                by_caller.remove(&self.caller);
            }
        }
        drop(by_caller);
        s.freed.notify_waiters();
    }
}

/// The wire stream of `watch`: its events, and a bookmark each `interval`; counted
/// (by `joined`) while it is open; ended with the status `revocation` gives once the
/// caller's credentials stop being valid.
pub fn stream(
    mut watch: Watch,
    resource: String,
    interval: Duration,
    shutdown: CancellationToken,
    joined: Joined,
    revocation: Option<Revocation>,
) -> WatchStream {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopped = Box::pin(shutdown.cancelled_owned());
    let mut revoked = revocation.map(|r| r.revoked());
    let mut ended = false;
    Box::pin(futures::stream::poll_fn(move |cx| {
        let _counted = &joined;
        if ended || stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        if let Some(Poll::Ready(why)) = revoked.as_mut().map(|r| r.as_mut().poll(cx)) {
            ended = true;
            return Poll::Ready(Some(Err(why)));
        }
        if let Poll::Ready(item) = watch.poll_next_unpin(cx) {
            ended = !matches!(item, Some(Ok(_)));
            return Poll::Ready(item.map(|r| r.map(|e| event(e, &resource)).map_err(status)));
        }
        while ticks.poll_tick(cx).is_ready() {
            if let Some(at) = watch.bookmark(cx) {
                return Poll::Ready(Some(Ok(marker(proto::EventType::Bookmark, at))));
            }
            // An event came first: it is yielded now, the bookmark waits a tick.
            if let Poll::Ready(item) = watch.poll_next_unpin(cx) {
                ended = !matches!(item, Some(Ok(_)));
                return Poll::Ready(item.map(|r| r.map(|e| event(e, &resource)).map_err(status)));
            }
        }
        Poll::Pending
    }))
}
