//! The Fleet seam: what every front end (the gRPC service, the CLI, authorization,
//! a router over upstream instances) asks of a fleet, in domain types, and the one
//! error type its answers carry. The engine implements [`Fleet`]; the gRPC service is
//! generic over it and only converts, adds bookmarks and maps errors.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt as _};

use crate::{
    Access, ClusterFilter, ClusterName, EventType, FieldSelector, LabelSelector, ObjectKey,
    ResourceType, Revision,
};

/// Why a fleet could not answer. Each variant says what a caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    /// Not yet: starting, loading the store, discovering clusters. Retry shortly.
    #[error("{0}")]
    Unavailable(String),
    /// The request is wrong; the message names the field and, for selectors, the position.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such cluster, resource type or object.
    #[error("{0}")]
    NotFound(String),
    /// A revision or page token outside what is held: list again.
    #[error("{message}")]
    OutOfRange {
        /// What happened and what to do, for a person.
        message: String,
        /// Which case, for a program: one of [`reason`]'s `REVISION_*`/`PAGE_*` codes.
        reason: &'static str,
        /// The oldest revision a Watch can resume from now, when known.
        oldest: Option<Revision>,
    },
    /// A Watch fell too far behind and was ended (it may resume from `resume_from`),
    /// or a request asked for more than the server gives one request.
    #[error("{message}")]
    ResourceExhausted {
        /// What happened and what to do, for a person.
        message: String,
        /// Which case, for a program: one of [`reason`]'s `WATCH_*` codes.
        reason: &'static str,
        /// The revision a Watch resumes from without losing an event: the last one it
        /// delivered.
        resume_from: Option<Revision>,
    },
    /// The request's evaluation took longer than allowed; narrow it, or retry.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The caller is no longer granted what a running request needs (a Watch whose
    /// every grant a new policy took away).
    #[error("{0}")]
    PermissionDenied(String),
}

/// The machine-readable reasons of [`FleetError`]s (gRPC `google.rpc.ErrorInfo.reason`,
/// domain [`reason::DOMAIN`]).
pub mod reason {
    /// The domain every reason belongs to.
    pub const DOMAIN: &str = "fleetscope.io";
    /// A revision older than the event log holds (metadata: `oldest_revision`).
    pub const REVISION_COMPACTED: &str = "REVISION_COMPACTED";
    /// A revision newer than any applied.
    pub const REVISION_IN_FUTURE: &str = "REVISION_IN_FUTURE";
    /// A page token whose snapshot is no longer held.
    pub const PAGE_SNAPSHOT_RELEASED: &str = "PAGE_SNAPSHOT_RELEASED";
    /// A Watch fell further behind than its buffer (metadata: `resume_from`).
    pub const WATCH_BEHIND: &str = "WATCH_BEHIND";
    /// A Watch left its events unread too long (metadata: `resume_from`).
    pub const WATCH_STALLED: &str = "WATCH_STALLED";
}

/// How objects are returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Projection {
    /// The whole pruned object.
    #[default]
    Full,
    /// `apiVersion`, `kind` and `metadata` only.
    Metadata,
}

/// Which objects of one resource type a request reads.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// The resource type, kubectl-style (`pods`, `deployments.apps`, `apps/v1/Deployment`).
    pub resource: String,
    /// Which clusters, evaluated against the live fleet.
    pub clusters: ClusterFilter,
    /// Namespaces; empty for all (and cluster-scoped objects).
    pub namespaces: Vec<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

/// One object as a fleet returns it: JSON text with its identity beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetObject {
    /// Cluster, resource type, namespace, name.
    pub key: ObjectKey,
    /// The revision of the change that produced this state.
    pub revision: Revision,
    /// metadata.uid.
    pub uid: String,
    /// metadata.resourceVersion in its cluster.
    pub resource_version: String,
    /// The object (or its metadata, by projection) as JSON, shared with the index
    /// when it is the whole object as held.
    pub json: crate::Json,
}

/// How current fleetscope's copy of a cluster (or of one of its streams) is. Ordered
/// from best to worst, so the worst of several is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Freshness {
    /// Listed and watching.
    Synced,
    /// Loaded from the store at start; its watch has not yet caught up (for a whole
    /// cluster: or its watches have, and its discovery has not yet answered).
    Restored,
    /// Still in its initial list.
    Syncing,
    /// Could not be reached since `stale_since`; objects are as they were then.
    Stale,
    /// Refused or misconfigured; retrying has not cured it.
    Error,
}

/// How current a cluster's copy is, for one resource type or the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFreshness {
    /// The cluster.
    pub cluster: ClusterName,
    /// How current.
    pub freshness: Freshness,
    /// When it stopped being current.
    pub stale_since: Option<SystemTime>,
    /// Why, for a person; empty when synced.
    pub message: String,
}

/// Get one object.
#[derive(Debug, Clone)]
pub struct GetRequest {
    /// The resource type, kubectl-style.
    pub resource: String,
    /// The cluster.
    pub cluster: String,
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// How to return it.
    pub projection: Projection,
    /// Who asks, and the policy they are held to.
    pub access: Access,
}

impl GetRequest {
    /// A request of the caller `access`, every other field empty.
    pub fn for_caller(access: Access) -> Self {
        Self {
            resource: String::new(),
            cluster: String::new(),
            namespace: String::new(),
            name: String::new(),
            projection: Projection::default(),
            access,
        }
    }
}

/// One object, and how current its cluster is.
#[derive(Debug, Clone)]
pub struct GetAnswer {
    /// The object.
    pub object: FleetObject,
    /// Its cluster's freshness for the type.
    pub cluster: ClusterFreshness,
    /// The revision of the snapshot read.
    pub revision: Revision,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListRequest {
    /// What to list.
    pub query: Query,
    /// How to return objects.
    pub projection: Projection,
    /// The most objects in the page (at least 1).
    pub limit: usize,
    /// The most bytes of objects in the page (by [`FleetObject`] size: JSON and key);
    /// a page holds at least one object however large, so paging always moves on.
    pub max_bytes: usize,
    /// Continue a list: the snapshot's revision and the last key returned.
    pub after: Option<(Revision, ObjectKey)>,
    /// Continue a list: what its previous page's [`ListAnswer::resume`] said,
    /// unchanged; empty for a first page.
    pub resume: Vec<u8>,
    /// Keep the snapshot for a continuation even when this page is the last (a
    /// router continues each fleet it merges from where the merged page ended).
    pub keep_snapshot: bool,
    /// Who asks, and the policy they are held to.
    pub access: Access,
}

/// An engine's [`ListAnswer::resume`]: how many matching objects follow its page, so
/// that its next page is cut without counting them again.
pub fn remaining_resume(remaining: u64) -> Vec<u8> {
    remaining.to_le_bytes().to_vec()
}

/// The count a [`remaining_resume`] carries, if `resume` is one.
pub fn resumed_remaining(resume: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(resume).ok().map(u64::from_le_bytes)
}

impl ListRequest {
    /// A request of the caller `access`, every other field empty.
    pub fn for_caller(access: Access) -> Self {
        Self {
            query: Query::default(),
            projection: Projection::default(),
            limit: 0,
            max_bytes: 0,
            after: None,
            resume: Vec::new(),
            keep_snapshot: false,
            access,
        }
    }
}

/// A page of objects from one snapshot.
#[derive(Debug, Clone)]
pub struct ListAnswer {
    /// The objects, in key order.
    pub items: Vec<FleetObject>,
    /// The last key, when more follow: with `revision`, where the next page continues.
    pub next: Option<ObjectKey>,
    /// The snapshot's revision.
    pub revision: Revision,
    /// How many matching objects follow this page.
    pub remaining: u64,
    /// The freshness of every cluster drawn on.
    pub clusters: Vec<ClusterFreshness>,
    /// Whether some cluster drawn on is not synced.
    pub partial: bool,
    /// What the fleet needs besides `revision` and `next` to continue, carried
    /// (signed) in the page token: where a fleet made of other fleets (a router)
    /// continues each; how many objects an engine's page said follow it, so the next
    /// page need not count them again.
    pub resume: Vec<u8>,
    /// What the caller may want to know of the query (see [`ClusterFilter::unmatched`]).
    pub warnings: Vec<String>,
}

/// How to group a count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    /// By cluster.
    Cluster,
    /// By namespace.
    Namespace,
    /// By the value of a label (empty when absent).
    Label(String),
    /// By the value of a field path (empty when absent).
    Field(String),
}

impl GroupBy {
    /// Parses `cluster`, `namespace`, `label:KEY` or `field:PATH`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cluster" => Some(GroupBy::Cluster),
            "namespace" => Some(GroupBy::Namespace),
            _ => match s.split_once(':') {
                Some(("label", k)) if !k.is_empty() => Some(GroupBy::Label(k.to_string())),
                Some(("field", p)) if !p.is_empty() => Some(GroupBy::Field(p.to_string())),
                _ => None,
            },
        }
    }
}

/// Count objects, grouped.
#[derive(Debug, Clone)]
pub struct CountRequest {
    /// What to count.
    pub query: Query,
    /// How to group (nested, in order); empty for a total only.
    pub group_by: Vec<GroupBy>,
    /// Who asks, and the policy they are held to.
    pub access: Access,
}

impl CountRequest {
    /// A request of the caller `access`, every other field empty.
    pub fn for_caller(access: Access) -> Self {
        Self {
            query: Query::default(),
            group_by: Vec::new(),
            access,
        }
    }
}

/// Counts from one snapshot.
#[derive(Debug, Clone)]
pub struct CountAnswer {
    /// Group key (one value per GroupBy) → count, ordered by key.
    pub groups: BTreeMap<Vec<String>, u64>,
    /// How many objects match in all.
    pub total: u64,
    /// The snapshot's revision.
    pub revision: Revision,
    /// The freshness of every cluster drawn on.
    pub clusters: Vec<ClusterFreshness>,
    /// Whether some cluster drawn on is not synced.
    pub partial: bool,
    /// What the caller may want to know of the query (see [`ClusterFilter::unmatched`]).
    pub warnings: Vec<String>,
}

/// Stream changes.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// Which objects.
    pub query: Query,
    /// How to return objects.
    pub projection: Projection,
    /// Deliver every change after this revision (from the event log), then live.
    pub since: Option<Revision>,
    /// First the matching objects as `Added`, then [`WatchEvent::InitialEventsEnd`].
    pub initial: bool,
    /// Who asks, and the policy they are held to.
    pub access: Access,
    /// Continue from member positions instead: for each cluster, the member
    /// resourceVersion of the watched type the subscriber stands at (empty: not
    /// known). Each continues exactly where that is possible, and is otherwise
    /// reset ([`WatchEvent::Reset`]); a cluster the filter selects that is not listed
    /// is reset too. `since` and `initial` do not apply.
    pub positions: Option<Vec<(ClusterName, Arc<str>)>>,
    /// Report member positions: each object event carries its stream's, and a
    /// [`WatchEvent::Positions`] gives every watched stream's once the stream stands
    /// somewhere (after the initial objects, or at once).
    pub report_positions: bool,
    /// Through a router: resume from a position token and the positions reached
    /// after it.
    pub resume: Option<Resume>,
}

/// Where a Watch through a router resumes.
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// The position token of the last bookmark received.
    pub token: String,
    /// The member position of each cluster's last event received after that
    /// bookmark.
    pub after: Vec<(ClusterName, Arc<str>)>,
}

impl WatchRequest {
    /// A request of the caller `access`, every other field empty.
    pub fn for_caller(access: Access) -> Self {
        Self {
            query: Query::default(),
            projection: Projection::default(),
            since: None,
            initial: false,
            access,
            positions: None,
            report_positions: false,
            resume: None,
        }
    }
}

/// What a Watch delivers.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// A change, as the subscriber's filter sees it (an object leaving the filter is
    /// `Deleted`, one entering it `Added`).
    Object {
        /// What happened.
        kind: EventType,
        /// The object (its last state for `Deleted`).
        object: FleetObject,
        /// The change's revision.
        revision: Revision,
        /// The member resourceVersion the object's stream reached with the change,
        /// when positions are reported and the change is one (not a re-list's but
        /// its last, nor an initial object).
        position: Option<Arc<str>>,
    },
    /// The initial objects have all been sent.
    InitialEventsEnd {
        /// The snapshot's revision.
        revision: Revision,
        /// Through a router: where the subscriber stands, as a token to resume from
        /// (as a [`WatchEvent::Bookmark`] carries it); empty from a single server.
        token: String,
    },
    /// Where each watched stream stands (member resourceVersions by cluster; empty
    /// when not known), reported once the Watch stands somewhere.
    Positions {
        /// By cluster.
        positions: Vec<(ClusterName, Arc<str>)>,
        /// The revision the subscriber has reached.
        revision: Revision,
    },
    /// A cluster's stream could not continue from the subscriber's position: forget
    /// what it holds of it; its current objects follow as `Added`, then
    /// [`WatchEvent::ResetEnd`].
    Reset {
        /// The cluster.
        cluster: ClusterName,
    },
    /// A reset cluster's current objects have all been sent.
    ResetEnd {
        /// The cluster.
        cluster: ClusterName,
        /// Its stream's member position now (empty when not known).
        position: Arc<str>,
        /// The revision the subscriber has reached.
        revision: Revision,
    },
    /// Through a router: where the subscriber stands, as a token to resume from.
    Bookmark {
        /// The signed position.
        token: String,
    },
    /// A cluster drawn on changed freshness (or joined or left the fleet).
    ClusterStatus {
        /// Its new freshness.
        cluster: ClusterFreshness,
        /// The revision the subscriber has reached.
        revision: Revision,
    },
}

/// A running Watch: a stream of events, and how far its producer has read (for
/// bookmarks), never ahead of what the stream has yielded.
pub struct Watch {
    events: Pin<Box<dyn Stream<Item = Result<WatchEvent, FleetError>> + Send>>,
    /// The producer's position; 0 until it has one (while initial objects are sent).
    /// The producer stores it after handing over every event up to it.
    reached: Arc<AtomicU64>,
    /// An event taken while checking for a bookmark, yielded next.
    stashed: Option<Result<WatchEvent, FleetError>>,
}

impl Watch {
    /// A watch over `events`, whose producer stores its position in `reached` after
    /// handing over every event up to it.
    pub fn new(
        events: impl Stream<Item = Result<WatchEvent, FleetError>> + Send + 'static,
        reached: Arc<AtomicU64>,
    ) -> Self {
        Self {
            events: Box::pin(events),
            reached,
            stashed: None,
        }
    }

    /// The revision a bookmark may carry now: every change up to it has been yielded
    /// (or did not match). `None` when an event is still to be yielded first (the
    /// next `poll_next` returns it) or the watch has no position yet.
    pub fn bookmark(&mut self, cx: &mut Context<'_>) -> Option<Revision> {
        if self.stashed.is_some() {
            return None;
        }
        // Read before looking at the stream: everything up to this position was handed
        // over before it was stored, so an empty stream now means all of it was yielded.
        let reached = self.reached.load(Ordering::Acquire);
        match self.events.as_mut().poll_next(cx) {
            Poll::Ready(Some(item)) => {
                self.stashed = Some(item);
                None
            }
            Poll::Ready(None) | Poll::Pending => (reached > 0).then_some(Revision(reached)),
        }
    }
}

impl Watch {
    /// This watch, ended with `gate`'s error as soon as the gate closes: checked
    /// before every event it yields, and woken when the gate may close.
    pub fn gated(self, gate: Arc<dyn Gate>) -> Self {
        let Watch {
            events,
            reached,
            stashed,
        } = self;
        let closing = gate.closing();
        let events = GatedEvents {
            events: Box::pin(futures::stream::iter(stashed).chain(events)),
            gate,
            closing,
            done: false,
        };
        Self {
            events: Box::pin(events),
            reached,
            stashed: None,
        }
    }
}

/// A watch's events, ended by a [`Gate`] closing.
struct GatedEvents {
    events: Pin<Box<dyn Stream<Item = Result<WatchEvent, FleetError>> + Send>>,
    gate: Arc<dyn Gate>,
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
}

impl Stream for GatedEvents {
    type Item = Result<WatchEvent, FleetError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        // Re-armed until it waits, so that this task is woken when the gate may close.
        while self.closing.as_mut().poll(cx).is_ready() {
            self.closing = self.gate.closing();
            if let Err(e) = self.gate.check() {
                self.done = true;
                return Poll::Ready(Some(Err(e)));
            }
        }
        if let Err(e) = self.gate.check() {
            self.done = true;
            return Poll::Ready(Some(Err(e)));
        }
        self.events.as_mut().poll_next(cx)
    }
}

/// What may stop a fleet answering for a while (a replica that could not renew its
/// Lease must not answer as an owner it may no longer be).
pub trait Gate: Send + Sync + 'static {
    /// `Ok` while the fleet may answer; else why not (a retryable error).
    fn check(&self) -> Result<(), FleetError>;
    /// Resolves when [`Gate::check`] may have turned to an error since it was called.
    fn closing(&self) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A fleet that answers only while its gate (if any) is open: every query and Watch
/// is refused with the gate's error while it is closed, and a running Watch ends with
/// it when it closes. What a fleet reports about itself (clusters, types, store) is
/// answered whatever the gate says.
pub struct Gated<F> {
    inner: Arc<F>,
    gate: Option<Arc<dyn Gate>>,
}

impl<F: Fleet> Gated<F> {
    /// `inner`, behind `gate` (always open when `None`).
    pub fn new(inner: Arc<F>, gate: Option<Arc<dyn Gate>>) -> Self {
        Self { inner, gate }
    }

    fn check(&self) -> Result<(), FleetError> {
        self.gate.as_ref().map_or(Ok(()), |g| g.check())
    }
}

impl<F: Fleet> Fleet for Gated<F> {
    async fn get(&self, request: GetRequest) -> Result<GetAnswer, FleetError> {
        self.check()?;
        let answer = self.inner.get(request).await?;
        // Read while open, answered only if still open.
        self.check()?;
        Ok(answer)
    }
    async fn list(&self, request: ListRequest) -> Result<ListAnswer, FleetError> {
        self.check()?;
        let answer = self.inner.list(request).await?;
        self.check()?;
        Ok(answer)
    }
    async fn count(&self, request: CountRequest) -> Result<CountAnswer, FleetError> {
        self.check()?;
        let answer = self.inner.count(request).await?;
        self.check()?;
        Ok(answer)
    }
    async fn watch(&self, request: WatchRequest) -> Result<Watch, FleetError> {
        self.check()?;
        let watch = self.inner.watch(request).await?;
        Ok(match &self.gate {
            Some(gate) => watch.gated(gate.clone()),
            None => watch,
        })
    }
    async fn clusters(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> Result<ClustersAnswer, FleetError> {
        let mut answer = self
            .inner
            .clusters(filter, access)
            .await
            .map_err(|e| self.why_unavailable(e))?;
        // Behind a closed gate nothing is served: each cluster says so, and why,
        // rather than reading as current.
        if let Err(closed) = self.check() {
            let why = closed.to_string();
            for c in &mut answer.clusters {
                if matches!(
                    c.freshness.freshness,
                    Freshness::Synced | Freshness::Restored | Freshness::Syncing
                ) {
                    c.freshness.freshness = Freshness::Stale;
                    c.freshness.stale_since.get_or_insert_with(SystemTime::now);
                }
                c.freshness.message = why.clone();
                c.last_error = why.clone();
            }
        }
        Ok(answer)
    }
    async fn resource_types(&self, access: &Access) -> Result<Vec<ResourceTypeInfo>, FleetError> {
        let answer = self.inner.resource_types(access).await;
        answer.map_err(|e| self.why_unavailable(e))
    }
    async fn store(&self, access: &Access) -> Result<Store, FleetError> {
        let answer = self.inner.store(access).await;
        answer.map_err(|e| self.why_unavailable(e))
    }
}

impl<F: Fleet> Gated<F> {
    /// An inner fleet not there yet behind a closed gate is unavailable for the gate's
    /// reason (a replica not yet in its ring is not "loading its store").
    fn why_unavailable(&self, e: FleetError) -> FleetError {
        match (e, self.check()) {
            (FleetError::Unavailable(_), Err(closed)) => closed,
            (e, _) => e,
        }
    }
}

impl Stream for Watch {
    type Item = Result<WatchEvent, FleetError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(item) = self.stashed.take() {
            return Poll::Ready(Some(item));
        }
        self.events.as_mut().poll_next(cx)
    }
}

/// What a stream is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    /// Waiting to start, or backing off.
    Pending,
    /// Listing.
    Listing,
    /// Listed and watching.
    Watching,
    /// Failed; retrying with backoff.
    Failed,
    /// 401 or 403; retrying slowly.
    Forbidden,
    /// The cluster does not serve the type (404).
    NotFound,
}

/// How a stream last came to hold its cluster's full state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMethod {
    /// A streaming list (WatchList): the state as watch events, on the watch that
    /// then goes on.
    WatchList,
    /// A LIST served from the API server's watch cache (`resourceVersion=0`, or not
    /// older than the resourceVersion held).
    ListFromCache,
    /// A consistent LIST from storage, in pages (after a 410, or when nothing better
    /// is correct).
    ListConsistent,
    /// No list: the watch resumed from the stored resourceVersion.
    Resumed,
}

impl SyncMethod {
    /// The method as a label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMethod::WatchList => "watch-list",
            SyncMethod::ListFromCache => "list-from-cache",
            SyncMethod::ListConsistent => "list-consistent",
            SyncMethod::Resumed => "resumed",
        }
    }
}

/// One (cluster, resource type) stream.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    /// The resource type's canonical name (or, for a configured name the cluster
    /// does not serve, that name).
    pub resource: String,
    /// What it is doing.
    pub state: StreamState,
    /// Objects held.
    pub object_count: u64,
    /// The last resourceVersion seen.
    pub resource_version: String,
    /// When the last event arrived.
    pub last_event: Option<SystemTime>,
    /// The last error, for a person; empty if none.
    pub last_error: String,
    /// How far behind its cluster it may be (see the proto's `sync_lag`).
    pub sync_lag: Option<Duration>,
    /// How it last came to hold the cluster's state; `None` before it has.
    pub sync_method: Option<SyncMethod>,
    /// Why it listed although it asked for a streaming list, when it did; empty
    /// otherwise.
    pub watch_list_fallback: String,
}

/// One cluster's status.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    /// Its name.
    pub name: ClusterName,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its API server.
    pub server: String,
    /// How current the whole cluster is.
    pub freshness: ClusterFreshness,
    /// The last error talking to it, or why it is not synced.
    pub last_error: String,
    /// Its Kubernetes version.
    pub kubernetes_version: String,
    /// Its streams.
    pub streams: Vec<StreamInfo>,
    /// Where its settings come from.
    pub source: String,
    /// When its settings were last (re)loaded.
    pub source_loaded: SystemTime,
    /// The replicas serving it, when answered by a router over a ring (the assigned
    /// owner first); empty from a single server.
    pub owners: Vec<String>,
}

/// Every cluster's status, and how the cluster sources last loaded.
#[derive(Debug, Clone, Default)]
pub struct ClustersAnswer {
    /// The clusters, by name.
    pub clusters: Vec<ClusterInfo>,
    /// When the sources in force were loaded.
    pub sources_loaded: Option<SystemTime>,
    /// Why the last reload failed, and when (the sources before stay in force).
    pub sources_error: Option<(String, SystemTime)>,
    /// Why the store's writes fail, and since when (nothing newer is visible).
    pub store_error: Option<(String, SystemTime)>,
}

/// One collected resource type, with its object counts per cluster.
#[derive(Debug, Clone)]
pub struct ResourceTypeInfo {
    /// The type.
    pub resource: ResourceType,
    /// Its short names (`deploy`), as the clusters' discovery gives them.
    pub short_names: Vec<String>,
    /// Objects held per cluster.
    pub clusters: Vec<(ClusterName, u64)>,
}

/// What a fleet keeps on disk.
#[derive(Debug, Clone)]
pub enum Store {
    /// Its store, with its figures.
    Persisted(Box<StoreStats>),
    /// Nothing: it runs in memory only.
    InMemory,
    /// Nothing of its own: it is a router of the ring named, whose replicas each keep
    /// their own store.
    Router {
        /// The ring.
        ring: String,
    },
}

/// Figures about the store, for operators.
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    /// Batches written.
    pub flushes: u64,
    /// How long the last write took.
    pub last_flush: Duration,
    /// The longest write so far.
    pub max_flush: Duration,
    /// Bytes the store takes on disk, as of the last write.
    pub size_on_disk: u64,
    /// Changes gathered and not yet written.
    pub pending: usize,
    /// The last write error, if the last write failed.
    pub last_error: Option<String>,
    /// Since when writes have been failing (the first failure of the current run of
    /// failures); `None` while they succeed.
    pub failing_since: Option<std::time::SystemTime>,
    /// Write errors, in all.
    pub write_errors: u64,
    /// Events held in the persisted log.
    pub logged_events: usize,
    /// Events written, in all.
    pub events_written: u64,
    /// Snapshots written, in all.
    pub snapshots: u64,
    /// How long the last snapshot took to write.
    pub last_snapshot: Duration,
    /// Compactions done, in all.
    pub compactions: u64,
    /// How long the last compaction took.
    pub last_compaction: Duration,
    /// Whether a snapshot is being written now.
    pub snapshot_in_progress: bool,
    /// Whether the store is being compacted now.
    pub compaction_in_progress: bool,
    /// How long each write took.
    pub write_seconds: Histogram,
}

/// The upper bounds, in seconds, of [`Histogram`]'s buckets (a last one, unbounded,
/// follows them).
pub const HISTOGRAM_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Durations observed, counted in buckets bounded by [`HISTOGRAM_BOUNDS`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    pub counts: [u64; HISTOGRAM_BOUNDS.len() + 1],
    /// Their sum, in seconds.
    pub sum: f64,
}

impl Histogram {
    /// Counts one duration.
    pub fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = HISTOGRAM_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(HISTOGRAM_BOUNDS.len());
        self.counts[i] += 1;
        self.sum += secs;
    }

    /// How many were observed.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Each bucket's upper bound (`f64::MAX` for the unbounded last, as Prometheus
    /// encoders write `+Inf`) with its own count.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        HISTOGRAM_BOUNDS
            .iter()
            .copied()
            .chain([f64::MAX])
            .zip(self.counts)
            .collect()
    }
}

/// What every front end asks of a fleet. Implemented by the engine; a front end is
/// generic over it, so authorization or a router can stand in between.
pub trait Fleet: Send + Sync + 'static {
    /// One object.
    fn get(
        &self,
        request: GetRequest,
    ) -> impl Future<Output = Result<GetAnswer, FleetError>> + Send;
    /// One page of a list, from one snapshot (continued pages walk the same one).
    fn list(
        &self,
        request: ListRequest,
    ) -> impl Future<Output = Result<ListAnswer, FleetError>> + Send;
    /// Counts, grouped.
    fn count(
        &self,
        request: CountRequest,
    ) -> impl Future<Output = Result<CountAnswer, FleetError>> + Send;
    /// Changes: backlog, then live; the cluster filter followed as the fleet changes.
    fn watch(
        &self,
        request: WatchRequest,
    ) -> impl Future<Output = Result<Watch, FleetError>> + Send;
    /// The clusters the filter selects (of those the caller is granted anything in),
    /// with their streams (of the types granted, counting only granted objects).
    fn clusters(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> impl Future<Output = Result<ClustersAnswer, FleetError>> + Send;
    /// Every collected resource type the caller is granted somewhere, with counts of
    /// the granted objects.
    fn resource_types(
        &self,
        access: &Access,
    ) -> impl Future<Output = Result<Vec<ResourceTypeInfo>, FleetError>> + Send;
    /// What the fleet keeps on disk, and its figures. Only for a caller granted
    /// [`crate::access::STORE_ENDPOINT`]: others are `PermissionDenied`.
    fn store(&self, access: &Access) -> impl Future<Output = Result<Store, FleetError>> + Send;
}

/// A fleet that is not there yet (a store still loading): every call is
/// [`FleetError::Unavailable`] until [`Deferred::set`].
pub struct Deferred<F> {
    inner: std::sync::OnceLock<Arc<F>>,
}

impl<F> Default for Deferred<F> {
    fn default() -> Self {
        Self {
            inner: std::sync::OnceLock::new(),
        }
    }
}

impl<F: Fleet> Deferred<F> {
    /// Answers from `fleet` from now on (once; later calls change nothing).
    pub fn set(&self, fleet: Arc<F>) {
        let _ = self.inner.set(fleet);
    }

    /// The fleet, once set.
    pub fn get(&self) -> Option<&Arc<F>> {
        self.inner.get()
    }

    fn ready(&self) -> Result<&F, FleetError> {
        self.inner.get().map(|f| f.as_ref()).ok_or_else(|| {
            FleetError::Unavailable(
                "fleetscope is starting: its store is being loaded; retry shortly".into(),
            )
        })
    }
}

impl<F: Fleet> Fleet for Deferred<F> {
    async fn get(&self, request: GetRequest) -> Result<GetAnswer, FleetError> {
        self.ready()?.get(request).await
    }
    async fn list(&self, request: ListRequest) -> Result<ListAnswer, FleetError> {
        self.ready()?.list(request).await
    }
    async fn count(&self, request: CountRequest) -> Result<CountAnswer, FleetError> {
        self.ready()?.count(request).await
    }
    async fn watch(&self, request: WatchRequest) -> Result<Watch, FleetError> {
        self.ready()?.watch(request).await
    }
    async fn clusters(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> Result<ClustersAnswer, FleetError> {
        self.ready()?.clusters(filter, access).await
    }
    async fn resource_types(&self, access: &Access) -> Result<Vec<ResourceTypeInfo>, FleetError> {
        self.ready()?.resource_types(access).await
    }
    async fn store(&self, access: &Access) -> Result<Store, FleetError> {
        self.ready()?.store(access).await
    }
}

#[cfg(test)]
mod tests;
