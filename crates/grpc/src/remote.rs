//! A fleet on the other end of a gRPC channel: [`Remote`] implements the [`Fleet`]
//! seam by asking one server of a ring (a replica) over `fleetscope.v1.Fleet`, so a
//! router composes remote fleets as it would local ones and never sees the wire.
//! Everything the wire needs is here: requests out, answers in, the replica's errors
//! back as the fleet errors they stand for, the caller's identity passed on, and page
//! tokens signed with the ring's key (a continued list's snapshot and position travel
//! in the request as the domain's `after` and `resume`, and come back the same way).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use fleetscope_model::access::{Everything, Policy, Subject};
use fleetscope_model::fleet::{
    ClusterFreshness, ClustersAnswer, CountAnswer, CountRequest, Freshness, GetAnswer, GetRequest,
    ListAnswer, ListRequest, Projection, Query, ResourceTypeInfo, Store, StoreStats, Watch,
    WatchEvent, WatchRequest,
};
use fleetscope_model::{Access, ClusterFilter, ClusterName, EventType, Fleet, FleetError, GroupBy};
use futures::StreamExt as _;
use prost::Message as _;

use crate::convert;
use crate::identity::{ANONYMOUS, UNAUTHENTICATED, pass_identity, passed_subject};
use crate::page::Page;
use crate::status::from_replica;
use crate::token::{TokenKey, decode_token, encode_token};
use fleetscope_proto as proto;
use fleetscope_proto::fleet_client::FleetClient;

/// Which server of which ring a [`Remote`] asks, as its Lease names it: every answer
/// must come from it (its [`crate::REPLICA_HEADER`]).
#[derive(Debug, Clone)]
pub struct Replica {
    /// The ring.
    pub ring: String,
    /// The replica's identity in the ring.
    pub identity: String,
    /// The address its Lease publishes.
    pub address: String,
}

/// How a [`Remote`] speaks for its callers.
#[derive(Clone)]
pub struct Speaking {
    /// Whether the caller's identity is passed on (the channel presents a client
    /// certificate the replica takes as a router's); otherwise the replica serves
    /// every request as the channel's own caller.
    pub passes_identity: bool,
    /// The key the ring's servers sign page tokens with.
    pub page_token_key: TokenKey,
}

/// One server of a ring, as a [`Fleet`].
#[derive(Clone)]
pub struct Remote {
    channel: tonic::transport::Channel,
    replica: Arc<Replica>,
    speaking: Speaking,
    /// Held while the remote or any Watch it opened lives (a router's place on a
    /// pooled connection).
    held: Option<Arc<dyn Send + Sync>>,
}

impl Remote {
    /// A fleet asking `replica` over `channel`.
    pub fn new(channel: tonic::transport::Channel, replica: Replica, speaking: Speaking) -> Self {
        Self {
            channel,
            replica: Arc::new(replica),
            speaking,
            held: None,
        }
    }

    /// The same, holding `guard` until the remote and every Watch it opened are gone.
    pub fn holding(mut self, guard: impl Send + Sync + 'static) -> Self {
        self.held = Some(Arc::new(guard));
        self
    }

    /// The replica asked.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// `message` as sent for `access`'s caller.
    fn request<T>(&self, message: T, access: &Access) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if self.speaking.passes_identity {
            pass_identity(r.metadata_mut(), access.subject());
        }
        r
    }

    /// The caller the replica sees for `access` (page tokens are bound to it).
    pub fn caller(&self, access: &Access) -> String {
        let (_, policy) = tokio::sync::watch::channel(Arc::new(Everything) as Arc<dyn Policy>);
        if self.speaking.passes_identity {
            let s = access.subject();
            let subject = passed_subject(s.user.clone(), s.groups.clone());
            Access::new(subject, policy)
                .authenticated_by("certificate")
                .caller()
        } else {
            let subject = Subject {
                user: ANONYMOUS.into(),
                groups: vec![UNAUTHENTICATED.into()],
            };
            Access::new(subject, policy)
                .authenticated_by("none")
                .caller()
        }
    }

    /// The generated client, over the replica's channel.
    fn client(&self) -> FleetClient<tonic::transport::Channel> {
        FleetClient::new(self.channel.clone())
    }

    /// `List`, its objects read straight into the fleet's own ([`Page`]), where the
    /// generated client would read them into `fleetscope.v1.Object`s.
    async fn list_page(
        &self,
        mut request: tonic::Request<proto::ListRequest>,
    ) -> Result<tonic::Response<Page>, tonic::Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
        request
            .extensions_mut()
            .insert(tonic::GrpcMethod::new("fleetscope.v1.Fleet", "List"));
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/fleetscope.v1.Fleet/List");
        grpc.unary(request, path, fleetscope_proto::codec::Codec::default())
            .await
    }

    /// An answer, once its headers name the replica asked (see [`answered_as`]).
    fn answered<T>(
        &self,
        answer: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, FleetError> {
        let answer = answer.map_err(|s| from_replica(&self.replica.identity, &s))?;
        answered_as(answer.metadata(), &self.replica)?;
        Ok(answer.into_inner())
    }

    /// A page token of the replica's, bad: the ring's key differs, or the replica
    /// is not one of this ring.
    fn bad_token(&self) -> FleetError {
        FleetError::Unavailable(format!(
            "replica {} gave a page token not signed with the ring's key: check --shard-page-token-key-file",
            self.replica.identity
        ))
    }
}

/// Whether an answer's headers name `replica` as the one that gave it: a server
/// reached at the address the replica's Lease gives (a reused address, a wrong
/// `--shard-advertise`) but answering as another, or as no replica at all, answers for
/// nobody.
fn answered_as(
    headers: &tonic::metadata::MetadataMap,
    replica: &Replica,
) -> Result<(), FleetError> {
    let named = headers
        .get(crate::REPLICA_HEADER)
        .and_then(|v| v.to_str().ok());
    let Replica {
        ring,
        identity,
        address,
    } = replica;
    if named.and_then(|n| n.split_once('/')) == Some((ring.as_str(), identity.as_str())) {
        return Ok(());
    }
    let who = match named {
        Some(n) => format!("replica {n:?}"),
        None => "no replica of a ring".to_string(),
    };
    Err(FleetError::Unavailable(format!(
        "the server at {address}, the address replica {identity} of ring {ring} publishes, answers as {who}: check that replica's --shard-advertise"
    )))
}

/// What a Watch's position tokens are bound to: its query (names and globs aside)
/// and projection, as one string.
pub fn fingerprint(query: &Query, projection: Projection) -> String {
    use base64::Engine as _;
    let mut q = convert::query_out(query, projection);
    q.clusters.clear();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(q.encode_to_vec())
}

/// `g` as the wire spells it.
fn group_by_out(g: &GroupBy) -> String {
    match g {
        GroupBy::Cluster => "cluster".to_string(),
        GroupBy::Namespace => "namespace".to_string(),
        GroupBy::Label(k) => format!("label:{k}"),
        GroupBy::Field(p) => format!("field:{p}"),
    }
}

/// A stream position of the wire, as the domain holds it.
fn position_in(p: proto::StreamPosition) -> (ClusterName, Arc<str>) {
    (ClusterName::from(p.cluster), Arc::from(p.resource_version))
}

/// One event of a server's Watch as the domain holds it; `None` for one of a kind
/// this build does not know. A bookmark with positions is where the watched streams
/// stand; one with a token a router's; a bare one where the server has reached.
pub fn event_in(e: proto::WatchEvent) -> Option<WatchEvent> {
    let revision = fleetscope_model::Revision(e.revision);
    let kind = proto::EventType::try_from(e.r#type).unwrap_or(proto::EventType::Unspecified);
    Some(match kind {
        proto::EventType::Added | proto::EventType::Modified | proto::EventType::Deleted => {
            WatchEvent::Object {
                kind: match kind {
                    proto::EventType::Added => EventType::Added,
                    proto::EventType::Modified => EventType::Modified,
                    _ => EventType::Deleted,
                },
                object: convert::object_in(e.object?),
                revision,
                position: e.position.map(|p| Arc::from(p.resource_version)),
            }
        }
        proto::EventType::InitialEventsEnd => WatchEvent::InitialEventsEnd {
            revision,
            token: e.position_token,
        },
        proto::EventType::Bookmark if !e.position_token.is_empty() => WatchEvent::Bookmark {
            token: e.position_token,
        },
        proto::EventType::Bookmark => WatchEvent::Positions {
            positions: e.positions.into_iter().map(position_in).collect(),
            revision,
        },
        proto::EventType::Reset => WatchEvent::Reset {
            cluster: ClusterName::from(e.position?.cluster),
        },
        proto::EventType::ResetEnd => {
            let (cluster, position) = position_in(e.position?);
            WatchEvent::ResetEnd {
                cluster,
                position,
                revision,
            }
        }
        proto::EventType::ClusterStatus => WatchEvent::ClusterStatus {
            cluster: convert::cluster_freshness_in(e.cluster?),
            revision,
        },
        proto::EventType::Unspecified => return None,
    })
}

impl Fleet for Remote {
    async fn get(&self, r: GetRequest) -> Result<GetAnswer, FleetError> {
        let message = proto::GetRequest {
            resource: r.resource,
            cluster: r.cluster.clone(),
            namespace: r.namespace,
            name: r.name,
            projection: match r.projection {
                Projection::Full => proto::Projection::Unspecified,
                Projection::Metadata => proto::Projection::Metadata,
            } as i32,
        };
        let request = self.request(message, &r.access);
        let answer = self.answered(self.client().get(request).await)?;
        let object = answer.object.ok_or_else(|| {
            FleetError::Unavailable(format!(
                "replica {} answered without the object",
                self.replica.identity
            ))
        })?;
        Ok(GetAnswer {
            object: convert::object_in(object),
            cluster: answer.cluster.map_or_else(
                || ClusterFreshness {
                    cluster: r.cluster.as_str().into(),
                    freshness: Freshness::Error,
                    stale_since: None,
                    message: format!(
                        "replica {} gave no freshness for this cluster",
                        self.replica.identity
                    ),
                },
                convert::cluster_freshness_in,
            ),
            revision: fleetscope_model::Revision(answer.revision),
        })
    }

    async fn list(&self, r: ListRequest) -> Result<ListAnswer, FleetError> {
        let caller = self.caller(&r.access);
        let key = &self.speaking.page_token_key;
        let query = convert::query_out(&r.query, r.projection);
        let limit = u32::try_from(r.limit.max(1)).unwrap_or(u32::MAX);
        let message = match &r.after {
            None => proto::ListRequest {
                query: Some(query),
                limit,
                page_token: String::new(),
                keep_snapshot: r.keep_snapshot,
            },
            // A continuation carries its query, snapshot and position in the token.
            Some((revision, after)) => proto::ListRequest {
                query: None,
                limit,
                page_token: encode_token(key, &caller, *revision, &query, after, &r.resume),
                keep_snapshot: r.keep_snapshot,
            },
        };
        let request = self.request(message, &r.access);
        let Page {
            items, rest: page, ..
        } = self.answered(self.list_page(request).await)?;
        let (next, resume) = if page.next_page_token.is_empty() {
            (None, Vec::new())
        } else {
            let c =
                decode_token(key, &caller, &page.next_page_token).map_err(|_| self.bad_token())?;
            (Some(c.after), c.resume)
        };
        Ok(ListAnswer {
            items,
            next,
            revision: fleetscope_model::Revision(page.revision),
            remaining: page.remaining_item_count,
            clusters: page
                .clusters
                .into_iter()
                .map(convert::cluster_freshness_in)
                .collect(),
            partial: page.partial,
            resume,
            warnings: page.warnings,
        })
    }

    async fn count(&self, r: CountRequest) -> Result<CountAnswer, FleetError> {
        let message = proto::CountRequest {
            query: Some(convert::query_out(&r.query, Projection::Full)),
            group_by: r.group_by.iter().map(group_by_out).collect(),
        };
        let request = self.request(message, &r.access);
        let a = self.answered(self.client().count(request).await)?;
        let mut groups: BTreeMap<Vec<String>, u64> = BTreeMap::new();
        for g in a.groups {
            *groups.entry(g.key).or_default() += g.count;
        }
        Ok(CountAnswer {
            groups,
            total: a.total,
            revision: fleetscope_model::Revision(a.revision),
            clusters: a
                .clusters
                .into_iter()
                .map(convert::cluster_freshness_in)
                .collect(),
            partial: a.partial,
            warnings: a.warnings,
        })
    }

    async fn watch(&self, r: WatchRequest) -> Result<Watch, FleetError> {
        let resource = r.query.resource.clone();
        let position_out = |(c, rv): &(ClusterName, Arc<str>)| proto::StreamPosition {
            cluster: c.to_string(),
            resource: resource.clone(),
            resource_version: rv.to_string(),
        };
        let message = proto::WatchRequest {
            query: Some(convert::query_out(&r.query, r.projection)),
            since_revision: r.since.map_or(0, |s| s.0),
            send_initial_events: r.initial,
            bookmark_interval: None,
            resume_token: r
                .resume
                .as_ref()
                .map(|x| x.token.clone())
                .unwrap_or_default(),
            resume_positions: r
                .resume
                .as_ref()
                .map(|x| x.after.iter().map(position_out).collect())
                .unwrap_or_default(),
            report_positions: r.report_positions,
            start_positions: r
                .positions
                .as_ref()
                .map(|p| p.iter().map(position_out).collect())
                .unwrap_or_default(),
        };
        let request = self.request(message, &r.access);
        let stream = self.answered(self.client().watch(request).await)?;
        let replica = self.replica.identity.clone();
        // The stream holds what the remote holds until it is dropped.
        let held = self.held.clone();
        let events = stream.filter_map(move |item| {
            let _held = &held;
            let e = match item {
                Ok(e) => event_in(e).map(Ok),
                Err(s) => Some(Err(from_replica(&replica, &s))),
            };
            std::future::ready(e)
        });
        Ok(Watch::new(events, Arc::new(AtomicU64::new(0))))
    }

    async fn clusters(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> Result<ClustersAnswer, FleetError> {
        let message = proto::ListClustersRequest {
            clusters: filter.patterns(),
        };
        let request = self.request(message, access);
        let a = self.answered(self.client().list_clusters(request).await)?;
        let time = |t: Option<prost_types::Timestamp>| {
            t.and_then(|t| std::time::SystemTime::try_from(t).ok())
                .unwrap_or(std::time::UNIX_EPOCH)
        };
        let error = |e: String, at| (!e.is_empty()).then(|| (e, time(at)));
        Ok(ClustersAnswer {
            clusters: a.clusters.into_iter().map(convert::cluster_in).collect(),
            sources_loaded: a
                .sources_loaded_time
                .and_then(|t| std::time::SystemTime::try_from(t).ok()),
            sources_error: error(a.sources_error, a.sources_error_time),
            store_error: error(a.store_error, a.store_error_time),
        })
    }

    async fn resource_types(&self, access: &Access) -> Result<Vec<ResourceTypeInfo>, FleetError> {
        let request = self.request(proto::ListResourceTypesRequest {}, access);
        let a = self.answered(self.client().list_resource_types(request).await)?;
        Ok(a.resource_types
            .into_iter()
            .map(convert::resource_type_in)
            .collect())
    }

    async fn store(&self, access: &Access) -> Result<Store, FleetError> {
        let request = self.request(proto::GetStoreRequest {}, access);
        let s = self.answered(self.client().get_store(request).await)?;
        if !s.persisted {
            return Ok(if s.router_of_ring.is_empty() {
                Store::InMemory
            } else {
                Store::Router {
                    ring: s.router_of_ring,
                }
            });
        }
        let duration = |d: Option<prost_types::Duration>| {
            d.and_then(|d| std::time::Duration::try_from(d).ok())
                .unwrap_or_default()
        };
        Ok(Store::Persisted(Box::new(StoreStats {
            flushes: s.flushes,
            last_flush: duration(s.last_flush),
            max_flush: duration(s.max_flush),
            size_on_disk: s.size_on_disk_bytes,
            pending: usize::try_from(s.pending_changes).unwrap_or(usize::MAX),
            last_error: (!s.last_error.is_empty()).then_some(s.last_error),
            failing_since: s
                .failing_since
                .and_then(|t| std::time::SystemTime::try_from(t).ok()),
            write_errors: s.write_errors,
            logged_events: usize::try_from(s.logged_events).unwrap_or(usize::MAX),
            events_written: s.events_written,
            snapshots: s.snapshots,
            compactions: s.compactions,
            last_compaction: duration(s.last_compaction),
            ..StoreStats::default()
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_counts_only_from_the_replica_its_lease_names() {
        let replica = Replica {
            ring: "ring".into(),
            identity: "replica-a".into(),
            address: "10.0.0.1:50051".into(),
        };
        let headers = |value: Option<&str>| {
            let mut h = tonic::metadata::MetadataMap::new();
            if let Some(v) = value {
                h.insert(crate::REPLICA_HEADER, v.parse().unwrap());
            }
            h
        };
        assert!(answered_as(&headers(Some("ring/replica-a")), &replica).is_ok());
        for (value, says) in [
            (
                Some("ring/replica-b"),
                "answers as replica \"ring/replica-b\"",
            ),
            (
                Some("other/replica-a"),
                "answers as replica \"other/replica-a\"",
            ),
            (Some("replica-a"), "answers as replica \"replica-a\""),
            (None, "answers as no replica of a ring"),
        ] {
            let refused = answered_as(&headers(value), &replica).unwrap_err();
            assert!(
                matches!(&refused, FleetError::Unavailable(m) if m.contains(says) && m.contains("10.0.0.1:50051") && m.contains("--shard-advertise")),
                "{value:?}: {refused}"
            );
        }
    }

    #[test]
    fn a_query_restricted_to_clusters_reads_back_as_the_same_clusters_whatever_their_names() {
        let names = vec![
            "a[1]".to_string(),
            "prod-*".to_string(),
            "plain".to_string(),
        ];
        let query = Query {
            clusters: ClusterFilter::parse(&["prod-?".to_string()], "tier=web")
                .unwrap()
                .only(&names),
            resource: "pods".into(),
            ..Query::default()
        };
        let wire = convert::query_out(&query, Projection::Full);
        let back = convert::query(&wire).unwrap();
        for name in &names {
            assert!(back.clusters.names_match(name), "{name}");
        }
        // Each name is matched as written: none stands for others.
        assert!(!back.clusters.names_match("a1"));
        assert!(!back.clusters.names_match("prod-x"));
        assert_eq!(back.clusters.selector().to_string(), "tier=web");
    }

    #[test]
    fn every_event_a_server_sends_reads_back_as_the_domain_event_it_was() {
        let object = fleetscope_model::fleet::FleetObject {
            key: fleetscope_model::ObjectKey::new("pods", &"c1".into(), "ns", "a"),
            revision: fleetscope_model::Revision(7),
            uid: "u".into(),
            resource_version: "12".into(),
            json: Default::default(),
        };
        let events = vec![
            WatchEvent::Object {
                kind: EventType::Modified,
                object,
                revision: fleetscope_model::Revision(7),
                position: Some(Arc::from("12")),
            },
            WatchEvent::InitialEventsEnd {
                revision: fleetscope_model::Revision(7),
                token: String::new(),
            },
            WatchEvent::Positions {
                positions: vec![(ClusterName::from("c1"), Arc::from("12"))],
                revision: fleetscope_model::Revision(8),
            },
            WatchEvent::Reset {
                cluster: ClusterName::from("c1"),
            },
            WatchEvent::ResetEnd {
                cluster: ClusterName::from("c1"),
                position: Arc::from("13"),
                revision: fleetscope_model::Revision(9),
            },
            WatchEvent::Bookmark {
                token: "t.s".into(),
            },
            WatchEvent::ClusterStatus {
                cluster: ClusterFreshness {
                    cluster: ClusterName::from("c1"),
                    freshness: Freshness::Stale,
                    stale_since: None,
                    message: "relisting".into(),
                },
                revision: fleetscope_model::Revision(9),
            },
        ];
        for e in events {
            let wire = crate::watch::event(e.clone(), "pods");
            let back = event_in(wire).expect("a known kind");
            assert_eq!(format!("{back:?}"), format!("{e:?}"));
        }
        // A kind this build does not know is skipped, not misread.
        let unknown = proto::WatchEvent {
            r#type: 99,
            ..proto::WatchEvent::default()
        };
        assert!(event_in(unknown).is_none());
    }
}
