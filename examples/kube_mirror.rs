//! A backend that mirrors every configmap of the fleet through fleetscope's
//! Kubernetes API with a kube-rs reflector, unchanged: pointed at the fleet's path
//! (`/clusters/*`), where each name carries its cluster (`CLUSTER:NAME`), the
//! reflector's store holds each object of each cluster once. Its watch resumes from
//! the last resourceVersion it saw, across a restart of fleetscope too (and through a
//! router, from the router's position); a position no longer held is `410 Gone`, and
//! the reflector lists again by itself.
//!
//! ```sh
//! cargo run --example kube_mirror -- --server http://127.0.0.1:50052
//! ```

use clap::Parser;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};

/// Mirrors the fleet's configmaps through the Kubernetes API.
#[derive(Parser)]
struct Args {
    /// fleetscope's Kubernetes API (`--kube-api-listen`), without a path.
    #[arg(long, default_value = "http://127.0.0.1:50052")]
    server: String,
    /// Stop after this many changes (0: never).
    #[arg(long, default_value_t = 0)]
    changes: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let url = format!("{}/clusters/*", args.server.trim_end_matches('/'));
    let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
    let configmaps: kube::Api<ConfigMap> = kube::Api::all(client);
    let (store, writer) = reflector::store();
    let events = reflector(writer, watcher(configmaps, watcher::Config::default()));
    let mut events = std::pin::pin!(events.default_backoff());
    let (mut listed, mut changes) = (false, 0);
    while let Some(e) = events.next().await {
        match e {
            Ok(watcher::Event::InitDone) => {
                listed = true;
                let clusters: std::collections::BTreeSet<String> = store
                    .state()
                    .iter()
                    .filter_map(|cm| {
                        cm.metadata
                            .annotations
                            .as_ref()?
                            .get("fleetscope.io/cluster")
                            .cloned()
                    })
                    .collect();
                println!(
                    "listed: {} objects of {} clusters",
                    store.state().len(),
                    clusters.len()
                );
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) if listed => changes += 1,
            Ok(_) => {}
            // The watcher retries by itself (with backoff); say what happened.
            Err(e) => eprintln!("watch: {e}"),
        }
        if args.changes > 0 && changes >= args.changes {
            println!(
                "followed {changes} changes; holding {} objects",
                store.state().len()
            );
            return Ok(());
        }
    }
    Ok(())
}
