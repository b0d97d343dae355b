//! The plan of `serve`'s settings: the cluster sources and the engine's settings its
//! flags and file give, checked, with no side effect but reading `$KUBECONFIG`. Made
//! at start, by `config check`, and on each reload of the configuration file (whose
//! result the engine follows).

use fleetscope_engine::EngineConfig;

use super::flags::{ArgsError, ServeArgs, ensure, mib};
use super::kubeconfig::KubeconfigSources;

/// Settings that do not make a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A setting is invalid.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The kubeconfigs cannot be found.
    #[error(transparent)]
    Kubeconfig(#[from] fleetscope_informer::SourceError),
}

/// The cluster sources and engine settings of `args`; with delegated authorization
/// (`--rbac-authorization`), `authorization_types` are collected too, so that each
/// cluster's RBAC is read from its objects like any others.
pub fn plan(
    args: &ServeArgs,
    authorization_types: &[&str],
) -> Result<(KubeconfigSources, EngineConfig), PlanError> {
    let only_in_cluster =
        args.in_cluster && args.kubeconfigs.is_empty() && std::env::var_os("KUBECONFIG").is_none();
    let sources = KubeconfigSources {
        paths: if only_in_cluster {
            Vec::new()
        } else {
            fleetscope_informer::source::kubeconfig_paths(&args.kubeconfigs)?
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
    ensure(
        p.snapshot_cpu_share.is_finite() && (0.0..=1.0).contains(&p.snapshot_cpu_share),
        "--snapshot-cpu-share must be a number from 0 to 1",
    )?;
    if args.security.rbac_authorization {
        collect(&mut config, authorization_types);
    }
    config.keep_removed_clusters = p.keep_removed_clusters;
    config.persist.log_share = p.event_log_disk_share;
    config.persist.compact_share = p.compact_share;
    config.persist.compact_min_bytes = p.compact_min_mib.saturating_mul(1 << 20);
    config.persist.snapshot_log_bytes = mib(p.snapshot_log_mib);
    config.persist.snapshot_cpu_share = p.snapshot_cpu_share;
    Ok((sources, config))
}

/// Adds `types` to what `config` collects, unless it collects every type.
pub fn collect(config: &mut EngineConfig, types: &[&str]) {
    if config.resources.iter().any(|r| r == "*") {
        return;
    }
    for t in types {
        if !config.resources.iter().any(|r| r == t) {
            config.resources.push(t.to_string());
        }
    }
}
