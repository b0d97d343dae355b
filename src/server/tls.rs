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

use super::idle::{self, Frames, PREFACE};
pub use crate::peer::PeerInfo;
use crate::peer::{Closing, ConnStreams};

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
    /// The TLS files `args` name, when TLS is configured.
    pub fn of(args: &crate::config::flags::SecurityArgs) -> Option<Self> {
        Some(Self {
            cert: args.tls_cert.clone()?,
            key: args.tls_key.clone()?,
            client_ca: args.client_ca.clone(),
        })
    }
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
    let bytes = fleetscope_model::file::read_capped(path)
        .map_err(|e| bad(path, format!("cannot read the {what}: {e}")))?;
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
    let key_bytes = fleetscope_model::file::read_capped(&files.key)
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

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Io {
    fn read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }

    fn write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn flush(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
}

/// What an HTTP/2 connection follows to close itself once idle (see [`super::idle`]).
struct Idle {
    streams: Arc<ConnStreams>,
    timeout: Duration,
    /// How long the connection has to make its first authenticated call.
    to_authenticate: Duration,
    incoming: Frames,
    outgoing: Frames,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The GOAWAY being written, and how much of it is.
    goaway: Option<(Vec<u8>, usize)>,
    /// Written: the connection reads as ended.
    closed: bool,
}

impl Idle {
    /// Decides whether the connection has idled long enough (arming the timer that
    /// wakes it when it will have), and if so, and the server is between frames,
    /// begins the GOAWAY.
    fn check(&mut self, cx: &mut Context<'_>, remote: Option<SocketAddr>) {
        if self.goaway.is_some() || self.closed {
            return;
        }
        self.streams.register(cx);
        let Some((deadline, why)) =
            self.streams
                .close_deadline(self.timeout, self.timeout, self.to_authenticate)
        else {
            return;
        };
        if tokio::time::Instant::now() < deadline {
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            if timer.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
            return;
        }
        if self.outgoing.between_frames() {
            let reason = match why {
                Closing::Idle => {
                    idle::CLOSED_IDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(remote = ?remote, idle = ?self.timeout, "closing an idle connection (GOAWAY)");
                    "idle"
                }
                Closing::Unauthenticated | Closing::Evicted => {
                    idle::CLOSED_UNAUTHENTICATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(remote = ?remote, within = ?self.to_authenticate, evicted = why == Closing::Evicted, "closing a connection that made no authenticated call (GOAWAY)");
                    "no authenticated call"
                }
            };
            self.goaway = Some((idle::goaway(self.incoming.last_stream(), reason), 0));
        }
    }

    /// Writes what is left of the GOAWAY: ready once it is written and flushed.
    fn send_goaway(&mut self, io: &mut Io, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let Some((frame, written)) = &mut self.goaway else {
            return Poll::Ready(Ok(()));
        };
        while *written < frame.len() {
            match io.write(cx, &frame[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        std::task::ready!(io.flush(cx))?;
        self.goaway = None;
        self.closed = true;
        Poll::Ready(Ok(()))
    }
}

/// An admitted connection: counted against the caps until it closes.
pub struct Conn {
    io: Io,
    info: PeerInfo,
    /// Bytes read to see the client begin to speak, given to the server first.
    prefix: Vec<u8>,
    idle: Option<Idle>,
    _admitted: Admitted,
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
        let this = &mut *self;
        if let Some(idle) = &mut this.idle {
            idle.check(cx, this.info.remote);
            std::task::ready!(idle.send_goaway(&mut this.io, cx))?;
            if idle.closed {
                // The server reads the end of the connection, and closes it.
                return Poll::Ready(Ok(()));
            }
        }
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            let taken: Vec<u8> = this.prefix.drain(..n).collect();
            buf.put_slice(&taken);
            if let Some(idle) = &mut this.idle {
                idle.incoming.saw(&taken);
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = this.io.read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(idle)) = (&read, &mut this.idle) {
            idle.incoming.saw(&buf.filled()[before..]);
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if let Some(idle) = &mut this.idle {
            // A GOAWAY begun is written whole before any other frame.
            std::task::ready!(idle.send_goaway(&mut this.io, cx))?;
        }
        let written = this.io.write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(idle)) = (&written, &mut this.idle) {
            idle.outgoing.saw(&buf[..*n]);
            if idle.outgoing.between_frames() {
                // An expiry that waited for the end of a frame is due now.
                cx.waker().wake_by_ref();
            }
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if let Some(idle) = &mut this.idle {
            std::task::ready!(idle.send_goaway(&mut this.io, cx))?;
        }
        let written = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        };
        if let (Poll::Ready(Ok(n)), Some(idle)) = (&written, &mut this.idle) {
            let mut left = *n;
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                idle.outgoing.saw(&b[..take]);
                left -= take;
            }
            if idle.outgoing.between_frames() {
                cx.waker().wake_by_ref();
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// How the listener admits connections.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    /// Connections open at once; one more is closed at once, with a log line.
    pub max_connections: usize,
    /// Whether an eighth of `max_connections` (at least one) is kept for connections
    /// whose peer proved who it is (a client certificate, or a call admitted with a
    /// bearer token): connections that have not may not take the last places, and
    /// when their own places are full, the oldest of them is closed for a newcomer.
    pub keep_for_authenticated: bool,
    /// Connections one peer address may have open at once.
    pub max_connections_per_address: usize,
    /// How long a connection may take to complete its TLS handshake and send its
    /// first bytes (the HTTP/2 preface) before it is closed; and, once it has, to make
    /// its first authenticated call (without a client certificate) before it is closed
    /// with a GOAWAY.
    pub handshake_timeout: Duration,
    /// How long a gRPC connection may have no stream open before it is closed with an
    /// HTTP/2 GOAWAY (clients open a new one for their next call).
    pub idle_timeout: Duration,
}

impl Admission {
    /// How the listeners of `args` admit connections; with `keep_for_authenticated`
    /// (callers prove who they are), some places are kept for connections that did.
    pub fn of(args: &crate::config::flags::ListenerArgs, keep_for_authenticated: bool) -> Self {
        Self {
            max_connections: usize::try_from(args.grpc_max_connections).unwrap_or(usize::MAX),
            keep_for_authenticated,
            max_connections_per_address: usize::try_from(args.grpc_max_connections_per_address)
                .unwrap_or(usize::MAX),
            handshake_timeout: args.grpc_handshake_timeout,
            idle_timeout: args.grpc_idle_timeout,
        }
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            keep_for_authenticated: false,
            max_connections_per_address: 256,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

impl Admission {
    /// The places connections not yet authenticated may take.
    fn not_authenticated(&self) -> usize {
        let max = self.max_connections.max(1);
        if !self.keep_for_authenticated {
            return max;
        }
        max - (max / 8).max(1).min(max - 1)
    }
}

/// How long between two log lines about refused connections, per reason.
const CAP_LOG_EVERY: Duration = Duration::from_secs(10);

/// Why a connection was refused at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` are open.
    Cap,
    /// Its address has `max_connections_per_address` open.
    AddressCap,
    /// Not authenticated, only the places kept for authenticated connections are
    /// left, and no connection that has not authenticated can be closed for it.
    Unauthenticated,
}

impl Refusal {
    /// Every reason.
    pub const ALL: [Refusal; 3] = [Refusal::Cap, Refusal::AddressCap, Refusal::Unauthenticated];

    /// The reason as metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Cap => "cap",
            Refusal::AddressCap => "address_cap",
            Refusal::Unauthenticated => "reserved",
        }
    }

    fn log(self, admission: &Admission, remote: SocketAddr, refused: u64) {
        match self {
            Refusal::Cap => tracing::warn!(
                max_connections = admission.max_connections,
                refused,
                %remote,
                "connection cap reached: closing new connections until some close (--grpc-max-connections)"
            ),
            Refusal::AddressCap => tracing::warn!(
                max_connections_per_address = admission.max_connections_per_address,
                refused,
                %remote,
                "one address has its most connections open: closing its new ones (--grpc-max-connections-per-address)"
            ),
            Refusal::Unauthenticated => tracing::warn!(
                max_connections = admission.max_connections,
                kept = admission.max_connections.saturating_sub(admission.not_authenticated()),
                refused,
                %remote,
                "only the connection places kept for authenticated callers are left: closing new connections until one authenticates"
            ),
        }
    }
}

/// Connections refused since start, by reason (in the order of [`Refusal::ALL`]).
pub static REFUSED: [std::sync::atomic::AtomicU64; 3] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Counts a refusal and logs it, at most once per [`CAP_LOG_EVERY`] per reason.
#[derive(Default)]
struct Refusals {
    last_log: [Option<tokio::time::Instant>; 3],
    since_log: [u64; 3],
}

impl Refusals {
    fn refuse(&mut self, why: Refusal, admission: &Admission, remote: SocketAddr) {
        let i = why as usize;
        REFUSED[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.since_log[i] += 1;
        if self.last_log[i].is_none_or(|t| t.elapsed() >= CAP_LOG_EVERY) {
            why.log(admission, remote, self.since_log[i]);
            self.last_log[i] = Some(tokio::time::Instant::now());
            self.since_log[i] = 0;
        }
    }
}

/// The open connections per peer address.
type ByAddress = Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// What a connection holds while open: its place under the cap, under its address's
/// cap, and (an HTTP/1 connection without a client certificate) among those not
/// authenticated. An HTTP/2 connection not authenticated keeps its first and last
/// places in its [`ConnStreams`] instead: both given back if it is evicted, the last
/// once a call authenticates.
struct Admitted {
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
    _address: AddressPlace,
    _uncertified: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A connection's place under its address's cap, given back when dropped.
struct AddressPlace {
    open: ByAddress,
    ip: std::net::IpAddr,
}

impl AddressPlace {
    fn take(open: &ByAddress, ip: std::net::IpAddr, max: usize) -> Option<Self> {
        let mut map = open.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(ip).or_default();
        if *n >= max.max(1) {
            return None;
        }
        *n += 1;
        Some(Self {
            open: open.clone(),
            ip,
        })
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut map = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// The HTTP/2 connections that have not authenticated yet, oldest first: when their
/// places are full, the oldest still waiting is closed to make room for a newcomer,
/// so connections that never call cannot keep a caller with credentials out.
#[derive(Clone, Default)]
struct Waiting(Arc<std::sync::Mutex<std::collections::VecDeque<std::sync::Weak<ConnStreams>>>>);

impl Waiting {
    /// A place among the connections not authenticated, taken from the oldest of them
    /// when none is free; `None` when none is waiting to give one.
    fn admit(&self, places: &Arc<Semaphore>) -> Option<tokio::sync::OwnedSemaphorePermit> {
        loop {
            if let Ok(p) = places.clone().try_acquire_owned() {
                return Some(p);
            }
            let oldest = self
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()?;
            if let Some(c) = oldest.upgrade() {
                c.evict();
            }
        }
    }

    /// Follows a connection not yet authenticated.
    fn push(&self, c: &Arc<ConnStreams>) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Connections gone or authenticated are dropped from the front as they come
        // up; now and then, from everywhere, so the queue stays as long as the places.
        if q.len() >= 64 && q.len().is_power_of_two() {
            q.retain(|w| w.upgrade().is_some_and(|c| !c.is_authenticated()));
        }
        q.push_back(Arc::downgrade(c));
    }
}

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
    let acceptor = Acceptor {
        open: Arc::new(Semaphore::new(admission.max_connections.max(1))),
        uncertified: Arc::new(Semaphore::new(admission.not_authenticated())),
        waiting: Waiting::default(),
        by_address: ByAddress::default(),
        refusals: Arc::new(std::sync::Mutex::new(Refusals::default())),
        admission,
        protocol,
        tx,
    };
    crate::tasks::spawn("grpc-accept", acceptor.run(listener, tls, stop));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// What admitting a listener's connections shares: the places under the caps, the
/// connections still to authenticate, and where admitted connections go.
#[derive(Clone)]
struct Acceptor {
    /// Places under the connection cap.
    open: Arc<Semaphore>,
    /// Places for connections that have not authenticated.
    uncertified: Arc<Semaphore>,
    waiting: Waiting,
    by_address: ByAddress,
    refusals: Arc<std::sync::Mutex<Refusals>>,
    admission: Admission,
    protocol: Protocol,
    tx: mpsc::Sender<Result<Conn, std::io::Error>>,
}

impl Acceptor {
    /// Accepts connections until `stop` (or nobody takes them any more): each under
    /// the caps gets its handshake in a task of its own.
    async fn run(
        self,
        listener: TcpListener,
        tls: Option<watch::Receiver<Arc<rustls::ServerConfig>>>,
        stop: CancellationToken,
    ) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.cancelled() => return,
                _ = self.tx.closed() => return,
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
            let Some(place) = self.waiting.admit(&self.open) else {
                self.refuse(Refusal::Cap, remote);
                continue;
            };
            let Some(address) = AddressPlace::take(
                &self.by_address,
                remote.ip(),
                self.admission.max_connections_per_address,
            ) else {
                self.refuse(Refusal::AddressCap, remote);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let tls = tls.as_ref().map(|t| {
                let config = t.borrow().clone();
                match self.protocol {
                    Protocol::Http2 => config,
                    Protocol::Http1 => {
                        let mut c = (*config).clone();
                        c.alpn_protocols = vec![b"http/1.1".to_vec()];
                        Arc::new(c)
                    }
                }
            });
            crate::tasks::spawn(
                "grpc-connection",
                self.clone().connect(tcp, remote, tls, place, address),
            );
        }
    }

    /// Counts and logs a connection refused.
    fn refuse(&self, why: Refusal, remote: SocketAddr) {
        self.refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refuse(why, &self.admission, remote);
    }

    /// A connection's handshake within its time, then its admission: an HTTP/2 one
    /// that did not authenticate takes a place among those still to, and is closed
    /// once idle; one past every place is refused.
    async fn connect(
        self,
        tcp: TcpStream,
        remote: SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
        place: tokio::sync::OwnedSemaphorePermit,
        address: AddressPlace,
    ) {
        let admission = &self.admission;
        let handshake = handshake(tcp, remote, tls, self.protocol);
        let (io, mut info, prefix) =
            match tokio::time::timeout(admission.handshake_timeout, handshake).await {
                Ok(Ok(done)) => done,
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "connection closed during its handshake");
                    return;
                }
                Err(_) => {
                    tracing::debug!(
                        %remote,
                        timeout = ?admission.handshake_timeout,
                        "connection closed: no handshake and first bytes in time"
                    );
                    return;
                }
            };
        let mut place = Some(place);
        let certified = matches!(info.certificate, Some(Ok(_)));
        let (idle, uncertified) = if self.protocol == Protocol::Http2 {
            // Where nobody authenticates, every connection is as good as any.
            let proved = certified || !admission.keep_for_authenticated;
            let streams = if proved {
                ConnStreams::authenticated_at_start()
            } else {
                match self.waiting.admit(&self.uncertified) {
                    Some(pending) => match place.take() {
                        Some(open) => ConnStreams::pending(open, pending),
                        None => return,
                    },
                    None => return self.refuse(Refusal::Unauthenticated, remote),
                }
            };
            let streams = Arc::new(streams);
            if !proved {
                self.waiting.push(&streams);
            }
            info.streams = Some(streams.clone());
            let idle = Idle {
                streams,
                timeout: admission.idle_timeout,
                to_authenticate: admission.handshake_timeout,
                incoming: Frames::from_client(),
                outgoing: Frames::default(),
                timer: None,
                goaway: None,
                closed: false,
            };
            (Some(idle), None)
        } else if certified {
            (None, None)
        } else {
            match self.uncertified.clone().try_acquire_owned() {
                Ok(p) => (None, Some(p)),
                Err(_) => return self.refuse(Refusal::Unauthenticated, remote),
            }
        };
        let _ = self
            .tx
            .send(Ok(Conn {
                io,
                info,
                prefix,
                idle,
                _admitted: Admitted {
                    _place: place,
                    _address: address,
                    _uncertified: uncertified,
                },
            }))
            .await;
    }
}

/// Completes a connection's handshake and waits for the client's first bytes
/// (HTTP/2's whole preface, or the start of an HTTP/1 request), so that a client
/// that connects and says nothing is closed within the handshake timeout: the peer,
/// and the bytes read (in TLS) for the server to read first.
async fn handshake(
    tcp: TcpStream,
    remote: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    protocol: Protocol,
) -> std::io::Result<(Io, PeerInfo, Vec<u8>)> {
    use tokio::io::AsyncReadExt as _;
    let need = match protocol {
        Protocol::Http2 => PREFACE,
        Protocol::Http1 => 1,
    };
    let Some(config) = tls else {
        // Wait for the first bytes without taking them (hyper reads them).
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
            streams: None,
        };
        return Ok((Io::Plain(tcp), info, Vec::new()));
    };
    let mut stream = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await?;
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
        streams: None,
    };
    let mut prefix = vec![0u8; need];
    let mut filled = 0;
    while filled < need {
        match stream.read(&mut prefix[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    prefix.truncate(filled);
    Ok((Io::Tls(Box::new(stream)), info, prefix))
}

/// The TLS configuration in force (starting with `first`), and what reads its files
/// again: a change that fails keeps the last good configuration.
pub fn in_force(
    files: TlsFiles,
    first: Arc<rustls::ServerConfig>,
) -> (watch::Receiver<Arc<rustls::ServerConfig>>, TlsReload) {
    let (tx, rx) = watch::channel(first);
    (rx, TlsReload { files, tx })
}

/// Reads the TLS files again into the configuration in force.
pub struct TlsReload {
    files: TlsFiles,
    tx: watch::Sender<Arc<rustls::ServerConfig>>,
}

impl TlsReload {
    /// The files.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.paths()
    }

    /// Reads them again: what is in force now, or why they cannot be used.
    pub fn reload(&self) -> Result<String, String> {
        let config = server_config(&self.files).map_err(|e| e.to_string())?;
        self.tx.send_replace(config);
        Ok(format!(
            "TLS certificate reloaded from {}: new connections use it",
            self.files.cert.display()
        ))
    }
}

#[cfg(test)]
mod tests;
