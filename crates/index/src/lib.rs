//! fleetscope's merged index: every object of every cluster, keyed
//! (resource type, cluster, namespace, name), with label, owner and field indexes;
//! a global revision; an event log for resumable watches; and fan-out to subscribers.
//!
//! Entry points:
//! - [`Index::new`] with a [`Config`]; [`Index::apply`] takes one batch of [`Change`]s
//!   from the ingest and publishes it atomically: readers see all of it or none.
//! - [`Index::snapshot`]: a consistent [`State`] at one revision, free to take and to
//!   hold; [`State::page`] and [`State::count`] answer a [`Query`].
//! - [`Index::subscribe`]: the events after a revision, then live ones;
//!   [`transition`] turns an event into what a filtered subscriber sees.
//! - [`Index::pin`] / [`Index::pinned`]: snapshots kept for paging until their TTL.

mod object;
mod owners;
mod query;
mod state;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use fleetscope_model::{ClusterName, EventType, ObjectKey, Revision};
use tokio::sync::broadcast;

/// A hash set with a fast keyed hash.
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

pub use object::{Object, ObjectInput, ObjectRef};
pub use query::{Counts, GroupBy, Page, Query};
pub use state::{Event, State};

/// Index settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// How many events the log keeps for resuming watches. Default 100,000.
    pub log_retention: usize,
    /// How many events a subscriber may fall behind before it is ended. Default 10,000.
    pub subscriber_buffer: usize,
    /// JSON paths with a field index (like client-go's `AddIndexers`), e.g. `spec.nodeName`.
    pub field_indexes: Vec<String>,
    /// How long a pinned snapshot is kept for paging after its last use. Default 5 minutes.
    pub page_ttl: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            log_retention: 100_000,
            subscriber_buffer: 10_000,
            field_indexes: Vec::new(),
            page_ttl: Duration::from_secs(300),
        }
    }
}

/// One change from the ingest.
#[derive(Debug, Clone)]
pub enum Change {
    /// Create or replace one object.
    Upsert(ObjectInput),
    /// Delete one object.
    Delete(ObjectKey),
    /// The complete set of one resource type in one cluster, as a (re-)list returns it.
    /// Diffed against what is held: objects gone become deletes, changed ones
    /// modifications, new ones creates; unchanged ones produce nothing.
    Replace {
        /// Canonical resource type name.
        resource: String,
        /// The cluster.
        cluster: ClusterName,
        /// Every object the list returned.
        objects: Vec<ObjectInput>,
    },
    /// Remove every object of a cluster.
    RemoveCluster(ClusterName),
}

/// Persisted state to rebuild an index from.
#[derive(Debug, Default)]
pub struct Restored {
    /// The revision to continue from.
    pub revision: Revision,
    /// Every object, with the revision of the change that produced it.
    pub objects: Vec<(ObjectInput, Revision)>,
    /// The retained event log, in revision order.
    pub events: Vec<RestoredEvent>,
}

/// One event of a persisted log.
#[derive(Debug)]
pub struct RestoredEvent {
    /// The event's revision.
    pub revision: Revision,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for a delete, its last state), with its revision.
    pub object: (ObjectInput, Revision),
    /// The object before the change, with its revision.
    pub prev: Option<(ObjectInput, Revision)>,
}

/// A watch cannot start from the revision asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The revision is older than the event log holds.
    #[error(
        "revision {requested} is older than the event log, which starts after revision {oldest}: list again and watch from the list's revision"
    )]
    Expired {
        /// The revision asked for.
        requested: Revision,
        /// The oldest revision a watch can resume from.
        oldest: Revision,
    },
    /// The revision is newer than any the index has applied.
    #[error(
        "revision {requested} is newer than the current revision {current}: list again and watch from the list's revision"
    )]
    Future {
        /// The revision asked for.
        requested: Revision,
        /// The current revision.
        current: Revision,
    },
}

/// A registered subscriber: the state it starts from, the retained events it missed,
/// then live events.
pub struct Subscription {
    /// The state at the moment of subscribing.
    pub snapshot: Arc<State>,
    /// Retained events after the requested revision, in order.
    pub backlog: Vec<Arc<Event>>,
    /// Live events after `snapshot`; a receiver that lags past the buffer gets `Lagged`.
    pub live: broadcast::Receiver<Arc<Event>>,
}

struct Published {
    state: Arc<State>,
    log: VecDeque<Arc<Event>>,
    /// First revisions of recent batches larger than a subscriber's buffer.
    oversized: VecDeque<Revision>,
}

/// The merged index. One writer (the ingest), many cheap readers.
pub struct Index {
    config: Config,
    writer: Mutex<(State, object::Interner)>,
    published: RwLock<Published>,
    events: broadcast::Sender<Arc<Event>>,
    pins: Mutex<HashMap<Revision, (Arc<State>, Instant)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Index {
    /// An empty index at revision 0.
    pub fn new(config: Config) -> Self {
        let state = State {
            indexed_paths: Arc::new(config.field_indexes.clone()),
            ..State::default()
        };
        let (events, _) = broadcast::channel(config.subscriber_buffer.max(1));
        Self {
            writer: Mutex::new((state.clone(), object::Interner::default())),
            published: RwLock::new(Published {
                state: Arc::new(state),
                log: VecDeque::new(),
                oversized: VecDeque::new(),
            }),
            events,
            pins: Mutex::new(HashMap::new()),
            config,
        }
    }

    /// An index rebuilt from persisted state: the objects as they were, each with the
    /// revision that produced it, the retained event log, and the revision to continue
    /// from. Nothing is published as new events.
    pub fn restore(config: Config, restored: Restored) -> Self {
        let mut interner = object::Interner::default();
        let mut state = State {
            indexed_paths: Arc::new(config.field_indexes.clone()),
            ..State::default()
        };
        let mut inputs = restored.objects;
        // A store gives its objects in key order, each once; anything else is put so.
        in_key_order(&mut inputs, |(input, _)| &input.key);
        state.restore_all(inputs.into_iter().map(|(input, revision)| {
            ObjectRef::new(Object::from_input(input, revision, &mut interner))
        }));
        let newest_object = state.objects.iter().map(|e| e.0.revision).max();
        state.revision = restored.revision.max(newest_object.unwrap_or_default());
        let mut log = VecDeque::with_capacity(restored.events.len());
        for e in restored.events {
            // An event whose state is the one held shares it.
            let held = state
                .get(&e.object.0.key)
                .filter(|o| o.revision == e.object.1)
                .cloned();
            let object = held.unwrap_or_else(|| {
                ObjectRef::new(Object::from_input(e.object.0, e.object.1, &mut interner))
            });
            let prev = e.prev.map(|(input, revision)| {
                ObjectRef::new(Object::from_input(input, revision, &mut interner))
            });
            log.push_back(Arc::new(Event {
                revision: e.revision,
                kind: e.kind,
                object,
                prev,
            }));
        }
        let excess = log.len().saturating_sub(config.log_retention);
        log.drain(..excess);
        let (events, _) = broadcast::channel(config.subscriber_buffer.max(1));
        Self {
            writer: Mutex::new((state.clone(), interner)),
            published: RwLock::new(Published {
                state: Arc::new(state),
                log,
                oversized: VecDeque::new(),
            }),
            events,
            pins: Mutex::new(HashMap::new()),
            config,
        }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Applies one batch and publishes it atomically; returns the events it produced.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>) -> Vec<Arc<Event>> {
        let mut writer = lock(&self.writer);
        let (state, interner) = &mut *writer;
        let mut events = Vec::new();
        for change in changes {
            match change {
                Change::Upsert(mut input) => {
                    // A shared location makes every key comparison on the way cheap.
                    input.key = interner.key(&input.key);
                    events.extend(state.upsert(input, interner));
                }
                Change::Delete(key) => events.extend(state.delete(&interner.key(&key))),
                Change::Replace {
                    resource,
                    cluster,
                    objects,
                } => {
                    let mut objects: Vec<ObjectInput> = objects
                        .into_iter()
                        .filter(|o| *o.key.resource == *resource && o.key.cluster == cluster)
                        .map(|mut o| {
                            o.key = interner.key(&o.key);
                            o
                        })
                        .collect();
                    let held = state.keys_of(&resource, &cluster);
                    if held.is_empty() {
                        // A first list: nothing to diff against, added at once.
                        in_key_order(&mut objects, |o| &o.key);
                        state.add_new(objects, interner, &mut events);
                        continue;
                    }
                    let listed: HashSet<&ObjectKey> = objects.iter().map(|o| &o.key).collect();
                    for key in held {
                        if !listed.contains(&key) {
                            events.extend(state.delete(&key));
                        }
                    }
                    for input in objects {
                        events.extend(state.upsert(input, interner));
                    }
                }
                Change::RemoveCluster(cluster) => {
                    for resource in state.resources_of(&cluster) {
                        for key in state.keys_of(&resource, &cluster) {
                            events.extend(state.delete(&key));
                        }
                    }
                }
            }
        }
        let events: Vec<Arc<Event>> = events.into_iter().map(Arc::new).collect();
        if events.is_empty() {
            return events;
        }
        let snapshot = Arc::new(state.clone());
        drop(writer);
        let mut published = self.published.write().unwrap_or_else(|e| e.into_inner());
        published.state = snapshot;
        if events.len() > self.config.subscriber_buffer {
            published.oversized.push_back(events[0].revision);
            if published.oversized.len() > 64 {
                published.oversized.pop_front();
            }
        }
        for e in &events {
            published.log.push_back(e.clone());
            // Sent under the lock, so a subscriber registering under the read lock misses nothing.
            let _ = self.events.send(e.clone());
        }
        let excess = published
            .log
            .len()
            .saturating_sub(self.config.log_retention);
        published.log.drain(..excess);
        events
    }

    /// The current state: consistent, at one revision, free to hold.
    pub fn snapshot(&self) -> Arc<State> {
        self.published
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .state
            .clone()
    }

    /// The oldest revision a watch can resume from.
    pub fn oldest_resumable(&self) -> Revision {
        let p = self.published.read().unwrap_or_else(|e| e.into_inner());
        p.log
            .front()
            .map_or(p.state.revision(), |e| Revision(e.revision.0 - 1))
    }

    /// Registers a subscriber from now (`None`) or after a revision.
    pub fn subscribe(&self, since: Option<Revision>) -> Result<Subscription, IndexError> {
        let p = self.published.read().unwrap_or_else(|e| e.into_inner());
        let live = self.events.subscribe();
        let current = p.state.revision();
        let backlog = match since {
            None => Vec::new(),
            Some(r) if r > current => {
                return Err(IndexError::Future {
                    requested: r,
                    current,
                });
            }
            Some(r) => {
                let oldest = p
                    .log
                    .front()
                    .map_or(current, |e| Revision(e.revision.0 - 1));
                if r < oldest {
                    return Err(IndexError::Expired {
                        requested: r,
                        oldest,
                    });
                }
                let skip = p.log.partition_point(|e| e.revision <= r);
                p.log.iter().skip(skip).cloned().collect()
            }
        };
        Ok(Subscription {
            snapshot: p.state.clone(),
            backlog,
            live,
        })
    }

    /// Whether a batch larger than a subscriber's buffer was published after `revision`:
    /// a subscriber that lagged across it did not fall behind by its own slowness, and
    /// may catch up from the event log instead of being ended.
    pub fn oversized_since(&self, revision: Revision) -> bool {
        let p = self.published.read().unwrap_or_else(|e| e.into_inner());
        p.oversized.iter().any(|r| *r > revision)
    }

    /// How many subscribers are registered.
    pub fn subscriber_count(&self) -> usize {
        self.events.receiver_count()
    }

    /// Keeps a snapshot for paging until `page_ttl` after its last use.
    pub fn pin(&self, state: Arc<State>) {
        let now = Instant::now();
        let mut pins = lock(&self.pins);
        pins.retain(|_, (_, used)| now.duration_since(*used) < self.config.page_ttl);
        pins.insert(state.revision(), (state, now));
    }

    /// A pinned snapshot, if it has not expired; using it extends its life.
    pub fn pinned(&self, revision: Revision) -> Option<Arc<State>> {
        let now = Instant::now();
        let mut pins = lock(&self.pins);
        match pins.get_mut(&revision) {
            Some((state, used)) if now.duration_since(*used) < self.config.page_ttl => {
                *used = now;
                Some(state.clone())
            }
            Some(_) => {
                pins.remove(&revision);
                None
            }
            None => None,
        }
    }
}

/// What a subscriber with `query` sees of an event: filters apply to transitions, so
/// an object that stops matching is `Deleted` and one that starts matching is `Added`.
pub fn transition(query: &Query, event: &Event) -> Option<EventType> {
    let now = query.matches(&event.object);
    let before = event.prev.as_ref().is_some_and(|p| query.matches(p));
    match (event.kind, before, now) {
        (EventType::Added, _, true) => Some(EventType::Added),
        (EventType::Modified, true, true) => Some(EventType::Modified),
        (EventType::Modified, false, true) => Some(EventType::Added),
        (EventType::Modified, true, false) => Some(EventType::Deleted),
        (EventType::Deleted, b, n) if b || n => Some(EventType::Deleted),
        _ => None,
    }
}

/// Puts items in key order, each key once: the last of equal keys wins, as if they
/// were applied in order.
fn in_key_order<T>(items: &mut Vec<T>, key: impl Fn(&T) -> &ObjectKey) {
    if items.windows(2).all(|w| key(&w[0]) < key(&w[1])) {
        return;
    }
    items.sort_by(|a, b| key(a).cmp(key(b)));
    items.reverse();
    items.dedup_by(|a, b| key(a) == key(b));
    items.reverse();
}

#[cfg(test)]
mod tests;
