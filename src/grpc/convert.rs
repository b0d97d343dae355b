//! Domain → proto conversions.

use std::time::SystemTime;

use fleetscope_index::Object;
use fleetscope_model::EventType;

use crate::proto;
use crate::status::{ClusterStatus, Freshness};

pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

pub(crate) fn freshness_proto(f: Freshness) -> proto::Freshness {
    match f {
        Freshness::Synced => proto::Freshness::Synced,
        Freshness::Syncing => proto::Freshness::Syncing,
        Freshness::Restored => proto::Freshness::Restored,
        Freshness::Stale => proto::Freshness::Stale,
        Freshness::Error => proto::Freshness::Error,
    }
}

pub(crate) fn cluster_freshness(
    c: &ClusterStatus,
    resource: Option<&str>,
) -> proto::ClusterFreshness {
    let (f, since, message) = c.freshness(resource);
    proto::ClusterFreshness {
        cluster: c.name.to_string(),
        freshness: freshness_proto(f) as i32,
        stale_since: since.map(timestamp),
        message,
    }
}

/// An object for the wire, as JSON text with its identity beside it.
pub(crate) fn object_proto(o: &Object, projection: proto::Projection) -> proto::Object {
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

pub(crate) fn event_type(t: EventType) -> proto::EventType {
    match t {
        EventType::Added => proto::EventType::Added,
        EventType::Modified => proto::EventType::Modified,
        EventType::Deleted => proto::EventType::Deleted,
    }
}

pub(crate) fn stream_state(s: fleetscope_informer::StreamState) -> proto::StreamState {
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
