//! `fleetscope router`: a ring's replicas served whole.

use std::time::Duration;

use super::{
    RunError, SHUTDOWN_GRACE, bind_kube_api, bind_metrics, check_security, context_source,
    coordination, secure, serve_kube_api, serve_metrics,
};
use crate::config::reload::{self, ConfigFile, Reloads};
use crate::grpc::FleetService;
use crate::server;
use crate::telemetry;

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
    let kube_api = bind_kube_api(&args.listener).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let observed = follow_ring(&args, &source, &ring, &key, &stop).await?;
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
        follow_config(&mut reloads, config);
    }
    let security = secure(
        &args.security,
        None,
        &kubeconfigs,
        (
            EXEC_TIMEOUT,
            crate::server::tls::Admission::of(&args.listener, args.security.authenticates()),
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
    let positions = crate::kubeapi::routed::Positions::Tokens;
    serve_kube_api(kube_api, (&router, positions), &security, &service, &stop);
    let counted = serve_metrics(
        metrics,
        telemetry::metrics::Sources {
            engine: None,
            router: Some(router.clone()),
            subscribers: service.subscribers(),
            inputs,
            shard: None,
            server: crate::server::probes::figures,
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
        crate::server::limits::Limits::of(&args.listener),
        security,
    )
    .await;
    stop.cancel();
    let _ = crate::tasks::shutdown(SHUTDOWN_GRACE).await;
    served?;
    Ok(())
}

/// The ring's Leases in the coordination cluster `source`, followed by a task until
/// `stop`: who the replicas are and what each publishes, as far as its seal holds.
async fn follow_ring(
    args: &crate::config::flags::RouterArgs,
    source: &fleetscope_informer::ClusterSource,
    ring: &str,
    key: &crate::grpc::TokenKey,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<tokio::sync::watch::Receiver<fleetscope_ring::lease::Observed>, RunError> {
    let leases = coordination(source, &args.ring.shard_lease_namespace, EXEC_TIMEOUT, stop).await?;
    let (observed_tx, observed) =
        tokio::sync::watch::channel(fleetscope_ring::lease::Observed::new(
            ring,
            args.ring.shard_lease_duration,
            crate::config::flags::lease_key(key),
        ));
    crate::tasks::spawn(
        "lease-follower",
        fleetscope_ring::lease::follow(leases, ring.to_string(), observed_tx, stop.clone()),
    );
    Ok(observed)
}

/// The router's configuration file followed: each change checked again, and logged
/// as taking effect at the next restart.
fn follow_config(reloads: &mut Reloads, config: ConfigFile) {
    reloads.follow_config(
        config.path.clone(),
        reload::restart_input(config, |resolved| match resolved.router() {
            Ok(Some(args)) => args.ring_and_key().map(|_| ()).map_err(|e| e.to_string()),
            Ok(None) => Err("the command line is not `router`".into()),
            Err(e) => Err(e.to_string()),
        }),
    );
}

/// How long an exec credential plugin may run for the router's coordination cluster.
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);
