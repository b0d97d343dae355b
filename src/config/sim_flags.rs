//! The flags of `demo` and `sim`: the simulated fleet (clusters, objects, churn, the
//! simulator's faults), and what `demo` serves it with.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use fleetscope_sim::FleetSpec;

use super::flags::{ArgsError, EngineArgs, SecurityArgs, ensure};

/// The simulated clusters of `demo` and `sim`.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// How many clusters.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub clusters: u16,
    /// Cluster names, comma-separated (overrides --clusters); default sim-1 … sim-N.
    #[arg(long, value_delimiter = ',')]
    pub names: Vec<String>,
    /// About how many objects per cluster.
    #[arg(long, default_value_t = 2000)]
    pub objects: usize,
    /// Changes per second per cluster.
    #[arg(long, default_value_t = 20.0)]
    pub churn: f64,
    /// How many resourceVersions each cluster's watch cache trails its storage: a
    /// `resourceVersion=0` list may be that much older than a consistent one.
    #[arg(long, default_value_t = 0)]
    pub cache_lag: u64,
    /// How the clusters answer streaming lists (`sendInitialEvents=true`): `served`,
    /// `refused` (422, as an API server without the WatchList feature), `ignored`
    /// (a plain watch) or `unknown` (422, as an API server from before WatchList, v1.19 to
    /// v1.26, forbids `resourceVersionMatch` on a watch).
    #[arg(long, default_value = "served", value_parser = ["served", "refused", "ignored", "unknown"])]
    pub streaming_lists: String,
    /// How long each cluster waits before answering a request, as a distant API server
    /// would (e.g. 20ms); none by default.
    #[arg(long, default_value = "0s", value_parser = crate::config::parse_duration)]
    pub latency: Duration,
}

impl FleetArgs {
    /// The simulated fleet, checked.
    pub fn spec(&self) -> Result<FleetSpec, ArgsError> {
        ensure(
            self.churn.is_finite() && self.churn >= 0.0,
            "--churn must be a number of changes per second, 0 or more",
        )?;
        let mut spec = FleetSpec::numbered(self.clusters.into(), self.objects, self.churn);
        if !self.names.is_empty() {
            for n in &self.names {
                ensure(
                    !n.is_empty()
                        && n.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'),
                    "--names: {n:?} is not a usable context name (letters, digits, '-', '_', '.')",
                )?;
            }
            spec.names = self.names.clone();
        }
        spec.cache_lag = self.cache_lag;
        spec.latency = self.latency;
        spec.watch_list = match self.streaming_lists.as_str() {
            "refused" => fleetscope_sim::WatchListSupport::Refused,
            "ignored" => fleetscope_sim::WatchListSupport::Ignored,
            "unknown" => fleetscope_sim::WatchListSupport::Unknown,
            _ => fleetscope_sim::WatchListSupport::Served,
        };
        Ok(spec)
    }
}

/// `demo`'s flags.
#[derive(Debug, Args)]
pub struct DemoArgs {
    #[allow(missing_docs)]
    #[command(flatten)]
    pub fleet: FleetArgs,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub engine: EngineArgs,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// `sim`'s flags.
#[derive(Debug, Args)]
pub struct SimArgs {
    #[allow(missing_docs)]
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Where to write the kubeconfig with one context per cluster.
    #[arg(long, default_value = "sim.kubeconfig")]
    pub kubeconfig_out: PathBuf,
}

#[cfg(test)]
mod tests {
    use clap::Args as _;

    use super::*;

    fn sim_spec(args: &[&str]) -> Result<FleetSpec, String> {
        use clap::FromArgMatches as _;
        let matches = SimArgs::augment_args(clap::Command::new("sim"))
            .try_get_matches_from([&["sim"], args].concat())
            .map_err(|e| e.to_string())?;
        let sim = SimArgs::from_arg_matches(&matches).map_err(|e| e.to_string())?;
        sim.fleet.spec().map_err(|e| e.to_string())
    }

    #[test]
    fn simulated_clusters_take_a_latency_a_cache_lag_and_a_streaming_list_answer() {
        let spec = sim_spec(&[
            "--latency",
            "20ms",
            "--cache-lag",
            "3",
            "--streaming-lists",
            "refused",
        ])
        .unwrap();
        assert_eq!(spec.latency, std::time::Duration::from_millis(20));
        assert_eq!(spec.cache_lag, 3);
        assert_eq!(spec.watch_list, fleetscope_sim::WatchListSupport::Refused);
        assert_eq!(
            sim_spec(&["--streaming-lists", "unknown"])
                .unwrap()
                .watch_list,
            fleetscope_sim::WatchListSupport::Unknown
        );
        assert_eq!(sim_spec(&[]).unwrap().latency, std::time::Duration::ZERO);
        let e = sim_spec(&["--latency", "soon"]).unwrap_err();
        assert!(e.contains("--latency") && e.contains("soon"), "{e}");
    }
}
