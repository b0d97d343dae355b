//! The `fleetscope.v1.Fleet` service, generic over the [`Fleet`] seam: it converts
//! requests and answers, encodes page tokens, adds bookmarks to Watch streams and maps
//! the fleet's errors to status codes. Nothing else: what an answer holds is decided
//! below the seam.

use std::sync::Arc;
use std::time::Duration;

use fleetscope_model::fleet::{CountRequest, GetRequest, ListRequest, WatchRequest};
use fleetscope_model::{Access, ClusterName, Fleet, GroupBy, Revision};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

pub mod convert;
pub mod identity;
mod page;
pub mod remote;
pub mod status;
pub mod token;
mod watch;

pub use status::echo;
use status::status;
pub use token::{RandomUnavailable, TokenKey, random_secret};
use token::{decode_token, encode_token};
pub use watch::{Joined, Revocation, Subscribers, WatchStream};

use fleetscope_proto as proto;
use fleetscope_proto::fleet_server;

/// The response header a replica of a ring answers every call with: `ring/identity`,
/// the name its Lease is held under. A router checks it against the Lease whose
/// address it dialled, so an address that reaches another server (a reused address,
/// a wrong `--shard-advertise`) is never read as that replica.
pub const REPLICA_HEADER: &str = "fleetscope-replica";

pub use fleetscope_proto::VERSION_HEADER;

/// The most `group_by` entries of a Count.
pub const MAX_GROUP_BY: usize = 8;
/// The most groups a Count answers with.
pub const MAX_GROUPS: usize = 50_000;

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Page size when a List gives none. Default 500.
    pub default_limit: u32,
    /// Largest page. Default 10,000.
    pub max_limit: u32,
    /// Bookmark interval when a Watch gives none. Default 30 s.
    pub bookmark_interval: Duration,
    /// The most bytes of objects in one List page. Default 3 MiB, so a page stays
    /// under the 4 MiB message size gRPC clients accept by default.
    pub max_page_bytes: usize,
    /// The key page tokens are signed with.
    pub token_key: TokenKey,
    /// Watch streams one caller may have open at once. Default 1,000.
    pub max_watches_per_caller: usize,
    /// The status of the server's inputs that reload, served in `ListClusters`.
    /// Default: none.
    pub inputs: fleetscope_model::inputs::Inputs,
    /// This server as a replica of a ring, `ring/identity`: sent as
    /// [`REPLICA_HEADER`] with every answer. Default: none (not a replica).
    pub replica: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// This server's version: sent as [`VERSION_HEADER`] with every answer. Default:
    /// none.
    pub version: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl ServiceConfig {
    /// The defaults, signing page tokens with `token_key` (there is no default key:
    /// a start makes or loads one, and stops if it cannot).
    pub fn new(token_key: TokenKey) -> Self {
        Self {
            default_limit: 500,
            max_limit: 10_000,
            bookmark_interval: Duration::from_secs(30),
            max_page_bytes: 3 << 20,
            token_key,
            max_watches_per_caller: 1000,
            inputs: fleetscope_model::inputs::no_inputs(),
            replica: None,
            version: None,
        }
    }
}

/// The Fleet service over a fleet; Watch streams end when `shutdown` is cancelled.
pub struct FleetService<F> {
    fleet: Arc<F>,
    config: ServiceConfig,
    shutdown: CancellationToken,
    subscribers: Arc<watch::Subscribers>,
}

impl<F> Clone for FleetService<F> {
    fn clone(&self) -> Self {
        Self {
            fleet: self.fleet.clone(),
            config: self.config.clone(),
            shutdown: self.shutdown.clone(),
            subscribers: self.subscribers.clone(),
        }
    }
}

impl<F: Fleet> FleetService<F> {
    /// A service answering from `fleet`.
    pub fn new(fleet: Arc<F>, config: ServiceConfig, shutdown: CancellationToken) -> Self {
        Self {
            fleet,
            config,
            shutdown,
            subscribers: Arc::default(),
        }
    }

    /// The Watch streams this service (and its clones) has open and has ended.
    pub fn subscribers(&self) -> Arc<Subscribers> {
        self.subscribers.clone()
    }

    /// Its settings.
    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// `message` as an answer, naming this server as the replica it is (if it is one).
    fn answer<T>(&self, message: T) -> Response<T> {
        let mut r = Response::new(message);
        if let Some(replica) = &self.config.replica {
            r.metadata_mut().insert(REPLICA_HEADER, replica.clone());
        }
        if let Some(version) = &self.config.version {
            r.metadata_mut().insert(VERSION_HEADER, version.clone());
        }
        r
    }
}

/// The caller's access, as the authentication layer established it. A request that
/// did not pass through it is refused: nothing is served to no one in particular.
fn access<T>(request: &Request<T>) -> Result<Access, Status> {
    request
        .extensions()
        .get::<Access>()
        .cloned()
        .ok_or_else(|| Status::permission_denied("the request carries no identity"))
}

#[tonic::async_trait]
impl<F: Fleet> fleet_server::Fleet for FleetService<F> {
    async fn get(
        &self,
        request: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        let access = access(&request)?;
        let r = request.into_inner();
        convert::name("resource", &r.resource).map_err(status)?;
        convert::name("cluster", &r.cluster).map_err(status)?;
        convert::name("namespace", &r.namespace).map_err(status)?;
        convert::name("name", &r.name).map_err(status)?;
        let projection = convert::projection(r.projection());
        let answer = self
            .fleet
            .get(GetRequest {
                resource: r.resource,
                cluster: r.cluster,
                namespace: r.namespace,
                name: r.name,
                projection,
                access,
            })
            .await
            .map_err(status)?;
        Ok(self.answer(proto::GetResponse {
            object: Some(convert::object(answer.object)),
            cluster: Some(convert::cluster_freshness(answer.cluster)),
            revision: answer.revision.0,
        }))
    }

    async fn list(
        &self,
        request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        let access = access(&request)?;
        let caller = access.caller();
        let r = request.into_inner();
        // A continued list carries its query and snapshot in the token.
        let (query, after, resume) = if r.page_token.is_empty() {
            (r.query.unwrap_or_default(), None, Vec::new())
        } else {
            let c = decode_token(&self.config.token_key, &caller, &r.page_token)?;
            (c.query, Some((c.revision, c.after)), c.resume)
        };
        let limit = match r.limit {
            0 => self.config.default_limit,
            n => n.min(self.config.max_limit),
        } as usize;
        let answer = self
            .fleet
            .list(ListRequest {
                query: convert::query(&query).map_err(status)?,
                projection: convert::projection(query.projection()),
                limit,
                max_bytes: self.config.max_page_bytes,
                after,
                resume,
                keep_snapshot: r.keep_snapshot,
                access,
            })
            .await
            .map_err(status)?;
        let next_page_token = answer
            .next
            .as_ref()
            .map(|last| {
                encode_token(
                    &self.config.token_key,
                    &caller,
                    answer.revision,
                    &query,
                    last,
                    &answer.resume,
                )
            })
            .unwrap_or_default();
        Ok(self.answer(proto::ListResponse {
            items: answer.items.into_iter().map(convert::object).collect(),
            next_page_token,
            revision: answer.revision.0,
            clusters: convert::clusters_freshness(answer.clusters),
            partial: answer.partial,
            remaining_item_count: answer.remaining,
            warnings: answer.warnings,
        }))
    }

    async fn count(
        &self,
        request: Request<proto::CountRequest>,
    ) -> Result<Response<proto::CountResponse>, Status> {
        let access = access(&request)?;
        let r = request.into_inner();
        if r.group_by.len() > MAX_GROUP_BY {
            return Err(Status::invalid_argument(format!(
                "group_by: {} entries, more than the limit of {MAX_GROUP_BY}",
                r.group_by.len()
            )));
        }
        let group_by = r
            .group_by
            .iter()
            .map(|g| {
                GroupBy::parse(g).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "group_by {:?}: expected cluster, namespace, label:KEY or field:PATH",
                        echo(g)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let answer = self
            .fleet
            .count(CountRequest {
                query: convert::query(&r.query.unwrap_or_default()).map_err(status)?,
                group_by,
                access,
            })
            .await
            .map_err(status)?;
        if answer.groups.len() > MAX_GROUPS {
            return Err(Status::resource_exhausted(format!(
                "the count has {} groups, more than the limit of {MAX_GROUPS}: group by fewer or coarser keys, or narrow the query",
                answer.groups.len()
            )));
        }
        Ok(self.answer(proto::CountResponse {
            groups: answer
                .groups
                .into_iter()
                .map(|(key, count)| proto::CountGroup { key, count })
                .collect(),
            total: answer.total,
            revision: answer.revision.0,
            clusters: convert::clusters_freshness(answer.clusters),
            partial: answer.partial,
            warnings: answer.warnings,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let access = access(&request)?;
        let revocation = request.extensions().get::<Revocation>().cloned();
        let r = request.into_inner();
        let query = r.query.unwrap_or_default();
        let interval = r
            .bookmark_interval
            .and_then(|d| Duration::try_from(d).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(self.config.bookmark_interval)
            .max(Duration::from_millis(10));
        let caller = access.caller();
        let place = self
            .subscribers
            .admit(&caller, self.config.max_watches_per_caller)
            .await
            .ok_or_else(|| {
                Status::resource_exhausted(format!(
                    "{} has {} Watch streams open, the most one caller may: end one first",
                    echo(&access.subject().user),
                    self.config.max_watches_per_caller
                ))
            })?;
        let resume = if r.resume_token.is_empty() {
            None
        } else {
            Some(fleetscope_model::fleet::Resume {
                token: r.resume_token.clone(),
                after: positions(&r.resume_positions, &query, "resume_positions")?,
            })
        };
        let start_positions = if r.start_positions.is_empty() {
            None
        } else {
            Some(positions(&r.start_positions, &query, "start_positions")?)
        };
        let watch = self
            .fleet
            .watch(WatchRequest {
                query: convert::query(&query).map_err(status)?,
                projection: convert::projection(query.projection()),
                since: (r.since_revision > 0).then_some(Revision(r.since_revision)),
                initial: r.send_initial_events,
                access,
                positions: start_positions,
                report_positions: r.report_positions,
                resume,
            })
            .await
            .map_err(status)?;
        Ok(self.answer(watch::stream(
            watch,
            query.resource.clone(),
            interval,
            self.shutdown.clone(),
            place,
            revocation,
        )))
    }

    async fn list_clusters(
        &self,
        request: Request<proto::ListClustersRequest>,
    ) -> Result<Response<proto::ListClustersResponse>, Status> {
        let access = access(&request)?;
        let r = request.into_inner();
        convert::names("clusters", &r.clusters).map_err(status)?;
        let filter = convert::cluster_filter(&r.clusters, "").map_err(status)?;
        let answer = self.fleet.clusters(filter, &access).await.map_err(status)?;
        Ok(self.answer(proto::ListClustersResponse {
            clusters: answer.clusters.into_iter().map(convert::cluster).collect(),
            sources_loaded_time: answer.sources_loaded.map(convert::timestamp),
            sources_error: answer
                .sources_error
                .as_ref()
                .map(|(e, _)| e.clone())
                .unwrap_or_default(),
            sources_error_time: answer.sources_error.map(|(_, at)| convert::timestamp(at)),
            store_error: answer
                .store_error
                .as_ref()
                .map(|(e, _)| e.clone())
                .unwrap_or_default(),
            store_error_time: answer.store_error.map(|(_, at)| convert::timestamp(at)),
            inputs: self
                .config
                .inputs
                .borrow()
                .iter()
                .map(convert::input)
                .collect(),
        }))
    }

    async fn list_resource_types(
        &self,
        request: Request<proto::ListResourceTypesRequest>,
    ) -> Result<Response<proto::ListResourceTypesResponse>, Status> {
        let access = access(&request)?;
        let types = self.fleet.resource_types(&access).await.map_err(status)?;
        let resource_types = types
            .into_iter()
            .map(|t| {
                let clusters: Vec<proto::ClusterCount> = t
                    .clusters
                    .into_iter()
                    .map(|(cluster, count)| proto::ClusterCount {
                        cluster: cluster.to_string(),
                        count,
                    })
                    .collect();
                proto::ResourceType {
                    total: clusters.iter().map(|c| c.count).sum(),
                    name: t.resource.name(),
                    group: t.resource.group,
                    version: t.resource.version,
                    kind: t.resource.kind,
                    namespaced: t.resource.namespaced,
                    clusters,
                    short_names: t.short_names,
                }
            })
            .collect();
        Ok(self.answer(proto::ListResourceTypesResponse { resource_types }))
    }

    async fn get_store(
        &self,
        request: Request<proto::GetStoreRequest>,
    ) -> Result<Response<proto::GetStoreResponse>, Status> {
        let access = access(&request)?;
        use fleetscope_model::fleet::Store;
        let s = match self.fleet.store(&access).await.map_err(status)? {
            Store::Persisted(s) => *s,
            Store::InMemory => return Ok(self.answer(proto::GetStoreResponse::default())),
            Store::Router { ring } => {
                return Ok(self.answer(proto::GetStoreResponse {
                    router_of_ring: ring,
                    ..Default::default()
                }));
            }
        };
        Ok(self.answer(proto::GetStoreResponse {
            persisted: true,
            size_on_disk_bytes: s.size_on_disk,
            pending_changes: s.pending as u64,
            flushes: s.flushes,
            last_flush: convert::duration(s.last_flush),
            max_flush: convert::duration(s.max_flush),
            events_written: s.events_written,
            logged_events: s.logged_events as u64,
            snapshots: s.snapshots,
            compactions: s.compactions,
            last_compaction: convert::duration(s.last_compaction),
            last_error: s.last_error.unwrap_or_default(),
            failing_since: s.failing_since.map(convert::timestamp),
            write_errors: s.write_errors,
            router_of_ring: String::new(),
        }))
    }
}

/// The stream positions a client gave in `field`, each checked against what a member
/// can have: of the query's type, in a cluster the query names (by name or glob), at a
/// resourceVersion an API server makes (a number) or none (inside a re-list).
fn positions(
    given: &[proto::StreamPosition],
    query: &proto::Query,
    field: &str,
) -> Result<Vec<(ClusterName, Arc<str>)>, Status> {
    let names = fleetscope_model::ClusterFilter::parse(&query.clusters, "")
        .map_err(|e| Status::invalid_argument(format!("query.clusters: {e}")))?;
    given
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let bad = |why: String| Status::invalid_argument(format!("{field}[{i}]: {why}"));
            if !p.resource.is_empty() && p.resource != query.resource {
                return Err(bad(format!(
                    "resource {:?} is not the query's ({:?})",
                    echo(&p.resource),
                    echo(&query.resource)
                )));
            }
            if !names.names_match(&p.cluster) {
                return Err(bad(format!(
                    "cluster {:?} is not one the query names",
                    echo(&p.cluster)
                )));
            }
            let rv = &p.resource_version;
            if !rv.is_empty() && !fleetscope_model::is_resource_version(rv) {
                return Err(bad(format!(
                    "resource_version {:?} is not one an API server makes (a number)",
                    echo(rv)
                )));
            }
            Ok((
                ClusterName::from(p.cluster.as_str()),
                Arc::from(rv.as_str()),
            ))
        })
        .collect()
}
