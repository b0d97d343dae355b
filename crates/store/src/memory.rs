//! The store in memory: the same records and verification, for tests, with a switch
//! that makes every write fail as a full disk would.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{Store, StoreError, Visit, Writes};

/// A store held in memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    fail_writes: AtomicBool,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// While set, every write fails and changes nothing.
    pub fn fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::SeqCst);
    }

    /// Replaces one record's bytes, to test verification.
    pub fn overwrite_raw(&self, key: &[u8], value: Vec<u8>) {
        self.lock().insert(key.to_vec(), value);
    }

    /// One record's bytes as held.
    pub fn raw(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().get(key).cloned()
    }

    /// Every key held, in order.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for MemoryStore {
    fn scan(&self, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        for (k, v) in self.lock().iter() {
            visit(k, v)?;
        }
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }

    fn write(&self, writes: Writes) -> Result<(), StoreError> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(StoreError::Engine(
                "No space left on device (os error 28)".into(),
            ));
        }
        let mut records = self.lock();
        for (k, v) in writes {
            match v {
                Some(v) => records.insert(k, v),
                None => records.remove(&k),
            };
        }
        Ok(())
    }

    fn size_on_disk(&self) -> u64 {
        0
    }
}
