//! Queries over a [`State`]: which objects match, in primary-key order, using the
//! most selective secondary index and filtering the rest.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use std::borrow::Cow;

use fleetscope_model::access::{Hidden, Reach};
use fleetscope_model::selector::{FieldOp, Labels, Requirement};
use fleetscope_model::{ClusterName, FieldSelector, GroupBy, LabelSelector, ObjectKey};

use crate::object::{Object, ObjectRef};
use crate::state::{KeySet, Members, State};
use crate::terms::UNINDEXED_LABELS;

/// Which objects of one resource type to read.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Canonical resource type name.
    pub resource: String,
    /// Clusters to read; `None` reads every cluster.
    pub clusters: Option<Vec<ClusterName>>,
    /// Namespaces to read; empty reads all (and cluster-scoped objects).
    pub namespaces: Vec<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector over any JSON path.
    pub fields: FieldSelector,
    /// The places the caller may read; `None` for everywhere. Objects elsewhere are
    /// neither returned nor counted.
    pub reach: Option<Reach>,
    /// Where Secrets' values are hidden from the caller: there, selectors and group
    /// keys read them as absent, so no answer depends on them. `None` where nothing
    /// is hidden.
    pub hidden: Option<Hidden>,
    /// When evaluation stops: an answer read past it is cut short, and
    /// [`Query::expired`] says so (the caller then answers with an error, never with
    /// the part).
    pub deadline: Option<std::time::Instant>,
}

impl Query {
    /// Every object of a resource type.
    pub fn all(resource: &str) -> Self {
        Self {
            resource: resource.to_string(),
            ..Self::default()
        }
    }

    /// Whether its deadline has passed.
    pub fn expired(&self) -> bool {
        self.deadline
            .is_some_and(|d| std::time::Instant::now() >= d)
    }

    /// Whether an object matches.
    pub fn matches(&self, o: &Object) -> bool {
        *o.key.resource == *self.resource
            && self
                .clusters
                .as_ref()
                .is_none_or(|cs| cs.contains(&o.key.cluster))
            && (self.namespaces.is_empty()
                || self.namespaces.iter().any(|n| **n == *o.key.namespace))
            && self
                .reach
                .as_ref()
                .is_none_or(|r| r.allows(&o.key.cluster, &o.key.namespace))
            && self.labels.matches(o)
            && self
                .fields
                .requirements()
                .iter()
                .all(|r| r.matches_value(self.field(o, &r.path).as_deref()))
    }

    /// The value of a field path of an object as the caller sees it: absent where it
    /// is hidden from them.
    pub fn field<'o>(&self, o: &'o Object, path: &str) -> Option<Cow<'o, str>> {
        if self
            .hidden
            .as_ref()
            .is_some_and(|h| h.hides(&o.key.cluster, &o.key.namespace, path))
        {
            return None;
        }
        o.field_value(path)
    }
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct Page {
    /// The matching objects, in key order.
    pub items: Vec<ObjectRef>,
    /// The last key of this page, to continue after; `None` when nothing follows.
    pub next: Option<ObjectKey>,
    /// How many matching objects follow this page.
    pub remaining: u64,
}

/// Counts, grouped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Group key (one value per GroupBy) → count, ordered by key.
    pub groups: BTreeMap<Vec<String>, u64>,
    /// How many objects match in all.
    pub total: u64,
}

impl State {
    /// The candidate keys from the most selective secondary index, if one applies.
    /// Whether the secondary index alone decides the query: one label requirement that
    /// an index answers, and nothing else to filter.
    fn index_answers_exactly(&self, q: &Query) -> bool {
        !self.building
            && self.unindexed_labels(&q.resource).is_none()
            && q.clusters.is_none()
            && q.reach.is_none()
            && q.namespaces.is_empty()
            && q.fields.is_empty()
            && matches!(
                q.labels.requirements(),
                [Requirement::Equals(..) | Requirement::In(..) | Requirement::Exists(..)]
            )
    }

    /// The objects of `resource` whose labels the label index does not hold (more
    /// than [`crate::MAX_INDEXED_LABELS`]), if any.
    fn unindexed_labels(&self, resource: &str) -> Option<&Members> {
        self.labels
            .get(&(Arc::from(resource), Arc::from(UNINDEXED_LABELS)))
            .and_then(|m| m.get(UNINDEXED_LABELS))
    }

    /// None while the secondary indexes are being built: the primary set is scanned.
    fn indexed_candidates(&self, q: &Query) -> Option<KeySet> {
        if self.building {
            return None;
        }
        let resource: Arc<str> = Arc::from(q.resource.as_str());
        let mut best: Option<KeySet> = None;
        // A label's objects in the index, and every object whose labels it does not
        // hold (each may carry the label: the filter decides).
        let unindexed = self.unindexed_labels(&q.resource).map(Members::to_set);
        let mut consider = |set: KeySet, by_label: bool| {
            let set = match (&unindexed, by_label) {
                (Some(u), true) => set.union(u.clone()),
                _ => set,
            };
            if best.as_ref().is_none_or(|b| set.len() < b.len()) {
                best = Some(set);
            }
        };
        for r in q.labels.requirements() {
            let values = self.labels.get(&(resource.clone(), Arc::from(r.key())));
            match r {
                Requirement::Equals(_, v) => consider(
                    values
                        .and_then(|m| m.get(v.as_str()))
                        .map(Members::to_set)
                        .unwrap_or_default(),
                    true,
                ),
                Requirement::In(_, vs) => {
                    let mut union = KeySet::new();
                    for v in vs {
                        if let Some(set) = values.and_then(|m| m.get(v.as_str())) {
                            union = union.union(set.to_set());
                        }
                    }
                    consider(union, true);
                }
                Requirement::Exists(_) => {
                    let mut union = KeySet::new();
                    for set in values.into_iter().flat_map(|m| m.values()) {
                        union = union.union(set.to_set());
                    }
                    consider(union, true);
                }
                _ => {}
            }
        }
        for f in q
            .fields
            .requirements()
            .iter()
            .filter(|f| f.op == FieldOp::Equals)
            // Hidden values read as absent for some objects: the index, which holds
            // them as they are, cannot answer.
            .filter(|f| {
                q.hidden.is_none() || !fleetscope_model::access::reads_secret_values(&f.path)
            })
        {
            let key = (
                resource.clone(),
                Arc::from(f.path.as_str()),
                Arc::from(f.value.as_str()),
            );
            if self.indexed_paths.contains(&f.path) {
                consider(
                    self.fields
                        .get(&key)
                        .map(Members::to_set)
                        .unwrap_or_default(),
                    false,
                );
            }
        }
        best
    }

    /// The key prefixes a primary scan walks, in key order: (cluster, namespace) pairs.
    fn scan_prefixes(&self, q: &Query) -> Vec<(Option<ClusterName>, Option<String>)> {
        let mut namespaces = q.namespaces.clone();
        namespaces.sort();
        namespaces.dedup();
        let clusters: Option<Vec<ClusterName>> = match (&q.clusters, namespaces.is_empty()) {
            (Some(cs), _) => {
                let mut cs = cs.clone();
                cs.sort();
                cs.dedup();
                Some(cs)
            }
            (None, true) => None,
            (None, false) => Some(
                self.counts
                    .keys()
                    .filter(|(r, _, _)| **r == *q.resource)
                    .map(|(_, c, _)| c.clone())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            ),
        };
        match clusters {
            None => vec![(None, None)],
            Some(cs) if namespaces.is_empty() => cs.into_iter().map(|c| (Some(c), None)).collect(),
            Some(cs) => cs
                .into_iter()
                .flat_map(|c| {
                    namespaces
                        .iter()
                        .map(move |n| (Some(c.clone()), Some(n.clone())))
                })
                .collect(),
        }
    }

    /// Every matching object after `after`, in key order.
    pub fn matching<'a>(
        &'a self,
        q: &'a Query,
        after: Option<&'a ObjectKey>,
    ) -> Box<dyn Iterator<Item = &'a ObjectRef> + Send + 'a> {
        if let Some(set) = self.indexed_candidates(q) {
            // The set may be a union built here; the objects it names live in `self`.
            return Box::new(Candidates {
                set,
                state: self,
                query: q,
                cursor: after.cloned(),
                ready: Vec::new().into_iter(),
                done: false,
            });
        }
        let prefixes = self.scan_prefixes(q);
        let resource: Arc<str> = Arc::from(q.resource.as_str());
        Box::new(prefixes.into_iter().flat_map(move |(cluster, namespace)| {
            let lo = ObjectKey::new(
                &resource,
                &cluster.clone().unwrap_or_else(|| ClusterName::from("")),
                namespace.as_deref().unwrap_or(""),
                "",
            );
            let start = match after {
                Some(a) if *a >= lo => Bound::Excluded(a.clone()),
                _ => Bound::Included(lo),
            };
            let resource = resource.clone();
            let scan = self
                .objects
                .range((start, Bound::Unbounded))
                .map(|e| &e.0)
                .take_while(move |o| {
                    o.key.resource == resource
                        && cluster.as_ref().is_none_or(|c| o.key.cluster == *c)
                        && namespace.as_ref().is_none_or(|n| *o.key.namespace == **n)
                });
            until(q.deadline, scan).filter(move |o| q.matches(o))
        }))
    }

    /// One page of at most `limit` matching objects after `after`.
    pub fn page(&self, q: &Query, after: Option<&ObjectKey>, limit: usize) -> Page {
        self.page_within(q, after, limit, usize::MAX)
    }

    /// A page of at most `limit` objects whose sizes (see [`Object::wire_size`]) add up
    /// to at most `max_bytes`; at least one object, however large, so paging always
    /// moves on.
    pub fn page_within(
        &self,
        q: &Query,
        after: Option<&ObjectKey>,
        limit: usize,
        max_bytes: usize,
    ) -> Page {
        self.page_from(q, after, None, limit, max_bytes)
    }

    /// [`State::page_within`], continuing a page of this snapshot that said `known`
    /// matching objects follow it (its [`Page::remaining`]): this page's remainder is
    /// then that less what it returns, so no page counts what follows it and a list
    /// read page by page costs its objects once. A first page's remainder comes from
    /// the indexes where they give it (the per-namespace totals without selectors, an
    /// index that alone answers the selector); only a first page with other selectors
    /// counts its matches.
    pub fn page_from(
        &self,
        q: &Query,
        after: Option<&ObjectKey>,
        known: Option<u64>,
        limit: usize,
        max_bytes: usize,
    ) -> Page {
        if self.index_answers_exactly(q)
            && let Some(set) = self.indexed_candidates(q)
        {
            // Every key in the set matches: page and remainder come from the set alone.
            let lower: Bound<&ObjectKey> = after.map_or(Bound::Unbounded, Bound::Excluded);
            let known = known.or_else(|| after.is_none().then(|| set.len() as u64));
            let keys = set.range::<_, ObjectKey>((lower, Bound::Unbounded));
            return cut(keys.map(|e| &e.0), limit, max_bytes, known);
        }
        let known = known.or_else(|| {
            (after.is_none() && q.labels.is_empty() && q.fields.is_empty())
                .then(|| self.count_from_totals(q, &[]).total)
        });
        cut(self.matching(q, after), limit, max_bytes, known)
    }

    /// A first page from a state a restore is still making ([`crate::Early`]), whose
    /// objects up to `through` are all made: `None` unless a whole page lies within
    /// them with a match after it, so that what it says follows is so. Its
    /// remainder counts only the matches made so far: a lower bound.
    pub fn early_page(
        &self,
        q: &Query,
        through: &ObjectKey,
        limit: usize,
        max_bytes: usize,
    ) -> Option<Page> {
        let made = self.matching(q, None).take_while(|o| o.key <= *through);
        let page = cut(made, limit, max_bytes, None);
        page.next.is_some().then_some(page)
    }

    /// Counts the matching objects, grouped.
    pub fn count(&self, q: &Query, group_by: &[GroupBy]) -> Counts {
        let by_place = group_by
            .iter()
            .all(|g| matches!(g, GroupBy::Cluster | GroupBy::Namespace));
        if q.labels.is_empty() && q.fields.is_empty() && by_place {
            return self.count_from_totals(q, group_by);
        }
        // Keys are borrowed while counting; only a new group allocates.
        let mut groups: std::collections::HashMap<Vec<std::borrow::Cow<'_, str>>, u64> =
            std::collections::HashMap::new();
        let mut total = 0;
        let mut key: Vec<std::borrow::Cow<'_, str>> = Vec::with_capacity(group_by.len());
        for o in self.matching(q, None) {
            total += 1;
            if group_by.is_empty() {
                continue;
            }
            key.clear();
            for g in group_by {
                key.push(match g {
                    GroupBy::Cluster => std::borrow::Cow::Borrowed(o.key.cluster.as_str()),
                    GroupBy::Namespace => std::borrow::Cow::Borrowed(&*o.key.namespace),
                    GroupBy::Label(k) => std::borrow::Cow::Borrowed(o.label(k).unwrap_or("")),
                    GroupBy::Field(p) => std::borrow::Cow::Owned(
                        q.field(o, p).map(Cow::into_owned).unwrap_or_default(),
                    ),
                });
            }
            match groups.get_mut(key.as_slice()) {
                Some(n) => *n += 1,
                None => {
                    groups.insert(key.clone(), 1);
                }
            }
        }
        Counts {
            groups: groups
                .into_iter()
                .map(|(k, n)| (k.into_iter().map(|c| c.into_owned()).collect(), n))
                .collect(),
            total,
        }
    }

    /// Counts by cluster and namespace from the per-namespace totals, without visiting objects.
    fn count_from_totals(&self, q: &Query, group_by: &[GroupBy]) -> Counts {
        let mut counts = Counts::default();
        for (r, c, ns, n) in self.namespace_counts() {
            if *r != *q.resource
                || q.clusters.as_ref().is_some_and(|cs| !cs.contains(c))
                || (!q.namespaces.is_empty() && !q.namespaces.iter().any(|x| x == ns))
                || q.reach.as_ref().is_some_and(|r| !r.allows(c, ns))
            {
                continue;
            }
            counts.total += n as u64;
            if group_by.is_empty() {
                continue;
            }
            let key = group_by
                .iter()
                .map(|g| match g {
                    GroupBy::Cluster => c.to_string(),
                    _ => ns.to_string(),
                })
                .collect();
            *counts.groups.entry(key).or_default() += n as u64;
        }
        counts
    }
}

/// `items` until `deadline`, read every so many items (reading the clock for each
/// would cost more than most matches).
fn until<T>(
    deadline: Option<std::time::Instant>,
    items: impl Iterator<Item = T>,
) -> impl Iterator<Item = T> {
    let mut n: u32 = 0;
    items.take_while(move |_| {
        n = n.wrapping_add(1);
        deadline.is_none_or(|d| !n.is_multiple_of(1024) || std::time::Instant::now() < d)
    })
}

/// Takes a page from `matching`. What follows it is `known` (every match `matching`
/// yields) less the page, when known, else counted.
fn cut<'a>(
    matching: impl Iterator<Item = &'a ObjectRef>,
    limit: usize,
    max_bytes: usize,
    known: Option<u64>,
) -> Page {
    let mut matching = matching.peekable();
    let mut items: Vec<ObjectRef> = Vec::new();
    let mut bytes = 0usize;
    while items.len() < limit.max(1) {
        let Some(o) = matching.peek() else { break };
        let size = o.wire_size();
        if !items.is_empty() && bytes.saturating_add(size) > max_bytes {
            break;
        }
        bytes = bytes.saturating_add(size);
        items.push((*o).clone());
        matching.next();
    }
    let more = matching.peek().is_some();
    let remaining = match (more, known) {
        (false, _) => 0,
        // At least the one seen, whatever the count said.
        (true, Some(n)) => n.saturating_sub(items.len() as u64).max(1),
        (true, None) => matching.count() as u64,
    };
    Page {
        next: if more {
            items.last().map(|o| o.key.clone())
        } else {
            None
        },
        items,
        remaining,
    }
}

/// The objects an index's candidate set names that match a query, after a key, read
/// from the set a few at a time: a page takes what it needs, never every candidate
/// after it.
struct Candidates<'a> {
    set: KeySet,
    state: &'a State,
    query: &'a Query,
    /// The last key read from the set.
    cursor: Option<ObjectKey>,
    /// Matches read and not yet taken.
    ready: std::vec::IntoIter<&'a ObjectRef>,
    /// The set is read to its end, or the query's deadline passed.
    done: bool,
}

/// Candidates read from the set at once.
const CANDIDATES_AT_ONCE: usize = 256;

impl<'a> Iterator for Candidates<'a> {
    type Item = &'a ObjectRef;

    fn next(&mut self) -> Option<&'a ObjectRef> {
        loop {
            if let Some(o) = self.ready.next() {
                return Some(o);
            }
            if self.done {
                return None;
            }
            let lower: Bound<&ObjectKey> = self
                .cursor
                .as_ref()
                .map_or(Bound::Unbounded, Bound::Excluded);
            let read: Vec<&ObjectRef> = self
                .set
                .range::<_, ObjectKey>((lower, Bound::Unbounded))
                .take(CANDIDATES_AT_ONCE)
                .map(|e| &e.0)
                .collect();
            self.done = read.len() < CANDIDATES_AT_ONCE
                || self
                    .query
                    .deadline
                    .is_some_and(|d| std::time::Instant::now() >= d);
            self.cursor = read.last().map(|o| o.key.clone());
            let (state, query) = (self.state, self.query);
            let matched: Vec<&'a ObjectRef> = read
                .into_iter()
                .filter(|o| query.matches(o))
                .filter_map(|o| state.get(&o.key))
                .collect();
            self.ready = matched.into_iter();
        }
    }
}
