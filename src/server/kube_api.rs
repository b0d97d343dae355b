//! The Kubernetes API listener (`--kube-api-listen`): HTTPS (or plaintext when the
//! server is), with the same TLS, connection admission and guard as the gRPC
//! listener, each request answered by [`crate::kubeapi::KubeApi`].

use std::sync::Arc;

use fleetscope_model::Fleet;
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
    let answer = move |r, peer| {
        let api = api.clone();
        async move { api.handle(r, Some(&peer)).await }
    };
    let names = ("Kubernetes API", "kube-api-connection");
    super::http::serve(listener, &security, stop, names, answer).await;
}
