//! How much the server takes on: a bound on requests in flight across all connections,
//! shedding the excess at once with `UNAVAILABLE` (retryable) instead of queueing it,
//! and the timeouts and HTTP/2 settings the server is built with. Health checks are
//! never shed: a busy server is not a dead one.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Semaphore;

/// The server's limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The longest a request may take to its response (for a stream, to its first
    /// message); a client's `grpc-timeout` may be shorter. Default 30 s.
    pub request_timeout: Duration,
    /// Requests being handled at once, across all connections; more are refused with
    /// `UNAVAILABLE`. A Watch holds its place only until its stream starts. Default 1,024.
    pub max_in_flight: usize,
    /// HTTP/2 streams one connection may have open at once. Default 1,024.
    pub max_streams_per_connection: u32,
    /// HTTP/2 keepalive: a PING after this much silence, and the connection closed if
    /// it is not answered within `keepalive_timeout`. Default 30 s and 20 s.
    pub keepalive_interval: Duration,
    /// See `keepalive_interval`.
    pub keepalive_timeout: Duration,
}

impl Limits {
    /// The gRPC server's limits, as `args` set them.
    pub fn of(args: &crate::config::flags::ListenerArgs) -> Self {
        Self {
            request_timeout: args.grpc_request_timeout,
            max_in_flight: usize::try_from(args.grpc_max_in_flight).unwrap_or(usize::MAX),
            keepalive_interval: args.grpc_keepalive_interval,
            keepalive_timeout: args.grpc_keepalive_timeout,
            ..Default::default()
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            max_in_flight: 1024,
            max_streams_per_connection: 1024,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

/// Sheds requests beyond a bound on those in flight (see [`Limits::max_in_flight`]).
#[derive(Debug, Clone)]
pub struct ShedLayer {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl ShedLayer {
    /// At most `limit` requests in flight.
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }
}

impl<S> tower::Layer<S> for ShedLayer {
    type Service = Shed<S>;
    fn layer(&self, inner: S) -> Shed<S> {
        Shed {
            inner,
            permits: self.permits.clone(),
            limit: self.limit,
        }
    }
}

/// The service of [`ShedLayer`].
#[derive(Debug, Clone)]
pub struct Shed<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
}

impl<S, B> tower::Service<http::Request<B>> for Shed<S>
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
        let health = request.uri().path().starts_with("/grpc.health.v1.Health/");
        let permit = if health {
            None
        } else {
            match self.permits.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    let status = tonic::Status::unavailable(format!(
                        "fleetscope is handling its limit of {} requests: retry with backoff",
                        self.limit
                    ));
                    return Box::pin(async move { Ok(status.into_http()) });
                }
            }
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let r = response.await;
            drop(permit);
            r
        })
    }
}

/// Answers a request the server could not decode as the client's mistake: a body that
/// is not the method's protobuf message is `INVALID_ARGUMENT` (tonic says `INTERNAL`),
/// a message over the size limit `RESOURCE_EXHAUSTED` (tonic says `OUT_OF_RANGE`), as
/// gRPC's other servers answer them.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireErrorsLayer;

impl<S> tower::Layer<S> for WireErrorsLayer {
    type Service = WireErrors<S>;
    fn layer(&self, inner: S) -> WireErrors<S> {
        WireErrors { inner }
    }
}

/// The service of [`WireErrorsLayer`].
#[derive(Debug, Clone)]
pub struct WireErrors<S> {
    inner: S,
}

/// The status a decoding failure is answered with, if `status` is one.
fn client_mistake(status: &tonic::Status) -> Option<tonic::Status> {
    let m = status.message();
    match status.code() {
        tonic::Code::Internal
            if m.starts_with("failed to decode Protobuf message")
                || m.starts_with("Unexpected EOF decoding stream") =>
        {
            Some(tonic::Status::invalid_argument(format!(
                "the request is not a valid message for this method: {}",
                crate::grpc::echo(m)
            )))
        }
        tonic::Code::OutOfRange if m.starts_with("Error, decoded message length too large") => {
            Some(tonic::Status::resource_exhausted(m.to_string()))
        }
        _ => None,
    }
}

impl<S, B> tower::Service<http::Request<B>> for WireErrors<S>
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
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            // A request that fails to decode is answered before any message, with
            // the status in the headers (trailers-only).
            if let Some(status) = tonic::Status::from_header_map(response.headers())
                && let Some(fixed) = client_mistake(&status)
            {
                let _ = fixed.add_header(response.headers_mut());
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    /// A service that answers once given a permit.
    #[derive(Clone)]
    struct Gate(Arc<Semaphore>);

    impl tower::Service<http::Request<()>> for Gate {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let gate = self.0.clone();
            Box::pin(async move {
                gate.acquire().await.expect("open").forget();
                Ok(http::Response::new(tonic::body::Body::empty()))
            })
        }
    }

    fn code(r: &http::Response<tonic::body::Body>) -> Option<tonic::Code> {
        tonic::Status::from_header_map(r.headers()).map(|s| s.code())
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    #[tokio::test]
    async fn requests_past_the_limit_are_unavailable_at_once_but_health_is_not_shed() {
        let gate = Arc::new(Semaphore::new(0));
        let mut svc = ShedLayer::new(2).layer(Gate(gate.clone()));
        let a = svc
            .ready()
            .await
            .unwrap()
            .call(request("/fleetscope.v1.Fleet/List"));
        let b = svc
            .ready()
            .await
            .unwrap()
            .call(request("/fleetscope.v1.Fleet/Get"));
        let shed = svc
            .ready()
            .await
            .unwrap()
            .call(request("/fleetscope.v1.Fleet/Count"))
            .await
            .unwrap();
        assert_eq!(code(&shed), Some(tonic::Code::Unavailable));
        let health = svc
            .ready()
            .await
            .unwrap()
            .call(request("/grpc.health.v1.Health/Check"));
        let (a, b, health) = (tokio::spawn(a), tokio::spawn(b), tokio::spawn(health));
        gate.add_permits(3);
        let (a, b, health) = (
            a.await.unwrap().unwrap(),
            b.await.unwrap().unwrap(),
            health.await.unwrap().unwrap(),
        );
        assert_eq!(code(&a), None);
        assert_eq!(code(&b), None);
        assert_eq!(code(&health), None);
        // Their places are free again.
        let again = svc
            .ready()
            .await
            .unwrap()
            .call(request("/fleetscope.v1.Fleet/Count"));
        let again = tokio::spawn(again);
        gate.add_permits(1);
        assert_eq!(code(&again.await.unwrap().unwrap()), None);
    }
}
