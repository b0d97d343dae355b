//! OpenTelemetry traces over OTLP (gRPC), on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set and not disabled by `OTEL_SDK_DISABLED`
//! or `OTEL_TRACES_EXPORTER=none`; nothing is exported otherwise. The standard
//! variables apply as the OpenTelemetry SDK reads them: `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES` (service name `fleetscope` unless given),
//! `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, `OTEL_EXPORTER_OTLP_*`
//! (endpoint, headers, timeout, compression), `OTEL_BSP_*` (batching).
//!
//! fleetscope's own spans are exported: one per RPC (see [`super::grpc`]), continuing
//! the W3C trace context of the request, and one per stream of a cluster and each
//! list it makes (with the cluster and resource type).

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// An OTLP protocol other than gRPC.
    #[error("{var}={value:?}: fleetscope exports traces over OTLP/gRPC only (set it to grpc)")]
    Protocol {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter cannot be built (a malformed endpoint, say).
    #[error("building the OTLP trace exporter: {0}")]
    Exporter(String),
}

fn set(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// Whether the environment asks for traces.
pub fn wanted() -> bool {
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    !disabled
        && (set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some())
}

/// The tracer provider the environment asks for. Must be called within the Tokio
/// runtime (the exporter's channel lives on it).
pub fn provider() -> Result<SdkTracerProvider, TraceError> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(value) = set(var) {
            if value != "grpc" {
                return Err(TraceError::Protocol { var, value });
            }
            break;
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| TraceError::Exporter(e.to_string()))?;
    let named = set("OTEL_SERVICE_NAME").is_some()
        || set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
    let mut resource = opentelemetry_sdk::Resource::builder().with_attribute(
        opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    );
    if !named {
        resource = resource.with_service_name("fleetscope");
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The spans exported: an RPC, a cluster's stream of one type, one list it makes.
const EXPORTED: [&str; 3] = ["rpc", "informer", "list"];

/// The layer sending fleetscope's spans to `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("fleetscope"))
        // fleetscope's spans only (not every HTTP request of its clients), and of
        // those the RPCs, the streams and their lists: not the spans that last as long
        // as the process. A span's exported parent is its nearest exported ancestor.
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.target().starts_with("fleetscope")
                && (!meta.is_span() || EXPORTED.contains(&meta.name()))
        }))
}

/// Reads W3C trace context from request headers.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Makes `span` a child of the trace context in `headers` (`traceparent`,
/// `tracestate`), when there is one and traces are on.
pub fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    let _ = span.set_parent(parent);
}
