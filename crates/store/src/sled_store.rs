//! The store on disk, in sled: one tree, every batch one atomic sled batch, flushed
//! before it counts as written. The data directory is locked while open.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Loaded, Store, StoreError, Visit, Writes};

/// A data directory opened by this process.
pub struct SledStore {
    db: sled::Db,
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
    move |source| StoreError::Io {
        what,
        path: path.to_path_buf(),
        source,
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
        // Damage found by sled or by verification: the store is closed, moved aside,
        // and an empty one opened in its place.
        let (db, loaded, damage) = match Self::open_db(&db_path) {
            Ok(db) => {
                let probe = SledStore {
                    db,
                    dir: dir.to_path_buf(),
                    _lock: lock
                        .try_clone()
                        .map_err(io("cannot use lock file", &lock_path))?,
                };
                match probe.load() {
                    Ok(loaded) => (Some(probe.db), loaded, None),
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
            db,
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

    fn open_db(path: &Path) -> Result<sled::Db, StoreError> {
        // sled may panic on some damage rather than return an error: contain that here.
        let opened = std::panic::catch_unwind(|| {
            sled::Config::new()
                .path(path)
                .mode(sled::Mode::LowSpace)
                .cache_capacity(64 << 20)
                .flush_every_ms(None)
                .open()
        });
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
                    source: e,
                }),
                // Anything else sled reports while reading its own files is damage.
                _ => Err(StoreError::Damaged(format!("sled cannot open it: {e}"))),
            },
            Ok(Err(e)) => Err(StoreError::Damaged(format!("sled cannot open it: {e}"))),
            Err(_) => Err(StoreError::Damaged("sled failed while opening it".into())),
        }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
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
        for item in self.db.iter() {
            let (k, v) = item.map_err(engine)?;
            visit(&k, &v)?;
        }
        Ok(())
    }

    fn write(&self, writes: Writes) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (k, v) in writes {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        self.db.apply_batch(batch).map_err(engine)?;
        self.db.flush().map_err(engine)?;
        Ok(())
    }

    fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}
