//! `fleetscope clusters` and `store`: what the server reports of each cluster, its
//! streams and inputs, and of its store.

use std::fmt::Write as _;

use super::args;
use super::connect::{Client, ClientError};
use super::output::{self};
use super::printing::{
    duration_text, freshness_name, owners_text, print, state_name, sync_method_name,
};
use fleetscope_proto::{GetStoreRequest, ListClustersRequest, ListClustersResponse};

/// `clusters`: one row per cluster (freshness, lag, objects, labels); with `-o wide`
/// one per stream; `-o json` everything.
pub async fn clusters(client: &mut Client, args: args::ClustersArgs) -> Result<(), ClientError> {
    let r = client
        .list_clusters(ListClustersRequest::default())
        .await?
        .into_inner();
    if args.output == "json" {
        print(&output::to_json(&clusters_json(&r)));
        return Ok(());
    }
    let (header, rows) = if args.output == "wide" {
        stream_rows(&r)
    } else {
        cluster_rows(&r)
    };
    print(&output::align(Some(&header), &rows));
    if !r.sources_error.is_empty() {
        eprintln!(
            "warning: the last reload failed (the configuration before it stays in force): {}",
            r.sources_error
        );
    }
    // The configuration's and the kubeconfigs' failures are in sources_error.
    for i in r.inputs.iter().filter(|i| !i.error.is_empty()) {
        if !matches!(i.name.as_str(), "config" | "sources") {
            eprintln!(
                "warning: the last reload of {} failed (the version before it stays in force): {}",
                i.name, i.error
            );
        }
    }
    Ok(())
}

/// Everything `ListClusters` said, as JSON.
fn clusters_json(r: &ListClustersResponse) -> serde_json::Value {
    let clusters: Vec<serde_json::Value> = r.clusters.iter().map(|c| {
        let streams: Vec<serde_json::Value> = c.streams.iter().map(|s| serde_json::json!({
            "resource": s.resource, "state": state_name(s.state()), "objects": s.object_count.to_string(),
            "resourceVersion": s.resource_version, "lastError": s.last_error,
            "syncLagSeconds": s.sync_lag.as_ref().map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9),
            "syncMethod": sync_method_name(s.sync_method()), "watchListFallback": s.watch_list_fallback,
        })).collect();
        let labels: std::collections::BTreeMap<&String, &String> = c.labels.iter().collect();
        serde_json::json!({
            "name": c.name, "freshness": freshness_name(c.freshness()), "labels": labels,
            "server": c.server, "kubernetesVersion": c.kubernetes_version, "source": c.source,
            "lastError": c.last_error, "streams": streams, "owners": c.owners,
        })
    }).collect();
    let mut doc = serde_json::json!({"clusters": clusters});
    if !r.sources_error.is_empty() {
        doc["sourcesError"] = r.sources_error.clone().into();
    }
    let inputs: Vec<serde_json::Value> = r.inputs.iter().map(|i| serde_json::json!({
        "name": i.name, "files": i.files, "reloads": i.reloads.to_string(),
        "loadedTime": i.loaded_time.as_ref().and_then(|t| jiff::Timestamp::new(t.seconds, t.nanos).ok()).map(|t| t.to_string()),
        "error": i.error,
    })).collect();
    if !inputs.is_empty() {
        doc["inputs"] = inputs.into();
    }
    doc
}

/// `-o wide`: one row per stream (a cluster with none, one row of its own).
fn stream_rows(r: &ListClustersResponse) -> (Vec<String>, Vec<Vec<String>>) {
    let mut rows = Vec::new();
    for c in &r.clusters {
        for s in &c.streams {
            rows.push(vec![
                c.name.clone(),
                freshness_name(c.freshness()),
                owners_text(&c.owners),
                s.resource.clone(),
                state_name(s.state()),
                s.object_count.to_string(),
                duration_text(s.sync_lag.as_ref()),
                s.resource_version.clone(),
                sync_method_name(s.sync_method()),
                if s.last_error.is_empty() && !s.watch_list_fallback.is_empty() {
                    format!("listed: {}", s.watch_list_fallback)
                } else {
                    s.last_error.clone()
                },
            ]);
        }
        if c.streams.is_empty() {
            let mut row = vec![
                c.name.clone(),
                freshness_name(c.freshness()),
                owners_text(&c.owners),
            ];
            row.extend(std::iter::repeat_n(String::new(), 6));
            row.push(c.last_error.clone());
            rows.push(row);
        }
    }
    let header = [
        "CLUSTER",
        "FRESHNESS",
        "OWNERS",
        "RESOURCE",
        "STATE",
        "OBJECTS",
        "LAG",
        "RV",
        "SYNCED-BY",
        "ERROR",
    ];
    (header.map(String::from).to_vec(), rows)
}

/// One row per cluster: its streams summed, its largest lag, its first error.
fn cluster_rows(r: &ListClustersResponse) -> (Vec<String>, Vec<Vec<String>>) {
    let labels_text = |l: &std::collections::HashMap<String, String>| {
        let mut v: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
        v.sort();
        if v.is_empty() {
            "<none>".into()
        } else {
            v.join(",")
        }
    };
    let mut rows = Vec::new();
    for c in &r.clusters {
        let objects: u64 = c.streams.iter().map(|s| s.object_count).sum();
        let lag = c
            .streams
            .iter()
            .filter_map(|s| s.sync_lag.as_ref())
            .max_by_key(|d| (d.seconds, d.nanos));
        let error = if c.last_error.is_empty() {
            c.streams
                .iter()
                .find(|s| !s.last_error.is_empty())
                .map(|s| format!("{}: {}", s.resource, s.last_error))
                .unwrap_or_default()
        } else {
            c.last_error.clone()
        };
        rows.push(vec![
            c.name.clone(),
            freshness_name(c.freshness()),
            c.streams.len().to_string(),
            objects.to_string(),
            duration_text(lag),
            c.kubernetes_version.clone(),
            labels_text(&c.labels),
            error,
        ]);
    }
    let header = [
        "CLUSTER",
        "FRESHNESS",
        "STREAMS",
        "OBJECTS",
        "LAG",
        "VERSION",
        "LABELS",
        "ERROR",
    ];
    (header.map(String::from).to_vec(), rows)
}

/// The names of the clusters the server serves the caller.
pub async fn cluster_names(client: &mut Client) -> Result<Vec<String>, ClientError> {
    let r = client.list_clusters(ListClustersRequest::default()).await?;
    Ok(r.into_inner()
        .clusters
        .into_iter()
        .map(|c| c.name)
        .collect())
}

/// The version the server says it is (its `fleetscope-version` header), asked with
/// the cheapest call there is.
pub async fn server_version(client: &mut Client) -> Result<String, ClientError> {
    let r = client
        .list_resource_types(fleetscope_proto::ListResourceTypesRequest::default())
        .await?;
    Ok(r.metadata()
        .get(fleetscope_proto::VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or_else(
            || "unknown (the server does not say)".to_string(),
            str::to_string,
        ))
}

/// `fleetscope store`: the persisted store's figures, one per line.
pub async fn store(client: &mut Client, args: args::StoreArgs) -> Result<(), ClientError> {
    let r = client
        .get_store(GetStoreRequest::default())
        .await?
        .into_inner();
    if args.output == "json" {
        let ms = |d: &Option<prost_types::Duration>| {
            d.as_ref()
                .map_or(0.0, |d| d.seconds as f64 * 1e3 + f64::from(d.nanos) / 1e6)
        };
        print(&output::to_json(&serde_json::json!({
            "persisted": r.persisted, "sizeOnDiskBytes": r.size_on_disk_bytes.to_string(),
            "pendingChanges": r.pending_changes.to_string(), "writes": r.flushes.to_string(),
            "lastWriteMs": ms(&r.last_flush), "longestWriteMs": ms(&r.max_flush),
            "eventsWritten": r.events_written.to_string(), "eventsInLog": r.logged_events.to_string(),
            "snapshots": r.snapshots.to_string(), "compactions": r.compactions.to_string(),
            "lastCompactionMs": ms(&r.last_compaction), "lastError": r.last_error,
            "routerOfRing": r.router_of_ring,
        })));
        return Ok(());
    }
    if !r.router_of_ring.is_empty() {
        print(&format!(
            "a router (of ring {}) holds no store: each replica keeps its own; ask a replica with --server\n",
            r.router_of_ring
        ));
        return Ok(());
    }
    if !r.persisted {
        print("in memory only: nothing is persisted\n");
        return Ok(());
    }
    let ms = |d: Option<prost_types::Duration>| {
        d.map_or(0.0, |d| d.seconds as f64 * 1e3 + f64::from(d.nanos) / 1e6)
    };
    let rows = [
        (
            "size on disk",
            format!("{:.1} MB", r.size_on_disk_bytes as f64 / 1e6),
        ),
        ("pending changes", r.pending_changes.to_string()),
        ("writes", r.flushes.to_string()),
        ("last write", format!("{:.1} ms", ms(r.last_flush))),
        ("longest write", format!("{:.1} ms", ms(r.max_flush))),
        ("events written", r.events_written.to_string()),
        ("events in the log", r.logged_events.to_string()),
        ("snapshots", r.snapshots.to_string()),
        ("compactions", r.compactions.to_string()),
        (
            "last compaction",
            format!("{:.1} ms", ms(r.last_compaction)),
        ),
        ("last error", r.last_error),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{:<18} {v}", format!("{k}:"));
    }
    print(&out);
    Ok(())
}
