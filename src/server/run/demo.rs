//! `fleetscope demo`: simulated clusters and the server over them, in memory.

use fleetscope_model::fleet::Deferred;

use super::sim::{start_fleet, write_kubeconfig};
use super::{RunError, Serving, bind_metrics, run, secure, this_binary};
use crate::config::reload::Reloads;
use crate::config::sim_flags::DemoArgs;
use crate::engine::Engine;
use crate::server;
use crate::sources;

/// The demo's tour: what it prints to try, and what the README's "A tour" holds (a
/// test compares them). Each is a command (`fleetscope` standing for the binary,
/// `ADDR` for the server's address) and what it shows.
const TOUR: &[(&str, &str)] = &[
    (
        "fleetscope clusters",
        "every cluster: freshness, lag, objects",
    ),
    (
        "fleetscope get pods -A -l app=web",
        "kubectl's columns, the CLUSTER first",
    ),
    (
        "fleetscope get deploy,svc -n team-0 --cluster sim-1",
        "several types, a table each",
    ),
    (
        "fleetscope describe deploy web-0 -n team-0",
        "in detail, with its cluster and events",
    ),
    (
        "fleetscope count pods --by cluster,field:status.phase",
        "grouped counts",
    ),
    (
        "fleetscope watch configmaps -n team-0 -o json",
        "resumes by itself across restarts (lists again if it must)",
    ),
    ("grpcurl -plaintext ADDR list", "reflection: the whole API"),
    (
        "grpcurl -plaintext ADDR fleetscope.v1.Fleet/ListClusters",
        "the same over gRPC",
    ),
    (
        "fleetscope kubeconfig --kube-api http://KUBE > fleet.kubeconfig",
        "kubectl's view of the fleet:",
    ),
    (
        "kubectl --kubeconfig fleet.kubeconfig --context fleet get pods -A",
        "the Kubernetes API: every cluster, a CLUSTER column",
    ),
];

/// The tour, each command with `cli` for the binary, `addr` for the server and `kube`
/// for its Kubernetes API, its comment aligned after it.
pub fn tour(cli: &str, addr: &str, kube: &str) -> String {
    let lines: Vec<String> = TOUR
        .iter()
        .map(|(command, _)| {
            let command = command.replace("ADDR", addr).replace("KUBE", kube);
            match command.strip_prefix("fleetscope ") {
                Some(rest) => format!("{cli} {rest}"),
                None => command,
            }
        })
        .collect();
    let width = lines.iter().map(String::len).max().unwrap_or(0) + 2;
    lines
        .iter()
        .zip(TOUR)
        .map(|(line, (_, what))| format!("{line:width$}# {what}\n"))
        .collect()
}

/// The demo's Kubernetes API listener: at `--kube-api-listen`, else on the gRPC
/// listener's address `grpc` one port up, or any free port when that one is taken or
/// the gRPC one was the system's choice (`:0`); the banner says which.
async fn demo_kube_api(
    args: &crate::config::flags::ListenerArgs,
    grpc: std::net::SocketAddr,
) -> Result<tokio::net::TcpListener, RunError> {
    if let Some(addr) = &args.kube_api_listen {
        return Ok(server::bind(addr).await?);
    }
    let chosen = args.listen.rsplit_once(':').is_some_and(|(_, p)| p == "0");
    let next = std::net::SocketAddr::new(grpc.ip(), grpc.port().saturating_add(1));
    if !chosen && let Ok(listener) = server::bind(&next.to_string()).await {
        return Ok(listener);
    }
    let any = std::net::SocketAddr::new(grpc.ip(), 0);
    Ok(server::bind(&any.to_string()).await?)
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
    if args.security.rbac_authorization {
        crate::config::plan::collect(&mut config, &crate::auth::rbac::TYPES);
    }
    let addr = listener.local_addr().map_err(RunError::Listen)?;
    let kube_api = demo_kube_api(&args.engine.listener, addr).await?;
    let kube = kube_api.local_addr().map_err(RunError::Listen)?;
    let kc = kubeconfig.display();
    // Resolved once: it reads PATH and the file system.
    let cli = this_binary();
    say!(
        "fleetscope demo\n\n\
         {n} simulated clusters with ~{objects} objects each and {churn} changes/s, kubeconfig: {kc}\n\
         gRPC server on {addr} (health, reflection and the fleetscope.v1.Fleet contract),\n\
         the Kubernetes API on http://{kube} (kubectl, client-go, kube-rs).\n\n\
         Try (the fleetscope CLI is this binary{install}):\n\n\
         export FLEETSCOPE_SERVER=http://{addr}\n\
         {tour}\n\
         and, against the simulated clusters themselves:\n\n\
         kubectl --kubeconfig {kc} --context {first} get pods -A\n\n\
         Ctrl-C stops it.",
        tour = tour(&cli, &addr.to_string(), &kube.to_string()),
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
            crate::server::tls::Admission::of(&args.engine.listener, args.security.authenticates()),
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
            limits: crate::server::limits::Limits::of(&args.engine.listener),
            security,
            reloads: stop_reloads.clone(),
            replica: None,
            kube_api: Some(kube_api),
        },
        None,
    )
    .await;
    stop_reloads.cancel();
    fleet.shutdown().await;
    let _ = std::fs::remove_file(&kubeconfig);
    result
}
