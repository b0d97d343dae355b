//! Errors as the Kubernetes API writes them: a `metav1.Status` with the API server's
//! code and reason, so every client (kubectl, client-go, kube-rs) reads them as it
//! reads an API server's: `NotFound`, `Forbidden`, `Unauthorized`, `Gone` (a position
//! no longer held: list again), `Expired` (a `continue` token too old), `BadRequest`,
//! `TooManyRequests` with `Retry-After`, `MethodNotAllowed` for writes, and
//! `ServiceUnavailable` while fleetscope starts (retried by clients).

use fleetscope_model::FleetError;
use fleetscope_model::fleet::reason;
use serde_json::{Value, json};

/// A refusal: the HTTP code and the `metav1.Status` that says it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The HTTP status code.
    pub code: u16,
    /// The `metav1.Status` object.
    pub status: Value,
    /// Seconds to wait before retrying, when there is a wait (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl Refusal {
    /// A refusal of `code` and Kubernetes `reason`, saying `message`.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            status: json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message.into(),
                "reason": reason,
                "code": code,
            }),
            retry_after: None,
        }
    }

    /// Names what was not found (`details.name`, `details.kind`), as an API server
    /// does.
    pub fn not_found(kind: &str, group: &str, name: &str, message: impl Into<String>) -> Self {
        let mut r = Self::new(404, "NotFound", message);
        r.status["details"] = json!({"name": name, "group": group, "kind": kind});
        r
    }

    /// A bad request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// A write, refused: the view is read-only; the message says where to write.
    pub fn read_only(method: &str, cluster: Option<&str>) -> Self {
        Self::read_only_because(&format!("{method} is not allowed"), cluster)
    }

    /// The OpenAPI schema kubectl asks for before it writes (`apply`, `create -f`,
    /// `edit`): not served, saying where to write.
    pub fn no_schema(cluster: Option<&str>) -> Self {
        Self::read_only_because(
            "it has no OpenAPI schema, as nothing is written here",
            cluster,
        )
    }

    fn read_only_because(why: &str, cluster: Option<&str>) -> Self {
        let to = cluster.map_or_else(
            || "the cluster that holds the object".to_string(),
            |c| format!("cluster {c} directly (its own API server)"),
        );
        let mut r = Self::new(
            405,
            "MethodNotAllowed",
            format!("fleetscope serves a read-only view of the fleet ({why}): write to {to}"),
        );
        r.status["details"] = json!({"causes": [{"reason": "MethodNotAllowed", "message": "only get, list and watch are served"}]});
        r
    }

    /// With `Retry-After` (and the status's `details.retryAfterSeconds`).
    fn retry(mut self, seconds: u64) -> Self {
        self.status["details"]["retryAfterSeconds"] = json!(seconds);
        self.retry_after = Some(seconds);
        self
    }
}

/// How the Kubernetes API says `e`.
pub fn of(e: &FleetError) -> Refusal {
    match e {
        FleetError::Unavailable(m) => Refusal::new(503, "ServiceUnavailable", m.clone()).retry(1),
        FleetError::InvalidArgument(m) => Refusal::bad_request(m.clone()),
        FleetError::NotFound(m) => Refusal::new(404, "NotFound", m.clone()),
        FleetError::OutOfRange {
            message,
            reason: why,
            ..
        } => {
            if *why == reason::PAGE_SNAPSHOT_RELEASED {
                Refusal::new(410, "Expired", message.clone())
            } else {
                Refusal::new(410, "Gone", message.clone())
            }
        }
        FleetError::ResourceExhausted { message, .. } => {
            Refusal::new(429, "TooManyRequests", message.clone()).retry(1)
        }
        FleetError::DeadlineExceeded(m) => Refusal::new(504, "Timeout", m.clone()).retry(1),
        FleetError::PermissionDenied(m) => Refusal::new(403, "Forbidden", m.clone()),
    }
}

/// How the Kubernetes API says an authentication or admission refusal (a gRPC status
/// from the guard): `Unauthorized` (no or bad credentials), `Forbidden`, or
/// `ServiceUnavailable` (a token that could not be reviewed now).
pub fn refused(s: &tonic::Status) -> Refusal {
    match s.code() {
        tonic::Code::Unauthenticated => Refusal::new(401, "Unauthorized", s.message()),
        tonic::Code::Unavailable => Refusal::new(503, "ServiceUnavailable", s.message()).retry(2),
        tonic::Code::ResourceExhausted => {
            Refusal::new(429, "TooManyRequests", s.message()).retry(1)
        }
        _ => Refusal::new(403, "Forbidden", s.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seam_s_errors_read_as_an_api_server_s() {
        let gone = of(&FleetError::OutOfRange {
            message: "revision 3 is older than the event log".into(),
            reason: reason::REVISION_COMPACTED,
            oldest: None,
        });
        assert_eq!((gone.code, &gone.status["reason"]), (410, &json!("Gone")));
        assert_eq!(gone.status["kind"], "Status");
        let expired = of(&FleetError::OutOfRange {
            message: "page token expired".into(),
            reason: reason::PAGE_SNAPSHOT_RELEASED,
            oldest: None,
        });
        assert_eq!(expired.status["reason"], "Expired");
        let busy = of(&FleetError::ResourceExhausted {
            message: "too many".into(),
            reason: reason::WATCH_BEHIND,
            resume_from: None,
        });
        assert_eq!(
            (
                busy.code,
                busy.retry_after,
                &busy.status["details"]["retryAfterSeconds"]
            ),
            (429, Some(1), &json!(1))
        );
        assert_eq!(of(&FleetError::Unavailable("starting".into())).code, 503);
        assert_eq!(
            of(&FleetError::PermissionDenied("no".into())).status["reason"],
            "Forbidden"
        );
        let write = Refusal::read_only("POST", Some("prod-1"));
        assert_eq!(write.code, 405);
        assert!(
            write.status["message"]
                .as_str()
                .unwrap()
                .contains("cluster prod-1"),
            "{}",
            write.status
        );
        assert_eq!(
            refused(&tonic::Status::unauthenticated("no credentials")).status["reason"],
            "Unauthorized"
        );
    }
}
