//! The reload of `serve`'s inputs while it runs: the kubeconfig files and the
//! configuration file. Each file's directory is watched (editors and Kubernetes
//! Secret and ConfigMap volumes replace files by rename), changes are debounced, and
//! SIGHUP reloads too.
//!
//! A configuration file that changes is resolved again with the same command line
//! and environment (flags still win). What it changes applies at once: the cluster
//! sources (kubeconfigs, contexts, aliases) and what each cluster collects and how
//! (resources, scopes, pruning, cluster labels, exec timeout), leaving unaffected
//! streams undisturbed. Settings that shape the process (listen addresses, the data
//! directory, buffer and retention sizes, field indexes) take effect at the next
//! restart, and the reload says so. A file that fails to resolve keeps the last good
//! configuration in force and says why: an error log line,
//! `fleetscope_config_last_reload_successful` 0, and the reason in `ListClusters`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::flags::ServeArgs;
use super::kubeconfig::{self, KubeconfigSources};
use super::resolve::{self, Row, value};
use super::settings::Applies;
use crate::engine::{EngineConfig, SourceSet};

/// How long file events settle before a reload.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// The configuration file in use and the command line it is resolved with.
pub struct ConfigFile {
    /// The file.
    pub path: PathBuf,
    /// The process's command line.
    pub argv: Vec<OsString>,
    /// The command line's definition.
    pub command: clap::Command,
    /// The settings of the last good resolution.
    pub last: Vec<Row>,
}

/// What `serve` reloads and where the results go.
pub struct Reloader {
    /// The cluster sources in force.
    pub sources: KubeconfigSources,
    /// The configuration file, when `serve` has one.
    pub config: Option<ConfigFile>,
    /// The engine's desired clusters.
    pub desired: watch::Sender<SourceSet>,
    /// The engine's settings, followed by the engine once it runs.
    pub settings: watch::Sender<EngineConfig>,
}

/// The kubeconfig sources and engine settings of resolved `serve` flags.
pub type Plan = fn(&ServeArgs) -> Result<(KubeconfigSources, EngineConfig), String>;

impl Reloader {
    /// Reloads whenever a watched file changes or `hangups` fires, until `cancel`.
    pub async fn run(
        mut self,
        plan: Plan,
        mut hangups: mpsc::Receiver<()>,
        cancel: CancellationToken,
    ) {
        let (changed_tx, mut changed) = mpsc::channel::<()>(1);
        let mut watched = self.files();
        // Kept alive while reloading; replaced when the files followed change.
        let mut _watcher = watch_files(&watched, changed_tx.clone());
        loop {
            let why = tokio::select! {
                Some(()) = changed.recv() => "a watched file changed",
                Some(()) = hangups.recv() => "SIGHUP",
                _ = cancel.cancelled() => return,
            };
            ReloadCounts::count(&RELOADS.config);
            if let Err(e) = self.reload_config(plan, why) {
                tracing::error!(reason = why, error = %e, "the configuration cannot be reloaded: the last good one stays in force");
                let now = SystemTime::now();
                self.desired.send_modify(|set| {
                    set.error = Some((format!("configuration file: {e}"), now));
                });
                continue;
            }
            kubeconfig::apply(&self.sources, &self.desired, why);
            let now_watched = self.files();
            if now_watched != watched {
                _watcher = watch_files(&now_watched, changed_tx.clone());
                watched = now_watched;
            }
        }
    }

    /// Resolves the configuration file again and hands on what changed.
    fn reload_config(&mut self, plan: Plan, why: &str) -> Result<(), String> {
        let Some(config) = &mut self.config else {
            return Ok(());
        };
        let resolved = resolve::resolve(config.command.clone(), &config.argv, &config.path)
            .map_err(|e| e.to_string())?;
        let Some(args) = resolved.serve().map_err(|e| e.to_string())? else {
            return Err("the command line is not `serve`".into());
        };
        let (sources, engine) = plan(&args)?;
        for row in resolved.rows.iter() {
            let flag = row.flag.as_str();
            let (was, now) = (value(&config.last, flag), Some(row.value.as_str()));
            if row.applies == Some(Applies::Restart) && was != now {
                tracing::warn!(
                    setting = flag,
                    was = was.unwrap_or(""),
                    now = now.unwrap_or(""),
                    "changed in the configuration file: takes effect at the next restart"
                );
            }
        }
        let changed: Vec<&str> = resolved
            .rows
            .iter()
            .filter(|r| value(&config.last, &r.flag) != Some(r.value.as_str()))
            .map(|r| r.key)
            .collect();
        tracing::info!(reason = why, file = %config.path.display(), changed = ?changed, "configuration reloaded");
        config.last = resolved.rows;
        self.sources = sources;
        self.settings.send_replace(engine);
        Ok(())
    }

    /// The directories to watch: each kubeconfig's and the configuration file's.
    /// The files followed: the kubeconfigs and the configuration file.
    fn files(&self) -> Vec<PathBuf> {
        let mut files = self.sources.files().to_vec();
        if let Some(c) = &self.config {
            files.push(c.path.clone());
        }
        files.sort();
        files.dedup();
        files
    }
}

/// A file's directory (`.` for a bare name).
fn parent(path: &Path) -> PathBuf {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// A file watcher, kept alive while it is wanted.
pub(crate) type Watcher = notify_debouncer_full::Debouncer<
    notify_debouncer_full::notify::RecommendedWatcher,
    notify_debouncer_full::RecommendedCache,
>;

/// Watches `files`, signalling `changed` (debounced) when the content of one of them
/// changed: written, created, removed or renamed over, directly or by Kubernetes'
/// `..data` swap of a Secret or ConfigMap volume. Each file's directory is watched
/// (a rename over a file is an event of its directory); opening or reading a file is
/// no change, and neither is a write that leaves every followed file's content as it
/// was, so a reload (which reads them) never causes the next.
pub(crate) fn watch_files(files: &[PathBuf], changed: mpsc::Sender<()>) -> Option<Watcher> {
    use notify_debouncer_full::notify::{EventKind, RecursiveMode};
    let mut files: Vec<PathBuf> = files.to_vec();
    files.sort();
    files.dedup();
    let mut dirs: Vec<PathBuf> = files.iter().map(|f| parent(f)).collect();
    dirs.sort();
    dirs.dedup();
    if dirs.is_empty() {
        return None;
    }
    let names: Vec<std::ffi::OsString> = files
        .iter()
        .filter_map(|f| f.file_name().map(ToOwned::to_owned))
        .collect();
    let follows = move |path: &Path| {
        path.file_name()
            .is_some_and(|n| n == KUBERNETES_SWAP || names.iter().any(|f| f == n))
    };
    let mut seen = fingerprint(&files);
    let mut debouncer = match notify_debouncer_full::new_debouncer(
        DEBOUNCE,
        None,
        move |result: notify_debouncer_full::DebounceEventResult| {
            let Ok(events) = result else { return };
            let touched = events.iter().any(|e| {
                !matches!(e.kind, EventKind::Access(_)) && e.paths.iter().any(|p| follows(p))
            });
            if !touched {
                return;
            }
            let now = fingerprint(&files);
            if now != seen {
                seen = now;
                // A reload is already due when this is full.
                let _ = changed.try_send(());
            }
        },
    ) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch files for changes: they reload on SIGHUP only");
            return None;
        }
    };
    for dir in &dirs {
        if let Err(e) = debouncer.watch(dir, RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a directory: its files reload on SIGHUP only");
        }
    }
    Some(debouncer)
}

/// The link a Kubernetes Secret or ConfigMap volume swaps to publish new files.
const KUBERNETES_SWAP: &str = "..data";

/// What the followed files hold now: a hash of each one's content (`None` when it
/// cannot be read).
fn fingerprint(files: &[PathBuf]) -> Vec<Option<u64>> {
    use std::hash::{Hash, Hasher};
    files
        .iter()
        .map(|f| {
            std::fs::read(f).ok().map(|bytes| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                h.finish()
            })
        })
        .collect()
}

/// How many times each input of `serve` was reloaded since start (the configuration
/// file with the kubeconfigs, the tokens file, the policy, the TLS files), for
/// metrics: a reload that did not follow a change would show here.
#[derive(Debug, Default)]
pub struct ReloadCounts {
    /// The configuration file and kubeconfigs.
    pub config: std::sync::atomic::AtomicU64,
    /// The tokens file.
    pub tokens: std::sync::atomic::AtomicU64,
    /// The policy file.
    pub policy: std::sync::atomic::AtomicU64,
    /// The TLS certificate, key and client CA.
    pub tls: std::sync::atomic::AtomicU64,
}

impl ReloadCounts {
    /// Counts one reload of `input`.
    pub fn count(input: &std::sync::atomic::AtomicU64) {
        input.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Each input's name and count.
    pub fn read(&self) -> [(&'static str, u64); 4] {
        use std::sync::atomic::Ordering::Relaxed;
        [
            ("config", self.config.load(Relaxed)),
            ("tokens", self.tokens.load(Relaxed)),
            ("policy", self.policy.load(Relaxed)),
            ("tls", self.tls.load(Relaxed)),
        ]
    }
}

/// The reloads of this process.
pub static RELOADS: ReloadCounts = ReloadCounts {
    config: std::sync::atomic::AtomicU64::new(0),
    tokens: std::sync::atomic::AtomicU64::new(0),
    policy: std::sync::atomic::AtomicU64::new(0),
    tls: std::sync::atomic::AtomicU64::new(0),
};
