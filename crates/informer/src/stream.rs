//! One informer: the cluster's state by a streaming list (WatchList) whose watch then
//! goes on, or, where the server does not offer one, a LIST from the watch cache and
//! then a WATCH with bookmarks from the list's resourceVersion (see [`ListFrom`] for
//! which read, and [`goes_back`] for the list never applied); reconnect from the last
//! resourceVersion after timeouts and EOFs; re-list on 410 (consistently, from
//! storage); back off with jitter on every failure, never sooner than a server asks;
//! report state as it changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetscope_model::{ClusterName, ResourceType, is_resource_version};
use kube::Client;
use kube::Resource;
use kube::api::{DynamicObject, ListParams, WatchParams};
use kube::core::Request;
use kube::discovery::ApiResource;
use rand::Rng;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::prune::{PrunedObject, Pruning};

mod api;
mod follow;

use api::*;
pub(crate) use api::{ListStop, Stop};

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

pub use fleetscope_model::fleet::{StreamState, SyncMethod};

/// What an informer tells the ingest.
#[derive(Debug, Clone)]
pub enum Update {
    /// Part of a list still arriving, sent ahead of its end so the index is built
    /// while the rest is transferred: the list's objects are the parts with this
    /// `list` number, then the [`Update::Listed`] that names it. Only a first list,
    /// with nothing held for the stream, is sent in parts.
    ListPart {
        /// The stream.
        stream: Arc<StreamId>,
        /// Which list this is part of (unique within the process).
        list: u64,
        /// Objects of the list, in the order they came.
        objects: Vec<PrunedObject>,
    },
    /// A complete (re-)list: the full set of the stream's objects.
    Listed {
        /// The stream.
        stream: Arc<StreamId>,
        /// Every object listed, or the last of them when parts were sent ahead.
        objects: Vec<PrunedObject>,
        /// The list's number when parts of it were sent ahead ([`Update::ListPart`]).
        parts: Option<u64>,
        /// The list's resourceVersion.
        resource_version: String,
        /// Why the stream listed.
        reason: ListReason,
        /// How the list was made; `None` for the empty list of a dropped type.
        method: Option<SyncMethod>,
        /// Why a LIST was made although the stream asked for a streaming list.
        fallback: Option<String>,
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
    /// What the stream dropped of what its cluster sent, since its last report.
    Dropped {
        /// The stream.
        stream: Arc<StreamId>,
        /// How many, by why.
        drops: Drops,
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

/// What a stream dropped of what its cluster sent: objects and watch events that no
/// API server sends, each logged and counted, never applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drops {
    /// Objects larger than [`StreamConfig::max_object_bytes`].
    pub too_large: u64,
    /// Objects and bookmarks whose resourceVersion is not a number (etcd's revisions
    /// are; a watch could not resume from it).
    pub malformed_version: u64,
    /// Watch events and bookmarks whose resourceVersion is behind the stream's.
    pub backward_version: u64,
}

impl Drops {
    /// Whether nothing was dropped.
    pub fn is_empty(&self) -> bool {
        *self == Drops::default()
    }

    /// Adds `other` to these.
    pub fn add(&mut self, other: &Drops) {
        self.too_large += other.too_large;
        self.malformed_version += other.malformed_version;
        self.backward_version += other.backward_version;
    }
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
    /// Asked to confirm it current (this process did not run for a while): a
    /// consistent list, whatever its resourceVersion.
    Confirm,
}

impl ListReason {
    /// The reason as a metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ListReason::Initial => "initial",
            ListReason::Expired => "expired",
            ListReason::Dropped => "dropped",
            ListReason::Confirm => "confirm",
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
    /// Ask for streaming lists (WatchList) and list only when the server refuses or
    /// ignores them. Default true.
    pub watch_list: bool,
    /// A streaming list silent this long before its initial events have ended is taken
    /// for a server that ignored the request (a plain watch of a quiet type sends
    /// nothing): the stream lists instead. Default 10 s (an API server answers from its
    /// watch cache, waiting at most 3 s for it to catch up).
    pub watch_list_silence: Duration,
    /// A first list, streaming or not (nothing held for the stream), is handed over in
    /// parts of this many objects as they arrive, so the index is built beside the
    /// transfer; 0 hands it over whole. Default 4,096.
    pub list_part: usize,
    /// The largest object taken, as its cluster sends it (its JSON, before pruning):
    /// a larger one is dropped, logged and counted. Default 16 MiB, well above what
    /// an API server stores (etcd takes requests of 1.5 MiB by default).
    pub max_object_bytes: usize,
    /// How long a watch resumed from a stored resourceVersion must stay quiet, once
    /// its cluster has accepted it, to count as resumed: an API server sends back a
    /// resourceVersion it no longer holds (410) and the changes since it at once.
    /// Default 250 ms.
    pub resumed_quiet: Duration,
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
            watch_list: true,
            watch_list_silence: Duration::from_secs(10),
            list_part: 4096,
            max_object_bytes: 16 << 20,
            resumed_quiet: Duration::from_millis(250),
        }
    }
}

/// Numbers lists sent in parts, so the parts of an abandoned list are never taken for
/// the next one's.
static LIST_NUMBER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A number for a list handed over in parts, unlike any other's.
fn next_list_number() -> u64 {
    LIST_NUMBER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Where a list reads from: what the stream holds decides it, as client-go's
/// reflector decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFrom {
    /// Nothing held: any recent state, from the API server's watch cache
    /// (`resourceVersion=0`; the server may then not page).
    Cache,
    /// Something held at this resourceVersion: state not older than it, from the
    /// watch cache (`resourceVersionMatch=NotOlderThan`, unpaged).
    NotOlderThan(String),
    /// After a 410 (or a reset history): a consistent read from storage, in pages.
    Consistent,
    /// The state at exactly this resourceVersion, from storage, in pages
    /// (`resourceVersionMatch=Exact`); 410 once the history no longer holds it.
    Exact(String),
}

impl ListFrom {
    /// The read for a stream holding state at `held` (if anything) that lists for `reason`.
    pub fn choose(held: Option<&str>, reason: ListReason) -> Self {
        match (reason, held) {
            (ListReason::Expired | ListReason::Confirm, _) => ListFrom::Consistent,
            (_, Some(rv)) if !rv.is_empty() => ListFrom::NotOlderThan(rv.to_string()),
            _ => ListFrom::Cache,
        }
    }

    /// How a list read this way counts.
    fn method(&self) -> SyncMethod {
        match self {
            ListFrom::Consistent | ListFrom::Exact(_) => SyncMethod::ListConsistent,
            _ => SyncMethod::ListFromCache,
        }
    }
}

/// Whether a list at `listed` would take a stream holding `held` back in time.
/// resourceVersions are compared as the numbers etcd makes them; ones that are not
/// numbers cannot be compared and never count as older.
pub fn goes_back(listed: &str, held: Option<&str>) -> bool {
    match (listed.parse::<u64>(), held.map(str::parse::<u64>)) {
        (Ok(listed), Some(Ok(held))) => listed < held,
        _ => false,
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

/// Resolves when `rewatch` changes; never without one (or once its sender is gone).
async fn asked_to_rewatch(rewatch: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    let Some(r) = rewatch else {
        return std::future::pending().await;
    };
    if r.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

pub(crate) struct Informer {
    client: Client,
    id: Arc<StreamId>,
    outage: Arc<crate::outage::Outage>,
    config: StreamConfig,
    tx: mpsc::Sender<Update>,
    cancel: CancellationToken,
    path: String,
    /// Changed when the stream must end its watch and resume it at once.
    rewatch: Option<tokio::sync::watch::Receiver<u64>>,
    /// Told when the stream's watch resumed from the store has been accepted and
    /// stayed quiet ([`StreamConfig::resumed_quiet`]).
    resumed: Option<Resumed>,
}

/// What a stream tells when its watch resumed from the store has been accepted and
/// stayed quiet: what was restored for it is its cluster's state.
pub type Resumed = Arc<dyn Fn() + Send + Sync>;

/// Where an informer starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Start {
    /// Watch from this resourceVersion without listing first; a 410 then leads to a
    /// re-list.
    pub watch_from: Option<String>,
    /// The resourceVersion of objects the ingest holds for this stream that cannot be
    /// resumed (collected under another selection): a list never goes back before it.
    pub floor: Option<String>,
}

/// How a stream is steered from outside, and what it tells besides its updates.
pub(crate) struct Steering {
    /// Cancelled to stop it.
    pub(crate) cancel: CancellationToken,
    /// Each change makes it list again (consistently), confirming it current.
    pub(crate) rewatch: Option<tokio::sync::watch::Receiver<u64>>,
    /// Told when its watch resumed from the store (its start's `watch_from`) is
    /// accepted and stays quiet.
    pub(crate) resumed: Option<Resumed>,
}

/// Runs one informer from `start` until `steering` cancels it.
///
/// Returns where a successor resumes: the resourceVersion of the last update it
/// handed to `tx` (`None` when nothing was listed), so a stream restarted with new
/// credentials continues exactly after what the ingest has.
pub(crate) async fn run(
    client: Client,
    id: Arc<StreamId>,
    outage: Arc<crate::outage::Outage>,
    config: StreamConfig,
    start: Start,
    tx: mpsc::Sender<Update>,
    steering: Steering,
) -> Option<String> {
    let Steering {
        cancel,
        rewatch,
        resumed,
    } = steering;
    let mut informer = Informer::new(client, id, outage, config, tx, cancel);
    informer.rewatch = rewatch;
    informer.resumed = resumed;
    let reached = informer.run(start).await;
    // A stream that stops holds no outage open.
    informer.outage.forget(&informer.id.name);
    reached
}

/// Where a stream stands between its lists and watches.
struct Cursor {
    backoff: Backoff,
    /// The resourceVersion to watch from; `None` to list.
    rv: Option<String>,
    /// The newest resourceVersion the ingest holds for this stream: no list older
    /// than it is applied.
    held: Option<String>,
    /// The cause last logged for this stream's own (not the cluster's) failures.
    last_logged: Option<String>,
    /// Why the next list is made.
    reason: ListReason,
    last_state: Option<StreamState>,
    /// Whether lists are asked for as streaming lists.
    watch_list: bool,
    /// Why the stream lists although it asked for streaming lists.
    fallback: Option<String>,
    /// Whether the stream's next watch is its first, resumed from the store.
    restored: bool,
}

impl Cursor {
    /// A watch begun at `started` ended having seen `seen`; one that stayed healthy
    /// for a while earns a fresh backoff.
    fn watched(&mut self, seen: String, started: Instant) {
        self.held = Some(seen.clone());
        self.rv = Some(seen);
        if started.elapsed() > Duration::from_secs(60) {
            self.backoff.reset();
        }
    }
}

/// What comes after a list.
enum Next {
    /// The list or its watch stopped so.
    Stop(Stop),
    /// Go round again (watch from the list, or list another way).
    Again,
    /// The ingest is gone: nothing is resumed.
    Gone,
    /// The stream ends where it stands.
    Ended,
}

impl Informer {
    pub(crate) fn new(
        client: Client,
        id: Arc<StreamId>,
        outage: Arc<crate::outage::Outage>,
        config: StreamConfig,
        tx: mpsc::Sender<Update>,
        cancel: CancellationToken,
    ) -> Self {
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
        Informer {
            client,
            id,
            outage,
            config,
            tx,
            cancel,
            path,
            rewatch: None,
            resumed: None,
        }
    }

    pub(crate) async fn send(&self, update: Update) -> bool {
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

    async fn run(&self, start: Start) -> Option<String> {
        let mut c = Cursor {
            backoff: Backoff::new(self.config.backoff_start, self.config.backoff_cap),
            held: start.watch_from.clone().or(start.floor),
            restored: start.watch_from.is_some(),
            rv: start.watch_from,
            last_logged: None,
            reason: ListReason::Initial,
            last_state: None,
            watch_list: self.config.watch_list,
            fallback: None,
        };
        loop {
            if self.cancel.is_cancelled() {
                return c.rv;
            }
            let stop = match c.rv.clone() {
                None => match self.list_into(&mut c).await {
                    Next::Stop(stop) => stop,
                    Next::Again => continue,
                    Next::Gone => return None,
                    Next::Ended => return c.rv,
                },
                Some(from) => {
                    if c.last_state != Some(StreamState::Watching) {
                        if !self.state(StreamState::Watching, None).await {
                            return c.rv;
                        }
                        c.last_state = Some(StreamState::Watching);
                    }
                    let started = Instant::now();
                    // The first watch of a stream resumed from the store.
                    let quiet =
                        std::mem::take(&mut c.restored).then_some(self.config.resumed_quiet);
                    let (stop, seen) = self.watch(&from, quiet).await;
                    c.watched(seen, started);
                    stop
                }
            };
            if !self.after(&mut c, stop).await {
                return c.rv;
            }
        }
    }

    /// Lists the stream's state (streaming, or a LIST) and hands it to the ingest; a
    /// streaming list's watch then goes on. What to do next.
    async fn list_into(&self, c: &mut Cursor) -> Next {
        if !self.state(StreamState::Listing, None).await {
            return Next::Gone;
        }
        c.last_state = Some(StreamState::Listing);
        let from = ListFrom::choose(c.held.as_deref(), c.reason);
        let span = tracing::info_span!(
            "list",
            cluster = %self.id.cluster,
            resource = %self.id.name,
            reason = ?c.reason,
            from = ?from,
            streaming = c.watch_list,
            objects = tracing::field::Empty,
        );
        // A first list goes to the index in parts as it arrives; any other (a re-list
        // after a 410 included) is applied whole, diffed against what is held. The
        // ingest checks again that nothing is held.
        let first = c.reason == ListReason::Initial && c.held.is_none();
        let parts = (first && self.config.list_part > 0).then(next_list_number);
        let listed = if c.watch_list {
            self.watch_list(&from, parts).instrument(span.clone()).await
        } else {
            self.list(&from, parts).instrument(span.clone()).await
        };
        if let Ok(l) = &listed {
            span.record("objects", i64::try_from(l.count).unwrap_or(i64::MAX));
        }
        drop(span);
        let listed = match listed {
            Ok(listed) if goes_back(&listed.resource_version, c.held.as_deref()) => {
                // Several API servers behind one address can answer from caches at
                // different points; an older one is not applied.
                tracing::warn!(
                    cluster = %self.id.cluster,
                    resource = %self.id.name,
                    listed = %listed.resource_version,
                    held = c.held.as_deref().unwrap_or_default(),
                    "the list is older than what is held: not applied, listing again"
                );
                return Next::Stop(Stop::Failed(format!(
                    "the API server answered a list at resourceVersion {}, older than the {} held",
                    listed.resource_version,
                    c.held.as_deref().unwrap_or_default()
                )));
            }
            Ok(listed) => listed,
            Err(ListStop::Unsupported(why)) => {
                tracing::info!(cluster = %self.id.cluster, resource = %self.id.name, why = %why, "streaming lists are not served: listing instead");
                c.watch_list = false;
                c.fallback = Some(why);
                return Next::Again;
            }
            Err(ListStop::Stop(stop)) => return Next::Stop(stop),
        };
        self.outage.recovered(&self.id.name);
        let list_rv = listed.resource_version;
        let update = Update::Listed {
            stream: self.id.clone(),
            objects: listed.objects,
            parts: listed.parts,
            resource_version: list_rv.clone(),
            reason: c.reason,
            method: Some(listed.method),
            fallback: c.fallback.clone(),
        };
        if !self.send(update).await {
            return Next::Gone;
        }
        c.held = Some(list_rv.clone());
        c.rv = Some(list_rv.clone());
        // A streaming list's watch goes on from its state.
        let Some(lines) = listed.watch else {
            return Next::Again;
        };
        if !self.state(StreamState::Watching, None).await {
            return Next::Ended;
        }
        c.last_state = Some(StreamState::Watching);
        let started = Instant::now();
        let (stop, seen) = self.follow(lines, list_rv, None).await;
        c.watched(seen, started);
        Next::Stop(stop)
    }

    /// What a stop means: list again, reconnect, or wait (reporting the state, and
    /// logging a failure once per outage or change of cause). False once the stream
    /// is to end.
    async fn after(&self, c: &mut Cursor, stop: Stop) -> bool {
        let (state, error, wait) = match stop {
            Stop::Cancelled => return false,
            Stop::Reconnect => return true,
            Stop::Confirm => {
                // Listed again, diffed against what is held, never older than it.
                c.rv = None;
                c.reason = ListReason::Confirm;
                return true;
            }
            Stop::Expired => {
                tracing::info!(cluster = %self.id.cluster, resource = %self.id.resource.name(), "resourceVersion expired: re-listing");
                c.rv = None;
                // The history the held version belongs to is gone (compacted, or
                // reset by a restore): the consistent list replaces it.
                c.held = None;
                c.reason = ListReason::Expired;
                return true;
            }
            Stop::Forbidden(m) => (StreamState::Forbidden, m, self.config.forbidden_retry),
            Stop::NotFound(m) => (StreamState::NotFound, m, self.config.forbidden_retry),
            Stop::Failed(m) | Stop::Invalid(m) => (StreamState::Failed, m, c.backoff.next_delay()),
            Stop::Throttled(m, after) => {
                (StreamState::Failed, m, c.backoff.next_delay().max(after))
            }
        };
        match state {
            // The cluster failing: once per outage, for all its streams.
            StreamState::Failed => {
                self.outage.failed(&self.id.name, &error);
            }
            // This type refused or gone: once per change of cause.
            _ if c.last_logged.as_deref() != Some(error.as_str()) => {
                tracing::warn!(cluster = %self.id.cluster, resource = %self.id.resource.name(), error = %error, retry_in = ?wait, "stream failed");
            }
            _ => {}
        }
        c.last_logged = Some(error.clone());
        c.last_state = Some(state);
        self.state(state, Some(error)).await && self.sleep(wait).await
    }

    fn list_params(&self, from: &ListFrom) -> ListParams {
        let mut lp = ListParams::default();
        match from {
            // From the watch cache: unpaged (the cache ignores limit, and a limit
            // with a resourceVersion would send the read to storage).
            ListFrom::Cache => lp = lp.match_any(),
            ListFrom::NotOlderThan(rv) => {
                lp.resource_version = Some(rv.clone());
                lp.version_match = Some(kube::api::VersionMatch::NotOlderThan);
            }
            ListFrom::Consistent => lp = lp.limit(self.config.page_size),
            ListFrom::Exact(rv) => {
                lp = lp.limit(self.config.page_size);
                lp.resource_version = Some(rv.clone());
                lp.version_match = Some(kube::api::VersionMatch::Exact);
            }
        }
        if let Some(l) = &self.config.label_selector {
            lp = lp.labels(l);
        }
        if let Some(f) = &self.config.field_selector {
            lp = lp.fields(f);
        }
        lp
    }

    /// The member's newest resourceVersion of this stream's collection now: a
    /// consistent list of one object (read from etcd), its objects passed over.
    pub(crate) async fn newest(&self) -> Result<String, Stop> {
        let lp = self.list_params(&ListFrom::Consistent).limit(1);
        let req = Request::new(&self.path)
            .list(&lp)
            .map_err(|e| Stop::Failed(e.to_string()))?;
        let mut reader =
            crate::prune::list::ListReader::new(&self.id.resource, &self.config.pruning);
        let mut none = |_: Result<PrunedObject, crate::prune::PruneError>| {};
        tokio::select! {
            r = fetch_list(&self.client, req, &mut reader, &mut none) => r.map_err(classify)?,
            _ = self.cancel.cancelled() => return Err(Stop::Cancelled),
        }
        let meta = reader
            .finish(&mut none)
            .map_err(|e| Stop::Failed(format!("the list response is not a list: {e}")))?;
        if !is_resource_version(&meta.resource_version) {
            return Err(Stop::Failed(format!(
                "the list's resourceVersion {:?} is not a number",
                meta.resource_version
            )));
        }
        Ok(meta.resource_version)
    }

    /// Lists every page, pruning each item as its bytes arrive. An expired continue
    /// token restarts the list, so the result is always one consistent snapshot. A
    /// list numbered `parts` (a first one) is handed over in parts of `list_part`
    /// objects as it arrives, as a streaming list is; one restarted after parts went
    /// takes a number of its own, so it is not taken for the rest of the first.
    pub(crate) async fn list(
        &self,
        from: &ListFrom,
        mut parts: Option<u64>,
    ) -> Result<Listed, ListStop> {
        let mut objects = Vec::new();
        let mut drops = Drops::default();
        // Objects sent ahead in parts.
        let mut sent = 0;
        let mut lp = self.list_params(from);
        loop {
            let req = Request::new(&self.path)
                .list(&lp)
                .map_err(|e| Stop::Failed(e.to_string()))?;
            let mut reader =
                crate::prune::list::ListReader::new(&self.id.resource, &self.config.pruning);
            let fetched = self
                .fetch_page(req, &mut reader, &mut objects, &mut drops, parts, &mut sent)
                .await;
            match fetched {
                Err(ListStop::Stop(Stop::Expired))
                    if lp.continue_token.is_some() && !matches!(from, ListFrom::Exact(_)) =>
                {
                    objects.clear();
                    if sent > 0 {
                        parts = parts.map(|_| next_list_number());
                        sent = 0;
                    }
                    lp = self.list_params(from);
                    continue;
                }
                other => other?,
            }
            let meta = reader
                .finish(&mut |item| objects.extend(self.kept(item, &mut drops)))
                .map_err(|e| Stop::Failed(format!("the list response is not a list: {e}")))?;
            // Room for the rest at once, rather than growing by doubling (the list is
            // held whole until it is applied, unless it goes in parts; a bound, as the
            // count comes from outside).
            let remaining = meta.remaining_item_count.unwrap_or(0).min(1 << 20);
            let room = if parts.is_some() {
                remaining.min(self.config.list_part as u64)
            } else {
                remaining
            };
            objects.reserve(usize::try_from(room).unwrap_or(0));
            match meta.continue_token.filter(|c| !c.is_empty()) {
                // Later pages come from storage at the first page's resourceVersion.
                Some(c) => lp = lp.continue_token(&c),
                None => {
                    // None at all is taken as before (nothing to resume from); one that
                    // is not a number is no API server's.
                    if !meta.resource_version.is_empty()
                        && !is_resource_version(&meta.resource_version)
                    {
                        return Err(Stop::Failed(format!(
                            "the list's resourceVersion {:?} is not a number",
                            meta.resource_version
                        ))
                        .into());
                    }
                    if !self.report(&mut drops).await {
                        return Err(Stop::Cancelled.into());
                    }
                    return Ok(Listed {
                        count: sent + objects.len(),
                        objects,
                        parts: parts.filter(|_| sent > 0),
                        resource_version: meta.resource_version,
                        method: from.method(),
                        watch: None,
                    });
                }
            }
        }
    }

    /// Reads one page of a list into `objects` frame by frame, sending them ahead as
    /// a part of list `parts` whenever `list_part` of them are in.
    async fn fetch_page(
        &self,
        req: http::Request<Vec<u8>>,
        reader: &mut crate::prune::list::ListReader<'_>,
        objects: &mut Vec<PrunedObject>,
        drops: &mut Drops,
        parts: Option<u64>,
        sent: &mut usize,
    ) -> Result<(), ListStop> {
        let mut body = tokio::select! {
            r = ListBody::open(&self.client, req) => r.map_err(classify)?,
            _ = self.cancel.cancelled() => return Err(Stop::Cancelled.into()),
        };
        loop {
            let mut each = |item| objects.extend(self.kept(item, drops));
            let more = tokio::select! {
                r = body.feed(reader, &mut each) => r.map_err(classify)?,
                _ = self.cancel.cancelled() => return Err(Stop::Cancelled.into()),
            };
            if let Some(list) = parts
                && objects.len() >= self.config.list_part
            {
                *sent += self.send_part(list, objects).await?;
            }
            if !more {
                return Ok(());
            }
        }
    }

    fn watch_params(&self) -> WatchParams {
        let mut wp = WatchParams::default()
            .timeout(self.config.watch_timeout.as_secs().clamp(1, 294) as u32);
        wp.bookmarks = true;
        wp.label_selector = self.config.label_selector.clone();
        wp.field_selector = self.config.field_selector.clone();
        wp
    }

    /// Opens a watch; its lines, or why it was not opened.
    async fn open(&self, req: http::Request<Vec<u8>>) -> Result<WatchLines, Stop> {
        let silence = self.config.watch_timeout + self.config.idle_margin;
        let opened = tokio::select! {
            r = tokio::time::timeout(silence, self.client.request_stream(req)) => r,
            _ = self.cancel.cancelled() => return Err(Stop::Cancelled),
        };
        match opened {
            Err(_) => Err(Stop::Failed(format!(
                "the watch was not answered within {silence:?}"
            ))),
            Ok(Err(e)) => Err(classify(e)),
            Ok(Ok(body)) => Ok(WatchLines::new(body, self.config.max_object_bytes)),
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod sim_tests;

#[cfg(test)]
mod tests;
