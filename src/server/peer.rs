//! A connection's peer as the server knows it: its address, its client certificate,
//! and the streams it has open (counted for closing idle connections, see
//! [`super::idle`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Context;
use std::time::Duration;

use fleetscope_model::access::Subject;
use futures::task::AtomicWaker;

/// What the server knows of a connection's peer, in every request's extensions.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Who the client certificate names, when one was presented and verified, or why
    /// it names no one.
    pub certificate: Option<Result<Subject, String>>,
    /// When the client certificate stops being valid (its `notAfter`): a stream
    /// it authenticated ends then.
    pub certificate_expires: Option<std::time::SystemTime>,
    /// The streams the connection has open (gRPC connections only), for closing it
    /// once idle.
    pub streams: Option<Arc<ConnStreams>>,
}

impl PeerInfo {
    /// Whether the peer is on this host.
    pub fn is_loopback(&self) -> bool {
        self.remote.is_some_and(|a| a.ip().is_loopback())
    }
}

/// The streams one connection has open, and since when it has had none.
#[derive(Debug)]
pub struct ConnStreams {
    active: AtomicUsize,
    /// Milliseconds since `epoch` at which the last stream ended (or the connection
    /// began).
    idle_since_ms: AtomicU64,
    epoch: tokio::time::Instant,
    /// Whether a stream was ever opened on the connection.
    used: std::sync::atomic::AtomicBool,
    /// The connection's task, woken when its last stream ends so that it starts to
    /// count its idle time.
    waker: AtomicWaker,
}

impl Default for ConnStreams {
    fn default() -> Self {
        Self {
            active: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
            used: std::sync::atomic::AtomicBool::new(false),
            waker: AtomicWaker::new(),
        }
    }
}

impl ConnStreams {
    /// One more stream, counted until the guard is dropped.
    pub fn open(self: &Arc<Self>) -> StreamGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.used.store(true, Ordering::Release);
        StreamGuard(self.clone())
    }

    /// When the connection becomes idle long enough to close, given the time a
    /// connection may idle before its first stream and after one: `None` while a
    /// stream is open.
    pub(crate) fn idle_deadline(
        &self,
        before_first: Duration,
        after: Duration,
    ) -> Option<tokio::time::Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.epoch + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        let bound = if self.used.load(Ordering::Acquire) {
            after
        } else {
            before_first
        };
        Some(since + bound)
    }

    pub(crate) fn register(&self, cx: &Context<'_>) {
        self.waker.register(cx.waker());
    }
}

/// One open stream of a connection.
#[derive(Debug)]
pub struct StreamGuard(Arc<ConnStreams>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let s = &self.0;
        let ms = u64::try_from(s.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        s.idle_since_ms.store(ms, Ordering::Release);
        if s.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            s.waker.wake();
        }
    }
}
