//! `fleetscope sim`: simulated clusters and a kubeconfig for them.

use fleetscope_sim::SimFleet;

use super::RunError;
use crate::config::sim_flags::{FleetArgs, SimArgs};
use crate::server;

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

/// The simulated clusters `args` asks for, started.
pub(super) async fn start_fleet(args: &FleetArgs) -> Result<SimFleet, RunError> {
    let spec = args.spec()?;
    let fleet = SimFleet::start(&spec).await.map_err(RunError::Sim)?;
    for s in fleet.servers() {
        tracing::info!(cluster = s.cluster().name(), url = %s.url(), "simulated cluster");
    }
    Ok(fleet)
}

/// Writes the fleet's kubeconfig; returns its first context, for the printed examples.
pub(super) fn write_kubeconfig(
    fleet: &SimFleet,
    path: &std::path::Path,
) -> Result<String, RunError> {
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
