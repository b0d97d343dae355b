//! `fleetscope serve`: the kubeconfigs' clusters, reloaded as they change, served until
//! SIGTERM.

use fleetscope_model::fleet::Deferred;

use super::{
    RunError, Serving, bind_kube_api, bind_metrics, check_security, context_source, private, run,
    secure, token_key,
};
use crate::config::flags::{ArgsError, ServeArgs};
use crate::config::kubeconfig::KubeconfigSources;
use crate::config::reload::{self, ConfigFile, Reloads};
use crate::engine::{Engine, EngineConfig, SourceSet, Stored};
use crate::server;

/// `serve`'s plan: with delegated authorization, each cluster's RBAC is collected too.
pub fn plan(
    args: &ServeArgs,
) -> Result<
    (crate::config::kubeconfig::KubeconfigSources, EngineConfig),
    crate::config::plan::PlanError,
> {
    crate::config::plan::plan(args, &crate::auth::rbac::TYPES)
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
    let membership = membership(&args, &kubeconfig_paths)?;
    let (settings_tx, mut settings) = tokio::sync::watch::channel(config_now.clone());
    settings.mark_unchanged();
    if args.persist.flush_ms.is_some() {
        tracing::warn!(
            "--flush-ms no longer applies: each store write starts as soon as the previous one ends"
        );
    }
    let data_dir = data_dir(&args)?;
    // Bad security files, like a bad kubeconfig, are an error before any port is bound.
    check_security(&args.security, &kubeconfig_paths)?;
    // What serve writes (the store, its key) is for its own user only.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let listener = server::bind(&args.engine.listener.listen).await?;
    let mut service = args
        .engine
        .listener
        .service(page_token_key(&args, data_dir.as_deref())?);
    let replica = match membership {
        None => None,
        Some((membership, advertise, source)) => {
            let named = format!("{}/{}", membership.ring, membership.identity);
            service.replica = Some(named.parse().map_err(|_| {
                ArgsError::Invalid(format!(
                    "--shard-ring and --shard-identity: {named:?} cannot be sent in a header"
                ))
            })?);
            let leases = super::coordination(
                &source,
                &args.shard.ring.shard_lease_namespace,
                args.engine.exec_timeout,
                &reload,
            )
            .await?;
            Some(join_ring(
                leases, membership, advertise, &desired, &fleet, &reload,
            ))
        }
    };
    // A replica's engine runs the clusters it holds, not every configured one.
    let engine_sources = replica.as_ref().map_or(desired, |r| r.held.clone());
    // The server answers (UNAVAILABLE, health NOT_SERVING) while the store loads.
    let start = move || start_engine(data_dir, engine_sources, config_now);
    let mut reloads = follow_inputs(config, sources, settings_tx, desired_tx);
    let metrics = bind_metrics(&args.engine.listener).await?;
    let kube_api = bind_kube_api(&args.engine.listener).await?;
    let security = secure(
        &args.security,
        Some(&fleet),
        &kubeconfig_paths,
        (
            args.engine.exec_timeout,
            crate::server::tls::Admission::of(&args.engine.listener, args.security.authenticates()),
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
            limits: crate::server::limits::Limits::of(&args.engine.listener),
            security,
            reloads: reload.clone(),
            replica,
            kube_api,
        },
        Some(settings),
    )
    .await;
    reload.cancel();
    let _ = reloader.await;
    result
}

/// How this replica takes part in its ring (when one is named): its membership, the
/// address it publishes, and the coordination cluster, checked before any port is
/// bound.
fn membership(
    args: &ServeArgs,
    kubeconfigs: &[std::path::PathBuf],
) -> Result<
    Option<(
        fleetscope_ring::member::MembershipConfig,
        String,
        fleetscope_informer::ClusterSource,
    )>,
    RunError,
> {
    let Some((membership, advertise)) = args.shard.membership(&args.engine.listener.listen)? else {
        return Ok(None);
    };
    let source = context_source(
        "--shard-coordination",
        &args.shard.ring.shard_coordination,
        kubeconfigs,
    )?;
    Ok(Some((membership, advertise, source)))
}

/// The inputs `serve` follows: its configuration file (new settings and sources),
/// and the kubeconfigs (the clusters).
fn follow_inputs(
    config: Option<ConfigFile>,
    sources: KubeconfigSources,
    settings: tokio::sync::watch::Sender<EngineConfig>,
    desired: tokio::sync::watch::Sender<SourceSet>,
) -> Reloads {
    let mut reloads = Reloads::default();
    let paths = sources.paths.clone();
    let sources = std::sync::Arc::new(std::sync::Mutex::new(sources));
    if let Some(config) = config {
        reloads.follow_config(
            config.path.clone(),
            reload::config_input(
                config,
                |args| plan(args).map_err(|e| crate::sources::chain(&e)),
                sources.clone(),
                settings,
                desired.clone(),
            ),
        );
    }
    reloads.follow(
        "sources",
        "the cluster sources",
        paths,
        reload::sources_input(sources, desired),
    );
    reloads
}

/// Where the store is kept: `--data-dir`, else the platform's user data directory;
/// `None` with `--no-persist`.
fn data_dir(args: &ServeArgs) -> Result<Option<std::path::PathBuf>, RunError> {
    Ok(match &args.persist.data_dir {
        _ if args.persist.no_persist => None,
        Some(d) => Some(d.clone()),
        None => Some(
            dirs::data_dir()
                .ok_or(RunError::NoDataDir)?
                .join("fleetscope"),
        ),
    })
}

/// The key page tokens are signed with: the ring's (a replica's), else the one kept
/// in the data directory, else a fresh one (in memory only, tokens live as long as
/// the process).
fn page_token_key(
    args: &ServeArgs,
    data_dir: Option<&std::path::Path>,
) -> Result<crate::grpc::TokenKey, RunError> {
    Ok(
        match (&args.shard.ring.shard_page_token_key_file, data_dir) {
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
        },
    )
}

/// This replica in its ring: it holds the clusters of `desired` it owns, telling
/// which it holds synced, and making the engine (once started) resume its watches
/// after a gap.
fn join_ring(
    leases: fleetscope_ring::leases::Leases,
    membership: fleetscope_ring::member::MembershipConfig,
    advertise: String,
    desired: &tokio::sync::watch::Receiver<SourceSet>,
    fleet: &std::sync::Arc<Deferred<Engine>>,
    stop: &tokio_util::sync::CancellationToken,
) -> crate::shard::replica::Replica {
    let (engine, resume) = (fleet.clone(), fleet.clone());
    crate::shard::replica::Replica::start(
        leases,
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
        stop.clone(),
    )
}

/// Starts the engine over `sources`: from the store in `data_dir` (opened and
/// verified), or in memory only.
fn start_engine(
    data_dir: Option<std::path::PathBuf>,
    sources: tokio::sync::watch::Receiver<SourceSet>,
    config: EngineConfig,
) -> Result<Engine, RunError> {
    let Some(dir) = data_dir else {
        tracing::info!("running in memory only (--no-persist)");
        return Ok(Engine::start_live(sources, config, None));
    };
    let opened = fleetscope_store::SledStore::open(&dir).map_err(|source| RunError::Store {
        dir: dir.clone(),
        source,
    })?;
    tracing::info!(dir = %dir.display(), objects = opened.loaded.objects.len(), revision = %opened.loaded.revision, "store opened");
    let stored = Stored {
        store: std::sync::Arc::new(opened.store),
        loaded: opened.loaded,
    };
    Ok(Engine::start_live(sources, config, Some(stored)))
}
