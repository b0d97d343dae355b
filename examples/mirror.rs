//! A backend that mirrors one resource type across the whole fleet and follows its
//! changes over gRPC, resuming exactly where it stopped after any disconnect: the
//! Rust twin of `examples/python/mirror.py`, on the `fleetscope-proto` crate's
//! generated client (or generate your own from `proto/` with `tonic-prost-build`).
//!
//! It holds every object's resourceVersion by (cluster, namespace, name) and keeps
//! what it needs to resume: on a single server the revision of the last change or
//! bookmark (`since_revision`), through a router the last bookmark's `position_token`
//! and the position of each change after it (`resume_token`, `resume_positions`).
//! When the position is no longer held (`OUT_OF_RANGE`) it lists again; when the
//! server is away (`UNAVAILABLE`) it waits and resumes.
//!
//! ```sh
//! cargo run --example mirror -- --server http://127.0.0.1:50051 --resource configmaps
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use fleetscope_proto::fleet_client::FleetClient;
use fleetscope_proto::{EventType, Query, StreamPosition, WatchEvent, WatchRequest};
use tonic::Code;

/// Mirrors one resource type of the fleet and follows its changes.
#[derive(Parser)]
struct Args {
    /// fleetscope's gRPC address (a server or a router).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// The resource type.
    #[arg(long, default_value = "configmaps")]
    resource: String,
    /// Stop after this many changes (0: never).
    #[arg(long, default_value_t = 0)]
    changes: usize,
}

/// The objects, and where the stream stands.
#[derive(Default)]
struct Mirror {
    objects: BTreeMap<(String, String, String), String>,
    revision: u64,
    token: String,
    after: BTreeMap<String, StreamPosition>,
    listing: bool,
    changes: usize,
}

impl Mirror {
    /// The Watch that continues from where the mirror stands (or lists afresh).
    fn request(&mut self, resource: &str) -> WatchRequest {
        let mut r = WatchRequest {
            query: Some(Query {
                resource: resource.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        };
        if !self.token.is_empty() {
            r.resume_token.clone_from(&self.token);
            r.resume_positions = self.after.values().cloned().collect();
        } else if self.revision > 0 && !self.listing {
            r.since_revision = self.revision;
        } else {
            self.objects.clear();
            self.listing = true;
            r.send_initial_events = true;
        }
        r
    }

    fn forget_position(&mut self) {
        self.revision = 0;
        self.token.clear();
        self.after.clear();
    }

    fn take(&mut self, e: WatchEvent) {
        let t = e.r#type();
        if let Some(o) = &e.object {
            let key = (o.cluster.clone(), o.namespace.clone(), o.name.clone());
            match t {
                EventType::Added | EventType::Modified => {
                    self.objects.insert(key, o.resource_version.clone());
                }
                EventType::Deleted => {
                    self.objects.remove(&key);
                }
                _ => {}
            }
        }
        match t {
            EventType::InitialEventsEnd => {
                self.listing = false;
                println!("listed: {} objects", self.objects.len());
            }
            EventType::Reset => {
                let cluster = e
                    .position
                    .as_ref()
                    .map(|p| p.cluster.clone())
                    .unwrap_or_default();
                self.objects.retain(|k, _| k.0 != cluster);
            }
            EventType::ClusterStatus => {
                if let Some(c) = &e.cluster {
                    println!("cluster {}: {}", c.cluster, c.message);
                }
            }
            _ => {}
        }
        if matches!(
            t,
            EventType::Added | EventType::Modified | EventType::Deleted
        ) {
            if !self.listing {
                self.changes += 1;
            }
            if let Some(p) = e
                .position
                .as_ref()
                .filter(|p| !self.token.is_empty() && !p.cluster.is_empty())
            {
                self.after.insert(p.cluster.clone(), p.clone());
            }
        }
        if !e.position_token.is_empty() {
            self.token = e.position_token;
            self.after.clear();
        }
        if e.revision > 0 && !self.listing {
            self.revision = e.revision;
        }
    }
}

/// Waits that end by themselves: try again in a moment.
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::ResourceExhausted
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
    )
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut m = Mirror::default();
    loop {
        let status = match follow(&args, &mut m).await {
            Ok(true) => {
                println!(
                    "followed {} changes; holding {} objects",
                    m.changes,
                    m.objects.len()
                );
                return std::process::ExitCode::SUCCESS;
            }
            // The stream ended (the server stopped): resume.
            Ok(false) => continue,
            Err(status) => status,
        };
        if status.code() == Code::OutOfRange {
            println!(
                "position no longer held ({}): listing again",
                status.message()
            );
            m.forget_position();
        } else if retryable(status.code()) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        } else {
            eprintln!("{:?}: {}", status.code(), status.message());
            return std::process::ExitCode::FAILURE;
        }
    }
}

/// Follows one Watch stream; `true` once the changes asked for were followed.
async fn follow(args: &Args, m: &mut Mirror) -> Result<bool, tonic::Status> {
    let mut client = FleetClient::connect(args.server.clone())
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut stream = client.watch(m.request(&args.resource)).await?.into_inner();
    while let Some(e) = stream.message().await? {
        m.take(e);
        if args.changes > 0 && m.changes >= args.changes {
            return Ok(true);
        }
    }
    Ok(false)
}
