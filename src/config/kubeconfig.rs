//! The cluster sources from kubeconfig files, applied to the engine's desired set. A
//! load that fails (a file that no longer parses, a pattern that matches nothing) is
//! logged at error level and reported in `ListClusters`, and the last good set stays
//! in force. [`super::reload`] runs the loads.

use std::path::PathBuf;
use std::time::SystemTime;

use crate::engine::SourceSet;
use crate::sources::{self, ClusterSource, SourceError};
use tokio::sync::watch;

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
    /// Names for contexts (context → cluster name), from `--cluster-alias`.
    pub aliases: std::collections::BTreeMap<String, String>,
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
    /// An alias names a cluster another context already has.
    #[error(
        "--cluster-alias {context}={name}: another context's cluster is already named {name:?}"
    )]
    AliasClash {
        /// The aliased context.
        context: String,
        /// The alias.
        name: String,
    },
}

impl KubeconfigSources {
    /// Reads every file and returns the chosen contexts (and the in-cluster source).
    pub fn load(&self) -> Result<Vec<ClusterSource>, LoadError> {
        let mut clusters = if self.paths.is_empty() {
            Vec::new()
        } else {
            sources::resolve(&self.paths, &self.contexts)?
        };
        for i in 0..clusters.len() {
            if let Some(name) = self.aliases.get(&clusters[i].context) {
                if clusters.iter().any(|c| c.name == *name) {
                    return Err(LoadError::AliasClash {
                        context: clusters[i].context.clone(),
                        name: name.clone(),
                    });
                }
                clusters[i] = clusters[i].clone().renamed(name);
            }
        }
        if let Some(name) = &self.in_cluster {
            if clusters.iter().any(|c| c.name == *name) {
                return Err(LoadError::InClusterClash(name.clone()));
            }
            clusters.push(ClusterSource::in_cluster(name));
        }
        Ok(clusters)
    }

    /// The kubeconfig files followed.
    pub fn files(&self) -> &[PathBuf] {
        &self.paths
    }
}

/// Loads the sources again and hands a changed set to the engine: what changed (for
/// the log; `None` when nothing did), or why they cannot be loaded (also handed to
/// the engine, for `ListClusters`; the last good set stays in force).
pub fn apply(
    sources: &KubeconfigSources,
    desired: &watch::Sender<SourceSet>,
) -> Result<Option<String>, String> {
    let now = SystemTime::now();
    match sources.load() {
        Ok(clusters) => {
            let n = clusters.len();
            let changed = desired.send_if_modified(|set| {
                let same = set.clusters == clusters && set.error.is_none();
                if !same {
                    *set = SourceSet {
                        clusters,
                        loaded_at: Some(now),
                        error: None,
                    };
                }
                !same
            });
            Ok(changed.then(|| format!("cluster sources reloaded: {n} cluster(s)")))
        }
        Err(e) => {
            let why_not = crate::sources::chain(&e);
            desired.send_modify(|set| set.error = Some((why_not.clone(), now)));
            Err(why_not)
        }
    }
}
