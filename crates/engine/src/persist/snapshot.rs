//! The persister's background work: snapshots of the index written beside the
//! change log (so a restart replays little), and the store compacted once what it
//! holds on disk has grown well past what it needs; each counted as under way while
//! it runs, for the store's figures.

use super::*;

impl Persister {
    /// Writes a snapshot of `state` to `store` now, within a batch's write.
    pub(super) fn snapshot_now(
        &self,
        store: &dyn Store,
        state: &State,
    ) -> Result<ReadySnapshot, fleetscope_store::StoreError> {
        let _writing = self.under_way(SNAPSHOT);
        write_snapshot(store, state, &self.index)
    }

    /// Whether a snapshot due only to `snapshot_log_bytes` may start now as changes
    /// go on: once a restore is over, when [`Self::paced_from`] allows.
    pub(super) fn snapshot_spaced(&self) -> bool {
        let now = tokio::time::Instant::now();
        self.index.is_history_restored() && self.paced_from(now).is_some_and(|at| at <= now)
    }

    /// When the pacing lets the next snapshot for `snapshot_log_bytes` start: once the
    /// last one made current is far enough behind for snapshots to keep within
    /// `snapshot_cpu_share` of a core (`now` before the first); never during a first
    /// fill, nor with a zero share.
    fn paced_from(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        if self.first_fill() {
            return None;
        }
        let last = *lock(&self.last_snapshot);
        let Some(last) = last else {
            return Some(now);
        };
        let spacing = last.took.as_secs_f64() / self.config.snapshot_cpu_share;
        Duration::try_from_secs_f64(spacing)
            .ok()
            .and_then(|spacing| last.current_at.checked_add(spacing))
    }

    /// When a snapshot due to `snapshot_log_bytes` alone may start, if the change
    /// log is past it and no snapshot being written covers it: as the pacing allows,
    /// or once changes have stopped for [`QUIET`] (a burst over), whichever is first
    /// (only the pacing after a snapshot that failed); `None` if never (a zero share).
    pub(super) fn log_snapshot_at(&self) -> Option<tokio::time::Instant> {
        if self.config.snapshot_cpu_share <= 0.0 {
            return None;
        }
        let gathered = lock(&self.pending).bytes;
        let held_json = (*lock(&self.held_json)).max(0) as f64;
        if self.change_log(gathered, 0, held_json) <= self.config.snapshot_log_bytes {
            return None;
        }
        let now = tokio::time::Instant::now();
        let paced = self.paced_from(now);
        if lock(&self.last_snapshot).is_some_and(|last| last.failed) {
            // Not tried again over and over on a failing disk.
            return paced;
        }
        let quiet = lock(&self.last_change).map_or(now, |at| at + QUIET);
        Some(paced.map_or(quiet, |paced| paced.min(quiet)))
    }

    /// Captures the published state as the next snapshot (written beside the
    /// batches) when one is due to `snapshot_log_bytes` alone and nothing is
    /// gathered: the writer found the log past it with no change arriving. Whether
    /// it did.
    pub(super) fn capture_log_snapshot(&self) -> bool {
        // Not while a restore is still making the index (and its retained events).
        if !self.index.is_history_restored()
            || self
                .log_snapshot_at()
                .is_none_or(|at| at > tokio::time::Instant::now())
        {
            return false;
        }
        let state = self.index.snapshot();
        let mut p = lock(&self.pending);
        if p.snapshot.is_some() || !p.events.is_empty() || state.revision() != p.revision {
            return false;
        }
        tracing::debug!(revision = %state.revision(), "the change log passed its bound: a snapshot is due");
        p.snapshot = Some(state);
        true
    }

    /// Whether a store that started empty has had no snapshot since it filled: its
    /// first sync's own snapshots are those of `snapshot_share` (each one there
    /// moves the next), and the bound is met once changes stop.
    fn first_fill(&self) -> bool {
        let fill = *lock(&self.fill);
        match fill {
            Fill::Filling { .. } => true,
            Fill::Filled { snapshot, .. } => snapshot == lock(&self.disk).snapshot_revision(),
            Fill::Never => false,
        }
    }

    /// Whether a snapshot, and a compaction, is being written now.
    pub(super) fn under_way_now(&self) -> (bool, bool) {
        (
            self.in_progress[SNAPSHOT].load(Ordering::Relaxed) > 0,
            self.in_progress[COMPACTION].load(Ordering::Relaxed) > 0,
        )
    }

    /// Counts a snapshot's writing or a compaction as under way until the guard drops.
    fn under_way(&self, kind: usize) -> UnderWay<'_> {
        self.in_progress[kind].fetch_add(1, Ordering::Relaxed);
        UnderWay(&self.in_progress[kind])
    }

    /// Checks the store's size, and compacts it in the background when it has grown
    /// past its limits: writes go on meanwhile (one at a time, as ever).
    pub(super) fn start_compaction(self: &Arc<Self>) {
        let mut compacting = lock(&self.compacting);
        if compacting.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let this = self.clone();
        *compacting = Some(tokio::task::spawn_blocking(move || {
            let size = this.compact_if_grown();
            lock(&this.stats).size_on_disk = size;
        }));
    }

    /// Writes `state` as a snapshot's chunks in the background (one at a time; a
    /// later due snapshot is captured again once this one is current).
    pub(super) fn start_snapshot(self: &Arc<Self>, state: Arc<State>, covers: usize) {
        let mut writing = lock(&self.snapshotting);
        if writing.as_ref().is_some_and(|t| !t.is_finished())
            || lock(&self.snapshot_ready).is_some()
        {
            return;
        }
        let Some(store) = lock(&self.store).clone() else {
            return;
        };
        self.covered.store(covers, Ordering::Relaxed);
        let this = self.clone();
        *writing = Some(tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let written = {
                let _writing = this.under_way(SNAPSHOT);
                write_snapshot(&*store, &state, &this.index)
            };
            match written {
                Ok(ready) => *lock(&this.snapshot_ready) = Some(ready),
                Err(e) => {
                    this.covered.store(0, Ordering::Relaxed);
                    // Spaced as a snapshot would be, so a failing one is not retried
                    // over and over.
                    *lock(&this.last_snapshot) = Some(LastSnapshot {
                        current_at: tokio::time::Instant::now(),
                        took: started.elapsed().max(Duration::from_secs(1)),
                        failed: true,
                    });
                    // While the writes fail too, their error says it (once).
                    if lock(&this.stats).last_error.is_none() {
                        tracing::warn!(error = %e, "writing a snapshot failed: the change log is kept, and a snapshot is tried again");
                    } else {
                        tracing::debug!(error = %e, "writing a snapshot failed while the store's writes fail");
                    }
                }
            }
            this.wake.notify_one();
        }));
    }

    /// Compacts the store when its file has grown past its limits (see
    /// [`PersistConfig::compact_share`]), and returns its size on disk. Runs beside
    /// the writes, which wait only for the switch to the compacted copy. A failed
    /// compaction is logged and leaves the store as it was; the next is tried once the
    /// file has grown by half again.
    pub(super) fn compact_if_grown(&self) -> u64 {
        let Some(store) = lock(&self.store).clone() else {
            return 0;
        };
        let size = store.size_on_disk();
        let held = *lock(&self.held_json) as f64;
        if !self.compaction_due(size, held) {
            return size;
        }
        let started = Instant::now();
        tracing::debug!(size, "compacting the store");
        let compacting = self.under_way(COMPACTION);
        let compacted = store.compact();
        drop(compacting);
        match compacted {
            Ok(Some((before, after))) => {
                let took = started.elapsed();
                self.compacted.store(after, Ordering::Relaxed);
                let mut s = lock(&self.stats);
                s.compactions += 1;
                s.last_compaction = took;
                tracing::info!(
                    before,
                    after,
                    took_ms = took.as_secs_f64() * 1e3,
                    "store compacted"
                );
                after
            }
            // Nothing to reclaim (a store in memory has no size on disk to pass a limit).
            Ok(None) => size,
            Err(e) => {
                self.compacted.store(size, Ordering::Relaxed);
                tracing::warn!(error = %e, size, "store compaction failed: the store goes on as it was");
                size
            }
        }
    }

    /// Whether the store has grown past its limits (see [`PersistConfig::compact_share`]).
    pub(super) fn compaction_due(&self, size: u64, held: f64) -> bool {
        match &mut *lock(&self.fill) {
            Fill::Filling { .. } => return false,
            Fill::Filled { size_due, .. } => {
                if std::mem::take(size_due) {
                    self.compacted.fetch_max(size, Ordering::Relaxed);
                }
            }
            Fill::Never => {}
        }
        let limit = (self.config.compact_share * held)
            .max(self.config.compact_min_bytes as f64)
            .max(1.5 * self.compacted.load(Ordering::Relaxed) as f64);
        size as f64 > limit
    }
}

/// How long changes must have stopped for a burst of them to count as over: a change
/// log past `snapshot_log_bytes` is then snapshotted without waiting out the spacing
/// (changes that never stop this long are paced by it).
pub(super) const QUIET: Duration = Duration::from_secs(1);

/// Which of [`Persister`]'s in-progress counters: a snapshot's writing.
const SNAPSHOT: usize = 0;
/// Which of [`Persister`]'s in-progress counters: a compaction.
const COMPACTION: usize = 1;

/// A snapshot's writing or a compaction under way, until dropped.
struct UnderWay<'a>(&'a AtomicU64);

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Writes the chunks of a snapshot of `state` (not yet current), each object's JSON
/// compressed as `index` compresses it, so a restart reads it back as it is held
/// settled; returns its meta and how long writing took.
fn write_snapshot(
    store: &dyn Store,
    state: &State,
    index: &Index,
) -> Result<ReadySnapshot, fleetscope_store::StoreError> {
    let started = Instant::now();
    let revision = state.revision();
    tracing::debug!(%revision, objects = state.len(), "writing a snapshot");
    // Encoded straight from the index's objects: nothing is copied first.
    let meta = fleetscope_store::write_snapshot(
        store,
        revision.0,
        revision,
        state.iter().map(|o| &**o),
        |o| index.packed_for_store(o),
    )?;
    tracing::debug!(%revision, objects = meta.objects, took = ?started.elapsed(), "snapshot written");
    Ok((meta, started.elapsed()))
}
