//! The gRPC server: the Fleet service, standard health checking and server reflection
//! (v1 and v1alpha, so grpcurl of any age can `list` and `describe`).

pub mod http;
pub mod idle;
pub mod kube_api;
pub mod limits;
pub mod probes;
pub mod run;
pub mod tls;

use std::future::Future;

use tokio::net::TcpListener;

use fleetscope_model::Fleet;

use crate::auth::{AuthLayer, Guard};
use crate::grpc::FleetService;
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::proto::fleet_server::FleetServer;
use crate::telemetry::grpc::GrpcLayer;
use limits::{Limits, ShedLayer, WireErrorsLayer};

/// A failure to start or run the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound.
    // Each cause is shown once: in the message when it is not chained as a source.
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        /// The address, as given.
        addr: String,
        /// Why (not chained: the message carries it).
        cause: std::io::Error,
    },
    /// The reflection service could not be built from the descriptor sets.
    #[error("building server reflection")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed while serving.
    #[error("serving gRPC")]
    Transport(#[from] tonic::transport::Error),
}

/// Binds the listen address (`host:port`, a name such as `localhost` resolved); done
/// before anything else starts, so a taken port fails fast.
pub async fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|cause| ServerError::Bind {
            addr: addr.to_string(),
            cause,
        })
}

/// Serves until `shutdown` resolves, then stops accepting and ends open streams.
/// gRPC health reports `NOT_SERVING` (for the server and for the Fleet service) until
/// `ready` resolves, then `SERVING`.
pub async fn serve<F: Fleet>(
    listener: TcpListener,
    service: FleetService<F>,
    ready: impl Future<Output = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    serve_with(
        listener,
        service,
        ready,
        shutdown,
        GrpcLayer::off(),
        Limits::default(),
        Security::default(),
    )
    .await
}

/// How the server is secured: TLS (the configuration in force when each connection
/// arrives), who may call it, and how connections are admitted.
#[derive(Clone, Default)]
pub struct Security {
    /// The TLS configuration, reloaded as its files change; `None` for plaintext.
    pub tls: Option<tokio::sync::watch::Receiver<std::sync::Arc<rustls::ServerConfig>>>,
    /// Authentication and the policy.
    pub guard: Guard,
    /// The connection cap and handshake timeout.
    pub admission: tls::Admission,
}

/// [`serve`], counting every RPC with `metrics`, within `limits`, secured by `security`.
pub async fn serve_with<F: Fleet>(
    listener: TcpListener,
    service: FleetService<F>,
    ready: impl Future<Output = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send,
    metrics: GrpcLayer,
    limits: Limits,
    security: Security,
) -> Result<(), ServerError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_not_serving::<FleetServer<FleetService<F>>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let readiness = crate::tasks::spawn("readiness", async move {
        ready.await;
        health.set_serving::<FleetServer<FleetService<F>>>().await;
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        tracing::info!("ready: health checks report SERVING");
    });
    let reflection = |b: tonic_reflection::server::Builder<'static>| {
        b.register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection(tonic_reflection::server::Builder::configure()).build_v1()?;
    let reflection_v1alpha =
        reflection(tonic_reflection::server::Builder::configure()).build_v1alpha()?;
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let stop_accepting = tokio_util::sync::CancellationToken::new();
    let tls_on = security.tls.is_some();
    let incoming = tls::incoming(
        listener,
        security.tls,
        tls::Protocol::Http2,
        security.admission,
        stop_accepting.clone(),
    );
    tracing::info!(%addr, tls = tls_on, "serving fleetscope.v1.Fleet");
    tonic::transport::Server::builder()
        .timeout(limits.request_timeout)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        // Counted first, so a shed request is counted as the UNAVAILABLE it gets.
        .layer(metrics)
        // Each request's stream is counted on its connection, so an idle one closes.
        .layer(idle::StreamsLayer)
        .layer(WireErrorsLayer)
        .layer(ShedLayer::new(limits.max_in_flight))
        .layer(AuthLayer::new(security.guard))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(FleetServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    stop_accepting.cancel();
    readiness.abort();
    tracing::info!("server stopped");
    Ok(())
}

/// Ctrl-C (SIGINT) and SIGTERM, listened for from the moment this returns (so their
/// default, ending the process at once, no longer applies even before the returned
/// future is first polled); the future resolves on either.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutdown requested");
    })
}

/// SIGHUP, as a stream of requests to reload every input: once this returns, SIGHUP
/// no longer ends the process (its default), whatever the process is doing.
pub fn hangups() -> std::io::Result<tokio::sync::mpsc::Receiver<()>> {
    let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    crate::tasks::spawn("sighup", async move {
        loop {
            tokio::select! {
                received = signal.recv() => if received.is_none() { return },
                // Whoever reloaded on it has stopped.
                _ = tx.closed() => return,
            }
            tracing::info!("SIGHUP: reloading every input");
            // A reload already pending covers this one.
            if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) = tx.try_send(()) {
                return;
            }
        }
    });
    Ok(rx)
}
