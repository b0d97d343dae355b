//! The store on disk, in sled: one tree, every batch one atomic sled batch, flushed
//! before it counts as written. The data directory is locked while open.
//!
//! sled reclaims the space of removed and overwritten records lazily, so under churn
//! its files grow well past what they hold. [`SledStore::compact`] copies the live
//! records into a fresh database beside it (`db.next`), then switches: `db` is renamed
//! `db.old`, `db.next` renamed `db`, `db.old` deleted. Opening finishes or undoes a
//! switch a crash interrupted: a `db.next` beside a `db` is an unfinished copy and is
//! deleted; a `db.next` without a `db` is a finished one and becomes `db`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Loaded, Store, StoreError, Visit, Writes};

/// How long opening waits for sled's own lock on its file (see [`SledStore::open_db`]).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Bytes written to a database since it was opened below which it is not reopened
/// (see [`SledStore::checkpoint`]).
const CHECKPOINT_MIN: u64 = 64 << 20;

/// A data directory opened by this process.
pub struct SledStore {
    /// Replaced whole by a compaction; `None` only if reopening after one failed.
    db: RwLock<Option<sled::Db>>,
    /// While a compaction copies the store, every write made meanwhile, in the order
    /// applied, to replay onto the copy before switching to it. Held across each
    /// write, so the order here is the order of the database.
    journal: Mutex<Option<Vec<Writes>>>,
    /// Bytes of keys and values written since the database was last opened, and its
    /// size on disk then: opening it again reads the log written since.
    logged: AtomicU64,
    opened_size: AtomicU64,
    /// [`CHECKPOINT_MIN`], lower in tests.
    pub(crate) checkpoint_min: u64,
    dir: PathBuf,
    // Held for as long as the store is open; released when the process ends, however it ends.
    _lock: File,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").field("dir", &self.dir).finish()
    }
}

/// What opening found.
#[derive(Debug)]
pub struct Opened {
    /// The open store.
    pub store: SledStore,
    /// What it holds, verified.
    pub loaded: Loaded,
    /// Where a damaged store was moved, and why, if one was.
    pub moved_aside: Option<(PathBuf, String)>,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |cause| StoreError::Io {
        what,
        path: path.to_path_buf(),
        cause,
    }
}

impl SledStore {
    /// Opens the data directory `dir` (creating it), takes its lock, and loads and
    /// verifies the store in it. A store that fails verification, that sled cannot
    /// open, or that has an unknown schema is renamed aside with a timestamp (logged at
    /// error level) and an empty one takes its place.
    pub fn open(dir: &Path) -> Result<Opened, StoreError> {
        if dir.exists() && !dir.is_dir() {
            return Err(StoreError::NotADirectory(dir.to_path_buf()));
        }
        std::fs::create_dir_all(dir).map_err(io("cannot create data directory", dir))?;
        let lock_path = dir.join("LOCK");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io("cannot open lock file", &lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked(dir.to_path_buf()));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io("cannot lock", &lock_path)(e));
            }
        }
        let db_path = dir.join("db");
        finish_switch(dir)?;
        // Damage found by sled or by verification: the store is closed, moved aside,
        // and an empty one opened in its place.
        let (db, loaded, damage) = match Self::open_db(&db_path) {
            Ok(db) => {
                let probe = SledStore {
                    db: RwLock::new(Some(db)),
                    journal: Mutex::new(None),
                    logged: AtomicU64::new(0),
                    opened_size: AtomicU64::new(0),
                    checkpoint_min: CHECKPOINT_MIN,
                    dir: dir.to_path_buf(),
                    _lock: lock
                        .try_clone()
                        .map_err(io("cannot use lock file", &lock_path))?,
                };
                match probe.load() {
                    Ok(loaded) => (probe.into_db(), loaded, None),
                    Err(e) if e.is_damage() => (None, Loaded::default(), Some(e)),
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.is_damage() => (None, Loaded::default(), Some(e)),
            Err(e) => return Err(e),
        };
        let mut moved_aside = None;
        let db = match (db, damage) {
            (Some(db), _) => db,
            (None, damage) => {
                let why = damage.map(|e| e.to_string()).unwrap_or_default();
                moved_aside = Some((move_aside(&db_path, &why)?, why));
                Self::open_db(&db_path)?
            }
        };
        let store = SledStore {
            opened_size: AtomicU64::new(db.size_on_disk().unwrap_or(0)),
            db: RwLock::new(Some(db)),
            journal: Mutex::new(None),
            logged: AtomicU64::new(0),
            checkpoint_min: CHECKPOINT_MIN,
            dir: dir.to_path_buf(),
            _lock: lock,
        };
        if loaded.revision.0 == 0 && loaded.objects.is_empty() {
            store.initialise()?;
        }
        Ok(Opened {
            store,
            loaded,
            moved_aside,
        })
    }

    /// Opens the sled database at `path`. sled locks its file while a database is
    /// open, and a database this process just closed (a probe, or the one a compaction
    /// replaced) may hold that lock a little longer, while sled's background work
    /// winds down: opening waits for it, up to [`LOCK_WAIT`], and is then an error —
    /// never taken for damage.
    fn open_db(path: &Path) -> Result<sled::Db, StoreError> {
        remove_unfinished_sled_snapshots(path)?;
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            // sled may panic on some damage rather than return an error: contain that here.
            let opened = contained(|| {
                sled::Config::new()
                    .path(path)
                    .mode(sled::Mode::LowSpace)
                    .cache_capacity(64 << 20)
                    .flush_every_ms(None)
                    .open()
            });
            match opened {
                Ok(Err(sled::Error::Io(e)))
                    if lock_held(&e) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => return Self::opened(path, other),
            }
        }
    }

    /// What an attempt to open the database at `path` amounts to.
    fn opened(
        path: &Path,
        opened: std::thread::Result<sled::Result<sled::Db>>,
    ) -> Result<sled::Db, StoreError> {
        match opened {
            Ok(Ok(db)) => Ok(db),
            Ok(Err(sled::Error::Io(e))) => match e.kind() {
                std::io::ErrorKind::PermissionDenied
                | std::io::ErrorKind::NotFound
                | std::io::ErrorKind::StorageFull
                | std::io::ErrorKind::ReadOnlyFilesystem
                | std::io::ErrorKind::QuotaExceeded => Err(StoreError::Io {
                    what: "cannot open store",
                    path: path.to_path_buf(),
                    cause: e,
                }),
                _ if lock_held(&e) => Err(StoreError::Engine(format!("{}: {e}", path.display()))),
                // Anything else sled reports while reading its own files is damage.
                _ => Err(StoreError::Damaged(format!("sled cannot open it: {e}"))),
            },
            // sled's own text of this one ends with an empty backtrace.
            Ok(Err(sled::Error::Corruption { at, .. })) => Err(StoreError::Damaged(match at {
                Some(at) => format!("sled found corrupted data at {at}"),
                None => "sled found corrupted data".into(),
            })),
            Ok(Err(e)) => Err(StoreError::Damaged(format!("sled cannot open it: {e}"))),
            Err(payload) => {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(StoreError::Damaged(format!(
                    "sled failed while opening it: {why}"
                )))
            }
        }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn into_db(self) -> Option<sled::Db> {
        self.db.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the open database (a compaction waits until it returns).
    fn with_db<T>(
        &self,
        f: impl FnOnce(&sled::Db) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        {
            let guard = self.db.read().unwrap_or_else(|e| e.into_inner());
            if let Some(db) = guard.as_ref() {
                return f(db);
            }
        }
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        f(self.reopened(&mut slot)?)
    }

    /// The database in `slot`; one a compaction could not reopen (its switch failed
    /// half-way, or reopening failed) is first opened again, finishing or undoing the
    /// switch.
    fn reopened<'s>(&self, slot: &'s mut Option<sled::Db>) -> Result<&'s sled::Db, StoreError> {
        if slot.is_none() {
            finish_switch(&self.dir)?;
            let db = slot.insert(Self::open_db(&self.dir.join("db"))?);
            self.reopened_at(db);
        }
        slot.as_ref()
            .ok_or_else(|| StoreError::Engine("the store is not open".into()))
    }

    /// Rewrites the store into a fresh database holding only its live records, and
    /// switches to it; returns the size on disk before and after. Writes go on while
    /// the records are copied (each is journaled and replayed onto the copy), and wait
    /// only for the switch. On failure the store goes on as it was.
    pub fn compact(&self) -> Result<(u64, u64), StoreError> {
        let next = self.dir.join("db.next");
        remove_dir(&next)?;
        let fresh = Self::open_db(&next)?;
        // From here on, every write is also journaled; every earlier one is whole in
        // the database the copy reads.
        *self.journal() = Some(Vec::new());
        let copied = self.copy_into(&fresh);
        let switched = copied.and_then(|before| self.switch(fresh, before));
        self.journal().take();
        if switched.is_err() {
            let _ = remove_dir(&next);
        }
        switched
    }

    /// Closes the database and opens it again, writes held meanwhile; returns how long
    /// they were held, or `None` when nothing was written since it was opened or it is
    /// in use (a compaction copying it, a scan). sled writes down where its pages are
    /// (its page table) only when it opens a database, after reading the log written
    /// since it last did: a store that has taken a large write, a first sync into an
    /// empty one, would have the next start read all of it again (0.30–0.35 s for the
    /// 0.5 GB of 1,000,000 pods). The store is reopened so when the process stops (see
    /// [`Store::checkpoint`]), and on a write past [`CHECKPOINT_MIN`] since the last
    /// opening that finds the size on disk doubled since, which bounds what a start
    /// after a crash reads to about the last half of what the store holds. A
    /// compaction's switch reopens it too.
    pub fn checkpoint(&self) -> Result<Option<std::time::Duration>, StoreError> {
        let mut slot = match self.db.try_write() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(None),
        };
        let held = std::time::Instant::now();
        if self.journal().is_some() || self.logged.load(Ordering::Relaxed) == 0 {
            return Ok(None);
        }
        self.reopened(&mut slot)?.flush().map_err(engine)?;
        slot.take();
        // Failing from here on, the slot stays empty and the next use reopens it.
        let db = slot.insert(Self::open_db(&self.dir.join("db"))?);
        self.reopened_at(db);
        Ok(Some(held.elapsed()))
    }

    /// How far into its log sled's newest record of its layout (a `snap.` file of
    /// the database in data directory `dir`, named by that offset) reaches: opening
    /// the store reads the log from there on. `None` before sled has recorded any.
    pub fn layout_recorded_through(dir: &Path) -> Option<u64> {
        std::fs::read_dir(dir.join("db"))
            .ok()?
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                u64::from_str_radix(name.strip_prefix("snap.")?, 16).ok()
            })
            .max()
    }

    /// Notes that `db` was just opened: its log is read from here on.
    fn reopened_at(&self, db: &sled::Db) {
        self.logged.store(0, Ordering::Relaxed);
        self.opened_size
            .store(db.size_on_disk().unwrap_or(0), Ordering::Relaxed);
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Option<Vec<Writes>>> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies every record into `fresh`, beside writes; returns the size on disk.
    fn copy_into(&self, fresh: &sled::Db) -> Result<u64, StoreError> {
        self.with_db(|db| {
            let before = db.size_on_disk().unwrap_or(0);
            let mut batch = sled::Batch::default();
            let mut batch_bytes = 0;
            for item in db.iter() {
                let (k, v) = item.map_err(engine)?;
                batch_bytes += k.len() + v.len();
                batch.insert(k, v);
                if batch_bytes >= crate::WRITE_BYTES {
                    fresh
                        .apply_batch(std::mem::take(&mut batch))
                        .map_err(engine)?;
                    batch_bytes = 0;
                }
            }
            fresh.apply_batch(batch).map_err(engine)?;
            // Flushed before writes are held: the switch flushes only what it replays.
            fresh.flush().map_err(engine)?;
            Ok(before)
        })
    }

    /// With writes held: replays what was written during the copy onto it, and
    /// switches to it.
    fn switch(&self, fresh: sled::Db, before: u64) -> Result<(u64, u64), StoreError> {
        let started = std::time::Instant::now();
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        let held = std::time::Instant::now();
        let db = self.reopened(&mut slot)?;
        let journal = self.journal().take().unwrap_or_default();
        for writes in journal {
            fresh.apply_batch(sled_batch(writes)).map_err(engine)?;
        }
        fresh.flush().map_err(engine)?;
        drop(fresh);
        let next = self.dir.join("db.next");
        let old = self.dir.join("db.old");
        let current = self.dir.join("db");
        // The copy is complete on disk: from here on, opening finds either `db`, or
        // `db.next` alone, and both are whole. The current database is closed before
        // its directory is renamed, so nothing of it is written under the new name.
        db.flush().map_err(engine)?;
        slot.take();
        // Failing from here on, the slot stays empty and the next use reopens it.
        std::fs::rename(&current, &old)
            .map_err(io("cannot switch to the compacted store", &current))?;
        std::fs::rename(&next, &current)
            .map_err(io("cannot switch to the compacted store", &next))?;
        let db = slot.insert(Self::open_db(&current)?);
        self.reopened_at(db);
        let after = db.size_on_disk().unwrap_or(0);
        drop(slot);
        tracing::debug!(
            waited = ?held.duration_since(started),
            writes_held = ?held.elapsed(),
            "switched to the compacted store"
        );
        remove_dir(&old)?;
        Ok((before, after))
    }
}

fn sled_batch(writes: Writes) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for (k, v) in writes {
        match v {
            Some(v) => batch.insert(k, v),
            None => batch.remove(k),
        }
    }
    batch
}

/// sled writes its own snapshot (of where its pages are) as `snap.<lsn>.generating`,
/// then renames it; a process killed in between leaves the unfinished file, which
/// sled 0.34 then reads as the newest snapshot and refuses as corrupt. It is removed
/// before opening: sled then recovers from its previous snapshot and its log, and
/// every record is verified after loading as always.
fn remove_unfinished_sled_snapshots(path: &Path) -> Result<(), StoreError> {
    let Ok(entries) = std::fs::read_dir(path) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            let file = entry.path();
            // Left by a process that was killed, or by a write that failed (a full
            // disk, when the store is opened again): harmless, and not news.
            tracing::debug!(file = %file.display(), "removing sled's unfinished snapshot file");
            std::fs::remove_file(&file).map_err(io("cannot remove", &file))?;
        }
    }
    Ok(())
}

/// Whether sled refused to open because its file lock is held.
fn lock_held(e: &std::io::Error) -> bool {
    e.to_string().contains("could not acquire lock")
}

fn remove_dir(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("cannot remove", path)(e)),
        _ => Ok(()),
    }
}

/// Finishes or undoes a compaction's switch that a crash interrupted (see the
/// module's documentation).
fn finish_switch(dir: &Path) -> Result<(), StoreError> {
    let current = dir.join("db");
    let next = dir.join("db.next");
    if next.exists() {
        if current.exists() {
            tracing::warn!(store = %next.display(), "removing an unfinished compaction");
            remove_dir(&next)?;
        } else {
            tracing::warn!(store = %next.display(), "finishing a compaction's switch");
            std::fs::rename(&next, &current).map_err(io("cannot finish a compaction", &next))?;
        }
    }
    remove_dir(&dir.join("db.old"))
}

/// Renames a damaged store to `<name>.damaged-<unix seconds>` beside it.
fn move_aside(path: &Path, why: &str) -> Result<PathBuf, StoreError> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = path.with_extension(format!("damaged-{secs}"));
    let mut n = 1;
    while aside.exists() {
        aside = path.with_extension(format!("damaged-{secs}-{n}"));
        n += 1;
    }
    if path.exists() {
        std::fs::rename(path, &aside).map_err(io("cannot move the damaged store aside", path))?;
    }
    tracing::error!(store = %path.display(), moved_to = %aside.display(), reason = %why, "store failed verification: moved aside, starting empty and re-listing every cluster");
    Ok(aside)
}

fn engine(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Corruption { .. } => StoreError::Damaged(e.to_string()),
        other => StoreError::Engine(other.to_string()),
    }
}

impl Store for SledStore {
    fn scan(&self, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        self.with_db(|db| {
            for item in db.iter() {
                let (k, v) = item.map_err(engine)?;
                visit(&k, &v)?;
            }
            Ok(())
        })
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.with_db(|db| Ok(db.get(key).map_err(engine)?.map(|v| v.to_vec())))
    }

    fn write(&self, writes: Writes) -> Result<(), StoreError> {
        let bytes: usize = writes
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        let written = self.with_db(|db| {
            // Held across the write: a compaction's journal is in the database's order.
            let mut journal = self.journal();
            match journal.as_mut() {
                Some(j) => {
                    db.apply_batch(sled_batch(writes.clone())).map_err(engine)?;
                    j.push(writes);
                }
                None => db.apply_batch(sled_batch(writes)).map_err(engine)?,
            }
            drop(journal);
            db.flush().map_err(engine)?;
            Ok(())
        });
        if written.is_err() {
            // sled keeps the first I/O error of an open database (a full disk) and
            // fails every later operation with it: the database is opened again, from
            // what is on disk, before the next write, so writes resume once they can.
            // Not while a compaction copies it: the compaction's switch replaces it
            // (or, failing, leaves it for the next failed write to reopen).
            let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
            if self.journal().is_none() {
                slot.take();
            }
            return written;
        }
        let logged = self.logged.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        if logged >= self.checkpoint_min
            && self.size_on_disk() >= 2 * self.opened_size.load(Ordering::Relaxed)
        {
            match self.checkpoint() {
                Ok(None) => {}
                Ok(Some(held)) => tracing::debug!(
                    logged,
                    writes_held = ?held,
                    "reopened the store, so that opening it reads its recorded layout, not the log written since"
                ),
                // The write stands; opening the store reads more of its log.
                Err(e) => {
                    tracing::warn!(error = %e, "reopening the store after a large write failed: the next use opens it again")
                }
            }
        }
        written
    }

    fn size_on_disk(&self) -> u64 {
        self.with_db(|db| Ok(db.size_on_disk().unwrap_or(0)))
            .unwrap_or(0)
    }

    fn compact(&self) -> Result<Option<(u64, u64)>, StoreError> {
        SledStore::compact(self).map(Some)
    }

    fn checkpoint(&self) -> Result<Option<std::time::Duration>, StoreError> {
        SledStore::checkpoint(self)
    }
}

thread_local! {
    /// Set while a panic on this thread is contained and reported as an error.
    static CONTAINING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into an error its caller reports in one line: the
/// process's panic hook (a backtrace of many lines) stays silent for it, and for it
/// only.
fn contained<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CONTAINING.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    CONTAINING.with(|c| c.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CONTAINING.with(|c| c.set(false));
    result
}

#[cfg(test)]
mod contained_tests {
    #[test]
    fn a_contained_panic_is_an_error_carrying_its_message() {
        let r = super::contained(|| -> u8 { panic!("sled: bad page") });
        let payload = r.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"sled: bad page"));
        assert_eq!(super::contained(|| 7).unwrap(), 7);
    }
}
