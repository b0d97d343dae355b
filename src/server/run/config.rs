//! `fleetscope config check` and `fleetscope config settings`.

use super::{RunError, check_security, plan};
use crate::config::resolve::Row;

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
/// declaration, as an aligned table or (`markdown`) the reference `docs/settings.md`
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
