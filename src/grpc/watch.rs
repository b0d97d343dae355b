//! A Watch on the wire: the fleet's events converted, with bookmarks added every
//! interval (carrying the revision the watch has reached, never ahead of an event
//! still to come), ended when the server shuts down.

use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use fleetscope_model::Revision;
use fleetscope_model::fleet::{Watch, WatchEvent};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::convert;
use super::status::status;
use crate::proto;

/// The stream type of `Watch`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

fn marker(t: proto::EventType, revision: Revision) -> proto::WatchEvent {
    proto::WatchEvent {
        r#type: t as i32,
        object: None,
        revision: revision.0,
        cluster: None,
    }
}

fn event(e: WatchEvent) -> proto::WatchEvent {
    match e {
        WatchEvent::Object {
            kind,
            object,
            revision,
        } => proto::WatchEvent {
            r#type: convert::event_type(kind) as i32,
            object: Some(convert::object(object)),
            revision: revision.0,
            cluster: None,
        },
        WatchEvent::InitialEventsEnd(revision) => {
            marker(proto::EventType::InitialEventsEnd, revision)
        }
        WatchEvent::ClusterStatus { cluster, revision } => proto::WatchEvent {
            r#type: proto::EventType::ClusterStatus as i32,
            object: None,
            revision: revision.0,
            cluster: Some(convert::cluster_freshness(cluster)),
        },
    }
}

/// The wire stream of `watch`: its events, and a bookmark each `interval`.
pub(crate) fn stream(
    mut watch: Watch,
    interval: Duration,
    shutdown: CancellationToken,
) -> WatchStream {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopped = Box::pin(shutdown.cancelled_owned());
    Box::pin(futures::stream::poll_fn(move |cx| {
        if stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(item) = watch.poll_next_unpin(cx) {
            return Poll::Ready(item.map(|r| r.map(event).map_err(status)));
        }
        while ticks.poll_tick(cx).is_ready() {
            if let Some(at) = watch.bookmark(cx) {
                return Poll::Ready(Some(Ok(marker(proto::EventType::Bookmark, at))));
            }
            // An event came first: it is yielded now, the bookmark waits a tick.
            if let Poll::Ready(item) = watch.poll_next_unpin(cx) {
                return Poll::Ready(item.map(|r| r.map(event).map_err(status)));
            }
        }
        Poll::Pending
    }))
}
