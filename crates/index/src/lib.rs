//! fleetscope's merged index: every object of every cluster, keyed
//! (resource type, cluster, namespace, name), with label, owner and field indexes;
//! a global revision; an event log for resumable watches; and fan-out to subscribers.
//!
//! Entry points:
//! - [`Index::new`] with a [`Config`]; [`Index::apply`] takes one batch of [`Change`]s
//!   from the ingest and publishes it atomically: readers see all of it or none.
//!   [`Index::stage`] and [`Index::publish`] split the two, for an owner that makes a
//!   batch visible only once it is durable.
//! - [`Index::snapshot`]: a consistent [`State`] at one revision, free to take and to
//!   hold; [`State::page`] and [`State::count`] answer a [`Query`].
//! - [`Index::subscribe`]: a [`Feed`] of the events after a revision, then live ones,
//!   pulled from the log (bounded in events and bytes);
//!   [`transition`] turns an event into what a filtered subscriber sees.
//! - [`Index::pin`] / [`Index::pinned`]: snapshots kept for paging until their TTL.

mod feed;
mod object;
mod owners;
mod query;
mod restore;
mod state;
mod terms;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use fleetscope_model::{ClusterName, EventType, ObjectKey, ObjectState, PackedJson, Revision};
use tokio::sync::watch;

/// A hash set with a fast keyed hash.
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

pub use feed::{Feed, FeedError, Staged};
pub use fleetscope_model::GroupBy;
pub use object::{Object, ObjectRef, uid_and_resource_version};
pub use query::{Counts, Page, Query};
pub use restore::{EarlierEvents, Early, Restored, RestoredEvent, RestoredObject, RestoredRun};
pub use state::{Event, State};
pub use terms::MAX_INDEXED_LABELS;

/// Index settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// How many events the log keeps for resuming watches. Default 100,000.
    pub log_retention: usize,
    /// The most JSON bytes the log's events may hold (an object and, for a
    /// modification, its previous state). Default 256 MiB.
    pub log_bytes: usize,
    /// How many events a subscriber may fall behind before it is ended. Default 10,000.
    pub subscriber_buffer: usize,
    /// JSON paths with a field index (like client-go's `AddIndexers`), e.g. `spec.nodeName`.
    pub field_indexes: Vec<String>,
    /// How long a pinned snapshot is kept for paging after its last use. Default 5 minutes.
    pub page_ttl: Duration,
    /// The most snapshots pinned at once; pinning one more lets the least recently
    /// used go (its page tokens then expire). Default 256.
    pub max_pinned: usize,
    /// The most snapshots one owner (a caller) may have pinned at once. Default 32.
    pub max_pinned_per_owner: usize,
    /// Hold each object's JSON compressed (LZ4) against a dictionary of its resource
    /// type, made from the first object of that type, once the object has settled
    /// ([`Index::pack_settled`]): a fifth to a third of the memory for the JSON, at
    /// the cost of compressing each settled state once and decompressing each object
    /// read. A state is held as text until then. Default on.
    pub compress_objects: bool,
    /// How long a state stays unchanged before it is compressed: the engine's packer
    /// passes [`Index::pack_settled`] the revision the index had that long ago, or a
    /// tenth of that ago where the changes since were made by lists (see
    /// [`Index::listed_count`]). Default 10 seconds.
    pub compress_after: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            log_retention: 100_000,
            log_bytes: 256 << 20,
            subscriber_buffer: 10_000,
            field_indexes: Vec::new(),
            page_ttl: Duration::from_secs(300),
            max_pinned: 256,
            max_pinned_per_owner: 32,
            compress_objects: true,
            compress_after: Duration::from_secs(10),
        }
    }
}

/// One change from the ingest.
#[derive(Debug, Clone)]
pub enum Change {
    /// Create or replace one object.
    Upsert(ObjectState),
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
        objects: Vec<ObjectState>,
    },
    /// Objects arriving together (a part of a first list): each created, or replaced
    /// when already held, as [`Change::Upsert`] would; those not held go in at once,
    /// as a first list's do.
    Add(Vec<ObjectState>),
    /// Remove every object of a cluster.
    RemoveCluster(ClusterName),
    /// [`Change::Upsert`] by a watch event at a member resourceVersion: the object's
    /// stream reaches it (and its event carries it).
    UpsertAt(ObjectState, Arc<str>),
    /// [`Change::Delete`] by a watch event at a member resourceVersion.
    DeleteAt(ObjectKey, Arc<str>),
    /// A list of one resource type in one cluster at a member resourceVersion is
    /// complete (after its [`Change::Replace`] or [`Change::Add`]s): the stream
    /// reaches it, and the list's last event of this batch, if any, carries it.
    Reached {
        /// Canonical resource type name.
        resource: Arc<str>,
        /// The cluster.
        cluster: ClusterName,
        /// The list's resourceVersion.
        resource_version: Arc<str>,
    },
}

/// Where one stream of a subscriber at a member position starts
/// ([`Index::subscribe_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Its changes after `revision` follow, from the log and then live; those whose
    /// member resourceVersion is at or before `skip_to` the subscriber has already
    /// (it stood between two of the stream's changes, or ahead of this index).
    After {
        /// The revision after which the stream's changes follow.
        revision: Revision,
        /// The subscriber's own position, when it is not the one at `revision`.
        skip_to: Option<u64>,
    },
    /// Nothing held continues the stream exactly from the position: its history is
    /// gone (or was never here), so its current state must be sent anew.
    Reset,
}

/// A member resourceVersion as the number Kubernetes API servers give.
pub fn number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

/// One stream's walk through the log for [`Index::subscribe_at`].
struct Walk {
    wanted: u64,
    /// The last change at or before the wanted position, and its position.
    last: Option<(Revision, u64)>,
    /// Whether changes of no position of their own (a re-list's) follow it.
    listed_after: bool,
    /// Whether the cluster left this index after it: what this index held of it
    /// since is a fresh start, not a continuation.
    left_after: bool,
    /// Past the wanted position.
    done: bool,
}

impl Walk {
    fn new(wanted: u64) -> Self {
        Self {
            wanted,
            last: None,
            listed_after: false,
            left_after: false,
            done: false,
        }
    }

    fn step(&mut self, revision: Revision, position: Option<u64>, cluster_removed: bool) {
        if cluster_removed {
            self.left_after |= self.last.is_some();
            return;
        }
        if self.done {
            return;
        }
        match position {
            Some(x) if x <= self.wanted => {
                self.last = Some((revision, x));
                self.listed_after = false;
                self.left_after = false;
            }
            Some(_) => self.done = true,
            None => self.listed_after |= self.last.is_some(),
        }
    }

    fn start(&self) -> Start {
        if self.left_after {
            // Let go and taken up again since: the log does not carry the stream
            // from the position (what changed meanwhile, deletes included, is not in it).
            return Start::Reset;
        }
        match self.last {
            // Exactly at a change: what follows (a re-list's diff included) is exact.
            Some((revision, x)) if x == self.wanted => Start::After {
                revision,
                skip_to: None,
            },
            // Between two changes: exact unless a re-list's diff, made from the state
            // before the subscriber's position, comes before the next change.
            Some((revision, _)) if !self.listed_after => Start::After {
                revision,
                skip_to: Some(self.wanted),
            },
            _ => Start::Reset,
        }
    }
}

/// A stream of the index: (resource, cluster).
pub type StreamKey = (Arc<str>, ClusterName);

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

/// A registered subscriber: the state it starts from and its feed of the events after
/// its position (the retained ones it missed, then live ones).
pub struct Subscription {
    /// The published state at the moment of subscribing.
    pub snapshot: Arc<State>,
    /// The events after the requested revision (or after `snapshot`).
    pub feed: Feed,
}

/// The merged index. One writer (the ingest), many cheap readers. A batch is applied
/// ([`Index::stage`]) and made visible ([`Index::publish`]) in two steps, so that a
/// persisted index shows nothing before it is durable; [`Index::apply`] does both.
pub struct Index {
    config: Config,
    writer: Arc<Mutex<(State, terms::Interner)>>,
    published: feed::Shared,
    /// The thread building a restored index's secondary indexes, until joined.
    building: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A restore on a thread of its own ([`Index::restoring`]), while under way.
    restoring: restore::Restoring,
    head: watch::Sender<Revision>,
    pins: Mutex<HashMap<Revision, Pin>>,
    /// Where compressing settled objects is.
    sweep: Mutex<Sweep>,
    /// Object states compressed since the index was made, those restored compressed
    /// included.
    compressed: std::sync::atomic::AtomicU64,
    /// Changes staged from lists ([`Change::Replace`], [`Change::Add`]) since the
    /// index was made ([`Index::listed_count`]).
    listed: std::sync::atomic::AtomicU64,
    /// The dictionaries objects are compressed against, by resource type.
    dictionaries: Mutex<object::Dictionaries>,
}

/// A pass over the held objects that compresses those of a range of revisions.
#[derive(Debug, Default)]
struct Sweep {
    /// Every object whose revision is at most this was considered by a finished pass.
    swept: Revision,
    /// The pass under way: the revision it goes to, and the last key it considered.
    under_way: Option<(Revision, ObjectKey)>,
}

/// A snapshot kept for paging: by whom, and when it was last used.
struct Pin {
    state: Arc<State>,
    used: Instant,
    owner: Arc<str>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Index {
    /// An empty index at revision 0.
    pub fn new(config: Config) -> Self {
        Self::starting_after(config, Revision(0))
    }

    /// An empty index whose first change gets the revision after `revision`.
    pub fn starting_after(config: Config, revision: Revision) -> Self {
        let state = State {
            indexed_paths: Arc::new(config.field_indexes.clone()),
            revision,
            ..State::default()
        };
        let (head, _) = watch::channel(state.revision());
        let published = feed::Published::new(state.clone());
        Self {
            writer: Arc::new(Mutex::new((state, terms::Interner::default()))),
            building: Mutex::new(None),
            restoring: restore::Restoring::whole(),
            published: Arc::new(RwLock::new(published)),
            head,
            pins: Mutex::new(HashMap::new()),
            sweep: Mutex::default(),
            compressed: Default::default(),
            listed: Default::default(),
            dictionaries: Mutex::default(),
            config,
        }
    }

    /// Waits until a restored index's label, owner and field indexes are built and
    /// in use (at once for any other index).
    pub fn wait_for_indexes(&self) {
        self.restoring.wait();
        let handle = lock(&self.building).take();
        if let Some(handle) = handle
            && let Err(panic) = handle.join()
        {
            std::panic::resume_unwind(panic);
        }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Applies one batch and publishes it at once; returns the events it produced.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>) -> Vec<Arc<Event>> {
        let staged = self.stage(changes);
        let events = staged.events.clone();
        self.publish(staged);
        events
    }

    /// Applies one batch without making it visible: readers and subscribers see it
    /// once it is passed to [`Index::publish`]. Staged batches are published in the
    /// order they were staged.
    pub fn stage(&self, changes: impl IntoIterator<Item = Change>) -> Staged {
        // A change is applied to the secondary indexes too: they must be in first.
        self.wait_for_indexes();
        let mut writer = lock(&self.writer);
        let (state, interner) = &mut *writer;
        let mut events: Vec<Event> = Vec::new();
        let mut moved = false;
        let mut listed = 0;
        for change in changes {
            let (before, by_list) = (
                events.len(),
                matches!(change, Change::Replace { .. } | Change::Add(_)),
            );
            match change {
                Change::UpsertAt(mut input, rv) => {
                    input.key = interner.key(&input.key);
                    let stream = (input.key.resource.clone(), input.key.cluster.clone());
                    events.extend(state.upsert(input, interner).map(|e| e.at(rv.clone())));
                    moved |= state.reach(stream, rv);
                }
                Change::DeleteAt(key, rv) => {
                    let key = interner.key(&key);
                    let stream = (key.resource.clone(), key.cluster.clone());
                    events.extend(state.delete(&key).map(|e| e.at(rv.clone())));
                    moved |= state.reach(stream, rv);
                }
                Change::Reached {
                    resource,
                    cluster,
                    resource_version,
                } => {
                    if let Some(last) = events.iter_mut().rev().find(|e| {
                        *e.object.key.resource == *resource && e.object.key.cluster == cluster
                    }) && last.position.is_none()
                    {
                        last.position = Some(resource_version.clone());
                    }
                    moved |= state.reach((resource, cluster), resource_version);
                }
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
                } => replace(state, interner, &mut events, (&resource, &cluster), objects),
                Change::Add(objects) => add(state, interner, &mut events, objects),
                Change::RemoveCluster(cluster) => {
                    moved |= remove_cluster(state, &mut events, &cluster);
                }
            }
            if by_list {
                listed += events.len() - before;
            }
        }
        self.listed
            .fetch_add(listed as u64, std::sync::atomic::Ordering::Relaxed);
        let events: Vec<Arc<Event>> = events.into_iter().map(Arc::new).collect();
        if events.is_empty() && !moved {
            return Staged::default();
        }
        Staged {
            state: Some(Arc::new(state.clone())),
            events,
        }
    }

    /// Compresses (with [`Config::compress_objects`]) the held objects whose state
    /// has settled: those whose revision is at most `settled` and that no earlier pass
    /// considered. A pass goes through the published objects in key order, at most
    /// `most` of them per call, and resumes where the last call stopped; returns true
    /// once no object up to `settled` is left to consider. An object changed since
    /// has a newer revision, for a later pass: a state that changes within its first
    /// moments is never compressed, and compressing stays off the path of a sync (the
    /// caller decides what has settled: see [`Config::compress_after`]).
    pub fn pack_settled(&self, settled: Revision, most: usize) -> bool {
        self.restoring.wait();
        if !self.config.compress_objects {
            return true;
        }
        let mut sweep = lock(&self.sweep);
        let Sweep { swept, under_way } = &mut *sweep;
        let mut dictionaries = lock(&self.dictionaries);
        let state = self.snapshot();
        let (to, objects) = match under_way.take() {
            Some((to, last)) => (
                to,
                state.objects.range::<_, ObjectKey>((
                    std::ops::Bound::Excluded(&last),
                    std::ops::Bound::Unbounded,
                )),
            ),
            None if settled > *swept => (
                settled.min(state.revision()),
                state.objects.range::<_, ObjectKey>(..),
            ),
            None => return true,
        };
        let mut compressed = 0;
        let mut done = true;
        for (n, entry) in objects.enumerate() {
            let object = &entry.0;
            if object.revision > *swept && object.revision <= to && object.pack(&mut dictionaries) {
                compressed += 1;
            }
            if n + 1 == most {
                *under_way = Some((to, object.key.clone()));
                done = false;
                break;
            }
        }
        if done {
            *swept = to;
        }
        self.compressed
            .fetch_add(compressed, std::sync::atomic::Ordering::Relaxed);
        done
    }

    /// `object`'s JSON compressed against its type's dictionary, as a snapshot stores
    /// it (with [`Config::compress_objects`]): the form it is held in when it is held
    /// so, compressed now when it is held as text and compressing is worth it (it
    /// stays held as text until it settles). `None`: stored as text.
    pub fn packed_for_store(&self, object: &Object) -> Option<triomphe::Arc<PackedJson>> {
        if !self.config.compress_objects {
            return None;
        }
        if let Some(packed) = object.packed() {
            return Some(packed);
        }
        let text = object.json();
        let dictionary = lock(&self.dictionaries).of(&object.key.resource, &text)?;
        PackedJson::pack(&dictionary, &text).map(triomphe::Arc::new)
    }

    /// Object states compressed since the index was made ([`Index::pack_settled`]),
    /// and those a restored index was given compressed.
    pub fn compressed_count(&self) -> u64 {
        self.compressed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes made by lists ([`Change::Replace`], [`Change::Add`]: a first sync, a
    /// relist) since the index was made, staged ones included. Beside the revision, it
    /// tells how much of a stretch of changes came from lists: states a cluster has
    /// held for a while, rather than ones that just changed.
    pub fn listed_count(&self) -> u64 {
        self.listed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether anything of one resource type in one cluster is held, staged changes
    /// included.
    pub fn holds_any(&self, resource: &str, cluster: &ClusterName) -> bool {
        self.restoring.wait();
        let writer = lock(&self.writer);
        writer.0.holds_any(resource, cluster)
    }

    /// Makes staged batches visible: the state they reach, and their events to
    /// subscribers and the log. Events missing between what was published and these
    /// (dropped unpublished, as a failing store's backlog is) are a gap no watch can
    /// resume across: the log restarts after it, and subscribers behind it are ended.
    pub fn publish(&self, staged: Staged) {
        let Staged {
            state: Some(state),
            events,
        } = staged
        else {
            return;
        };
        let revision = state.revision();
        let mut p = feed::write(&self.published);
        if events.is_empty() && revision == p.state.revision() {
            // Only streams' positions moved: the same revision, newer positions.
            p.state = state;
            return;
        }
        if revision <= p.state.revision() {
            return;
        }
        let continues = events
            .first()
            .is_some_and(|e| e.revision.0 == p.state.revision().0 + 1);
        if !continues {
            p.log.clear();
            p.log_bytes = 0;
        }
        p.state = state;
        if events.len() > self.config.subscriber_buffer
            && let Some(first) = events.first()
        {
            p.oversized.push_back(first.revision);
            if p.oversized.len() > 64 {
                p.oversized.pop_front();
            }
        }
        for e in events {
            p.push(e);
        }
        p.trim(&self.config);
        drop(p);
        self.head.send_replace(revision);
    }

    /// What readers see, once a restore under way is over.
    fn published(&self) -> std::sync::RwLockReadGuard<'_, feed::Published> {
        self.restoring.wait();
        feed::read(&self.published)
    }

    /// The published state: consistent, at one revision, free to hold.
    pub fn snapshot(&self) -> Arc<State> {
        self.published().state.clone()
    }

    /// What readers see, once a restore under way is over and its retained events
    /// are in the log ([`Index::history_restored`] awaits the same).
    fn published_log(&self) -> std::sync::RwLockReadGuard<'_, feed::Published> {
        self.restoring.wait();
        self.restoring.wait_history();
        feed::read(&self.published)
    }

    /// The oldest revision a watch can resume from.
    pub fn oldest_resumable(&self) -> Revision {
        self.published_log().oldest_resumable()
    }

    /// The events and their JSON bytes the log holds.
    pub fn log_size(&self) -> (usize, usize) {
        let p = self.published_log();
        (p.log.len(), p.log_bytes)
    }

    /// Registers a subscriber from now (`None`) or after a revision.
    pub fn subscribe(&self, since: Option<Revision>) -> Result<Subscription, IndexError> {
        let p = self.published_log();
        let current = p.state.revision();
        let position = match since {
            None => current,
            Some(r) if r > current => {
                return Err(IndexError::Future {
                    requested: r,
                    current,
                });
            }
            Some(r) => {
                let oldest = p.oldest_resumable();
                if r < oldest {
                    return Err(IndexError::Expired {
                        requested: r,
                        oldest,
                    });
                }
                r
            }
        };
        Ok(self.subscription(&p, position))
    }

    /// A subscription to the published `p` from `since`: made under `p`'s read lock,
    /// so any publication after it sees the subscriber.
    fn subscription(&self, p: &feed::Published, since: Revision) -> Subscription {
        let head = self.head.subscribe();
        Subscription {
            snapshot: p.state.clone(),
            feed: Feed {
                published: self.published.clone(),
                head,
                reached: since,
                buffer: self.config.subscriber_buffer,
                caught_up: since >= p.state.revision(),
            },
        }
    }

    /// Registers a subscriber of one resource type that stands, in each of some
    /// clusters, at a member resourceVersion (as a Watch through a router does), and
    /// says where each of those streams starts: the changes after the position follow
    /// exactly when the log holds them (or nothing changed since), otherwise the
    /// stream must be sent anew ([`Start::Reset`]). Member resourceVersions are
    /// compared as the numbers every Kubernetes API server gives them; one that is
    /// not a number only matches itself.
    pub fn subscribe_at(
        &self,
        resource: &str,
        positions: &[(ClusterName, Arc<str>)],
    ) -> (Subscription, Vec<Start>) {
        let p = self.published_log();
        let current = p.state.revision();
        let mut walks: HashMap<&ClusterName, Walk> = HashMap::new();
        for (cluster, rv) in positions {
            if let Some(n) = number(rv) {
                walks.insert(cluster, Walk::new(n));
            }
        }
        if !walks.is_empty() {
            for e in &p.log {
                if *e.object.key.resource != *resource {
                    continue;
                }
                if let Some(w) = walks.get_mut(&e.object.key.cluster) {
                    w.step(
                        e.revision,
                        e.position.as_deref().and_then(number),
                        e.cluster_removed,
                    );
                }
            }
        }
        let starts: Vec<Start> = positions
            .iter()
            .map(|(cluster, rv)| {
                let held = p.state.position(resource, cluster);
                if held.is_some_and(|h| **h == **rv) {
                    return Start::After {
                        revision: current,
                        skip_to: None,
                    };
                }
                let Some(wanted) = number(rv) else {
                    return Start::Reset;
                };
                if held.and_then(|h| number(h)).is_some_and(|h| h < wanted) {
                    // The subscriber is ahead: what comes up to its position it has.
                    return Start::After {
                        revision: current,
                        skip_to: Some(wanted),
                    };
                }
                walks.get(cluster).map_or(Start::Reset, Walk::start)
            })
            .collect();
        let since = starts
            .iter()
            .filter_map(|s| match s {
                Start::After { revision, .. } => Some(*revision),
                Start::Reset => None,
            })
            .min()
            .unwrap_or(current);
        (self.subscription(&p, since), starts)
    }

    /// How many subscribers are registered.
    pub fn subscriber_count(&self) -> usize {
        self.head.receiver_count()
    }

    /// Keeps a snapshot for paging until `page_ttl` after its last use, for `owner`
    /// (a caller), within [`Config::max_pinned`] and [`Config::max_pinned_per_owner`]:
    /// past either, the least recently used pin (of that owner, or of all) goes.
    pub fn pin(&self, state: Arc<State>, owner: &str) {
        let now = Instant::now();
        let mut pins = lock(&self.pins);
        pins.retain(|_, p| now.duration_since(p.used) < self.config.page_ttl);
        if let Some(p) = pins.get_mut(&state.revision()) {
            p.used = now;
            return;
        }
        let oldest = |pins: &HashMap<Revision, Pin>, of: Option<&str>| {
            pins.iter()
                .filter(|(_, p)| of.is_none_or(|o| *p.owner == *o))
                .min_by_key(|(_, p)| p.used)
                .map(|(r, _)| *r)
        };
        while pins.values().filter(|p| *p.owner == *owner).count()
            >= self.config.max_pinned_per_owner.max(1)
        {
            let Some(r) = oldest(&pins, Some(owner)) else {
                break;
            };
            pins.remove(&r);
        }
        while pins.len() >= self.config.max_pinned.max(1) {
            let Some(r) = oldest(&pins, None) else { break };
            pins.remove(&r);
        }
        pins.insert(
            state.revision(),
            Pin {
                state,
                used: now,
                owner: Arc::from(owner),
            },
        );
    }

    /// Lets every pinned snapshot past its TTL go (run on a timer, so an abandoned
    /// first page does not hold its snapshot until the next List).
    pub fn expire_pins(&self) {
        let now = Instant::now();
        lock(&self.pins).retain(|_, p| now.duration_since(p.used) < self.config.page_ttl);
    }

    /// How many snapshots are pinned.
    pub fn pinned_count(&self) -> usize {
        lock(&self.pins).len()
    }

    /// A pinned snapshot, if it has not expired; using it extends its life.
    pub fn pinned(&self, revision: Revision) -> Option<Arc<State>> {
        self.restoring.wait();
        let now = Instant::now();
        let mut pins = lock(&self.pins);
        match pins.get_mut(&revision) {
            Some(p) if now.duration_since(p.used) < self.config.page_ttl => {
                p.used = now;
                Some(p.state.clone())
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

/// A whole list of `resource` in `cluster` in place of what is held of it: what it
/// no longer has deleted, the rest upserted (a first list added at once).
fn replace(
    state: &mut State,
    interner: &mut terms::Interner,
    events: &mut Vec<Event>,
    (resource, cluster): (&str, &ClusterName),
    objects: Vec<ObjectState>,
) {
    let mut objects: Vec<ObjectState> = objects
        .into_iter()
        .filter(|o| *o.key.resource == *resource && o.key.cluster == *cluster)
        .map(|mut o| {
            o.key = interner.key(&o.key);
            o
        })
        .collect();
    let held = state.keys_of(resource, cluster);
    if held.is_empty() {
        // A first list: nothing to diff against, added at once.
        in_key_order(&mut objects, |o| &o.key);
        state.add_new(objects, interner, events);
        return;
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

/// Objects arriving together: each new one added at once, each held one upserted.
fn add(
    state: &mut State,
    interner: &mut terms::Interner,
    events: &mut Vec<Event>,
    objects: Vec<ObjectState>,
) {
    let mut objects: Vec<ObjectState> = objects
        .into_iter()
        .map(|mut o| {
            o.key = interner.key(&o.key);
            o
        })
        .collect();
    // The last of one key wins, as upserts in order would have it.
    in_key_order(&mut objects, |o| &o.key);
    // Nothing held in their range (the parts of a first list, coming in order): all
    // new, without a lookup for each.
    let none_held = match (objects.first(), objects.last()) {
        (Some(first), Some(last)) => !state.holds_between(&first.key, &last.key),
        _ => true,
    };
    let (held, new): (Vec<ObjectState>, Vec<ObjectState>) = if none_held {
        (Vec::new(), objects)
    } else {
        objects
            .into_iter()
            .partition(|o| state.get(&o.key).is_some())
    };
    state.add_new(new, interner, events);
    for input in held {
        events.extend(state.upsert(input, interner));
    }
}

/// A cluster leaving: its streams' positions dropped and every object of it deleted
/// as the cluster's removal. Whether any position moved.
fn remove_cluster(state: &mut State, events: &mut Vec<Event>, cluster: &ClusterName) -> bool {
    let streams: Vec<_> = (state.positions.keys())
        .filter(|(_, c)| c == cluster)
        .cloned()
        .collect();
    let moved = !streams.is_empty();
    for stream in streams {
        state.positions.remove(&stream);
    }
    for resource in state.resources_of(cluster) {
        for key in state.keys_of(&resource, cluster) {
            events.extend(state.delete(&key).map(Event::removing_cluster));
        }
    }
    moved
}

#[cfg(test)]
mod tests;
