//! A connection's peer as the server knows it: its address, its client certificate,
//! and the streams it has open (counted for closing idle connections). Below both the
//! server, which learns it at the handshake, and authentication, which reads it.

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

/// The streams one connection has open, since when it has had none, and whether a
/// call on it was authenticated yet.
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
    /// Whether the peer has proved who it is: a client certificate at the handshake,
    /// or a call admitted with its credentials.
    authenticated: std::sync::atomic::AtomicBool,
    /// Told to close before it authenticated: a newer connection took its place.
    evicted: std::sync::atomic::AtomicBool,
    /// Its places while it has not authenticated: under the connection cap, given
    /// back only if it is evicted, and among the connections not yet authenticated,
    /// given back once it is.
    places: std::sync::Mutex<Places>,
}

impl Default for ConnStreams {
    fn default() -> Self {
        Self {
            active: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
            used: std::sync::atomic::AtomicBool::new(false),
            waker: AtomicWaker::new(),
            authenticated: std::sync::atomic::AtomicBool::new(false),
            evicted: std::sync::atomic::AtomicBool::new(false),
            places: std::sync::Mutex::new(Places::default()),
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

    /// A connection whose peer proved who it is already (a client certificate).
    pub fn authenticated_at_start() -> Self {
        let s = Self::default();
        s.authenticated.store(true, Ordering::Release);
        s
    }

    /// A connection not yet authenticated, holding its place under the connection
    /// cap (`open`), and `pending` among the connections not authenticated until it is.
    pub fn pending(
        open: tokio::sync::OwnedSemaphorePermit,
        pending: tokio::sync::OwnedSemaphorePermit,
    ) -> Self {
        let s = Self::default();
        *s.places.lock().unwrap_or_else(|e| e.into_inner()) = Places {
            _open: Some(open),
            pending: Some(pending),
        };
        s
    }

    /// Marks the connection authenticated (a call on it was admitted with its
    /// credentials): its place among those not yet authenticated is given back, and
    /// it is no longer closed for not authenticating.
    pub fn authenticated(&self) {
        if self.authenticated.swap(true, Ordering::AcqRel) {
            return;
        }
        self.places
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pending
            .take();
        self.waker.wake();
    }

    /// Whether the peer has proved who it is.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// Tells a connection that has not authenticated to close, giving its places back
    /// at once (it closes within a frame); false when it has authenticated or was told
    /// already.
    pub fn evict(&self) -> bool {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        if self.authenticated.load(Ordering::Acquire) || self.evicted.load(Ordering::Acquire) {
            return false;
        }
        self.evicted.store(true, Ordering::Release);
        let given_back = std::mem::take(&mut *places);
        drop(places);
        drop(given_back);
        self.waker.wake();
        true
    }

    /// Why the connection is to close, and from when: a connection that has not
    /// authenticated within `to_authenticate` of its start (or was evicted), else one
    /// idle long enough, given the time a connection may idle before its first stream
    /// and after one. `None` while a stream is open on an authenticated connection.
    pub fn close_deadline(
        &self,
        before_first: Duration,
        after: Duration,
        to_authenticate: Duration,
    ) -> Option<(tokio::time::Instant, Closing)> {
        if self.evicted.load(Ordering::Acquire) {
            return Some((self.epoch, Closing::Evicted));
        }
        let unproved = (!self.authenticated.load(Ordering::Acquire))
            .then(|| (self.epoch + to_authenticate, Closing::Unauthenticated));
        let idle = self
            .idle_deadline(before_first, after)
            .map(|at| (at, Closing::Idle));
        match (unproved, idle) {
            (Some(u), Some(i)) => Some(if i.0 < u.0 { i } else { u }),
            (u, i) => u.or(i),
        }
    }

    /// When the connection becomes idle long enough to close, given the time a
    /// connection may idle before its first stream and after one: `None` while a
    /// stream is open.
    pub fn idle_deadline(
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

    /// Wakes the connection's task (`cx`) when its last stream ends.
    pub fn register(&self, cx: &Context<'_>) {
        self.waker.register(cx.waker());
    }
}

/// The places a connection holds while it has not authenticated.
#[derive(Debug, Default)]
struct Places {
    /// Held only to be given back: dropped on eviction.
    _open: Option<tokio::sync::OwnedSemaphorePermit>,
    pending: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Why a connection is closed by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// No stream open for the idle timeout.
    Idle,
    /// No call authenticated within its time.
    Unauthenticated,
    /// Not authenticated, and its place given to a newer connection.
    Evicted,
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
