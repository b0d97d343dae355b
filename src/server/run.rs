//! Running the server: `serve` (kubeconfig clusters, reloaded as they change),
//! `demo` (simulated clusters and the server over them) and `sim` (the simulator
//! alone). The server answers at once, starts the engine beside it, and on SIGTERM
//! stops within its grace period.

use std::path::PathBuf;
use std::time::Duration;

use fleetscope_model::fleet::Deferred;
use fleetscope_sim::SimFleet;

use crate::config::flags::{ArgsError, DemoArgs, FleetArgs, SecurityArgs, ServeArgs, SimArgs};
use crate::config::kubeconfig::{KubeconfigSources, LoadError};
use crate::config::reload::{self, ConfigFile, Reloads};
use crate::config::resolve::{ResolveError, Row};
use crate::engine::{Engine, EngineConfig, SourceSet, Stored};
use crate::grpc::{FleetService, ServiceConfig};
use crate::server::{self, ServerError};
use crate::sources::{self, SourceError};
use crate::telemetry;
use crate::telemetry::grpc::GrpcLayer;

/// Prints to stdout, ignoring a closed stdout: a banner must never take the server down.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Why a command could not start or ended in failure.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No key for page tokens can be made.
    #[error(transparent)]
    Random(#[from] crate::grpc::RandomUnavailable),
    /// A flag's value cannot be used.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The kubeconfigs or context patterns cannot be used.
    #[error(transparent)]
    Sources(#[from] LoadError),
    /// A kubeconfig cannot be used.
    #[error(transparent)]
    Kubeconfig(#[from] SourceError),
    /// The configuration file, with the command line, cannot be used.
    #[error(transparent)]
    Config(#[from] ResolveError),
    /// No data directory was given and the platform has none.
    #[error("no user data directory on this platform: give --data-dir or --no-persist")]
    NoDataDir,
    /// The data directory's store could not be opened.
    #[error("opening the data directory {}", dir.display())]
    Store {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: fleetscope_store::StoreError,
    },
    /// The server failed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// A task of the server ended abnormally.
    #[error("a server task failed")]
    Task(#[from] tokio::task::JoinError),
    /// SIGHUP, SIGINT or SIGTERM could not be taken over.
    #[error("listening for signals")]
    Signal(#[source] std::io::Error),
    /// The listen address could not be read back.
    #[error("reading the listen address")]
    Listen(#[source] std::io::Error),
    /// The simulated clusters could not start.
    #[error("starting simulated clusters")]
    Sim(#[source] std::io::Error),
    /// A TLS file cannot be used.
    #[error(transparent)]
    Tls(#[from] server::tls::TlsError),
    /// The tokens or policy file cannot be used: nothing is served under it.
    #[error(transparent)]
    Security(#[from] crate::config::yaml::FileError),
    /// A file could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn ensure(holds: bool, message: &str) -> Result<(), RunError> {
    if holds {
        Ok(())
    } else {
        Err(ArgsError::Invalid(message.to_string()).into())
    }
}

/// The cluster sources and engine settings of `serve`'s flags: checked, with no side
/// effect but reading `$KUBECONFIG`. Used at start, by `config check` and on reload.
pub fn plan(args: &ServeArgs) -> Result<(KubeconfigSources, EngineConfig), RunError> {
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
        aliases: args.aliases()?,
    };
    let mut config = args.engine.config()?;
    let p = &args.persist;
    ensure(
        p.event_log_disk_share.is_finite() && p.event_log_disk_share >= 0.0,
        "--event-log-disk-share must be a number, 0 or more",
    )?;
    ensure(
        p.compact_share.is_finite() && p.compact_share >= 0.0,
        "--compact-share must be a number, 0 or more",
    )?;
    collect_rbac(&mut config, args.security.rbac_authorization);
    config.keep_removed_clusters = p.keep_removed_clusters;
    config.persist.log_share = p.event_log_disk_share;
    config.persist.compact_share = p.compact_share;
    config.persist.compact_min_bytes = p.compact_min_mib.saturating_mul(1 << 20);
    Ok((sources, config))
}

/// With delegated authorization, each cluster's RBAC is read from its objects,
/// collected like any others.
fn collect_rbac(config: &mut EngineConfig, on: bool) {
    if !on || config.resources.iter().any(|r| r == "*") {
        return;
    }
    for t in crate::auth::rbac::TYPES {
        if !config.resources.iter().any(|r| r == t) {
            config.resources.push(t.to_string());
        }
    }
}

/// `fleetscope serve`: the kubeconfigs' clusters, reloaded as they change, served
/// until SIGTERM. `config` is the configuration file's resolution, when there is one.
pub async fn serve(args: ServeArgs, config: Option<ConfigFile>) -> Result<(), RunError> {
    // SIGHUP reloads every input; it never ends the process, from here on.
    let hangups = server::hangups().map_err(RunError::Signal)?;
    let (sources, config_now) = plan(&args)?;
    let kubeconfig_paths = sources.paths.clone();
    // A bad kubeconfig at start is an error before any port is bound.
    let clusters = sources.load()?;
    for c in &clusters {
        tracing::info!(cluster = %c.name, origin = %c.origin, "cluster source");
    }
    let (desired_tx, desired) = tokio::sync::watch::channel(SourceSet::of(clusters));
    let reload = tokio_util::sync::CancellationToken::new();
    let fleet = std::sync::Arc::new(Deferred::<Engine>::default());
    // A ring's coordination cluster, like a kubeconfig, is checked before any port is bound.
    let membership = match args.shard.membership(&args.engine.listener.listen)? {
        None => None,
        Some((membership, advertise)) => Some((
            membership,
            advertise,
            context_source(
                "--shard-coordination",
                &args.shard.ring.shard_coordination,
                &kubeconfig_paths,
            )?,
        )),
    };
    let (settings_tx, mut settings) = tokio::sync::watch::channel(config_now.clone());
    settings.mark_unchanged();
    if args.persist.flush_ms.is_some() {
        tracing::warn!(
            "--flush-ms no longer applies: each store write starts as soon as the previous one ends"
        );
    }
    let data_dir = match &args.persist.data_dir {
        _ if args.persist.no_persist => None,
        Some(d) => Some(d.clone()),
        None => Some(
            dirs::data_dir()
                .ok_or(RunError::NoDataDir)?
                .join("fleetscope"),
        ),
    };
    // Bad security files, like a bad kubeconfig, are an error before any port is bound.
    check_security(&args.security, &kubeconfig_paths)?;
    // What serve writes (the store, its key) is for its own user only.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let listener = server::bind(&args.engine.listener.listen).await?;
    let key = match (&args.shard.ring.shard_page_token_key_file, &data_dir) {
        (Some(file), dir) => {
            if let Some(dir) = dir {
                private(dir)?;
            }
            crate::grpc::TokenKey::from_file(file)
                .map_err(|e| ArgsError::Invalid(format!("--shard-page-token-key-file {e}")))?
        }
        (None, Some(dir)) => {
            private(dir)?;
            token_key(dir)?
        }
        (None, None) => crate::grpc::TokenKey::random()?,
    };
    let mut service = args.engine.listener.service(key);
    let replica = match membership {
        None => None,
        Some((membership, advertise, source)) => {
            let named = format!("{}/{}", membership.ring, membership.identity);
            service.replica = Some(named.parse().map_err(|_| {
                ArgsError::Invalid(format!(
                    "--shard-ring and --shard-identity: {named:?} cannot be sent in a header"
                ))
            })?);
            let client = crate::shard::coordination::client(
                &source,
                args.engine.exec_timeout,
                reload.clone(),
            )
            .await?;
            let api = kube::Api::namespaced(client, &args.shard.ring.shard_lease_namespace);
            let engine = fleet.clone();
            let resume = fleet.clone();
            Some(crate::shard::replica::Replica::start(
                api,
                membership,
                advertise,
                desired.clone(),
                Box::new(move |since| {
                    engine
                        .get()
                        .map(|e| e.synced_since(since))
                        .unwrap_or_default()
                }),
                Box::new(move || {
                    if let Some(e) = resume.get() {
                        e.rewatch();
                    }
                }),
                reload.clone(),
            ))
        }
    };
    // A replica's engine runs the clusters it holds, not every configured one.
    let engine_sources = replica.as_ref().map_or(desired, |r| r.held.clone());
    // The server answers (UNAVAILABLE, health NOT_SERVING) while the store loads.
    let start = move || {
        let engine = match data_dir {
            None => {
                tracing::info!("running in memory only (--no-persist)");
                Engine::start_live(engine_sources, config_now, None)
            }
            Some(dir) => {
                let opened =
                    fleetscope_store::SledStore::open(&dir).map_err(|source| RunError::Store {
                        dir: dir.clone(),
                        source,
                    })?;
                tracing::info!(dir = %dir.display(), objects = opened.loaded.objects.len(), revision = %opened.loaded.revision, "store opened");
                let stored = Stored {
                    store: std::sync::Arc::new(opened.store),
                    loaded: opened.loaded,
                };
                Engine::start_live(engine_sources, config_now, Some(stored))
            }
        };
        Ok(engine)
    };
    let mut reloads = Reloads::default();
    let sources = std::sync::Arc::new(std::sync::Mutex::new(sources));
    if let Some(config) = config {
        reloads.follow_config(
            config.path.clone(),
            reload::config_input(
                config,
                |args| plan(args).map_err(|e| crate::sources::chain(&e)),
                sources.clone(),
                settings_tx,
                desired_tx.clone(),
            ),
        );
    }
    reloads.follow(
        "sources",
        "the cluster sources",
        kubeconfig_paths.clone(),
        reload::sources_input(sources, desired_tx),
    );
    let metrics = bind_metrics(&args.engine.listener).await?;
    let security = secure(
        &args.security,
        Some(&fleet),
        &kubeconfig_paths,
        (
            args.engine.exec_timeout,
            args.engine
                .listener
                .admission(args.security.authenticates()),
        ),
        (&listener, metrics.as_ref()),
        &reload,
        &mut reloads,
    )?;
    service.inputs = reloads.status();
    let reloader = crate::tasks::spawn("reloader", reloads.run(hangups, reload.clone()));
    let result = run(
        fleet,
        listener,
        metrics,
        start,
        Serving {
            service,
            limits: args.engine.listener.limits(),
            security,
            reloads: reload.clone(),
            replica,
        },
        Some(settings),
    )
    .await;
    reload.cancel();
    let _ = reloader.await;
    result
}

/// `fleetscope router`: the fleet of a ring's replicas served whole, until SIGTERM;
/// `config`, its configuration file, followed (its settings apply at restart).
pub async fn router(
    args: crate::config::flags::RouterArgs,
    config: Option<ConfigFile>,
) -> Result<(), RunError> {
    let hangups = server::hangups().map_err(RunError::Signal)?;
    let shutdown = server::shutdown_signal().map_err(RunError::Signal)?;
    let (ring, key) = args.ring_and_key()?;
    let kubeconfigs = if args.ring.shard_coordination == "in-cluster" {
        Vec::new()
    } else {
        crate::sources::kubeconfig_paths(&args.kubeconfigs)?
    };
    let source = context_source(
        "--shard-coordination",
        &args.ring.shard_coordination,
        &kubeconfigs,
    )?;
    let upstream_tls = args.upstream_tls()?;
    check_security(&args.security, &kubeconfigs)?;
    let listener = server::bind(&args.listener.listen).await?;
    let metrics = bind_metrics(&args.listener).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let client = crate::shard::coordination::client(&source, EXEC_TIMEOUT, stop.clone()).await?;
    let api = kube::Api::namespaced(client, &args.ring.shard_lease_namespace);
    let (observed_tx, observed) = tokio::sync::watch::channel(crate::shard::lease::Observed::new(
        &ring,
        args.ring.shard_lease_duration,
        crate::shard::seal::LeaseKey::of(&key),
    ));
    crate::tasks::spawn(
        "lease-follower",
        crate::shard::lease::follow(api, ring.clone(), observed_tx, stop.clone()),
    );
    tracing::info!(%ring, "routing to the ring's replicas");
    let router = std::sync::Arc::new(crate::router::Router::new(
        ring,
        observed.clone(),
        crate::router::Upstream {
            passes_identity: upstream_tls.as_ref().is_some_and(|(_, cert)| *cert),
            tls: upstream_tls.map(|(tls, _)| tls),
            page_token_key: key.clone(),
            timeout: args.replica_timeout,
        },
    ));
    let mut reloads = Reloads::default();
    if let Some(config) = config {
        reloads.follow_config(
            config.path.clone(),
            reload::restart_input(config, |resolved| match resolved.router() {
                Ok(Some(args)) => args.ring_and_key().map(|_| ()).map_err(|e| e.to_string()),
                Ok(None) => Err("the command line is not `router`".into()),
                Err(e) => Err(e.to_string()),
            }),
        );
    }
    let security = secure(
        &args.security,
        None,
        &kubeconfigs,
        (
            EXEC_TIMEOUT,
            args.listener.admission(args.security.authenticates()),
        ),
        (&listener, metrics.as_ref()),
        &stop,
        &mut reloads,
    )?;
    let mut config = args.listener.service(key);
    config.inputs = reloads.status();
    crate::tasks::spawn("reloader", reloads.run(hangups, stop.clone()));
    // Ready once the ring's Leases have been read and one replica's taken.
    let ready = router.ready();
    let inputs = config.inputs.clone();
    let service = FleetService::new(router.clone(), config, stop.clone());
    let counted = serve_metrics(
        metrics,
        telemetry::metrics::Sources {
            engine: None,
            router: Some(router.clone()),
            subscribers: service.subscribers(),
            inputs,
            shard: None,
        },
        router,
        &security,
        &stop,
    );
    crate::tasks::spawn("memory-return", crate::memory::return_freed(stop.clone()));
    crate::tasks::spawn("shutdown-signal", {
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    });
    let served = server::serve_with(
        listener,
        service,
        ready,
        {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        },
        counted,
        args.listener.limits(),
        security,
    )
    .await;
    stop.cancel();
    let _ = crate::tasks::shutdown(SHUTDOWN_GRACE).await;
    served?;
    Ok(())
}

/// How long an exec credential plugin may run for the router's coordination cluster.
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// `fleetscope config check FILE`: the configuration as `serve --config FILE` (or
/// `router`, `of`) would resolve it in this environment, each value with its source;
/// then the same checks the command makes before it starts (for `serve`: selectors,
/// labels, aliases, the kubeconfigs and context patterns; for `router`: the ring and
/// its key, the replicas' TLS files), changing nothing.
pub fn config_check(
    file: &std::path::Path,
    of: &str,
    command: clap::Command,
) -> Result<(), RunError> {
    let argv: Vec<std::ffi::OsString> = vec![
        "fleetscope".into(),
        of.into(),
        "--config".into(),
        file.into(),
    ];
    let resolved = crate::config::resolve::resolve(command, of, &argv, file)?;
    let width = |f: fn(&Row) -> usize| resolved.rows.iter().map(f).max().unwrap_or(0);
    let (kw, fw, vw) = (
        width(|r| r.key.len()).max(3),
        width(|r| r.flag.len()).max(4),
        width(|r| r.value.len().min(60)).max(5),
    );
    say!("{:<kw$}  {:<fw$}  {:<vw$}  SOURCE", "KEY", "FLAG", "VALUE");
    for r in &resolved.rows {
        let value = if r.value.is_empty() { "-" } else { &r.value };
        say!(
            "{:<kw$}  {:<fw$}  {:<vw$}  {}",
            r.key,
            r.flag,
            value,
            r.source
        );
    }
    if let Some(args) = resolved.router()? {
        let (ring, _) = args.ring_and_key()?;
        args.upstream_tls()?;
        say!("\n{}: valid; routes to ring {ring}", file.display());
        return Ok(());
    }
    let Some(args) = resolved.serve()? else {
        return Ok(());
    };
    let (sources, _) = plan(&args)?;
    let clusters = sources.load()?;
    check_security(&args.security, &sources.paths)?;
    args.shard.membership(&args.engine.listener.listen)?;
    let names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    say!(
        "\n{}: valid; {} cluster(s): {}",
        file.display(),
        names.len(),
        names.join(", ")
    );
    Ok(())
}

/// `fleetscope config settings`: every setting of `serve` (or `router`, `of`) from its
/// declaration, as an aligned table or (`markdown`) the reference `docs/operating.md`
/// holds.
pub fn config_settings(command: &clap::Command, of: &str, output: &str) {
    let Some(sub) = command.find_subcommand(of) else {
        return;
    };
    let described =
        crate::config::settings::describe(sub, crate::config::flags::settings_of(of).into_iter());
    if output == "markdown" {
        say!(
            "{}",
            crate::config::settings::markdown(&described).trim_end()
        );
        return;
    }
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let rows: Vec<Vec<String>> = described
        .iter()
        .map(|d| {
            vec![
                d.key.to_string(),
                d.flag.clone(),
                dash(d.env.as_deref().unwrap_or("")),
                dash(&d.default),
                d.applies.to_string(),
            ]
        })
        .collect();
    let header = ["KEY", "FLAG", "ENV", "DEFAULT", "APPLIES"].map(String::from);
    say!(
        "{}",
        crate::cli::output::align(Some(&header), &rows).trim_end()
    );
}

/// How the server serves: the service's settings, its limits and its security.
struct Serving {
    service: ServiceConfig,
    limits: server::limits::Limits,
    security: server::Security,
    /// Stops the reloaders (configuration, credentials, TLS, RBAC): cancelled when
    /// the shutdown begins, so they end with the rest.
    reloads: tokio_util::sync::CancellationToken,
    /// This server as a replica of a ring: the engine starts once it has decided what
    /// it holds, answers pass its fence, and a shutdown first hands its clusters over.
    replica: Option<crate::shard::replica::Replica>,
}

/// Serves at once, starts the engine with `start` (off the async workers: it may load
/// a store), answers from it once started, and runs until Ctrl-C or SIGTERM; then
/// stops the server (ending open streams) and the engine (writing what is pending).
/// `settings`, when given, carries new engine settings from a configuration reload.
async fn run(
    fleet: std::sync::Arc<Deferred<Engine>>,
    listener: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
    start: impl FnOnce() -> Result<Engine, RunError> + Send + 'static,
    how: Serving,
    settings: Option<tokio::sync::watch::Receiver<EngineConfig>>,
) -> Result<(), RunError> {
    let Serving {
        service,
        limits,
        security,
        reloads,
        replica,
    } = how;
    // From here on SIGTERM shuts down in order, whatever is starting.
    let shutdown = server::shutdown_signal().map_err(RunError::Signal)?;
    let stop = tokio_util::sync::CancellationToken::new();
    crate::tasks::spawn("memory-return", crate::memory::return_freed(stop.clone()));
    let inputs = service.inputs.clone();
    let gated = std::sync::Arc::new(fleetscope_model::fleet::Gated::new(
        fleet.clone(),
        replica.as_ref().map(|r| r.gate.clone()),
    ));
    let service = FleetService::new(gated, service, stop.clone());
    let counted = serve_metrics(
        metrics,
        telemetry::metrics::Sources {
            engine: Some(fleet.clone()),
            router: None,
            subscribers: service.subscribers(),
            inputs,
            shard: replica.as_ref().map(|r| r.status.clone()),
        },
        fleet.clone(),
        &security,
        &stop,
    );
    let (started_tx, started) = tokio::sync::oneshot::channel::<std::sync::Arc<Engine>>();
    let ready = async move {
        match started.await {
            Ok(engine) => engine.wait_ready().await,
            // Never started: never ready.
            Err(_) => std::future::pending().await,
        }
    };
    let server = crate::tasks::spawn(
        "grpc-server",
        server::serve_with(
            listener,
            service.clone(),
            ready,
            {
                let stop = stop.clone();
                async move { stop.cancelled().await }
            },
            counted,
            limits,
            security,
        ),
    );
    let handover = replica.as_ref().map(|r| r.handover());
    let signal = crate::tasks::spawn("shutdown-signal", {
        let stop = stop.clone();
        async move {
            shutdown.await;
            if let Some(handover) = handover {
                handover.await;
            }
            stop.cancel();
        }
    });
    let decided = replica.as_ref().map(|r| r.decided());
    let starting = crate::tasks::spawn("engine-start", async move {
        if let Some(decided) = decided {
            decided.await;
        }
        crate::tasks::spawn_blocking("engine-start", start).await
    });
    let engine = tokio::select! {
        e = starting => e??,
        _ = stop.cancelled() => {
            server.await??;
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
    if let Some(mut settings) = settings {
        let engine = engine.clone();
        let stop = stop.clone();
        crate::tasks::spawn("settings", async move {
            // Settings reloaded while the engine started are applied first.
            loop {
                if settings.has_changed().unwrap_or(false) {
                    engine.reconfigure(&settings.borrow_and_update());
                }
                tokio::select! {
                    changed = settings.changed() => if changed.is_err() { return },
                    _ = stop.cancelled() => return,
                }
                engine.reconfigure(&settings.borrow_and_update());
            }
        });
    }
    stop.cancelled().await;
    reloads.cancel();
    // Whatever a cluster, a client or a credential plugin is doing, the process ends
    // within the grace period (and a little for the final store write's own bound).
    std::thread::spawn(|| {
        std::thread::sleep(SHUTDOWN_GRACE + Duration::from_secs(5));
        tracing::error!(grace = ?SHUTDOWN_GRACE, "shutdown did not finish within the grace period: exiting now");
        std::process::exit(1);
    });
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    let served = match tokio::time::timeout_at(deadline, server).await {
        Ok(served) => served?,
        Err(_) => {
            tracing::warn!("open calls did not end within the grace period");
            Ok(())
        }
    };
    engine
        .shutdown(deadline.saturating_duration_since(tokio::time::Instant::now()))
        .await;
    // Every other task (listeners, reloaders, connections) ends with `stop`.
    let _ = crate::tasks::shutdown(deadline.saturating_duration_since(tokio::time::Instant::now()))
        .await;
    served?;
    Ok(())
}

/// How long a shutdown may take: ending open calls, stopping the clusters' tasks and
/// writing what is pending.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

async fn start_fleet(args: &FleetArgs) -> Result<SimFleet, RunError> {
    let spec = args.spec()?;
    let fleet = SimFleet::start(&spec).await.map_err(RunError::Sim)?;
    for s in fleet.servers() {
        tracing::info!(cluster = s.cluster().name(), url = %s.url(), "simulated cluster");
    }
    Ok(fleet)
}

/// Writes the fleet's kubeconfig; returns its first context, for the printed examples.
fn write_kubeconfig(fleet: &SimFleet, path: &std::path::Path) -> Result<String, RunError> {
    fleet
        .write_kubeconfig(path)
        .map_err(|source| RunError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(fleet
        .contexts()
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default())
}

/// `fleetscope sim`: simulated clusters and a kubeconfig for them, until Ctrl-C.
pub async fn sim(args: SimArgs) -> Result<(), RunError> {
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
    server::shutdown_signal().map_err(RunError::Signal)?.await;
    fleet.shutdown().await;
    Ok(())
}

/// The checks `serve` makes of its security settings before it serves, with no side
/// effect: the flags that go together, the TLS, tokens and policy files, and the
/// reviewing cluster's context.
fn check_security(args: &SecurityArgs, kubeconfigs: &[PathBuf]) -> Result<(), RunError> {
    paired(args)?;
    if let Some(files) = args.tls() {
        server::tls::server_config(&files)?;
    }
    if let Some(path) = &args.tokens_file {
        crate::auth::tokens::Tokens::load(path)?;
    }
    if let Some(path) = &args.policy {
        crate::auth::policy::PolicyGrants::load(path)?;
    }
    if let Some(context) = &args.token_review_context {
        context_source("--token-review-context", context, kubeconfigs)?;
    }
    Ok(())
}

/// The TLS flags that go together.
fn paired(args: &SecurityArgs) -> Result<(), RunError> {
    let alone = |m: &str| Err(ArgsError::Invalid(m.to_string()).into());
    match (&args.tls_cert, &args.tls_key, &args.client_ca) {
        (Some(_), None, _) => alone("--tls-cert needs --tls-key"),
        (None, Some(_), _) => alone("--tls-key needs --tls-cert"),
        (None, None, Some(_)) => alone("--client-ca (mutual TLS) needs --tls-cert and --tls-key"),
        (_, _, None) if !args.router_names.is_empty() => {
            alone("--router-name needs --client-ca: a router is known by its client certificate")
        }
        _ => Ok(()),
    }
}

/// The server's security from its flags, before anything is served: the TLS, tokens
/// and policy files loaded (an error names the file and key), each then reloaded as it
/// changes and on SIGHUP until `stop`; plaintext refused on an address other than
/// loopback unless `--insecure-listen`.
fn secure(
    args: &SecurityArgs,
    fleet: Option<&std::sync::Arc<Deferred<Engine>>>,
    kubeconfigs: &[PathBuf],
    (exec_timeout, admission): (Duration, server::tls::Admission),
    (listener, metrics): (&tokio::net::TcpListener, Option<&tokio::net::TcpListener>),
    stop: &tokio_util::sync::CancellationToken,
    reloads: &mut Reloads,
) -> Result<server::Security, RunError> {
    paired(args)?;
    let tls_files = args.tls();
    if tls_files.is_none() && !args.insecure_listen {
        for (l, flag) in [(Some(listener), "--listen"), (metrics, "--metrics-listen")] {
            let Some(Ok(addr)) = l.map(|l| l.local_addr()) else {
                continue;
            };
            if !addr.ip().is_loopback() {
                return Err(ArgsError::Invalid(format!(
                    "{flag} {addr} is not a loopback address: serve TLS there (--tls-cert, --tls-key), or give --insecure-listen to serve plaintext beyond this host"
                ))
                .into());
            }
        }
    }
    if tls_files.is_none() && args.tokens_file.is_some() && args.insecure_listen {
        tracing::warn!(
            "bearer tokens are accepted over plaintext (--insecure-listen without --tls-cert): anyone on the network path can read them"
        );
    }
    let tls = match tls_files {
        None => None,
        Some(files) => {
            let first = server::tls::server_config(&files)?;
            tracing::info!(cert = %files.cert.display(), mutual = files.client_ca.is_some(), "TLS on");
            let (in_force, tls) = server::tls::in_force(files, first);
            reloads.follow(
                "tls",
                "the TLS files",
                tls.paths(),
                Box::new(move |_| tls.reload().map(reload::Reloaded::said)),
            );
            Some(in_force)
        }
    };
    let reviewer = match &args.token_review_context {
        None => None,
        Some(context) => Some(crate::auth::review::Reviewer::new(
            fleetscope_informer::review::TokenReviewer::new(
                context_source("--token-review-context", context, kubeconfigs)?,
                exec_timeout,
                args.token_review_audiences.clone(),
            ),
            args.token_review_ttl,
            args.token_review_negative_ttl,
            args.token_review_timeout,
        )),
    };
    let rbac = match (args.rbac_authorization, fleet) {
        (false, _) => None,
        (true, Some(fleet)) => Some(fleet.clone()),
        (true, None) => {
            return Err(ArgsError::Invalid(
                "--rbac-authorization: a router does not authorize; give it to the replicas, which see each cluster's RBAC".into(),
            )
            .into());
        }
    };
    let (guard, files) = crate::auth::guard(&args.files(), reviewer, rbac, stop.clone())?;
    if let Some(tokens) = files.tokens {
        reloads.follow(
            "tokens",
            "the tokens file",
            vec![tokens.path().to_path_buf()],
            Box::new(move |_| tokens.reload().map(reload::Reloaded::said)),
        );
    }
    if let Some(policy) = files.policy {
        reloads.follow(
            "policy",
            "the policy",
            vec![policy.path().to_path_buf()],
            Box::new(move |_| policy.reload().map(reload::Reloaded::said)),
        );
    }
    if args.policy.is_none() {
        tracing::info!("no policy (--policy): only callers on this host are served");
    }
    Ok(server::Security {
        tls,
        guard,
        admission,
    })
}

/// How a person at a shell runs this binary: `fleetscope` when that is what PATH
/// finds, else its path (quoted for the shell when it needs to be).
fn this_binary() -> String {
    let exe = std::env::current_exe().and_then(|p| p.canonicalize()).ok();
    let on_path = exe.as_ref().is_some_and(|exe| {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths)
                .any(|d| d.join("fleetscope").canonicalize().ok().as_ref() == Some(exe))
        })
    });
    match exe {
        Some(_) if on_path => "fleetscope".into(),
        Some(exe) => {
            let path = exe.display().to_string();
            if path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
            {
                path
            } else {
                format!("'{}'", path.replace('\'', r"'\''"))
            }
        }
        None => "fleetscope".into(),
    }
}

/// Makes the data directory private to this user (0700, its files 0600): it holds
/// the clusters' objects, Secrets among them when they are collected. A directory
/// made by an earlier version with wider modes is narrowed.
fn private(dir: &std::path::Path) -> Result<(), RunError> {
    use std::os::unix::fs::PermissionsExt as _;
    if dir.exists() && !dir.is_dir() {
        return Err(ArgsError::Invalid(format!(
            "--data-dir {}: is not a directory",
            dir.display()
        ))
        .into());
    }
    let fail = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| RunError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(fail(dir))?;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).map_err(fail(&d))?;
        for entry in std::fs::read_dir(&d).map_err(fail(&d))?.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push(path),
                Ok(t) if t.is_file() => {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                        .map_err(fail(&path))?
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A cluster fleetscope talks to besides those it watches (the one that reviews
/// tokens, the one holding a ring's Leases), named by `flag`: `in-cluster`, or a
/// context of the kubeconfigs (any of them, not only those watched).
fn context_source(
    flag: &str,
    context: &str,
    kubeconfigs: &[PathBuf],
) -> Result<fleetscope_informer::ClusterSource, RunError> {
    if context == "in-cluster" {
        return Ok(fleetscope_informer::ClusterSource::in_cluster("in-cluster"));
    }
    sources::resolve(kubeconfigs, &[])?
        .into_iter()
        .find(|s| s.context == context)
        .ok_or_else(|| {
            ArgsError::Invalid(format!(
                "{flag} {context:?}: no such context in the kubeconfigs (or `in-cluster`)"
            ))
            .into()
        })
}

/// The key page tokens are signed with, kept in the data directory (made by
/// [`private`]) so tokens a client holds stay good across a restart; made the first time.
fn token_key(dir: &std::path::Path) -> Result<crate::grpc::TokenKey, RunError> {
    let path = dir.join("page-token.key");
    let write = |source| RunError::Write {
        path: path.clone(),
        source,
    };
    if let Ok(bytes) = fleetscope_model::file::read_capped(&path)
        && let Ok(secret) = <[u8; 32]>::try_from(bytes.as_slice())
    {
        return Ok(crate::grpc::TokenKey::new(&secret));
    }
    let secret = crate::grpc::random_secret()?;
    std::fs::write(&path, secret).map_err(write)?;
    Ok(crate::grpc::TokenKey::new(&secret))
}

/// Binds the metrics listener when one is asked for, before anything starts.
async fn bind_metrics(
    args: &crate::config::flags::ListenerArgs,
) -> Result<Option<tokio::net::TcpListener>, RunError> {
    match &args.metrics_listen {
        Some(addr) => Ok(Some(server::bind(addr).await?)),
        None => Ok(None),
    }
}

/// Serves the metrics of `sources` on `listener` (when given) until `stop`, `/readyz`
/// by `ready`; the layer that counts the gRPC server's calls into them (off without
/// a listener).
fn serve_metrics(
    listener: Option<tokio::net::TcpListener>,
    sources: telemetry::metrics::Sources,
    ready: std::sync::Arc<dyn telemetry::metrics::Readiness>,
    security: &server::Security,
    stop: &tokio_util::sync::CancellationToken,
) -> GrpcLayer {
    let Some(listener) = listener else {
        return GrpcLayer::off();
    };
    let (registry, grpc) = telemetry::metrics::registry(sources);
    if let Ok(addr) = listener.local_addr() {
        let scheme = if security.tls.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!("metrics on {scheme}://{addr}/metrics (and /livez, /readyz)");
    }
    crate::tasks::spawn(
        "metrics-listener",
        telemetry::metrics::serve(
            listener,
            std::sync::Arc::new(registry),
            ready,
            security.clone(),
            stop.clone(),
        ),
    );
    GrpcLayer::new(grpc)
}

/// `fleetscope demo`: simulated clusters and the server over them, in memory.
pub async fn demo(args: DemoArgs) -> Result<(), RunError> {
    let listener = server::bind(&args.engine.listener.listen).await?;
    let fleet = start_fleet(&args.fleet).await?;
    let kubeconfig =
        std::env::temp_dir().join(format!("fleetscope-demo-{}.kubeconfig", std::process::id()));
    let first = write_kubeconfig(&fleet, &kubeconfig)?;
    let clusters = sources::resolve(std::slice::from_ref(&kubeconfig), &[])?;
    let mut config = args.engine.config()?;
    collect_rbac(&mut config, args.security.rbac_authorization);
    let addr = listener.local_addr().map_err(RunError::Listen)?;
    let kc = kubeconfig.display();
    // Resolved once: it reads PATH and the file system.
    let cli = this_binary();
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
         or with the fleetscope CLI (this binary{install}):\n  \
         export FLEETSCOPE_SERVER=http://{addr}\n  \
         {cli} clusters\n  \
         {cli} get pods -l app=web --cluster 'sim-*'\n  \
         {cli} count pods --group-by cluster,field:status.phase\n  \
         {cli} watch configmaps -n team-0\n  \
         kubectl --kubeconfig {kc} --context {first} get pods -A\n\n\
         Ctrl-C stops it.",
        install = if cli == "fleetscope" {
            ""
        } else {
            "; `cargo install --path .` puts it on your PATH as fleetscope"
        },
        n = fleet.servers().len(),
        objects = args.fleet.objects,
        churn = args.fleet.churn,
    );
    // The demo's clusters are new each run, so it keeps its state in memory.
    let metrics = bind_metrics(&args.engine.listener).await?;
    let stop_reloads = tokio_util::sync::CancellationToken::new();
    let fleet_view = std::sync::Arc::new(Deferred::<Engine>::default());
    let mut reloads = Reloads::default();
    let security = secure(
        &args.security,
        Some(&fleet_view),
        std::slice::from_ref(&kubeconfig),
        (
            args.engine.exec_timeout,
            args.engine
                .listener
                .admission(args.security.authenticates()),
        ),
        (&listener, metrics.as_ref()),
        &stop_reloads,
        &mut reloads,
    );
    let security = match security {
        Ok(s) => s,
        Err(e) => {
            fleet.shutdown().await;
            return Err(e);
        }
    };
    let mut service = args
        .engine
        .listener
        .service(crate::grpc::TokenKey::random()?);
    service.inputs = reloads.status();
    let hangups = server::hangups().map_err(RunError::Signal)?;
    crate::tasks::spawn("reloader", reloads.run(hangups, stop_reloads.clone()));
    let result = run(
        fleet_view,
        listener,
        metrics,
        move || Ok(Engine::start(clusters, config)),
        Serving {
            service,
            limits: args.engine.listener.limits(),
            security,
            reloads: stop_reloads.clone(),
            replica: None,
        },
        None,
    )
    .await;
    stop_reloads.cancel();
    fleet.shutdown().await;
    let _ = std::fs::remove_file(&kubeconfig);
    result
}
