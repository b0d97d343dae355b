//! One informer: LIST in pages, then WATCH with bookmarks from the list's
//! resourceVersion; reconnect from the last resourceVersion after timeouts and EOFs;
//! re-list on 410; back off with jitter on every failure; report state as it changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetscope_model::{ClusterName, ResourceType};
use futures::{AsyncBufReadExt, StreamExt};
use kube::Client;
use kube::Resource;
use kube::api::{DynamicObject, ListParams, WatchParams};
use kube::core::Request;
use kube::discovery::ApiResource;
use rand::Rng;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::prune::{PrunedObject, Pruning, prune, prune_list};

/// Which stream an update is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    /// The cluster.
    pub cluster: ClusterName,
    /// The resource type.
    pub resource: ResourceType,
    /// The resource type's canonical name, computed once for every object's key.
    pub name: Arc<str>,
    /// What the stream's configuration selects and keeps (see
    /// [`StreamConfig::selection`]); empty when not given.
    pub selection: Arc<str>,
}

impl StreamId {
    /// The stream of one resource type in one cluster.
    pub fn new(cluster: ClusterName, resource: ResourceType) -> Self {
        let name = Arc::from(resource.name());
        Self {
            cluster,
            resource,
            name,
            selection: Arc::from(""),
        }
    }

    /// The same stream, run with a configuration that selects `selection`.
    pub fn selecting(mut self, selection: String) -> Self {
        self.selection = Arc::from(selection);
        self
    }
}

pub use fleetscope_model::fleet::StreamState;

/// What an informer tells the ingest.
#[derive(Debug, Clone)]
pub enum Update {
    /// A complete (re-)list: the full set of the stream's objects.
    Listed {
        /// The stream.
        stream: Arc<StreamId>,
        /// Every object listed.
        objects: Vec<PrunedObject>,
        /// The list's resourceVersion.
        resource_version: String,
        /// Why the stream listed.
        reason: ListReason,
    },
    /// An object was created or changed.
    Applied {
        /// The stream.
        stream: Arc<StreamId>,
        /// The object's new state.
        object: PrunedObject,
        /// Whether the watch said ADDED (else MODIFIED).
        created: bool,
    },
    /// An object was deleted.
    Deleted {
        /// The stream.
        stream: Arc<StreamId>,
        /// The object's last state.
        object: PrunedObject,
    },
    /// A bookmark: the stream has seen everything up to this resourceVersion.
    Progress {
        /// The stream.
        stream: Arc<StreamId>,
        /// The resourceVersion.
        resource_version: String,
    },
    /// The cluster left the fleet; all its streams have stopped and sent everything
    /// they had.
    ClusterGone {
        /// The cluster.
        cluster: ClusterName,
    },
    /// The stream's state changed.
    State {
        /// The stream.
        stream: Arc<StreamId>,
        /// The new state.
        state: StreamState,
        /// Why, for a person to read, when not healthy.
        error: Option<String>,
    },
}

/// Why a stream listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ListReason {
    /// Its first list, with nothing to resume from.
    Initial,
    /// Its resourceVersion expired (410 Gone, or the cluster's history was reset).
    Expired,
    /// Its type is no longer served: an empty list drops its objects.
    Dropped,
}

impl ListReason {
    /// The reason as a metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ListReason::Initial => "initial",
            ListReason::Expired => "expired",
            ListReason::Dropped => "dropped",
        }
    }
}

/// Settings of every stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    /// LIST page size. Default 500.
    pub page_size: u32,
    /// Server-side watch timeout. Default 290 s (kube allows less than 295 s).
    pub watch_timeout: Duration,
    /// A watch silent for its timeout plus this is treated as dead. Default 30 s.
    pub idle_margin: Duration,
    /// First backoff. Default 0.8 s.
    pub backoff_start: Duration,
    /// Longest backoff. Default 30 s.
    pub backoff_cap: Duration,
    /// Backoff for 401/403. Default 60 s.
    pub forbidden_retry: Duration,
    /// What to prune from objects.
    pub pruning: Pruning,
    /// Only this namespace; `None` for all.
    pub namespace: Option<String>,
    /// Server-side label selector.
    pub label_selector: Option<String>,
    /// Server-side field selector.
    pub field_selector: Option<String>,
}

impl StreamConfig {
    /// Which objects the stream holds and what of them it keeps: namespace, label and
    /// field selectors, and pruning, as one canonical text. A stored resourceVersion
    /// resumes only a stream of the same selection; any other lists again.
    pub fn selection(&self) -> String {
        let mut annotations = self.pruning.annotations.clone();
        annotations.sort();
        format!(
            "namespace={:?} labels={:?} fields={:?} prune-managed-fields={} prune-annotations={:?}",
            self.namespace.as_deref().unwrap_or(""),
            self.label_selector.as_deref().unwrap_or(""),
            self.field_selector.as_deref().unwrap_or(""),
            self.pruning.managed_fields,
            annotations,
        )
    }
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            page_size: 500,
            watch_timeout: Duration::from_secs(290),
            idle_margin: Duration::from_secs(30),
            backoff_start: Duration::from_millis(800),
            backoff_cap: Duration::from_secs(30),
            forbidden_retry: Duration::from_secs(60),
            pruning: Pruning::default(),
            namespace: None,
            label_selector: None,
            field_selector: None,
        }
    }
}

/// Exponential backoff with jitter, reset after a healthy period.
#[derive(Debug)]
pub struct Backoff {
    start: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// Starting at `start`, doubling to `cap`.
    pub fn new(start: Duration, cap: Duration) -> Self {
        Self {
            start,
            cap,
            next: start,
        }
    }

    /// The next wait: the current step with ±25% jitter; the step then doubles.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.cap);
        base.mul_f64(rand::rng().random_range(0.75..1.25))
    }

    /// Back to the first step.
    pub fn reset(&mut self) {
        self.next = self.start;
    }
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
struct RawBookmark {
    metadata: RawBookmarkMeta,
}

#[derive(Deserialize)]
struct RawBookmarkMeta {
    #[serde(rename = "resourceVersion", default)]
    resource_version: String,
}

/// Why a LIST or WATCH stopped.
#[derive(Debug)]
enum Stop {
    /// The resourceVersion is too old: re-list.
    Expired,
    /// The watch ended normally (timeout, EOF) or went silent: reconnect from the last RV.
    Reconnect,
    /// Refused: 401 or 403.
    Forbidden(String),
    /// The type is not served: 404.
    NotFound(String),
    /// Anything else.
    Failed(String),
    /// Cancelled.
    Cancelled,
}

fn classify(e: kube::Error) -> Stop {
    match e {
        kube::Error::Api(s) if s.code == 410 => Stop::Expired,
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => {
            Stop::Forbidden(crate::cause::api_status(&s))
        }
        kube::Error::Api(s) if s.code == 404 => Stop::NotFound(s.message.clone()),
        // "Too large resource version": the cluster's history was reset; start over.
        kube::Error::Api(s)
            if s.code == 504 && s.message.contains("Too large resource version") =>
        {
            Stop::Expired
        }
        other => Stop::Failed(crate::source::chain(&other)),
    }
}

/// Sends `req` and reads the whole response body into `body` (cleared first; its
/// capacity is kept). An error status becomes `kube::Error::Api` with the cluster's
/// `Status`, or one built from the status code when the body is not a `Status`.
async fn fetch(
    client: &Client,
    req: http::Request<Vec<u8>>,
    body: &mut Vec<u8>,
) -> Result<(), kube::Error> {
    use http_body_util::BodyExt;
    let res = client.send(req.map(kube::client::Body::from)).await?;
    let status = res.status();
    let length = res
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let mut stream = res.into_body();
    body.clear();
    // A length is a hint only: it never reserves more than a page could be.
    body.reserve(length.unwrap_or(0).min(64 << 20));
    while let Some(frame) = stream.frame().await {
        if let Ok(data) = frame?.into_data() {
            body.extend_from_slice(&data);
        }
    }
    if status.is_client_error() || status.is_server_error() {
        let text = String::from_utf8_lossy(body);
        let s = serde_json::from_str::<kube::core::Status>(&text).unwrap_or_else(|_| {
            kube::core::Status::failure(text.trim(), "the response is not a Status")
                .with_code(status.as_u16())
        });
        return Err(kube::Error::Api(s.boxed()));
    }
    Ok(())
}

struct Informer {
    client: Client,
    id: Arc<StreamId>,
    outage: Arc<crate::outage::Outage>,
    config: StreamConfig,
    tx: mpsc::Sender<Update>,
    cancel: CancellationToken,
    path: String,
}

/// Runs one informer until cancelled. With `resume_from`, it watches from that
/// resourceVersion without listing first; a 410 then leads to a re-list.
///
/// Returns where a successor resumes: the resourceVersion of the last update it
/// handed to `tx` (`None` when nothing was listed), so a stream restarted with new
/// credentials continues exactly after what the ingest has.
pub(crate) async fn run(
    client: Client,
    id: Arc<StreamId>,
    outage: Arc<crate::outage::Outage>,
    config: StreamConfig,
    resume_from: Option<String>,
    tx: mpsc::Sender<Update>,
    cancel: CancellationToken,
) -> Option<String> {
    let rt = &id.resource;
    let ar = ApiResource {
        group: rt.group.clone(),
        version: rt.version.clone(),
        api_version: rt.api_version(),
        kind: rt.kind.clone(),
        plural: rt.plural.clone(),
    };
    let namespace = if rt.namespaced {
        config.namespace.as_deref()
    } else {
        None
    };
    let path = DynamicObject::url_path(&ar, namespace);
    let informer = Informer {
        client,
        id,
        outage,
        config,
        tx,
        cancel,
        path,
    };
    let reached = informer.run(resume_from).await;
    // A stream that stops holds no outage open.
    informer.outage.forget(&informer.id.name);
    reached
}

impl Informer {
    async fn send(&self, update: Update) -> bool {
        tokio::select! {
            r = self.tx.send(update) => r.is_ok(),
            _ = self.cancel.cancelled() => false,
        }
    }

    async fn state(&self, state: StreamState, error: Option<String>) -> bool {
        self.send(Update::State {
            stream: self.id.clone(),
            state,
            error,
        })
        .await
    }

    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.cancel.cancelled() => false,
        }
    }

    async fn run(&self, resume_from: Option<String>) -> Option<String> {
        let mut backoff = Backoff::new(self.config.backoff_start, self.config.backoff_cap);
        let mut rv = resume_from;
        // The cause last logged for this stream's own (not the cluster's) failures.
        let mut last_logged: Option<String> = None;
        let mut reason = ListReason::Initial;
        let mut last_state = None;
        loop {
            if self.cancel.is_cancelled() {
                return rv;
            }
            let stop = match rv.clone() {
                None => {
                    if !self.state(StreamState::Listing, None).await {
                        return None;
                    }
                    let span = tracing::info_span!(
                        "list",
                        cluster = %self.id.cluster,
                        resource = %self.id.name,
                        reason = ?reason,
                        objects = tracing::field::Empty,
                    );
                    let listed = self.list().instrument(span.clone()).await;
                    if let Ok((objects, _)) = &listed {
                        span.record("objects", i64::try_from(objects.len()).unwrap_or(i64::MAX));
                    }
                    drop(span);
                    match listed {
                        Ok((objects, list_rv)) => {
                            self.outage.recovered(&self.id.name);
                            let update = Update::Listed {
                                stream: self.id.clone(),
                                objects,
                                resource_version: list_rv.clone(),
                                reason,
                            };
                            if !self.send(update).await {
                                return None;
                            }
                            rv = Some(list_rv);
                            continue;
                        }
                        Err(stop) => stop,
                    }
                }
                Some(from) => {
                    if last_state != Some(StreamState::Watching) {
                        if !self.state(StreamState::Watching, None).await {
                            return rv;
                        }
                        last_state = Some(StreamState::Watching);
                    }
                    let started = Instant::now();
                    let (stop, seen) = self.watch(&from).await;
                    rv = Some(seen);
                    // A watch that stayed healthy for a while earns a fresh backoff.
                    if started.elapsed() > Duration::from_secs(60) {
                        backoff.reset();
                    }
                    stop
                }
            };
            let (state, error, wait) = match stop {
                Stop::Cancelled => return rv,
                Stop::Reconnect => continue,
                Stop::Expired => {
                    tracing::info!(cluster = %self.id.cluster, resource = %self.id.resource.name(), "resourceVersion expired: re-listing");
                    rv = None;
                    reason = ListReason::Expired;
                    continue;
                }
                Stop::Forbidden(m) => (StreamState::Forbidden, m, self.config.forbidden_retry),
                Stop::NotFound(m) => (StreamState::NotFound, m, self.config.forbidden_retry),
                Stop::Failed(m) => (StreamState::Failed, m, backoff.next_delay()),
            };
            match state {
                // The cluster failing: once per outage, for all its streams.
                StreamState::Failed => {
                    self.outage.failed(&self.id.name, &error);
                }
                // This type refused or gone: once per change of cause.
                _ if last_logged.as_deref() != Some(error.as_str()) => {
                    tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), error = %error, retry_in = ?wait, "stream failed");
                }
                _ => {}
            }
            last_logged = Some(error.clone());
            last_state = Some(state);
            if !self.state(state, Some(error)).await || !self.sleep(wait).await {
                return rv;
            }
        }
    }

    fn list_params(&self) -> ListParams {
        let mut lp = ListParams::default().limit(self.config.page_size);
        if let Some(l) = &self.config.label_selector {
            lp = lp.labels(l);
        }
        if let Some(f) = &self.config.field_selector {
            lp = lp.fields(f);
        }
        lp
    }

    /// Lists every page. An expired continue token restarts the list, so the result is
    /// always one consistent snapshot.
    async fn list(&self) -> Result<(Vec<PrunedObject>, String), Stop> {
        let mut objects = Vec::new();
        let mut lp = self.list_params();
        // One buffer for every page's body, reused: pages are large and alike.
        let mut body = Vec::new();
        loop {
            let req = Request::new(&self.path)
                .list(&lp)
                .map_err(|e| Stop::Failed(e.to_string()))?;
            let fetched = tokio::select! {
                r = fetch(&self.client, req, &mut body) => r.map_err(classify),
                _ = self.cancel.cancelled() => Err(Stop::Cancelled),
            };
            match fetched {
                Err(Stop::Expired) if lp.continue_token.is_some() => {
                    objects.clear();
                    lp = self.list_params();
                    continue;
                }
                other => other?,
            }
            let text = std::str::from_utf8(&body)
                .map_err(|e| Stop::Failed(format!("list response is not UTF-8: {e}")))?;
            let meta = prune_list(text, &self.id.resource, &self.config.pruning, &mut |item| {
                match item {
                    Ok(o) => objects.push(o),
                    Err(e) => {
                        tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), error = %e, "skipping a malformed object")
                    }
                }
            })
            .map_err(|e| Stop::Failed(format!("list response is not a list: {e}")))?;
            // Room for the rest at once, rather than growing by doubling (the list is
            // held whole until it is applied; a bound, as the count comes from outside).
            let remaining = meta.remaining_item_count.unwrap_or(0).min(1 << 20);
            objects.reserve(usize::try_from(remaining).unwrap_or(0));
            match meta.continue_token.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => return Ok((objects, meta.resource_version)),
            }
        }
    }

    /// Watches from `from` until the stream stops; returns why, and the last
    /// resourceVersion seen (where to resume).
    async fn watch(&self, from: &str) -> (Stop, String) {
        let mut seen = from.to_string();
        let mut wp = WatchParams::default()
            .timeout(self.config.watch_timeout.as_secs().clamp(1, 294) as u32);
        wp.bookmarks = true;
        wp.label_selector = self.config.label_selector.clone();
        wp.field_selector = self.config.field_selector.clone();
        let req = match Request::new(&self.path).watch(&wp, from) {
            Ok(r) => r,
            Err(e) => return (Stop::Failed(e.to_string()), seen),
        };
        let silence = self.config.watch_timeout + self.config.idle_margin;
        let opened = tokio::select! {
            r = tokio::time::timeout(silence, self.client.request_stream(req)) => r,
            _ = self.cancel.cancelled() => return (Stop::Cancelled, seen),
        };
        let body = match opened {
            Err(_) => {
                return (
                    Stop::Failed(format!("the watch was not answered within {silence:?}")),
                    seen,
                );
            }
            Ok(Err(e)) => return (classify(e), seen),
            Ok(Ok(body)) => body,
        };
        // The watch is accepted: the cluster answers this stream again.
        self.outage.recovered(&self.id.name);
        let mut lines = body.lines();
        loop {
            let next = tokio::select! {
                r = tokio::time::timeout(silence, lines.next()) => r,
                _ = self.cancel.cancelled() => return (Stop::Cancelled, seen),
            };
            let line = match next {
                Err(_) => {
                    tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), "watch silent for {silence:?}: reconnecting");
                    return (Stop::Reconnect, seen);
                }
                Ok(None) => return (Stop::Reconnect, seen),
                Ok(Some(Err(e))) => {
                    return (Stop::Failed(format!("watch stream broke: {e}")), seen);
                }
                Ok(Some(Ok(line))) => line,
            };
            if line.trim().is_empty() {
                continue;
            }
            let event: RawEvent = match serde_json::from_str(&line) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), error = %e, "skipping a malformed watch event");
                    continue;
                }
            };
            // Where to resume moves only once the update is handed over.
            let mut next_seen = None;
            let update = match event.kind.as_str() {
                "ADDED" | "MODIFIED" | "DELETED" => {
                    match prune(event.object.get(), &self.id.resource, &self.config.pruning) {
                        Ok(object) => {
                            if !object.resource_version.is_empty() {
                                next_seen = Some(object.resource_version.clone());
                            }
                            if event.kind == "DELETED" {
                                Update::Deleted {
                                    stream: self.id.clone(),
                                    object,
                                }
                            } else {
                                Update::Applied {
                                    stream: self.id.clone(),
                                    object,
                                    created: event.kind == "ADDED",
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), error = %e, "skipping a malformed object");
                            continue;
                        }
                    }
                }
                "BOOKMARK" => match serde_json::from_str::<RawBookmark>(event.object.get()) {
                    Ok(b) if !b.metadata.resource_version.is_empty() => {
                        next_seen = Some(b.metadata.resource_version.clone());
                        Update::Progress {
                            stream: self.id.clone(),
                            resource_version: b.metadata.resource_version,
                        }
                    }
                    _ => continue,
                },
                "ERROR" => {
                    let status: RawStatus =
                        serde_json::from_str(event.object.get()).unwrap_or(RawStatus {
                            code: 0,
                            message: line.clone(),
                        });
                    return match status.code {
                        410 => (Stop::Expired, seen),
                        401 | 403 => {
                            let mut s = kube::core::Status::failure(&status.message, "");
                            s.code = status.code;
                            (Stop::Forbidden(crate::cause::api_status(&s)), seen)
                        }
                        _ => (
                            Stop::Failed(format!(
                                "watch error {}: {}",
                                status.code, status.message
                            )),
                            seen,
                        ),
                    };
                }
                other => {
                    tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), kind = other, "skipping a watch event of unknown type");
                    continue;
                }
            };
            if !self.send(update).await {
                return (Stop::Cancelled, seen);
            }
            if let Some(rv) = next_seen {
                seen = rv;
            }
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod sim_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(800), Duration::from_secs(30));
        let first = b.next_delay();
        assert!(
            first >= Duration::from_millis(600) && first <= Duration::from_millis(1000),
            "{first:?}"
        );
        for _ in 0..20 {
            assert!(b.next_delay() <= Duration::from_millis(37_500));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(1000));
    }
}
