//! The reload of `serve`'s (and `router`'s) inputs while it runs, in one place: the configuration
//! file, the kubeconfigs (the cluster sources), the tokens file, the policy and the
//! TLS files. One [`Reloads`] hub follows them all: one debounced watcher over the
//! directories of the files it follows (editors and Kubernetes Secret and ConfigMap
//! volumes replace files by rename; a change is the content of a followed file, or
//! Kubernetes' `..data` swap, never another file of the directory) and one SIGHUP
//! stream (every input reloads). Each input publishes its status (when the version
//! in force was loaded, how many reloads, why the last one failed), served in
//! `ListClusters` and the metrics.
//!
//! A configuration file that changes is resolved again with the same command line
//! and environment (flags still win). What it changes applies at once: the cluster
//! sources (kubeconfigs, contexts, aliases) and what each cluster collects and how
//! (resources, scopes, pruning, cluster labels, exec timeout), leaving unaffected
//! streams undisturbed. Settings declared to apply at restart ([`super::flags`])
//! take effect at the next restart, and the reload says so. An input that fails to
//! reload keeps its last good version in force and says why: an error log line, its
//! status, and for the configuration and the kubeconfigs `sources_error` in
//! `ListClusters`.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::flags::ServeArgs;
use super::kubeconfig::{self, KubeconfigSources};
use super::resolve::{self, Row, value};
use super::settings::Applies;
use crate::engine::{EngineConfig, SourceSet};
pub use fleetscope_model::inputs::{InputStatus, Inputs, no_inputs};

/// How long file events settle before a reload.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// What a reload did.
#[derive(Debug, Default)]
pub struct Reloaded {
    /// What changed, for the log; `None` when nothing did (nothing is logged).
    pub said: Option<String>,
    /// The input's files from now on, when they changed.
    pub files: Option<Vec<PathBuf>>,
    /// Inputs to reload after this one (the cluster sources after the configuration).
    pub then: Vec<&'static str>,
}

impl Reloaded {
    /// A reload that changed what `said` says.
    pub fn said(said: impl Into<String>) -> Self {
        Self {
            said: Some(said.into()),
            ..Self::default()
        }
    }
}

/// Reads an input again (`why` says what asked); an error keeps the version in force.
pub type Reload = Box<dyn FnMut(&str) -> Result<Reloaded, String> + Send>;

struct Input {
    name: &'static str,
    /// How log lines name it (`the policy`).
    what: &'static str,
    files: Vec<PathBuf>,
    reload: Reload,
}

/// Every input that reloads, the one watcher of their files and SIGHUP.
pub struct Reloads {
    inputs: Vec<Input>,
    status: watch::Sender<Vec<InputStatus>>,
}

impl Default for Reloads {
    fn default() -> Self {
        Self {
            inputs: Vec::new(),
            status: watch::channel(Vec::new()).0,
        }
    }
}

impl Reloads {
    /// Follows the configuration file at `path` as the input `config`, reloaded with
    /// `reload`.
    pub fn follow_config(&mut self, path: PathBuf, reload: Reload) {
        self.follow("config", "the configuration", vec![path], reload);
    }

    /// Follows an input loaded just now from `files`: `reload` reads it again when
    /// one of them changes and on SIGHUP. Inputs reload in the order they are followed.
    pub fn follow(
        &mut self,
        name: &'static str,
        what: &'static str,
        files: Vec<PathBuf>,
        reload: Reload,
    ) {
        let status = InputStatus {
            input: name,
            files: files.clone(),
            loaded_at: SystemTime::now(),
            reloads: 0,
            error: None,
        };
        self.status.send_modify(|s| s.push(status));
        self.inputs.push(Input {
            name,
            what,
            files,
            reload,
        });
    }

    /// The status of every input, as it changes.
    pub fn status(&self) -> Inputs {
        self.status.subscribe()
    }

    /// Reloads whenever a followed file changes or `hangups` fires, until `cancel`.
    pub async fn run(mut self, mut hangups: mpsc::Receiver<()>, cancel: CancellationToken) {
        let (changed_tx, mut changed) = mpsc::unbounded_channel::<Vec<PathBuf>>();
        let mut followed = self.files();
        // Kept alive while reloading; replaced when the files followed change.
        let mut _watcher = watch_files(&followed, changed_tx.clone());
        loop {
            let (why, due): (&str, Vec<usize>) = tokio::select! {
                Some(paths) = changed.recv() => ("a watched file changed", self.following(&paths)),
                Some(()) = hangups.recv() => ("SIGHUP", (0..self.inputs.len()).collect()),
                _ = cancel.cancelled() => return,
            };
            self.reload(due, why);
            let now = self.files();
            if now != followed {
                _watcher = watch_files(&now, changed_tx.clone());
                followed = now;
            }
        }
    }

    /// The inputs that follow one of `paths`.
    fn following(&self, paths: &[PathBuf]) -> Vec<usize> {
        (0..self.inputs.len())
            .filter(|&i| self.inputs[i].files.iter().any(|f| paths.contains(f)))
            .collect()
    }

    /// Reloads the inputs `due` (by index), then those they name, each once.
    fn reload(&mut self, due: Vec<usize>, why: &str) {
        let mut queue: VecDeque<usize> = due.into();
        let mut done = Vec::new();
        while let Some(i) = queue.pop_front() {
            if done.contains(&i) {
                continue;
            }
            done.push(i);
            let input = &mut self.inputs[i];
            let result = (input.reload)(why);
            let now = SystemTime::now();
            let (name, what) = (input.name, input.what);
            match result {
                Ok(reloaded) => {
                    if let Some(said) = &reloaded.said {
                        tracing::info!(input = name, reason = why, "{said}");
                    }
                    if let Some(files) = reloaded.files {
                        input.files = files;
                    }
                    let files = input.files.clone();
                    self.status.send_modify(|s| {
                        if let Some(s) = s.iter_mut().find(|s| s.input == name) {
                            s.reloads += 1;
                            s.files = files;
                            s.loaded_at = now;
                            s.error = None;
                        }
                    });
                    for then in reloaded.then {
                        if let Some(j) = self.inputs.iter().position(|i| i.name == then) {
                            queue.push_back(j);
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(input = name, reason = why, error = %e, "{what} cannot be reloaded: the last good one stays in force");
                    self.status.send_modify(|s| {
                        if let Some(s) = s.iter_mut().find(|s| s.input == name) {
                            s.reloads += 1;
                            s.error = Some((e, now));
                        }
                    });
                }
            }
        }
    }

    /// Every file followed.
    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.inputs.iter().flat_map(|i| i.files.clone()).collect();
        files.sort();
        files.dedup();
        files
    }
}

/// The configuration file in use and the command line it is resolved with.
pub struct ConfigFile {
    /// The file.
    pub path: PathBuf,
    /// The command it configures: `serve` or `router`.
    pub subcommand: &'static str,
    /// The process's command line.
    pub argv: Vec<OsString>,
    /// The command line's definition.
    pub command: clap::Command,
    /// The settings of the last good resolution.
    pub last: Vec<Row>,
}

/// The kubeconfig sources and engine settings of resolved `serve` flags.
pub type Plan = fn(&ServeArgs) -> Result<(KubeconfigSources, EngineConfig), String>;

/// The configuration file as an input: resolved again, it hands new cluster sources
/// to `sources` (then reloaded) and new engine settings to `settings`.
pub fn config_input(
    mut config: ConfigFile,
    plan: Plan,
    sources: Arc<Mutex<KubeconfigSources>>,
    settings: watch::Sender<EngineConfig>,
    desired: watch::Sender<SourceSet>,
) -> Reload {
    Box::new(move |_why| {
        let result = reload_config(&mut config, plan);
        let (new_sources, engine, changed) = match result {
            Ok(r) => r,
            Err(e) => {
                let now = SystemTime::now();
                desired.send_modify(|set| {
                    set.error = Some((format!("configuration file: {e}"), now));
                });
                return Err(e);
            }
        };
        *sources.lock().unwrap_or_else(|e| e.into_inner()) = new_sources;
        settings.send_replace(engine);
        Ok(Reloaded {
            said: Some(format!(
                "configuration reloaded from {}: changed {changed:?}",
                config.path.display()
            )),
            files: None,
            then: vec!["sources"],
        })
    })
}

/// Resolves the configuration file again: the new sources and engine settings, and
/// the keys that changed. A setting that applies at restart is logged.
fn reload_config(
    config: &mut ConfigFile,
    plan: Plan,
) -> Result<(KubeconfigSources, EngineConfig, Vec<&'static str>), String> {
    let resolved = resolve_again(config)?;
    let Some(args) = resolved.serve().map_err(|e| e.to_string())? else {
        return Err("the command line is not `serve`".into());
    };
    let (sources, engine) = plan(&args)?;
    Ok((sources, engine, changed(config, resolved)))
}

/// The configuration file resolved again with the process's command line.
fn resolve_again(config: &ConfigFile) -> Result<resolve::Resolved, String> {
    resolve::resolve(
        config.command.clone(),
        config.subcommand,
        &config.argv,
        &config.path,
    )
    .map_err(|e| e.to_string())
}

/// The keys `resolved` changes from the last good resolution, which it becomes; each
/// change of a setting that applies at restart is logged as such.
fn changed(config: &mut ConfigFile, resolved: resolve::Resolved) -> Vec<&'static str> {
    for row in &resolved.rows {
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
    let changed: Vec<&'static str> = resolved
        .rows
        .iter()
        .filter(|r| value(&config.last, &r.flag) != Some(r.value.as_str()))
        .map(|r| r.key)
        .collect();
    config.last = resolved.rows;
    changed
}

/// The configuration file of a command whose every setting applies at restart (the
/// router's): resolved again and checked with `check`, each change logged as taking
/// effect at the next restart; a file that no longer resolves or passes `check` is
/// an error, the settings in force kept.
pub fn restart_input(
    mut config: ConfigFile,
    check: fn(&resolve::Resolved) -> Result<(), String>,
) -> Reload {
    Box::new(move |_why| {
        let resolved = resolve_again(&config)?;
        check(&resolved)?;
        let changed = changed(&mut config, resolved);
        Ok(Reloaded {
            said: (!changed.is_empty()).then(|| {
                format!(
                    "configuration reloaded from {}: changed {changed:?}, each at the next restart",
                    config.path.display()
                )
            }),
            ..Reloaded::default()
        })
    })
}

/// The kubeconfigs as an input: the sources in force loaded again, a changed set
/// handed to the engine.
pub fn sources_input(
    sources: Arc<Mutex<KubeconfigSources>>,
    desired: watch::Sender<SourceSet>,
) -> Reload {
    Box::new(move |_why| {
        let sources = sources.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let said = kubeconfig::apply(&sources, &desired)?;
        Ok(Reloaded {
            said,
            files: Some(sources.files().to_vec()),
            then: Vec::new(),
        })
    })
}

/// A file's directory (`.` for a bare name).
fn parent(path: &Path) -> PathBuf {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// A file watcher, kept alive while it is wanted.
type Watcher = notify_debouncer_full::Debouncer<
    notify_debouncer_full::notify::RecommendedWatcher,
    notify_debouncer_full::RecommendedCache,
>;

/// Watches `files`, sending `changed` (debounced) those whose content changed: written, created, removed or renamed over, directly or by Kubernetes'
/// `..data` swap of a Secret or ConfigMap volume. Each file's directory is watched
/// (a rename over a file is an event of its directory); opening or reading a file is
/// no change, and neither is a write that leaves every followed file's content as it
/// was, so a reload (which reads them) never causes the next.
fn watch_files(files: &[PathBuf], changed: mpsc::UnboundedSender<Vec<PathBuf>>) -> Option<Watcher> {
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
            let differ: Vec<PathBuf> = files
                .iter()
                .zip(now.iter().zip(&seen))
                .filter(|(_, (a, b))| a != b)
                .map(|(f, _)| f.clone())
                .collect();
            seen = now;
            if !differ.is_empty() {
                // Closed only when the hub has stopped.
                let _ = changed.send(differ);
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
            fleetscope_model::file::read_capped(f).ok().map(|bytes| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                h.finish()
            })
        })
        .collect()
}
