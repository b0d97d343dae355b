//! Proto ↔ domain conversions: requests in (selectors parsed, so a bad one is
//! `INVALID_ARGUMENT` naming the field), answers out; and, for a router, the other
//! way: its requests to replicas out, their answers in.

use std::time::SystemTime;

use fleetscope_model::fleet::{
    ClusterFreshness, ClusterInfo, FleetObject, Freshness, Projection, Query, StreamInfo,
    StreamState, SyncMethod,
};
use fleetscope_model::{
    ClusterFilter, ClusterFilterError, EventType, FieldSelector, FleetError, LabelSelector,
};

use fleetscope_proto as proto;

/// A moment as the API writes it.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

/// A duration as the API writes it; `None` for zero.
pub fn duration(d: std::time::Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

/// The cluster filter of a query (or of `ListClusters`).
pub fn cluster_filter(clusters: &[String], selector: &str) -> Result<ClusterFilter, FleetError> {
    ClusterFilter::parse(clusters, selector).map_err(|e| match e {
        ClusterFilterError::Pattern { .. } => {
            FleetError::InvalidArgument(format!("query.clusters: {e}"))
        }
        ClusterFilterError::Selector(e) => {
            FleetError::InvalidArgument(format!("query.cluster_selector: {e}"))
        }
    })
}

/// The most bytes a selector (label, field or cluster) may have.
pub const MAX_SELECTOR_BYTES: usize = 16 * 1024;
/// The most terms a selector may have: requirements, each value of a set counted.
pub const MAX_SELECTOR_TERMS: usize = 256;
/// The most clusters (names or globs) or namespaces a query may name.
pub const MAX_NAMES: usize = 1024;
/// The most bytes a name (resource type, cluster, namespace, object) may have.
pub const MAX_NAME_BYTES: usize = 512;

fn over(field: &str, what: String) -> FleetError {
    FleetError::InvalidArgument(format!("{field}: {what}"))
}

/// Checks a selector's size before it is parsed.
fn sized(field: &str, selector: &str) -> Result<(), FleetError> {
    if selector.len() > MAX_SELECTOR_BYTES {
        return Err(over(
            field,
            format!(
                "{} bytes, more than the limit of {MAX_SELECTOR_BYTES}",
                selector.len()
            ),
        ));
    }
    Ok(())
}

fn termed(field: &str, terms: usize) -> Result<(), FleetError> {
    if terms > MAX_SELECTOR_TERMS {
        return Err(over(
            field,
            format!("{terms} terms, more than the limit of {MAX_SELECTOR_TERMS}"),
        ));
    }
    Ok(())
}

/// Terms of a label selector: each requirement, and each value of a set.
fn label_terms(s: &LabelSelector) -> usize {
    use fleetscope_model::selector::Requirement;
    s.requirements()
        .iter()
        .map(|r| match r {
            Requirement::In(_, v) | Requirement::NotIn(_, v) => v.len().max(1),
            _ => 1,
        })
        .sum()
}

/// A list of names or globs within [`MAX_NAMES`] entries of [`MAX_NAME_BYTES`].
pub fn names(field: &str, names: &[String]) -> Result<(), FleetError> {
    if names.len() > MAX_NAMES {
        return Err(over(
            field,
            format!(
                "{} entries, more than the limit of {MAX_NAMES}",
                names.len()
            ),
        ));
    }
    if let Some(long) = names.iter().find(|n| n.len() > MAX_NAME_BYTES) {
        return Err(over(
            field,
            format!(
                "an entry of {} bytes, more than the limit of {MAX_NAME_BYTES}",
                long.len()
            ),
        ));
    }
    Ok(())
}

/// A name within [`MAX_NAME_BYTES`].
pub fn name(field: &str, name: &str) -> Result<(), FleetError> {
    names(field, std::slice::from_ref(&name.to_string()))
}

/// A query, its selectors parsed, within the bounds of one request.
pub fn query(q: &proto::Query) -> Result<Query, FleetError> {
    name("query.resource", &q.resource)?;
    names("query.clusters", &q.clusters)?;
    names("query.namespaces", &q.namespaces)?;
    sized("query.cluster_selector", &q.cluster_selector)?;
    sized("query.label_selector", &q.label_selector)?;
    sized("query.field_selector", &q.field_selector)?;
    let clusters = cluster_filter(&q.clusters, &q.cluster_selector)?;
    // Parsed once more to count its terms: a cluster filter keeps its selector whole.
    if let Ok(selector) = LabelSelector::parse(&q.cluster_selector) {
        termed("query.cluster_selector", label_terms(&selector))?;
    }
    let labels = LabelSelector::parse(&q.label_selector)
        .map_err(|e| FleetError::InvalidArgument(format!("query.label_selector: {e}")))?;
    termed("query.label_selector", label_terms(&labels))?;
    let fields = FieldSelector::parse(&q.field_selector)
        .map_err(|e| FleetError::InvalidArgument(format!("query.field_selector: {e}")))?;
    termed("query.field_selector", fields.requirements().len())?;
    Ok(Query {
        resource: q.resource.clone(),
        clusters,
        namespaces: q.namespaces.clone(),
        labels,
        fields,
    })
}

/// The projection a request asks for.
pub fn projection(p: proto::Projection) -> Projection {
    match p {
        proto::Projection::Metadata => Projection::Metadata,
        _ => Projection::Full,
    }
}

/// A cluster's freshness as the API writes it.
pub fn freshness(f: Freshness) -> proto::Freshness {
    match f {
        Freshness::Synced => proto::Freshness::Synced,
        Freshness::Syncing => proto::Freshness::Syncing,
        Freshness::Restored => proto::Freshness::Restored,
        Freshness::Stale => proto::Freshness::Stale,
        Freshness::Error => proto::Freshness::Error,
    }
}

/// A cluster's freshness, with why, as the API writes it.
pub fn cluster_freshness(c: ClusterFreshness) -> proto::ClusterFreshness {
    proto::ClusterFreshness {
        cluster: c.cluster.to_string(),
        freshness: freshness(c.freshness) as i32,
        stale_since: c.stale_since.map(timestamp),
        message: c.message,
    }
}

/// The freshness of every cluster an answer drew on.
pub fn clusters_freshness(clusters: Vec<ClusterFreshness>) -> Vec<proto::ClusterFreshness> {
    clusters.into_iter().map(cluster_freshness).collect()
}

/// An object for the wire, as JSON text with its identity beside it.
pub fn object(o: FleetObject) -> proto::Object {
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

/// An event type as the API writes it.
pub fn event_type(t: EventType) -> proto::EventType {
    match t {
        EventType::Added => proto::EventType::Added,
        EventType::Modified => proto::EventType::Modified,
        EventType::Deleted => proto::EventType::Deleted,
    }
}

/// A stream's state as the API writes it.
pub fn stream_state(s: StreamState) -> proto::StreamState {
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
        sync_method: s
            .sync_method
            .map_or(proto::SyncMethod::Unspecified, |m| match m {
                SyncMethod::WatchList => proto::SyncMethod::WatchList,
                SyncMethod::ListFromCache => proto::SyncMethod::ListFromCache,
                SyncMethod::ListConsistent => proto::SyncMethod::ListConsistent,
                SyncMethod::Resumed => proto::SyncMethod::Resumed,
            }) as i32,
        watch_list_fallback: s.watch_list_fallback,
    }
}

/// A domain query as the wire carries it, for `projection`: the inverse of
/// [`query`] (its names and globs as given, its cluster selector kept).
pub fn query_out(q: &Query, projection: Projection) -> proto::Query {
    proto::Query {
        clusters: q.clusters.patterns(),
        cluster_selector: q.clusters.selector().to_string(),
        resource: q.resource.clone(),
        namespaces: q.namespaces.clone(),
        label_selector: q.labels.to_string(),
        field_selector: q.fields.to_string(),
        projection: match projection {
            Projection::Full => proto::Projection::Unspecified,
            Projection::Metadata => proto::Projection::Metadata,
        } as i32,
    }
}

fn time_in(t: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    t.and_then(|t| SystemTime::try_from(t).ok())
}

/// A freshness as a replica wrote it (an unknown value reads as unknown).
pub fn freshness_in(f: i32) -> Freshness {
    match proto::Freshness::try_from(f) {
        Ok(proto::Freshness::Synced) => Freshness::Synced,
        Ok(proto::Freshness::Restored) => Freshness::Restored,
        Ok(proto::Freshness::Syncing) => Freshness::Syncing,
        Ok(proto::Freshness::Stale) => Freshness::Stale,
        _ => Freshness::Error,
    }
}

/// A cluster's freshness as a replica wrote it.
pub fn cluster_freshness_in(c: proto::ClusterFreshness) -> ClusterFreshness {
    ClusterFreshness {
        cluster: c.cluster.as_str().into(),
        freshness: freshness_in(c.freshness),
        stale_since: time_in(c.stale_since),
        message: c.message,
    }
}

/// An object as a replica returned it.
pub fn object_in(o: proto::Object) -> FleetObject {
    FleetObject {
        key: fleetscope_model::ObjectKey::new(
            &o.resource,
            &o.cluster.as_str().into(),
            &o.namespace,
            &o.name,
        ),
        revision: fleetscope_model::Revision(o.revision),
        uid: o.uid,
        resource_version: o.resource_version,
        json: o.json,
    }
}

fn stream_in(s: proto::ResourceStream) -> StreamInfo {
    StreamInfo {
        resource: s.resource,
        state: match proto::StreamState::try_from(s.state) {
            Ok(proto::StreamState::Listing) => StreamState::Listing,
            Ok(proto::StreamState::Watching) => StreamState::Watching,
            Ok(proto::StreamState::Failed) => StreamState::Failed,
            Ok(proto::StreamState::Forbidden) => StreamState::Forbidden,
            Ok(proto::StreamState::NotFound) => StreamState::NotFound,
            _ => StreamState::Pending,
        },
        object_count: s.object_count,
        resource_version: s.resource_version,
        last_event: time_in(s.last_event_time),
        last_error: s.last_error,
        sync_lag: s
            .sync_lag
            .and_then(|d| std::time::Duration::try_from(d).ok()),
        sync_method: match proto::SyncMethod::try_from(s.sync_method) {
            Ok(proto::SyncMethod::WatchList) => Some(SyncMethod::WatchList),
            Ok(proto::SyncMethod::ListFromCache) => Some(SyncMethod::ListFromCache),
            Ok(proto::SyncMethod::ListConsistent) => Some(SyncMethod::ListConsistent),
            Ok(proto::SyncMethod::Resumed) => Some(SyncMethod::Resumed),
            _ => None,
        },
        watch_list_fallback: s.watch_list_fallback,
    }
}

/// A cluster as a replica reports it.
pub fn cluster_in(c: proto::Cluster) -> ClusterInfo {
    let name: fleetscope_model::ClusterName = c.name.as_str().into();
    let stale_since = time_in(c.stale_since);
    ClusterInfo {
        freshness: ClusterFreshness {
            cluster: name.clone(),
            freshness: freshness_in(c.freshness),
            stale_since,
            message: c.last_error.clone(),
        },
        name,
        labels: c.labels.into_iter().collect(),
        server: c.server,
        last_error: c.last_error,
        kubernetes_version: c.kubernetes_version,
        streams: c.streams.into_iter().map(stream_in).collect(),
        source: c.source,
        source_loaded: time_in(c.source_loaded_time).unwrap_or(SystemTime::UNIX_EPOCH),
        owners: c.owners,
    }
}

/// A collected type as a replica reports it.
pub fn resource_type_in(t: proto::ResourceType) -> fleetscope_model::fleet::ResourceTypeInfo {
    let suffix = format!(".{}", t.group);
    let plural = match t.group.as_str() {
        "" => t.name.as_str(),
        _ => t.name.strip_suffix(&suffix).unwrap_or(&t.name),
    };
    fleetscope_model::fleet::ResourceTypeInfo {
        resource: fleetscope_model::ResourceType::new(
            &t.group,
            &t.version,
            plural,
            &t.kind,
            t.namespaced,
        ),
        short_names: t.short_names,
        clusters: t
            .clusters
            .into_iter()
            .map(|c| (c.cluster.as_str().into(), c.count))
            .collect(),
    }
}

/// A cluster as the API writes it.
pub fn cluster(c: ClusterInfo) -> proto::Cluster {
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
        owners: c.owners,
    }
}

/// An input of the server that reloads, and how its last reload went.
pub fn input(i: &fleetscope_model::inputs::InputStatus) -> proto::ServerInput {
    proto::ServerInput {
        name: i.input.to_string(),
        files: i.files.iter().map(|f| f.display().to_string()).collect(),
        loaded_time: Some(timestamp(i.loaded_at)),
        reloads: i.reloads,
        error: i.error.as_ref().map(|(e, _)| e.clone()).unwrap_or_default(),
        error_time: i.error.as_ref().map(|(_, at)| timestamp(*at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(q: proto::Query) -> String {
        match query(&q) {
            Err(FleetError::InvalidArgument(m)) => m,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    fn pods(f: impl FnOnce(&mut proto::Query)) -> proto::Query {
        let mut q = proto::Query {
            resource: "pods".into(),
            ..Default::default()
        };
        f(&mut q);
        q
    }

    #[test]
    fn selectors_and_name_lists_are_bounded_and_the_error_names_the_limit() {
        let m = refused(pods(|q| q.field_selector = "a=b,".repeat(300_000)));
        assert!(
            m.starts_with("query.field_selector: 1200000 bytes") && m.contains("16384"),
            "{m}"
        );
        let m = refused(pods(|q| {
            q.field_selector = (0..300)
                .map(|i| format!("f{i}=v"))
                .collect::<Vec<_>>()
                .join(",")
        }));
        assert!(m.contains("300 terms") && m.contains("256"), "{m}");
        let m = refused(pods(|q| {
            let values: Vec<String> = (0..300).map(|i| format!("r{i}")).collect();
            q.cluster_selector = format!("region in ({})", values.join(","));
        }));
        assert!(
            m.starts_with("query.cluster_selector") && m.contains("256"),
            "{m}"
        );
        let m = refused(pods(|q| {
            let values: Vec<String> = (0..300).map(|i| format!("v{i}")).collect();
            q.label_selector = format!("app in ({})", values.join(","));
        }));
        assert!(m.starts_with("query.label_selector: 300 terms"), "{m}");
        let m = refused(pods(|q| q.namespaces = vec!["n".into(); 2000]));
        assert!(m.starts_with("query.namespaces: 2000 entries"), "{m}");
        let m = refused(pods(|q| q.clusters = vec!["c".repeat(1000)]));
        assert!(
            m.starts_with("query.clusters: an entry of 1000 bytes"),
            "{m}"
        );
        let m = refused(pods(|q| q.resource = "p".repeat(600)));
        assert!(m.starts_with("query.resource"), "{m}");
        assert!(query(&pods(|q| q.label_selector = "app in (a,b),tier=web".into())).is_ok());
    }
}
