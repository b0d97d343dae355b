//! Several simulated clusters on loopback, with a workload, churn and controllers each, and the
//! kubeconfig that reaches them: what `fleetscope sim` and `fleetscope demo` run.

use std::io;
use std::path::Path;

use base64::Engine;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::{Cluster, ClusterConfig};
use crate::server::SimServer;
use crate::workload::{Workload, WorkloadSpec};

/// What to run.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// Cluster names; each becomes a kubeconfig context.
    pub names: Vec<String>,
    /// About how many objects per cluster.
    pub objects: usize,
    /// Changes per second per cluster.
    pub churn: f64,
    /// How many resourceVersions each cluster's watch cache trails its storage.
    pub cache_lag: u64,
    /// How each cluster answers streaming lists.
    pub watch_list: crate::cluster::WatchListSupport,
    /// How long each cluster waits before answering a request (a distant API server).
    pub latency: std::time::Duration,
}

impl FleetSpec {
    /// `sim-1` … `sim-N`.
    pub fn numbered(clusters: usize, objects: usize, churn: f64) -> Self {
        Self {
            names: (1..=clusters).map(|i| format!("sim-{i}")).collect(),
            objects,
            churn,
            cache_lag: 0,
            watch_list: crate::cluster::WatchListSupport::Served,
            latency: std::time::Duration::ZERO,
        }
    }
}

/// Running simulated clusters.
pub struct SimFleet {
    servers: Vec<SimServer>,
    /// Churn and controllers.
    churn: Vec<JoinHandle<()>>,
    cancel: CancellationToken,
}

/// One kubeconfig context: a name, a server URL and a bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// The context, cluster and user name.
    pub name: String,
    /// `http://127.0.0.1:PORT`.
    pub server: String,
    /// The bearer token.
    pub token: String,
    /// The CA certificate (PEM) to trust for an `https` server.
    pub ca_pem: Option<String>,
}

/// A kubeconfig (as JSON, which every kubeconfig reader accepts) with one context per entry;
/// the first is current.
pub fn kubeconfig(contexts: &[Context]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "current-context": contexts.first().map(|c| c.name.clone()).unwrap_or_default(),
        "clusters": contexts.iter().map(|c| {
            let mut cluster = json!({"server": c.server});
            if let Some(pem) = &c.ca_pem {
                cluster["certificate-authority-data"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
            }
            json!({"name": c.name, "cluster": cluster})
        }).collect::<Vec<_>>(),
        "users": contexts.iter().map(|c| json!({"name": c.name, "user": {"token": c.token}})).collect::<Vec<_>>(),
        "contexts": contexts.iter().map(|c| json!({"name": c.name, "context": {"cluster": c.name, "user": c.name}})).collect::<Vec<_>>(),
    })
}

/// Writes [`kubeconfig`] to a file, readable by its owner only (it holds tokens).
/// The file appears whole (written beside it, then renamed over it): a reader that
/// finds it, or follows it, never reads half of it.
pub fn write_kubeconfig(path: &Path, contexts: &[Context]) -> io::Result<()> {
    let text = serde_json::to_string_pretty(&kubeconfig(contexts)).map_err(io::Error::other)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
    let mut partial = name.to_os_string();
    partial.push(".partial");
    let partial = path.with_file_name(partial);
    std::fs::write(&partial, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&partial, path)
}

impl SimFleet {
    /// Starts the clusters on free loopback ports, populates them and starts their
    /// controllers and churn.
    pub async fn start(spec: &FleetSpec) -> io::Result<Self> {
        let cancel = CancellationToken::new();
        let mut servers = Vec::new();
        let mut churn = Vec::new();
        for (i, name) in spec.names.iter().enumerate() {
            let mut config = ClusterConfig::new(name);
            config.cache_lag = spec.cache_lag;
            config.latency = spec.latency;
            config.watch_list = spec.watch_list;
            let cluster = Cluster::new(config);
            let workload =
                Workload::populate(&cluster, &WorkloadSpec::new(spec.objects, i as u64 + 1))
                    .map_err(|e| io::Error::other(format!("populating {name}: {e}")))?;
            let server = SimServer::start_local(cluster.clone()).await?;
            let span = tracing::info_span!("sim_controllers", cluster = %name);
            churn.push(tokio::spawn(
                crate::controllers::run_controllers(cluster.clone(), cancel.child_token())
                    .instrument(span),
            ));
            let span = tracing::info_span!("sim_churn", cluster = %name);
            churn.push(tokio::spawn(
                workload
                    .churn(cluster, spec.churn, cancel.child_token())
                    .instrument(span),
            ));
            servers.push(server);
        }
        Ok(Self {
            servers,
            churn,
            cancel,
        })
    }

    /// The served clusters.
    pub fn servers(&self) -> &[SimServer] {
        &self.servers
    }

    /// One context per cluster.
    pub fn contexts(&self) -> Vec<Context> {
        self.servers
            .iter()
            .map(|s| Context {
                name: s.cluster().name().to_string(),
                server: s.url(),
                token: s.cluster().admin_token(),
                ca_pem: s.ca_pem().map(str::to_string),
            })
            .collect()
    }

    /// Writes a kubeconfig with a context per cluster.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        write_kubeconfig(path, &self.contexts())
    }

    /// Stops churn and every server.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        for task in self.churn {
            let _ = task.await;
        }
        for server in self.servers {
            server.shutdown().await;
        }
    }
}
