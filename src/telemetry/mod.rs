//! Logging: `tracing` with an env filter (`RUST_LOG`, default `info`) as text or JSON;
//! Prometheus metrics ([`metrics`]); OpenTelemetry traces ([`trace`]); the gRPC
//! server's layer for both ([`grpc`]).

pub mod grpc;
pub mod metrics;
pub mod trace;

use tracing_subscriber::EnvFilter;

pub use crate::config::flags::LogFormat;

/// What must outlive the process's work for telemetry to be complete: the tracer
/// provider, whose last spans are flushed when this is dropped.
#[derive(Debug, Default)]
#[must_use = "dropping it flushes and stops trace export"]
pub struct Telemetry {
    traces: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.traces.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber: logs in `format`, and OpenTelemetry traces when
/// the environment asks for them ([`trace`]). Safe to call once per process, within
/// the Tokio runtime.
pub fn init(format: LogFormat) -> Telemetry {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // A cluster's client logs no line per request (fleetscope says a cluster failed
    // once per outage, and that it recovered once; fleetscope_rest_client_requests_total
    // counts the requests).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal, never in files or log collectors.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        // One flat object a line: `message` and the event's fields beside `level`,
        // `timestamp` and `target`, as log pipelines index them.
        LogFormat::Json => logs.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let (traces, problem) = if trace::wanted() {
        match trace::provider() {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, None)
    };
    let exporting = traces.as_ref().map(trace::layer);
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(exporting)
        .try_init();
    if let Some(e) = problem {
        tracing::error!(error = %e, "traces are not exported");
    } else if traces.is_some() {
        tracing::info!("exporting traces over OTLP");
    }
    Telemetry { traces }
}
