//! The one mapping from the fleet's errors to gRPC status codes.

use fleetscope_model::FleetError;
use tonic::Status;

/// The status a fleet error is answered with. Its message is cut to a bound: an error
/// about a large input never repeats all of it (clients refuse oversized metadata).
pub(crate) fn status(e: FleetError) -> Status {
    match e {
        FleetError::Unavailable(m) => Status::unavailable(bounded(m)),
        FleetError::InvalidArgument(m) => Status::invalid_argument(bounded(m)),
        FleetError::NotFound(m) => Status::not_found(bounded(m)),
        FleetError::OutOfRange(m) => Status::out_of_range(bounded(m)),
        FleetError::ResourceExhausted(m) => Status::resource_exhausted(bounded(m)),
        FleetError::DeadlineExceeded(m) => Status::deadline_exceeded(bounded(m)),
        FleetError::PermissionDenied(m) => Status::permission_denied(bounded(m)),
    }
}

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
