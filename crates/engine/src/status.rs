//! Health of every cluster and stream, and the freshness answers report.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime};

use fleetscope_informer::StreamState;
use fleetscope_model::catalogue::{Catalogue, Named};
use fleetscope_model::{ClusterName, ResourceType};
use tokio::sync::broadcast;

pub use fleetscope_model::fleet::{ClusterFreshness, Freshness};

/// One stream's status.
#[derive(Debug, Clone)]
pub struct StreamStatus {
    /// What it is doing.
    pub state: StreamState,
    /// The last resourceVersion seen.
    pub resource_version: String,
    /// When the last event arrived.
    pub last_event: Option<SystemTime>,
    /// The last error.
    pub last_error: Option<String>,
    /// Whether it has completed a list since start.
    pub synced_once: bool,
    /// When it was last known current.
    pub current_at: Option<Instant>,
    /// When it stopped being current.
    pub stale_since: Option<SystemTime>,
    /// Loaded from the store and not yet confirmed by its resumed watch.
    pub restored: bool,
    /// What it has received since the cluster joined (for metrics).
    pub counts: StreamCounts,
    /// How it last came to hold its cluster's state.
    pub sync_method: Option<fleetscope_model::fleet::SyncMethod>,
    /// Why it listed although it asked for a streaming list.
    pub watch_list_fallback: Option<String>,
}

/// What a stream has received, counted for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounts {
    /// Watch events ADDED.
    pub added: u64,
    /// Watch events MODIFIED.
    pub modified: u64,
    /// Watch events DELETED.
    pub deleted: u64,
    /// Lists with nothing to resume from (a first list, or a changed selection).
    pub initial_lists: u64,
    /// Lists after its resourceVersion expired.
    pub expired_lists: u64,
    /// Lists made to confirm the stream current (after this process did not run for
    /// a while).
    pub confirm_lists: u64,
    /// Objects stored with more labels than the label index takes of one object
    /// (`fleetscope_index::MAX_INDEXED_LABELS`): selected by a scan.
    pub unindexed_labels: u64,
    /// What the stream dropped of what its cluster sent (too large, or a
    /// resourceVersion malformed or behind).
    pub dropped: fleetscope_informer::stream::Drops,
}

impl StreamCounts {
    /// Adds `other` to these.
    pub fn add(&mut self, other: &StreamCounts) {
        self.added += other.added;
        self.modified += other.modified;
        self.deleted += other.deleted;
        self.initial_lists += other.initial_lists;
        self.expired_lists += other.expired_lists;
        self.confirm_lists += other.confirm_lists;
        self.unindexed_labels += other.unindexed_labels;
        self.dropped.add(&other.dropped);
    }
}

impl StreamStatus {
    fn new() -> Self {
        Self {
            state: StreamState::Pending,
            resource_version: String::new(),
            last_event: None,
            last_error: None,
            synced_once: false,
            current_at: None,
            stale_since: None,
            restored: false,
            counts: StreamCounts::default(),
            sync_method: None,
            watch_list_fallback: None,
        }
    }

    /// How far behind the cluster the stream may be: zero while its watch is open and
    /// current (a quiet, healthy stream is not behind), else the time since it was
    /// last known current; `None` if it never was.
    pub fn sync_lag(&self) -> Option<std::time::Duration> {
        if self.freshness() == Freshness::Synced {
            return Some(std::time::Duration::ZERO);
        }
        self.current_at.map(|t| t.elapsed())
    }

    /// The stream's freshness. One that has failed and never synced since is in
    /// error (with its error), whether it is backing off or trying again.
    pub fn freshness(&self) -> Freshness {
        match self.state {
            StreamState::Forbidden | StreamState::NotFound => Freshness::Error,
            StreamState::Failed if self.synced_once => Freshness::Stale,
            _ if !self.synced_once && !self.restored && self.last_error.is_some() => {
                Freshness::Error
            }
            _ if self.restored => Freshness::Restored,
            StreamState::Watching if self.synced_once => Freshness::Synced,
            _ if self.synced_once => Freshness::Stale,
            _ => Freshness::Syncing,
        }
    }
}

/// One cluster's status.
#[derive(Debug, Clone)]
pub struct ClusterStatus {
    /// Name.
    pub name: ClusterName,
    /// Labels from the configuration.
    pub labels: BTreeMap<String, String>,
    /// The API server address.
    pub server: String,
    /// The Kubernetes version it reports.
    pub version: String,
    /// A cluster-level error (client, discovery), if any.
    pub error: Option<String>,
    /// When the cluster-level error began.
    pub error_since: Option<SystemTime>,
    /// Per resource type.
    pub streams: BTreeMap<String, (ResourceType, StreamStatus)>,
    /// Configured names this cluster does not serve, with why.
    pub missing: Vec<(String, String)>,
    /// Set when the cluster left the fleet and its objects were kept: why.
    pub kept: Option<String>,
    /// Told to leave the fleet; its objects go (or are kept) once its streams stop.
    pub leaving: bool,
    /// Whether its discovery has completed once since start (until then, a type
    /// unknown to queries may still be one it serves).
    pub discovered: bool,
    /// Where its settings come from, for a person (`kubeconfig FILE, context NAME`).
    pub source: String,
    /// When its settings were last (re)loaded.
    pub loaded_at: SystemTime,
    /// When it joined the fleet (readiness waits for its first discovery a while).
    pub joined: std::time::Instant,
    /// Its requests to its API server, by method and code.
    pub requests: Arc<fleetscope_informer::requests::RequestCounts>,
    /// What it served at its last discovery, with short and singular names.
    pub served: Arc<Vec<fleetscope_informer::discovery::Served>>,
    /// Set (when read) while the store's writes fail: nothing newer than the last
    /// write is visible, so no answer is current.
    pub store_stall: Option<StoreStall>,
}

impl ClusterStatus {
    /// Whether its first discovery is still to come: not yet done, and not failed (an
    /// unreachable cluster is reported, not waited for).
    pub fn discovering(&self) -> bool {
        !self.discovered && self.error.is_none() && self.kept.is_none()
    }

    /// Freshness for one resource type (or the whole cluster with `None`), with the time it went stale and why.
    pub fn freshness(&self, resource: Option<&str>) -> (Freshness, Option<SystemTime>, String) {
        let (freshness, since, why) = self.freshness_of_streams(resource);
        match &self.store_stall {
            Some(stall)
                if matches!(
                    freshness,
                    Freshness::Synced | Freshness::Restored | Freshness::Syncing
                ) =>
            {
                (
                    Freshness::Stale,
                    Some(stall.since),
                    format!(
                        "the store cannot be written ({}): answers hold only what was written before; retried until it succeeds",
                        stall.error
                    ),
                )
            }
            _ => (freshness, since, why),
        }
    }

    /// The freshness of a cluster with no stream (of `resource`, or at all) yet.
    fn no_streams(&self, resource: Option<&str>) -> (Freshness, Option<SystemTime>, String) {
        if !self.discovered {
            return (
                Freshness::Syncing,
                None,
                "connecting to the cluster and discovering its resource types".into(),
            );
        }
        match resource {
            Some(r) => (
                Freshness::Error,
                None,
                format!("the cluster serves no resource type {r}"),
            ),
            None => (Freshness::Syncing, None, "no resource streams yet".into()),
        }
    }

    /// [`ClusterStatus::freshness`] as its streams have it, whatever the store does.
    fn freshness_of_streams(
        &self,
        resource: Option<&str>,
    ) -> (Freshness, Option<SystemTime>, String) {
        if let Some(why) = &self.kept {
            return (Freshness::Stale, self.error_since, why.clone());
        }
        let streams: Vec<&StreamStatus> = match resource {
            Some(r) => self.streams.get(r).map(|(_, s)| s).into_iter().collect(),
            None => self.streams.values().map(|(_, s)| s).collect(),
        };
        if let Some(e) = &self.error {
            let ever = streams.iter().any(|s| s.synced_once);
            let f = if ever {
                Freshness::Stale
            } else {
                Freshness::Error
            };
            return (f, self.error_since, e.clone());
        }
        if streams.is_empty() {
            return self.no_streams(resource);
        }
        let worst = streams
            .iter()
            .map(|s| s.freshness())
            .max()
            .unwrap_or(Freshness::Syncing);
        let why = streams
            .iter()
            .filter_map(|s| s.last_error.clone())
            .next()
            .unwrap_or_default();
        let since = streams.iter().filter_map(|s| s.stale_since).min();
        match worst {
            // Streams of known types start before discovery answers; the cluster as a
            // whole is synced once discovery has said what else it serves. Streams
            // that resumed from the store keep it restored meanwhile: its objects are
            // current for the types it served when it was stored.
            Freshness::Synced if resource.is_none() && !self.discovered => (
                if streams
                    .iter()
                    .all(|s| s.sync_method == Some(fleetscope_model::fleet::SyncMethod::Resumed))
                {
                    Freshness::Restored
                } else {
                    Freshness::Syncing
                },
                None,
                "discovering the cluster's resource types".into(),
            ),
            Freshness::Synced if resource.is_none() && !self.missing.is_empty() => {
                // Synced for what it serves; a configured name it does not serve is said.
                let names: Vec<String> = self
                    .missing
                    .iter()
                    .map(|(name, why)| format!("{name} ({why})"))
                    .collect();
                (
                    Freshness::Synced,
                    None,
                    format!("configured but not collected: {}", names.join(", ")),
                )
            }
            Freshness::Synced => (Freshness::Synced, None, String::new()),
            Freshness::Syncing => (Freshness::Syncing, None, "initial list in progress".into()),
            Freshness::Restored => (
                Freshness::Restored,
                None,
                "loaded from the store; resuming watches".into(),
            ),
            // Never a status without a reason: a stream between its watches (its
            // settings changed, its watch ended) has no error to give.
            other if why.is_empty() => (
                other,
                since,
                match other {
                    Freshness::Stale => {
                        "re-establishing a watch (its settings changed or it ended); answers hold the last state seen".into()
                    }
                    _ => "a stream cannot list or watch".into(),
                },
            ),
            other => (other, since, why),
        }
    }
}

/// How the cluster sources last loaded (kubeconfig files, and later the
/// configuration file).
#[derive(Debug, Clone, Default)]
pub struct SourcesStatus {
    /// When the sources in force were loaded.
    pub loaded_at: Option<SystemTime>,
    /// Why the last attempt to reload failed, if it did (the sources loaded before
    /// stay in force), and when.
    pub error: Option<(String, SystemTime)>,
}

/// A change of a cluster's freshness, as it stood when it happened.
#[derive(Debug, Clone)]
pub struct FreshnessChange {
    /// The cluster as a whole.
    pub overall: ClusterFreshness,
    /// Each type's stream as it stood then, by resource name, when the change was one
    /// of its streams (a Watch of one type is told its own type's change even when
    /// the stream is current again by the time the Watch reads it); `None` for a
    /// change of the whole cluster (added, removed, the store's writes).
    pub by_type: Option<Arc<BTreeMap<String, ClusterFreshness>>>,
}

impl FreshnessChange {
    /// A change of the whole cluster.
    fn of(overall: ClusterFreshness) -> Self {
        Self {
            overall,
            by_type: None,
        }
    }
}

/// How current each of a cluster's streams is, in the order of their names.
fn types_freshness(status: &ClusterStatus) -> Vec<Freshness> {
    status
        .streams
        .keys()
        .map(|t| status.freshness(Some(t)).0)
        .collect()
}

/// Every cluster's status. Cheap to clone.
#[derive(Clone)]
pub struct StatusTable {
    inner: Arc<RwLock<BTreeMap<ClusterName, ClusterStatus>>>,
    sources: Arc<RwLock<SourcesStatus>>,
    changes: broadcast::Sender<FreshnessChange>,
    store: Arc<RwLock<Option<StoreStall>>>,
    /// The types collected somewhere, with their names: built when first asked for
    /// after what is collected changed (a stream or a cluster added or removed, a
    /// cluster's discovery answered), then shared by every query until it changes again.
    catalogue: Arc<std::sync::Mutex<Option<Arc<Catalogue>>>>,
}

impl Default for StatusTable {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            sources: Arc::default(),
            changes: broadcast::channel(1024).0,
            store: Arc::default(),
            catalogue: Arc::default(),
        }
    }
}

/// Why nothing new is visible: the store's writes fail, and what is not durable is
/// not shown, so every cluster's answers are as of the last write that succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStall {
    /// The write's error.
    pub error: String,
    /// Since when writes fail.
    pub since: SystemTime,
}

impl StatusTable {
    /// Registers a cluster (anew, if it was held: a cluster added again starts over).
    pub fn add_cluster(&self, name: &ClusterName, source: &str, labels: BTreeMap<String, String>) {
        let status = ClusterStatus {
            name: name.clone(),
            labels,
            server: String::new(),
            version: String::new(),
            error: None,
            error_since: None,
            streams: BTreeMap::new(),
            missing: Vec::new(),
            kept: None,
            leaving: false,
            discovered: false,
            source: source.to_string(),
            loaded_at: SystemTime::now(),
            joined: std::time::Instant::now(),
            requests: Arc::default(),
            served: Arc::default(),
            store_stall: None,
        };
        self.write().insert(name.clone(), status);
        self.catalogue_changed();
        let _ = self.changes.send(FreshnessChange::of(ClusterFreshness {
            cluster: name.clone(),
            freshness: Freshness::Syncing,
            stale_since: None,
            message: "added to the fleet".into(),
        }));
    }

    /// A cluster left the fleet: forgotten, or (`kept`) held as it was with its
    /// objects, reported stale.
    /// A cluster added again since it was told to leave is not touched.
    pub fn cluster_gone(&self, name: &ClusterName, kept: bool) {
        let leaving = self.cluster(name).is_some_and(|c| c.leaving);
        if !leaving {
            return;
        }
        if kept {
            self.update(name, |c| {
                c.kept = Some("no longer configured; its objects are kept as they were".into());
                c.error_since = Some(SystemTime::now());
                c.streams
                    .values_mut()
                    .for_each(|(_, s)| s.state = StreamState::Pending);
            });
            return;
        }
        if self.write().remove(name).is_some() {
            self.catalogue_changed();
            let _ = self.changes.send(FreshnessChange::of(ClusterFreshness {
                cluster: name.clone(),
                freshness: Freshness::Error,
                stale_since: None,
                message: "removed from the fleet".into(),
            }));
        }
    }

    /// How the cluster sources last loaded.
    pub fn sources(&self) -> SourcesStatus {
        self.sources
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records a load of the cluster sources: in force (`error` is `None`) or refused.
    pub fn sources_loaded(&self, loaded_at: SystemTime, error: Option<String>) {
        let mut s = self.sources.write().unwrap_or_else(|e| e.into_inner());
        match error {
            None => {
                s.loaded_at = Some(loaded_at);
                s.error = None;
            }
            Some(e) => s.error = Some((e, loaded_at)),
        }
    }

    /// The types collected (or restored) somewhere now, with kubectl's names for them.
    pub fn catalogue(&self) -> Arc<Catalogue> {
        // The table first, then the cache: the order every writer takes them in (a
        // write to the table drops the cache while holding it), so no two wait on
        // each other, and no cache is built from a table changing under it.
        let table = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut cached = self.catalogue.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &*cached {
            return c.clone();
        }
        let names: HashMap<(&str, &str), &fleetscope_informer::discovery::Served> = table
            .values()
            .flat_map(|c| c.served.iter())
            .map(|s| ((s.resource.group.as_str(), s.resource.plural.as_str()), s))
            .collect();
        let built = Arc::new(Catalogue::new(table.values().flat_map(|c| {
            c.streams.values().map(|(rt, _)| {
                let served = names.get(&(rt.group.as_str(), rt.plural.as_str()));
                Named {
                    resource: rt.clone(),
                    singular: served.map(|s| s.singular.clone()).unwrap_or_default(),
                    short_names: served.map(|s| s.short_names.clone()).unwrap_or_default(),
                }
            })
        })));
        *cached = Some(built.clone());
        built
    }

    /// What is collected changed: the catalogue is built again when next asked for.
    fn catalogue_changed(&self) {
        *self.catalogue.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<ClusterName, ClusterStatus>> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every cluster's status, ordered by name.
    pub fn clusters(&self) -> Vec<ClusterStatus> {
        let stall = self.store_stall();
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|c| ClusterStatus {
                store_stall: stall.clone(),
                ..c.clone()
            })
            .collect()
    }

    /// One cluster's status.
    pub fn cluster(&self, name: &ClusterName) -> Option<ClusterStatus> {
        let stall = self.store_stall();
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
            .map(|mut c| {
                c.store_stall = stall;
                c
            })
    }

    /// Whether the store's writes fail now, and why.
    pub fn store_stall(&self) -> Option<StoreStall> {
        self.store.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records that the store's writes fail (or succeed again, `None`); every
    /// cluster's freshness says so to running Watches when it changes.
    pub fn set_store_stall(&self, stall: Option<StoreStall>) {
        let changed = {
            let mut s = self.store.write().unwrap_or_else(|e| e.into_inner());
            let changed = s.is_some() != stall.is_some();
            *s = stall;
            changed
        };
        if changed {
            for c in self.clusters() {
                let (freshness, stale_since, message) = c.freshness(None);
                let _ = self.changes.send(FreshnessChange::of(ClusterFreshness {
                    cluster: c.name.clone(),
                    freshness,
                    stale_since,
                    message,
                }));
            }
        }
    }

    /// Every cluster's labels, by name (read without copying the clusters' streams).
    pub fn all_labels(&self) -> BTreeMap<ClusterName, BTreeMap<String, String>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, c)| (name.clone(), c.labels.clone()))
            .collect()
    }

    /// Whether some cluster, by its name and labels, satisfies `check` (read in place).
    pub fn any_cluster(
        &self,
        check: impl Fn(&ClusterName, &BTreeMap<String, String>) -> bool,
    ) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(name, c)| check(name, &c.labels))
    }

    /// A cluster's labels.
    pub fn labels(&self, name: &ClusterName) -> Option<BTreeMap<String, String>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|c| c.labels.clone())
    }

    /// Where a cluster's requests to its API server are counted.
    pub fn request_counts(
        &self,
        name: &ClusterName,
    ) -> Option<Arc<fleetscope_informer::requests::RequestCounts>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|c| c.requests.clone())
    }

    /// Freshness changes, as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<FreshnessChange> {
        self.changes.subscribe()
    }

    /// Applies `f` to a cluster's status and announces a change of its overall freshness.
    pub fn update(&self, name: &ClusterName, f: impl FnOnce(&mut ClusterStatus)) {
        let mut table = self.write();
        let Some(status) = table.get_mut(name) else {
            return;
        };
        let before = status.freshness(None).0;
        let types_before = types_freshness(status);
        let shape = |c: &ClusterStatus| (c.streams.len(), Arc::as_ptr(&c.served));
        let shape_before = shape(status);
        f(status);
        if shape(status) != shape_before {
            self.catalogue_changed();
        }
        let (after, stale_since, message) = status.freshness(None);
        if before != after {
            tracing::info!(cluster = %name, ?before, ?after, "cluster freshness changed");
        }
        if before != after || types_freshness(status) != types_before {
            let by_type = status
                .streams
                .keys()
                .map(|t| {
                    let (freshness, stale_since, message) = status.freshness(Some(t));
                    let c = ClusterFreshness {
                        cluster: name.clone(),
                        freshness,
                        stale_since,
                        message,
                    };
                    (t.clone(), c)
                })
                .collect();
            let _ = self.changes.send(FreshnessChange {
                overall: ClusterFreshness {
                    cluster: name.clone(),
                    freshness: after,
                    stale_since,
                    message,
                },
                by_type: Some(Arc::new(by_type)),
            });
        }
    }

    /// Applies `f` to one stream's status, creating it if new.
    pub fn update_stream(
        &self,
        name: &ClusterName,
        rt: &ResourceType,
        f: impl FnOnce(&mut StreamStatus),
    ) {
        self.update(name, |c| {
            let (_, s) = c
                .streams
                .entry(rt.name())
                .or_insert_with(|| (rt.clone(), StreamStatus::new()));
            f(s);
        });
    }

    /// Forgets a stream (its type vanished from the cluster).
    pub fn remove_stream(&self, name: &ClusterName, resource: &str) {
        self.update(name, |c| {
            c.streams.remove(resource);
        });
    }

    /// Records a stream's new state.
    pub fn stream_state(
        &self,
        name: &ClusterName,
        rt: &ResourceType,
        state: StreamState,
        error: Option<String>,
    ) {
        self.update_stream(name, rt, |s| {
            s.state = state;
            if error.is_some() {
                s.last_error = error;
            }
            match state {
                StreamState::Watching if s.synced_once => {
                    s.stale_since = None;
                    s.current_at = Some(Instant::now());
                }
                StreamState::Failed | StreamState::Forbidden | StreamState::NotFound => {
                    s.stale_since.get_or_insert_with(SystemTime::now);
                }
                _ => {}
            }
        });
    }

    /// Records that a stream completed a list at `rv`.
    pub fn stream_listed(&self, name: &ClusterName, rt: &ResourceType, rv: &str) {
        self.update_stream(name, rt, |s| {
            s.synced_once = true;
            s.restored = false;
            s.state = StreamState::Watching;
            s.resource_version = rv.to_string();
            s.last_error = None;
            s.stale_since = None;
            s.current_at = Some(Instant::now());
            s.last_event = Some(SystemTime::now());
        });
    }

    /// Records progress (an event or a bookmark) at `rv`. A restored stream that makes
    /// progress has caught up.
    pub fn stream_progress(&self, name: &ClusterName, rt: &ResourceType, rv: &str, event: bool) {
        let mut table = self.write();
        let Some(c) = table.get_mut(name) else { return };
        let Some((_, s)) = c.streams.get_mut(&rt.name()) else {
            return;
        };
        s.resource_version = rv.to_string();
        s.current_at = Some(Instant::now());
        if event {
            s.last_event = Some(SystemTime::now());
        }
        if s.restored {
            drop(table);
            self.confirm_restored(name, rt);
        }
    }

    /// Registers a stream loaded from the store at `rv`: restored until its watch confirms it.
    pub fn stream_restored(&self, name: &ClusterName, rt: &ResourceType, rv: &str) {
        self.update_stream(name, rt, |s| {
            s.synced_once = true;
            s.restored = true;
            s.resource_version = rv.to_string();
        });
    }

    /// A stream's watch resumed from the store was accepted and stayed quiet: what was
    /// restored for it is current, and it is watching (told beside the ingest, whose
    /// own report of the watch may still be on its way).
    pub fn watch_resumed(&self, name: &ClusterName, rt: &ResourceType) {
        self.update_stream(name, rt, |s| {
            if s.restored {
                s.state = StreamState::Watching;
            }
        });
        self.confirm_restored(name, rt);
    }

    /// Ends a stream's restored state: its resumed watch is current.
    pub fn confirm_restored(&self, name: &ClusterName, rt: &ResourceType) {
        self.update_stream(name, rt, |s| {
            if s.restored && s.state == StreamState::Watching {
                s.restored = false;
                s.stale_since = None;
                s.current_at = Some(Instant::now());
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_is_shared_until_what_is_collected_changes() {
        let table = StatusTable::default();
        let (a, b) = (ClusterName::from("a"), ClusterName::from("b"));
        let pods = ResourceType::new("", "v1", "pods", "Pod", true);
        let deploys = ResourceType::new("apps", "v1", "deployments", "Deployment", true);
        table.add_cluster(&a, "test", BTreeMap::new());
        table.add_cluster(&b, "test", BTreeMap::new());
        table.stream_state(&a, &pods, StreamState::Listing, None);
        let first = table.catalogue();
        assert_eq!(
            first.resolve("pod").map(ResourceType::name).as_deref(),
            Some("pods")
        );
        // Progress on a stream shares the catalogue.
        table.stream_listed(&a, &pods, "7");
        table.stream_state(&b, &pods, StreamState::Listing, None);
        assert!(
            !Arc::ptr_eq(&first, &table.catalogue()),
            "b's stream is new"
        );
        let second = table.catalogue();
        table.stream_progress(&b, &pods, "8", true);
        assert!(Arc::ptr_eq(&second, &table.catalogue()));
        // A cluster's discovery names a type's short names; a new type joins.
        table.update(&b, |c| {
            c.served = Arc::new(vec![fleetscope_informer::discovery::Served {
                short_names: vec!["deploy".into()],
                ..fleetscope_informer::discovery::Served::of(deploys.clone(), true)
            }]);
        });
        table.stream_state(&b, &deploys, StreamState::Listing, None);
        let third = table.catalogue();
        assert_eq!(third.resolve("deploy"), Some(&deploys));
        table.remove_stream(&b, &deploys.name());
        assert_eq!(table.catalogue().resolve("deploy"), None);
    }

    #[test]
    fn reading_the_catalogue_while_what_is_collected_changes_never_deadlocks() {
        let table = Arc::new(StatusTable::default());
        let a = ClusterName::from("a");
        table.add_cluster(&a, "test", BTreeMap::new());
        let (done_tx, done) = std::sync::mpsc::channel();
        let writer = {
            let (table, a, done_tx) = (table.clone(), a.clone(), done_tx.clone());
            std::thread::spawn(move || {
                for i in 0..200_000 {
                    let pods = ResourceType::new("", "v1", &format!("p{}", i % 7), "P", true);
                    table.stream_state(&a, &pods, StreamState::Listing, None);
                    // A changed shape drops the cache while the table is held.
                    table.update(&a, |c| c.served = Arc::default());
                }
                let _ = done_tx.send(());
            })
        };
        let reader = {
            let table = table.clone();
            std::thread::spawn(move || {
                for _ in 0..200_000 {
                    let _ = table.catalogue();
                }
                let _ = done_tx.send(());
            })
        };
        for _ in 0..2 {
            done.recv_timeout(std::time::Duration::from_secs(60))
                .expect("the catalogue and the table's writers wait on each other");
        }
        writer.join().unwrap();
        reader.join().unwrap();
    }

    #[test]
    fn a_change_tells_each_type_as_it_stood_then_even_once_it_is_current_again() {
        let table = StatusTable::default();
        let a = ClusterName::from("a");
        let pods = ResourceType::new("", "v1", "pods", "Pod", true);
        let cms = ResourceType::new("", "v1", "configmaps", "ConfigMap", true);
        table.add_cluster(&a, "test", BTreeMap::new());
        table.update(&a, |c| c.discovered = true);
        for rt in [&pods, &cms] {
            table.stream_state(&a, rt, StreamState::Listing, None);
            table.stream_listed(&a, rt, "5");
            table.stream_state(&a, rt, StreamState::Watching, None);
        }
        let mut changes = table.subscribe();
        // configmaps list again (their selection changed) and are current again before
        // anyone reads the changes.
        table.stream_state(&a, &cms, StreamState::Listing, None);
        table.stream_listed(&a, &cms, "9");
        table.stream_state(&a, &cms, StreamState::Watching, None);
        let mut told = Vec::new();
        while let Ok(c) = changes.try_recv() {
            let types = c.by_type.expect("a stream's change carries every type's");
            assert_eq!(types["pods"].freshness, Freshness::Synced, "{types:?}");
            told.push(types["configmaps"].freshness);
        }
        assert_eq!(told.first(), Some(&Freshness::Stale), "{told:?}");
        assert_eq!(told.last(), Some(&Freshness::Synced), "{told:?}");
    }

    #[test]
    fn a_resumed_watch_told_quiet_makes_its_stream_current_before_the_ingest_reports_it() {
        let table = StatusTable::default();
        let pods = ResourceType::new("", "v1", "pods", "Pod", true);
        let c = ClusterName::from("c");
        table.add_cluster(&c, "test", BTreeMap::new());
        table.stream_restored(&c, &pods, "7");
        // Neither its Watching state nor any event has come through the ingest yet.
        table.watch_resumed(&c, &pods);
        let (freshness, _, _) = table.cluster(&c).unwrap().freshness(Some("pods"));
        assert_eq!(freshness, Freshness::Synced);
        // The ingest's report of the watch, arriving after, changes nothing; a later
        // 410 (a list) is the stream's own state again.
        table.stream_state(&c, &pods, StreamState::Watching, None);
        assert_eq!(
            table.cluster(&c).unwrap().freshness(Some("pods")).0,
            Freshness::Synced
        );
        table.stream_state(&c, &pods, StreamState::Listing, None);
        assert_ne!(
            table.cluster(&c).unwrap().freshness(Some("pods")).0,
            Freshness::Synced
        );
        // A stream not restored is not touched.
        let other = ClusterName::from("other");
        table.add_cluster(&other, "test", BTreeMap::new());
        table.stream_state(&other, &pods, StreamState::Listing, None);
        table.watch_resumed(&other, &pods);
        assert_ne!(
            table.cluster(&other).unwrap().freshness(Some("pods")).0,
            Freshness::Synced
        );
    }

    #[test]
    fn a_restored_cluster_whose_watches_resumed_before_its_discovery_reads_as_restored() {
        let table = StatusTable::default();
        let pods = ResourceType::new("", "v1", "pods", "Pod", true);
        let (restored, listed) = (ClusterName::from("restored"), ClusterName::from("listed"));
        for name in [&restored, &listed] {
            table.add_cluster(name, "test", BTreeMap::new());
        }
        table.stream_restored(&restored, &pods, "7");
        assert_eq!(
            table.cluster(&restored).unwrap().freshness(None).0,
            Freshness::Restored
        );
        // Its watch resumes and is confirmed before discovery has answered.
        table.update_stream(&restored, &pods, |s| {
            s.sync_method = Some(fleetscope_model::fleet::SyncMethod::Resumed);
        });
        table.stream_state(&restored, &pods, StreamState::Watching, None);
        table.confirm_restored(&restored, &pods);
        let c = table.cluster(&restored).unwrap();
        assert_eq!(c.freshness(Some("pods")).0, Freshness::Synced);
        assert_eq!(
            c.freshness(None).0,
            Freshness::Restored,
            "not back to syncing"
        );
        // A cluster that listed is syncing until discovery has said what else it serves.
        table.stream_state(&listed, &pods, StreamState::Listing, None);
        table.stream_listed(&listed, &pods, "9");
        let (f, _, why) = table.cluster(&listed).unwrap().freshness(None);
        assert_eq!(
            (f, why.as_str()),
            (
                Freshness::Syncing,
                "discovering the cluster's resource types"
            )
        );
        for name in [&restored, &listed] {
            table.update(name, |c| c.discovered = true);
            assert_eq!(
                table.cluster(name).unwrap().freshness(None).0,
                Freshness::Synced
            );
        }
    }

    #[test]
    fn a_stream_failing_before_its_first_sync_reads_as_an_error_with_its_error() {
        let table = StatusTable::default();
        let name = ClusterName::from("a");
        let pods = ResourceType::new("", "v1", "pods", "Pod", true);
        table.add_cluster(&name, "test", BTreeMap::new());
        table.stream_state(&name, &pods, StreamState::Listing, None);
        let c = table.cluster(&name).unwrap();
        assert_eq!(c.freshness(None).0, Freshness::Syncing);
        // The list fails (a body that is not JSON), and is tried again.
        let why = "list failed: expected value at line 1 column 1".to_string();
        table.stream_state(&name, &pods, StreamState::Failed, Some(why.clone()));
        table.stream_state(&name, &pods, StreamState::Listing, None);
        let (freshness, _, message) = table.cluster(&name).unwrap().freshness(None);
        assert_eq!((freshness, message), (Freshness::Error, why));
        // Listed at last: synced, the error gone.
        table.stream_listed(&name, &pods, "7");
        let c = table.cluster(&name).unwrap();
        let (freshness, _, message) = c.freshness(Some(&pods.name()));
        assert_eq!((freshness, message.as_str()), (Freshness::Synced, ""));
    }
}
