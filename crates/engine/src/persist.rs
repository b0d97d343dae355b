//! Persistence and publication. The ingest stages each batch in the index and records
//! it here; nothing of it is visible yet. A writer task commits what has gathered as
//! one atomic store batch (group commit: the next write starts as soon as the previous
//! one ends, holding everything staged meanwhile): the events (the change log) and the
//! streams' resourceVersions together, so a stream's resourceVersion on disk never runs
//! ahead of the objects the store rebuilds. Only once a write is durable are its
//! batches published (to readers, subscribers and the status table), so no revision is
//! ever seen that a crash could give to another change. When the change log grows past a share of
//! the objects' size, the index's state at that revision is written as a new snapshot
//! and the log before it is trimmed to what resuming watches needs, so the store's size
//! follows the objects held, not the changes seen. A failing store (a full disk) is
//! logged and retried; what is already durable keeps being served, and nothing
//! gathered is lost (a backlog past the log's bounds is replaced by a snapshot).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleetscope_index::{Event, Index, Object, Staged, State};
use fleetscope_model::{ClusterName, EventType, ResourceType, Revision};
use fleetscope_store::{Batch, EventRun, SnapshotMeta, Store, StoredEvent, StreamRecord};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::progress::ProgressLog;
use crate::status::StatusTable;

/// A snapshot written beside the batches and not yet current, with how long writing
/// it took.
type ReadySnapshot = (SnapshotMeta, Duration);

/// A write that failed: why, and the snapshot it was to make current (offered again
/// with the next write).
type WriteFailed = (String, Option<ReadySnapshot>);

/// Persistence settings.
#[derive(Debug, Clone)]
pub struct PersistConfig {
    /// Gathered changes past which the ingest waits for the store (× 4). Default 20,000.
    pub max_changes: usize,
    /// Gathered JSON bytes past which the ingest waits for the store, and past which a
    /// failing store's backlog is replaced by a snapshot. Default 256 MiB.
    pub max_pending_bytes: usize,
    /// Events kept on disk for resuming watches across restarts (the in-memory log's length).
    pub log_retention: usize,
    /// The resume log's size limit, as a share of the held objects' JSON. Default 0.5.
    pub log_share: f64,
    /// A new snapshot is written once the change log after the last one exceeds this
    /// share of the held objects' JSON and `snapshot_min_bytes` (not counting the log
    /// of a store filling from empty: see [`FILLED_SHARE`]). Default 0.5.
    pub snapshot_share: f64,
    /// The change log's size below which no snapshot is written. Default 1 MiB.
    pub snapshot_min_bytes: usize,
    /// The change log a restart should find at most: past it, a snapshot is due as
    /// soon as `snapshot_cpu_share` allows, or once changes stop for a second.
    /// Default 64 MiB.
    pub snapshot_log_bytes: usize,
    /// The share of one core that snapshots written for `snapshot_log_bytes` may take
    /// while running: after one that took `d`, the next waits `d` ÷ this share.
    /// Default 0.1.
    pub snapshot_cpu_share: f64,
    /// The store is compacted (its live records copied to a fresh file) once its
    /// size on disk passes this share of the held objects' JSON, `compact_min_bytes`,
    /// and 1.5 × its size after the last compaction. A store that starts empty is not
    /// compacted while it fills (see [`FILLED_SHARE`]); its size once filled counts
    /// as its size after a compaction. Default 1.
    pub compact_share: f64,
    /// The size on disk below which the store is never compacted. Default 4 MiB.
    pub compact_min_bytes: u64,
}

impl Default for PersistConfig {
    fn default() -> Self {
        Self {
            max_changes: 20_000,
            max_pending_bytes: 256 << 20,
            log_retention: 100_000,
            log_share: 0.5,
            snapshot_share: 0.5,
            snapshot_min_bytes: 1 << 20,
            snapshot_log_bytes: 64 << 20,
            snapshot_cpu_share: 0.1,
            compact_share: 1.0,
            compact_min_bytes: 4 << 20,
        }
    }
}

/// While a store that started empty has recorded no more than this share of the JSON
/// it holds, it is filling: each object was written about once, so its change log is
/// as good as a snapshot, and a compaction would reclaim only the storage engine's own
/// slack from the writes (a first sync of 5,100 pods left 11.0–13.6 MB, which a copy
/// made 8.4–11.0 MB). Written then, while the fleet syncs, a snapshot left about 4 MB
/// and a copy 6–12 MB more memory resident after a first sync (docs/notes/performance-log.md).
/// Once filled, the log written while filling counts as a snapshot until the next
/// one, and the store's size as its size after a compaction. A store also counts as
/// filled once it holds [`FILL_MAX_JSON`].
pub const FILLED_SHARE: f64 = 1.25;

/// The held JSON past which a store filling from empty is compacted and snapshotted
/// as any other: the memory a copy leaves is then a small share of the process's,
/// while the disk it saves is not (a cold start of a million pods, 740 MB of JSON,
/// left 0.92–1.06 × the JSON on disk uncompacted, against 0.65–0.84 compacted).
pub const FILL_MAX_JSON: f64 = 128.0 * 1024.0 * 1024.0;

/// Where a store that started empty is in filling (see [`FILLED_SHARE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// It did not start empty.
    Never,
    /// It is filling, and has recorded `recorded` bytes of JSON since the start: its
    /// change log counts as a snapshot, and it is not compacted.
    Filling { recorded: usize },
    /// It was found filled when `snapshot` was current and its change log held `log`
    /// bytes, which count as a snapshot while that one stays current; `size_due` until
    /// the next compaction check takes its size as its size after a compaction.
    Filled {
        snapshot: u64,
        log: usize,
        size_due: bool,
    },
}

/// A store write that failed; what it held is kept in memory and written again.
#[derive(Debug, Clone, thiserror::Error)]
#[error("store write failed: {0}")]
pub struct FlushError(pub String);

/// Figures about the store, for operators.
pub type PersistStats = fleetscope_model::fleet::StoreStats;

/// What has gathered since the last write.
#[derive(Default)]
struct Pending {
    events: VecDeque<Arc<Event>>,
    /// Latest resume point per stream; `None` for a stream that is gone.
    streams: HashMap<(ClusterName, String), Option<StreamRecord>>,
    clusters: Option<Vec<ClusterName>>,
    field_indexes: Option<Vec<String>>,
    /// Clusters' latest discovery answers; `None` for a cluster that left.
    discovery: HashMap<ClusterName, Option<fleetscope_store::DiscoveryRecord>>,
    /// The index's state to write as the next snapshot, captured at a recorded revision.
    snapshot: Option<Arc<State>>,
    /// The snapshot must be written with this batch, not beside it: gathered events
    /// were dropped for it, or the store has none yet to follow.
    snapshot_inline: bool,
    revision: Revision,
    /// Bytes of the gathered events.
    bytes: usize,
    /// The newest staged state, published with the events once they are durable.
    state: Option<Arc<State>>,
    /// Stream progress, applied to the status table once durable.
    after: ProgressLog,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.streams.is_empty()
            && self.clusters.is_none()
            && self.field_indexes.is_none()
            && self.discovery.is_empty()
            && self.snapshot.is_none()
            && self.state.is_none()
            && self.after.is_empty()
    }

    fn changes(&self) -> usize {
        self.events.len() + self.streams.len()
    }

    /// Puts back a batch that failed to write, under what gathered since (newer wins).
    fn restore_under(&mut self, mut older: Pending) {
        older.events.extend(self.events.drain(..));
        older.bytes += self.bytes;
        for (k, v) in self.streams.drain() {
            older.streams.insert(k, v);
        }
        if self.clusters.is_some() {
            older.clusters = self.clusters.take();
        }
        if self.field_indexes.is_some() {
            older.field_indexes = self.field_indexes.take();
        }
        for (k, v) in self.discovery.drain() {
            older.discovery.insert(k, v);
        }
        if self.snapshot.is_some() {
            older.snapshot = self.snapshot.take();
        }
        older.snapshot_inline |= self.snapshot_inline;
        if self.state.is_some() {
            older.state = self.state.take();
        }
        older.after.append(std::mem::take(&mut self.after));
        older.revision = older.revision.max(self.revision);
        *self = older;
    }
}

/// The persisted log's records (first and last revision, bytes; oldest first), and the snapshot.
#[derive(Default, Clone)]
struct OnDisk {
    records: VecDeque<(u64, u64, usize)>,
    events: usize,
    bytes: usize,
    snapshot: Option<SnapshotMeta>,
    /// Bytes of the records after the snapshot: the change log a load replays.
    change_log: usize,
}

impl OnDisk {
    fn snapshot_revision(&self) -> u64 {
        self.snapshot.map_or(0, |s| s.revision.0)
    }

    fn push(&mut self, first: u64, last: u64, bytes: usize) {
        self.records.push_back((first, last, bytes));
        self.events += (last - first + 1) as usize;
        self.bytes += bytes;
    }
}

/// The write-behind persister.
pub struct Persister {
    /// Released by `close`, so the data directory's lock goes with it.
    store: Mutex<Option<Arc<dyn Store>>>,
    config: PersistConfig,
    pending: Mutex<Pending>,
    wake: Notify,
    /// Held objects' JSON bytes, for the logs' size limits.
    held_json: Mutex<i64>,
    disk: Mutex<OnDisk>,
    stats: Mutex<PersistStats>,
    /// Snapshots being written now (0 or 1), and compactions under way (0 or 1).
    in_progress: [AtomicU64; 2],
    /// Serialises writes: the writer task and the final flush.
    writing: tokio::sync::Mutex<()>,
    /// Signalled after each write, for an ingest waiting on a full backlog.
    written: Notify,
    /// The store's size on disk after its last compaction (0 before the first), or
    /// once filled, for a store that started empty.
    compacted: AtomicU64,
    /// Where a store that started empty is in filling (see [`FILLED_SHARE`]).
    fill: Mutex<Fill>,
    /// Where durable batches are published.
    index: Arc<Index>,
    status: StatusTable,
    /// A snapshot being written beside the batches, and one written and waiting to
    /// be made current by the next batch (with how long its writing took).
    snapshotting: Mutex<Option<tokio::task::JoinHandle<()>>>,
    snapshot_ready: Mutex<Option<ReadySnapshot>>,
    /// A compaction (or the size check before one) running beside the writes.
    compacting: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Bytes of change log that the snapshot being written (or written and not yet
    /// current) covers: not counted towards the next one.
    covered: std::sync::atomic::AtomicUsize,
    /// The last snapshot made current: when, and how long writing it took.
    last_snapshot: Mutex<Option<LastSnapshot>>,
    /// When the last change was recorded (tokio's clock).
    last_change: Mutex<Option<tokio::time::Instant>>,
}

/// A snapshot made current, for spacing the next (see
/// [`PersistConfig::snapshot_cpu_share`]).
#[derive(Debug, Clone, Copy)]
struct LastSnapshot {
    /// On tokio's clock, as the writer's wait for the next one is.
    current_at: tokio::time::Instant,
    took: Duration,
    /// Writing it failed: the next waits out the spacing even once changes stop.
    failed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An index event as the log writes it: a modification keeps its previous state (a
/// filter needs it to see the transition), other events only their object.
struct Logged<'e>(&'e Arc<Event>);

impl StoredEvent for Logged<'_> {
    type Object = Object;
    fn revision(&self) -> Revision {
        self.0.revision
    }
    fn kind(&self) -> EventType {
        self.0.kind
    }
    fn object(&self) -> &Object {
        &self.0.object
    }
    fn prev(&self) -> Option<&Object> {
        match self.0.kind {
            EventType::Modified => self.0.prev.as_deref(),
            _ => None,
        }
    }
}

impl Persister {
    /// A persister over `store`, continuing what it holds, publishing what it makes
    /// durable to `index` and `status`.
    pub fn new(
        store: Arc<dyn Store>,
        config: PersistConfig,
        from: Continued,
        index: Arc<Index>,
        status: StatusTable,
    ) -> Self {
        let empty = from.held_json == 0 && from.records.is_empty();
        let mut disk = OnDisk {
            snapshot: from.snapshot,
            change_log: from.change_log,
            ..OnDisk::default()
        };
        for (first, last, bytes) in from.records {
            disk.push(first, last, bytes);
        }
        Self {
            store: Mutex::new(Some(store.clone())),
            config,
            pending: Mutex::new(Pending {
                revision: from.revision,
                ..Pending::default()
            }),
            wake: Notify::new(),
            held_json: Mutex::new(from.held_json as i64),
            disk: Mutex::new(disk),
            stats: Mutex::new(PersistStats {
                size_on_disk: store.size_on_disk(),
                ..PersistStats::default()
            }),
            in_progress: [AtomicU64::new(0), AtomicU64::new(0)],
            writing: tokio::sync::Mutex::new(()),
            written: Notify::new(),
            compacted: AtomicU64::new(0),
            fill: Mutex::new(if empty {
                Fill::Filling { recorded: 0 }
            } else {
                Fill::Never
            }),
            index,
            status,
            snapshotting: Mutex::new(None),
            snapshot_ready: Mutex::new(None),
            compacting: Mutex::new(None),
            covered: std::sync::atomic::AtomicUsize::new(0),
            last_snapshot: Mutex::new(None),
            last_change: Mutex::new(None),
        }
    }

    /// Records one staged batch (staged after every batch recorded before it): its
    /// events, the streams' new resume points, and the stream progress to report once
    /// it is durable. Nothing of it is visible until then.
    pub fn record(
        &self,
        staged: Staged,
        streams: impl IntoIterator<Item = (ClusterName, ResourceType, Option<(String, Arc<str>)>)>,
        after: ProgressLog,
    ) {
        let mut held = 0i64;
        let mut added = 0usize;
        if !staged.events.is_empty() {
            *lock(&self.last_change) = Some(tokio::time::Instant::now());
        }
        let mut p = lock(&self.pending);
        for e in &staged.events {
            match e.kind {
                EventType::Deleted => held -= e.object.json_len() as i64,
                _ => {
                    held += e.object.json_len() as i64
                        - e.prev.as_ref().map_or(0, |p| p.json_len() as i64);
                }
            }
            added += e.json_bytes();
            p.revision = p.revision.max(e.revision);
        }
        p.events.extend(staged.events);
        if staged.state.is_some() {
            p.state = staged.state;
        }
        p.after.append(after);
        for (cluster, resource, rv) in streams {
            let key = (cluster.clone(), resource.name());
            let record = rv.map(|(resource_version, selection)| StreamRecord {
                cluster,
                resource,
                resource_version,
                selection: selection.to_string(),
            });
            p.streams.insert(key, record);
        }
        let held_json = {
            let mut h = lock(&self.held_json);
            *h += held;
            (*h).max(0) as f64
        };
        // A snapshot is due when the change log (on disk and gathered) outgrows its
        // share of the objects, or when a backlog the store cannot take grows past the
        // retained log: the snapshot then stands in for the changes.
        p.bytes += added;
        let change_log = self.change_log(p.bytes, added, held_json);
        let over_log =
            p.events.len() > self.config.log_retention || p.bytes > self.config.max_pending_bytes;
        let due = change_log as f64
            > (held_json * self.config.snapshot_share).max(self.config.snapshot_min_bytes as f64)
            || over_log
            || (change_log > self.config.snapshot_log_bytes && self.snapshot_spaced());
        if due
            && p.snapshot
                .as_ref()
                .is_none_or(|s| s.revision() < p.revision)
            && let Some(state) = p.state.clone()
            && state.revision() == p.revision
        {
            p.snapshot = Some(state);
            // The oldest gathered events are then not needed to rebuild the objects;
            // past the log's bounds they are dropped unwritten (and so unpublished: a
            // gap that subscribers behind it learn of).
            while p.events.len() > self.config.log_retention
                || (p.bytes > self.config.max_pending_bytes && p.events.len() > 1)
            {
                match p.events.pop_front() {
                    Some(e) => {
                        p.bytes -= e.json_bytes();
                        // The log on disk then continues only after the snapshot.
                        p.snapshot_inline = true;
                    }
                    None => break,
                }
            }
        }
        drop(p);
        self.wake.notify_one();
    }

    /// Waits while the backlog is over `max_changes` × 4 (or `max_pending_bytes`) and
    /// the store is writing, so an ingest far ahead of the disk slows to its pace (and
    /// batches stay bounded). A failing store does not hold the ingest: its backlog is
    /// bounded by snapshots.
    pub async fn backpressure(&self) {
        loop {
            let notified = self.written.notified();
            let over = {
                let p = lock(&self.pending);
                p.changes() > self.config.max_changes * 4 || p.bytes > self.config.max_pending_bytes
            };
            if !over || lock(&self.stats).last_error.is_some() {
                return;
            }
            self.wake.notify_one();
            notified.await;
        }
    }

    /// Writes `state` (the index's published state) as the store's snapshot with the
    /// next write. A store that starts empty above revision 0 is given its starting
    /// point this way: the events after it then follow a snapshot, as a load expects.
    pub fn write_snapshot_of(&self, state: Arc<State>) {
        let mut p = lock(&self.pending);
        p.snapshot = Some(state);
        p.snapshot_inline = true;
        drop(p);
        self.wake.notify_one();
    }

    /// The newest revision recorded (staged), durable or not.
    pub fn recorded(&self) -> Revision {
        lock(&self.pending).revision
    }

    /// Records what a cluster's discovery answered (`None`: forget it, the cluster
    /// left), written with the next batch.
    pub fn record_discovery(
        &self,
        cluster: ClusterName,
        record: Option<fleetscope_store::DiscoveryRecord>,
    ) {
        lock(&self.pending).discovery.insert(cluster, record);
        self.wake.notify_one();
    }

    /// Records the configured clusters and field-index paths.
    pub fn record_config(&self, clusters: Vec<ClusterName>, field_indexes: Vec<String>) {
        let mut p = lock(&self.pending);
        p.clusters = Some(clusters);
        p.field_indexes = Some(field_indexes);
    }

    /// Bytes of the change log on disk after the current snapshot: what a restart
    /// now would replay.
    pub fn change_log_bytes(&self) -> usize {
        lock(&self.disk).change_log
    }

    /// The current figures.
    pub fn stats(&self) -> PersistStats {
        let mut s = lock(&self.stats).clone();
        s.pending = lock(&self.pending).changes();
        s.logged_events = lock(&self.disk).events;
        (s.snapshot_in_progress, s.compaction_in_progress) = self.under_way_now();
        s
    }

    /// Writes what gathers, one write after another, until cancelled: a write starts
    /// as soon as the previous one ends, with everything staged meanwhile.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut last_report = Instant::now();
        loop {
            if lock(&self.pending).is_empty() && lock(&self.snapshot_ready).is_none() {
                // A change log past `snapshot_log_bytes` is snapshotted once the spacing
                // allows, even if no change comes to find it due.
                let log_snapshot = self.log_snapshot_at();
                // Not while a restore is still making the index: it has the cores.
                let spaced = async {
                    match log_snapshot {
                        Some(at) => {
                            self.index.history_restored().await;
                            tokio::time::sleep_until(at).await;
                        }
                        None => std::future::pending().await,
                    }
                };
                // `record` (and a finished snapshot) leaves a permit when nobody
                // waits: no wake-up is lost.
                tokio::select! {
                    _ = self.wake.notified() => {}
                    () = spaced => {
                        if !self.capture_log_snapshot() {
                            // Nothing to capture now: the next record or snapshot says
                            // when to look again.
                            tokio::select! {
                                _ = self.wake.notified() => {}
                                _ = cancel.cancelled() => break,
                            }
                        }
                    }
                    _ = cancel.cancelled() => break,
                }
            }
            if self.flush().await.is_err() {
                // Logged by flush; wait before retrying so a full disk is not hammered.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = cancel.cancelled() => break,
                }
            }
            // At debug level: a line of its own every minute would repeat in an idle
            // server's log; GetStore and the metrics carry the same figures.
            if last_report.elapsed() >= Duration::from_secs(60) {
                last_report = Instant::now();
                let s = self.stats();
                tracing::debug!(
                    size_on_disk = s.size_on_disk,
                    last_flush_ms = s.last_flush.as_secs_f64() * 1e3,
                    max_flush_ms = s.max_flush.as_secs_f64() * 1e3,
                    pending = s.pending,
                    logged_events = s.logged_events,
                    snapshots = s.snapshots,
                    "store"
                );
            }
        }
    }

    /// Writes what has gathered, then lets the store go (closing it once nothing else holds it).
    pub async fn close(self: &Arc<Self>) -> Result<(), FlushError> {
        let mut flushed = self.flush().await;
        // A snapshot being written holds the store: it finishes, and is made current.
        let writing = lock(&self.snapshotting).take();
        if let Some(task) = writing {
            let _ = task.await;
            flushed = flushed.and(self.flush().await);
        }
        let compacting = lock(&self.compacting).take();
        if let Some(task) = compacting {
            let _ = task.await;
        }
        let store = lock(&self.store).take();
        if let Some(store) = store {
            // The next start then reads the store's layout, not its log.
            let recorded = tokio::task::spawn_blocking(move || store.checkpoint()).await;
            match recorded {
                Ok(Ok(Some(took))) => {
                    tracing::debug!(?took, "store layout recorded for the next start")
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "recording the store's layout at stop failed: the next start reads its log")
                }
                Err(e) => tracing::warn!(error = %e, "recording the store's layout at stop failed"),
            }
        }
        flushed
    }

    /// Writes everything gathered so far.
    pub async fn flush(self: &Arc<Self>) -> Result<(), FlushError> {
        let _writing = self.writing.lock().await;
        let mut taken = {
            let mut p = lock(&self.pending);
            if p.is_empty() && lock(&self.snapshot_ready).is_none() {
                return Ok(());
            }
            let revision = p.revision;
            std::mem::replace(
                &mut *p,
                Pending {
                    revision,
                    ..Pending::default()
                },
            )
        };
        // A snapshot that can follow the log is written beside the batches, so that a
        // batch's publication never waits for one; the next batch makes it current.
        if taken.snapshot.is_some() && !taken.snapshot_inline {
            let (has_snapshot, change_log) = {
                let disk = lock(&self.disk);
                (disk.snapshot.is_some(), disk.change_log)
            };
            if has_snapshot {
                if let Some(state) = taken.snapshot.take() {
                    self.start_snapshot(state, change_log + taken.bytes);
                }
            } else {
                taken.snapshot_inline = true;
            }
        }
        let ready = lock(&self.snapshot_ready).take();
        let this = self.clone();
        let started = Instant::now();
        let (taken, result) = tokio::task::spawn_blocking(move || {
            let result = this.write(&taken, ready);
            (taken, result)
        })
        .await
        .unwrap_or_else(|e| {
            (
                Pending::default(),
                Err((format!("store writer failed: {e}"), None)),
            )
        });
        let took = started.elapsed();
        let outcome = match result {
            Ok((disk, events, snapshot_took)) => {
                // Durable: now, and only now, visible.
                self.publish(taken);
                self.written_whole(disk, events, snapshot_took, took);
                Ok(())
            }
            Err((e, ready)) => {
                if ready.is_some() {
                    *lock(&self.snapshot_ready) = ready;
                }
                self.write_failed(&e);
                lock(&self.pending).restore_under(taken);
                Err(FlushError(e))
            }
        };
        self.written.notify_waiters();
        if outcome.is_ok() {
            self.start_compaction();
        }
        outcome
    }

    /// Records a durable write that took `took`: where the store now stands on disk,
    /// and the figures (a failure before it is over).
    fn written_whole(
        &self,
        disk: OnDisk,
        events: u64,
        snapshot_took: Option<Duration>,
        took: Duration,
    ) {
        if let Some(took) = snapshot_took {
            // The new snapshot is current: the change log is counted after it.
            self.covered.store(0, Ordering::Relaxed);
            *lock(&self.last_snapshot) = Some(LastSnapshot {
                current_at: tokio::time::Instant::now(),
                took,
                failed: false,
            });
        }
        *lock(&self.disk) = disk;
        let mut s = lock(&self.stats);
        if s.last_error.take().is_some() {
            let since = s.failing_since.take();
            let failed_for = since.and_then(|t| t.elapsed().ok()).unwrap_or_default();
            tracing::info!(failed_for = ?failed_for, "store writes succeed again: answers are current again");
            self.status.set_store_stall(None);
        }
        s.flushes += 1;
        s.events_written += events;
        if let Some(t) = snapshot_took {
            s.snapshots += 1;
            s.last_snapshot = t;
        }
        s.last_flush = took;
        s.max_flush = s.max_flush.max(took);
        s.write_seconds.observe(took);
    }

    /// Records a failed write: logged once per error, and every cluster told the
    /// store stalls (answers are not current until a write succeeds).
    fn write_failed(&self, e: &str) {
        let mut s = lock(&self.stats);
        if s.last_error.as_deref() != Some(e) {
            tracing::error!(error = %e, "store write failed: changes are kept in memory and retried; answers are not current until a write succeeds");
        }
        s.last_error = Some(e.to_string());
        s.write_errors += 1;
        let since = *s
            .failing_since
            .get_or_insert_with(std::time::SystemTime::now);
        self.status.set_store_stall(Some(crate::status::StoreStall {
            error: e.to_string(),
            since,
        }));
    }

    /// Makes a durable batch visible: the index's state and events, then the streams'
    /// progress (so a stream never reads as synced before its objects are served).
    fn publish(&self, written: Pending) {
        let Pending {
            events,
            state,
            after,
            ..
        } = written;
        self.index.publish(Staged {
            state,
            events: events.into(),
        });
        after.apply(&self.status);
    }

    /// The change log a snapshot would cover, with `gathered` bytes not yet written
    /// (`added` of them just recorded): on disk and gathered, less what a snapshot
    /// being written already covers and what counts as one (see [`Self::fill_log`]).
    fn change_log(&self, gathered: usize, added: usize, held_json: f64) -> usize {
        let (on_disk, snapshot) = {
            let disk = lock(&self.disk);
            (disk.change_log, disk.snapshot_revision())
        };
        let change_log = (on_disk + gathered).saturating_sub(self.covered.load(Ordering::Relaxed));
        change_log.saturating_sub(self.fill_log(change_log, added, held_json, snapshot))
    }

    /// What of `change_log` counts as a snapshot, with `added` bytes of JSON just
    /// recorded: all of it while a store that started empty fills (the JSON recorded
    /// since the start at most [`FILLED_SHARE`] × `held`, and `held` at most
    /// [`FILL_MAX_JSON`]); the log written while it filled, until a snapshot follows
    /// (`snapshot` is the current one's revision); nothing otherwise.
    fn fill_log(&self, change_log: usize, added: usize, held: f64, snapshot: u64) -> usize {
        let mut fill = lock(&self.fill);
        if let Fill::Filling { recorded } = &mut *fill {
            *recorded += added;
            if *recorded as f64 <= FILLED_SHARE * held && held <= FILL_MAX_JSON {
                return change_log;
            }
            *fill = Fill::Filled {
                snapshot,
                log: change_log,
                size_due: true,
            };
            tracing::debug!(
                change_log,
                "store filled: its log counts as a snapshot, its size as compacted"
            );
        }
        match *fill {
            Fill::Filled {
                snapshot: current,
                log,
                ..
            } if current == snapshot => log.min(change_log),
            _ => 0,
        }
    }

    /// Writes one gathered batch (and a snapshot, when one was captured); returns the
    /// store's new extent, the events written and how long a snapshot took.
    fn write(
        &self,
        p: &Pending,
        ready: Option<ReadySnapshot>,
    ) -> Result<(OnDisk, u64, Option<Duration>), WriteFailed> {
        let Some(store) = lock(&self.store).clone() else {
            return Err(("the store is closed".to_string(), ready));
        };
        let mut disk = lock(&self.disk).clone();
        let mut batch = batch_of(p);
        let mut snapshot_took = None;
        if let Some(state) = p.snapshot.as_ref().filter(|_| p.snapshot_inline) {
            let written = self.snapshot_now(&*store, state);
            let (meta, took) = written.map_err(|e| (e.to_string(), ready))?;
            batch.snapshot = Some((meta, disk.snapshot));
            disk.snapshot = Some(meta);
            snapshot_took = Some(took);
        } else if let Some((meta, took)) = ready {
            // Written beside earlier batches: current from this one on, unless a newer
            // one already is (its chunks are then removed).
            if meta.revision.0 > disk.snapshot_revision() {
                batch.snapshot = Some((meta, disk.snapshot));
                disk.snapshot = Some(meta);
                snapshot_took = Some(took);
            } else {
                batch.discard_snapshots.push(meta);
                self.covered.store(0, Ordering::Relaxed);
            }
        }
        let written = self.log(p, &mut disk, &mut batch);
        if let Err(e) = store.commit(&batch) {
            // A snapshot made current by this batch is offered again with the next.
            let ready = batch
                .snapshot
                .filter(|_| !p.snapshot_inline)
                .zip(snapshot_took)
                .map(|((meta, _), took)| (meta, took));
            return Err((e.to_string(), ready));
        }
        Ok((disk, written, snapshot_took))
    }

    /// Puts `p`'s events in `batch`'s log: it keeps every event after the snapshot
    /// (the change log), and before it the newest within the resume log's length and
    /// size: whole records are dropped oldest first, then the oldest of the new events
    /// are not written. How many events are written.
    fn log(&self, p: &Pending, disk: &mut OnDisk, batch: &mut Batch) -> u64 {
        let budget = (*lock(&self.held_json)).max(0) as f64 * self.config.log_share;
        let cut = disk.snapshot_revision();
        let retention = self.config.log_retention;
        let new_bytes: usize = p.events.iter().map(|e| e.json_bytes()).sum();
        let mut events = disk.events + p.events.len();
        let mut bytes = disk.bytes + new_bytes;
        let over = |events: usize, bytes: usize| events > retention || bytes as f64 > budget;
        while let Some(&(first, last, n)) = disk.records.front() {
            if last > cut || !over(events, bytes) {
                break;
            }
            disk.records.pop_front();
            disk.events -= (last - first + 1) as usize;
            disk.bytes -= n;
            events -= (last - first + 1) as usize;
            bytes -= n;
            batch.drop_events.push(first);
        }
        let mut skip = 0;
        while skip < p.events.len() && p.events[skip].revision.0 <= cut && over(events, bytes) {
            events -= 1;
            bytes -= p.events[skip].json_bytes();
            skip += 1;
        }
        // Runs of at most a chunk's size, each one record, encoded straight from the
        // index's events: nothing is copied first.
        let mut start = skip;
        let mut run_bytes = 0;
        for (i, e) in p.events.iter().enumerate().skip(skip) {
            run_bytes += e.json_bytes();
            let last = i + 1 == p.events.len();
            if run_bytes >= fleetscope_store::CHUNK_BYTES || last {
                if let Some(run) = EventRun::encode(p.events.range(start..=i).map(Logged)) {
                    disk.push(run.first().0, run.last().0, run_bytes);
                    batch.events.push(run);
                }
                start = i + 1;
                run_bytes = 0;
            }
        }
        disk.change_log = disk
            .records
            .iter()
            .filter(|(_, last, _)| *last > cut)
            .map(|(_, _, n)| n)
            .sum();
        (p.events.len() - skip) as u64
    }
}

/// A batch carrying `p`'s streams, discovery answers, clusters and field indexes.
fn batch_of(p: &Pending) -> Batch {
    let mut batch = Batch {
        revision: p.revision,
        clusters: p.clusters.clone(),
        field_indexes: p.field_indexes.clone(),
        ..Batch::default()
    };
    for ((cluster, resource), record) in &p.streams {
        match record {
            Some(r) => batch.streams.push(r.clone()),
            None => batch.drop_streams.push((cluster.clone(), resource.clone())),
        }
    }
    for (cluster, record) in &p.discovery {
        match record {
            Some(d) => batch.discovery.push(d.clone()),
            None => batch.drop_discovery.push(cluster.clone()),
        }
    }
    batch
}

mod loaded;
mod snapshot;

pub use loaded::{Continued, restored};

#[cfg(test)]
pub(crate) mod tests;
