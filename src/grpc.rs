//! The `fleetscope.v1.Fleet` service over the engine: proto ↔ domain conversions and
//! the mapping of every domain error to a status code a person can act on.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use fleetscope_index::{FeedError, GroupBy, Index, IndexError, Object, State, transition};
use fleetscope_informer::discovery::{self, Served};
use fleetscope_model::{
    ClusterName, EventType, FieldSelector, LabelSelector, ObjectKey, ResourceType, Revision,
};
use futures::Stream;
use prost::Message as _;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::proto;
use crate::proto::fleet_server::Fleet;
use crate::status::{ClusterStatus, Freshness, StatusTable};

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Page size when a List gives none. Default 500.
    pub default_limit: u32,
    /// Largest page. Default 10,000.
    pub max_limit: u32,
    /// Bookmark interval when a Watch gives none. Default 30 s.
    pub bookmark_interval: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            default_limit: 500,
            max_limit: 10_000,
            bookmark_interval: Duration::from_secs(30),
        }
    }
}

/// The Fleet service. It can serve before the engine exists (while a store loads):
/// until then every call is `UNAVAILABLE`, which clients retry.
#[derive(Clone)]
pub struct FleetService {
    serving: Arc<OnceLock<Serving>>,
    config: ServiceConfig,
    shutdown: CancellationToken,
}

/// What the service answers from: the running engine's parts.
struct Serving {
    index: Arc<Index>,
    status: StatusTable,
    types: crate::engine::Types,
    persister: Option<Arc<crate::persist::Persister>>,
}

impl FleetService {
    /// A service over a running engine; streams end when `shutdown` is cancelled.
    pub fn new(
        engine: &crate::engine::Engine,
        config: ServiceConfig,
        shutdown: CancellationToken,
    ) -> Self {
        let service = Self::starting(config, shutdown);
        service.serve_engine(engine);
        service
    }

    /// A service with no engine yet: every call answers `UNAVAILABLE` until
    /// [`FleetService::serve_engine`].
    pub fn starting(config: ServiceConfig, shutdown: CancellationToken) -> Self {
        Self {
            serving: Arc::default(),
            config,
            shutdown,
        }
    }

    /// Starts answering from `engine` (once; later calls change nothing).
    pub fn serve_engine(&self, engine: &crate::engine::Engine) {
        let _ = self.serving.set(Serving {
            index: engine.index.clone(),
            status: engine.status.clone(),
            types: engine.types.clone(),
            persister: engine.persister(),
        });
    }

    /// How many clusters are configured (none while starting).
    pub fn cluster_count(&self) -> usize {
        self.serving.get().map_or(0, |s| s.status.clusters().len())
    }

    fn serving(&self) -> Result<&Serving, Status> {
        self.serving.get().ok_or_else(|| {
            Status::unavailable("fleetscope is starting: its store is being loaded; retry shortly")
        })
    }
}

impl Serving {
    fn resolve_resource(&self, name: &str) -> Result<ResourceType, Status> {
        if name.trim().is_empty() {
            return Err(Status::invalid_argument(
                "query.resource is required, e.g. \"pods\" or \"deployments.apps\"",
            ));
        }
        let types = self.types.read().unwrap_or_else(|e| e.into_inner());
        let served: Vec<Served> = types
            .values()
            .map(|rt| Served {
                resource: rt.clone(),
                watchable: true,
            })
            .collect();
        let resolved = discovery::resolve(&[name.to_string()], &served);
        if let Some(rt) = resolved.resources.into_iter().next() {
            return Ok(rt);
        }
        // Not known yet is not unknown: a cluster still being discovered may serve it.
        let discovering: Vec<String> = self
            .status
            .clusters()
            .into_iter()
            .filter(|c| c.discovering())
            .map(|c| c.name.to_string())
            .collect();
        if !discovering.is_empty() {
            return Err(Status::unavailable(format!(
                "resource type {name:?} is not known yet: fleetscope is still discovering cluster(s) {}; retry shortly",
                discovering.join(", ")
            )));
        }
        let mut close: Vec<(usize, String)> = types
            .keys()
            .map(|k| {
                (
                    strsim::levenshtein(&name.to_ascii_lowercase(), k),
                    k.clone(),
                )
            })
            .filter(|(d, k)| *d <= 3 || k.starts_with(&name.to_ascii_lowercase()))
            .collect();
        close.sort();
        let hint = if close.is_empty() {
            format!(
                "collected types: {}",
                types.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        } else {
            format!(
                "did you mean {}?",
                close
                    .iter()
                    .map(|(_, k)| k.as_str())
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Err(Status::not_found(format!(
            "resource type {name:?} is not collected from any cluster; {hint}"
        )))
    }

    /// The clusters a query draws on: names or globs, narrowed by the cluster label selector.
    fn select_clusters(&self, q: &proto::Query) -> Result<Vec<ClusterStatus>, Status> {
        let patterns = q
            .clusters
            .iter()
            .map(|p| {
                glob::Pattern::new(p).map_err(|e| {
                    Status::invalid_argument(format!(
                        "query.clusters: {p:?} is not a valid name or glob: {e}"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let selector = LabelSelector::parse(&q.cluster_selector)
            .map_err(|e| Status::invalid_argument(format!("query.cluster_selector: {e}")))?;
        Ok(self
            .status
            .clusters()
            .into_iter()
            .filter(|c| patterns.is_empty() || patterns.iter().any(|p| p.matches(c.name.as_str())))
            .filter(|c| selector.matches(&c.labels))
            .collect())
    }

    fn build(&self, q: &proto::Query) -> Result<Built, Status> {
        let rt = self.resolve_resource(&q.resource)?;
        let clusters = self.select_clusters(q)?;
        let labels = LabelSelector::parse(&q.label_selector)
            .map_err(|e| Status::invalid_argument(format!("query.label_selector: {e}")))?;
        let fields = FieldSelector::parse(&q.field_selector)
            .map_err(|e| Status::invalid_argument(format!("query.field_selector: {e}")))?;
        let names: Vec<ClusterName> = clusters.iter().map(|c| c.name.clone()).collect();
        let query = fleetscope_index::Query {
            resource: rt.name(),
            clusters: if q.clusters.is_empty() && q.cluster_selector.is_empty() {
                None
            } else {
                Some(names)
            },
            namespaces: q
                .namespaces
                .iter()
                .filter(|n| !n.is_empty())
                .cloned()
                .collect(),
            labels,
            fields,
        };
        let freshness: Vec<proto::ClusterFreshness> = clusters
            .iter()
            .map(|c| cluster_freshness(c, Some(&rt.name())))
            .collect();
        let partial = freshness
            .iter()
            .any(|f| f.freshness() != proto::Freshness::Synced);
        let projection = q.projection();
        Ok(Built {
            query,
            freshness,
            partial,
            projection,
        })
    }
}

struct Built {
    query: fleetscope_index::Query,
    freshness: Vec<proto::ClusterFreshness>,
    partial: bool,
    projection: proto::Projection,
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

fn freshness_proto(f: Freshness) -> proto::Freshness {
    match f {
        Freshness::Synced => proto::Freshness::Synced,
        Freshness::Syncing => proto::Freshness::Syncing,
        Freshness::Restored => proto::Freshness::Restored,
        Freshness::Stale => proto::Freshness::Stale,
        Freshness::Error => proto::Freshness::Error,
    }
}

fn cluster_freshness(c: &ClusterStatus, resource: Option<&str>) -> proto::ClusterFreshness {
    let (f, since, message) = c.freshness(resource);
    proto::ClusterFreshness {
        cluster: c.name.to_string(),
        freshness: freshness_proto(f) as i32,
        stale_since: since.map(timestamp),
        message,
    }
}

/// An object for the wire, as JSON text with its identity beside it.
fn object_proto(o: &Object, projection: proto::Projection) -> proto::Object {
    let json = match projection {
        proto::Projection::Metadata => o.metadata_json(),
        _ => o.json.to_string(),
    };
    let (uid, resource_version) = o.uid_and_resource_version();
    proto::Object {
        cluster: o.key.cluster.to_string(),
        resource: o.key.resource.to_string(),
        namespace: o.key.namespace.to_string(),
        name: o.key.name.to_string(),
        uid,
        resource_version,
        revision: o.revision.0,
        json,
    }
}

/// What a page token carries: the snapshot's revision, the query, and where to continue.
#[derive(serde::Serialize, serde::Deserialize)]
struct PageToken {
    /// Snapshot revision.
    r: u64,
    /// The query, protobuf-encoded, base64.
    q: String,
    /// The last key returned: resource, cluster, namespace, name.
    a: [String; 4],
}

fn encode_token(revision: Revision, query: &proto::Query, after: &ObjectKey) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let token = PageToken {
        r: revision.0,
        q: b64.encode(query.encode_to_vec()),
        a: [
            after.resource.to_string(),
            after.cluster.to_string(),
            after.namespace.to_string(),
            after.name.to_string(),
        ],
    };
    b64.encode(serde_json::to_vec(&token).unwrap_or_default())
}

fn decode_token(token: &str) -> Result<(Revision, proto::Query, ObjectKey), Status> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let bad = || {
        Status::invalid_argument(
            "page_token is not a token this server issued: pass back next_page_token unchanged, or start the list without one",
        )
    };
    let raw = b64.decode(token).map_err(|_| bad())?;
    let t: PageToken = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let query =
        proto::Query::decode(b64.decode(&t.q).map_err(|_| bad())?.as_slice()).map_err(|_| bad())?;
    let [r, c, n, m] = t.a;
    Ok((
        Revision(t.r),
        query,
        ObjectKey::new(&r, &ClusterName::from(c), &n, &m),
    ))
}

fn index_error(e: IndexError) -> Status {
    Status::out_of_range(e.to_string())
}

/// The stream type of `Watch`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

fn event_type(t: EventType) -> proto::EventType {
    match t {
        EventType::Added => proto::EventType::Added,
        EventType::Modified => proto::EventType::Modified,
        EventType::Deleted => proto::EventType::Deleted,
    }
}

#[tonic::async_trait]
impl Fleet for FleetService {
    async fn get(
        &self,
        request: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        let serving = self.serving()?;
        let r = request.into_inner();
        let rt = serving.resolve_resource(&r.resource)?;
        let cluster = ClusterName::from(r.cluster.as_str());
        let status = serving
            .status
            .cluster(&cluster)
            .ok_or_else(|| Status::not_found(format!("no cluster named {:?}", r.cluster)))?;
        if r.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        let snapshot = serving.index.snapshot();
        let key = ObjectKey::new(&rt.name(), &cluster, &r.namespace, &r.name);
        let projection = r.projection();
        let object = snapshot.get(&key).ok_or_else(|| {
            let place = if r.namespace.is_empty() {
                String::new()
            } else {
                format!(" in namespace {:?}", r.namespace)
            };
            Status::not_found(format!(
                "{} {:?} not found{place} of cluster {:?}",
                rt.name(),
                r.name,
                r.cluster
            ))
        })?;
        Ok(Response::new(proto::GetResponse {
            object: Some(object_proto(object, projection)),
            cluster: Some(cluster_freshness(&status, Some(&rt.name()))),
            revision: snapshot.revision().0,
        }))
    }

    async fn list(
        &self,
        request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        let serving = self.serving()?;
        let r = request.into_inner();
        let (query, snapshot, after): (proto::Query, Arc<State>, Option<ObjectKey>) = if r
            .page_token
            .is_empty()
        {
            (r.query.unwrap_or_default(), serving.index.snapshot(), None)
        } else {
            let (revision, query, after) = decode_token(&r.page_token)?;
            let snapshot = serving.index.pinned(revision).ok_or_else(|| {
                Status::out_of_range(format!("the page token expired: its snapshot at revision {revision} is no longer held; start the list again"))
            })?;
            (query, snapshot, Some(after))
        };
        let built = serving.build(&query)?;
        let limit = match r.limit {
            0 => self.config.default_limit,
            n => n.min(self.config.max_limit),
        } as usize;
        let page = snapshot.page(&built.query, after.as_ref(), limit);
        let next_page_token = match &page.next {
            Some(last) => {
                serving.index.pin(snapshot.clone());
                encode_token(snapshot.revision(), &query, last)
            }
            None => String::new(),
        };
        Ok(Response::new(proto::ListResponse {
            items: page
                .items
                .iter()
                .map(|o| object_proto(o, built.projection))
                .collect(),
            next_page_token,
            revision: snapshot.revision().0,
            clusters: built.freshness,
            partial: built.partial,
            remaining_item_count: page.remaining,
        }))
    }

    async fn count(
        &self,
        request: Request<proto::CountRequest>,
    ) -> Result<Response<proto::CountResponse>, Status> {
        let serving = self.serving()?;
        let r = request.into_inner();
        let group_by = r
            .group_by
            .iter()
            .map(|g| {
                GroupBy::parse(g).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "group_by {g:?}: expected cluster, namespace, label:KEY or field:PATH"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let built = serving.build(&r.query.unwrap_or_default())?;
        let snapshot = serving.index.snapshot();
        let counts = snapshot.count(&built.query, &group_by);
        Ok(Response::new(proto::CountResponse {
            groups: counts
                .groups
                .into_iter()
                .map(|(key, count)| proto::CountGroup { key, count })
                .collect(),
            total: counts.total,
            revision: snapshot.revision().0,
            clusters: built.freshness,
            partial: built.partial,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let serving = self.serving()?;
        let r = request.into_inner();
        let built = serving.build(&r.query.unwrap_or_default())?;
        let since = match (r.send_initial_events, r.since_revision) {
            (true, _) | (false, 0) => None,
            (false, n) => Some(Revision(n)),
        };
        let sub = serving.index.subscribe(since).map_err(index_error)?;
        let interval = r
            .bookmark_interval
            .and_then(|d| Duration::try_from(d).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(self.config.bookmark_interval)
            .max(Duration::from_millis(10));
        let clusters: Vec<String> = match &built.query.clusters {
            Some(cs) => cs.iter().map(ToString::to_string).collect(),
            None => Vec::new(),
        };
        // A short hand-off: the subscriber's real bound is the index's subscriber buffer
        // and event log, which it pulls from.
        let (tx, rx) = mpsc::channel(8);
        let job = WatchJob {
            query: built.query,
            projection: built.projection,
            clusters,
            initial: r.send_initial_events,
            interval,
            statuses: serving.status.subscribe(),
            shutdown: self.shutdown.clone(),
            tx,
        };
        tokio::spawn(job.run(sub));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_clusters(
        &self,
        request: Request<proto::ListClustersRequest>,
    ) -> Result<Response<proto::ListClustersResponse>, Status> {
        let serving = self.serving()?;
        let r = request.into_inner();
        let selected = serving.select_clusters(&proto::Query {
            clusters: r.clusters,
            ..Default::default()
        })?;
        let snapshot = serving.index.snapshot();
        let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (resource, cluster, n) in snapshot.counts() {
            counts.insert((cluster.to_string(), resource.to_string()), n as u64);
        }
        let clusters = selected
            .iter()
            .map(|c| {
                let whole = cluster_freshness(c, None);
                proto::Cluster {
                    name: c.name.to_string(),
                    labels: c.labels.clone().into_iter().collect(),
                    server: c.server.clone(),
                    freshness: whole.freshness,
                    stale_since: whole.stale_since,
                    last_error: c.error.clone().unwrap_or_else(|| whole.message.clone()),
                    kubernetes_version: c.version.clone(),
                    streams: c
                        .streams
                        .iter()
                        .map(|(name, (_, s))| proto::ResourceStream {
                            resource: name.clone(),
                            state: stream_state(s.state) as i32,
                            object_count: counts
                                .get(&(c.name.to_string(), name.clone()))
                                .copied()
                                .unwrap_or(0),
                            resource_version: s.resource_version.clone(),
                            last_event_time: s.last_event.map(timestamp),
                            last_error: s.last_error.clone().unwrap_or_default(),
                            sync_lag: s
                                .current_at
                                .and_then(|t| prost_types::Duration::try_from(t.elapsed()).ok()),
                        })
                        .chain(c.missing.iter().map(|(spec, why)| proto::ResourceStream {
                            resource: spec.clone(),
                            state: proto::StreamState::NotFound as i32,
                            last_error: why.clone(),
                            ..Default::default()
                        }))
                        .collect(),
                }
            })
            .collect();
        Ok(Response::new(proto::ListClustersResponse { clusters }))
    }

    async fn list_resource_types(
        &self,
        _: Request<proto::ListResourceTypesRequest>,
    ) -> Result<Response<proto::ListResourceTypesResponse>, Status> {
        let serving = self.serving()?;
        let snapshot = serving.index.snapshot();
        let types = serving
            .types
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let resource_types = types
            .values()
            .map(|rt| {
                let name = rt.name();
                let clusters: Vec<proto::ClusterCount> = snapshot
                    .counts()
                    .filter(|(r, _, _)| *r == name)
                    .map(|(_, c, n)| proto::ClusterCount {
                        cluster: c.to_string(),
                        count: n as u64,
                    })
                    .collect();
                proto::ResourceType {
                    total: clusters.iter().map(|c| c.count).sum(),
                    name,
                    group: rt.group.clone(),
                    version: rt.version.clone(),
                    kind: rt.kind.clone(),
                    namespaced: rt.namespaced,
                    clusters,
                }
            })
            .collect();
        Ok(Response::new(proto::ListResourceTypesResponse {
            resource_types,
        }))
    }

    async fn get_store(
        &self,
        _: Request<proto::GetStoreRequest>,
    ) -> Result<Response<proto::GetStoreResponse>, Status> {
        let serving = self.serving()?;
        let Some(persister) = &serving.persister else {
            return Ok(Response::new(proto::GetStoreResponse::default()));
        };
        let s = persister.stats();
        let duration = |d: Duration| prost_types::Duration::try_from(d).ok();
        Ok(Response::new(proto::GetStoreResponse {
            persisted: true,
            size_on_disk_bytes: s.size_on_disk,
            pending_changes: s.pending as u64,
            flushes: s.flushes,
            last_flush: duration(s.last_flush),
            max_flush: duration(s.max_flush),
            events_written: s.events_written,
            logged_events: s.logged_events as u64,
            snapshots: s.snapshots,
            compactions: s.compactions,
            last_compaction: duration(s.last_compaction),
            last_error: s.last_error.unwrap_or_default(),
        }))
    }
}

fn stream_state(s: fleetscope_informer::StreamState) -> proto::StreamState {
    use fleetscope_informer::StreamState as S;
    match s {
        S::Pending => proto::StreamState::Pending,
        S::Listing => proto::StreamState::Listing,
        S::Watching => proto::StreamState::Watching,
        S::Failed => proto::StreamState::Failed,
        S::Forbidden => proto::StreamState::Forbidden,
        S::NotFound => proto::StreamState::NotFound,
    }
}

/// One Watch subscriber's producer.
struct WatchJob {
    query: fleetscope_index::Query,
    projection: proto::Projection,
    clusters: Vec<String>,
    initial: bool,
    interval: Duration,
    statuses: broadcast::Receiver<crate::status::FreshnessChange>,
    shutdown: CancellationToken,
    tx: mpsc::Sender<Result<proto::WatchEvent, Status>>,
}

impl WatchJob {
    /// Sends what a change means to this subscriber; false once the client is gone.
    async fn deliver(&self, e: &fleetscope_index::Event) -> bool {
        match transition(&self.query, e) {
            Some(t) => {
                let ev = proto::WatchEvent {
                    r#type: event_type(t) as i32,
                    object: Some(object_proto(&e.object, self.projection)),
                    revision: e.revision.0,
                    cluster: None,
                };
                self.send(ev).await
            }
            None => true,
        }
    }

    async fn send(&self, e: proto::WatchEvent) -> bool {
        self.tx.send(Ok(e)).await.is_ok()
    }

    fn marker(t: proto::EventType, revision: Revision) -> proto::WatchEvent {
        proto::WatchEvent {
            r#type: t as i32,
            object: None,
            revision: revision.0,
            cluster: None,
        }
    }

    async fn run(mut self, sub: fleetscope_index::Subscription) {
        let fleetscope_index::Subscription { snapshot, mut feed } = sub;
        if self.initial {
            for o in snapshot.matching(&self.query, None) {
                let e = proto::WatchEvent {
                    r#type: proto::EventType::Added as i32,
                    object: Some(object_proto(o, self.projection)),
                    revision: o.revision.0,
                    cluster: None,
                };
                if !self.send(e).await {
                    return;
                }
            }
            if !self
                .send(Self::marker(
                    proto::EventType::InitialEventsEnd,
                    snapshot.revision(),
                ))
                .await
            {
                return;
            }
        }
        drop(snapshot);
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.tx.closed() => return,
                r = feed.next() => match r {
                    Ok(events) => {
                        for e in &events {
                            if !self.deliver(e).await {
                                return;
                            }
                        }
                    }
                    Err(e @ FeedError::Behind { .. }) => {
                        let _ = self.tx.send(Err(Status::resource_exhausted(e.to_string()))).await;
                        return;
                    }
                    Err(e @ FeedError::Expired { .. }) => {
                        let _ = self.tx.send(Err(Status::out_of_range(e.to_string()))).await;
                        return;
                    }
                    Err(FeedError::Closed) => return,
                },
                c = self.statuses.recv() => {
                    if let Ok(c) = c
                        && (self.clusters.is_empty() || self.clusters.iter().any(|n| *n == c.cluster.as_str()))
                    {
                        let cluster = proto::ClusterFreshness {
                            cluster: c.cluster.to_string(),
                            freshness: freshness_proto(c.freshness) as i32,
                            stale_since: c.stale_since.map(timestamp),
                            message: c.message,
                        };
                        let ev = proto::WatchEvent { r#type: proto::EventType::ClusterStatus as i32, object: None, revision: feed.reached().0, cluster: Some(cluster) };
                        if !self.send(ev).await {
                            return;
                        }
                    }
                }
                _ = ticks.tick() => {
                    if !self.send(Self::marker(proto::EventType::Bookmark, feed.reached())).await {
                        return;
                    }
                }
            }
        }
    }
}
