//! The cluster reconciler: the desired set of cluster sources is an input (a
//! `tokio::sync::watch`), and each change to it is made true. A new cluster starts its
//! loop (resuming stored streams); a removed one stops it, and the loop's last word,
//! after every update of its streams, removes (or keeps) its objects in order; a
//! changed one is handed its new settings and reconnects without dropping anything.
//! Clusters the change does not name are not touched.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fleetscope_informer::cluster::{self, ClusterConfig, Report, Seed};
use fleetscope_informer::discovery::Served;
use fleetscope_informer::{ClusterSource, Update};
use fleetscope_model::{ClusterName, ResourceType};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::status::StatusTable;

/// The clusters the engine should run, as last loaded by a producer (the kubeconfig
/// reloader, a configuration file, a shard assignment).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceSet {
    /// The clusters, each once by name.
    pub clusters: Vec<ClusterSource>,
    /// When this set was loaded.
    pub loaded_at: Option<SystemTime>,
    /// Set when the producer's last attempt to load failed (the clusters above are
    /// the last good ones, still in force): why, and when.
    pub error: Option<(String, SystemTime)>,
}

impl SourceSet {
    /// A set loaded now, without error.
    pub fn of(clusters: Vec<ClusterSource>) -> Self {
        Self {
            clusters,
            loaded_at: Some(SystemTime::now()),
            error: None,
        }
    }
}

/// Labels for clusters whose names match a glob.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterLabels {
    /// Which clusters.
    pub pattern: glob::Pattern,
    /// Their labels.
    pub labels: BTreeMap<String, String>,
}

/// The labels of one cluster: those of every rule matching its name, later rules winning.
pub fn labels_for(rules: &[ClusterLabels], name: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for r in rules.iter().filter(|r| r.pattern.matches(name)) {
        labels.extend(r.labels.clone());
    }
    labels
}

/// What the reconciler needs to start a cluster.
pub(crate) struct Members {
    pub config: watch::Receiver<Arc<ClusterConfig>>,
    pub labels: watch::Receiver<Vec<ClusterLabels>>,
    pub restore_confirm: Duration,
    pub status: StatusTable,
    pub tx: mpsc::Sender<Update>,
    pub tasks: TaskTracker,
    pub cancel: CancellationToken,
    /// Where stored streams resume and the kept discovery answers, by cluster:
    /// taken by the cluster's first start.
    pub stored: HashMap<ClusterName, Seed>,
    /// Where discovery answers are kept, with persistence on.
    pub persister: Option<Arc<crate::persist::Persister>>,
    /// Every running stream's history reader.
    pub histories: crate::subscriber::Histories,
    /// Clusters already in the status table, registered before the reconciler ran.
    pub registered: std::collections::HashSet<ClusterName>,
    /// Given to every cluster: changed when each stream must resume its watch.
    pub rewatch: watch::Receiver<u64>,
}

/// A running cluster.
struct Member {
    source: watch::Sender<ClusterSource>,
    done: JoinHandle<()>,
}

/// Reconciles the desired set until the engine stops.
pub(crate) async fn run(mut members: Members, mut desired: watch::Receiver<SourceSet>) {
    let mut running: HashMap<ClusterName, Member> = HashMap::new();
    // Loops told to stop, until they have said their last word.
    let mut leaving: HashMap<ClusterName, JoinHandle<()>> = HashMap::new();
    loop {
        let set = desired.borrow_and_update().clone();
        if let Some(at) = set.loaded_at {
            members.status.sources_loaded(at, None);
        }
        if let Some((why, at)) = &set.error {
            members.status.sources_loaded(*at, Some(why.clone()));
        }
        let wanted: HashMap<ClusterName, &ClusterSource> = set
            .clusters
            .iter()
            .map(|s| (ClusterName::from(s.name.as_str()), s))
            .collect();
        let removed: Vec<ClusterName> = running
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            if let Some(m) = running.remove(&name) {
                tracing::info!(cluster = %name, "cluster removed from the fleet: stopping its streams");
                members.status.update(&name, |c| c.leaving = true);
                // Its kept discovery answer goes with it (a late answer from its loop is
                // not kept: the cluster is leaving).
                if let Some(p) = &members.persister {
                    p.record_discovery(name.clone(), None);
                }
                // Dropping the sender tells its loop to stop and say so.
                drop(m.source);
                leaving.insert(name, m.done);
            }
        }
        for source in &set.clusters {
            let name = ClusterName::from(source.name.as_str());
            match running.get(&name) {
                Some(m) => {
                    let changed = m.source.send_if_modified(|current| {
                        if current == source {
                            return false;
                        }
                        *current = source.clone();
                        true
                    });
                    if changed {
                        tracing::info!(cluster = %name, source = %source.describe(), "cluster settings changed: reconnecting it");
                        members.status.update(&name, |c| {
                            c.source = source.describe();
                            c.loaded_at = SystemTime::now();
                        });
                    }
                }
                None => {
                    if let Some(old) = leaving.remove(&name) {
                        // Its objects go (or stay) before the cluster comes back.
                        let _ = old.await;
                    }
                    let member = members.start(source.clone());
                    running.insert(name, member);
                }
            }
        }
        leaving.retain(|_, h| !h.is_finished());
        loop {
            tokio::select! {
                changed = desired.changed() => {
                    if changed.is_err() {
                        // No producer any more: the fleet stays as it is.
                        members.cancel.cancelled().await;
                        return;
                    }
                    break;
                }
                Ok(()) = members.labels.changed() => {
                    let rules = members.labels.borrow_and_update().clone();
                    for name in running.keys() {
                        let labels = labels_for(&rules, name.as_str());
                        members.status.update(name, |c| c.labels = labels);
                    }
                    tracing::info!("cluster labels changed");
                }
                _ = members.cancel.cancelled() => return,
            }
        }
    }
}

impl Members {
    /// Registers every cluster of `set` (reported, and waited for by readiness).
    pub(crate) fn register_all(&mut self, set: &SourceSet) {
        for source in &set.clusters {
            self.register(source);
            self.registered
                .insert(ClusterName::from(source.name.as_str()));
        }
    }

    /// Puts a cluster in the status table, with the streams it resumes as restored,
    /// so it is reported (and waited for by readiness) from now on.
    pub(crate) fn register(&mut self, source: &ClusterSource) {
        let name = ClusterName::from(source.name.as_str());
        let labels = labels_for(&self.labels.borrow(), name.as_str());
        self.status.add_cluster(&name, &source.describe(), labels);
        if let Some(seed) = self.stored.get(&name) {
            for point in seed.resume.values() {
                self.status
                    .stream_restored(&name, &point.resource, &point.resource_version);
            }
            // The kept discovery answer resolves names until discovery answers again.
            if !seed.served.is_empty() {
                let served = Arc::new(seed.served.clone());
                self.status.update(&name, |c| c.served = served);
            }
        }
    }

    fn start(&mut self, source: ClusterSource) -> Member {
        let name = ClusterName::from(source.name.as_str());
        tracing::info!(cluster = %name, source = %source.describe(), "cluster joins the fleet");
        if !self.registered.remove(&name) {
            self.register(&source);
        }
        let mut seed = self.stored.remove(&name).unwrap_or_default();
        seed.rewatch = Some(self.rewatch.clone());
        let (tx, rx) = watch::channel(source);
        let report = Arc::new(Reporter {
            status: self.status.clone(),
            tasks: self.tasks.clone(),
            restore_confirm: self.restore_confirm,
            cancel: self.cancel.clone(),
            persister: self.persister.clone(),
            histories: self.histories.clone(),
        });
        let span = tracing::info_span!("cluster", cluster = %name);
        let done = self.tasks.spawn(
            cluster::run(
                rx,
                self.config.clone(),
                seed,
                self.tx.clone(),
                report,
                self.tasks.clone(),
                self.cancel.child_token(),
            )
            .instrument(span),
        );
        Member { source: tx, done }
    }
}

/// A cluster loop's reports, into the status table.
struct Reporter {
    status: StatusTable,
    tasks: TaskTracker,
    restore_confirm: Duration,
    cancel: CancellationToken,
    persister: Option<Arc<crate::persist::Persister>>,
    histories: crate::subscriber::Histories,
}

/// A kept discovery entry as the informers take it.
pub(crate) fn served_of(r: fleetscope_store::ServedRecord) -> Served {
    Served {
        resource: r.resource,
        watchable: r.watchable,
        short_names: r.short_names,
        singular: r.singular,
    }
}

/// A discovery entry as the store keeps it.
fn record_of(s: &Served) -> fleetscope_store::ServedRecord {
    fleetscope_store::ServedRecord {
        resource: s.resource.clone(),
        watchable: s.watchable,
        short_names: s.short_names.clone(),
        singular: s.singular.clone(),
    }
}

impl Report for Reporter {
    fn connected(&self, cluster: &ClusterName, server: &str) {
        self.status
            .update(cluster, |c| c.server = server.to_string());
    }

    fn discovered(
        &self,
        cluster: &ClusterName,
        version: Option<&str>,
        missing: &[(String, String)],
    ) {
        self.status.update(cluster, |c| {
            if let Some(v) = version {
                c.version = v.to_string();
            }
            c.missing = missing.to_vec();
            c.error = None;
            c.error_since = None;
            c.discovered = true;
        });
    }

    fn failed(&self, cluster: &ClusterName, error: &str) {
        self.status.update(cluster, |c| {
            c.error = Some(error.to_string());
            c.error_since.get_or_insert_with(SystemTime::now);
        });
    }

    fn stream_started(&self, cluster: &ClusterName, resource: &ResourceType, resumed: bool) {
        self.status.update_stream(cluster, resource, |s| {
            if resumed {
                s.sync_method = Some(fleetscope_model::fleet::SyncMethod::Resumed);
            }
        });
        if resumed {
            // A resumed watch that stays open without a 410 confirms what was restored.
            let (status, cluster, rt, wait, cancel) = (
                self.status.clone(),
                cluster.clone(),
                resource.clone(),
                self.restore_confirm,
                self.cancel.clone(),
            );
            self.tasks.spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => status.confirm_restored(&cluster, &rt),
                    _ = cancel.cancelled() => {}
                }
            });
        }
    }

    fn watch_resumed(&self, cluster: &ClusterName, resource: &ResourceType) {
        self.status.watch_resumed(cluster, resource);
    }

    fn stream_stopped(&self, cluster: &ClusterName, resource: &ResourceType) {
        self.status.remove_stream(cluster, &resource.name());
    }

    fn history(
        &self,
        cluster: &ClusterName,
        resource: &str,
        history: Option<fleetscope_informer::history::History>,
    ) {
        self.histories.lend(cluster, resource, history);
    }

    fn served(&self, cluster: &ClusterName, served: &[Served]) {
        // Compared where it is kept: an answer like the last is neither copied nor
        // written to the store again.
        let mut changed = true;
        self.status.update(cluster, |c| {
            changed = c.served.as_slice() != served && !c.leaving;
            if changed {
                c.served = Arc::new(served.to_vec());
            }
        });
        if changed && let Some(p) = &self.persister {
            p.record_discovery(
                cluster.clone(),
                Some(fleetscope_store::DiscoveryRecord {
                    cluster: cluster.clone(),
                    served: served.iter().map(record_of).collect(),
                }),
            );
        }
    }

    fn request_counts(
        &self,
        cluster: &ClusterName,
    ) -> Option<Arc<fleetscope_informer::requests::RequestCounts>> {
        self.status.request_counts(cluster)
    }
}
