//! Wiring: cluster sources → informers → one ordered, batched ingest → the index; and
//! the status table beside it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fleetscope_index::{Change, Index, ObjectInput};
use fleetscope_informer::PrunedObject;
use fleetscope_informer::discovery::{self, Served};
use fleetscope_informer::source::{self, ClusterSource};
use fleetscope_informer::stream::{self, Backoff, StreamConfig, StreamId, Update};
use fleetscope_model::selector::field_in_json;
use fleetscope_model::{ClusterName, Location, ObjectKey, ResourceType, Revision};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::persist::{self, PersistConfig, Persister};
use crate::status::StatusTable;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Resource types to collect, kubectl-style; `*` for every watchable type.
    pub resources: Vec<String>,
    /// Labels per cluster, for cluster selectors.
    pub cluster_labels: HashMap<String, BTreeMap<String, String>>,
    /// Informer settings.
    pub stream: StreamConfig,
    /// Per resource type (named kubectl-style): namespace scope and server-side selectors.
    pub scopes: Vec<Scope>,
    /// How often each cluster's discovery is refreshed (new CRDs, vanished types). Default 60 s.
    pub rediscovery: Duration,
    /// Index settings.
    pub index: fleetscope_index::Config,
    /// Most updates applied in one batch. Default 4,096.
    pub batch: usize,
    /// Write-behind persistence settings (used when started with a store).
    pub persist: PersistConfig,
    /// How long a resumed watch must stay open without a 410 before restored objects
    /// count as current, when no event or bookmark confirms it sooner. Default 2 s.
    pub restore_confirm: Duration,
    /// Keep the stored objects of clusters no longer configured (default: delete them).
    pub keep_removed_clusters: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            resources: vec![
                "pods".into(),
                "configmaps".into(),
                "deployments.apps".into(),
            ],
            cluster_labels: HashMap::new(),
            stream: StreamConfig::default(),
            scopes: Vec::new(),
            rediscovery: Duration::from_secs(60),
            index: fleetscope_index::Config::default(),
            batch: 4096,
            persist: PersistConfig::default(),
            restore_confirm: Duration::from_secs(2),
            keep_removed_clusters: false,
        }
    }
}

/// What of one resource type to collect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// The resource type, kubectl-style.
    pub resource: String,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Server-side label selector.
    pub labels: Option<String>,
    /// Server-side field selector.
    pub fields: Option<String>,
}

impl Scope {
    /// Parses `RESOURCE:namespace=NS;labels=SELECTOR;fields=SELECTOR` (each part optional),
    /// checking the selectors' syntax.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (resource, options) = text.split_once(':').ok_or_else(|| {
            format!("{text:?}: expected RESOURCE:namespace=NS;labels=SELECTOR;fields=SELECTOR")
        })?;
        let mut scope = Scope {
            resource: resource.trim().to_string(),
            ..Scope::default()
        };
        if scope.resource.is_empty() {
            return Err(format!("{text:?}: the resource type is missing"));
        }
        for part in options.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{text:?}: {part:?} is not key=value"))?;
            let value = value.trim().to_string();
            match key.trim() {
                "namespace" => scope.namespace = Some(value),
                "labels" => {
                    fleetscope_model::LabelSelector::parse(&value)
                        .map_err(|e| format!("{text:?}: {e}"))?;
                    scope.labels = Some(value);
                }
                "fields" => {
                    fleetscope_model::FieldSelector::parse(&value)
                        .map_err(|e| format!("{text:?}: {e}"))?;
                    scope.fields = Some(value);
                }
                other => {
                    return Err(format!(
                        "{text:?}: unknown option {other:?} (namespace, labels, fields)"
                    ));
                }
            }
        }
        Ok(scope)
    }
}

/// The stream settings for one type: the base, narrowed by the first scope naming it.
fn stream_config(config: &EngineConfig, rt: &ResourceType, served: &[Served]) -> StreamConfig {
    let mut stream = config.stream.clone();
    let scope = config.scopes.iter().find(|s| {
        discovery::resolve(std::slice::from_ref(&s.resource), served)
            .resources
            .first()
            == Some(rt)
    });
    if let Some(s) = scope {
        stream.namespace = s.namespace.clone();
        stream.label_selector = s.labels.clone();
        stream.field_selector = s.fields.clone();
    }
    stream
}

/// The running engine: the index, the status table, and the tasks feeding them.
pub struct Engine {
    /// The merged index.
    pub index: Arc<Index>,
    /// Cluster and stream health.
    pub status: StatusTable,
    /// Every resource type collected in some cluster.
    pub types: Types,
    persister: Option<Arc<Persister>>,
    /// Whether the index was restored from a store holding data.
    restored: bool,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

/// Where a cluster's streams resume: resource name → (type, resourceVersion, selection).
type Resume = HashMap<String, (ResourceType, String, String)>;

/// Every resource type collected in some cluster, by canonical name.
pub type Types = Arc<std::sync::RwLock<BTreeMap<String, ResourceType>>>;

/// Makes a type known to queries.
fn collect_type(types: &Types, rt: &ResourceType) {
    types
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(rt.name(), rt.clone());
}

/// A stream loaded from the store: answered for at once, restored until confirmed.
fn restore_stream(
    status: &StatusTable,
    types: &Types,
    cluster: &ClusterName,
    rt: &ResourceType,
    rv: &str,
) {
    status.stream_restored(cluster, rt, rv);
    collect_type(types, rt);
}

impl Engine {
    /// Starts informers for every source and the ingest, in memory only. Revisions
    /// begin above anything an earlier run issued ([`Revision::fresh_start`]), so a
    /// client's revision from before is refused, never taken for another change.
    pub fn start(sources: Vec<ClusterSource>, config: EngineConfig) -> Self {
        let index = Arc::new(Index::starting_after(
            config.index.clone(),
            Revision::fresh_start(),
        ));
        let status = StatusTable::default();
        Self::start_inner(sources, config, index, status, None, HashMap::new())
    }

    /// Starts from what a store holds: the index is rebuilt at once, each stored stream
    /// resumes its watch from its stored resourceVersion without listing, and every
    /// change is written behind to the store. Clusters no longer configured lose their
    /// objects (as deletes) unless `keep_removed_clusters`.
    pub fn start_with_store(
        sources: Vec<ClusterSource>,
        config: EngineConfig,
        store: Arc<dyn fleetscope_store::Store>,
        mut loaded: fleetscope_store::Loaded,
    ) -> Self {
        let started = std::time::Instant::now();
        let configured: std::collections::BTreeSet<ClusterName> = sources
            .iter()
            .map(|s| ClusterName::from(s.name.as_str()))
            .collect();
        reindex_fields(&mut loaded, &config.index.field_indexes);
        let mut continued = persist::Continued::of(&loaded);
        let streams = std::mem::take(&mut loaded.streams);
        let objects = loaded.objects.len();
        // A store with nothing in it (new, or one moved aside as damaged) continues
        // nothing: its revisions begin above anything an earlier run issued, and the
        // first write keeps that start on disk.
        let fresh = loaded.revision == Revision(0) && objects == 0 && streams.is_empty();
        let index = Arc::new(if fresh {
            continued.revision = Revision::fresh_start();
            Index::starting_after(config.index.clone(), continued.revision)
        } else {
            Index::restore(config.index.clone(), persist::restored(&mut loaded))
        });
        let revision = index.snapshot().revision();
        tracing::info!(objects, streams = streams.len(), %revision, took = ?started.elapsed(), "restored the index from the store");
        let mut persist_config = config.persist.clone();
        persist_config.log_retention = config.index.log_retention;
        let status = StatusTable::default();
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
        let mut held: std::collections::BTreeSet<ClusterName> = index
            .snapshot()
            .counts()
            .map(|(_, c, _)| c.clone())
            .collect();
        held.extend(streams.iter().map(|s| s.cluster.clone()));
        let mut kept = Vec::new();
        for gone in held.difference(&configured) {
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
        let mut resume: HashMap<ClusterName, Resume> = HashMap::new();
        let mut kept_streams = Vec::new();
        for s in streams {
            if kept.contains(&s.cluster) {
                kept_streams.push(s);
            } else if configured.contains(&s.cluster) {
                resume.entry(s.cluster.clone()).or_default().insert(
                    s.resource.name(),
                    (s.resource, s.resource_version, s.selection),
                );
            }
        }
        let mut engine = Self::start_inner(sources, config, index, status, Some(persister), resume);
        engine.restored = !fresh;
        for c in &kept {
            engine.status.add_cluster(c, "", BTreeMap::new());
            engine.status.update(c, |s| s.discovered = true);
        }
        for s in kept_streams {
            restore_stream(
                &engine.status,
                &engine.types,
                &s.cluster,
                &s.resource,
                &s.resource_version,
            );
        }
        for c in kept {
            engine.status.update(&c, |s| {
                s.error = Some("no longer configured; objects kept from the store".into());
                s.error_since = Some(SystemTime::now());
            });
        }
        engine
    }

    fn start_inner(
        sources: Vec<ClusterSource>,
        config: EngineConfig,
        index: Arc<Index>,
        status: StatusTable,
        persister: Option<Arc<Persister>>,
        mut resume: HashMap<ClusterName, Resume>,
    ) -> Self {
        let types: Types = Arc::default();
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        // A batch is published at once; kept within half a subscriber buffer, a reader
        // that keeps up is never overrun by one batch.
        let batch = config
            .batch
            .clamp(1, (config.index.subscriber_buffer / 2).max(1));
        let (tx, rx) = mpsc::channel::<Update>(batch.max(16) * 4);
        let field_paths = config.index.field_indexes.clone();
        if let Some(p) = &persister {
            tasks.spawn(
                p.clone()
                    .run(cancel.clone())
                    .instrument(tracing::info_span!("store")),
            );
        }
        tasks.spawn(
            ingest(
                index.clone(),
                status.clone(),
                persister.clone(),
                rx,
                field_paths,
                batch,
                cancel.clone(),
            )
            .instrument(tracing::info_span!("ingest")),
        );
        for source in sources {
            let labels = config
                .cluster_labels
                .get(&source.name)
                .cloned()
                .unwrap_or_default();
            let name = ClusterName::from(source.name.as_str());
            status.add_cluster(&name, "", labels);
            let cluster_resume = resume.remove(&name).unwrap_or_default();
            for (rt, rv, _) in cluster_resume.values() {
                restore_stream(&status, &types, &name, rt, rv);
            }
            let span = tracing::info_span!("cluster", cluster = %source.name);
            tasks.spawn(
                run_cluster(
                    source,
                    config.clone(),
                    cluster_resume,
                    tx.clone(),
                    status.clone(),
                    Arc::clone(&types),
                    tasks.clone(),
                    cancel.clone(),
                )
                .instrument(span),
            );
        }
        Self {
            index,
            status,
            types,
            persister,
            restored: false,
            cancel,
            tasks,
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
    /// unreachable cluster is reported, not waited for).
    pub fn is_ready(&self) -> bool {
        self.restored || !self.status.clusters().iter().any(|c| c.discovering())
    }

    /// Persistence figures, when running with a store.
    pub fn store_stats(&self) -> Option<persist::PersistStats> {
        self.persister.as_ref().map(|p| p.stats())
    }

    /// The persister, when running with a store.
    pub fn persister(&self) -> Option<Arc<Persister>> {
        self.persister.clone()
    }

    /// Stops every task and waits for them, up to `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        self.cancel.cancel();
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(?grace, "engine tasks did not stop within the grace period");
        }
        // Everything the ingest applied is written before the process ends.
        if let Some(p) = &self.persister
            && p.close().await.is_err()
        {
            tracing::error!(
                "the final store write failed: the next start resumes from the last write"
            );
        }
    }

    /// A token cancelled when the engine stops.
    pub fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_cluster(
    source: ClusterSource,
    config: EngineConfig,
    mut resume: Resume,
    tx: mpsc::Sender<Update>,
    status: StatusTable,
    types: Types,
    tasks: TaskTracker,
    cancel: CancellationToken,
) {
    let name = ClusterName::from(source.name.as_str());
    let client = match source::config(&source).await.and_then(|config| {
        let server = config.cluster_url.to_string();
        status.update(&name, |c| c.server = server);
        kube::Client::try_from(config).map_err(|e| source::SourceError::Client {
            cluster: source.name.clone(),
            message: e.to_string(),
        })
    }) {
        Ok(c) => c,
        Err(e) => {
            let why = source::chain(&e);
            tracing::error!(error = %why, "cannot build a client for the cluster");
            status.update(&name, |c| {
                c.error = Some(why);
                c.error_since.get_or_insert_with(SystemTime::now);
            });
            return;
        }
    };
    let mut streams: HashMap<ResourceType, CancellationToken> = HashMap::new();
    let mut backoff = Backoff::new(config.stream.backoff_start, config.stream.backoff_cap);
    loop {
        let wait = match discovery::discover(&client).await {
            Ok(served) => {
                backoff.reset();
                if let Ok(v) = client.apiserver_version().await {
                    status.update(&name, |c| c.version = v.git_version.clone());
                }
                status.update(&name, |c| {
                    c.error = None;
                    c.error_since = None;
                });
                reconcile(
                    &name,
                    &client,
                    &served,
                    &config,
                    &mut resume,
                    &mut streams,
                    &tx,
                    &status,
                    &types,
                    &tasks,
                    &cancel,
                )
                .await;
                status.update(&name, |c| c.discovered = true);
                config.rediscovery
            }
            Err(e) => {
                tracing::warn!(error = %e, "discovery failed");
                status.update(&name, |c| {
                    c.error = Some(format!("discovery failed: {e}"));
                    c.error_since.get_or_insert_with(SystemTime::now);
                });
                backoff.next_delay()
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// Starts streams for newly served types and stops those whose type vanished.
#[allow(clippy::too_many_arguments)]
async fn reconcile(
    name: &ClusterName,
    client: &kube::Client,
    served: &[Served],
    config: &EngineConfig,
    resume: &mut Resume,
    streams: &mut HashMap<ResourceType, CancellationToken>,
    tx: &mpsc::Sender<Update>,
    status: &StatusTable,
    types: &Types,
    tasks: &TaskTracker,
    cancel: &CancellationToken,
) {
    let resolved = discovery::resolve(&config.resources, served);
    status.update(name, |c| c.missing = resolved.missing.clone());
    for rt in &resolved.resources {
        if streams.contains_key(rt) {
            continue;
        }
        collect_type(types, rt);
        let token = cancel.child_token();
        streams.insert(rt.clone(), token.clone());
        status.update_stream(name, rt, |_| {});
        let stream = stream_config(config, rt, served);
        let selection = stream.selection();
        let span = tracing::info_span!("informer", cluster = %name, resource = %rt.name());
        // A stored stream of the same type and selection resumes its watch; anything
        // else lists, and the list is diffed against the stored objects.
        let resume_from = resume
            .remove(&rt.name())
            .filter(|(stored, _, _)| stored == rt)
            .and_then(|(_, rv, stored)| {
                if stored == selection {
                    Some(rv)
                } else {
                    tracing::info!(cluster = %name, resource = %rt.name(), was = %stored, now = %selection, "the stream selects differently than when its objects were stored: listing again");
                    None
                }
            });
        let id = Arc::new(StreamId::new(name.clone(), rt.clone()).selecting(selection));
        if resume_from.is_some() {
            let (status, name, rt, wait, token) = (
                status.clone(),
                name.clone(),
                rt.clone(),
                config.restore_confirm,
                token.clone(),
            );
            tasks.spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => status.confirm_restored(&name, &rt),
                    _ = token.cancelled() => {}
                }
            });
        }
        tasks.spawn(
            stream::run(client.clone(), id, stream, resume_from, tx.clone(), token)
                .instrument(span),
        );
    }
    let mut gone: Vec<ResourceType> = streams
        .keys()
        .filter(|rt| !resolved.resources.contains(rt))
        .cloned()
        .collect();
    // Stored streams this cluster no longer serves (or that are no longer configured).
    gone.extend(resume.drain().map(|(_, (rt, _, _))| rt));
    for rt in gone {
        tracing::info!(cluster = %name, resource = %rt.name(), "resource type no longer served: dropping its objects");
        if let Some(token) = streams.remove(&rt) {
            token.cancel();
        }
        status.remove_stream(name, &rt.name());
        // A type no cluster collects any more is unknown to queries again.
        let still_collected = status
            .clusters()
            .iter()
            .any(|c| c.streams.contains_key(&rt.name()));
        if !still_collected {
            types
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&rt.name());
        }
        let id = Arc::new(StreamId::new(name.clone(), rt));
        let _ = tx
            .send(Update::Listed {
                stream: id,
                objects: Vec::new(),
                resource_version: String::new(),
            })
            .await;
    }
}

/// Stored objects carry the field-index values of the configuration that stored them;
/// when the configured paths differ, the values are read again from each object's JSON.
fn reindex_fields(loaded: &mut fleetscope_store::Loaded, paths: &[String]) {
    if loaded.field_indexes.as_deref() == Some(paths) {
        return;
    }
    let records = loaded.objects.iter_mut().chain(
        loaded
            .events
            .iter_mut()
            .flat_map(|e| std::iter::once(&mut e.object).chain(e.prev.as_mut())),
    );
    let mut redone = 0usize;
    for o in records {
        o.fields = field_values(&o.json, paths);
        redone += 1;
    }
    if redone > 0 {
        tracing::info!(
            objects = redone,
            "field indexes changed since the store was written: values read again"
        );
    }
}

/// The configured field-index values of an object, read at any nesting depth.
fn field_values(json: &str, paths: &[String]) -> Vec<(String, String)> {
    paths
        .iter()
        .filter_map(|p| Some((p.clone(), field_in_json(json, p)?)))
        .collect()
}

/// An object's key, sharing the stream's resource name and cluster.
fn stream_key(stream: &StreamId, o: &PrunedObject) -> ObjectKey {
    StreamKeys::new(stream).key(o)
}

/// Keys of one stream's objects: consecutive objects of one namespace (as a list gives
/// them) share one location, so the index finds its shared copy without a lookup.
struct StreamKeys<'a> {
    stream: &'a StreamId,
    last: Option<Arc<Location>>,
}

impl<'a> StreamKeys<'a> {
    fn new(stream: &'a StreamId) -> Self {
        Self { stream, last: None }
    }

    fn key(&mut self, o: &PrunedObject) -> ObjectKey {
        let location = match &self.last {
            Some(l) if *l.namespace == *o.namespace => l.clone(),
            _ => self
                .last
                .insert(Arc::new(Location {
                    resource: self.stream.name.clone(),
                    cluster: self.stream.cluster.clone(),
                    namespace: Arc::from(o.namespace.as_str()),
                }))
                .clone(),
        };
        ObjectKey::in_location(location, Arc::from(o.name.as_str()))
    }
}

fn to_input(key: ObjectKey, o: PrunedObject, field_paths: &[String]) -> ObjectInput {
    let fields = field_values(&o.json, field_paths);
    ObjectInput {
        key,
        json: o.json,
        labels: o.labels,
        owners: o.owners,
        fields,
    }
}

/// The one ordered writer: drains what is waiting, applies it as one batch, then
/// records stream progress, so status never runs ahead of the index.
async fn ingest(
    index: Arc<Index>,
    status: StatusTable,
    persister: Option<Arc<Persister>>,
    mut rx: mpsc::Receiver<Update>,
    field_paths: Vec<String>,
    batch: usize,
    cancel: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            u = rx.recv() => match u { Some(u) => u, None => return },
            _ = cancel.cancelled() => return,
        };
        let mut updates = vec![first];
        while updates.len() < batch {
            match rx.try_recv() {
                Ok(u) => updates.push(u),
                Err(_) => break,
            }
        }
        let mut changes = Vec::with_capacity(updates.len());
        // Status is recorded after the batch is applied, so it never runs ahead of the index.
        let mut after: Vec<(Arc<StreamId>, Progress)> = Vec::with_capacity(updates.len());
        for u in updates {
            match u {
                Update::Listed {
                    stream,
                    objects,
                    resource_version,
                } => {
                    let mut keys = StreamKeys::new(&stream);
                    let objects = objects
                        .into_iter()
                        .map(|o| to_input(keys.key(&o), o, &field_paths))
                        .collect();
                    changes.push(Change::Replace {
                        resource: stream.name.to_string(),
                        cluster: stream.cluster.clone(),
                        objects,
                    });
                    if resource_version.is_empty() {
                        after.push((stream, Progress::Dropped));
                    } else {
                        after.push((stream, Progress::Listed(resource_version)));
                    }
                }
                Update::Applied { stream, object } => {
                    let rv = object.resource_version.clone();
                    let key = stream_key(&stream, &object);
                    changes.push(Change::Upsert(to_input(key, object, &field_paths)));
                    after.push((stream, Progress::Event(rv)));
                }
                Update::Deleted { stream, object } => {
                    changes.push(Change::Delete(stream_key(&stream, &object)));
                    after.push((stream, Progress::Event(object.resource_version)));
                }
                Update::Progress {
                    stream,
                    resource_version,
                } => after.push((stream, Progress::Bookmark(resource_version))),
                Update::State {
                    stream,
                    state,
                    error,
                } => after.push((stream, Progress::State(state, error))),
            }
        }
        // The resume points the batch implies, written with its events.
        let resume_points: Vec<_> = after
            .iter()
            .filter_map(|(stream, progress)| {
                let rv = match progress {
                    Progress::Listed(rv) | Progress::Event(rv) | Progress::Bookmark(rv)
                        if !rv.is_empty() =>
                    {
                        Some((rv.clone(), stream.selection.clone()))
                    }
                    Progress::Dropped => None,
                    _ => return None,
                };
                Some((stream.cluster.clone(), stream.resource.clone(), rv))
            })
            .collect();
        let mut log = ProgressLog::default();
        for (stream, progress) in after {
            log.push(stream, progress);
        }
        match &persister {
            // Visible once durable: the persister publishes the batch and its progress.
            Some(p) => {
                p.record(index.stage(changes), resume_points, log);
                p.backpressure().await;
            }
            None => {
                index.apply(changes);
                log.apply(&status);
            }
        }
    }
}

/// Stream progress in the order it happened, waiting to be reported with the batch
/// it belongs to. Consecutive events and bookmarks of one stream fold into one entry,
/// so a backlog that waits on a slow store stays small.
#[derive(Default)]
pub struct ProgressLog {
    entries: Vec<(Arc<StreamId>, Progress)>,
    /// Each stream's last entry.
    last: HashMap<(ClusterName, Arc<str>), usize>,
}

impl ProgressLog {
    fn push(&mut self, stream: Arc<StreamId>, progress: Progress) {
        let key = (stream.cluster.clone(), stream.name.clone());
        if let Some(&i) = self.last.get(&key)
            && let Some(folded) = self.entries[i].1.fold(&progress)
        {
            self.entries[i].1 = folded;
            return;
        }
        self.last.insert(key, self.entries.len());
        self.entries.push((stream, progress));
    }

    /// Appends later progress.
    pub(crate) fn append(&mut self, later: ProgressLog) {
        for (stream, progress) in later.entries {
            self.push(stream, progress);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Reports the progress to the status table, in order.
    pub(crate) fn apply(self, status: &StatusTable) {
        for (stream, progress) in self.entries {
            let (cluster, rt) = (&stream.cluster, &stream.resource);
            match progress {
                Progress::Dropped => {}
                Progress::Listed(rv) => status.stream_listed(cluster, rt, &rv),
                Progress::Event(rv) => status.stream_progress(cluster, rt, &rv, true),
                Progress::Bookmark(rv) => status.stream_progress(cluster, rt, &rv, false),
                Progress::State(state, error) => status.stream_state(cluster, rt, state, error),
            }
        }
    }
}

/// What an update says about its stream, recorded once its batch is visible.
enum Progress {
    /// The stream's type is gone: its objects were dropped.
    Dropped,
    Listed(String),
    Event(String),
    Bookmark(String),
    State(fleetscope_informer::StreamState, Option<String>),
}

impl Progress {
    /// One entry for this and `later`, when both are events or bookmarks: the later
    /// resourceVersion, an event if either was.
    fn fold(&self, later: &Progress) -> Option<Progress> {
        match (self, later) {
            (Progress::Event(_), Progress::Event(rv) | Progress::Bookmark(rv))
            | (Progress::Bookmark(_), Progress::Event(rv)) => Some(Progress::Event(rv.clone())),
            (Progress::Bookmark(_), Progress::Bookmark(rv)) => Some(Progress::Bookmark(rv.clone())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_and_reject_bad_selectors() {
        let s = Scope::parse(
            "pods:namespace=team-0;labels=app in (web,api);fields=status.phase=Running",
        )
        .unwrap();
        assert_eq!(s.resource, "pods");
        assert_eq!(s.namespace.as_deref(), Some("team-0"));
        assert_eq!(s.labels.as_deref(), Some("app in (web,api)"));
        assert_eq!(s.fields.as_deref(), Some("status.phase=Running"));
        assert!(Scope::parse("pods").is_err());
        assert!(Scope::parse(":namespace=x").is_err());
        assert!(
            Scope::parse("pods:labels=app in web")
                .unwrap_err()
                .contains("position")
        );
        assert!(Scope::parse("pods:colour=blue").is_err());
    }
}
