//! An index rebuilt from persisted state: what a store gives, and how the index is
//! made of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use fleetscope_model::{EventType, ObjectKey, ObjectState, PackedJson, Revision, StoredRun};
use tokio::sync::watch;

use crate::state::{self, Event, State};
use crate::{Config, Index, Object, ObjectRef, StreamKey, feed, in_key_order, lock, object, terms};

/// Persisted state to rebuild an index from.
#[derive(Default)]
pub struct Restored {
    /// The revision to continue from.
    pub revision: Revision,
    /// Every object, with the revision of the change that produced it, in runs.
    pub objects: Vec<RestoredRun>,
    /// The retained event log, in revision order.
    pub events: Vec<RestoredEvent>,
    /// Retained events older than `events`, read only once the objects answer (and
    /// only as many as the log keeps).
    pub earlier: Option<EarlierEvents>,
    /// Where each stream stood: (resource, cluster) and the member resourceVersion
    /// its watch resumes from.
    pub positions: Vec<(StreamKey, Arc<str>)>,
}

impl std::fmt::Debug for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Restored")
            .field("revision", &self.revision)
            .field("objects", &self.objects)
            .field("events", &self.events)
            .field("earlier", &self.earlier.is_some())
            .field("positions", &self.positions)
            .finish()
    }
}

/// Reads the newest of a restore's earlier retained events, as many as it is given
/// (fewer if there are fewer), oldest first.
pub type EarlierEvents = Box<dyn FnOnce(usize) -> Vec<RestoredEvent> + Send>;

/// A run of persisted objects.
#[derive(Debug)]
pub enum RestoredRun {
    /// Objects one by one.
    Objects(Vec<RestoredObject>),
    /// Objects as a store verified and holds them (a snapshot's chunk), read in place
    /// as they are made.
    Stored(Box<dyn StoredRun>),
}

/// One object of persisted state.
#[derive(Debug)]
pub struct RestoredObject {
    /// Its state; `state.json` is not read when `packed` is given.
    pub state: ObjectState,
    /// The revision of the change that produced it.
    pub revision: Revision,
    /// Its JSON compressed against its type's dictionary, as a snapshot stored it.
    pub packed: Option<triomphe::Arc<PackedJson>>,
}

impl From<(ObjectState, Revision)> for RestoredObject {
    /// An object whose JSON is its state's text.
    fn from((state, revision): (ObjectState, Revision)) -> Self {
        Self {
            state,
            revision,
            packed: None,
        }
    }
}

/// One event of a persisted log.
#[derive(Debug)]
pub struct RestoredEvent {
    /// The event's revision.
    pub revision: Revision,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for a delete, its last state), with its revision.
    pub object: (ObjectState, Revision),
    /// The object before the change, with its revision.
    pub prev: Option<(ObjectState, Revision)>,
}

/// Builds the label, owner and field indexes of a restored index's `objects` and
/// installs them into the writer's state and the published one: both hold those same
/// objects, as nothing is staged before the build is joined.
fn install_secondary(
    objects: &state::KeySet,
    writer: &Mutex<(State, terms::Interner)>,
    published: &feed::Shared,
) {
    let secondary = state::Secondary::of(objects);
    lock(writer).0.install(&secondary);
    let mut p = feed::write(published);
    let mut state = (*p.state).clone();
    state.install(&secondary);
    p.state = Arc::new(state);
}

/// The objects a restore still under way has made so far: every object up to
/// `through`, in key order, is in `state`; what follows it may not be yet.
#[derive(Clone)]
pub struct Early {
    /// A state holding the objects made so far, at the revision the restore
    /// continues from; its label, owner and field indexes are not built (it scans).
    pub state: Arc<State>,
    /// The last key of the made prefix.
    pub through: ObjectKey,
    /// Which of the prefixes offered this is (they grow).
    number: u64,
}

impl std::fmt::Debug for Early {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Early")
            .field("revision", &self.state.revision())
            .field("objects", &self.state.len())
            .field("through", &self.through)
            .finish()
    }
}

/// How far a restore made on a thread of its own ([`Index::restoring`]) is.
pub(crate) struct Restoring {
    /// Set while the restore is under way, and after one that failed: every call
    /// that reads the index waits, and then fails if it did.
    under_way: AtomicBool,
    /// The latest prefix made, and the callers answered from it (their next pages
    /// read the whole index at the same revision, pinned for them once it is in).
    early: Mutex<(Option<Early>, Vec<Arc<str>>)>,
    outcome: Mutex<Outcome>,
    finished: Condvar,
    /// How far it is, for waiting without a thread.
    phase: watch::Sender<Phase>,
    /// Whether the retained events are still being made, after the objects: until
    /// they are in, the log holds only the events after the restored revision, and
    /// every call that reads the log waits.
    history: Mutex<bool>,
    history_in: Condvar,
    /// The same, for waiting without a thread.
    history_phase: watch::Sender<bool>,
}

/// How far a restore is, as it is awaited.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Nothing made yet.
    Starting,
    /// Objects made, offered as the prefix of this number ([`Index::early`]).
    Made(u64),
    /// Over: every object made (or the restore failed).
    Over,
}

/// The retained events of a restore being made ([`Restoring::hold_history`]): the log
/// is whole again once this drops.
pub(crate) struct HistoryHeld<'a>(&'a Restoring);

impl Drop for HistoryHeld<'_> {
    fn drop(&mut self) {
        *lock(&self.0.history) = false;
        self.0.history_in.notify_all();
        self.0.history_phase.send_replace(false);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    UnderWay,
    Whole,
    Failed,
}

impl Restoring {
    /// Nothing under way: the index is whole from the start.
    pub(crate) fn whole() -> Self {
        Self {
            under_way: AtomicBool::new(false),
            early: Mutex::default(),
            outcome: Mutex::new(Outcome::Whole),
            finished: Condvar::new(),
            phase: watch::Sender::new(Phase::Over),
            history: Mutex::new(false),
            history_in: Condvar::new(),
            history_phase: watch::Sender::new(false),
        }
    }

    /// Marks the retained events as being made: reads of the log wait until the
    /// guard is dropped (made or not).
    pub(crate) fn hold_history(&self) -> HistoryHeld<'_> {
        *lock(&self.history) = true;
        self.history_phase.send_replace(true);
        HistoryHeld(self)
    }

    /// Blocks until the retained events of a restore are in the log.
    pub(crate) fn wait_history(&self) {
        let mut pending = lock(&self.history);
        while *pending {
            pending = self
                .history_in
                .wait(pending)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn begin(&self) {
        *lock(&self.outcome) = Outcome::UnderWay;
        self.phase.send_replace(Phase::Starting);
        self.under_way.store(true, Ordering::Release);
    }

    /// Makes `early` the latest prefix, numbered after the one before.
    fn offer(&self, mut early: Early) {
        let mut held = lock(&self.early);
        early.number = held.0.as_ref().map_or(1, |before| before.number + 1);
        let number = early.number;
        held.0 = Some(early);
        drop(held);
        self.phase.send_replace(Phase::Made(number));
    }

    /// Ends the restore: callers answered early, to pin the whole state for.
    fn end(&self, outcome: Outcome) -> Vec<Arc<str>> {
        let owners = {
            let mut early = lock(&self.early);
            early.0 = None;
            std::mem::take(&mut early.1)
        };
        *lock(&self.outcome) = outcome;
        // A failed restore leaves the index unmade: every wait goes on to fail.
        if outcome == Outcome::Whole {
            self.under_way.store(false, Ordering::Release);
        }
        self.finished.notify_all();
        self.phase.send_replace(Phase::Over);
        owners
    }

    /// Blocks until the restore is over; a failed one is raised here.
    pub(crate) fn wait(&self) {
        if !self.under_way.load(Ordering::Acquire) {
            return;
        }
        let mut outcome = lock(&self.outcome);
        while *outcome == Outcome::UnderWay {
            outcome = self
                .finished
                .wait(outcome)
                .unwrap_or_else(|e| e.into_inner());
        }
        assert!(
            *outcome == Outcome::Whole,
            "the index could not be restored: its restore thread failed"
        );
    }
}

/// An index made of persisted state, not yet installed.
struct Built {
    state: State,
    interner: terms::Interner,
    /// The retained events, made once the objects answer (the earlier ones read
    /// then).
    events: Vec<RestoredEvent>,
    earlier: Option<EarlierEvents>,
    dictionaries: object::Dictionaries,
    compressed: u64,
}

/// Makes an index of persisted state, offering each prefix it has made in key order
/// to `early` as it goes.
fn build(config: &Config, restored: Restored, early: &(dyn Fn(Early) + Sync)) -> Built {
    let paths = Arc::new(config.field_indexes.clone());
    let mut state = State {
        indexed_paths: paths.clone(),
        ..State::default()
    };
    // Made on two threads, each taking a run of them at a time and sharing what
    // they repeat through an interner of its own.
    let runs = Mutex::new(in_runs(restored.objects).into_iter().enumerate());
    let mut makers = object::Maker::pair(config.compress_objects);
    let [first, second] = &mut makers;
    let offer = |objects: &state::KeySet, through: &ObjectKey| {
        early(Early {
            state: Arc::new(State {
                revision: restored.revision,
                objects: objects.clone(),
                indexed_paths: paths.clone(),
                building: true,
                ..State::default()
            }),
            through: through.clone(),
            number: 0,
        });
    };
    state.restore_primary(made_by(first, &runs), made_by(second, &runs), &offer);
    let [mut maker, other] = makers;
    maker.absorb(other);
    let object::Maker {
        interner,
        dictionaries,
        compressed,
        newest,
        ..
    } = maker;
    state.revision = restored.revision.max(newest);
    for (stream, rv) in restored.positions {
        state.reach(stream, rv);
    }
    // Those the log would drop at once are not made, nor read.
    let mut events = restored.events;
    events.drain(..events.len().saturating_sub(config.log_retention));
    let earlier = restored
        .earlier
        .filter(|_| events.len() < config.log_retention);
    Built {
        state,
        interner,
        events,
        earlier,
        dictionaries,
        compressed,
    }
}

impl Index {
    /// An index rebuilt from persisted state: the objects as they were, each with the
    /// revision that produced it, the retained event log, each stream's position, and
    /// the revision to continue from. Nothing is published as new events.
    ///
    /// It answers once the objects are in their primary order; the label, owner and
    /// field indexes are built on a thread of their own meanwhile (queries scan until
    /// they are in), and the first change staged waits for them.
    pub fn restore(config: Config, restored: Restored) -> Self {
        let index = Self::starting_after(config, restored.revision);
        let built = build(&index.config, restored, &|_| {});
        index.install(built);
        index
    }

    /// [`Index::restore`] on a thread of its own: returned at once, the index makes
    /// its objects meanwhile. Every call that reads or changes it waits until they are
    /// all made ([`Index::restored`] waits without a thread), except
    /// [`Index::early`], which gives the prefix made so far.
    pub fn restoring(config: Config, restored: Restored) -> Arc<Self> {
        let index = Arc::new(Self::starting_after(config, restored.revision));
        index.restoring.begin();
        let work = Arc::new(Mutex::new(Some(restored)));
        let run = {
            let (index, work) = (index.clone(), work.clone());
            move || {
                let Some(restored) = lock(&work).take() else {
                    return;
                };
                let offer = |early| index.restoring.offer(early);
                let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    build(&index.config, restored, &offer)
                }));
                match made {
                    Ok(built) => index.install(built),
                    Err(panic) => {
                        index.restoring.end(Outcome::Failed);
                        std::panic::resume_unwind(panic);
                    }
                }
            }
        };
        if std::thread::Builder::new()
            .name("index-restore".into())
            .spawn(run)
            .is_err()
        {
            // No thread to be had: made here, before it is returned.
            if let Some(restored) = lock(&work).take() {
                let built = build(&index.config, restored, &|_| {});
                index.install(built);
            }
        }
        index
    }

    /// While a restore is under way ([`Index::restoring`]), the objects made so far,
    /// for an answer that lies within them; a page's `owner` (the caller) gets the
    /// whole index pinned at the same revision once it is in, for the pages that
    /// follow. `None` once the restore is over (or before it has made anything).
    pub fn early(&self, owner: Option<&str>) -> Option<Early> {
        if !self.restoring.under_way.load(Ordering::Acquire) {
            return None;
        }
        let mut early = lock(&self.restoring.early);
        let made = early.0.clone()?;
        if let Some(owner) = owner
            && !early.1.iter().any(|o| **o == *owner)
        {
            early.1.push(Arc::from(owner));
        }
        Some(made)
    }

    /// Resolves once every object is made (at once unless [`Index::restoring`]).
    pub async fn restored(&self) {
        self.reached(Phase::Over).await;
    }

    /// Resolves once a restore's retained events are in the log too (at once unless
    /// one is under way): what reading the log ([`Index::subscribe`]) waits for.
    pub async fn history_restored(&self) {
        self.restored().await;
        let mut pending = self.restoring.history_phase.subscribe();
        // The sender lives as long as the index: `wait_for` ends there.
        let _ = pending.wait_for(|pending| !*pending).await;
    }

    /// Resolves once a restore under way has made its first objects (for
    /// [`Index::early`]) or is over.
    pub async fn made_some(&self) {
        self.reached(Phase::Made(1)).await;
    }

    /// Resolves once a restore under way has made more than `early` holds, or is over.
    pub async fn made_more(&self, early: &Early) {
        self.reached(Phase::Made(early.number + 1)).await;
    }

    async fn reached(&self, phase: Phase) {
        let mut now = self.restoring.phase.subscribe();
        // The sender lives as long as the index: `wait_for` ends there.
        let _ = now.wait_for(|now| *now >= phase).await;
    }

    /// Whether every object is made (always, unless [`Index::restoring`] is under way
    /// or failed).
    pub fn is_restored(&self) -> bool {
        !self.restoring.under_way.load(Ordering::Acquire)
    }

    /// Whether the retained events are in the log too (see [`Index::history_restored`]).
    pub fn is_history_restored(&self) -> bool {
        self.is_restored() && !*self.restoring.history_phase.borrow()
    }

    /// Makes `built` the index's state and log, starts building its secondary
    /// indexes, and ends a restore under way.
    fn install(&self, built: Built) {
        let Built {
            state,
            interner,
            mut events,
            earlier,
            dictionaries,
            compressed,
        } = built;
        let revision = state.revision();
        let objects = state.objects.clone();
        let published = feed::Published::new(state.clone());
        let whole = published.state.clone();
        *lock(&self.writer) = (state, interner);
        *feed::write(&self.published) = published;
        *lock(&self.dictionaries) = dictionaries;
        self.compressed.store(compressed, Ordering::Relaxed);
        self.head.send_replace(revision);
        let (writer, shared) = (self.writer.clone(), self.published.clone());
        let on_thread = objects.clone();
        match std::thread::Builder::new()
            .name("index-build".into())
            .spawn(move || install_secondary(&on_thread, &writer, &shared))
        {
            Ok(handle) => *lock(&self.building) = Some(handle),
            // No thread to be had: built here, before the index answers.
            Err(_) => install_secondary(&objects, &self.writer, &self.published),
        }
        // Reads of the log wait for the retained events from here: none reads it
        // before they are in.
        let history = self.restoring.hold_history();
        for owner in self.restoring.end(Outcome::Whole) {
            self.pin(whole.clone(), &owner);
        }
        // The objects answer, and changes are taken, while the events are read and
        // made.
        if let Some(read) = earlier {
            let mut all = read(self.config.log_retention - events.len());
            all.append(&mut events);
            events = all;
        }
        self.restore_history(events, &whole);
        drop(history);
    }

    /// Makes a restore's retained `events` and puts them in the log before those
    /// published since; an event whose state is the one `whole` holds shares it.
    pub(crate) fn restore_history(&self, events: Vec<RestoredEvent>, whole: &State) {
        if events.is_empty() {
            return;
        }
        let mut interner = terms::Interner::default();
        let made: Vec<Arc<Event>> = events
            .into_iter()
            .map(|e| {
                let held = whole
                    .get(&e.object.0.key)
                    .filter(|o| o.revision == e.object.1)
                    .cloned();
                let object = held
                    .unwrap_or_else(|| Object::from_input(e.object.0, e.object.1, &mut interner));
                let prev = e
                    .prev
                    .map(|(input, revision)| Object::from_input(input, revision, &mut interner));
                Arc::new(Event::new(e.revision, e.kind, object, prev))
            })
            .collect();
        let mut p = feed::write(&self.published);
        let since = std::mem::take(&mut p.log);
        p.log_bytes = 0;
        for e in made.into_iter().chain(since) {
            p.push(e);
        }
        p.trim(&self.config);
    }
}

/// The objects of `runs` in runs of a size a maker takes at a time. A store gives
/// them in key order, each once; objects given one by one in any other order are put
/// so.
fn in_runs(runs: Vec<RestoredRun>) -> Vec<RestoredRun> {
    const RUN: usize = 1024;
    let mut out = Vec::with_capacity(runs.len());
    let pieces = |objects: Vec<RestoredObject>, out: &mut Vec<RestoredRun>| {
        let mut rest = objects.into_iter();
        while rest.len() > 0 {
            out.push(RestoredRun::Objects(rest.by_ref().take(RUN).collect()));
        }
    };
    if runs.iter().all(|r| matches!(r, RestoredRun::Objects(_))) {
        let mut objects: Vec<RestoredObject> = runs
            .into_iter()
            .flat_map(|r| match r {
                RestoredRun::Objects(objects) => objects,
                RestoredRun::Stored(_) => Vec::new(),
            })
            .collect();
        in_key_order(&mut objects, |o| &o.state.key);
        pieces(objects, &mut out);
        return out;
    }
    for run in runs {
        match run {
            RestoredRun::Objects(objects) => pieces(objects, &mut out),
            stored => out.push(stored),
        }
    }
    out
}

/// The runs `maker` makes of those it takes from `runs`, one at a time, each with its
/// place in key order.
fn made_by<'a>(
    maker: &'a mut object::Maker,
    runs: &'a Mutex<std::iter::Enumerate<std::vec::IntoIter<RestoredRun>>>,
) -> impl Iterator<Item = (usize, Vec<ObjectRef>)> + 'a {
    std::iter::from_fn(move || {
        let (n, run) = lock(runs).next()?;
        Some((
            n,
            match run {
                RestoredRun::Objects(objects) => objects
                    .into_iter()
                    .map(|o| maker.make(o.state, o.revision, o.packed))
                    .collect(),
                RestoredRun::Stored(stored) => {
                    let mut made = Vec::with_capacity(stored.len());
                    stored.visit(&mut |view| made.push(maker.make_viewed(view)));
                    made
                }
            },
        ))
    })
}
