//! Idle connections: a gRPC connection that has no stream open for a bounded time is
//! closed with an HTTP/2 GOAWAY, so connections that hold a place and do nothing
//! (a client that connected and went quiet, or a hostile one answering only PINGs)
//! cannot keep others out.
//!
//! The streams a connection has open are counted by [`StreamsLayer`], in front of
//! every service; the connection itself (`super::tls::Conn`) follows the HTTP/2
//! frames it carries (only their 9-byte headers: lengths, types, stream ids), so that
//! it can write a GOAWAY between two of the server's frames, naming the last stream
//! the client opened, and then end the connection.

use std::pin::Pin;

use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};

use crate::peer::{ConnStreams, PeerInfo, StreamGuard};

/// Follows HTTP/2 frames in one direction of a connection by their headers.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    /// Bytes of the client's connection preface still to pass before frames begin.
    preface: usize,
    header: [u8; 9],
    filled: usize,
    /// Payload bytes of the current frame still to pass.
    remaining: usize,
    /// The highest stream a HEADERS frame opened.
    last_stream: u32,
}

/// The length of the client's HTTP/2 connection preface.
pub(crate) const PREFACE: usize = 24;

impl Frames {
    /// The frames a client sends: after its preface.
    pub(crate) fn from_client() -> Self {
        Self {
            preface: PREFACE,
            ..Self::default()
        }
    }

    /// Takes note of bytes that passed.
    pub(crate) fn saw(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                bytes = &bytes[n..];
            } else if self.remaining > 0 {
                let n = self.remaining.min(bytes.len());
                self.remaining -= n;
                bytes = &bytes[n..];
            } else {
                let n = (9 - self.filled).min(bytes.len());
                self.header[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
                self.filled += n;
                bytes = &bytes[n..];
                if self.filled == 9 {
                    let h = &self.header;
                    self.remaining =
                        usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    // HEADERS opens a stream (trailers reuse an open one's id).
                    if h[3] == 0x1 {
                        self.last_stream = self.last_stream.max(stream);
                    }
                    self.filled = 0;
                }
            }
        }
    }

    /// Whether the bytes so far end between two frames.
    pub(crate) fn between_frames(&self) -> bool {
        self.preface == 0 && self.remaining == 0 && self.filled == 0
    }

    /// The highest stream the peer opened.
    pub(crate) fn last_stream(&self) -> u32 {
        self.last_stream
    }
}

/// A GOAWAY frame (NO_ERROR) naming `last_stream`, with `why` as its debug data.
pub(crate) fn goaway(last_stream: u32, why: &str) -> Vec<u8> {
    let len = 8 + why.len();
    let mut f = Vec::with_capacity(9 + len);
    f.extend_from_slice(&u32::try_from(len).unwrap_or(8).to_be_bytes()[1..]);
    f.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    f.extend_from_slice(why.as_bytes());
    f
}

/// Connections closed for idling, since start.
pub static CLOSED_IDLE: AtomicU64 = AtomicU64::new(0);

/// Connections closed for making no authenticated call in time (or to make room for
/// a newer one), since start.
pub static CLOSED_UNAUTHENTICATED: AtomicU64 = AtomicU64::new(0);

/// Counts each request's stream on its connection (see [`ConnStreams`]) until its
/// response ends.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamsLayer;

impl<S> tower::Layer<S> for StreamsLayer {
    type Service = Streams<S>;
    fn layer(&self, inner: S) -> Streams<S> {
        Streams { inner }
    }
}

/// The service of [`StreamsLayer`].
#[derive(Debug, Clone)]
pub struct Streams<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Streams<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let guard = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.streams.as_ref())
            .map(ConnStreams::open);
        let response = self.inner.call(request);
        Box::pin(async move {
            let r = response.await?;
            Ok(match guard {
                Some(guard) => r.map(|body| {
                    tonic::body::Body::new(Counted {
                        body,
                        _guard: guard,
                    })
                }),
                None => r,
            })
        })
    }
}

/// A response body that keeps its stream counted until it is dropped.
struct Counted {
    body: tonic::body::Body,
    _guard: StreamGuard,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn frame(kind: u8, stream: u32, payload: usize) -> Vec<u8> {
        let mut f = u32::try_from(payload).unwrap().to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, 0]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend(std::iter::repeat_n(0u8, payload));
        f
    }

    #[test]
    fn frames_are_followed_across_any_split_and_the_last_stream_is_the_highest_opened() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, 6));
        bytes.extend(frame(0x1, 1, 40));
        bytes.extend(frame(0x0, 1, 300));
        bytes.extend(frame(0x1, 7, 12));
        bytes.extend(frame(0x1, 3, 12));
        for split in [1, 2, 5, 9, 10, 64, 1000] {
            let mut f = Frames::from_client();
            for chunk in bytes.chunks(split) {
                f.saw(chunk);
            }
            assert!(f.between_frames(), "split {split}");
            assert_eq!(f.last_stream(), 7);
            f.saw(&frame(0x0, 7, 10)[..12]);
            assert!(!f.between_frames());
        }
    }

    #[test]
    fn a_goaway_is_one_well_formed_frame() {
        let g = goaway(5, "idle");
        let mut f = Frames::default();
        f.saw(&g);
        assert!(f.between_frames());
        assert_eq!(&g[..9], &[0, 0, 12, 0x7, 0, 0, 0, 0, 0]);
        assert_eq!(&g[9..13], &5u32.to_be_bytes());
        assert_eq!(&g[17..], b"idle");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_from_its_start_and_from_its_last_stream() {
        let s = Arc::new(ConnStreams::default());
        let first = Duration::from_secs(10);
        let after = Duration::from_secs(60);
        let start = tokio::time::Instant::now();
        assert_eq!(s.idle_deadline(first, after), Some(start + first));
        let g = s.open();
        assert_eq!(s.idle_deadline(first, after), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(g);
        let d = s.idle_deadline(first, after).unwrap();
        assert!(
            d >= start + Duration::from_secs(65) - Duration::from_millis(1),
            "{d:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_must_authenticate_in_time_and_gives_its_places_back_if_evicted() {
        use crate::peer::Closing;
        let open = Arc::new(tokio::sync::Semaphore::new(1));
        let pending = Arc::new(tokio::sync::Semaphore::new(1));
        let (idle, auth) = (Duration::from_secs(60), Duration::from_secs(10));
        let start = tokio::time::Instant::now();
        let s = ConnStreams::pending(
            open.clone().try_acquire_owned().unwrap(),
            pending.clone().try_acquire_owned().unwrap(),
        );
        // A stream open does not keep a connection that has not authenticated.
        let g = Arc::new(s);
        let stream = g.open();
        assert_eq!(
            g.close_deadline(idle, idle, auth),
            Some((start + auth, Closing::Unauthenticated))
        );
        g.authenticated();
        assert_eq!(
            pending.available_permits(),
            1,
            "its place among those waiting is back"
        );
        assert_eq!(
            open.available_permits(),
            0,
            "its place under the cap is kept"
        );
        assert_eq!(g.close_deadline(idle, idle, auth), None);
        assert!(!g.evict(), "an authenticated connection is never evicted");
        drop(stream);
        let (at, why) = g.close_deadline(idle, idle, auth).unwrap();
        assert_eq!(why, Closing::Idle);
        assert!(at >= start + idle);
        drop(g);
        // Evicted: both places back at once, and due to close now.
        let e = ConnStreams::pending(
            open.clone().try_acquire_owned().unwrap(),
            pending.clone().try_acquire_owned().unwrap(),
        );
        assert!(e.evict());
        assert!(!e.evict());
        assert_eq!(
            (open.available_permits(), pending.available_permits()),
            (1, 1)
        );
        assert_eq!(
            e.close_deadline(idle, idle, auth),
            Some((start, Closing::Evicted))
        );
        assert!(
            ConnStreams::authenticated_at_start()
                .close_deadline(idle, idle, auth)
                .is_some_and(|(_, why)| why == Closing::Idle)
        );
    }
}
