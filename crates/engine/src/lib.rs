//! fleetscope's engine: cluster sources → informers → one ordered, batched ingest →
//! the index (visible once durable, with a store), with cluster and stream health
//! beside it, and the reconciler that keeps the running clusters equal to a live set
//! of desired ones.
//!
//! Entry points:
//! - [`Engine::start`] (a fixed set of clusters, in memory), [`Engine::start_live`]
//!   (a `watch` of the desired [`SourceSet`], optionally over a store);
//! - [`status::StatusTable`]: the one owner of what is collected from each cluster and
//!   how current it is;
//! - [`persist::Persister`]: write-behind persistence, publication after durability.

mod fleet;
mod ingest;
pub mod persist;
mod plan;
mod progress;
mod reconcile;
pub mod status;
mod subscriber;
mod view;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fleetscope_index::{Change, Index};
use fleetscope_informer::cluster::{ClusterConfig, ResumePoint, Seed};
use fleetscope_informer::{ClusterSource, StreamConfig, Update};
use fleetscope_model::{ClusterName, Revision};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use fleetscope_informer::{Scope, ScopeError};
pub use progress::{Progress, ProgressLog};
pub use reconcile::{ClusterLabels, SourceSet, labels_for};

use crate::persist::{PersistConfig, Persister};
use crate::status::StatusTable;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Resource types to collect, kubectl-style; `*` for every watchable type.
    pub resources: Vec<String>,
    /// Labels for clusters, by name glob, for cluster selectors.
    pub cluster_labels: Vec<ClusterLabels>,
    /// Informer settings.
    pub stream: StreamConfig,
    /// Per resource type (named kubectl-style): namespace scope and server-side selectors.
    pub scopes: Vec<Scope>,
    /// How often each cluster's discovery is refreshed (new CRDs, vanished types). Default 60 s.
    pub rediscovery: Duration,
    /// The longest an exec credential plugin may run before it is killed. Default 30 s.
    pub exec_timeout: Duration,
    /// Index settings.
    pub index: fleetscope_index::Config,
    /// Most updates applied in one batch. Default 4,096.
    pub batch: usize,
    /// Write-behind persistence settings (used when started with a store).
    pub persist: PersistConfig,
    /// How long a resumed watch must stay open without a 410 before restored objects
    /// count as current, when no event or bookmark confirms it sooner. Default 2 s.
    pub restore_confirm: Duration,
    /// Keep the objects of clusters no longer configured, at start and when one is
    /// removed while running (default: delete them).
    pub keep_removed_clusters: bool,
    /// The longest one List page or Count may take to evaluate; past it the request
    /// is `DEADLINE_EXCEEDED`. Default 10 s.
    pub query_timeout: Duration,
    /// Queries evaluated at once, each on a thread of its own (off the async workers,
    /// so Watch streams and health never wait for them). Default: the CPUs available.
    pub query_threads: usize,
    /// How long a Watch may leave its events unread (its buffer full) before it is
    /// ended with `RESOURCE_EXHAUSTED` and the revision to resume from. Default 60 s.
    pub subscriber_stall: Duration,
    /// How long readiness waits for a cluster's first discovery: one that has not
    /// answered by then (a hung API server that accepts and never answers) no longer
    /// holds the server back; it is reported as syncing until it answers or fails.
    /// Default 30 s.
    pub ready_patience: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            resources: vec![
                "pods".into(),
                "configmaps".into(),
                "deployments.apps".into(),
            ],
            cluster_labels: Vec::new(),
            stream: StreamConfig::default(),
            scopes: Vec::new(),
            rediscovery: Duration::from_secs(60),
            exec_timeout: Duration::from_secs(30),
            index: fleetscope_index::Config::default(),
            batch: 4096,
            persist: PersistConfig::default(),
            restore_confirm: Duration::from_secs(2),
            keep_removed_clusters: false,
            query_timeout: Duration::from_secs(10),
            query_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            subscriber_stall: Duration::from_secs(60),
            ready_patience: Duration::from_secs(30),
        }
    }
}

impl EngineConfig {
    fn cluster_config(&self) -> ClusterConfig {
        let mut stream = self.stream.clone();
        // Field-index values are read as objects are pruned, by each stream.
        stream.pruning.field_indexes = self.index.field_indexes.clone();
        ClusterConfig {
            resources: self.resources.clone(),
            scopes: self.scopes.clone(),
            stream,
            rediscovery: self.rediscovery,
            exec_timeout: self.exec_timeout,
        }
    }
}

/// A store to start from: the store and what it held when opened.
pub struct Stored {
    /// The store, written behind the index.
    pub store: Arc<dyn fleetscope_store::Store>,
    /// What it held.
    pub loaded: fleetscope_store::Loaded,
}

/// What [`Engine::observe`] reports.
#[derive(Debug, Clone)]
pub struct Observation {
    /// Objects held, by resource type and cluster.
    pub objects: Vec<(String, ClusterName, u64)>,
    /// Every cluster's status, with its streams.
    pub clusters: Vec<status::ClusterStatus>,
    /// The cluster sources in force: when loaded, and the last reload's error.
    pub sources: status::SourcesStatus,
    /// The store's figures, when persisting.
    pub store: Option<persist::PersistStats>,
    /// Whether the engine is ready (the store loaded, every cluster discovered or
    /// failed).
    pub ready: bool,
    /// Object states the index compressed once they settled, since start.
    pub objects_compressed: u64,
    /// Watches the engine ended for not keeping up, since start.
    pub watches_dropped: WatchesDropped,
}

/// Watches the engine ended for not keeping up, by why.
#[derive(Debug, Clone, Copy, Default)]
pub struct WatchesDropped {
    /// Its subscriber left its events unread for the stall bound.
    pub unread: u64,
    /// It fell further behind than the event log holds.
    pub behind: u64,
}

/// The counts behind [`WatchesDropped`], shared with every Watch's producer.
#[derive(Debug, Default)]
pub(crate) struct DroppedCounts {
    pub(crate) unread: std::sync::atomic::AtomicU64,
    pub(crate) behind: std::sync::atomic::AtomicU64,
}

/// The running engine: the index, the status table, and the tasks feeding them.
pub struct Engine {
    /// The merged index.
    pub(crate) index: Arc<Index>,
    /// Cluster and stream health, and what is collected where.
    pub(crate) status: StatusTable,
    persister: Option<Arc<Persister>>,
    /// Whether the index was restored from a store holding data.
    restored: bool,
    /// The desired set, when the engine was started with a fixed one.
    fixed: Option<watch::Sender<SourceSet>>,
    /// What every cluster collects and how, followed by the running clusters.
    settings: watch::Sender<Arc<ClusterConfig>>,
    /// The cluster label rules, followed by the reconciler.
    labels: watch::Sender<Vec<ClusterLabels>>,
    /// The field indexes the index was built with: they stay as started.
    field_indexes: Vec<String>,
    /// Places for query evaluation (see [`EngineConfig::query_threads`]).
    pub(crate) queries: Arc<tokio::sync::Semaphore>,
    /// See [`EngineConfig::query_timeout`].
    pub(crate) query_timeout: Duration,
    /// See [`EngineConfig::subscriber_stall`].
    pub(crate) subscriber_stall: Duration,
    /// Watches ended for not keeping up.
    pub(crate) dropped: Arc<DroppedCounts>,
    /// See [`EngineConfig::ready_patience`].
    ready_patience: Duration,
    /// Every running stream's history reader, for carrying a Watch from a member
    /// position its stream is past.
    pub(crate) histories: subscriber::Histories,
    /// Changed to make every stream list again (see [`Engine::rewatch`]).
    rewatch: watch::Sender<u64>,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

impl Engine {
    /// Starts informers for a fixed set of sources and the ingest, in memory only.
    /// Revisions begin above anything an earlier run issued ([`Revision::fresh_start`]),
    /// so a client's revision from before is refused, never taken for another change.
    pub fn start(sources: Vec<ClusterSource>, config: EngineConfig) -> Self {
        let (tx, rx) = watch::channel(SourceSet::of(sources));
        let mut engine = Self::start_live(rx, config, None);
        engine.fixed = Some(tx);
        engine
    }

    /// Starts from a fixed set of sources and what a store holds (see [`Engine::start_live`]).
    pub fn start_with_store(
        sources: Vec<ClusterSource>,
        config: EngineConfig,
        store: Arc<dyn fleetscope_store::Store>,
        loaded: fleetscope_store::Loaded,
    ) -> Self {
        let (tx, rx) = watch::channel(SourceSet::of(sources));
        let mut engine = Self::start_live(rx, config, Some(Stored { store, loaded }));
        engine.fixed = Some(tx);
        engine
    }

    /// Starts the engine over a live set of desired clusters: each change of `desired`
    /// is reconciled (clusters added, removed, or reconnected with new settings) while
    /// the others run undisturbed.
    ///
    /// With a store, the index is rebuilt from it at once, each stored stream resumes
    /// its watch from its stored resourceVersion without listing, and every change is
    /// written behind to the store. Stored clusters not in the first desired set lose
    /// their objects (as deletes) unless `keep_removed_clusters`.
    pub fn start_live(
        desired: watch::Receiver<SourceSet>,
        config: EngineConfig,
        store: Option<Stored>,
    ) -> Self {
        let status = StatusTable::default();
        let (index, persister, stored, restored, then) = match store {
            None => (
                Arc::new(Index::starting_after(
                    config.index.clone(),
                    Revision::fresh_start(),
                )),
                None,
                HashMap::new(),
                false,
                None,
            ),
            Some(Stored { store, loaded }) => {
                let configured: BTreeSet<ClusterName> = desired
                    .borrow()
                    .clusters
                    .iter()
                    .map(|s| ClusterName::from(s.name.as_str()))
                    .collect();
                let s = open_store(&config, &status, configured, store, loaded);
                (s.index, Some(s.persister), s.resume, s.restored, s.then)
            }
        };
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        // A batch is published at once; kept within half a subscriber buffer, a reader
        // that keeps up is never overrun by one batch.
        let batch = config
            .batch
            .clamp(1, (config.index.subscriber_buffer / 2).max(1));
        let (tx, rx) = mpsc::channel::<Update>(batch.max(16) * 4);
        if let Some(p) = &persister {
            tasks.spawn(
                p.clone()
                    .run(cancel.clone())
                    .instrument(tracing::info_span!("store")),
            );
        }
        let ingesting = ingest::ingest(
            index.clone(),
            status.clone(),
            persister.clone(),
            rx,
            batch,
            config.keep_removed_clusters,
            cancel.clone(),
        );
        tasks.spawn(
            once_whole(index.clone(), then, ingesting, cancel.clone())
                .instrument(tracing::info_span!("ingest")),
        );
        upkeep(&index, &config, &tasks, &cancel);
        let histories = subscriber::Histories::default();
        let (settings, settings_rx) = watch::channel(Arc::new(config.cluster_config()));
        let (labels, labels_rx) = watch::channel(config.cluster_labels.clone());
        let (rewatch, rewatch_rx) = watch::channel(0u64);
        let mut members = reconcile::Members {
            rewatch: rewatch_rx,
            config: settings_rx,
            labels: labels_rx,
            restore_confirm: config.restore_confirm,
            status: status.clone(),
            tx,
            tasks: tasks.clone(),
            cancel: cancel.clone(),
            stored,
            persister: persister.clone(),
            histories: histories.clone(),
            registered: Default::default(),
        };
        // The first set is in the status table before this returns: reported, and
        // waited for by readiness.
        members.register_all(&desired.borrow());
        tasks.spawn(reconcile::run(members, desired).instrument(tracing::info_span!("reconciler")));
        Self {
            index,
            status,
            persister,
            restored,
            fixed: None,
            settings,
            labels,
            field_indexes: config.index.field_indexes.clone(),
            queries: Arc::new(tokio::sync::Semaphore::new(config.query_threads.max(1))),
            query_timeout: config.query_timeout,
            subscriber_stall: config.subscriber_stall,
            dropped: Arc::default(),
            ready_patience: config.ready_patience,
            histories,
            rewatch,
            cancel,
            tasks,
        }
    }

    /// Makes every stream end its watch and list again (a consistent read, diffed
    /// against what is held, counted as a `confirm` list), so that each is confirmed
    /// current by its cluster's API server now rather than whenever its next change
    /// or bookmark comes: after this process did not run for a while (stopped,
    /// starved), its quiet streams would otherwise stay unconfirmed for as long.
    pub fn rewatch(&self) {
        self.rewatch.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Applies new settings to the running fleet: what to collect and how (resource
    /// types, scopes, pruning, rediscovery, exec timeout) and the cluster labels.
    /// Each cluster applies them without reconnecting; only the streams whose type or
    /// selection changed stop, start or list again. The index, store, batch and
    /// retention settings (and the field indexes) stay as the engine started.
    pub fn reconfigure(&self, config: &EngineConfig) {
        self.apply_settings(config);
    }

    /// Follows `settings` (a configuration file's reloads) until the engine stops:
    /// each new value is applied as [`Engine::reconfigure`] applies it, the one in
    /// `settings` now first if it changed while the engine started.
    pub fn follow(self: &Arc<Self>, mut settings: watch::Receiver<EngineConfig>) {
        let engine = Arc::downgrade(self);
        let cancel = self.cancel.clone();
        self.tasks.spawn(
            async move {
                let mut due = settings.has_changed().unwrap_or(false);
                loop {
                    if due {
                        let Some(engine) = engine.upgrade() else {
                            return;
                        };
                        engine.apply_settings(&settings.borrow_and_update());
                    }
                    tokio::select! {
                        changed = settings.changed() => if changed.is_err() { return },
                        _ = cancel.cancelled() => return,
                    }
                    due = true;
                }
            }
            .instrument(tracing::info_span!("task", task = "settings")),
        );
    }

    fn apply_settings(&self, config: &EngineConfig) {
        let mut cluster = config.cluster_config();
        cluster
            .stream
            .pruning
            .field_indexes
            .clone_from(&self.field_indexes);
        self.settings.send_if_modified(|current| {
            let changed = **current != cluster;
            if changed {
                *current = Arc::new(cluster);
            }
            changed
        });
        self.labels.send_if_modified(|current| {
            let changed = *current != config.cluster_labels;
            if changed {
                current.clone_from(&config.cluster_labels);
            }
            changed
        });
    }

    /// Replaces the desired set of an engine started with a fixed one (for tests and
    /// embedders; an engine started live follows its own `watch`).
    pub fn set_sources(&self, sources: SourceSet) {
        if let Some(tx) = &self.fixed {
            tx.send_replace(sources);
        }
    }

    /// Resolves once [`Engine::is_ready`] holds.
    pub async fn wait_ready(&self) {
        while !self.is_ready() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the engine can answer for its fleet: its index was restored from a
    /// store, or every cluster has been discovered once (or has failed: an
    /// unreachable cluster is reported, not waited for), or has had
    /// [`EngineConfig::ready_patience`] to answer (a hung one is not waited for either).
    pub fn is_ready(&self) -> bool {
        self.index.is_restored()
            && (self.restored
                || !self
                    .status
                    .clusters()
                    .iter()
                    .any(|c| c.discovering() && c.joined.elapsed() < self.ready_patience))
    }

    /// Persistence figures, when running with a store.
    pub fn store_stats(&self) -> Option<persist::PersistStats> {
        self.persister.as_ref().map(|p| p.stats())
    }

    /// The merged index, for tests and benchmarks that drive the engine's parts
    /// directly; everything else reads the engine through [`Fleet`] and
    /// [`Engine::observe`], so that it works the same behind any implementation of
    /// the seam.
    #[doc(hidden)]
    pub fn index_for_tests(&self) -> &Arc<Index> {
        &self.index
    }

    /// The status table, for tests and benchmarks (see [`Engine::index_for_tests`]).
    #[doc(hidden)]
    pub fn status_for_tests(&self) -> &StatusTable {
        &self.status
    }

    /// One summary of the engine for operators (metrics, readiness), read at once:
    /// objects held by type and cluster, every cluster's status with its streams,
    /// the cluster sources in force, the store's figures, and whether it is ready.
    pub fn observe(&self) -> Observation {
        // Nothing is counted while a restored index is still being made (it is not
        // ready then): an observation never waits.
        let objects = if self.index.is_restored() {
            self.index
                .snapshot()
                .counts()
                .map(|(resource, cluster, n)| (resource.to_string(), cluster.clone(), n as u64))
                .collect()
        } else {
            Vec::new()
        };
        Observation {
            objects,
            clusters: self.status.clusters(),
            sources: self.status.sources(),
            store: self.store_stats(),
            ready: self.is_ready(),
            objects_compressed: self.index.compressed_count(),
            watches_dropped: WatchesDropped {
                unread: self
                    .dropped
                    .unread
                    .load(std::sync::atomic::Ordering::Relaxed),
                behind: self
                    .dropped
                    .behind
                    .load(std::sync::atomic::Ordering::Relaxed),
            },
        }
    }

    /// The clusters held listed and watching on every stream (what a replica publishes
    /// as ready to serve).
    pub fn synced_clusters(&self) -> std::collections::BTreeSet<String> {
        self.synced_since(None)
    }

    /// The clusters held synced whose every stream was also confirmed current (a
    /// list, an event, a bookmark, a watch resumed) at or after `since`.
    pub fn synced_since(
        &self,
        since: Option<std::time::Instant>,
    ) -> std::collections::BTreeSet<String> {
        self.status
            .clusters()
            .into_iter()
            .filter(|c| !c.leaving && c.kept.is_none())
            .filter(|c| c.freshness(None).0 == fleetscope_model::fleet::Freshness::Synced)
            .filter(|c| {
                since.is_none_or(|t| {
                    c.streams
                        .values()
                        .all(|(_, s)| s.current_at.is_some_and(|at| at >= t))
                })
            })
            .map(|c| c.name.to_string())
            .collect()
    }

    /// The persister, when running with a store.
    pub fn persister(&self) -> Option<Arc<Persister>> {
        self.persister.clone()
    }

    /// Stops every task and waits for them, up to `grace`; then writes what the
    /// ingest applied, within what is left of `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        self.cancel.cancel();
        self.tasks.close();
        if tokio::time::timeout_at(deadline, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(?grace, "engine tasks did not stop within the grace period");
        }
        // Everything the ingest applied is written before the process ends.
        if let Some(p) = &self.persister {
            match tokio::time::timeout_at(deadline, p.close()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => tracing::error!(
                    "the final store write failed: the next start resumes from the last write"
                ),
                Err(_) => tracing::error!(
                    ?grace,
                    "the final store write did not finish within the grace period: the next start resumes from the last write"
                ),
            }
        }
    }

    /// A token cancelled when the engine stops.
    pub fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

/// Compresses the objects whose state has stayed unchanged for `after`, in small
/// batches so that no query waits behind it, until cancelled.
async fn pack(index: Arc<Index>, after: Duration, cancel: CancellationToken) {
    /// Objects considered between two yields (compressing one takes about 1.6 µs).
    const BATCH: usize = 2048;
    let every = (after / 2).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut passes = Passes::new(after);
    tokio::select! {
        () = index.restored() => {}
        () = cancel.cancelled() => return,
    }
    loop {
        let snapshot = index.snapshot();
        let (revision, held) = (snapshot.revision(), snapshot.len());
        drop(snapshot);
        let seen = (revision, index.listed_count());
        if let Some(settled) = passes.due(std::time::Instant::now(), seen, held) {
            while !index.pack_settled(settled, BATCH) && !cancel.is_cancelled() {
                tokio::task::yield_now().await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// When a pass that compresses settled objects is due. A state has settled once it has
/// gone unchanged for `after`; a stretch of changes nine tenths made by lists (a first
/// sync, a relist: states the cluster has held for a while, not ones that just changed)
/// once it has for a tenth of that, so a sync longer than that has what it read first
/// compressed while the rest arrives, where it would otherwise hold all of it as text
/// until `after` past its end. A pass goes through every object held, so one starts
/// once the settled changes since the last are a sixty-fourth of the objects held, or a
/// minute after the last when fewer: a fleet of a million objects under steady churn is
/// gone through once a minute, not once a second.
#[derive(Debug)]
struct Passes {
    after: Duration,
    /// The index's revision and its count of changes made by lists
    /// ([`Index::listed_count`]) as seen at each tick, oldest first.
    seen: std::collections::VecDeque<(std::time::Instant, Revision, u64)>,
    /// The newest revision every state up to which has settled, and the count of
    /// changes made by lists when it was seen.
    settled: (Revision, u64),
    /// Where the last pass went to, and when it started.
    last: Option<(Revision, std::time::Instant)>,
}

impl Passes {
    /// The longest a settled change waits for a pass.
    const LONGEST: Duration = Duration::from_secs(60);

    fn new(after: Duration) -> Self {
        Self {
            after,
            seen: Default::default(),
            settled: (Revision(0), 0),
            last: None,
        }
    }

    /// Notes the index at `revision`, with `listed` changes made by lists so far,
    /// holding `held` objects, at `now`; the revision a pass is to go to, when one is
    /// due (it is then counted as started).
    fn due(
        &mut self,
        now: std::time::Instant,
        (revision, listed): (Revision, u64),
        held: usize,
    ) -> Option<Revision> {
        self.seen.push_back((now, revision, listed));
        while let Some(&(at, revision, listed)) = self.seen.front() {
            let waited = now.duration_since(at);
            let (from, listed_from) = self.settled;
            let changes = revision.0.saturating_sub(from.0);
            let by_lists = listed.saturating_sub(listed_from);
            let settled = waited >= self.after
                || (waited >= self.after / 10
                    && by_lists.saturating_mul(10) >= changes.saturating_mul(9));
            if !settled {
                break;
            }
            self.settled = (revision, listed);
            self.seen.pop_front();
        }
        let settled = self.settled.0;
        let since = self.last.map_or(0, |(to, _)| to.0);
        let new = settled.0.saturating_sub(since);
        let due = new > 0
            && (new.saturating_mul(64) >= held as u64
                || self
                    .last
                    .is_some_and(|(_, at)| now.duration_since(at) >= Self::LONGEST));
        due.then(|| {
            self.last = Some((settled, now));
            settled
        })
    }
}

/// The clusters the store holds that are no longer configured: each kept (with
/// `--keep-removed-clusters`, returned) or its objects deleted.
fn not_configured(
    config: &EngineConfig,
    index: &Index,
    persister: &Persister,
    configured: &BTreeSet<ClusterName>,
    streams: &[fleetscope_store::StreamRecord],
) -> Vec<ClusterName> {
    let mut held: BTreeSet<ClusterName> = index
        .snapshot()
        .counts()
        .map(|(_, c, _)| c.clone())
        .collect();
    held.extend(streams.iter().map(|s| s.cluster.clone()));
    let mut kept = Vec::new();
    for gone in held.difference(configured) {
        if config.keep_removed_clusters {
            tracing::info!(cluster = %gone, "cluster no longer configured: keeping its stored objects");
            kept.push(gone.clone());
            continue;
        }
        tracing::info!(cluster = %gone, "cluster no longer configured: deleting its stored objects");
        let staged = index.stage([Change::RemoveCluster(gone.clone())]);
        let dropped = streams
            .iter()
            .filter(|s| &s.cluster == gone)
            .map(|s| (s.cluster.clone(), s.resource.clone(), None));
        persister.record(staged, dropped, ProgressLog::default());
    }
    kept
}

/// The index's upkeep, as tasks until `cancel`: abandoned pages let their snapshots
/// go on a timer (not at the next List), and settled objects are compressed (with
/// `index.compressObjects`).
fn upkeep(
    index: &Arc<Index>,
    config: &EngineConfig,
    tasks: &TaskTracker,
    cancel: &CancellationToken,
) {
    let every = (config.index.page_ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    tasks.spawn({
        let (index, cancel) = (index.clone(), cancel.clone());
        async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => index.expire_pins(),
                    _ = cancel.cancelled() => return,
                }
            }
        }
        .instrument(tracing::info_span!("pins"))
    });
    if config.index.compress_objects {
        tasks.spawn(
            pack(index.clone(), config.index.compress_after, cancel.clone())
                .instrument(tracing::info_span!("packer")),
        );
    }
}

/// What is left to do once a restored index is whole, before any change is applied.
type Then = Box<dyn FnOnce() + Send>;

/// Runs `ingesting` once `index` is whole and `then` is done: nothing is applied
/// before.
async fn once_whole(
    index: Arc<Index>,
    then: Option<Then>,
    ingesting: impl std::future::Future<Output = ()>,
    cancel: CancellationToken,
) {
    tokio::select! {
        () = index.restored() => {}
        () = cancel.cancelled() => return,
    }
    if let Some(then) = then {
        then();
    }
    ingesting.await;
}

/// The engine's state as a store gives it.
struct FromStore {
    index: Arc<Index>,
    persister: Arc<Persister>,
    /// Where stored streams resume, by configured cluster.
    resume: HashMap<ClusterName, Seed>,
    /// Whether anything was restored.
    restored: bool,
    /// What is left to do once the index is whole.
    then: Option<Then>,
}

/// Opens the engine's state from a store: the index, the persister, where stored
/// streams resume (by configured cluster), whether anything was restored, and what
/// is left to do once the index is whole. Stored clusters not `configured` are
/// deleted, or kept as reported stale.
///
/// When every cluster the store names is configured, the index makes its objects on
/// a thread of its own ([`Index::restoring`]) and the engine answers meanwhile; the
/// check for objects of clusters no longer configured then runs once they are made.
fn open_store(
    config: &EngineConfig,
    status: &StatusTable,
    configured: BTreeSet<ClusterName>,
    store: Arc<dyn fleetscope_store::Store>,
    mut loaded: fleetscope_store::Loaded,
) -> FromStore {
    let started = std::time::Instant::now();
    ingest::reindex_fields(&mut loaded, &config.index.field_indexes);
    let mut continued = persist::Continued::of(&loaded);
    let streams = std::mem::take(&mut loaded.streams);
    let objects = loaded.objects.len();
    // A store with nothing in it (new, or one moved aside as damaged) continues
    // nothing: its revisions begin above anything an earlier run issued, and the
    // first write keeps that start on disk.
    let fresh = loaded.revision == Revision(0) && objects == 0 && streams.is_empty();
    let in_background = !fresh
        && loaded
            .clusters
            .iter()
            .chain(streams.iter().map(|s| &s.cluster))
            .all(|c| configured.contains(c));
    let index = if fresh {
        continued.revision = Revision::fresh_start();
        Arc::new(Index::starting_after(
            config.index.clone(),
            continued.revision,
        ))
    } else {
        let mut restored = persist::restored(&mut loaded);
        // Each stream stands where its watch resumes: the member's state there is the
        // one restored.
        restored.positions = streams
            .iter()
            .map(|s| {
                let stream = (Arc::from(s.resource.name()), s.cluster.clone());
                (stream, Arc::from(s.resource_version.as_str()))
            })
            .collect();
        if in_background {
            Index::restoring(config.index.clone(), restored)
        } else {
            Arc::new(Index::restore(config.index.clone(), restored))
        }
    };
    tracing::info!(objects, streams = streams.len(), revision = %loaded.revision, took = ?started.elapsed(), in_background, "restoring the index from the store");
    let mut persist_config = config.persist.clone();
    persist_config.log_retention = config.index.log_retention;
    let persister = Arc::new(Persister::new(
        store,
        persist_config,
        continued,
        index.clone(),
        status.clone(),
    ));
    persister.record_config(
        configured.iter().cloned().collect(),
        config.index.field_indexes.clone(),
    );
    if fresh {
        persister.write_snapshot_of(index.snapshot());
    }
    let resume = seeds(
        &configured,
        std::mem::take(&mut loaded.discovery),
        &streams,
        &persister,
    );
    let then = {
        let (config, status, index, persister) = (
            config.clone(),
            status.clone(),
            index.clone(),
            persister.clone(),
        );
        move || {
            let kept = not_configured(&config, &index, &persister, &configured, &streams);
            report_kept(&config, &status, &kept, &streams);
            tracing::info!(objects = index.snapshot().len(), took = ?started.elapsed(), "restored the index from the store");
        }
    };
    let then: Option<Then> = if in_background {
        Some(Box::new(then))
    } else {
        then();
        None
    };
    FromStore {
        index,
        persister,
        resume,
        restored: !fresh,
        then,
    }
}

/// What each configured cluster starts from: its stored discovery and where its
/// stored streams resume. Discovery of clusters not configured is forgotten.
fn seeds(
    configured: &BTreeSet<ClusterName>,
    discovery: Vec<fleetscope_store::DiscoveryRecord>,
    streams: &[fleetscope_store::StreamRecord],
    persister: &Persister,
) -> HashMap<ClusterName, Seed> {
    let mut resume: HashMap<ClusterName, Seed> = HashMap::new();
    for d in discovery {
        if configured.contains(&d.cluster) {
            resume.entry(d.cluster.clone()).or_default().served =
                d.served.into_iter().map(reconcile::served_of).collect();
        } else {
            persister.record_discovery(d.cluster, None);
        }
    }
    for s in streams {
        if configured.contains(&s.cluster) {
            resume.entry(s.cluster.clone()).or_default().resume.insert(
                s.resource.name(),
                ResumePoint {
                    resource: s.resource.clone(),
                    resource_version: s.resource_version.clone(),
                    selection: s.selection.clone(),
                },
            );
        }
    }
    resume
}

/// Reports clusters no longer configured whose objects are kept: stale, leaving,
/// their streams where they stood.
fn report_kept(
    config: &EngineConfig,
    status: &StatusTable,
    kept: &[ClusterName],
    streams: &[fleetscope_store::StreamRecord],
) {
    for c in kept {
        status.add_cluster(
            c,
            "no longer configured",
            labels_for(&config.cluster_labels, c.as_str()),
        );
        status.update(c, |s| s.leaving = true);
    }
    for s in streams.iter().filter(|s| kept.contains(&s.cluster)) {
        status.stream_restored(&s.cluster, &s.resource, &s.resource_version);
    }
    for c in kept {
        status.cluster_gone(c, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_goes_to_what_has_settled_once_enough_of_it_changed_or_a_minute_passed() {
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut p = Passes::new(Duration::from_secs(10));
        // Changes by watch events: nothing has settled before `after`.
        let by_events = |r: u64| (Revision(r), 0);
        assert_eq!(p.due(at(0), by_events(1000), 1000), None);
        assert_eq!(p.due(at(5), by_events(1500), 1000), None);
        // The revision seen ten seconds ago has settled: 1,000 changes, a pass.
        assert_eq!(p.due(at(10), by_events(1600), 1000), Some(Revision(1000)));
        // 500 more settled: over a sixty-fourth of 1,000 objects.
        assert_eq!(p.due(at(15), by_events(1600), 1000), Some(Revision(1500)));
        // 100 more settle: over a sixty-fourth of 1,000 objects.
        assert_eq!(p.due(at(20), by_events(1610), 1000), Some(Revision(1600)));
        // Twenty more settle: under a sixty-fourth of 10,000 objects, so not before a
        // minute after the last pass.
        assert_eq!(p.due(at(31), by_events(1620), 10_000), None);
        assert_eq!(p.due(at(79), by_events(1620), 10_000), None);
        assert_eq!(p.due(at(80), by_events(1620), 10_000), Some(Revision(1620)));
        // Nothing new: no pass, however long.
        assert_eq!(p.due(at(400), by_events(1620), 10_000), None);
    }

    #[test]
    fn changes_made_by_lists_settle_in_a_tenth_of_the_wait_and_never_ahead_of_others() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Passes::new(Duration::from_secs(10));
        // A first sync: every change by a list. Settled a second after it was seen.
        assert_eq!(p.due(at(0), (Revision(10_000), 10_000), 10_000), None);
        assert_eq!(p.due(at(999), (Revision(20_000), 20_000), 20_000), None);
        assert_eq!(
            p.due(at(1_000), (Revision(30_000), 30_000), 30_000),
            Some(Revision(10_000))
        );
        // A stretch of watch events (4,000 of 10,000 changes): it waits the whole ten
        // seconds, and the listed stretch after it waits for it.
        assert_eq!(
            p.due(at(2_000), (Revision(40_000), 36_000), 40_000),
            Some(Revision(30_000))
        );
        assert_eq!(p.due(at(3_000), (Revision(50_000), 46_000), 50_000), None);
        assert_eq!(p.due(at(11_999), (Revision(50_000), 46_000), 50_000), None);
        assert_eq!(
            p.due(at(12_000), (Revision(50_000), 46_000), 50_000),
            Some(Revision(50_000))
        );
        // Nine in ten by lists counts as listed.
        assert_eq!(p.due(at(13_000), (Revision(60_000), 55_000), 60_000), None);
        assert_eq!(
            p.due(at(14_000), (Revision(60_000), 55_000), 60_000),
            Some(Revision(60_000))
        );
    }

    #[test]
    fn with_no_wait_every_change_is_settled_at_once() {
        let t0 = std::time::Instant::now();
        let mut p = Passes::new(Duration::ZERO);
        assert_eq!(p.due(t0, (Revision(7), 0), 7), Some(Revision(7)));
        assert_eq!(p.due(t0, (Revision(7), 0), 7), None);
        assert_eq!(p.due(t0, (Revision(8), 0), 7), Some(Revision(8)));
    }
}
