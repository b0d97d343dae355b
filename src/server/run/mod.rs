//! The commands that run: `serve` (kubeconfig clusters, reloaded as they change),
//! `router` (a ring's replicas served whole), `demo` (simulated clusters and the
//! server over them), `sim` (the simulator alone) and `config` (a configuration file
//! checked, the settings listed), one file each; here what they share. The server
//! answers at once, starts the engine beside it, and on SIGTERM stops within its
//! grace period.

use std::path::PathBuf;
use std::time::Duration;

use fleetscope_model::fleet::Deferred;

use crate::config::flags::{ArgsError, SecurityArgs};
use crate::config::kubeconfig::LoadError;
use crate::config::reload::{self, Reloads};
use crate::config::resolve::ResolveError;
use crate::engine::{Engine, EngineConfig};
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
    /// The settings make no plan.
    #[error(transparent)]
    Plan(#[from] crate::config::plan::PlanError),
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
    Security(#[from] fleetscope_model::yaml::FileError),
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

mod config;
mod demo;
mod route;
mod serve;
mod sim;

pub use config::{config_check, config_settings};
pub use demo::{demo, tour};
pub use route::router;
pub use serve::{plan, serve};
pub use sim::sim;

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
    /// The Kubernetes API's listener, when it is served.
    kube_api: Option<tokio::net::TcpListener>,
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
        kube_api,
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
    let service = FleetService::new(gated.clone(), service, stop.clone());
    let positions = crate::kubeapi::routed::Positions::Revisions;
    serve_kube_api(kube_api, (&gated, positions), &security, &service, &stop);
    let counted = serve_metrics(
        metrics,
        telemetry::metrics::Sources {
            engine: Some(fleet.clone()),
            router: None,
            subscribers: service.subscribers(),
            inputs,
            shard: replica.as_ref().map(|r| r.status.clone()),
            server: crate::server::probes::figures,
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
    let engine = match start_engine(start, decided, &stop).await {
        Started::Engine(engine) => engine,
        Started::Stopped => return server.await?.map_err(RunError::from),
        Started::Failed(e) => {
            stop.cancel();
            let _ = server.await;
            signal.abort();
            return Err(e);
        }
    };
    fleet.set(engine.clone());
    let _ = started_tx.send(engine.clone());
    if let Some(settings) = settings {
        engine.follow(settings);
    }
    stop.cancelled().await;
    reloads.cancel();
    shut_down(server, &engine).await
}

/// How the engine's start ended.
enum Started {
    /// Started.
    Engine(std::sync::Arc<Engine>),
    /// The process was told to stop first.
    Stopped,
    /// It could not start.
    Failed(RunError),
}

/// Starts the engine with `start` off the async workers, once a replica has
/// `decided` what it holds; unless `stop` comes first.
async fn start_engine(
    start: impl FnOnce() -> Result<Engine, RunError> + Send + 'static,
    decided: Option<impl Future<Output = ()> + Send + 'static>,
    stop: &tokio_util::sync::CancellationToken,
) -> Started {
    let starting = crate::tasks::spawn("engine-start", async move {
        if let Some(decided) = decided {
            decided.await;
        }
        crate::tasks::spawn_blocking("engine-start", start).await
    });
    let started = tokio::select! {
        e = starting => e,
        _ = stop.cancelled() => return Started::Stopped,
    };
    match started {
        Ok(Ok(Ok(engine))) => Started::Engine(std::sync::Arc::new(engine)),
        Ok(Ok(Err(e))) => Started::Failed(e),
        Ok(Err(e)) | Err(e) => Started::Failed(RunError::Task(e)),
    }
}

/// Stops in order, within the grace period: the server (ending open calls), the
/// engine (writing what is pending), then every other task. Whatever a cluster, a
/// client or a credential plugin is doing, the process ends within the grace period
/// (and a little for the final store write's own bound).
async fn shut_down(
    server: tokio::task::JoinHandle<Result<(), server::ServerError>>,
    engine: &Engine,
) -> Result<(), RunError> {
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

/// The checks `serve` makes of its security settings before it serves, with no side
/// effect: the flags that go together, the TLS, tokens and policy files, and the
/// reviewing cluster's context.
fn check_security(args: &SecurityArgs, kubeconfigs: &[PathBuf]) -> Result<(), RunError> {
    paired(args)?;
    if let Some(files) = crate::server::tls::TlsFiles::of(args) {
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
    let tls_files = crate::server::tls::TlsFiles::of(args);
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
    if let Some(rbac) = files.rbac {
        crate::tasks::spawn("rbac-follower", rbac);
    }
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

/// The ring's Leases in `namespace` of the coordination cluster `source`, their
/// credential (when it expires) renewed by a task until `stop`.
async fn coordination(
    source: &fleetscope_informer::ClusterSource,
    namespace: &str,
    exec_timeout: Duration,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<fleetscope_ring::leases::Leases, RunError> {
    let (leases, renewal) =
        fleetscope_ring::leases::Leases::connect(source, namespace, exec_timeout, stop.clone())
            .await?;
    if let Some(renewal) = renewal {
        crate::tasks::spawn("coordination-credential", renewal);
    }
    Ok(leases)
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

/// The Kubernetes API's listener, bound when `--kube-api-listen` is set.
async fn bind_kube_api(
    args: &crate::config::flags::ListenerArgs,
) -> Result<Option<tokio::net::TcpListener>, RunError> {
    match &args.kube_api_listen {
        Some(addr) => Ok(Some(server::bind(addr).await?)),
        None => Ok(None),
    }
}

/// Serves the Kubernetes API over `fleet` on `listener` (when given) until `stop`,
/// secured as the gRPC listener is, beside the gRPC service `grpc` (its page token key,
/// its per-caller Watch limit).
fn serve_kube_api<F: fleetscope_model::Fleet + 'static, G: fleetscope_model::Fleet>(
    listener: Option<tokio::net::TcpListener>,
    (fleet, positions): (&std::sync::Arc<F>, crate::kubeapi::routed::Positions),
    security: &server::Security,
    grpc: &FleetService<G>,
    stop: &tokio_util::sync::CancellationToken,
) {
    let Some(listener) = listener else {
        return;
    };
    if let Ok(addr) = listener.local_addr() {
        let scheme = if security.tls.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(
            "the Kubernetes API on {scheme}://{addr} (the fleet at /clusters/*, a cluster at /clusters/NAME)"
        );
    }
    let guard = std::sync::Arc::new(security.guard.clone());
    let api = crate::kubeapi::KubeApi::new(fleet.clone(), guard, grpc, positions);
    crate::tasks::spawn(
        "kube-api-listener",
        server::kube_api::serve(
            listener,
            std::sync::Arc::new(api),
            security.clone(),
            stop.clone(),
        ),
    );
}

/// Serves the metrics of `sources` on `listener` (when given) until `stop`, `/readyz`
/// by `ready`; the layer that counts the gRPC server's calls into them (off without
/// a listener).
fn serve_metrics(
    listener: Option<tokio::net::TcpListener>,
    sources: telemetry::metrics::Sources,
    ready: std::sync::Arc<dyn crate::server::probes::Readiness>,
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
        crate::server::probes::serve(
            listener,
            std::sync::Arc::new(registry),
            ready,
            security.clone(),
            stop.clone(),
        ),
    );
    GrpcLayer::new(grpc)
}
