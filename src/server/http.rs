//! An HTTP/1.1 listener secured as the gRPC one is (its TLS, its connection
//! admission): what the metrics and probes listener and the Kubernetes API listener
//! share. Each request is answered with the connection's peer, for the guard.

use std::future::Future;

use fleetscope_auth::peer::PeerInfo;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `listener` until `stop`, each connection a task named `task`, each request
/// answered by `answer` (with its connection's peer); `what` names the listener in
/// the log.
pub async fn serve<B, Fut>(
    listener: TcpListener,
    security: &super::Security,
    stop: CancellationToken,
    (what, task): (&'static str, &'static str),
    answer: impl Fn(hyper::Request<Incoming>, PeerInfo) -> Fut + Clone + Send + Sync + 'static,
) where
    Fut: Future<Output = hyper::Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use futures::StreamExt as _;
    let mut incoming = Box::pin(super::tls::incoming(
        listener,
        security.tls.clone(),
        super::tls::Protocol::Http1,
        security.admission,
        stop.clone(),
    ));
    loop {
        let stream = tokio::select! {
            accepted = incoming.next() => match accepted {
                Some(Ok(a)) => a,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, listener = what, "accepting a connection failed");
                    continue;
                }
                None => return,
            },
            () = stop.cancelled() => return,
        };
        let peer = tonic::transport::server::Connected::connect_info(&stream);
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |r: hyper::Request<Incoming>| {
            let answer = answer.clone();
            let peer = peer.clone();
            async move { Ok::<_, std::convert::Infallible>(answer(r, peer).await) }
        });
        let stop = stop.clone();
        crate::tasks::spawn(task, async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
}
