//! The `fleetscope` command: `serve`, `demo` and `sim`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;
use std::time::Duration;

use fleetscope::cli;
use fleetscope::config::kubeconfig::KubeconfigSources;
use fleetscope::engine::{ClusterLabels, Engine, EngineConfig, Scope, SourceSet, Stored};
use fleetscope::grpc::{FleetService, ServiceConfig};
use fleetscope::telemetry::{self, LogFormat};
use fleetscope::{server, sources};
use fleetscope_model::fleet::Deferred;
use fleetscope_sim::{FleetSpec, SimFleet};

/// Prints to stdout, ignoring a closed stdout: a banner must never take the server down.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// One gRPC view over many Kubernetes clusters.
#[derive(Debug, Parser)]
#[command(name = "fleetscope", version, about)]
struct Cli {
    /// Log line format.
    #[arg(
        long,
        global = true,
        env = "FLEETSCOPE_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the Fleet API over the contexts of one or more kubeconfigs.
    Serve(ServeArgs),
    /// Run simulated clusters with a workload and the server over them: no Kubernetes needed.
    Demo(DemoArgs),
    /// Run simulated Kubernetes clusters on loopback and write a kubeconfig for them.
    Sim(SimArgs),
    /// List objects across the fleet, or get one by name.
    Get(GetArgs),
    /// Count objects across the fleet, grouped.
    Count(CountArgs),
    /// Stream changes across the fleet.
    Watch(WatchArgs),
    /// Show the health of every cluster and stream.
    Clusters(ServerArg),
    /// Show the persisted store: size on disk, writes and their latency, errors.
    Store(ServerArg),
}

#[derive(Debug, Args)]
struct ServerArg {
    /// The fleetscope server.
    #[arg(
        long,
        env = "FLEETSCOPE_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,
}

#[derive(Debug, Args)]
struct QueryArgs {
    /// The resource type, kubectl-style: pods, deployments.apps, apps/v1/deployments, Deployment.
    resource: String,
    /// Namespaces; repeatable. Default: all.
    #[arg(short = 'n', long = "namespace")]
    namespaces: Vec<String>,
    /// Label selector, Kubernetes syntax.
    #[arg(short = 'l', long = "selector", default_value = "")]
    labels: String,
    /// Field selector over any JSON path, Kubernetes syntax.
    #[arg(long = "field-selector", default_value = "")]
    fields: String,
    /// Clusters by name or glob; repeatable. Default: all.
    #[arg(long = "cluster")]
    clusters: Vec<String>,
    /// Label selector over cluster labels.
    #[arg(long = "cluster-selector", default_value = "")]
    cluster_selector: String,
    /// Only apiVersion, kind and metadata.
    #[arg(long)]
    metadata_only: bool,
    #[command(flatten)]
    server: ServerArg,
}

impl QueryArgs {
    fn query(&self) -> fleetscope::proto::Query {
        fleetscope::proto::Query {
            clusters: self.clusters.clone(),
            cluster_selector: self.cluster_selector.clone(),
            resource: self.resource.clone(),
            namespaces: self.namespaces.clone(),
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            projection: if self.metadata_only {
                fleetscope::proto::Projection::Metadata as i32
            } else {
                0
            },
        }
    }
}

#[derive(Debug, Args)]
struct GetArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// An object's name (with one --cluster, and -n for namespaced types).
    name: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: cli::Output,
}

#[derive(Debug, Args)]
struct CountArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// Group by cluster, namespace, label:KEY or field:PATH; comma-separated.
    #[arg(long, value_delimiter = ',')]
    group_by: Vec<String>,
}

#[derive(Debug, Args)]
struct WatchArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// Deliver every change after this revision.
    #[arg(long, default_value_t = 0)]
    since: u64,
    /// First send the current objects as ADDED.
    #[arg(long)]
    initial: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: cli::Output,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// A kubeconfig file; repeat for several. Default: $KUBECONFIG (a path list), else ~/.kube/config.
    #[arg(long = "kubeconfig", value_name = "FILE")]
    kubeconfigs: Vec<PathBuf>,
    /// Contexts to watch, by name or glob (`prod-*`); repeat for several. Default: every context.
    #[arg(long = "context", value_name = "PATTERN")]
    contexts: Vec<String>,
    /// The gRPC listen address.
    #[arg(long, env = "FLEETSCOPE_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Also watch the cluster fleetscope runs in, through its service account.
    #[arg(long, env = "FLEETSCOPE_IN_CLUSTER")]
    in_cluster: bool,
    /// The name of the in-cluster source.
    #[arg(long, default_value = "in-cluster")]
    in_cluster_name: String,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    persist: PersistArgs,
}

/// What to collect and how: shared by `serve` and `demo`.
#[derive(Debug, Args)]
struct EngineArgs {
    /// Resource types to collect, kubectl-style (`pods`, `deployments.apps`, `apps/v1/deployments`), comma-separated; `*` for every watchable type.
    #[arg(
        long,
        env = "FLEETSCOPE_RESOURCES",
        value_delimiter = ',',
        default_value = "pods,configmaps,services,nodes,namespaces,deployments.apps,replicasets.apps"
    )]
    resources: Vec<String>,
    /// Labels for clusters, for cluster selectors: `GLOB:key=value,key=value`; repeatable.
    #[arg(long = "cluster-label", value_name = "GLOB:LABELS")]
    cluster_labels: Vec<String>,
    /// Narrow one type: `RESOURCE:namespace=NS;labels=SELECTOR;fields=SELECTOR` (parts optional); repeatable.
    #[arg(long = "scope", value_name = "RESOURCE:OPTIONS")]
    scopes: Vec<String>,
    /// Keep metadata.managedFields (pruned by default).
    #[arg(long)]
    keep_managed_fields: bool,
    /// Annotations to prune from every object; repeatable. Default: kubectl's last-applied-configuration.
    #[arg(
        long = "prune-annotation",
        value_name = "KEY",
        default_value = "kubectl.kubernetes.io/last-applied-configuration"
    )]
    prune_annotations: Vec<String>,
    /// A JSON path to index for field selectors and counts (e.g. `spec.nodeName`); repeatable.
    #[arg(long = "field-index", value_name = "PATH")]
    field_indexes: Vec<String>,
    /// LIST page size towards the clusters.
    #[arg(long, default_value_t = 500)]
    page_size: u32,
    /// Events kept for resuming watches.
    #[arg(long, default_value_t = 100_000)]
    event_log: usize,
    /// The most the kept events may hold, in MiB of JSON (an object and, for a
    /// modification, its previous state), in memory; also what the store may gather
    /// unwritten before the ingest waits for it.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    event_log_mib: u64,
    /// Events a Watch subscriber may fall behind before it is ended.
    #[arg(long, default_value_t = 10_000)]
    subscriber_buffer: usize,
    /// Seconds between Watch bookmarks.
    #[arg(long, default_value_t = 30)]
    bookmark_seconds: u64,
    /// The longest an exec credential plugin may run (`30s`, `2m`); it is then killed
    /// with the processes it started, and its cluster reported as failing.
    #[arg(long, default_value = "30s", value_parser = fleetscope::config::parse_duration)]
    exec_timeout: Duration,
}

/// Where and how `serve` keeps its state across restarts.
#[derive(Debug, Args)]
struct PersistArgs {
    /// The data directory. Default: the platform's user data directory + /fleetscope
    /// (~/.local/share/fleetscope on Linux).
    #[arg(long, env = "FLEETSCOPE_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Run in memory only: nothing is written, every start lists every cluster.
    #[arg(long, env = "FLEETSCOPE_NO_PERSIST", conflicts_with = "data_dir")]
    no_persist: bool,
    /// Keep the objects of clusters no longer configured (at start, and when a context
    /// leaves a kubeconfig while running), instead of deleting them.
    #[arg(long)]
    keep_removed_clusters: bool,
    /// No longer used: each store write starts as soon as the previous one ends, and
    /// a change is visible once its write is durable. Accepted so that existing
    /// command lines keep working.
    #[arg(long, hide = true)]
    flush_ms: Option<u64>,
    /// The persisted event log's size limit, as a share of the held objects' JSON size.
    #[arg(long, default_value_t = 0.5)]
    event_log_disk_share: f64,
    /// Compact the store (copy its live records to a fresh file) once its size on disk
    /// passes this share of the held objects' JSON size (and 1.5 × its size after the
    /// last compaction). The copy briefly takes its own space beside the store.
    #[arg(long, default_value_t = 1.0)]
    compact_share: f64,
    /// The size on disk, in MiB, below which the store is never compacted.
    #[arg(long, default_value_t = 4)]
    compact_min_mib: u64,
}

/// MiB as bytes.
fn mib(n: u64) -> usize {
    usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

/// Persistence defaults, with the unwritten backlog bounded like the event log.
fn persist_config(event_log_mib: u64) -> fleetscope::persist::PersistConfig {
    fleetscope::persist::PersistConfig {
        max_pending_bytes: mib(event_log_mib),
        ..Default::default()
    }
}

/// Exit status when the data directory is held by another running fleetscope.
const EXIT_DATA_DIR_LOCKED: u8 = 3;

impl EngineArgs {
    fn config(&self) -> anyhow::Result<EngineConfig> {
        let mut cluster_labels = Vec::new();
        for spec in &self.cluster_labels {
            let (pattern, labels) = spec.split_once(':').with_context(|| {
                format!("--cluster-label {spec:?}: expected GLOB:key=value[,key=value]")
            })?;
            let pattern = glob::Pattern::new(pattern)
                .with_context(|| format!("--cluster-label {spec:?}: {pattern:?} is not a glob"))?;
            let mut parsed = BTreeMap::new();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').with_context(|| {
                    format!("--cluster-label {spec:?}: {pair:?} is not key=value")
                })?;
                parsed.insert(k.trim().to_string(), v.trim().to_string());
            }
            cluster_labels.push(ClusterLabels {
                pattern,
                labels: parsed,
            });
        }
        anyhow::ensure!(
            self.resources.iter().any(|r| !r.trim().is_empty()),
            "--resources names no resource type"
        );
        anyhow::ensure!(self.page_size > 0, "--page-size must be at least 1");
        Ok(EngineConfig {
            resources: self.resources.clone(),
            cluster_labels,
            stream: fleetscope_informer::StreamConfig {
                page_size: self.page_size,
                pruning: fleetscope_informer::Pruning {
                    managed_fields: !self.keep_managed_fields,
                    annotations: self.prune_annotations.clone(),
                    ..Default::default()
                },
                ..Default::default()
            },
            scopes: self
                .scopes
                .iter()
                .map(|s| Scope::parse(s).with_context(|| format!("--scope {s:?}")))
                .collect::<anyhow::Result<_>>()?,
            exec_timeout: self.exec_timeout,
            persist: persist_config(self.event_log_mib),
            index: fleetscope_index::Config {
                log_bytes: mib(self.event_log_mib),
                log_retention: self.event_log.max(1),
                subscriber_buffer: self.subscriber_buffer.max(1),
                field_indexes: self.field_indexes.clone(),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn service(&self) -> ServiceConfig {
        ServiceConfig {
            bookmark_interval: Duration::from_secs(self.bookmark_seconds.max(1)),
            ..Default::default()
        }
    }
}

#[derive(Debug, Args)]
struct FleetArgs {
    /// How many clusters.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=1000))]
    clusters: u16,
    /// Cluster names, comma-separated (overrides --clusters); default sim-1 … sim-N.
    #[arg(long, value_delimiter = ',')]
    names: Vec<String>,
    /// About how many objects per cluster.
    #[arg(long, default_value_t = 2000)]
    objects: usize,
    /// Changes per second per cluster.
    #[arg(long, default_value_t = 20.0)]
    churn: f64,
}

impl FleetArgs {
    fn spec(&self) -> anyhow::Result<FleetSpec> {
        anyhow::ensure!(
            self.churn.is_finite() && self.churn >= 0.0,
            "--churn must be a number of changes per second, 0 or more"
        );
        let mut spec = FleetSpec::numbered(self.clusters.into(), self.objects, self.churn);
        if !self.names.is_empty() {
            for n in &self.names {
                anyhow::ensure!(
                    !n.is_empty()
                        && n.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'),
                    "--names: {n:?} is not a usable context name (letters, digits, '-', '_', '.')"
                );
            }
            spec.names = self.names.clone();
        }
        Ok(spec)
    }
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// The gRPC listen address.
    #[arg(long, env = "FLEETSCOPE_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    #[command(flatten)]
    fleet: FleetArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Debug, Args)]
struct SimArgs {
    #[command(flatten)]
    fleet: FleetArgs,
    /// Where to write the kubeconfig with one context per cluster.
    #[arg(long, default_value = "sim.kubeconfig")]
    kubeconfig_out: PathBuf,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run_cli().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with every cause, the way people read errors at a terminal.
            eprintln!("fleetscope: {e:#}");
            let locked = e.chain().any(|c| {
                matches!(
                    c.downcast_ref::<fleetscope_store::StoreError>(),
                    Some(fleetscope_store::StoreError::Locked(_))
                )
            });
            if locked {
                std::process::ExitCode::from(EXIT_DATA_DIR_LOCKED)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

async fn run_cli() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Demo(args) => demo(args).await,
        Command::Sim(args) => sim(args).await,
        Command::Get(args) => {
            let mut c = cli::connect(&args.query.server.server).await?;
            Ok(cli::get(&mut c, args.query.query(), args.name, args.output).await?)
        }
        Command::Count(args) => {
            let mut c = cli::connect(&args.query.server.server).await?;
            Ok(cli::count(&mut c, args.query.query(), args.group_by).await?)
        }
        Command::Watch(args) => {
            let mut c = cli::connect(&args.query.server.server).await?;
            Ok(cli::watch(
                &mut c,
                args.query.query(),
                args.since,
                args.initial,
                args.output,
            )
            .await?)
        }
        Command::Clusters(args) => {
            let mut c = cli::connect(&args.server).await?;
            Ok(cli::clusters(&mut c).await?)
        }
        Command::Store(args) => {
            let mut c = cli::connect(&args.server).await?;
            Ok(cli::store(&mut c).await?)
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // SIGHUP reloads the cluster sources; it never ends the process, from here on.
    let hangups = server::hangups()?;
    let only_in_cluster =
        args.in_cluster && args.kubeconfigs.is_empty() && std::env::var_os("KUBECONFIG").is_none();
    let sources = KubeconfigSources {
        paths: if only_in_cluster {
            Vec::new()
        } else {
            sources::kubeconfig_paths(&args.kubeconfigs)?
        },
        contexts: args.contexts.clone(),
        in_cluster: args.in_cluster.then(|| args.in_cluster_name.clone()),
    };
    // A bad kubeconfig at start is an error before any port is bound.
    let clusters = sources.load()?;
    for c in &clusters {
        tracing::info!(cluster = %c.name, origin = %c.origin, "cluster source");
    }
    let (desired_tx, desired) = tokio::sync::watch::channel(SourceSet::of(clusters));
    let mut config = args.engine.config()?;
    let p = &args.persist;
    anyhow::ensure!(
        p.event_log_disk_share.is_finite() && p.event_log_disk_share >= 0.0,
        "--event-log-disk-share must be a number, 0 or more"
    );
    anyhow::ensure!(
        p.compact_share.is_finite() && p.compact_share >= 0.0,
        "--compact-share must be a number, 0 or more"
    );
    config.keep_removed_clusters = p.keep_removed_clusters;
    if p.flush_ms.is_some() {
        tracing::warn!(
            "--flush-ms no longer applies: each store write starts as soon as the previous one ends"
        );
    }
    config.persist.log_share = p.event_log_disk_share;
    config.persist.compact_share = p.compact_share;
    config.persist.compact_min_bytes = p.compact_min_mib.saturating_mul(1 << 20);
    let no_persist = p.no_persist;
    let data_dir = match &p.data_dir {
        _ if no_persist => None,
        Some(d) => Some(d.clone()),
        None => Some(
            dirs::data_dir()
                .context(
                    "no user data directory on this platform: give --data-dir or --no-persist",
                )?
                .join("fleetscope"),
        ),
    };
    let listener = server::bind(args.listen).await?;
    // The server answers (UNAVAILABLE, health NOT_SERVING) while the store loads.
    let start = move || match data_dir {
        None => {
            tracing::info!("running in memory only (--no-persist)");
            Ok(Engine::start_live(desired, config, None))
        }
        Some(dir) => {
            let opened = fleetscope_store::SledStore::open(&dir)
                .with_context(|| format!("opening the data directory {}", dir.display()))?;
            tracing::info!(dir = %dir.display(), objects = opened.loaded.objects.len(), revision = %opened.loaded.revision, "store opened");
            let stored = Stored {
                store: std::sync::Arc::new(opened.store),
                loaded: opened.loaded,
            };
            Ok(Engine::start_live(desired, config, Some(stored)))
        }
    };
    let reload = tokio_util::sync::CancellationToken::new();
    let reloader = tokio::spawn(fleetscope::config::kubeconfig::reload_on_change(
        sources,
        desired_tx,
        hangups,
        reload.clone(),
    ));
    let result = run(listener, start, args.engine.service()).await;
    reload.cancel();
    let _ = reloader.await;
    result
}

/// Serves at once, starts the engine with `start` (off the async workers: it may load
/// a store), answers from it once started, and runs until Ctrl-C or SIGTERM; then
/// stops the server (ending open streams) and the engine (writing what is pending).
async fn run(
    listener: tokio::net::TcpListener,
    start: impl FnOnce() -> anyhow::Result<Engine> + Send + 'static,
    service: ServiceConfig,
) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let fleet = std::sync::Arc::new(Deferred::<Engine>::default());
    let service = FleetService::new(fleet.clone(), service, stop.clone());
    let (started_tx, started) = tokio::sync::oneshot::channel::<std::sync::Arc<Engine>>();
    let ready = async move {
        match started.await {
            Ok(engine) => engine.wait_ready().await,
            // Never started: never ready.
            Err(_) => std::future::pending().await,
        }
    };
    let server = tokio::spawn(server::serve(listener, service.clone(), ready, {
        let stop = stop.clone();
        async move { stop.cancelled().await }
    }));
    let signal = tokio::spawn({
        let stop = stop.clone();
        async move {
            server::shutdown_signal().await;
            stop.cancel();
        }
    });
    let starting = tokio::task::spawn_blocking(start);
    let engine = tokio::select! {
        e = starting => e.context("starting the engine")?,
        _ = stop.cancelled() => {
            server.await.context("the server task")??;
            return Ok(());
        }
    };
    let engine = match engine {
        Ok(engine) => std::sync::Arc::new(engine),
        Err(e) => {
            stop.cancel();
            let _ = server.await;
            signal.abort();
            return Err(e);
        }
    };
    fleet.set(engine.clone());
    let _ = started_tx.send(engine.clone());
    stop.cancelled().await;
    // Whatever a cluster, a client or a credential plugin is doing, the process ends
    // within the grace period (and a little for the final store write's own bound).
    std::thread::spawn(|| {
        std::thread::sleep(SHUTDOWN_GRACE + Duration::from_secs(5));
        tracing::error!(grace = ?SHUTDOWN_GRACE, "shutdown did not finish within the grace period: exiting now");
        std::process::exit(1);
    });
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    let served = match tokio::time::timeout_at(deadline, server).await {
        Ok(served) => served.context("the server task")?,
        Err(_) => {
            tracing::warn!("open calls did not end within the grace period");
            Ok(())
        }
    };
    engine
        .shutdown(deadline.saturating_duration_since(tokio::time::Instant::now()))
        .await;
    served?;
    Ok(())
}

/// How long a shutdown may take: ending open calls, stopping the clusters' tasks and
/// writing what is pending.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

async fn start_fleet(args: &FleetArgs) -> anyhow::Result<SimFleet> {
    let spec = args.spec()?;
    let fleet = SimFleet::start(&spec)
        .await
        .context("starting simulated clusters")?;
    for s in fleet.servers() {
        tracing::info!(cluster = s.cluster().name(), url = %s.url(), "simulated cluster");
    }
    Ok(fleet)
}

/// Writes the fleet's kubeconfig; returns its first context, for the printed examples.
fn write_kubeconfig(fleet: &SimFleet, path: &std::path::Path) -> anyhow::Result<String> {
    fleet
        .write_kubeconfig(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(fleet
        .contexts()
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default())
}

async fn sim(args: SimArgs) -> anyhow::Result<()> {
    let fleet = start_fleet(&args.fleet).await?;
    let first = write_kubeconfig(&fleet, &args.kubeconfig_out)?;
    let kc = args.kubeconfig_out.display();
    say!(
        "{} simulated clusters are running; kubeconfig: {kc}\n",
        fleet.servers().len()
    );
    for s in fleet.servers() {
        say!("  {:<12} {}", s.cluster().name(), s.url());
    }
    say!(
        "\nTry:\n  kubectl --kubeconfig {kc} --context {first} get pods -A\n  kubectl --kubeconfig {kc} --context {first} get --raw '/api/v1/configmaps?watch=1'\n\nCtrl-C stops them."
    );
    server::shutdown_signal().await;
    fleet.shutdown().await;
    Ok(())
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let listener = server::bind(args.listen).await?;
    let fleet = start_fleet(&args.fleet).await?;
    let kubeconfig =
        std::env::temp_dir().join(format!("fleetscope-demo-{}.kubeconfig", std::process::id()));
    let first = write_kubeconfig(&fleet, &kubeconfig)?;
    let clusters = sources::resolve(std::slice::from_ref(&kubeconfig), &[])?;
    let config = args.engine.config()?;
    let addr = listener
        .local_addr()
        .context("reading the listen address")?;
    let kc = kubeconfig.display();
    say!(
        "fleetscope demo\n\n\
         {n} simulated clusters with ~{objects} objects each and {churn} changes/s, kubeconfig: {kc}\n\
         gRPC server on {addr} (health, reflection and the fleetscope.v1.Fleet contract).\n\n\
         Try:\n  \
         grpcurl -plaintext {addr} list\n  \
         grpcurl -plaintext {addr} describe fleetscope.v1.Fleet\n  \
         grpcurl -plaintext {addr} fleetscope.v1.Fleet/ListClusters\n  \
         grpcurl -plaintext -d '{{\"query\":{{\"resource\":\"pods\",\"label_selector\":\"app=web\"}},\"limit\":3}}' {addr} fleetscope.v1.Fleet/List\n  \
         grpcurl -plaintext -d '{{\"query\":{{\"resource\":\"pods\"}},\"group_by\":[\"cluster\",\"field:status.phase\"]}}' {addr} fleetscope.v1.Fleet/Count\n  \
         grpcurl -plaintext -d '{{\"query\":{{\"resource\":\"configmaps\"}}}}' {addr} fleetscope.v1.Fleet/Watch\n  \
         grpcurl -plaintext {addr} grpc.health.v1.Health/Check\n\n\
         or with the fleetscope CLI:\n  \
         fleetscope clusters --server http://{addr}\n  \
         fleetscope get pods -l app=web --cluster 'sim-*' --server http://{addr}\n  \
         fleetscope count pods --group-by cluster,field:status.phase --server http://{addr}\n  \
         fleetscope watch configmaps -n team-0 --server http://{addr}\n  \
         kubectl --kubeconfig {kc} --context {first} get pods -A\n\n\
         Ctrl-C stops it.",
        n = fleet.servers().len(),
        objects = args.fleet.objects,
        churn = args.fleet.churn,
    );
    // The demo's clusters are new each run, so it keeps its state in memory.
    let result = run(
        listener,
        move || Ok(Engine::start(clusters, config)),
        args.engine.service(),
    )
    .await;
    fleet.shutdown().await;
    let _ = std::fs::remove_file(&kubeconfig);
    result
}
