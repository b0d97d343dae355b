//! Shared set-up for end-to-end tests: simulated clusters on loopback, the real engine
//! and server over them, and a real gRPC client.
#![allow(dead_code, clippy::unwrap_used)]

pub mod eventually;
mod kubectl;
pub mod process;
pub use kubectl::Kubectl;
pub mod subscriber;

pub use eventually::{eventually, eventually_blocking, eventually_within, with_log};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fleetscope::engine::{Engine, EngineConfig};
use fleetscope::grpc::{FleetService, ServiceConfig};
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{self, ListClustersRequest};
use fleetscope::{server, sources};
use fleetscope_sim::{FleetSpec, SimFleet};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Generous bound for anything a test waits on.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub struct Harness {
    pub fleet: SimFleet,
    pub kubeconfig: PathBuf,
    pub addr: SocketAddr,
    pub engine: std::sync::Arc<Engine>,
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<ServerTask>,
}

/// The Fleet service's default settings, page tokens signed with a fresh key.
pub fn service_config() -> ServiceConfig {
    ServiceConfig::new(fleetscope::grpc::TokenKey::random().expect("the system's random generator"))
}

/// Engine settings for tests: quick retries, so faults heal within the patience bound.
pub fn test_config(resources: &[&str]) -> EngineConfig {
    let mut config = EngineConfig {
        resources: resources.iter().map(|s| s.to_string()).collect(),
        ..EngineConfig::default()
    };
    config.stream.backoff_start = Duration::from_millis(50);
    config.stream.backoff_cap = Duration::from_millis(500);
    config.stream.forbidden_retry = Duration::from_millis(300);
    config.stream.page_size = 100;
    // First lists reach the index in parts of a few objects, as large ones do.
    config.stream.list_part = 3;
    config.rediscovery = Duration::from_millis(500);
    config
}

impl Harness {
    /// Simulated clusters (no churn), the engine and the server over them.
    pub async fn start(clusters: usize, objects: usize) -> Self {
        Self::start_with(
            FleetSpec::numbered(clusters, objects, 0.0),
            test_config(&["pods", "configmaps", "deployments.apps"]),
            service_config(),
        )
        .await
    }

    pub async fn start_with(spec: FleetSpec, config: EngineConfig, service: ServiceConfig) -> Self {
        Self::start_full(spec, config, service, None).await
    }

    /// Like `start_with`, keeping state in a sled store in `data_dir`.
    pub async fn start_persistent(
        spec: FleetSpec,
        config: EngineConfig,
        data_dir: &std::path::Path,
    ) -> Self {
        Self::start_full(spec, config, service_config(), Some(data_dir)).await
    }

    async fn start_full(
        spec: FleetSpec,
        config: EngineConfig,
        service: ServiceConfig,
        data_dir: Option<&std::path::Path>,
    ) -> Self {
        let fleet = SimFleet::start(&spec)
            .await
            .expect("simulated clusters start");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        fleet.write_kubeconfig(&kubeconfig).unwrap();
        let (engine, addr, stop, task) = launch(&kubeconfig, config, service, data_dir, &[]).await;
        Self {
            fleet,
            kubeconfig,
            addr,
            engine,
            _dir: dir,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts the engine and the server over the fleet (contexts matching `contexts`,
    /// all when empty), with a store in `data_dir` if given.
    pub async fn start_node(
        &mut self,
        config: EngineConfig,
        service: ServiceConfig,
        data_dir: Option<&std::path::Path>,
        contexts: &[&str],
    ) {
        let (engine, addr, stop, task) =
            launch(&self.kubeconfig, config, service, data_dir, contexts).await;
        self.engine = engine;
        self.addr = addr;
        self.stop = Some(stop);
        self.task = Some(task);
    }

    /// Stops the server and the engine gracefully (flushing the store), keeping the fleet.
    pub async fn stop_node(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("server stops")
                .expect("task")
                .expect("server ran cleanly");
        }
        self.engine.shutdown(Duration::from_secs(10)).await;
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A gRPC channel to the server.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .expect("server reachable")
    }

    pub async fn client(&self) -> FleetClient<Channel> {
        FleetClient::new(self.channel().await)
    }

    pub fn cluster(&self, i: usize) -> &fleetscope_sim::Cluster {
        self.fleet.servers()[i].cluster()
    }

    /// Waits until every stream of every cluster is watching (ListClusters says so).
    pub async fn synced(&self) {
        self.wait_clusters(|cs| {
            cs.iter()
                .all(|c| c.freshness() == proto::Freshness::Synced && !c.streams.is_empty())
        })
        .await;
    }

    /// Polls ListClusters until `cond` holds, within the patience bound.
    pub async fn wait_clusters(
        &self,
        cond: impl Fn(&[proto::Cluster]) -> bool,
    ) -> Vec<proto::Cluster> {
        let mut client = self.client().await;
        wait_for_clusters(&mut client, "the clusters reach the expected state", |r| {
            cond(&r.clusters)
        })
        .await
        .clusters
    }

    /// Waits until the index holds `n` objects matching a query.
    pub async fn wait_count(&self, query: proto::Query, n: u64) {
        let mut client = self.client().await;
        eventually(format!("a count of {n}"), async || {
            let total = client
                .count(proto::CountRequest {
                    query: Some(query.clone()),
                    group_by: vec![],
                })
                .await
                .unwrap()
                .into_inner()
                .total;
            if total == n { Ok(()) } else { Err(total) }
        })
        .await
    }

    /// Stops the server and the engine and waits for them to finish cleanly.
    pub async fn shutdown(mut self) {
        self.stop_node().await;
        self.fleet.shutdown().await;
    }
}

type ServerTask = JoinHandle<Result<(), server::ServerError>>;

/// The engine (over the kubeconfig's contexts matching `contexts`, all when empty, with a
/// store in `data_dir` if given) and a server over it on a free loopback port.
async fn launch(
    kubeconfig: &std::path::Path,
    config: EngineConfig,
    service: ServiceConfig,
    data_dir: Option<&std::path::Path>,
    contexts: &[&str],
) -> (
    std::sync::Arc<Engine>,
    SocketAddr,
    oneshot::Sender<()>,
    ServerTask,
) {
    let contexts: Vec<String> = contexts.iter().map(|s| s.to_string()).collect();
    let resolved = sources::resolve(&[kubeconfig.to_path_buf()], &contexts).unwrap();
    let listener = server::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let engine = match data_dir {
        Some(d) => {
            let opened = fleetscope_store::SledStore::open(d).expect("store opens");
            Engine::start_with_store(
                resolved,
                config,
                std::sync::Arc::new(opened.store),
                opened.loaded,
            )
        }
        None => Engine::start(resolved, config),
    };
    let engine = std::sync::Arc::new(engine);
    let (stop, stopped) = oneshot::channel::<()>();
    let service = FleetService::new(engine.clone(), service, engine.cancelled());
    let cancel = engine.cancelled();
    let ready = {
        let engine = engine.clone();
        async move { engine.wait_ready().await }
    };
    let task = tokio::spawn(server::serve(listener, service, ready, async move {
        let _ = stopped.await;
        cancel.cancel();
    }));
    (engine, addr, stop, task)
}

/// Polls gRPC health (the Fleet service) at `url` until it reports SERVING; returns
/// every status seen before, in order. Connection failures are retried: the server
/// may still be binding.
pub async fn wait_serving(url: &str) -> Vec<i32> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let mut seen = Vec::new();
    eventually(format!("{url} reports SERVING"), async || {
        if let Ok(channel) = Channel::from_shared(url.to_string())
            .unwrap()
            .connect()
            .await
            && let Ok(reply) = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: "fleetscope.v1.Fleet".into(),
                })
                .await
        {
            let status = reply.into_inner().status;
            if status == ServingStatus::Serving as i32 {
                return Ok(());
            }
            seen.push(status);
        }
        Err(seen.clone())
    })
    .await;
    seen
}

/// The simulated clusters' objects of a type at their latest resourceVersion:
/// (cluster, namespace, name) → resourceVersion.
pub fn truth(
    fleet: &SimFleet,
    resource: &str,
) -> std::collections::BTreeMap<(String, String, String), String> {
    let mut out = std::collections::BTreeMap::new();
    for s in fleet.servers() {
        let snap = s
            .cluster()
            .store
            .snapshot(resource, fleetscope_sim::store::ReadAt::Latest)
            .unwrap();
        for o in snap.objects.values() {
            out.insert(
                (
                    s.cluster().name().to_string(),
                    o.namespace.clone(),
                    o.name.clone(),
                ),
                o.rv.to_string(),
            );
        }
    }
    out
}

/// What a [`Churn`] does in each cluster.
pub struct ChurnSpec {
    /// How many configmaps (`churn-0` …) it cycles through, in namespace team-0.
    pub names: u64,
    /// Bytes of incompressible data in each (0: none).
    pub bytes: usize,
    /// Every this-many-th change to an existing configmap deletes it.
    pub delete_every: u64,
    /// The pause between changes.
    pub pause: Duration,
}

/// Configmaps created, changed and deleted in every simulated cluster until stopped.
pub struct Churn {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writers: Vec<JoinHandle<()>>,
}

impl Churn {
    pub fn start(fleet: &SimFleet, spec: &ChurnSpec) -> Self {
        use serde_json::json;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers = fleet
            .servers()
            .iter()
            .map(|s| {
                let cluster = s.cluster().clone();
                let stop = stop.clone();
                let (names, bytes, delete_every, pause) =
                    (spec.names, spec.bytes, spec.delete_every, spec.pause);
                tokio::spawn(async move {
                    // Data that does not compress away, so snapshots take real writing.
                    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ bytes as u64;
                    let mut pad = move || {
                        let mut out = String::with_capacity(bytes);
                        while out.len() < bytes {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            out.push_str(&format!("{seed:016x}"));
                        }
                        out
                    };
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let name = format!("churn-{}", i % names);
                        let data = json!({"i": i.to_string(), "pad": pad()});
                        let store = &cluster.store;
                        match store.get("configmaps", "team-0", &name) {
                            None => {
                                let _ = store.create(
                                    "configmaps",
                                    Some("team-0"),
                                    json!({"metadata": {"name": name}, "data": data}),
                                );
                            }
                            Some(_) if i.is_multiple_of(delete_every) => {
                                let _ = store.delete("configmaps", "team-0", &name);
                            }
                            Some(o) => {
                                let mut v = o.value();
                                v["data"] = data;
                                let _ = store.update("configmaps", "team-0", &name, v);
                            }
                        }
                        i += 1;
                        tokio::time::sleep(pause).await;
                    }
                })
            })
            .collect();
        Self { stop, writers }
    }

    /// Stops every writer and waits for them.
    pub async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in self.writers {
            w.await.unwrap();
        }
    }
}

/// A kube-rs client for one context of a kubeconfig, as kube itself loads it (for
/// tests that talk to the simulated clusters directly).
pub async fn kube_client(kubeconfig: &std::path::Path, context: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let options = kube::config::KubeConfigOptions {
        context: Some(context.into()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The server's ListClusters answer.
pub async fn list_clusters(c: &mut FleetClient<Channel>) -> proto::ListClustersResponse {
    c.list_clusters(ListClustersRequest::default())
        .await
        .unwrap()
        .into_inner()
}

/// Waits until `check` holds for the ListClusters answer, or panics with the last one.
pub async fn wait_for_clusters(
    c: &mut FleetClient<Channel>,
    what: &str,
    check: impl Fn(&proto::ListClustersResponse) -> bool,
) -> proto::ListClustersResponse {
    eventually(what, async || {
        let now = list_clusters(c).await;
        if check(&now) { Ok(now) } else { Err(now) }
    })
    .await
}

/// Simulated clusters without churn, and a kubeconfig for them in a fresh directory.
pub async fn fleet_with_kubeconfig(
    clusters: usize,
    objects: usize,
) -> (SimFleet, tempfile::TempDir, PathBuf) {
    let fleet = SimFleet::start(&FleetSpec::numbered(clusters, objects, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    (fleet, dir, kubeconfig)
}

/// One simulated cluster of `objects` objects (`sim-1`) and a context `gone` whose
/// server nothing listens at, in a kubeconfig in a temporary directory.
pub async fn fleet_with_an_unreachable_cluster(
    objects: usize,
) -> (SimFleet, tempfile::TempDir, PathBuf) {
    let fleet = SimFleet::start(&FleetSpec::numbered(1, objects, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut contexts = fleet.contexts();
    contexts.push(fleetscope_sim::Context {
        name: "gone".into(),
        server: format!("http://127.0.0.1:{}", process::free_port()),
        token: "t".into(),
        ca_pem: None,
    });
    fleetscope_sim::write_kubeconfig(&kubeconfig, &contexts).unwrap();
    (fleet, dir, kubeconfig)
}

/// LIST and WATCH requests each simulated cluster has served.
pub fn requests(fleet: &SimFleet) -> Vec<(u64, u64)> {
    fleet
        .servers()
        .iter()
        .map(|s| {
            let c = s.cluster();
            (
                c.requests_of(fleetscope_sim::Verb::List),
                c.requests_of(fleetscope_sim::Verb::Watch),
            )
        })
        .collect()
}

/// GET `path` from `addr` (plain HTTP): the status code and body, or `None` while
/// nothing listens or the answer is no HTTP response.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http_get_with(addr, path, &[]).await
}

/// [`http_get`] with more request `headers`.
pub async fn http_get_with(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Some((
        code,
        if chunked {
            unchunked(body)?
        } else {
            body.to_string()
        },
    ))
}

/// A chunked HTTP/1.1 body's content; `None` if it is cut short.
fn unchunked(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// The text of `/metrics` at `addr` (plain HTTP), or `None` while nothing answers.
pub async fn scrape(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    Some(body)
}

/// The value of the sample named exactly `series` (name and labels as exposed) in a
/// `/metrics` body.
pub fn sample_in(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The value of the sample `series` at `addr` (a counter or a gauge of whole
/// numbers), or `None` while nothing answers or the sample is not there.
pub async fn sample(addr: &str, series: &str) -> Option<u64> {
    sample_in(&scrape(addr).await?, series).map(|v| v as u64)
}

/// Lists of each simulated cluster's state, however made: LIST requests and
/// streaming lists (WATCHes that send the state first), as a restart or a reconnect
/// that resumes must make none of either.
pub fn lists(fleet: &SimFleet) -> Vec<u64> {
    fleet
        .servers()
        .iter()
        .map(|s| {
            let c = s.cluster();
            c.requests_of(fleetscope_sim::Verb::List)
                + c.lists_of(fleetscope_sim::ListKind::Streaming)
        })
        .collect()
}

/// Makes a cluster serve the custom type `widgets.example.com` (namespaced, `Widget`,
/// short name `wd`), holding one object of each name in namespace `team-0`.
pub fn add_widgets(cluster: &fleetscope_sim::Cluster, names: &[&str]) {
    let mut def = fleetscope_sim::ResourceDef::new("example.com", "v1", "widgets", "Widget", true);
    def.short_names = vec!["wd".into()];
    cluster.store.add_resource(def);
    for name in names {
        cluster
            .store
            .create(
                "widgets.example.com",
                Some("team-0"),
                serde_json::json!({"metadata": {"name": name}, "spec": {"size": 3}}),
            )
            .unwrap();
    }
}

/// Writes `text` to `path` as an editor or a Kubernetes volume does: a new file renamed
/// over the old, so a reader sees one or the other, whole.
pub fn replace(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A tokens file (`--tokens-file`) of `(token, name, groups)` entries, each by its
/// SHA-256.
pub fn tokens_file(entries: &[(&str, &str, &[&str])]) -> String {
    let mut s = String::from("tokens:\n");
    for (token, name, groups) in entries {
        s += &format!(
            "  - name: {name}\n    groups: [{}]\n    sha256: {}\n",
            groups.join(", "),
            fleetscope::auth::tokens::hex_hash(token)
        );
    }
    s
}

/// Whether the real kubectl is on the PATH (it is not a build dependency: tests that
/// need it say so and check nothing else without it).
pub fn kubectl_installed() -> bool {
    std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}
