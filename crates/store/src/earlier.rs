//! The retained events at or before a store's snapshot: read and verified at load
//! (checksum, layout, revisions in sequence), decoded only when asked. A restart
//! needs them only for the watches that resume from before the snapshot, which it
//! makes after the objects answer; the change log after the snapshot is decoded at
//! once, since the objects are made from it.

use crate::codec::{self, Skimmed};
use crate::{EventRecord, StoreError};

/// One change log record, verified but not decoded.
pub(crate) struct Held {
    pub(crate) skimmed: Skimmed,
    record: Vec<u8>,
}

impl Held {
    pub(crate) fn new(skimmed: Skimmed, record: Vec<u8>) -> Self {
        Self { skimmed, record }
    }

    /// Its events, decoded.
    pub(crate) fn decode(&self) -> Result<Vec<EventRecord>, StoreError> {
        codec::decode_events(&self.record).map_err(|e| damaged_record(self.skimmed.first, &e))
    }
}

/// The damage of the change log record keyed by revision `first`.
pub(crate) fn damaged_record(first: u64, e: &codec::DecodeError) -> StoreError {
    StoreError::Damaged(format!("event record at revision {first}: {e}"))
}

/// The retained events at or before the snapshot, oldest first, not yet decoded.
#[derive(Default)]
pub struct EarlierEvents(pub(crate) Vec<Held>);

impl EarlierEvents {
    /// How many events they are.
    pub fn len(&self) -> usize {
        self.0.iter().map(|h| h.skimmed.events).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The newest `keep` of them (all, if fewer), decoded, oldest first; records
    /// holding only older ones are not decoded.
    pub fn decode_newest(&self, keep: usize) -> Result<Vec<EventRecord>, StoreError> {
        let mut from = self.0.len();
        let mut held = 0;
        while from > 0 && held < keep {
            from -= 1;
            held += self.0[from].skimmed.events;
        }
        let mut events = Vec::with_capacity(held);
        for record in &self.0[from..] {
            events.extend(record.decode()?);
        }
        events.drain(..events.len().saturating_sub(keep));
        Ok(events)
    }
}

impl std::fmt::Debug for EarlierEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlierEvents")
            .field("records", &self.0.len())
            .field("events", &self.len())
            .finish()
    }
}
