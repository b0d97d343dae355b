//! The `fleetscope.v1.Fleet` service over the engine: proto ↔ domain conversions and
//! the mapping of every domain error to a status code a person can act on.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fleetscope_index::{GroupBy, Index, IndexError, State};
use fleetscope_informer::discovery::{self, Served};
use fleetscope_model::{
    ClusterFilter, ClusterFilterError, ClusterName, FieldSelector, LabelSelector, ObjectKey,
    ResourceType, Revision,
};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

mod convert;
mod token;
mod watch;

use convert::{cluster_freshness, object_proto, stream_state, timestamp};
use token::{decode_token, encode_token};
use watch::WatchJob;

use crate::proto;
use crate::proto::fleet_server::Fleet;
use crate::status::{ClusterStatus, StatusTable};

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
        let types = self.status.types();
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
    fn select_clusters(
        &self,
        q: &proto::Query,
    ) -> Result<(ClusterFilter, Vec<ClusterStatus>), Status> {
        let filter =
            ClusterFilter::parse(&q.clusters, &q.cluster_selector).map_err(|e| match e {
                ClusterFilterError::Pattern { .. } => {
                    Status::invalid_argument(format!("query.clusters: {e}"))
                }
                ClusterFilterError::Selector(e) => {
                    Status::invalid_argument(format!("query.cluster_selector: {e}"))
                }
            })?;
        let clusters = self
            .status
            .clusters()
            .into_iter()
            .filter(|c| filter.matches(&c.name, &c.labels))
            .collect();
        Ok((filter, clusters))
    }

    fn build(&self, q: &proto::Query) -> Result<Built, Status> {
        let rt = self.resolve_resource(&q.resource)?;
        let (filter, clusters) = self.select_clusters(q)?;
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
            filter,
            freshness,
            partial,
            projection,
        })
    }
}

struct Built {
    query: fleetscope_index::Query,
    /// The cluster filter, for queries that follow the fleet as it changes.
    filter: ClusterFilter,
    freshness: Vec<proto::ClusterFreshness>,
    partial: bool,
    projection: proto::Projection,
}

fn index_error(e: IndexError) -> Status {
    Status::out_of_range(e.to_string())
}

/// The stream type of `Watch`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

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
        // The cluster filter is evaluated per event against the live fleet, so a
        // matching cluster added later is followed too; the index query reads all.
        let initial = r.send_initial_events.then(|| built.query.clone());
        let mut query = built.query;
        query.clusters = None;
        let labels = serving
            .status
            .clusters()
            .into_iter()
            .map(|c| (c.name, c.labels))
            .collect();
        // A short hand-off: the subscriber's real bound is the index's subscriber buffer
        // and event log, which it pulls from.
        let (tx, rx) = mpsc::channel(8);
        let job = WatchJob {
            query,
            projection: built.projection,
            filter: built.filter,
            labels,
            selected: Default::default(),
            status: serving.status.clone(),
            initial,
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
        let (_, selected) = serving.select_clusters(&proto::Query {
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
                                .sync_lag()
                                .and_then(|d| prost_types::Duration::try_from(d).ok()),
                        })
                        .chain(c.missing.iter().map(|(spec, why)| proto::ResourceStream {
                            resource: spec.clone(),
                            state: proto::StreamState::NotFound as i32,
                            last_error: why.clone(),
                            ..Default::default()
                        }))
                        .collect(),
                    source: c.source.clone(),
                    source_loaded_time: Some(timestamp(c.loaded_at)),
                }
            })
            .collect();
        let sources = serving.status.sources();
        Ok(Response::new(proto::ListClustersResponse {
            clusters,
            sources_loaded_time: sources.loaded_at.map(timestamp),
            sources_error: sources
                .error
                .as_ref()
                .map(|(e, _)| e.clone())
                .unwrap_or_default(),
            sources_error_time: sources.error.map(|(_, at)| timestamp(at)),
        }))
    }

    async fn list_resource_types(
        &self,
        _: Request<proto::ListResourceTypesRequest>,
    ) -> Result<Response<proto::ListResourceTypesResponse>, Status> {
        let serving = self.serving()?;
        let snapshot = serving.index.snapshot();
        let types = serving.status.types();
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
