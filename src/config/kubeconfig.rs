//! The cluster sources from kubeconfig files, and their reload: each file's directory
//! is watched (editors and Kubernetes Secret volumes replace files by rename), changes
//! are debounced, and SIGHUP reloads too. A reload that fails (a file that no longer
//! parses, a pattern that matches nothing) is logged at error level and reported in
//! `ListClusters`, and the last good set stays in force.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::engine::SourceSet;
use crate::sources::{self, ClusterSource, SourceError};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// How long file events settle before a reload.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// Which kubeconfig files and contexts make the fleet.
#[derive(Debug, Clone)]
pub struct KubeconfigSources {
    /// The files, resolved once (`--kubeconfig`, `$KUBECONFIG`, the default); empty
    /// when only the in-cluster source is used.
    pub paths: Vec<PathBuf>,
    /// `--context` patterns; empty for every context.
    pub contexts: Vec<String>,
    /// The in-cluster source's name, when it is watched too.
    pub in_cluster: Option<String>,
}

/// Why the sources could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A kubeconfig or pattern is unusable.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The in-cluster name is also a context's.
    #[error("--in-cluster-name {0:?} is also a kubeconfig context: choose another name")]
    InClusterClash(String),
}

impl KubeconfigSources {
    /// Reads every file and returns the chosen contexts (and the in-cluster source).
    pub fn load(&self) -> Result<Vec<ClusterSource>, LoadError> {
        let mut clusters = if self.paths.is_empty() {
            Vec::new()
        } else {
            sources::resolve(&self.paths, &self.contexts)?
        };
        if let Some(name) = &self.in_cluster {
            if clusters.iter().any(|c| c.name == *name) {
                return Err(LoadError::InClusterClash(name.clone()));
            }
            clusters.push(ClusterSource::in_cluster(name));
        }
        Ok(clusters)
    }

    /// The directories to watch: each file's.
    fn directories(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = self
            .paths
            .iter()
            .map(|p| {
                p.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), |d| d.to_path_buf())
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }
}

/// Reloads `sources` into `desired` whenever a watched file changes or `reload` fires
/// (SIGHUP), until `cancel`. Runs on the caller's task.
pub async fn reload_on_change(
    sources: KubeconfigSources,
    desired: watch::Sender<SourceSet>,
    mut reload: mpsc::Receiver<()>,
    cancel: CancellationToken,
) {
    let (changed_tx, mut changed) = mpsc::channel::<()>(1);
    // Kept alive while reloading; dropped (unwatching) when this returns.
    let _watcher = watch_directories(&sources, changed_tx);
    loop {
        let why = tokio::select! {
            Some(()) = changed.recv() => "a kubeconfig file changed",
            Some(()) = reload.recv() => "SIGHUP",
            _ = cancel.cancelled() => return,
        };
        apply(&sources, &desired, why);
    }
}

/// Loads the sources again and hands a changed set to the engine.
pub fn apply(sources: &KubeconfigSources, desired: &watch::Sender<SourceSet>, why: &str) {
    let now = SystemTime::now();
    match sources.load() {
        Ok(clusters) => {
            desired.send_if_modified(|set| {
                let same = set.clusters == clusters && set.error.is_none();
                if !same {
                    tracing::info!(
                        reason = why,
                        clusters = clusters.len(),
                        "cluster sources reloaded"
                    );
                    *set = SourceSet {
                        clusters,
                        loaded_at: Some(now),
                        error: None,
                    };
                }
                !same
            });
        }
        Err(e) => {
            let why_not = crate::sources::chain(&e);
            tracing::error!(reason = why, error = %why_not, "the cluster sources cannot be reloaded: the last good ones stay in force");
            desired.send_modify(|set| set.error = Some((why_not, now)));
        }
    }
}

/// Watches each file's directory, signalling `changed` (debounced) on any change in it.
fn watch_directories(
    sources: &KubeconfigSources,
    changed: mpsc::Sender<()>,
) -> Option<
    notify_debouncer_full::Debouncer<
        notify_debouncer_full::notify::RecommendedWatcher,
        notify_debouncer_full::RecommendedCache,
    >,
> {
    use notify_debouncer_full::notify::RecursiveMode;
    let dirs = sources.directories();
    if dirs.is_empty() {
        return None;
    }
    let mut debouncer = match notify_debouncer_full::new_debouncer(
        DEBOUNCE,
        None,
        move |result: notify_debouncer_full::DebounceEventResult| {
            if matches!(&result, Ok(events) if !events.is_empty()) {
                // A reload is already due when this is full.
                let _ = changed.try_send(());
            }
        },
    ) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the kubeconfig files: they reload on SIGHUP only");
            return None;
        }
    };
    for dir in dirs {
        if let Err(e) = debouncer.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a kubeconfig directory: its files reload on SIGHUP only");
        }
    }
    Some(debouncer)
}
