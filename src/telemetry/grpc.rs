//! The gRPC server's telemetry as one tower layer ([`GrpcLayer`]):
//! - a tracing span per RPC, lasting to the end of its response (a Watch: its whole
//!   stream), child of the W3C trace context (`traceparent`) the request carries, and
//!   exported over OTLP when traces are on ([`super::trace`]);
//! - metrics in go-grpc-prometheus's shape:
//!   `fleetscope_grpc_server_handled_total{grpc_service,grpc_method,grpc_type,grpc_code}`
//!   and `fleetscope_grpc_server_handling_seconds` (for a stream, the time to its
//!   first message), when a registry is given.
//!
//! The code is read where gRPC puts it: the response headers for an answer that is
//! only a status, else the trailers at the end of the body. A body dropped before its
//! trailers (the client went away) counts as `Canceled`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame};
use hyper::body::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing::Instrument;

/// Prometheus's default buckets, as go-grpc-prometheus uses them.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Which RPC.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Method {
    grpc_service: String,
    grpc_method: String,
    grpc_type: &'static str,
}

/// Which RPC, and how it ended.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Handled {
    grpc_service: String,
    grpc_method: String,
    grpc_type: &'static str,
    grpc_code: &'static str,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The RPC counters and latency histogram, registered once.
#[derive(Debug)]
pub struct GrpcMetrics {
    handled: Family<Handled, Counter>,
    handling: Family<Method, Histogram, fn() -> Histogram>,
}

impl GrpcMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let metrics = Arc::new(Self {
            handled: Family::default(),
            handling: Family::new_with_constructor(histogram),
        });
        registry.register(
            "fleetscope_grpc_server_handled",
            "RPCs completed on the server, by method and gRPC status code.",
            metrics.handled.clone(),
        );
        registry.register(
            "fleetscope_grpc_server_handling_seconds",
            "Time to answer an RPC: to its response for a unary call, to its first message (or its status) for a stream.",
            metrics.handling.clone(),
        );
        metrics
    }
}

/// The tower layer that traces every RPC and, with metrics, counts it; `off()` counts nothing.
#[derive(Debug, Clone, Default)]
pub struct GrpcLayer(Option<Arc<GrpcMetrics>>);

impl GrpcLayer {
    /// Counts into `metrics`.
    pub fn new(metrics: Arc<GrpcMetrics>) -> Self {
        Self(Some(metrics))
    }

    /// Traces, and counts nothing.
    pub fn off() -> Self {
        Self(None)
    }
}

impl<S> tower::Layer<S> for GrpcLayer {
    type Service = GrpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcService {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// See [`GrpcLayer`].
#[derive(Debug, Clone)]
pub struct GrpcService<S> {
    inner: S,
    metrics: Option<Arc<GrpcMetrics>>,
}

/// `/package.Service/Method` → (service, method, type).
fn method_of(path: &str) -> Method {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let service = parts.next().unwrap_or_default().to_string();
    let method = parts.next().unwrap_or_default().to_string();
    let kind = match method.as_str() {
        "Watch" => "server_stream",
        "ServerReflectionInfo" => "bidi_stream",
        _ => "unary",
    };
    Method {
        grpc_service: service,
        grpc_method: method,
        grpc_type: kind,
    }
}

/// gRPC's name for a status code, as go-grpc-prometheus labels it.
fn code_number(code: &[u8]) -> i64 {
    std::str::from_utf8(code)
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2)
}

fn code_name(code: &[u8]) -> &'static str {
    match code {
        b"0" => "OK",
        b"1" => "Canceled",
        b"2" => "Unknown",
        b"3" => "InvalidArgument",
        b"4" => "DeadlineExceeded",
        b"5" => "NotFound",
        b"6" => "AlreadyExists",
        b"7" => "PermissionDenied",
        b"8" => "ResourceExhausted",
        b"9" => "FailedPrecondition",
        b"10" => "Aborted",
        b"11" => "OutOfRange",
        b"12" => "Unimplemented",
        b"13" => "Internal",
        b"14" => "Unavailable",
        b"15" => "DataLoss",
        b"16" => "Unauthenticated",
        _ => "Unknown",
    }
}

/// One RPC being answered: observed once when it first answers, counted once when
/// it ends.
struct Call {
    metrics: Option<Arc<GrpcMetrics>>,
    method: Method,
    started: Instant,
    answered: bool,
    ended: bool,
    /// The RPC's span: closed when the call is dropped (its response ended).
    span: tracing::Span,
}

impl Call {
    fn answered(&mut self) {
        if !self.answered {
            self.answered = true;
            if let Some(metrics) = &self.metrics {
                metrics
                    .handling
                    .get_or_create(&self.method)
                    .observe(self.started.elapsed().as_secs_f64());
            }
        }
    }

    fn ended(&mut self, code: &'static str, number: i64) {
        self.answered();
        if !self.ended {
            self.ended = true;
            self.span.record("rpc.grpc.status_code", number);
            if number != 0 {
                self.span.record("otel.status_code", "ERROR");
            }
            let m = &self.method;
            if let Some(metrics) = &self.metrics {
                metrics
                    .handled
                    .get_or_create(&Handled {
                        grpc_service: m.grpc_service.clone(),
                        grpc_method: m.grpc_method.clone(),
                        grpc_type: m.grpc_type,
                        grpc_code: code,
                    })
                    .inc();
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // Dropped before its status: the client (or the server's shutdown) cut it.
        self.ended("Canceled", 1);
    }
}

impl<S, B, RB> tower::Service<http::Request<B>> for GrpcService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<Counted<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_of(request.uri().path());
        // At debug level: free when nothing exports it (logs at info), recorded when
        // traces are on (their layer takes fleetscope's spans at any level).
        let span = tracing::debug_span!(
            target: "fleetscope::rpc",
            "rpc",
            otel.name = %format!("{}/{}", method.grpc_service, method.grpc_method),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            rpc.system = "grpc",
            rpc.service = %method.grpc_service,
            rpc.method = %method.grpc_method,
            rpc.grpc.status_code = tracing::field::Empty,
        );
        super::trace::continue_trace(&span, request.headers());
        let mut call = Call {
            metrics: self.metrics.clone(),
            method,
            started: Instant::now(),
            answered: false,
            ended: false,
            span: span.clone(),
        };
        let answer = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Box::pin(
            async move {
                let response = answer.await?;
                // A status-only answer carries its code in the headers.
                if let Some(code) = response.headers().get("grpc-status") {
                    call.ended(code_name(code.as_bytes()), code_number(code.as_bytes()));
                }
                Ok(response.map(|body| Counted {
                    body: Box::pin(body),
                    call,
                }))
            }
            .instrument(span),
        )
    }
}

/// A response body that reports its first message and its trailers' status.
pub struct Counted<B> {
    body: Pin<Box<B>>,
    call: Call,
}

impl<B: Body<Data = Bytes>> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let span = self.call.span.clone();
        let _entered = span.enter();
        let polled = self.body.as_mut().poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            match frame.trailers_ref() {
                Some(trailers) => {
                    let code = trailers.get("grpc-status");
                    self.call.ended(
                        code.map_or("Unknown", |c| code_name(c.as_bytes())),
                        code.map_or(2, |c| code_number(c.as_bytes())),
                    );
                }
                None => self.call.answered(),
            }
        }
        polled
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

    #[test]
    fn methods_and_codes_are_named_as_go_grpc_prometheus_names_them() {
        let m = method_of("/fleetscope.v1.Fleet/Watch");
        assert_eq!(
            (m.grpc_service.as_str(), m.grpc_method.as_str(), m.grpc_type),
            ("fleetscope.v1.Fleet", "Watch", "server_stream")
        );
        assert_eq!(method_of("/fleetscope.v1.Fleet/List").grpc_type, "unary");
        assert_eq!(code_name(b"0"), "OK");
        assert_eq!(code_name(b"3"), "InvalidArgument");
        assert_eq!(code_name(b"14"), "Unavailable");
        assert_eq!(code_name(b"99"), "Unknown");
    }
}
