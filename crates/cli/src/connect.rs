//! The client: connecting to a server (TLS, mutual TLS, a bearer token), and the
//! errors a client command meets, each with a hint at its likely cause.

use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::args;
use fleetscope_proto::fleet_client::FleetClient;

/// A failure of a client command.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached.
    #[error(
        "cannot reach the fleetscope server at {server}{}",
        connect_hint(server, source)
    )]
    Connect {
        /// The address.
        server: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The server refused the request.
    #[error("{:?}: {}{}", .0.code(), .0.message(), rpc_hint(.0))]
    Rpc(Box<tonic::Status>),
    /// A failure worded for a person, as kubectl words it.
    #[error("{0}")]
    Message(String),
}

/// Every cause of `e`, on one line.
pub(super) fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// What to try when a connection to `server` failed as `e` says.
pub(super) fn connect_hint(server: &str, e: &tonic::transport::Error) -> String {
    let why = causes(e);
    let tls = server.starts_with("https://");
    let hint = if why.contains("Connection refused") {
        "nothing listens there: is `fleetscope serve` (or `demo`) running at that address? (--server, FLEETSCOPE_SERVER)"
    } else if tls && (why.contains("InvalidContentType") || why.contains("corrupt message")) {
        "the server does not speak TLS there: try http://"
    } else if why.contains("UnknownIssuer") || why.contains("invalid peer certificate") {
        "the server's certificate is not signed by a CA this client trusts: pass the CA that signed it with --ca"
    } else if why.contains("NoApplicationProtocol") {
        "the server there does not speak HTTP/2 (gRPC): is it fleetscope's gRPC address, not another service's?"
    } else if why.contains("NotValidForName") {
        "the server's certificate does not name that host: connect by a name it holds, or set --tls-server-name"
    } else if why.contains("UnknownCA")
        || why.contains("BadCertificate")
        || why.contains("CertificateRequired")
    {
        "the server refused the client certificate: use one signed by the server's client CA (--cert, --key)"
    } else {
        return String::new();
    };
    format!(" ({hint})")
}

/// What to try after a call failed as `s` says, when the connection, not the server,
/// failed: a plaintext client reaching a TLS server, or a TLS client whose certificate
/// the server refused mid-handshake, sees only a transport error.
pub(super) fn rpc_hint(s: &tonic::Status) -> &'static str {
    use tonic::Code;
    let m = s.message();
    // How tonic words a connection that broke under a call, with one of these codes.
    let transport = matches!(
        s.code(),
        Code::Unknown | Code::Internal | Code::Cancelled | Code::Unavailable
    ) && [
        "transport error",
        "h2 protocol error",
        "operation was canceled",
    ]
    .iter()
    .any(|w| m.contains(w));
    if transport {
        " (the connection failed: if the server serves TLS, use https:// with --ca; if it asks for a client certificate, pass one signed by its client CA with --cert and --key)"
    } else {
        ""
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Rpc(Box::new(s))
    }
}

/// A client of the Fleet service, sending the caller's credentials with every call.
pub type Client = FleetClient<InterceptedService<Channel, Credentials>>;

/// A bearer token to send, if any.
#[derive(Clone, Default)]
pub struct Credentials(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// The URL of a server: as given when it has a scheme; `host:port` is `https://` when
/// `tls` (a TLS flag was given), else `http://`, the way grpcurl takes it.
pub fn server_url(server: &str, tls: bool) -> String {
    if server.contains("://") {
        server.to_string()
    } else if tls {
        format!("https://{server}")
    } else {
        format!("http://{server}")
    }
}

pub(super) fn message(m: String) -> ClientError {
    ClientError::Message(m)
}

pub(super) fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, ClientError> {
    fleetscope_model::file::read_capped(path)
        .map_err(|e| message(format!("reading the {what} {}: {e}", path.display())))
}

/// Whether a URL's host is this host.
pub(super) fn is_local(uri: &http::Uri) -> bool {
    match uri.host() {
        Some("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// Connects to a server as `server` says: TLS for `https://` (verified with `--ca`, or
/// the public roots; with `--cert`/`--key` for mutual TLS), plaintext for `http://`,
/// never one for the other; a bearer token from `--token-file` only over TLS or to
/// this host.
pub async fn connect(server: &args::ServerArg) -> Result<Client, ClientError> {
    let tls_asked =
        server.ca.is_some() || server.cert.is_some() || server.tls_server_name.is_some();
    let url = server_url(&server.server, tls_asked);
    let uri: http::Uri = url
        .parse()
        .map_err(|_| message(format!("--server {url:?} is not a URL")))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(message(format!(
                "--server {url:?}: expected https:// or http://"
            )));
        }
    };
    if !tls && tls_asked {
        return Err(message(format!(
            "--server {url} is plaintext (http://) but TLS flags were given: use https://"
        )));
    }
    let token = match &server.token_file {
        None => None,
        Some(path) => {
            let raw = read(path, "token file")?;
            let token = String::from_utf8(raw)
                .map_err(|_| message(format!("the token file {} is not text", path.display())))?;
            let token = token.trim();
            if token.is_empty() {
                return Err(message(format!(
                    "the token file {} is empty",
                    path.display()
                )));
            }
            if !tls && !is_local(&uri) {
                return Err(message(format!(
                    "a bearer token is sent only over TLS or to this host: use https:// for {url}"
                )));
            }
            Some(format!("Bearer {token}").parse().map_err(|_| {
                message(format!(
                    "the token in {} is not printable ASCII",
                    path.display()
                ))
            })?)
        }
    };
    let mut endpoint = Channel::from_shared(url.clone())
        .map_err(|_| message(format!("--server {url:?} is not a URL")))?;
    if tls {
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match &server.ca {
            Some(ca) => config.ca_certificate(tonic::transport::Certificate::from_pem(read(
                ca, "CA file",
            )?)),
            None => config.with_webpki_roots(),
        };
        if let (Some(cert), Some(key)) = (&server.cert, &server.key) {
            config = config.identity(tonic::transport::Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        if let Some(name) = &server.tls_server_name {
            config = config.domain_name(name.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|source| ClientError::Connect {
                server: url.clone(),
                source,
            })?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| ClientError::Connect {
            server: url.clone(),
            source,
        })?;
    Ok(FleetClient::with_interceptor(channel, Credentials(token))
        .max_decoding_message_size(256 * 1024 * 1024))
}
