//! The metrics and probe listener (`--metrics-listen`): `/metrics` (the registry,
//! for identities the policy grants it), `/healthz` and `/livez` (the process
//! answers), `/readyz` (the engine or router is ready, or why not).

use std::sync::Arc;

use fleetscope_engine::Engine;
use fleetscope_model::fleet::Deferred;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The server's figures the metrics read, at a scrape.
pub fn figures() -> crate::telemetry::metrics::ServerFigures {
    use std::sync::atomic::Ordering::Relaxed;
    crate::telemetry::metrics::ServerFigures {
        refused: super::tls::Refusal::ALL
            .iter()
            .zip(&super::tls::REFUSED)
            .map(|(why, n)| (why.as_str(), n.load(Relaxed)))
            .collect(),
        closed_idle: super::idle::CLOSED_IDLE.load(Relaxed),
        closed_unauthenticated: super::idle::CLOSED_UNAUTHENTICATED.load(Relaxed),
        tasks: crate::tasks::running().into_iter().collect(),
    }
}

/// Whether a process can answer, and why not when it cannot (for `/readyz`).
pub trait Readiness: Send + Sync + 'static {
    /// `Ok` when ready; why not, otherwise.
    fn readiness(&self) -> Result<(), String>;
}

impl Readiness for Deferred<Engine> {
    /// Ready once the engine is (restored, or every cluster discovered once or
    /// failed).
    fn readiness(&self) -> Result<(), String> {
        match self.get() {
            Some(e) if e.observe().ready => Ok(()),
            Some(_) => Err("discovering clusters".into()),
            None => Err("starting: loading the store".into()),
        }
    }
}

impl Readiness for crate::router::Router {
    fn readiness(&self) -> Result<(), String> {
        crate::router::Router::readiness(self)
    }
}

/// Serves `/metrics`, `/healthz`, `/livez` and `/readyz` on `listener` until `stop`.
/// `/readyz` answers 200 once `ready` says so, 503 (saying why) before.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    engine: Arc<dyn Readiness>,
    security: super::Security,
    stop: CancellationToken,
) {
    let guard = Arc::new(security.guard.clone());
    let respond = move |r: Request<Incoming>, peer: crate::peer::PeerInfo| {
        let (registry, engine, guard) = (registry.clone(), engine.clone(), guard.clone());
        async move {
            if r.uri().path() == "/metrics"
                && let Err(refused) = guard.admit_metrics(r.headers(), Some(&peer)).await
            {
                // An HTTP refusal's code, as the Kubernetes API's are chosen.
                let code = crate::kubeapi::status::refused(&refused).code;
                let code = StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN);
                let body = format!("{}\n", refused.message());
                return text(code, "text/plain; charset=utf-8", body);
            }
            answer(&r, &registry, &engine)
        }
    };
    let names = ("metrics", "metrics-connection");
    super::http::serve(listener, &security, stop, names, respond).await;
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn answer(
    r: &Request<Incoming>,
    registry: &Registry,
    engine: &Arc<dyn Readiness>,
) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if r.method() != Method::GET && r.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "GET only\n".into());
    }
    match r.uri().path() {
        "/metrics" => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => text(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    body,
                ),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    PLAIN,
                    "encoding the metrics failed\n".into(),
                ),
            }
        }
        "/healthz" | "/livez" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/readyz" => match engine.readiness() {
            Ok(()) => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, format!("{why}\n")),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: /metrics, /healthz, /readyz\n".into(),
        ),
    }
}
