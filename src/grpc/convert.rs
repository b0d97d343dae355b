//! Proto ↔ domain conversions: requests in (selectors parsed, so a bad one is
//! `INVALID_ARGUMENT` naming the field), answers out.

use std::time::SystemTime;

use fleetscope_model::fleet::{
    ClusterFreshness, ClusterInfo, FleetObject, Freshness, Projection, Query, StreamInfo,
    StreamState,
};
use fleetscope_model::{
    ClusterFilter, ClusterFilterError, EventType, FieldSelector, FleetError, LabelSelector,
};

use crate::proto;

pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

pub(crate) fn duration(d: std::time::Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

/// The cluster filter of a query (or of `ListClusters`).
pub(crate) fn cluster_filter(
    clusters: &[String],
    selector: &str,
) -> Result<ClusterFilter, FleetError> {
    ClusterFilter::parse(clusters, selector).map_err(|e| match e {
        ClusterFilterError::Pattern { .. } => {
            FleetError::InvalidArgument(format!("query.clusters: {e}"))
        }
        ClusterFilterError::Selector(e) => {
            FleetError::InvalidArgument(format!("query.cluster_selector: {e}"))
        }
    })
}

/// A query, its selectors parsed.
pub(crate) fn query(q: &proto::Query) -> Result<Query, FleetError> {
    Ok(Query {
        resource: q.resource.clone(),
        clusters: cluster_filter(&q.clusters, &q.cluster_selector)?,
        namespaces: q.namespaces.clone(),
        labels: LabelSelector::parse(&q.label_selector)
            .map_err(|e| FleetError::InvalidArgument(format!("query.label_selector: {e}")))?,
        fields: FieldSelector::parse(&q.field_selector)
            .map_err(|e| FleetError::InvalidArgument(format!("query.field_selector: {e}")))?,
    })
}

pub(crate) fn projection(p: proto::Projection) -> Projection {
    match p {
        proto::Projection::Metadata => Projection::Metadata,
        _ => Projection::Full,
    }
}

pub(crate) fn freshness(f: Freshness) -> proto::Freshness {
    match f {
        Freshness::Synced => proto::Freshness::Synced,
        Freshness::Syncing => proto::Freshness::Syncing,
        Freshness::Restored => proto::Freshness::Restored,
        Freshness::Stale => proto::Freshness::Stale,
        Freshness::Error => proto::Freshness::Error,
    }
}

pub(crate) fn cluster_freshness(c: ClusterFreshness) -> proto::ClusterFreshness {
    proto::ClusterFreshness {
        cluster: c.cluster.to_string(),
        freshness: freshness(c.freshness) as i32,
        stale_since: c.stale_since.map(timestamp),
        message: c.message,
    }
}

/// The freshness of every cluster an answer drew on.
pub(crate) fn clusters_freshness(clusters: Vec<ClusterFreshness>) -> Vec<proto::ClusterFreshness> {
    clusters.into_iter().map(cluster_freshness).collect()
}

/// An object for the wire, as JSON text with its identity beside it.
pub(crate) fn object(o: FleetObject) -> proto::Object {
    proto::Object {
        cluster: o.key.cluster.to_string(),
        resource: o.key.resource.to_string(),
        namespace: o.key.namespace.to_string(),
        name: o.key.name.to_string(),
        uid: o.uid,
        resource_version: o.resource_version,
        revision: o.revision.0,
        json: o.json,
    }
}

pub(crate) fn event_type(t: EventType) -> proto::EventType {
    match t {
        EventType::Added => proto::EventType::Added,
        EventType::Modified => proto::EventType::Modified,
        EventType::Deleted => proto::EventType::Deleted,
    }
}

pub(crate) fn stream_state(s: StreamState) -> proto::StreamState {
    match s {
        StreamState::Pending => proto::StreamState::Pending,
        StreamState::Listing => proto::StreamState::Listing,
        StreamState::Watching => proto::StreamState::Watching,
        StreamState::Failed => proto::StreamState::Failed,
        StreamState::Forbidden => proto::StreamState::Forbidden,
        StreamState::NotFound => proto::StreamState::NotFound,
    }
}

fn stream(s: StreamInfo) -> proto::ResourceStream {
    proto::ResourceStream {
        resource: s.resource,
        state: stream_state(s.state) as i32,
        object_count: s.object_count,
        resource_version: s.resource_version,
        last_event_time: s.last_event.map(timestamp),
        last_error: s.last_error,
        sync_lag: s.sync_lag.and_then(duration),
    }
}

pub(crate) fn cluster(c: ClusterInfo) -> proto::Cluster {
    proto::Cluster {
        name: c.name.to_string(),
        labels: c.labels.into_iter().collect(),
        server: c.server,
        freshness: freshness(c.freshness.freshness) as i32,
        stale_since: c.freshness.stale_since.map(timestamp),
        last_error: c.last_error,
        kubernetes_version: c.kubernetes_version,
        streams: c.streams.into_iter().map(stream).collect(),
        source: c.source,
        source_loaded_time: Some(timestamp(c.source_loaded)),
    }
}
