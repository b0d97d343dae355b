//! What objects repeat, held once: the interner that shares it, and the label and
//! field values an object is found by.

use std::sync::Arc;

use fleetscope_model::{Location, ObjectKey};

/// Shares what many objects repeat (resource names, namespaces, label keys and values,
/// owner uids, whole label and field sets) so each is held once. Bounded: past its
/// capacity, new values are still used, only not shared.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    strings: Table<Arc<str>>,
    locations: Table<Arc<Location>>,
    /// The last location asked for and its shared copy: objects arrive in runs of one.
    last_location: Option<(Arc<Location>, Arc<Location>)>,
    labels: Table<SharedLabels>,
    terms: Table<Arc<Terms>>,
    uids: Table<Uid>,
    /// The last uid asked for, shared.
    last_uid: Option<Uid>,
    /// Locations shared with an interner working alongside (the other maker of a
    /// restore): a location is then one allocation whichever thread meets it first,
    /// and keys made on either compare by pointer.
    pub(crate) alongside: Option<Arc<std::sync::Mutex<Table<Arc<Location>>>>>,
}

/// One of the interner's tables: found by an equivalent of what it holds, too.
pub(crate) type Table<T> = hashbrown::HashSet<T, foldhash::fast::RandomState>;

/// metadata.labels, sorted by key.
pub(crate) type LabelSet = Arc<[(Arc<str>, Arc<str>)]>;

/// A label set as the interner holds it: found by the text of its labels
/// ([`LabelsOf`]), so an object whose set is held is not interned label by label.
#[derive(Debug, PartialEq, Eq)]
struct SharedLabels(LabelSet);

/// An object's labels, sorted, as they came: the key its shared set is found by.
struct LabelsOf<'a, S>(&'a [(S, S)]);

/// A location by its parts, as a record holds them: the key its shared copy is found
/// by. Hashes as [`Location`] does: its three strings in order.
#[derive(Hash)]
pub(crate) struct LocationOf<'a> {
    pub(crate) resource: &'a str,
    pub(crate) cluster: &'a str,
    pub(crate) namespace: &'a str,
}

impl hashbrown::Equivalent<Arc<Location>> for LocationOf<'_> {
    fn equivalent(&self, held: &Arc<Location>) -> bool {
        *held.resource == *self.resource
            && held.cluster.as_str() == self.cluster
            && *held.namespace == *self.namespace
    }
}

/// The one hash of a label set, whichever form it is in.
fn hash_labels<'a, H: std::hash::Hasher>(
    labels: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    state: &mut H,
) {
    state.write_usize(labels.len());
    for (k, v) in labels {
        state.write(k.as_bytes());
        state.write_u8(0xff);
        state.write(v.as_bytes());
        state.write_u8(0xff);
    }
}

impl std::hash::Hash for SharedLabels {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        hash_labels(self.0.iter().map(|(k, v)| (&**k, &**v)), state);
    }
}

impl<S: AsRef<str>> std::hash::Hash for LabelsOf<'_, S> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        hash_labels(self.0.iter().map(|(k, v)| (k.as_ref(), v.as_ref())), state);
    }
}

impl<S: AsRef<str>> hashbrown::Equivalent<SharedLabels> for LabelsOf<'_, S> {
    fn equivalent(&self, held: &SharedLabels) -> bool {
        self.0.len() == held.0.len()
            && self
                .0
                .iter()
                .zip(held.0.iter())
                .all(|((k, v), (hk, hv))| k.as_ref() == &**hk && v.as_ref() == &**hv)
    }
}

/// An owner's uid: a handle of one word (the object record holds one), shared.
pub type Uid = arcstr::ArcStr;

impl Interner {
    const CAPACITY: usize = 200_000;

    pub(crate) fn get(&mut self, s: &str) -> Arc<str> {
        Self::string(&mut self.strings, s)
    }

    /// An owner's uid, shared. Objects of one owner mostly come one after another (in
    /// key order, a workload's pods): the last uid is taken without a lookup.
    pub(crate) fn uid(&mut self, s: &str) -> Uid {
        if let Some(last) = &self.last_uid
            && last.as_str() == s
        {
            return last.clone();
        }
        let shared = Self::string(&mut self.uids, s);
        self.last_uid = Some(shared.clone());
        shared
    }

    /// `s` as `table` holds it, added when there is room.
    fn string<T>(table: &mut Table<T>, s: &str) -> T
    where
        T: for<'a> From<&'a str> + std::borrow::Borrow<str> + std::hash::Hash + Eq + Clone,
    {
        if let Some(shared) = table.get(s) {
            return shared.clone();
        }
        let fresh = T::from(s);
        if table.len() < Self::CAPACITY {
            table.insert(fresh.clone());
        }
        fresh
    }

    /// Takes what `other` shares and this one does not, while there is room: objects
    /// made through either are then shared with those made later.
    pub(crate) fn absorb(&mut self, other: Interner) {
        fn union<T: std::hash::Hash + Eq>(into: &mut Table<T>, from: Table<T>) {
            for v in from {
                if into.len() >= Interner::CAPACITY {
                    return;
                }
                into.insert(v);
            }
        }
        let Interner {
            strings,
            locations,
            last_location: _,
            labels,
            terms,
            uids,
            last_uid: _,
            alongside: _,
        } = other;
        // What it shared with the other is held here now: it works alone from here on.
        self.alongside = None;
        union(&mut self.strings, strings);
        union(&mut self.locations, locations);
        union(&mut self.labels, labels);
        union(&mut self.terms, terms);
        union(&mut self.uids, uids);
    }

    /// The same key, in its shared location.
    pub(crate) fn key(&mut self, key: &ObjectKey) -> ObjectKey {
        ObjectKey::in_location(self.location(key.location()), key.name.clone())
    }

    pub(crate) fn location(&mut self, location: &Arc<Location>) -> Arc<Location> {
        if let Some((asked, shared)) = &self.last_location
            && Arc::ptr_eq(asked, location)
        {
            return shared.clone();
        }
        let shared = self.location_slow(location);
        self.last_location = Some((location.clone(), shared.clone()));
        shared
    }

    /// The shared location of a key read in place, by its parts.
    pub(crate) fn location_of(&mut self, at: LocationOf<'_>) -> Arc<Location> {
        use hashbrown::Equivalent;
        if let Some((_, shared)) = &self.last_location
            && at.equivalent(shared)
        {
            return shared.clone();
        }
        let shared = match self.locations.get(&at) {
            Some(shared) => shared.clone(),
            None => self.new_location(&at, || fleetscope_model::ClusterName::from(at.cluster)),
        };
        self.last_location = Some((shared.clone(), shared.clone()));
        shared
    }

    fn location_slow(&mut self, location: &Arc<Location>) -> Arc<Location> {
        if let Some(shared) = self.locations.get(location) {
            return shared.clone();
        }
        let at = LocationOf {
            resource: &location.resource,
            cluster: location.cluster.as_str(),
            namespace: &location.namespace,
        };
        self.new_location(&at, || location.cluster.clone())
    }

    /// A location this interner does not hold: the one an interner alongside made, or
    /// a new one of shared strings.
    fn new_location(
        &mut self,
        at: &LocationOf<'_>,
        cluster: impl FnOnce() -> fleetscope_model::ClusterName,
    ) -> Arc<Location> {
        let alongside = self.alongside.clone();
        let mut made = alongside.as_deref().map(crate::lock);
        let held = made.as_ref().and_then(|m| m.get(at).cloned());
        let fresh = held.unwrap_or_else(|| {
            let fresh = Arc::new(Location {
                resource: self.get(at.resource),
                cluster: cluster(),
                namespace: self.get(at.namespace),
            });
            if let Some(made) = made.as_mut() {
                made.insert(fresh.clone());
            }
            fresh
        });
        if self.locations.len() < Self::CAPACITY {
            self.locations.insert(fresh.clone());
        }
        fresh
    }

    /// The shared set of `labels` (sorted): found whole, or made of shared keys and
    /// values.
    pub(crate) fn labels<S: AsRef<str>>(&mut self, labels: &[(S, S)]) -> LabelSet {
        if let Some(shared) = self.labels.get(&LabelsOf(labels)) {
            return shared.0.clone();
        }
        let fresh: LabelSet = labels
            .iter()
            .map(|(k, v)| (self.get(k.as_ref()), self.get(v.as_ref())))
            .collect();
        if self.labels.len() < Self::CAPACITY {
            self.labels.insert(SharedLabels(fresh.clone()));
        }
        fresh
    }

    pub(crate) fn terms(&mut self, terms: Terms) -> Arc<Terms> {
        if let Some(shared) = self.terms.get(&terms) {
            return shared.clone();
        }
        let fresh = Arc::new(terms);
        if self.terms.len() < Self::CAPACITY {
            self.terms.insert(fresh.clone());
        }
        fresh
    }
}

/// The label and field values an object is found by in the secondary indexes. Objects
/// of one workload usually carry the same ones, so they share one copy; label sets are
/// shared further, across workloads. The uid of a sole owner, unique to each workload
/// and cluster, is held by the object itself, so it does not keep these from being
/// shared.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Terms {
    /// metadata.labels, sorted by key; for an object with more than
    /// [`MAX_INDEXED_LABELS`], only [`UNINDEXED_LABELS`].
    pub(crate) labels: LabelSet,
    /// The labels of an object with more than [`MAX_INDEXED_LABELS`].
    pub(crate) unindexed: Option<PackedLabels>,
    /// Values of the configured field indexes, as (JSON path, value).
    pub(crate) fields: Box<[(Arc<str>, Arc<str>)]>,
    /// The owner uids of an object with several owners; empty otherwise.
    pub(crate) owners: Box<[Uid]>,
}

/// The most labels of one object the label index takes. An object with more (a label
/// bomb: the API server takes 60,000 on one object, which would cost the index about
/// 80 MB) holds them packed, about their own size again, and the label index names it
/// only under [`UNINDEXED_LABELS`]: every label query visits it and matches it by a
/// scan, so it is still served and selected as any other.
pub const MAX_INDEXED_LABELS: usize = 64;

/// The label under which the label index names the objects whose own labels it does
/// not hold: the empty key, which no Kubernetes label has.
pub(crate) const UNINDEXED_LABELS: &str = "";

/// Labels held outside the label index: every key and value in one text, found by
/// binary search.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct PackedLabels {
    text: Box<str>,
    /// Per label, sorted by key: where its key ends and where its value ends in
    /// `text` (each starts where the one before ends).
    ends: Box<[(u32, u32)]>,
}

impl PackedLabels {
    pub(crate) fn new(mut labels: Vec<(String, String)>) -> Self {
        labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        labels.dedup_by(|a, b| a.0 == b.0);
        let mut text = String::with_capacity(labels.iter().map(|(k, v)| k.len() + v.len()).sum());
        let mut ends = Vec::with_capacity(labels.len());
        for (k, v) in &labels {
            // Labels are bounded by the object's size, far below 4 GiB; any past that
            // could not be addressed and are left out.
            let (Ok(key_end), Ok(end)) = (
                u32::try_from(text.len() + k.len()),
                u32::try_from(text.len() + k.len() + v.len()),
            ) else {
                break;
            };
            text.push_str(k);
            text.push_str(v);
            ends.push((key_end, end));
        }
        Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }

    pub(crate) fn at(&self, i: usize) -> (&str, &str) {
        let start = if i == 0 {
            0
        } else {
            self.ends[i - 1].1 as usize
        };
        let (key_end, end) = (self.ends[i].0 as usize, self.ends[i].1 as usize);
        (&self.text[start..key_end], &self.text[key_end..end])
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        let mut lo = 0;
        let mut hi = self.ends.len();
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (k, v) = self.at(mid);
            match k.cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(v),
            }
        }
        None
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

/// Every label of an object, held indexed or packed.
pub(crate) enum AllLabels<'a> {
    Indexed(std::slice::Iter<'a, (Arc<str>, Arc<str>)>),
    Packed(&'a PackedLabels, usize),
}

impl<'a> Iterator for AllLabels<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            AllLabels::Indexed(i) => i.next().map(|(k, v)| (&**k, &**v)),
            AllLabels::Packed(p, at) => {
                let label = (*at < p.len()).then(|| p.at(*at))?;
                *at += 1;
                Some(label)
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            AllLabels::Indexed(i) => i.len(),
            AllLabels::Packed(p, at) => p.len() - at,
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for AllLabels<'_> {}
