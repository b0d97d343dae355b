//! `fleetscope demo`: simulated clusters and the server over them, in memory.

use fleetscope_model::fleet::Deferred;

use super::sim::{start_fleet, write_kubeconfig};
use super::{RunError, Serving, bind_metrics, run, secure, this_binary};
use crate::config::reload::Reloads;
use crate::config::sim_flags::DemoArgs;
use crate::engine::Engine;
use crate::server;
use crate::sources;

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
        },
        None,
    )
    .await;
    stop_reloads.cancel();
    fleet.shutdown().await;
    let _ = std::fs::remove_file(&kubeconfig);
    result
}
