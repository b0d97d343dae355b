//! The owner index: objects by the uids of their owners (metadata.ownerReferences).

use std::cmp::Ordering;

use equivalent::{Comparable, Equivalent};
use fleetscope_model::ObjectKey;
use imbl::OrdSet;

use crate::object::{Entry, Object, ObjectRef, insert_in_order};

/// Objects by the uids of their owners, ordered by uid, then key, so an owner's objects
/// are a range. There are about a third as many owners as objects (a replica set's
/// pods), so entries in ordered sets cost far less than a set per owner. An object with
/// one owner, as most have, is one entry of a single pointer, ordered by the uid the
/// object holds; one with several has an (owner uid, object) pair per owner.
#[derive(Clone, Default)]
pub(crate) struct OwnerIndex {
    sole: OrdSet<Sole>,
    several: OrdSet<Owned>,
}

/// An object with one owner, ordered by that owner's uid, then key.
#[derive(Clone, Debug)]
struct Sole(Entry);

impl Sole {
    fn uid(&self) -> &str {
        self.0.0.sole_owner().map_or("", |u| u)
    }
}

impl PartialEq for Sole {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Sole {}

impl PartialOrd for Sole {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Sole {
    fn cmp(&self, other: &Self) -> Ordering {
        self.uid()
            .cmp(other.uid())
            .then_with(|| self.0.cmp(&other.0))
    }
}

/// One (owner uid, object) pair of an object with several owners.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Owned {
    uid: crate::terms::Uid,
    entry: Entry,
}

/// Finds entries: those of an owner (`Owner`, before or after all of them), or one
/// (`Pair`).
#[derive(Clone, Copy)]
enum OwnedBy<'a> {
    Owner(&'a str, Ordering),
    Pair(&'a str, &'a ObjectKey),
}

impl OwnedBy<'_> {
    fn compare_to(&self, uid: &str, key: &ObjectKey) -> Ordering {
        match *self {
            OwnedBy::Owner(u, side) => u.cmp(uid).then(side),
            OwnedBy::Pair(u, k) => u.cmp(uid).then_with(|| k.cmp(key)),
        }
    }
}

impl Equivalent<Owned> for OwnedBy<'_> {
    fn equivalent(&self, o: &Owned) -> bool {
        self.compare(o).is_eq()
    }
}

impl Comparable<Owned> for OwnedBy<'_> {
    fn compare(&self, o: &Owned) -> Ordering {
        self.compare_to(&o.uid, &o.entry.0.key)
    }
}

impl Equivalent<Sole> for OwnedBy<'_> {
    fn equivalent(&self, o: &Sole) -> bool {
        self.compare(o).is_eq()
    }
}

impl Comparable<Sole> for OwnedBy<'_> {
    fn compare(&self, o: &Sole) -> Ordering {
        self.compare_to(o.uid(), &o.0.0.key)
    }
}

/// The owner-index entries of an object: one for a sole owner, else one pair per owner.
fn entries(o: &Object, entry: &Entry, mut sole: impl FnMut(Sole), mut pair: impl FnMut(Owned)) {
    if o.sole_owner().is_some() {
        return sole(Sole(entry.clone()));
    }
    for uid in o.owners() {
        pair(Owned {
            uid: uid.clone(),
            entry: entry.clone(),
        });
    }
}

impl OwnerIndex {
    pub(crate) fn insert(&mut self, o: &Object, entry: &Entry) {
        let OwnerIndex { sole, several } = self;
        entries(
            o,
            entry,
            |s| {
                sole.insert(s);
            },
            |p| {
                several.insert(p);
            },
        );
    }

    pub(crate) fn remove(&mut self, o: &Object) {
        if let Some(uid) = o.sole_owner() {
            self.sole.remove(&OwnedBy::Pair(uid, &o.key));
            return;
        }
        for uid in o.owners() {
            self.several.remove(&OwnedBy::Pair(uid, &o.key));
        }
    }

    /// The objects owned by `uid`, in key order.
    pub(crate) fn owned_by(&self, uid: &str) -> Vec<&ObjectRef> {
        use std::ops::Bound::Included;
        let range = (
            Included(OwnedBy::Owner(uid, Ordering::Less)),
            Included(OwnedBy::Owner(uid, Ordering::Greater)),
        );
        let mut objects: Vec<&ObjectRef> = self.sole.range(range).map(|s| &s.0.0).collect();
        let before = objects.len();
        objects.extend(self.several.range(range).map(|o| &o.entry.0));
        if before > 0 && objects.len() > before {
            objects.sort_by(|a, b| a.key.cmp(&b.key));
        }
        objects
    }
}

/// Owner-index entries of many objects, gathered as the objects come in key order and
/// added at the end, each kind in the index's order.
#[derive(Default)]
pub(crate) struct GatheredOwners {
    sole: Vec<Sole>,
    several: Vec<Owned>,
}

impl GatheredOwners {
    pub(crate) fn add(&mut self, o: &ObjectRef) {
        let GatheredOwners { sole, several } = self;
        entries(o, &Entry(o.clone()), |s| sole.push(s), |p| several.push(p));
    }

    pub(crate) fn add_to(self, index: &mut OwnerIndex) {
        let GatheredOwners {
            mut sole,
            mut several,
        } = self;
        // Gathered in key order: a stable sort by uid puts them in the index's order.
        sole.sort_by(|a, b| a.uid().cmp(b.uid()));
        insert_in_order(&mut index.sole, sole.into_iter());
        several.sort_by(|a, b| a.uid.cmp(&b.uid));
        several.dedup();
        insert_in_order(&mut index.several, several.into_iter());
    }
}
