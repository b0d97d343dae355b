//! The one mapping from the fleet's errors to gRPC status codes.

use std::collections::HashMap;

use fleetscope_model::fleet::reason;
use fleetscope_model::{FleetError, Revision};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

/// The status a fleet error is answered with. Its message is cut to a bound: an error
/// about a large input never repeats all of it (clients refuse oversized metadata).
///
/// What a program needs is in standard details (`google.rpc`), never only in the
/// message: `ErrorInfo` (domain `fleetscope.io`, the reason, and `oldest_revision` or
/// `resume_from` in its metadata) for revisions out of range and Watches ended behind,
/// and `RetryInfo` where retrying helps (a server starting, a Watch to resume).
pub fn status(e: FleetError) -> Status {
    match e {
        FleetError::Unavailable(m) => Status::with_error_details(
            Code::Unavailable,
            bounded(m),
            ErrorDetails::with_retry_info(Some(RETRY_UNAVAILABLE)),
        ),
        FleetError::InvalidArgument(m) => Status::invalid_argument(bounded(m)),
        FleetError::NotFound(m) => Status::not_found(bounded(m)),
        FleetError::OutOfRange {
            message,
            reason: code,
            oldest,
        } => Status::with_error_details(
            Code::OutOfRange,
            bounded(message),
            error_info(code, "oldest_revision", oldest),
        ),
        FleetError::ResourceExhausted {
            message,
            reason: code,
            resume_from,
        } => {
            let mut details = error_info(code, "resume_from", resume_from);
            if resume_from.is_some() {
                details.set_retry_info(Some(RETRY_RESUME));
            }
            Status::with_error_details(Code::ResourceExhausted, bounded(message), details)
        }
        FleetError::DeadlineExceeded(m) => Status::deadline_exceeded(bounded(m)),
        FleetError::PermissionDenied(m) => Status::permission_denied(bounded(m)),
    }
}

/// The fleet error a replica's status stands for, as a router answers it: each code
/// back to its variant (with the reason and revision of its `ErrorInfo`), and what no
/// variant holds (a replica that cannot be reached, refused the router, or failed) as
/// retryable, naming the replica.
pub fn from_replica(replica: &str, s: &Status) -> FleetError {
    let info = s.get_details_error_info();
    let known = |r: &str| {
        [
            reason::REVISION_COMPACTED,
            reason::REVISION_IN_FUTURE,
            reason::PAGE_SNAPSHOT_RELEASED,
            reason::WATCH_BEHIND,
            reason::WATCH_STALLED,
        ]
        .into_iter()
        .find(|k| *k == r)
    };
    let code = info.as_ref().and_then(|i| known(&i.reason));
    let revision = |key: &str| {
        info.as_ref()
            .and_then(|i| i.metadata.get(key))
            .and_then(|v| v.parse().ok())
            .map(Revision)
    };
    let m = s.message().to_string();
    match s.code() {
        Code::InvalidArgument => FleetError::InvalidArgument(m),
        Code::NotFound => FleetError::NotFound(m),
        Code::OutOfRange => FleetError::OutOfRange {
            message: m,
            reason: code.unwrap_or(reason::PAGE_SNAPSHOT_RELEASED),
            oldest: revision("oldest_revision"),
        },
        Code::ResourceExhausted => FleetError::ResourceExhausted {
            message: m,
            reason: code.unwrap_or(reason::WATCH_BEHIND),
            resume_from: revision("resume_from"),
        },
        Code::DeadlineExceeded => FleetError::DeadlineExceeded(m),
        Code::PermissionDenied => FleetError::PermissionDenied(m),
        Code::Unavailable => FleetError::Unavailable(format!("replica {replica}: {m}")),
        other => {
            FleetError::Unavailable(format!("replica {replica} answered {other:?}: {m}; retry"))
        }
    }
}

/// An `ErrorInfo` of fleetscope's domain: `code`, and `revision` under `key` when known.
fn error_info(code: &str, key: &str, revision: Option<Revision>) -> ErrorDetails {
    let metadata: HashMap<String, String> = revision
        .map(|r| (key.to_string(), r.to_string()))
        .into_iter()
        .collect();
    ErrorDetails::with_error_info(code, reason::DOMAIN, metadata)
}

/// How soon a call refused while the server starts may be retried.
const RETRY_UNAVAILABLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How soon a Watch ended behind may resume.
const RETRY_RESUME: std::time::Duration = std::time::Duration::from_millis(100);

/// The most bytes of an error message.
const MAX_MESSAGE: usize = 1024;

/// The most bytes of a client's input an error message repeats.
const MAX_ECHO: usize = 128;

/// Cuts `s` to at most `max` bytes (at a character boundary), saying how much was cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &s[..end], s.len() - end)
}

/// A message cut to [`MAX_MESSAGE`].
fn bounded(m: String) -> String {
    if m.len() <= MAX_MESSAGE {
        m
    } else {
        cut(&m, MAX_MESSAGE)
    }
}

/// A client's input as an error message repeats it: cut to [`MAX_ECHO`] bytes.
pub fn echo(input: &str) -> String {
    cut(input, MAX_ECHO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_repeat_a_large_input_whole() {
        let huge = "a=b,".repeat(300_000);
        let s = status(FleetError::InvalidArgument(format!(
            "query.label_selector: {huge}"
        )));
        assert!(
            s.message().len() < MAX_MESSAGE + 32,
            "{}",
            s.message().len()
        );
        assert!(s.message().ends_with("more bytes)"));
        assert_eq!(echo("short"), "short");
        let multibyte = "é".repeat(200);
        assert!(echo(&multibyte).len() <= MAX_ECHO + 32);
    }
}
