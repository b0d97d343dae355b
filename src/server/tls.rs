//! Serving TLS: the certificate, key and (for mutual TLS) client CA read from files,
//! read again when they change (cert-manager rotates them) without touching open
//! connections; and the server's listener, which admits a connection only within the
//! connection cap and only once it has completed its handshake (or, in plaintext,
//! begun to speak) within the handshake timeout.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use fleetscope_model::access::Subject;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The files a TLS server is configured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The serving certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CAs whose client certificates identify callers (PEM); none: no client certificates.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Every file, for watching.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.cert.clone(), self.key.clone()];
        paths.extend(self.client_ca.clone());
        paths
    }
}

/// A TLS file that cannot be used: which file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct TlsError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

fn bad(path: &Path, message: impl Into<String>) -> TlsError {
    TlsError {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes =
        std::fs::read(path).map_err(|e| bad(path, format!("cannot read the {what}: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(path, format!("the {what} is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            path,
            format!("the {what} holds no PEM CERTIFICATE block"),
        ));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads the files into a server configuration offering HTTP/2. With a client CA,
/// a client certificate is asked for and, when given, must chain to it; a caller
/// without one may still present a bearer token (authentication decides).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(&files.cert, "certificate")?;
    let key_bytes = std::fs::read(&files.key)
        .map_err(|e| bad(&files.key, format!("cannot read the private key: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        bad(
            &files.key,
            format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
        )
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&files.cert, e.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca, "client CA")? {
                roots
                    .add(cert)
                    .map_err(|e| bad(ca, format!("not a usable CA certificate: {e}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| bad(ca, format!("cannot verify clients with it: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        bad(
            &files.key,
            format!(
                "the key does not go with the certificate {}: {e}",
                files.cert.display()
            ),
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// When a client certificate stops being valid (its `notAfter`), if it can be read.
pub fn certificate_expiry(der: &[u8]) -> Option<std::time::SystemTime> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// Who a client certificate names: the first URI SAN (a SPIFFE ID), else the subject
/// CN; groups from the subject's O values.
pub fn certificate_subject(der: &[u8]) -> Result<Subject, String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("unreadable client certificate: {e}"))?;
    let uri = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                GeneralName::URI(u) => Some(u.to_string()),
                _ => None,
            })
        });
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .find_map(|a| a.as_str().ok().map(str::to_string));
    let user = uri
        .or(cn)
        .filter(|u| !u.is_empty())
        .ok_or("the client certificate names no one: it has neither a URI SAN nor a subject CN")?;
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    Ok(Subject { user, groups })
}

/// What the server knows of a connection's peer, in every request's extensions.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Who the client certificate names, when one was presented and verified, or why
    /// it names no one.
    pub certificate: Option<Result<Subject, String>>,
    /// When the client certificate stops being valid (its `notAfter`): a stream
    /// it authenticated ends then.
    pub certificate_expires: Option<std::time::SystemTime>,
}

impl PeerInfo {
    /// Whether the peer is on this host.
    pub fn is_loopback(&self) -> bool {
        self.remote.is_some_and(|a| a.ip().is_loopback())
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An admitted connection: counted against the cap until it closes.
pub struct Conn {
    io: Io,
    info: PeerInfo,
    _admitted: tokio::sync::OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// How the listener admits connections.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    /// Connections open at once; one more is closed at once, with a log line.
    pub max_connections: usize,
    /// How long a connection may take to complete its TLS handshake (or, in plaintext,
    /// to send its first bytes) before it is closed.
    pub handshake_timeout: Duration,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// How long between two "connection cap reached" log lines.
const CAP_LOG_EVERY: Duration = Duration::from_secs(10);

/// The protocol a listener speaks, as TLS negotiates it (ALPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC.
    Http2,
    /// The metrics endpoint.
    Http1,
}

/// The admitted connections of `listener`, in TLS when `tls` carries a configuration
/// (the one it carries when each connection arrives), until `stop`.
pub fn incoming(
    listener: TcpListener,
    tls: Option<watch::Receiver<Arc<rustls::ServerConfig>>>,
    protocol: Protocol,
    admission: Admission,
    stop: CancellationToken,
) -> impl futures::Stream<Item = Result<Conn, std::io::Error>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<Result<Conn, std::io::Error>>(64);
    let open = Arc::new(Semaphore::new(admission.max_connections.max(1)));
    tokio::spawn(async move {
        let mut last_cap_log: Option<tokio::time::Instant> = None;
        let mut refused = 0u64;
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.cancelled() => return,
                _ = tx.closed() => return,
            };
            let (tcp, remote) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, or the peer gave up: keep accepting, a
                    // little later.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(admitted) = open.clone().try_acquire_owned() else {
                refused += 1;
                if last_cap_log.is_none_or(|t| t.elapsed() >= CAP_LOG_EVERY) {
                    tracing::warn!(
                        max_connections = admission.max_connections,
                        refused,
                        %remote,
                        "connection cap reached: closing new connections until some close (--grpc-max-connections)"
                    );
                    last_cap_log = Some(tokio::time::Instant::now());
                    refused = 0;
                }
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let tls = tls.as_ref().map(|t| {
                let config = t.borrow().clone();
                match protocol {
                    Protocol::Http2 => config,
                    Protocol::Http1 => {
                        let mut c = (*config).clone();
                        c.alpn_protocols = vec![b"http/1.1".to_vec()];
                        Arc::new(c)
                    }
                }
            });
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshake = handshake(tcp, remote, tls, protocol);
                match tokio::time::timeout(admission.handshake_timeout, handshake).await {
                    Ok(Ok((io, info))) => {
                        let _ = tx
                            .send(Ok(Conn {
                                io,
                                info,
                                _admitted: admitted,
                            }))
                            .await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, error = %e, "connection closed during its handshake")
                    }
                    Err(_) => tracing::debug!(
                        %remote,
                        timeout = ?admission.handshake_timeout,
                        "connection closed: no handshake in time"
                    ),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The HTTP/2 connection preface's length: a plaintext client that has sent this much
/// has begun to speak.
const PREFACE: usize = 24;

async fn handshake(
    tcp: TcpStream,
    remote: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    protocol: Protocol,
) -> std::io::Result<(Io, PeerInfo)> {
    let Some(config) = tls else {
        // Wait for the first bytes without taking them (hyper reads them): HTTP/2's
        // whole preface, or any start of an HTTP/1 request (which may be short).
        let need = match protocol {
            Protocol::Http2 => PREFACE,
            Protocol::Http1 => 1,
        };
        let mut buf = [0u8; PREFACE];
        loop {
            let n = tcp.peek(&mut buf).await?;
            if n == 0 || n >= need {
                break;
            }
            // Part of it: the rest follows in the same flight, almost always.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let info = PeerInfo {
            remote: Some(remote),
            tls: false,
            certificate: None,
            certificate_expires: None,
        };
        return Ok((Io::Plain(tcp), info));
    };
    let stream = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first());
    let info = PeerInfo {
        remote: Some(remote),
        tls: true,
        certificate: leaf.map(|c| certificate_subject(c.as_ref())),
        certificate_expires: leaf.and_then(|c| certificate_expiry(c.as_ref())),
    };
    Ok((Io::Tls(Box::new(stream)), info))
}

/// The TLS configuration in force, read again whenever one of its files changes or
/// `reload` fires; a change that fails keeps the last good configuration and says why.
pub fn reloading(
    files: TlsFiles,
    first: Arc<rustls::ServerConfig>,
    mut reload: mpsc::Receiver<()>,
    stop: CancellationToken,
) -> watch::Receiver<Arc<rustls::ServerConfig>> {
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        let (changed_tx, mut changed) = mpsc::channel::<()>(1);
        let _watcher = crate::config::reload::watch_files(&files.paths(), changed_tx);
        loop {
            let why = tokio::select! {
                Some(()) = changed.recv() => "a TLS file changed",
                Some(()) = reload.recv() => "SIGHUP",
                _ = stop.cancelled() => return,
            };
            let counts = &crate::config::reload::RELOADS;
            crate::config::reload::ReloadCounts::count(&counts.tls);
            match server_config(&files) {
                Ok(config) => {
                    tx.send_replace(config);
                    tracing::info!(reason = why, cert = %files.cert.display(), "TLS certificate reloaded: new connections use it");
                }
                Err(e) => {
                    tracing::error!(reason = why, error = %e, "the TLS files cannot be reloaded: the last good certificate stays in use");
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(params: impl FnOnce(&mut rcgen::CertificateParams)) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        params(&mut p);
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_client_certificate_names_its_uri_san_else_its_cn_with_groups_from_o() {
        let spiffe = cert_with(|p| {
            p.subject_alt_names = vec![rcgen::SanType::URI(
                "spiffe://example.org/ns/a/sa/b".try_into().unwrap(),
            )];
            p.distinguished_name
                .push(rcgen::DnType::CommonName, "ignored");
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, "team-a");
        });
        let s = certificate_subject(&spiffe).unwrap();
        assert_eq!(s.user, "spiffe://example.org/ns/a/sa/b");
        assert_eq!(s.groups, ["team-a"]);
        let cn = cert_with(|p| {
            p.distinguished_name
                .push(rcgen::DnType::CommonName, "alice");
        });
        assert_eq!(certificate_subject(&cn).unwrap().user, "alice");
        let nobody = cert_with(|_| {});
        assert!(
            certificate_subject(&nobody)
                .unwrap_err()
                .contains("names no one")
        );
        assert!(certificate_subject(b"junk").is_err());
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        std::fs::write(path("empty.pem"), "").unwrap();
        std::fs::write(
            path("junk.pem"),
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let files = |cert: &str, key: &str| TlsFiles {
            cert: path(cert),
            key: path(key),
            client_ca: None,
        };
        let e = server_config(&files("missing.pem", "empty.pem")).unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
        let e = server_config(&files("empty.pem", "empty.pem")).unwrap_err();
        assert!(
            e.to_string()
                .contains("empty.pem: the certificate holds no PEM"),
            "{e}"
        );
        let e = server_config(&files("junk.pem", "empty.pem")).unwrap_err();
        assert!(e.to_string().contains("junk.pem"), "{e}");
        // A good certificate with someone else's key.
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(path("cert.pem"), cert.pem()).unwrap();
        std::fs::write(
            path("other.key"),
            rcgen::KeyPair::generate().unwrap().serialize_pem(),
        )
        .unwrap();
        std::fs::write(path("key.pem"), key.serialize_pem()).unwrap();
        let e = server_config(&files("cert.pem", "other.key")).unwrap_err();
        assert!(e.to_string().contains("does not go with"), "{e}");
        let e = server_config(&files("cert.pem", "empty.pem")).unwrap_err();
        assert!(
            e.to_string().contains("empty.pem: no usable private key"),
            "{e}"
        );
        assert!(server_config(&files("cert.pem", "key.pem")).is_ok());
        let mut with_ca = files("cert.pem", "key.pem");
        with_ca.client_ca = Some(path("junk.pem"));
        let e = server_config(&with_ca).unwrap_err();
        assert!(e.to_string().contains("junk.pem"), "{e}");
    }
}
