//! The index's state: persistent maps, so a snapshot is a clone that costs nothing and
//! shares everything with the live state.

use std::sync::Arc;
use std::sync::mpsc::SyncSender;

use fleetscope_model::{ClusterName, EventType, ObjectKey, ObjectState, Revision};
use imbl::{OrdMap, OrdSet};

/// A plain hash map, for gathering what a restore then makes persistent.
type StdHashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A persistent hash map with a fast keyed hash (label keys and values and field values
/// are short strings).
type HashMap<K, V> =
    imbl::GenericHashMap<K, V, foldhash::fast::RandomState, imbl::shared_ptr::DefaultSharedPtr>;

use crate::object::{Entry, Object, ObjectRef, insert_in_order};
use crate::owners::{GatheredOwners, OwnerIndex};
use crate::terms::Interner;

/// One applied change, with the state before it, so filters can see transitions.
#[derive(Debug)]
pub struct Event {
    /// The revision the change was given.
    pub revision: Revision,
    /// What happened to the object.
    pub kind: EventType,
    /// The object after the change; for a delete, its last state.
    pub object: ObjectRef,
    /// The object before the change; `None` for a create.
    pub prev: Option<ObjectRef>,
    /// The member resourceVersion the object's stream (its type in its cluster) has
    /// reached with this change: the watch event's, or a list's on its last change.
    /// `None` for a change that is no position of its own: one of a list but its
    /// last, a cluster removed, or an event restored from a store.
    pub position: Option<Arc<str>>,
    /// The change removes the object with its whole cluster (the cluster left this
    /// index), not by a change in the cluster.
    pub cluster_removed: bool,
    /// What subscribers read of the object, read once, by the first subscriber that
    /// sends the event, and shared by every other.
    read: std::sync::OnceLock<Box<Read>>,
}

impl Event {
    /// A change of `object` at `revision`.
    pub fn new(
        revision: Revision,
        kind: EventType,
        object: ObjectRef,
        prev: Option<ObjectRef>,
    ) -> Self {
        Self {
            revision,
            kind,
            object,
            prev,
            position: None,
            cluster_removed: false,
            read: std::sync::OnceLock::new(),
        }
    }

    fn read(&self) -> &Read {
        self.read.get_or_init(|| {
            // Text held as it is is shared, not copied: only a compressed object's is kept.
            let (text, made) = self.object.json_made();
            let (uid, rv) = crate::object::uid_and_resource_version(&text);
            Box::new(Read {
                uid: uid.into_boxed_str(),
                resource_version: rv.into_boxed_str(),
                json: made.then_some(text),
            })
        })
    }

    /// The object's metadata.uid and metadata.resourceVersion (empty when absent),
    /// read once per event.
    pub fn uid_and_resource_version(&self) -> (&str, &str) {
        let read = self.read();
        (&read.uid, &read.resource_version)
    }

    /// The object's JSON, shared by every subscriber that sends the event.
    pub fn json(&self) -> fleetscope_model::Json {
        match &self.read().json {
            Some(json) => json.clone(),
            None => self.object.json(),
        }
    }

    /// This event, as one of its cluster leaving the index.
    pub(crate) fn removing_cluster(mut self) -> Self {
        self.cluster_removed = true;
        self
    }

    /// This event, carrying the member resourceVersion its stream reached with it.
    pub(crate) fn at(mut self, position: Arc<str>) -> Self {
        self.position = Some(position);
        self
    }

    /// The JSON bytes the event holds: the object's, and the previous state's for a
    /// modification (a delete's previous state is its object).
    pub fn json_bytes(&self) -> usize {
        self.object.json_len()
            + match self.kind {
                EventType::Modified => self.prev.as_ref().map_or(0, |p| p.json_len()),
                _ => 0,
            }
    }
}

/// What subscribers read of an event's object.
#[derive(Debug)]
struct Read {
    uid: Box<str>,
    resource_version: Box<str>,
    /// The JSON, when the object holds it compressed.
    json: Option<fleetscope_model::Json>,
}

/// Objects ordered by key; a set of entries is also a map from key to object.
pub(crate) type KeySet = OrdSet<Entry>;
/// (resource, label key).
type LabelKey = (Arc<str>, Arc<str>);
/// (resource, field path, value).
type FieldKey = (Arc<str>, Arc<str>, Arc<str>);
/// (resource, label key) → label value → objects.
type LabelIndex = HashMap<LabelKey, HashMap<Arc<str>, Members>>;
/// (resource, field path, value) → objects.
type FieldIndex = HashMap<FieldKey, Members>;

/// The objects one label or field value names. Many values name a few objects (one pod
/// IP, a rare label), held as a small sorted vector; past [`Members::FEW`] they
/// move to a persistent set.
#[derive(Clone, Debug)]
pub(crate) enum Members {
    Few(Vec<Entry>),
    Many(KeySet),
}

impl Default for Members {
    fn default() -> Self {
        Members::Few(Vec::new())
    }
}

impl Members {
    const FEW: usize = 32;

    /// Adds an object, replacing one with the same key.
    fn insert(&mut self, entry: Entry) {
        match self {
            Members::Few(v) => match v.binary_search(&entry) {
                Ok(i) => v[i] = entry,
                Err(i) if v.len() < Self::FEW => v.insert(i, entry),
                Err(_) => {
                    let mut set: KeySet = v.drain(..).collect();
                    set.insert(entry);
                    *self = Members::Many(set);
                }
            },
            Members::Many(set) => {
                set.insert(entry);
            }
        }
    }

    /// Members from entries in key order (the same object twice in a row counts once).
    fn from_sorted(mut entries: Vec<Entry>) -> Self {
        entries.dedup_by(|a, b| a.0.key == b.0.key);
        if entries.len() <= Self::FEW {
            entries.shrink_to_fit();
            Members::Few(entries)
        } else {
            let mut set = KeySet::new();
            insert_in_order(&mut set, entries.into_iter());
            Members::Many(set)
        }
    }

    /// Adds entries in key order: to an empty value, as a whole.
    fn extend_sorted(&mut self, entries: Vec<Entry>) {
        match self {
            _ if self.is_empty() => *self = Self::from_sorted(entries),
            Members::Many(set) => insert_in_order(set, entries.into_iter()),
            Members::Few(_) => {
                for e in entries {
                    self.insert(e);
                }
            }
        }
    }

    fn remove(&mut self, key: &ObjectKey) {
        match self {
            Members::Few(v) => {
                if let Ok(i) = v.binary_search_by(|e| e.0.key.cmp(key)) {
                    v.remove(i);
                }
            }
            Members::Many(set) => {
                set.remove(key);
                if set.len() <= Self::FEW / 2 {
                    *self = Members::Few(set.iter().cloned().collect());
                }
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Members::Few(v) => v.len(),
            Members::Many(set) => set.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The members as a persistent set: free for a large one, a few inserts for a small one.
    pub(crate) fn to_set(&self) -> KeySet {
        match self {
            Members::Few(v) => v.iter().cloned().collect(),
            Members::Many(set) => set.clone(),
        }
    }
}

/// Adds an object to the label, owner and field indexes.
fn index_secondary(
    labels: &mut LabelIndex,
    owners: &mut OwnerIndex,
    fields: &mut FieldIndex,
    o: &Object,
    entry: &Entry,
) {
    let r = &o.key.resource;
    for (k, v) in o.labels() {
        labels
            .entry((r.clone(), k.clone()))
            .or_default()
            .entry(v.clone())
            .or_default()
            .insert(entry.clone());
    }
    owners.insert(o, entry);
    for (p, v) in o.fields() {
        fields
            .entry((r.clone(), p.clone(), v.clone()))
            .or_default()
            .insert(entry.clone());
    }
}

/// The label, owner and field indexes of a set of objects, built apart from the state
/// that holds them (a restored index answers while they are built).
pub(crate) struct Secondary {
    labels: LabelIndex,
    owners: OwnerIndex,
    fields: FieldIndex,
}

impl Secondary {
    /// Built from `objects` on two threads: one gathers the label index, the other
    /// the owner and field indexes, each value's members in key order, made persistent
    /// once at the end (a set built from sorted members rather than a persistent map
    /// updated per object).
    pub(crate) fn of(objects: &KeySet) -> Self {
        let (mut labels, mut owners, mut fields) = Default::default();
        std::thread::scope(|s| {
            let by_label = s.spawn(|| {
                let mut gathered = Gathered::default();
                objects.iter().for_each(|e| gathered.labels_of(&e.0));
                gathered.labels
            });
            let mut gathered = Gathered::default();
            objects
                .iter()
                .for_each(|e| gathered.owners_and_fields_of(&e.0));
            Gathered::add_owners_and_fields(
                gathered.owners,
                gathered.fields,
                &mut owners,
                &mut fields,
            );
            match by_label.join() {
                Ok(gathered) => Gathered::add_labels(gathered, &mut labels),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        });
        Self {
            labels,
            owners,
            fields,
        }
    }
}

/// Secondary-index entries of many objects, gathered in plain hash maps and vectors
/// (each value's members in key order, as the objects arrive), then added to the
/// persistent indexes with one lookup per value rather than one per object, each set
/// filled in order.
#[derive(Default)]
struct Gathered {
    labels: StdHashMap<LabelKey, StdHashMap<Arc<str>, Vec<Entry>>>,
    owners: GatheredOwners,
    fields: StdHashMap<FieldKey, Vec<Entry>>,
}

impl Gathered {
    fn labels_of(&mut self, o: &ObjectRef) {
        let r = &o.key.resource;
        for (k, v) in o.labels() {
            self.labels
                .entry((r.clone(), k.clone()))
                .or_default()
                .entry(v.clone())
                .or_default()
                .push(Entry(o.clone()));
        }
    }

    fn owners_and_fields_of(&mut self, o: &ObjectRef) {
        self.owners.add(o);
        let r = &o.key.resource;
        for (p, v) in o.fields() {
            self.fields
                .entry((r.clone(), p.clone(), v.clone()))
                .or_default()
                .push(Entry(o.clone()));
        }
    }

    fn add_labels(
        labels: StdHashMap<LabelKey, StdHashMap<Arc<str>, Vec<Entry>>>,
        to: &mut LabelIndex,
    ) {
        for (k, values) in labels {
            let held = to.entry(k).or_default();
            for (v, members) in values {
                held.entry(v).or_default().extend_sorted(members);
            }
        }
    }

    fn add_owners_and_fields(
        owners: GatheredOwners,
        fields: StdHashMap<FieldKey, Vec<Entry>>,
        to_owners: &mut OwnerIndex,
        to_fields: &mut FieldIndex,
    ) {
        owners.add_to(to_owners);
        for (k, members) in fields {
            to_fields.entry(k).or_default().extend_sorted(members);
        }
    }
}

/// Counts objects in runs of one place (resource, cluster, namespace), as objects in
/// key order come, so the counts are updated once per run.
#[derive(Default)]
struct Runs(Option<(ObjectKey, usize)>);

impl Runs {
    fn add(&mut self, counts: &mut Counts, key: &ObjectKey) {
        match &mut self.0 {
            Some((first, n)) if same_place(first, key) => *n += 1,
            _ => {
                self.finish(counts);
                self.0 = Some((key.clone(), 1));
            }
        }
    }

    fn finish(&mut self, counts: &mut Counts) {
        if let Some((first, n)) = self.0.take() {
            add_count(counts, &first, n);
        }
    }
}

/// Sends each run made to `to`, until done or nobody takes them (the taker
/// panicked, which its scope then raises).
fn send_runs(
    runs: impl Iterator<Item = (usize, Vec<ObjectRef>)>,
    to: &SyncSender<(usize, Vec<ObjectRef>)>,
) {
    for run in runs {
        if to.send(run).is_err() {
            return;
        }
    }
}

fn same_place(a: &ObjectKey, b: &ObjectKey) -> bool {
    a.resource == b.resource && a.cluster == b.cluster && a.namespace == b.namespace
}

fn add_count(counts: &mut Counts, key: &ObjectKey, n: usize) {
    let ck = (
        key.resource.clone(),
        key.cluster.clone(),
        key.namespace.clone(),
    );
    let total = counts.get(&ck).copied().unwrap_or(0) + n;
    counts.insert(ck, total);
}

/// (resource, cluster, namespace) → object count.
type Counts = OrdMap<(Arc<str>, ClusterName, Arc<str>), usize>;

/// A consistent state of the whole index at one revision.
#[derive(Clone, Default)]
pub struct State {
    pub(crate) revision: Revision,
    pub(crate) objects: KeySet,
    /// (resource, label key) → label value → objects.
    pub(crate) labels: LabelIndex,
    /// Objects by owner uid.
    pub(crate) owners: OwnerIndex,
    /// (resource, field path, value) → objects.
    pub(crate) fields: FieldIndex,
    /// (resource, cluster) → object count.
    /// (resource, cluster, namespace) → object count.
    pub(crate) counts: Counts,
    /// The JSON paths with a field index.
    pub(crate) indexed_paths: Arc<Vec<String>>,
    /// (resource, cluster) → the member resourceVersion the stream has reached: the
    /// member's state of that stream at it is the one held.
    pub(crate) positions: OrdMap<(Arc<str>, ClusterName), Arc<str>>,
    /// The label, owner and field indexes are still being built (a restored index
    /// answers before they are): queries scan the primary set meanwhile.
    pub(crate) building: bool,
}

impl State {
    /// The revision this state is at.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// Records the member resourceVersion a stream reached; whether it moved.
    pub(crate) fn reach(&mut self, stream: (Arc<str>, ClusterName), rv: Arc<str>) -> bool {
        self.positions.insert(stream, rv.clone()).as_ref() != Some(&rv)
    }

    /// The member resourceVersion each cluster's stream of one resource type has
    /// reached in this state.
    pub fn positions_of<'a>(
        &'a self,
        resource: &'a str,
    ) -> impl Iterator<Item = (&'a ClusterName, &'a Arc<str>)> + 'a {
        self.positions
            .iter()
            .filter(move |((r, _), _)| **r == *resource)
            .map(|((_, c), rv)| (c, rv))
    }

    /// The member resourceVersion one resource type of one cluster has reached in
    /// this state, if it was ever given one.
    pub fn position(&self, resource: &str, cluster: &ClusterName) -> Option<&Arc<str>> {
        self.positions.get(&(Arc::from(resource), cluster.clone()))
    }

    /// How many objects are held.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// One object.
    pub fn get(&self, key: &ObjectKey) -> Option<&ObjectRef> {
        self.objects.get(key).map(|e| &e.0)
    }

    /// Whether any object is held from `first` to `last` (inclusive).
    pub(crate) fn holds_between(&self, first: &ObjectKey, last: &ObjectKey) -> bool {
        self.objects
            .range::<_, ObjectKey>(first..=last)
            .next()
            .is_some()
    }

    /// Every object, in key order.
    pub fn iter(&self) -> impl Iterator<Item = &ObjectRef> {
        self.objects.iter().map(|e| &e.0)
    }

    /// Object counts per (resource, cluster).
    pub fn counts(&self) -> impl Iterator<Item = (&str, &ClusterName, usize)> {
        let mut out: Vec<(&str, &ClusterName, usize)> = Vec::new();
        for ((r, c, _), n) in self.counts.iter() {
            match out.last_mut() {
                Some((lr, lc, ln)) if *lr == &**r && *lc == c => *ln += n,
                _ => out.push((r, c, *n)),
            }
        }
        out.into_iter()
    }

    /// Object counts per (resource, cluster, namespace).
    pub fn namespace_counts(&self) -> impl Iterator<Item = (&str, &ClusterName, &str, usize)> {
        self.counts
            .iter()
            .map(|((r, c, ns), n)| (&**r, c, &**ns, *n))
    }

    /// The objects owned by an owner uid, in key order (found by a scan while the
    /// secondary indexes are being built).
    pub fn owned_by(&self, uid: &str) -> Vec<&ObjectRef> {
        if self.building {
            return self
                .objects
                .iter()
                .map(|e| &e.0)
                .filter(|o| o.owners().iter().any(|u| **u == *uid))
                .collect();
        }
        self.owners.owned_by(uid)
    }

    fn index(&mut self, o: &ObjectRef) {
        let entry = Entry(o.clone());
        index_secondary(
            &mut self.labels,
            &mut self.owners,
            &mut self.fields,
            o,
            &entry,
        );
        self.objects.insert(entry);
    }

    fn unindex(&mut self, o: &Object) {
        let r = &o.key.resource;
        for (k, v) in o.labels() {
            let lk = (r.clone(), k.clone());
            if let Some(values) = self.labels.get_mut(&lk) {
                if let Some(set) = values.get_mut(v) {
                    set.remove(&o.key);
                    if set.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.labels.remove(&lk);
                }
            }
        }
        self.owners.remove(o);
        for (p, v) in o.fields() {
            let fk = (r.clone(), p.clone(), v.clone());
            if let Some(set) = self.fields.get_mut(&fk) {
                set.remove(&o.key);
                if set.is_empty() {
                    self.fields.remove(&fk);
                }
            }
        }
    }

    fn bump_count(&mut self, key: &ObjectKey, delta: isize) {
        let ck = (
            key.resource.clone(),
            key.cluster.clone(),
            key.namespace.clone(),
        );
        let n = self
            .counts
            .get(&ck)
            .copied()
            .unwrap_or(0)
            .saturating_add_signed(delta);
        if n == 0 {
            self.counts.remove(&ck);
        } else {
            self.counts.insert(ck, n);
        }
    }

    /// Adds persisted objects (runs of distinct keys, each numbered by its place in
    /// key order) to an empty state, with their own revisions and no events, as
    /// `restored` makes them: the calling thread makes the first part's runs and
    /// another thread the second's, and a third takes them into the primary set in
    /// key order and counts, offering the set made so far and its last key to `offer`
    /// every so many runs. The secondary indexes are left to [`Secondary::of`]: until
    /// they are installed the state is `building`, and its queries scan.
    pub(crate) fn restore_primary(
        &mut self,
        first: impl Iterator<Item = (usize, Vec<ObjectRef>)>,
        second: impl Iterator<Item = (usize, Vec<ObjectRef>)> + Send,
        offer: &(dyn Fn(&KeySet, &ObjectKey) + Sync),
    ) {
        /// The most runs taken between two offers: the first is offered at once, and
        /// each after it once the runs taken have doubled, up to this many more.
        const OFFER_EVERY: usize = 32;
        let State {
            objects,
            counts,
            building,
            ..
        } = self;
        *building = true;
        let (to_primary, primary) = std::sync::mpsc::sync_channel::<(usize, Vec<ObjectRef>)>(8);
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut runs = Runs::default();
                // Runs made ahead of one still being made, by their number.
                let mut ahead: std::collections::BTreeMap<usize, Vec<ObjectRef>> =
                    std::collections::BTreeMap::new();
                let (mut next, mut offered) = (0, None);
                for (n, run) in primary {
                    ahead.insert(n, run);
                    let mut last = None;
                    while let Some(run) = ahead.remove(&next) {
                        next += 1;
                        run.iter().for_each(|o| runs.add(counts, &o.key));
                        last = run.last().map(|o| o.key.clone()).or(last);
                        insert_in_order(objects, run.into_iter().map(Entry));
                    }
                    if let Some(last) = last
                        && offered.is_none_or(|at: usize| next - at >= at.min(OFFER_EVERY))
                    {
                        offer(objects, &last);
                        offered = Some(next);
                    }
                }
                runs.finish(counts);
            });
            let to_second = to_primary.clone();
            s.spawn(move || send_runs(second, &to_second));
            send_runs(first, &to_primary);
            // The worker ends when both senders are gone.
            drop(to_primary);
        });
    }

    /// Takes secondary indexes built for this state's objects; it no longer scans.
    pub(crate) fn install(&mut self, secondary: &Secondary) {
        self.labels = secondary.labels.clone();
        self.owners = secondary.owners.clone();
        self.fields = secondary.fields.clone();
        self.building = false;
    }

    /// Adds objects none of which is held, in key order with distinct keys (a first
    /// list): as `upsert` would, one event each, but with each object's count and
    /// secondary entries gathered and added once per value.
    pub(crate) fn add_new(
        &mut self,
        inputs: Vec<ObjectState>,
        interner: &mut Interner,
        events: &mut Vec<Event>,
    ) {
        let mut gathered = Gathered::default();
        let mut runs = Runs::default();
        let first = events.len();
        events.reserve(inputs.len());
        for input in inputs {
            let revision = self.revision.next();
            self.revision = revision;
            let object = Object::from_input(input, revision, interner);
            runs.add(&mut self.counts, &object.key);
            gathered.labels_of(&object);
            gathered.owners_and_fields_of(&object);
            events.push(Event::new(revision, EventType::Added, object, None));
        }
        insert_in_order(
            &mut self.objects,
            events[first..].iter().map(|e| Entry(e.object.clone())),
        );
        runs.finish(&mut self.counts);
        Gathered::add_labels(gathered.labels, &mut self.labels);
        Gathered::add_owners_and_fields(
            gathered.owners,
            gathered.fields,
            &mut self.owners,
            &mut self.fields,
        );
    }

    /// Creates or replaces an object; `None` when the input is the state already held.
    pub(crate) fn upsert(&mut self, input: ObjectState, interner: &mut Interner) -> Option<Event> {
        let prev = self.get(&input.key).cloned();
        if prev.as_ref().is_some_and(|p| p.same_as(&input)) {
            return None;
        }
        let revision = self.revision.next();
        let object = Object::from_input(input, revision, interner);
        match &prev {
            // The same label, owner and field values (a status update, mostly): each
            // secondary entry is replaced where it is, by `index` below.
            Some(p) if p.same_terms(&object) => {}
            Some(p) => self.unindex(p),
            None => self.bump_count(&object.key, 1),
        }
        self.index(&object);
        self.revision = revision;
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        Some(Event::new(revision, kind, object, prev))
    }

    /// Deletes an object; `None` when it is not held.
    pub(crate) fn delete(&mut self, key: &ObjectKey) -> Option<Event> {
        let prev = self.objects.remove(key)?.0;
        self.unindex(&prev);
        self.bump_count(key, -1);
        let revision = self.revision.next();
        self.revision = revision;
        // The delete carries the object's last state, stamped with the delete's revision.
        let last = ObjectRef::new(prev.restamped(revision));
        Some(Event::new(revision, EventType::Deleted, last, Some(prev)))
    }

    /// Whether anything is held for one (resource, cluster).
    pub(crate) fn holds_any(&self, resource: &str, cluster: &ClusterName) -> bool {
        let lo = ObjectKey::new(resource, cluster, "", "");
        self.objects
            .range(lo..)
            .next()
            .is_some_and(|e| *e.0.key.resource == *resource && e.0.key.cluster == *cluster)
    }

    /// The keys held for one (resource, cluster).
    pub(crate) fn keys_of(&self, resource: &str, cluster: &ClusterName) -> Vec<ObjectKey> {
        let lo = ObjectKey::new(resource, cluster, "", "");
        self.objects
            .range(lo..)
            .take_while(|e| *e.0.key.resource == *resource && e.0.key.cluster == *cluster)
            .map(|e| e.0.key.clone())
            .collect()
    }

    /// The resources held for a cluster.
    pub(crate) fn resources_of(&self, cluster: &ClusterName) -> Vec<Arc<str>> {
        self.counts
            .keys()
            .filter(|(_, c, _)| c == cluster)
            .map(|(r, _, _)| r.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}
