//! Publication and fan-out. What readers see is the published state and the event log
//! behind it; a batch the writer has applied is staged until its owner publishes it
//! (after it is durable, when the index is persisted). Subscribers pull from the log
//! by revision, woken by a watch of the published revision: the log is the one place
//! events are held, so its bounds (events and bytes) bound what fan-out costs, however
//! many subscribers there are and however slow.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use fleetscope_model::Revision;
use tokio::sync::watch;

use crate::Config;
use crate::state::{Event, State};

/// What readers see: the published state and the retained events up to it.
pub(crate) struct Published {
    pub(crate) state: Arc<State>,
    pub(crate) log: VecDeque<Arc<Event>>,
    /// JSON bytes the log's events carry.
    pub(crate) log_bytes: usize,
    /// First revisions of recent batches larger than a subscriber's buffer.
    pub(crate) oversized: VecDeque<Revision>,
}

impl Published {
    pub(crate) fn new(state: State) -> Self {
        Self {
            state: Arc::new(state),
            log: VecDeque::new(),
            log_bytes: 0,
            oversized: VecDeque::new(),
        }
    }

    /// The oldest revision a watch can resume from.
    pub(crate) fn oldest_resumable(&self) -> Revision {
        self.log
            .front()
            .map_or(self.state.revision(), |e| Revision(e.revision.0 - 1))
    }

    pub(crate) fn push(&mut self, event: Arc<Event>) {
        self.log_bytes += event.json_bytes();
        self.log.push_back(event);
    }

    /// Drops the oldest events past the log's length or size.
    pub(crate) fn trim(&mut self, config: &Config) {
        while self.log.len() > config.log_retention || self.log_bytes > config.log_bytes {
            match self.log.pop_front() {
                Some(e) => self.log_bytes -= e.json_bytes(),
                None => break,
            }
        }
    }
}

/// Shared between the index and its subscribers' feeds.
pub(crate) type Shared = Arc<RwLock<Published>>;

pub(crate) fn read(p: &Shared) -> RwLockReadGuard<'_, Published> {
    p.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn write(p: &Shared) -> RwLockWriteGuard<'_, Published> {
    p.write().unwrap_or_else(|e| e.into_inner())
}

/// A batch applied by the writer and not yet visible: its state and events, to be
/// published (in order) by [`crate::Index::publish`]. Consecutive staged batches merge.
#[derive(Default)]
pub struct Staged {
    /// The state after the batch; `None` when it changed nothing.
    pub state: Option<Arc<State>>,
    /// The events it produced, in revision order.
    pub events: Vec<Arc<Event>>,
}

impl Staged {
    /// The revision the batch brings the index to, if it changed anything.
    pub fn revision(&self) -> Option<Revision> {
        self.state.as_ref().map(|s| s.revision())
    }

    /// Appends a later batch: its events follow, its state supersedes.
    pub fn then(&mut self, later: Staged) {
        if later.state.is_some() {
            self.state = later.state;
        }
        self.events.extend(later.events);
    }

    /// Whether there is nothing to publish.
    pub fn is_empty(&self) -> bool {
        self.state.is_none()
    }
}

/// Why a feed stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    /// The subscriber fell further behind than its buffer allows.
    #[error(
        "the subscriber fell {missed} events behind and was ended; last delivered revision {reached}: resume with since_revision={reached}"
    )]
    Behind {
        /// The last revision it was given.
        reached: Revision,
        /// How many events it was behind.
        missed: u64,
    },
    /// The events after its position are no longer held.
    #[error(
        "the events after revision {reached} are no longer held (the log starts after revision {oldest}): list again and watch from the list's revision"
    )]
    Expired {
        /// The last revision it was given.
        reached: Revision,
        /// The oldest revision a watch can resume from now.
        oldest: Revision,
    },
    /// The index is gone.
    #[error("the index was shut down")]
    Closed,
}

/// One subscriber's view of the published events, from a position on.
pub struct Feed {
    pub(crate) published: Shared,
    pub(crate) head: watch::Receiver<Revision>,
    pub(crate) reached: Revision,
    pub(crate) buffer: usize,
    /// Set once the feed has reached the head: from then on, falling more than
    /// `buffer` behind ends it (a backlog being caught up does not).
    pub(crate) caught_up: bool,
}

/// Most events one pull hands over.
const PULL: usize = 256;

impl Feed {
    /// The revision of the last event handed over (or the starting position).
    pub fn reached(&self) -> Revision {
        self.reached
    }

    /// The next events, waiting for some to be published.
    pub async fn next(&mut self) -> Result<Vec<Arc<Event>>, FeedError> {
        loop {
            let events = self.try_next()?;
            if !events.is_empty() {
                return Ok(events);
            }
            // A publication after the pull above has changed the value since it was
            // last seen, so this returns at once: no wake-up is lost.
            self.head.changed().await.map_err(|_| FeedError::Closed)?;
        }
    }

    /// The next events published, without waiting (empty when caught up).
    pub fn try_next(&mut self) -> Result<Vec<Arc<Event>>, FeedError> {
        let p = read(&self.published);
        let head = p.state.revision();
        if head <= self.reached {
            self.caught_up = true;
            return Ok(Vec::new());
        }
        let oldest = p.oldest_resumable();
        if self.reached < oldest {
            return Err(FeedError::Expired {
                reached: self.reached,
                oldest,
            });
        }
        let missed = head.0 - self.reached.0;
        if self.caught_up
            && missed > self.buffer as u64
            && !p.oversized.iter().any(|r| *r > self.reached)
        {
            return Err(FeedError::Behind {
                reached: self.reached,
                missed,
            });
        }
        let skip = p.log.partition_point(|e| e.revision <= self.reached);
        let events: Vec<Arc<Event>> = p.log.iter().skip(skip).take(PULL).cloned().collect();
        if let Some(last) = events.last() {
            self.reached = last.revision;
        } else {
            // Published with no event retained after the position: nothing to hand over.
            self.reached = head;
        }
        if self.reached >= head {
            self.caught_up = true;
        }
        Ok(events)
    }
}
