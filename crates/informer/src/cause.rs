//! Why a request to an API server failed, in words a person can act on: the TLS or
//! connection cause found in the error's chain (unknown certificate authority, a
//! certificate for another name, a refused connection, plain HTTP against HTTPS),
//! rather than the transport's outermost `client error (Connect)`.

use std::error::Error;

/// A one-line description of `e`, a failed request to `server`: the recognised cause
/// first, then the whole chain of causes.
pub fn describe(e: &(dyn Error + 'static), server: &str) -> String {
    // The API server answered: its Status says why, in a sentence (kube's own text
    // for it is a debug dump).
    if let Some(kube::Error::Api(s)) = causes(e)
        .into_iter()
        .find_map(|c| c.downcast_ref::<kube::Error>())
    {
        return api_status(s);
    }
    let chain = crate::source::chain(e);
    match recognise(e, server) {
        Some(cause) => format!("{cause} ({chain})"),
        None => chain,
    }
}

/// A refusal from an API server, as a person reads it: what the code means, then
/// the server's own message when it adds anything.
pub fn api_status(s: &kube::core::Status) -> String {
    let meaning = match s.code {
        401 => "the cluster does not accept the kubeconfig's credentials (401 Unauthorized): the token may have expired or been revoked, or the client certificate is not trusted".to_string(),
        403 => "the credentials are not allowed this (403 Forbidden)".to_string(),
        404 => "the cluster does not have it (404 Not Found)".to_string(),
        code if s.reason.is_empty() => format!("the cluster answered {code}"),
        code => format!("the cluster answered {code} {}", s.reason),
    };
    let message = s.message.trim();
    if message.is_empty() || message.eq_ignore_ascii_case(&s.reason) {
        meaning
    } else {
        format!("{meaning}: {message}")
    }
}

/// Every error in the chain, looking inside `io::Error`s (whose `source` skips the
/// error they wrap).
fn causes<'a>(e: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(e);
    while let Some(c) = next {
        out.push(c);
        next = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn Error + 'static)),
            None => c.source(),
        };
    }
    out
}

fn recognise(e: &(dyn Error + 'static), server: &str) -> Option<String> {
    use rustls::{CertificateError, Error as Tls};
    let plain = server.starts_with("http://");
    for c in causes(e) {
        if let Some(tls) = c.downcast_ref::<Tls>() {
            return Some(match tls {
                Tls::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
                    "TLS: the certificate of {server} is signed by an authority the kubeconfig does not trust (check certificate-authority-data)"
                ),
                Tls::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                ) => format!(
                    "TLS: the certificate of {server} is not valid for that address (check the server URL, or tls-server-name)"
                ),
                Tls::InvalidCertificate(
                    CertificateError::Expired | CertificateError::ExpiredContext { .. },
                ) => format!("TLS: the certificate of {server} has expired"),
                Tls::InvalidCertificate(
                    CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
                ) => format!("TLS: the certificate of {server} is not valid yet"),
                Tls::InvalidCertificate(other) => {
                    format!("TLS: the certificate of {server} was refused: {other:?}")
                }
                Tls::InvalidMessage(_) | Tls::InappropriateMessage { .. } => format!(
                    "TLS: {server} did not answer in TLS (is it serving plain HTTP? then use http://)"
                ),
                Tls::AlertReceived(alert) => {
                    format!(
                        "TLS: {server} ended the handshake ({alert:?}): it may want a client certificate the kubeconfig does not give"
                    )
                }
                other => format!("TLS with {server} failed: {other}"),
            });
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            let said = match io.kind() {
                K::ConnectionRefused => Some(format!(
                    "connection to {server} refused: nothing listens there"
                )),
                K::TimedOut => Some(format!("connecting to {server} timed out")),
                K::ConnectionReset if plain => Some(format!(
                    "{server} reset the connection: it may serve HTTPS (use https:// in the kubeconfig)"
                )),
                K::ConnectionReset => Some(format!("{server} reset the connection")),
                K::HostUnreachable | K::NetworkUnreachable => {
                    Some(format!("{server} cannot be reached from here"))
                }
                _ => None,
            };
            if said.is_some() {
                return said;
            }
        }
        let text = c.to_string();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            return Some(format!("the name of {server} does not resolve"));
        }
        if plain
            && (text.contains("invalid HTTP")
                || text.contains("parse")
                || text.contains("connection closed before message completed"))
        {
            return Some(format!(
                "{server} did not answer in HTTP: it may serve HTTPS (use https:// in the kubeconfig)"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_is_named_inside_io_errors() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let wrapped = std::io::Error::other(inner);
        let text = describe(&wrapped, "https://127.0.0.1:1");
        assert!(
            text.starts_with("connection to https://127.0.0.1:1 refused"),
            "{text}"
        );
    }

    fn status(code: u16, reason: &str, message: &str) -> kube::Error {
        let mut s = kube::core::Status::failure(message, reason);
        s.code = code;
        kube::Error::Api(Box::new(s))
    }

    #[test]
    fn refusals_read_as_sentences_not_debug_dumps() {
        let e = status(401, "Unauthorized", "Unauthorized");
        let text = describe(&e, "https://x:6443");
        assert!(
            text.starts_with(
                "the cluster does not accept the kubeconfig's credentials (401 Unauthorized)"
            ),
            "{text}"
        );
        assert!(
            !text.contains("Status {") && !text.contains("ApiError"),
            "{text}"
        );
        let e = status(
            403,
            "Forbidden",
            "pods is forbidden: User \"x\" cannot list resource \"pods\"",
        );
        let text = describe(&e, "https://x:6443");
        assert!(text.contains("403 Forbidden): pods is forbidden"), "{text}");
        let e = status(500, "InternalError", "etcd is down");
        assert_eq!(
            describe(&e, "https://x:6443"),
            "the cluster answered 500 InternalError: etcd is down"
        );
    }

    #[test]
    fn an_unknown_authority_is_named() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let text = describe(&io, "https://x:6443");
        assert!(
            text.contains("authority the kubeconfig does not trust"),
            "{text}"
        );
    }
}
