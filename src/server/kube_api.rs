//! The Kubernetes API listener (`--kube-api-listen`): HTTPS (or plaintext when the
//! server is), with the same TLS, connection admission and guard as the gRPC
//! listener, each request answered by [`crate::kubeapi::KubeApi`].

use std::sync::Arc;

use fleetscope_model::Fleet;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::kubeapi::KubeApi;

/// Serves `api` on `listener` until `stop`.
pub async fn serve<F: Fleet + 'static>(
    listener: TcpListener,
    api: Arc<KubeApi<F>>,
    security: super::Security,
    stop: CancellationToken,
) {
    use futures::StreamExt as _;
    let mut incoming = Box::pin(super::tls::incoming(
        listener,
        security.tls,
        super::tls::Protocol::Http1,
        security.admission,
        stop.clone(),
    ));
    loop {
        let stream = tokio::select! {
            accepted = incoming.next() => match accepted {
                Some(Ok(a)) => a,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "Kubernetes API listener: accept failed");
                    continue;
                }
                None => return,
            },
            () = stop.cancelled() => return,
        };
        let peer = tonic::transport::server::Connected::connect_info(&stream);
        let api = api.clone();
        let service = hyper::service::service_fn(move |r: hyper::Request<Incoming>| {
            let (api, peer) = (api.clone(), peer.clone());
            async move { Ok::<_, std::convert::Infallible>(api.handle(r, Some(&peer)).await) }
        });
        let stop = stop.clone();
        crate::tasks::spawn("kube-api-connection", async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
}
