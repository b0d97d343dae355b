//! Write-behind persistence: the ingest records each applied batch here; a writer
//! task commits what has gathered at most every `max_delay` (or sooner when it grows
//! past `max_changes`) as one atomic store batch: objects, events and stream
//! resourceVersions together, so a stream's resourceVersion on disk never runs ahead
//! of its objects on disk. A failing store (a full disk) is logged and retried; the
//! index keeps serving and nothing gathered is lost.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleetscope_index::{Event, Object, ObjectInput, Restored, RestoredEvent};
use fleetscope_model::{ClusterName, EventType, ObjectKey, ResourceType, Revision};
use fleetscope_store::{Batch, EventRecord, Loaded, ObjectRecord, Store, StreamRecord};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Persistence settings.
#[derive(Debug, Clone)]
pub struct PersistConfig {
    /// The longest a change waits before it is written. Default 100 ms.
    pub max_delay: Duration,
    /// Gathered changes that trigger a write before `max_delay`. Default 20,000.
    pub max_changes: usize,
    /// Events kept on disk for resuming watches across restarts (the in-memory log's length).
    pub log_retention: usize,
    /// The persisted event log's size limit, as a share of the held objects' JSON. Default 0.5.
    pub log_share: f64,
}

impl Default for PersistConfig {
    fn default() -> Self {
        Self {
            max_delay: Duration::from_millis(100),
            max_changes: 20_000,
            log_retention: 100_000,
            log_share: 0.5,
        }
    }
}

/// Figures about the store, for operators.
#[derive(Debug, Clone, Default)]
pub struct PersistStats {
    /// Batches written.
    pub flushes: u64,
    /// How long the last write took.
    pub last_flush: Duration,
    /// The longest write so far.
    pub max_flush: Duration,
    /// Bytes the store takes on disk, as of the last write.
    pub size_on_disk: u64,
    /// Changes gathered and not yet written.
    pub pending: usize,
    /// The last write error, if the last write failed.
    pub last_error: Option<String>,
    /// Events held in the persisted log.
    pub logged_events: usize,
    /// Object states and deletions written, in all.
    pub objects_written: u64,
    /// Events written to the log, in all.
    pub events_written: u64,
}

/// What has gathered since the last write.
#[derive(Default)]
struct Pending {
    /// Latest state per key; `None` for deleted.
    objects: HashMap<ObjectKey, Option<Arc<Object>>>,
    events: VecDeque<Arc<Event>>,
    /// Latest resume point per stream; `None` for a stream that is gone.
    streams: HashMap<(ClusterName, String), Option<StreamRecord>>,
    clusters: Option<Vec<ClusterName>>,
    field_indexes: Option<Vec<String>>,
    revision: Revision,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.objects.is_empty()
            && self.events.is_empty()
            && self.streams.is_empty()
            && self.clusters.is_none()
            && self.field_indexes.is_none()
    }

    fn changes(&self) -> usize {
        self.objects.len() + self.events.len() + self.streams.len()
    }

    /// Puts back a batch that failed to write, under what gathered since (newer wins).
    fn restore_under(&mut self, mut older: Pending, retention: usize) {
        for (k, v) in self.objects.drain() {
            older.objects.insert(k, v);
        }
        older.events.extend(self.events.drain(..));
        let excess = older.events.len().saturating_sub(retention);
        older.events.drain(..excess);
        for (k, v) in self.streams.drain() {
            older.streams.insert(k, v);
        }
        if self.clusters.is_some() {
            older.clusters = self.clusters.take();
        }
        if self.field_indexes.is_some() {
            older.field_indexes = self.field_indexes.take();
        }
        older.revision = older.revision.max(self.revision);
        *self = older;
    }
}

/// The persisted event log's extent: revisions and encoded sizes, oldest first.
#[derive(Default)]
struct LogOnDisk {
    events: VecDeque<(u64, usize)>,
    bytes: usize,
}

/// The write-behind persister.
pub struct Persister {
    /// Released by `close`, so the data directory's lock goes with it.
    store: Mutex<Option<Arc<dyn Store>>>,
    config: PersistConfig,
    pending: Mutex<Pending>,
    wake: Notify,
    /// Held objects' JSON bytes, for the log's size limit.
    held_json: Mutex<i64>,
    log: Mutex<LogOnDisk>,
    stats: Mutex<PersistStats>,
    /// Serialises writes: the writer task and the final flush.
    writing: tokio::sync::Mutex<()>,
    /// Signalled after each write, for an ingest waiting on a full backlog.
    written: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_record(o: &Object) -> ObjectRecord {
    ObjectRecord {
        key: o.key.clone(),
        revision: o.revision,
        json: o.json.to_string(),
        labels: o
            .labels()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        owners: o.owners().iter().map(|u| u.to_string()).collect(),
        fields: o
            .fields()
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .collect(),
    }
}

fn to_input(o: ObjectRecord) -> (ObjectInput, Revision) {
    (
        ObjectInput {
            key: o.key,
            json: o.json,
            labels: o.labels,
            owners: o.owners,
            fields: o.fields,
        },
        o.revision,
    )
}

/// What the index is rebuilt from.
pub fn restored(loaded: &mut Loaded) -> Restored {
    Restored {
        revision: loaded.revision,
        objects: std::mem::take(&mut loaded.objects)
            .into_iter()
            .map(to_input)
            .collect(),
        events: std::mem::take(&mut loaded.events)
            .into_iter()
            .map(|e| RestoredEvent {
                revision: e.revision,
                kind: e.kind,
                object: to_input(e.object),
                prev: e.prev.map(to_input),
            })
            .collect(),
    }
}

impl Persister {
    /// A persister over `store`, which holds `held_json` bytes of objects and the
    /// events `logged` (revision order).
    pub fn new(
        store: Arc<dyn Store>,
        config: PersistConfig,
        held_json: usize,
        logged: &[(Revision, usize)],
        revision: Revision,
    ) -> Self {
        let log = LogOnDisk {
            events: logged.iter().map(|(r, n)| (r.0, *n)).collect(),
            bytes: logged.iter().map(|(_, n)| n).sum(),
        };
        Self {
            store: Mutex::new(Some(store)),
            config,
            pending: Mutex::new(Pending {
                revision,
                ..Pending::default()
            }),
            wake: Notify::new(),
            held_json: Mutex::new(held_json as i64),
            log: Mutex::new(log),
            stats: Mutex::new(PersistStats::default()),
            writing: tokio::sync::Mutex::new(()),
            written: Notify::new(),
        }
    }

    /// Records one applied batch: its events and the streams' new resume points.
    pub fn record(
        &self,
        events: &[Arc<Event>],
        streams: impl IntoIterator<Item = (ClusterName, ResourceType, Option<String>)>,
    ) {
        let mut held = 0i64;
        let mut p = lock(&self.pending);
        for e in events {
            let key = e.object.key.clone();
            match e.kind {
                EventType::Deleted => {
                    held -= e.object.json.len() as i64;
                    p.objects.insert(key, None);
                }
                _ => {
                    held += e.object.json.len() as i64
                        - e.prev.as_ref().map_or(0, |p| p.json.len() as i64);
                    p.objects.insert(key, Some(e.object.clone()));
                }
            }
            p.events.push_back(e.clone());
            p.revision = p.revision.max(e.revision);
        }
        let excess = p.events.len().saturating_sub(self.config.log_retention);
        p.events.drain(..excess);
        for (cluster, resource, rv) in streams {
            let key = (cluster.clone(), resource.name());
            let record = rv.map(|resource_version| StreamRecord {
                cluster,
                resource,
                resource_version,
            });
            p.streams.insert(key, record);
        }
        let wake = p.changes() >= self.config.max_changes;
        drop(p);
        *lock(&self.held_json) += held;
        if wake {
            self.wake.notify_one();
        }
    }

    /// Waits while the backlog is over `max_changes` × 4 and the store is writing, so an
    /// ingest far ahead of the disk slows to its pace (and batches stay bounded). A
    /// failing store does not hold the ingest: its backlog is bounded by the objects held.
    pub async fn backpressure(&self) {
        loop {
            let notified = self.written.notified();
            let over = lock(&self.pending).changes() > self.config.max_changes * 4;
            if !over || lock(&self.stats).last_error.is_some() {
                return;
            }
            self.wake.notify_one();
            notified.await;
        }
    }

    /// Records the configured clusters and field-index paths.
    pub fn record_config(&self, clusters: Vec<ClusterName>, field_indexes: Vec<String>) {
        let mut p = lock(&self.pending);
        p.clusters = Some(clusters);
        p.field_indexes = Some(field_indexes);
    }

    /// The current figures.
    pub fn stats(&self) -> PersistStats {
        let mut s = lock(&self.stats).clone();
        s.pending = lock(&self.pending).changes();
        s.logged_events = lock(&self.log).events.len();
        s
    }

    /// Writes gathered changes every `max_delay` until cancelled, then once more.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut last_report = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.config.max_delay) => {}
                _ = self.wake.notified() => {}
                _ = cancel.cancelled() => break,
            }
            if self.flush().await.is_err() {
                // Logged by flush; wait before retrying so a full disk is not hammered.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = cancel.cancelled() => break,
                }
            }
            if last_report.elapsed() >= Duration::from_secs(60) {
                last_report = Instant::now();
                let s = self.stats();
                tracing::info!(
                    size_on_disk = s.size_on_disk,
                    last_flush_ms = s.last_flush.as_secs_f64() * 1e3,
                    max_flush_ms = s.max_flush.as_secs_f64() * 1e3,
                    pending = s.pending,
                    logged_events = s.logged_events,
                    "store"
                );
            }
        }
    }

    /// Writes what has gathered, then lets the store go (closing it once nothing else holds it).
    pub async fn close(self: &Arc<Self>) -> Result<(), ()> {
        let flushed = self.flush().await;
        lock(&self.store).take();
        flushed
    }

    /// Writes everything gathered so far as one batch.
    pub async fn flush(self: &Arc<Self>) -> Result<(), ()> {
        let _writing = self.writing.lock().await;
        let taken = {
            let mut p = lock(&self.pending);
            if p.is_empty() {
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
        let this = self.clone();
        let started = Instant::now();
        let (taken, result) = tokio::task::spawn_blocking(move || {
            let result = this.write(&taken);
            (taken, result)
        })
        .await
        .unwrap_or_else(|e| (Pending::default(), Err(format!("store writer failed: {e}"))));
        let took = started.elapsed();
        self.written.notify_waiters();
        match result {
            Ok((log, objects, events)) => {
                *lock(&self.log) = log;
                let size = lock(&self.store).as_ref().map_or(0, |s| s.size_on_disk());
                let mut s = lock(&self.stats);
                if s.last_error.take().is_some() {
                    tracing::info!("store writes succeed again");
                }
                s.flushes += 1;
                s.objects_written += objects;
                s.events_written += events;
                s.last_flush = took;
                s.max_flush = s.max_flush.max(took);
                s.size_on_disk = size;
                Ok(())
            }
            Err(e) => {
                let mut s = lock(&self.stats);
                if s.last_error.as_deref() != Some(e.as_str()) {
                    tracing::error!(error = %e, "store write failed: changes are kept in memory and retried");
                }
                s.last_error = Some(e);
                drop(s);
                lock(&self.pending).restore_under(taken, self.config.log_retention);
                Err(())
            }
        }
    }

    /// Encodes and commits one batch; returns the persisted log's new extent.
    fn write(&self, p: &Pending) -> Result<(LogOnDisk, u64, u64), String> {
        let mut batch = Batch {
            revision: p.revision,
            clusters: p.clusters.clone(),
            field_indexes: p.field_indexes.clone(),
            ..Batch::default()
        };
        for (key, state) in &p.objects {
            match state {
                Some(o) => batch.upserts.push(to_record(o)),
                None => batch.deletes.push(key.clone()),
            }
        }
        for ((cluster, resource), record) in &p.streams {
            match record {
                Some(r) => batch.streams.push(r.clone()),
                None => batch.drop_streams.push((cluster.clone(), resource.clone())),
            }
        }
        // The log keeps the newest events within its length and its share of the
        // objects' size; events trimmed before they reach the disk are not written.
        let budget = (*lock(&self.held_json)).max(0) as f64 * self.config.log_share;
        let mut log = {
            let l = lock(&self.log);
            LogOnDisk {
                events: l.events.clone(),
                bytes: l.bytes,
            }
        };
        let records: Vec<EventRecord> = p
            .events
            .iter()
            .map(|e| EventRecord {
                revision: e.revision,
                kind: e.kind,
                object: to_record(&e.object),
                prev: match e.kind {
                    EventType::Modified => e.prev.as_deref().map(to_record),
                    _ => None,
                },
            })
            .collect();
        let first_new = records.first().map(|e| e.revision.0);
        for e in &records {
            let size = e.object.json.len() + e.prev.as_ref().map_or(0, |p| p.json.len());
            log.events.push_back((e.revision.0, size));
            log.bytes += size;
        }
        let mut dropped_upto = None;
        while log.events.len() > self.config.log_retention
            || (log.bytes as f64 > budget && !log.events.is_empty())
        {
            if let Some((r, n)) = log.events.pop_front() {
                log.bytes -= n;
                dropped_upto = Some(r);
            }
        }
        let oldest_kept = log.events.front().map(|(r, _)| *r);
        let on_disk_from = {
            let l = lock(&self.log);
            l.events.front().map(|(r, _)| *r)
        };
        if let (Some(from), Some(upto)) = (on_disk_from, dropped_upto) {
            let end = (upto + 1).min(first_new.unwrap_or(u64::MAX));
            if end > from {
                batch.drop_events = from..end;
            }
        }
        batch.events = records
            .into_iter()
            .filter(|e| oldest_kept.is_some_and(|o| e.revision.0 >= o))
            .collect();
        let store = lock(&self.store)
            .clone()
            .ok_or_else(|| "the store is closed".to_string())?;
        store.commit(&batch).map_err(|e| e.to_string())?;
        let objects = (batch.upserts.len() + batch.deletes.len()) as u64;
        Ok((log, objects, batch.events.len() as u64))
    }
}

/// The persisted log's extent from what was loaded.
pub fn logged(loaded: &Loaded) -> Vec<(Revision, usize)> {
    loaded
        .events
        .iter()
        .map(|e| {
            (
                e.revision,
                e.object.json.len() + e.prev.as_ref().map_or(0, |p| p.json.len()),
            )
        })
        .collect()
}
