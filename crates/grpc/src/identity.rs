//! A caller's identity as a router passes it to a replica (kube-apiserver's
//! requestheader convention: `x-remote-user`, `x-remote-group`, each with a `-bin`
//! twin for what a text header cannot carry), and the Kubernetes names of the
//! anonymous and authenticated: one definition for the router that writes the
//! headers and the replica that reads them.

use fleetscope_model::access::Subject;

/// The group of every authenticated caller.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The user of a caller that presented nothing, when no authentication is configured.
pub const ANONYMOUS: &str = "system:anonymous";
/// The group of such a caller.
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

/// Who a server serves a router's request as: the user and groups it passed, in
/// `system:authenticated` unless anonymous.
pub fn passed_subject(user: String, mut groups: Vec<String>) -> Subject {
    if user != ANONYMOUS && !groups.iter().any(|g| g == AUTHENTICATED) {
        groups.push(AUTHENTICATED.into());
    }
    Subject { user, groups }
}

/// The header a router passes its caller's user name in (kube-apiserver's
/// requestheader default).
pub const REMOTE_USER: &str = "x-remote-user";
/// The header (repeated) a router passes its caller's groups in.
pub const REMOTE_GROUP: &str = "x-remote-group";
/// [`REMOTE_USER`] for a name a text header cannot carry (not ASCII): its UTF-8,
/// as gRPC carries binary metadata (base64).
pub const REMOTE_USER_BIN: &str = "x-remote-user-bin";
/// [`REMOTE_GROUP`] for a group a text header cannot carry.
pub const REMOTE_GROUP_BIN: &str = "x-remote-group-bin";

/// Puts `subject` on a request as a router passes its caller to a replica: each
/// value in its text header where that can carry it, else in the `-bin` twin, so
/// that any identity passes whole (none is dropped, which would leave the request
/// the router's own).
pub fn pass_identity(metadata: &mut tonic::metadata::MetadataMap, subject: &Subject) {
    use tonic::metadata::{AsciiMetadataValue, BinaryMetadataValue};
    // A header value may hold bytes past ASCII, but a replica reads text headers as
    // ASCII only: anything else goes binary.
    let ascii = |v: &str| {
        v.bytes()
            .all(|b| b.is_ascii_graphic() || b == b' ')
            .then(|| v.parse::<AsciiMetadataValue>().ok())
            .flatten()
    };
    match ascii(&subject.user) {
        Some(v) => {
            metadata.insert(REMOTE_USER, v);
        }
        None => {
            metadata.insert_bin(
                REMOTE_USER_BIN,
                BinaryMetadataValue::from_bytes(subject.user.as_bytes()),
            );
        }
    }
    for g in &subject.groups {
        match ascii(g) {
            Some(v) => {
                metadata.append(REMOTE_GROUP, v);
            }
            None => {
                metadata.append_bin(
                    REMOTE_GROUP_BIN,
                    BinaryMetadataValue::from_bytes(g.as_bytes()),
                );
            }
        }
    }
}

/// The values a router passed in `text` and its `-bin` twin (see [`pass_identity`]).
pub fn passed_values(
    headers: &http::HeaderMap,
    text: &'static str,
    bin: &'static str,
) -> Result<Vec<String>, tonic::Status> {
    use base64::Engine as _;
    let refused = |what: &str| {
        tonic::Status::unauthenticated(format!(
            "the router passed {what} that is empty or not text"
        ))
    };
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let plain = headers.get_all(text).iter().map(|v| {
        v.to_str()
            .ok()
            .map(str::to_string)
            .ok_or_else(|| refused(text))
    });
    let binary = headers.get_all(bin).iter().map(|v| {
        lenient
            .decode(v.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| refused(bin))
    });
    plain
        .chain(binary)
        .map(|v| {
            let v = v?;
            let v = v.trim();
            if v.is_empty() {
                Err(refused(text))
            } else {
                Ok(v.to_string())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_identity_a_router_passes_arrives_whole() {
        let subject = Subject {
            user: "josé".into(),
            groups: vec!["team-a".into(), "équipe".into(), "ops".into()],
        };
        let mut metadata = tonic::metadata::MetadataMap::new();
        pass_identity(&mut metadata, &subject);
        let headers = metadata.into_headers();
        assert!(headers.contains_key(REMOTE_USER_BIN) && !headers.contains_key(REMOTE_USER));
        assert_eq!(
            passed_values(&headers, REMOTE_USER, REMOTE_USER_BIN).unwrap(),
            ["josé"]
        );
        let mut groups = passed_values(&headers, REMOTE_GROUP, REMOTE_GROUP_BIN).unwrap();
        groups.sort();
        assert_eq!(groups, ["ops", "team-a", "équipe"]);
        // Not base64 of UTF-8: refused, never dropped.
        let mut bad = http::HeaderMap::new();
        bad.insert(REMOTE_USER_BIN, http::HeaderValue::from_static("/w=="));
        assert!(passed_values(&bad, REMOTE_USER, REMOTE_USER_BIN).is_err());
    }
}
