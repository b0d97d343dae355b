//! Talking to the API server for a stream: a list read whole (its body bounded), a
//! watch's lines as they arrive, and what an answer's status or error means for the
//! stream (expired, forbidden, throttled, retry).

use std::time::Duration;

use fleetscope_model::fleet::SyncMethod;
use kube::Client;
use serde::Deserialize;

use crate::prune::PrunedObject;

#[derive(Deserialize)]
pub(super) struct RawStatus {
    #[serde(default)]
    pub(super) code: u16,
    #[serde(default)]
    pub(super) message: String,
}

#[derive(Deserialize)]
pub(super) struct RawBookmark {
    pub(super) metadata: RawBookmarkMeta,
}

#[derive(Deserialize)]
pub(super) struct RawBookmarkMeta {
    #[serde(rename = "resourceVersion", default)]
    pub(super) resource_version: String,
    #[serde(default)]
    pub(super) annotations: std::collections::BTreeMap<String, String>,
}

/// A BOOKMARK event's object read as a bookmark: `None` for one without a
/// resourceVersion (nothing to resume from), or for anything else.
pub(super) fn bookmark(object: &str) -> Option<RawBookmarkMeta> {
    serde_json::from_str::<RawBookmark>(object)
        .ok()
        .map(|b| b.metadata)
        .filter(|m| !m.resource_version.is_empty())
}

impl RawBookmarkMeta {
    /// Whether this bookmark ends a streaming list's initial events.
    pub(super) fn initial_events_end(&self) -> bool {
        self.annotations
            .get("k8s.io/initial-events-end")
            .is_some_and(|v| v == "true")
    }
}

/// Why a LIST or WATCH stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The resourceVersion is too old: re-list.
    Expired,
    /// The watch ended normally (timeout, EOF) or went silent: reconnect from the last RV.
    Reconnect,
    /// Asked to confirm the stream current: list (consistently) again.
    Confirm,
    /// Refused: 401 or 403.
    Forbidden(String),
    /// The type is not served: 404.
    NotFound(String),
    /// The request was not taken: 400 or 422.
    Invalid(String),
    /// Throttled or unavailable (429, 503) with a time to wait before trying again.
    Throttled(String, Duration),
    /// Anything else.
    Failed(String),
    /// Cancelled.
    Cancelled,
}

pub(super) fn classify(e: kube::Error) -> Stop {
    // The server's own time to wait (`retryAfterSeconds`) is a floor under the backoff.
    if let kube::Error::Api(s) = &e
        && (s.code == 429 || s.code == 503)
    {
        let after = s.details.as_ref().map_or(0, |d| d.retry_after_seconds);
        if after > 0 {
            let after = Duration::from_secs(u64::from(after.min(600)));
            return Stop::Throttled(crate::source::chain(&e), after);
        }
    }
    match e {
        kube::Error::Api(s) if s.code == 410 => Stop::Expired,
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => {
            Stop::Forbidden(crate::cause::api_status(&s))
        }
        kube::Error::Api(s) if s.code == 404 => Stop::NotFound(s.message.clone()),
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => {
            Stop::Invalid(crate::cause::api_status(&s))
        }
        // "Too large resource version": the cluster's history was reset; start over.
        kube::Error::Api(s)
            if s.code == 504 && s.message.contains("Too large resource version") =>
        {
            Stop::Expired
        }
        other => Stop::Failed(crate::source::chain(&other)),
    }
}

/// The error a response with status `status` and body `body` stands for: the
/// cluster's `Status`, or one built from the status code when the body is not one.
pub(super) fn api_error(status: http::StatusCode, body: &[u8]) -> kube::Error {
    let text = String::from_utf8_lossy(body);
    let s = serde_json::from_str::<kube::core::Status>(&text).unwrap_or_else(|_| {
        kube::core::Status::failure(text.trim(), "the response is not a Status")
            .with_code(status.as_u16())
    });
    kube::Error::Api(s.boxed())
}

/// The most of an error response's body that is read.
pub(super) const ERROR_BODY_LIMIT: usize = 64 << 10;

/// Sends a LIST request and hands its body to `reader` as it arrives, so each item is
/// pruned as soon as it is in. An error status becomes `kube::Error::Api`.
pub(super) async fn fetch_list(
    client: &Client,
    req: http::Request<Vec<u8>>,
    reader: &mut crate::prune::list::ListReader<'_>,
    each: &mut (dyn FnMut(Result<PrunedObject, crate::prune::PruneError>) + Send),
) -> Result<(), kube::Error> {
    let mut body = ListBody::open(client, req).await?;
    while body.feed(reader, each).await? {}
    Ok(())
}

/// A list response whose status said it holds a list, read frame by frame.
pub(super) struct ListBody(kube::client::Body);

impl ListBody {
    /// Sends `req`; an error status is the error its body describes.
    pub(super) async fn open(
        client: &Client,
        req: http::Request<Vec<u8>>,
    ) -> Result<Self, kube::Error> {
        use http_body_util::BodyExt;
        let res = client.send(req.map(kube::client::Body::from)).await?;
        let status = res.status();
        let mut stream = res.into_body();
        if status.is_client_error() || status.is_server_error() {
            let mut body = Vec::new();
            while let Some(frame) = stream.frame().await {
                if let Ok(data) = frame?.into_data() {
                    body.extend_from_slice(&data[..data.len().min(ERROR_BODY_LIMIT - body.len())]);
                    if body.len() >= ERROR_BODY_LIMIT {
                        break;
                    }
                }
            }
            return Err(api_error(status, &body));
        }
        Ok(Self(stream))
    }

    /// Feeds the next frame to `reader`, each item it completes to `each`; whether
    /// there was one (`false` at the end of the response).
    pub(super) async fn feed(
        &mut self,
        reader: &mut crate::prune::list::ListReader<'_>,
        each: &mut (dyn FnMut(Result<PrunedObject, crate::prune::PruneError>) + Send),
    ) -> Result<bool, kube::Error> {
        use http_body_util::BodyExt;
        let Some(frame) = self.0.frame().await else {
            return Ok(false);
        };
        if let Ok(data) = frame?.into_data() {
            reader.feed(&data, each).map_err(|e| {
                kube::Error::Service(format!("the list response is not a list: {e}").into())
            })?;
        }
        Ok(true)
    }
}

/// A complete state of a stream, and how it was read.
pub(crate) struct Listed {
    /// The objects, or the last of them when parts were sent ahead.
    pub(crate) objects: Vec<PrunedObject>,
    /// The list's number when parts of it were sent ahead.
    pub(crate) parts: Option<u64>,
    /// How many objects the list held, parts sent ahead included.
    pub(crate) count: usize,
    pub(crate) resource_version: String,
    pub(crate) method: SyncMethod,
    /// For a streaming list: the watch it came on, which goes on from there.
    pub(crate) watch: Option<WatchLines>,
}

/// A watch response read line by line into one buffer, reused from line to line.
pub(crate) struct WatchLines {
    pub(super) body: std::pin::Pin<Box<dyn futures::AsyncBufRead + Send>>,
    pub(super) line: Vec<u8>,
    /// The longest line kept: one event's object at the largest object size, with room
    /// for its envelope.
    pub(super) max: usize,
    /// Lines passed over for their length since last asked.
    pub(super) too_long: u64,
}

impl WatchLines {
    pub(super) fn new(
        body: impl futures::AsyncBufRead + Send + 'static,
        max_object_bytes: usize,
    ) -> Self {
        Self {
            body: Box::pin(body),
            line: Vec::new(),
            max: max_object_bytes.saturating_add(64 << 10),
            too_long: 0,
        }
    }

    /// The next line, without its line end; `None` at the end of the response. A line
    /// longer than the most kept is read past without being held, and given as an
    /// empty line (see [`WatchLines::too_long`]).
    pub(super) async fn next(&mut self) -> Option<std::io::Result<&str>> {
        use futures::{AsyncBufReadExt, AsyncReadExt};
        self.line.clear();
        let mut passed = 0usize;
        loop {
            let limit = u64::try_from(self.max + 1 - self.line.len()).unwrap_or(u64::MAX);
            let mut bounded = (&mut self.body).take(limit);
            let read = match bounded.read_until(b'\n', &mut self.line).await {
                Ok(n) => n,
                Err(e) => return Some(Err(e)),
            };
            if self.line.last() == Some(&b'\n') || read == 0 {
                break;
            }
            if self.line.len() > self.max {
                // Too long: read on to the line's end, keeping nothing.
                passed += self.line.len();
                self.line.clear();
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    let mut chunk = (&mut self.body).take(64 << 10);
                    match chunk.read_until(b'\n', &mut rest).await {
                        Ok(0) => break,
                        Ok(_) if rest.last() == Some(&b'\n') => break,
                        Ok(_) => {}
                        Err(e) => return Some(Err(e)),
                    }
                }
                self.too_long += 1;
                tracing::debug!(
                    bytes = passed,
                    "passed over a watch line longer than the largest object"
                );
                return Some(Ok(""));
            }
        }
        if self.line.is_empty() {
            return None;
        }
        Some(
            std::str::from_utf8(&self.line)
                .map(|l| l.trim_end_matches(['\n', '\r']))
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        )
    }

    /// How many lines were passed over for their length since last asked.
    pub(super) fn too_long(&mut self) -> u64 {
        std::mem::take(&mut self.too_long)
    }
}

/// Why a list did not give a state.
pub(crate) enum ListStop {
    /// The server does not serve streaming lists (it refused or ignored the request):
    /// list instead.
    Unsupported(String),
    /// Anything else, handled as for a watch.
    Stop(Stop),
}

impl From<Stop> for ListStop {
    fn from(s: Stop) -> Self {
        ListStop::Stop(s)
    }
}

/// Why a watch's ERROR event stops it.
pub(super) fn watch_error(object: &str, line: &str) -> Stop {
    let status: RawStatus = serde_json::from_str(object).unwrap_or(RawStatus {
        code: 0,
        message: line.to_string(),
    });
    match status.code {
        410 => Stop::Expired,
        401 | 403 => {
            let mut s = kube::core::Status::failure(&status.message, "");
            s.code = status.code;
            Stop::Forbidden(crate::cause::api_status(&s))
        }
        _ => Stop::Failed(format!("watch error {}: {}", status.code, status.message)),
    }
}
