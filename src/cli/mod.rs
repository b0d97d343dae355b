//! The `fleetscope get | count | watch | clusters` commands: a gRPC client with
//! kubectl-like output.

// clap turns doc comments into help text: the flag structs are documented by `--help`.
#[allow(missing_docs)]
pub mod args;

use std::fmt::Write as _;
use std::io::Write as _;

use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::proto::fleet_client::FleetClient;
use crate::proto::{
    self, CountRequest, GetRequest, GetStoreRequest, ListClustersRequest, ListRequest, Query,
    WatchRequest,
};

/// A failure of a client command.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached.
    #[error("cannot reach the fleetscope server at {server}")]
    Connect {
        /// The address.
        server: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The server refused the request.
    #[error("{:?}: {}", .0.code(), .0.message())]
    Rpc(Box<tonic::Status>),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Rpc(Box::new(s))
    }
}

/// The URL of a server given as `http://host:port`, or as `host:port` the way grpcurl
/// takes it (plaintext).
pub fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// Connects to a server (`http://host:port`, or `host:port`).
pub async fn connect(server: &str) -> Result<FleetClient<Channel>, ClientError> {
    let server = &server_url(server);
    let endpoint = Channel::from_shared(server.to_string()).map_err(|_| {
        ClientError::from(tonic::Status::invalid_argument(format!(
            "{server:?} is not a URL"
        )))
    })?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| ClientError::Connect {
            server: server.to_string(),
            source,
        })?;
    Ok(FleetClient::new(channel).max_decoding_message_size(256 * 1024 * 1024))
}

/// Formats rows as aligned columns, as kubectl does.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i + 1 == widths.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}   ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

fn age(json: &str) -> String {
    let created = serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| {
            v["metadata"]["creationTimestamp"]
                .as_str()
                .map(str::to_string)
        });
    let Some(created) = created
        .and_then(|c| c.parse::<prost_types::Timestamp>().ok())
        .and_then(|t| std::time::SystemTime::try_from(t).ok())
    else {
        return "<unknown>".into();
    };
    let secs = std::time::SystemTime::now()
        .duration_since(created)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// One JSON object per line.
    Json,
}

fn print(text: &str) {
    let _ = std::io::stdout().write_all(text.as_bytes());
}

/// `get`: one object by name, or a list (every page).
pub async fn get(
    client: &mut FleetClient<Channel>,
    query: Query,
    name: Option<String>,
    output: Output,
) -> Result<(), ClientError> {
    let objects = match name {
        Some(name) => {
            let cluster = query.clusters.first().cloned().unwrap_or_default();
            let r = client
                .get(GetRequest {
                    cluster,
                    resource: query.resource.clone(),
                    namespace: query.namespaces.first().cloned().unwrap_or_default(),
                    name,
                    projection: query.projection,
                })
                .await?
                .into_inner();
            r.object.into_iter().collect::<Vec<_>>()
        }
        None => {
            let mut all = Vec::new();
            let mut token = String::new();
            loop {
                let page = client
                    .list(ListRequest {
                        query: Some(query.clone()),
                        limit: 500,
                        page_token: token,
                    })
                    .await?
                    .into_inner();
                if all.is_empty() {
                    for f in page
                        .clusters
                        .iter()
                        .filter(|f| f.freshness() != proto::Freshness::Synced)
                    {
                        eprintln!(
                            "warning: cluster {} is {:?}: {}",
                            f.cluster,
                            f.freshness(),
                            f.message
                        );
                    }
                }
                all.extend(page.items);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            all
        }
    };
    match output {
        Output::Json => objects.iter().for_each(|o| print(&format!("{}\n", o.json))),
        Output::Table => {
            let rows: Vec<Vec<String>> = objects
                .iter()
                .map(|o| {
                    vec![
                        o.cluster.clone(),
                        o.namespace.clone(),
                        o.name.clone(),
                        age(&o.json),
                    ]
                })
                .collect();
            print(&table(&["CLUSTER", "NAMESPACE", "NAME", "AGE"], &rows));
        }
    }
    Ok(())
}

/// `count`: grouped counts.
pub async fn count(
    client: &mut FleetClient<Channel>,
    query: Query,
    group_by: Vec<String>,
) -> Result<(), ClientError> {
    let r = client
        .count(CountRequest {
            query: Some(query),
            group_by: group_by.clone(),
        })
        .await?
        .into_inner();
    let mut header: Vec<String> = group_by.iter().map(|g| g.to_uppercase()).collect();
    header.push("COUNT".into());
    let mut rows: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| g.key.iter().cloned().chain([g.count.to_string()]).collect())
        .collect();
    if !group_by.is_empty() {
        let mut total = vec![String::new(); group_by.len()];
        total[0] = "TOTAL".into();
        total.push(r.total.to_string());
        rows.push(total);
    } else {
        rows.push(vec![r.total.to_string()]);
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    print(&table(&header, &rows));
    Ok(())
}

/// `watch`: changes as they happen, until interrupted.
pub async fn watch(
    client: &mut FleetClient<Channel>,
    query: Query,
    since: u64,
    initial: bool,
    output: Output,
) -> Result<(), ClientError> {
    let mut stream = client
        .watch(WatchRequest {
            query: Some(query),
            since_revision: since,
            send_initial_events: initial,
            bookmark_interval: None,
        })
        .await?
        .into_inner();
    while let Some(event) = stream.next().await {
        let e = event?;
        let kind = e
            .r#type()
            .as_str_name()
            .trim_start_matches("EVENT_TYPE_")
            .to_string();
        match (&e.object, output) {
            (Some(o), Output::Json) => print(&format!(
                "{{\"type\":\"{kind}\",\"revision\":{},\"object\":{}}}\n",
                e.revision, o.json
            )),
            (Some(o), Output::Table) => print(&format!(
                "{:<10} {:<8} {}/{}/{}\n",
                kind, e.revision, o.cluster, o.namespace, o.name
            )),
            (None, _) => {
                if let Some(c) = &e.cluster {
                    print(&format!(
                        "{kind:<10} {:<8} cluster {} is {}\n",
                        e.revision,
                        c.cluster,
                        c.freshness().as_str_name()
                    ));
                } else if e.r#type() != proto::EventType::Bookmark {
                    print(&format!("{kind:<10} {}\n", e.revision));
                }
            }
        }
    }
    Ok(())
}

fn freshness_name(f: proto::Freshness) -> String {
    f.as_str_name().trim_start_matches("FRESHNESS_").to_string()
}

/// `clusters`: health per cluster and stream.
pub async fn clusters(client: &mut FleetClient<Channel>) -> Result<(), ClientError> {
    let r = client
        .list_clusters(ListClustersRequest::default())
        .await?
        .into_inner();
    let mut rows = Vec::new();
    for c in &r.clusters {
        for s in &c.streams {
            rows.push(vec![
                c.name.clone(),
                freshness_name(c.freshness()),
                s.resource.clone(),
                s.state()
                    .as_str_name()
                    .trim_start_matches("STREAM_STATE_")
                    .to_string(),
                s.object_count.to_string(),
                s.resource_version.clone(),
                s.last_error.clone(),
            ]);
        }
        if c.streams.is_empty() {
            rows.push(vec![
                c.name.clone(),
                freshness_name(c.freshness()),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                c.last_error.clone(),
            ]);
        }
    }
    print(&table(
        &[
            "CLUSTER",
            "FRESHNESS",
            "RESOURCE",
            "STATE",
            "OBJECTS",
            "RV",
            "ERROR",
        ],
        &rows,
    ));
    Ok(())
}

/// `fleetscope store`: the persisted store's figures, one per line.
pub async fn store(client: &mut FleetClient<Channel>) -> Result<(), ClientError> {
    let r = client
        .get_store(GetStoreRequest::default())
        .await?
        .into_inner();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_a_url_or_host_and_port() {
        assert_eq!(server_url("localhost:50051"), "http://localhost:50051");
        assert_eq!(server_url("http://10.0.0.1:1"), "http://10.0.0.1:1");
        assert_eq!(server_url("https://fleet:443"), "https://fleet:443");
    }

    #[test]
    fn tables_align_like_kubectl() {
        let t = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A     LONGER\nxyz   1\n");
    }
}
