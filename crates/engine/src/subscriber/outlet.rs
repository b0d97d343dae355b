//! Where a Watch's producer hands its events over: a short channel to the
//! subscriber's stream, the revision handed over so far, and the ending of a
//! subscriber that leaves its events unread (told where to resume).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetscope_model::fleet::{Watch, WatchEvent, reason};
use fleetscope_model::{FleetError, Revision};
use tokio::sync::mpsc;

use crate::DroppedCounts;

/// What a producer hands over.
type Delivery = Result<WatchEvent, FleetError>;

/// The producer's end of one subscriber's stream.
pub(super) struct Outlet {
    tx: mpsc::Sender<Delivery>,
    /// Where it has read to, stored after everything up to it was handed over.
    reached: Arc<AtomicU64>,
    /// How long a hand-off may wait for the subscriber to read.
    stall: Duration,
    /// Why the producer ended the subscriber for not reading, for its stream to say.
    stalled: Arc<Mutex<Option<FleetError>>>,
    /// The engine's counts of Watches ended for not keeping up.
    dropped: Arc<DroppedCounts>,
}

impl Outlet {
    /// An outlet and the subscriber's stream it feeds: the events handed over, then,
    /// when the subscriber was ended for not reading, why.
    pub(super) fn open(stall: Duration, dropped: Arc<DroppedCounts>) -> (Self, Watch) {
        // A short hand-off: the subscriber's real bound is the index's subscriber
        // buffer and event log, which it pulls from.
        let (tx, mut rx) = mpsc::channel(8);
        let reached = Arc::new(AtomicU64::new(0));
        let stalled: Arc<Mutex<Option<FleetError>>> = Arc::default();
        let told = stalled.clone();
        let watch = Watch::new(
            futures::stream::poll_fn(move |cx| match rx.poll_recv(cx) {
                // Ended for not reading: what was handed over, then why.
                std::task::Poll::Ready(None) => std::task::Poll::Ready(
                    told.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take()
                        .map(Err),
                ),
                other => other,
            }),
            reached.clone(),
        );
        let outlet = Self {
            tx,
            reached,
            stall,
            stalled,
            dropped,
        };
        (outlet, watch)
    }

    /// Hands one event over; false once the subscriber is gone, or has left its
    /// events unread for the stall bound (then it is ended, resumably).
    pub(super) async fn send(&self, event: WatchEvent) -> bool {
        match tokio::time::timeout(self.stall, self.tx.send(Ok(event))).await {
            Ok(sent) => sent.is_ok(),
            Err(_) => {
                let reached = self.reached.load(Ordering::Acquire);
                self.dropped.unread.fetch_add(1, Ordering::Relaxed);
                tracing::info!(stall = ?self.stall, %reached, "a Watch left its events unread: ended");
                *self.stalled.lock().unwrap_or_else(|e| e.into_inner()) = Some(
                    FleetError::ResourceExhausted {
                        message: format!(
                            "the Watch left its events unread for {:?} and was ended; last delivered revision {reached}: resume with since_revision={reached}",
                            self.stall
                        ),
                        reason: reason::WATCH_STALLED,
                        resume_from: Some(Revision(reached)),
                    },
                );
                false
            }
        }
    }

    /// Records that everything up to `revision` has been handed over.
    pub(super) fn reach(&self, revision: Revision) {
        self.reached.store(revision.0, Ordering::Release);
    }

    /// Ends the subscriber with `error`: sent after what it has not read yet, or,
    /// when it does not read, kept for its stream to yield once it does.
    pub(super) async fn end(&self, error: FleetError) {
        match self.tx.try_reserve() {
            Ok(slot) => slot.send(Err(error)),
            Err(_) => *self.stalled.lock().unwrap_or_else(|e| e.into_inner()) = Some(error),
        }
    }

    /// Ends the subscriber for falling further behind than the event log holds.
    pub(super) async fn end_behind(&self, message: String, reached: Revision) {
        self.dropped.behind.fetch_add(1, Ordering::Relaxed);
        self.end(FleetError::ResourceExhausted {
            message,
            reason: reason::WATCH_BEHIND,
            resume_from: Some(reached),
        })
        .await;
    }

    /// Resolves once the subscriber is gone.
    pub(super) async fn closed(&self) {
        self.tx.closed().await;
    }
}
