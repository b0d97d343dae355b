//! Serving a simulated cluster over HTTP on loopback, with the faults that need the
//! listener: going offline, coming back, restarting.

use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::Cluster;
use crate::http;
use crate::tls::{ServerTls, TlsError};

struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A simulated cluster served at a fixed address.
pub struct SimServer {
    cluster: Cluster,
    addr: SocketAddr,
    tls: Option<ServerTls>,
    running: Mutex<Option<Running>>,
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Coming back online rebinds the same port while old connections linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl SimServer {
    /// Serves `cluster` at `addr` (port 0 picks a free port), over HTTPS unless the
    /// cluster's config turns TLS off.
    pub async fn start(cluster: Cluster, addr: SocketAddr) -> io::Result<Self> {
        let tls = if cluster.config.tls {
            Some(
                ServerTls::generate(cluster.name())
                    .map_err(|e: TlsError| io::Error::other(e.to_string()))?,
            )
        } else {
            None
        };
        let listener = bind(addr)?;
        let addr = listener.local_addr()?;
        let server = Self {
            cluster,
            addr,
            tls,
            running: Mutex::new(None),
        };
        server.serve(listener);
        Ok(server)
    }

    /// Serves `cluster` on a free port of 127.0.0.1.
    pub async fn start_local(cluster: Cluster) -> io::Result<Self> {
        Self::start(cluster, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    fn serve(&self, listener: TcpListener) {
        let stop = CancellationToken::new();
        let cluster = self.cluster.clone();
        let span = tracing::info_span!("sim_server", cluster = cluster.name(), addr = %self.addr);
        let tls = self.tls.clone();
        let task = tokio::spawn(accept_loop(listener, cluster, tls, stop.clone()).instrument(span));
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running { stop, task });
    }

    /// The cluster served.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT`, or `http://` when TLS is off.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The PEM of the CA that signed the serving certificate; `None` when TLS is off.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// Whether the server is accepting connections.
    pub fn is_online(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Stops listening and cuts every open connection: clients see refused connections.
    pub async fn go_offline(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(r) = running {
            r.stop.cancel();
            let _ = r.task.await;
        }
    }

    /// Listens again at the same address.
    pub async fn come_online(&self) -> io::Result<()> {
        if self.is_online() {
            return Ok(());
        }
        let listener = bind(self.addr)?;
        self.serve(listener);
        Ok(())
    }

    /// Restarts the apiserver: every connection is cut, and it comes back at the same
    /// address. With `reset_resource_versions`, the objects are renumbered from a fresh
    /// sequence and history is gone, as after a restore of etcd.
    pub async fn restart(&self, reset_resource_versions: bool) -> io::Result<()> {
        self.go_offline().await;
        if reset_resource_versions {
            self.cluster.store.reset_resource_versions();
        }
        self.come_online().await
    }

    /// Stops serving.
    pub async fn shutdown(self) {
        self.go_offline().await;
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(r) = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            r.stop.cancel();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    cluster: Cluster,
    tls: Option<ServerTls>,
    stop: CancellationToken,
) {
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn_token = stop.child_token();
        let cluster = cluster.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let token = conn_token.clone();
            let service = service_fn(move |req| http::handle(cluster.clone(), token.clone(), req));
            let builder = auto::Builder::new(TokioExecutor::new());
            let served = async {
                let result = match tls {
                    Some(tls) => match tls.acceptor.accept(stream).await {
                        Ok(stream) => {
                            builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await
                        }
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                    },
                    None => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                };
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
            };
            tokio::select! {
                _ = served => {}
                // Dropping the connection closes the socket at once: the fault is the point.
                _ = conn_token.cancelled() => {}
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}
