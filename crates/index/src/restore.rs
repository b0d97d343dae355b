//! An index rebuilt from persisted state: what a store gives, and how the index is
//! made of it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use fleetscope_model::{EventType, ObjectState, PackedJson, Revision, StoredRun};

use crate::state::{self, Event, State};
use crate::{Config, Index, Object, ObjectRef, StreamKey, feed, in_key_order, lock, object, terms};

/// Persisted state to rebuild an index from.
#[derive(Debug, Default)]
pub struct Restored {
    /// The revision to continue from.
    pub revision: Revision,
    /// Every object, with the revision of the change that produced it, in runs.
    pub objects: Vec<RestoredRun>,
    /// The retained event log, in revision order.
    pub events: Vec<RestoredEvent>,
    /// Where each stream stood: (resource, cluster) and the member resourceVersion
    /// its watch resumes from.
    pub positions: Vec<(StreamKey, Arc<str>)>,
}

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

impl Index {
    /// An index rebuilt from persisted state: the objects as they were, each with the
    /// revision that produced it, the retained event log, each stream's position, and
    /// the revision to continue from. Nothing is published as new events.
    ///
    /// It answers once the objects are in their primary order; the label, owner and
    /// field indexes are built on a thread of their own meanwhile (queries scan until
    /// they are in), and the first change staged waits for them.
    pub fn restore(config: Config, restored: Restored) -> Self {
        let mut state = State {
            indexed_paths: Arc::new(config.field_indexes.clone()),
            ..State::default()
        };
        // Made on two threads, each taking a run of them at a time and sharing what
        // they repeat through an interner of its own.
        let runs = Mutex::new(in_runs(restored.objects).into_iter());
        let mut makers = object::Maker::pair(config.compress_objects);
        let [first, second] = &mut makers;
        state.restore_primary(made_by(first, &runs), made_by(second, &runs));
        let [mut maker, other] = makers;
        maker.absorb(other);
        let object::Maker {
            mut interner,
            dictionaries,
            compressed,
            newest,
            ..
        } = maker;
        state.revision = restored.revision.max(newest);
        for (stream, rv) in restored.positions {
            state.reach(stream, rv);
        }
        let mut log = VecDeque::with_capacity(restored.events.len());
        for e in restored.events {
            // An event whose state is the one held shares it.
            let held = state
                .get(&e.object.0.key)
                .filter(|o| o.revision == e.object.1)
                .cloned();
            let object =
                held.unwrap_or_else(|| Object::from_input(e.object.0, e.object.1, &mut interner));
            let prev = e
                .prev
                .map(|(input, revision)| Object::from_input(input, revision, &mut interner));
            log.push_back(Arc::new(Event::new(e.revision, e.kind, object, prev)));
        }
        let objects = state.objects.clone();
        let mut index = Self::over(config, state, interner, log);
        index.dictionaries = Mutex::new(dictionaries);
        index.compressed = std::sync::atomic::AtomicU64::new(compressed);
        let (writer, published) = (index.writer.clone(), index.published.clone());
        let on_thread = objects.clone();
        match std::thread::Builder::new()
            .name("index-build".into())
            .spawn(move || install_secondary(&on_thread, &writer, &published))
        {
            Ok(handle) => *lock(&index.building) = Some(handle),
            // No thread to be had: built here, before the index answers.
            Err(_) => install_secondary(&objects, &index.writer, &index.published),
        }
        index
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

/// The objects `maker` makes of the runs it takes from `runs`, one run at a time.
fn made_by<'a>(
    maker: &'a mut object::Maker,
    runs: &'a Mutex<std::vec::IntoIter<RestoredRun>>,
) -> impl Iterator<Item = ObjectRef> + 'a {
    std::iter::from_fn(move || {
        let run = lock(runs).next()?;
        Some(match run {
            RestoredRun::Objects(objects) => objects
                .into_iter()
                .map(|o| maker.make(o.state, o.revision, o.packed))
                .collect(),
            RestoredRun::Stored(stored) => {
                let mut made = Vec::with_capacity(stored.len());
                stored.visit(&mut |view| made.push(maker.make_viewed(view)));
                made
            }
        })
    })
    .flatten()
}
