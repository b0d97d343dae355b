//! Carrying a Watch across a move by the member's own history. A subscriber that
//! comes to this replica from another stands, for each cluster, at a member
//! resourceVersion. Where this replica's event log does not reach back to it (it took
//! the cluster over with a list made after it), the member's API server still holds
//! the history: the subscriber's stream is read from there — the state at exactly its
//! position, then every change after it — and handed over to this replica's own
//! stream where the two meet:
//!
//! - by position: once the history has reached the position this replica's stream
//!   stands at (or gone past it: the stream's changes up to the history's position
//!   are then skipped), every later change comes from the stream;
//! - by content: a quiet cluster may never send another change to meet at (a list
//!   stands at a resourceVersion no object has), so once the history's objects are
//!   exactly the stream's (each object's JSON, as both are pruned alike), the
//!   subscriber holds the stream's state and goes on from there.
//!
//! A member that no longer holds the position (410 Gone, compacted) or cannot be read
//! sends the cluster anew instead, as before: an explicit reset, never a gap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleetscope_index::{Event, Object, ObjectRef, Query, State, number};
use fleetscope_informer::history::{History, HistoryEnd};
use fleetscope_model::{ClusterName, EventType, ObjectKey, Revision};

use crate::ingest::Past;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Every running stream's history reader, lent by the cluster loops, the reads in
/// progress, shared, and each caller's places for new reads.
#[derive(Clone, Default)]
pub(crate) struct Histories(
    Arc<Mutex<HashMap<(ClusterName, String), History>>>,
    Arc<Mutex<HashMap<ReadKey, std::sync::Weak<SharedRead>>>>,
    Arc<Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>>,
);

/// Reads of members' histories one caller's Watches may start at once, whatever the
/// clusters (joining a read in progress costs none): more wait, so that no caller can
/// make a replica read members on its behalf without bound.
pub(crate) const READS_PER_CALLER: usize = 4;

/// A read of one stream's history from one position.
type ReadKey = (ClusterName, Arc<str>, Arc<str>);

/// One read of a member's history from one position, shared by every subscriber
/// carried from there at once: what it has given so far is kept, so a subscriber that
/// joins late is given all of it, and the member is read once however many resume
/// from the same position. It stops once no subscriber holds it.
pub(crate) struct SharedRead {
    /// The updates so far, as the ingest converted them, and how the read ended.
    log: Mutex<(Vec<Past>, Option<HistoryEnd>)>,
    /// How many entries the log has (updates, and the end), for readers to wait on.
    grown: tokio::sync::watch::Sender<usize>,
    /// Stops the read.
    stop: CancellationToken,
}

impl Drop for SharedRead {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SharedRead {
    /// The entries from `from` on: the updates, and the end once every update is
    /// given.
    fn since(&self, from: usize) -> (Vec<Past>, Option<HistoryEnd>) {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let updates = log.0.get(from..).map(<[Past]>::to_vec).unwrap_or_default();
        (updates, log.1.clone())
    }
}

impl Histories {
    /// Keeps (or, with `None`, forgets) the reader of `resource` in `cluster`.
    pub(crate) fn lend(&self, cluster: &ClusterName, resource: &str, history: Option<History>) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (cluster.clone(), resource.to_string());
        match history {
            Some(h) => {
                held.insert(key, h);
            }
            None => {
                held.remove(&key);
            }
        }
    }

    /// The reader of `resource` in `cluster`, while its stream runs.
    pub(crate) fn of(&self, cluster: &ClusterName, resource: &str) -> Option<History> {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&(cluster.clone(), resource.to_string())).cloned()
    }

    /// The read of `history` from `from`: the one in progress, joined, or a new one
    /// started for `caller` once it has a place (on `tasks`, until no one holds it or
    /// `cancel`).
    pub(crate) fn read(
        &self,
        history: History,
        from: Arc<str>,
        caller: &str,
        tasks: &TaskTracker,
        cancel: &CancellationToken,
    ) -> Arc<SharedRead> {
        let key = (
            history.stream().cluster.clone(),
            history.stream().name.clone(),
            from.clone(),
        );
        let mut reads = self.1.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(read) = reads.get(&key).and_then(std::sync::Weak::upgrade) {
            return read;
        }
        reads.retain(|_, r| r.strong_count() > 0);
        let read = Arc::new(SharedRead {
            log: Mutex::default(),
            grown: tokio::sync::watch::Sender::new(0),
            stop: cancel.child_token(),
        });
        reads.insert(key, Arc::downgrade(&read));
        drop(reads);
        let places = {
            let mut callers = self.2.lock().unwrap_or_else(|e| e.into_inner());
            // Callers with no read in progress are forgotten.
            callers.retain(|_, s| Arc::strong_count(s) > 1);
            callers
                .entry(caller.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(READS_PER_CALLER)))
                .clone()
        };
        let span = tracing::info_span!("task", task = "watch-history", cluster = %history.stream().cluster, resource = %history.stream().name);
        let (token, shared) = (read.stop.clone(), Arc::downgrade(&read));
        tasks.spawn(
            async move {
                let _place = tokio::select! {
                    p = places.acquire_owned() => p,
                    _ = token.cancelled() => return,
                };
                let (updates, mut rx) = mpsc::channel(64);
                let reading = history.read(&from, updates, token);
                tokio::pin!(reading);
                let push = |entry: Result<fleetscope_informer::Update, HistoryEnd>| {
                    let Some(shared) = shared.upgrade() else {
                        return false;
                    };
                    let mut log = shared.log.lock().unwrap_or_else(|e| e.into_inner());
                    match entry {
                        Ok(u) => log.0.push(crate::ingest::past(u)),
                        Err(end) => log.1 = Some(end),
                    }
                    let n = log.0.len() + usize::from(log.1.is_some());
                    drop(log);
                    shared.grown.send_replace(n);
                    true
                };
                let end = loop {
                    tokio::select! {
                        end = &mut reading => break end,
                        Some(u) = rx.recv() => if !push(Ok(u)) { return },
                    }
                };
                while let Some(u) = rx.recv().await {
                    if !push(Ok(u)) {
                        return;
                    }
                }
                push(Err(end));
            }
            .instrument(span),
        );
        read
    }
}

/// What a history read tells its Watch.
#[derive(Debug)]
pub(crate) enum Caught {
    /// The state at the position, a change, or a bookmark.
    Update(Past),
    /// The read ended.
    End(HistoryEnd),
}

/// One cluster's stream of a Watch, carried by its member's history.
pub(crate) struct CatchUp {
    /// The member's objects at `position`, before the subscriber's filter.
    objects: HashMap<ObjectKey, ObjectRef>,
    /// The member resourceVersion the subscriber is carried to.
    position: Arc<str>,
    /// Whether the state at the first position is in.
    listed: bool,
    /// The revision the Watch started at: this replica's changes up to it are not
    /// the subscriber's concern (a replay of the cluster leaving earlier, say).
    floor: Revision,
    /// Stops passing the read on when the catch-up is dropped.
    _read: DropGuard,
    /// The read, shared with other subscribers from the same position: it stops once
    /// none holds it.
    _shared: Arc<SharedRead>,
}

/// Where a caught-up stream goes on from this replica's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Meet {
    /// Its changes after `floor` follow, but those at or before the member position
    /// `skip_to` (the subscriber has them).
    After {
        /// The revision after which the stream's changes follow.
        floor: Revision,
        /// The subscriber's position, when ahead of the stream's.
        skip_to: Option<u64>,
        /// The subscriber's position.
        position: Arc<str>,
    },
    /// Not yet.
    Apart,
}

impl CatchUp {
    /// Passes `read` (of `cluster`'s history from `from`) on to `tx` as `cluster`'s,
    /// from its first update (on `tasks`, until dropped or `cancel`).
    pub(crate) fn start(
        read: Arc<SharedRead>,
        cluster: ClusterName,
        from: Arc<str>,
        floor: Revision,
        tx: mpsc::Sender<(ClusterName, Caught)>,
        tasks: &TaskTracker,
        cancel: &CancellationToken,
    ) -> Self {
        let stop = cancel.child_token();
        let span = tracing::info_span!("task", task = "watch-history-reader", cluster = %cluster);
        let (shared, token) = (read.clone(), stop.clone());
        tasks.spawn(
            async move {
                let mut grown = shared.grown.subscribe();
                let mut given = 0;
                loop {
                    let (updates, end) = shared.since(given);
                    let all = updates.is_empty();
                    for u in updates {
                        given += 1;
                        if tx.send((cluster.clone(), Caught::Update(u))).await.is_err() {
                            return;
                        }
                    }
                    if all && let Some(end) = end {
                        let _ = tx.send((cluster, Caught::End(end))).await;
                        return;
                    }
                    if all {
                        tokio::select! {
                            r = grown.changed() => if r.is_err() { return },
                            _ = token.cancelled() => return,
                        }
                    }
                }
            }
            .instrument(span),
        );
        Self {
            objects: HashMap::new(),
            position: from,
            listed: false,
            floor,
            _read: stop.drop_guard(),
            _shared: read,
        }
    }

    /// Takes an update of the history: the changes it makes, as the index's events
    /// (at `revision`, the Watch's), each with its member position.
    pub(crate) fn apply(&mut self, update: Past, revision: Revision) -> Vec<Event> {
        match update {
            Past::State(objects) => {
                self.objects = objects
                    .into_iter()
                    .map(|input| (input.key.clone(), Object::detached(input, revision)))
                    .collect();
                self.listed = true;
                Vec::new()
            }
            Past::Applied(input, position) => {
                let object = Object::detached(input, revision);
                let prev = self.objects.insert(object.key.clone(), object.clone());
                let kind = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                self.moved(position);
                vec![self.event(revision, kind, object, prev)]
            }
            Past::Deleted(input, position) => {
                let object = Object::detached(input, revision);
                let prev = self.objects.remove(&object.key);
                self.moved(position);
                vec![self.event(revision, EventType::Deleted, object, prev)]
            }
            Past::Progress(Some(position)) => {
                self.moved(position);
                Vec::new()
            }
            Past::Progress(None) => Vec::new(),
        }
    }

    fn moved(&mut self, position: Arc<str>) {
        if !position.is_empty() {
            self.position = position;
        }
    }

    fn event(
        &self,
        revision: Revision,
        kind: EventType,
        object: ObjectRef,
        prev: Option<ObjectRef>,
    ) -> Event {
        let mut e = Event::new(revision, kind, object, prev);
        e.position = Some(self.position.clone());
        e
    }

    /// The revision the Watch started at.
    pub(crate) fn floor(&self) -> Revision {
        self.floor
    }

    /// The member position the subscriber is carried to.
    pub(crate) fn position(&self) -> &Arc<str> {
        &self.position
    }

    /// Whether the subscriber, carried to here, can go on from this replica's
    /// stream of `resource` in `cluster`, which the Watch has read to `reached` and
    /// `snapshot` (at or past it) holds; `by_content` compares the objects too (a
    /// walk over the cluster's objects of the type: not for every change).
    pub(crate) fn meets(
        &self,
        snapshot: &State,
        reached: Revision,
        resource: &str,
        cluster: &ClusterName,
        by_content: bool,
    ) -> Meet {
        if !self.listed {
            return Meet::Apart;
        }
        let Some(held) = snapshot.position(resource, cluster) else {
            return Meet::Apart;
        };
        let (Some(held_n), Some(here)) = (number(held), number(&self.position)) else {
            return Meet::Apart;
        };
        if held_n <= here {
            // The stream stands at or behind the subscriber, with every change since
            // `reached` still to come to the Watch: those up to here it has.
            return Meet::After {
                floor: reached,
                skip_to: (held_n < here || snapshot.revision() > reached).then_some(here),
                position: self.position.clone(),
            };
        }
        if by_content && self.same_as(snapshot, resource, cluster) {
            return Meet::After {
                floor: snapshot.revision(),
                skip_to: None,
                position: held.clone(),
            };
        }
        Meet::Apart
    }

    /// Whether the objects are exactly `snapshot`'s of the type in the cluster.
    fn same_as(&self, snapshot: &State, resource: &str, cluster: &ClusterName) -> bool {
        let mut query = Query::all(resource);
        query.clusters = Some(vec![cluster.clone()]);
        let mut count = 0;
        for o in snapshot.matching(&query, None) {
            count += 1;
            match self.objects.get(&o.key) {
                Some(mine) if mine.same_json(o) => {}
                _ => return false,
            }
        }
        count == self.objects.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetscope_index::{Change, Index};
    use fleetscope_informer::{PrunedObject, StreamId, Update};
    use fleetscope_model::ObjectState;
    use fleetscope_model::ResourceType;

    fn pods() -> ResourceType {
        ResourceType::new("", "v1", "pods", "Pod", true)
    }

    fn pruned(name: &str, rv: u64) -> PrunedObject {
        let json = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}}}}"#
        );
        fleetscope_informer::prune::prune(&json, &pods(), &Default::default()).unwrap()
    }

    fn stream() -> Arc<StreamId> {
        Arc::new(StreamId::new(ClusterName::from("a"), pods()))
    }

    /// `u` as the read hands it on (converted by the ingest), taken by `c`.
    fn take(c: &mut CatchUp, u: Update, revision: Revision) -> Vec<Event> {
        c.apply(crate::ingest::past(u), revision)
    }

    /// A catch-up with no read behind it.
    fn idle(from: &str) -> CatchUp {
        CatchUp {
            objects: HashMap::new(),
            position: Arc::from(from),
            listed: false,
            floor: Revision(0),
            _read: CancellationToken::new().drop_guard(),
            _shared: Arc::new(SharedRead {
                log: Mutex::default(),
                grown: tokio::sync::watch::Sender::new(0),
                stop: CancellationToken::new(),
            }),
        }
    }

    fn listed(objects: Vec<PrunedObject>, rv: &str) -> Update {
        Update::Listed {
            stream: stream(),
            objects,
            parts: None,
            resource_version: rv.into(),
            reason: fleetscope_informer::stream::ListReason::Initial,
            method: None,
            fallback: None,
        }
    }

    fn held(index: &Index, objects: &[(&str, u64)], position: &str) {
        let mut changes: Vec<Change> = objects
            .iter()
            .map(|(name, rv)| {
                let o = pruned(name, *rv);
                Change::Upsert(ObjectState {
                    key: ObjectKey::new("pods", &ClusterName::from("a"), "ns", name),
                    json: o.json.into(),
                    labels: Vec::new(),
                    owners: Vec::new(),
                    fields: Vec::new(),
                })
            })
            .collect();
        changes.push(Change::Reached {
            resource: Arc::from("pods"),
            cluster: ClusterName::from("a"),
            resource_version: Arc::from(position),
        });
        let staged = index.stage(changes);
        index.publish(staged);
    }

    #[test]
    fn changes_carry_their_previous_state_and_their_position() {
        let mut c = idle("10");
        assert!(take(&mut c, listed(vec![pruned("p1", 5)], "10"), Revision(7)).is_empty());
        let added = take(
            &mut c,
            Update::Applied {
                stream: stream(),
                object: pruned("p2", 11),
                created: true,
            },
            Revision(7),
        );
        assert_eq!(added[0].kind, EventType::Added);
        assert!(added[0].prev.is_none());
        assert_eq!(added[0].position.as_deref(), Some("11"));
        let changed = take(
            &mut c,
            Update::Applied {
                stream: stream(),
                object: pruned("p1", 12),
                created: false,
            },
            Revision(7),
        );
        assert_eq!(changed[0].kind, EventType::Modified);
        assert!(changed[0].prev.as_ref().unwrap().json().contains("\"5\""));
        let deleted = take(
            &mut c,
            Update::Deleted {
                stream: stream(),
                object: pruned("p2", 13),
            },
            Revision(7),
        );
        assert_eq!(deleted[0].kind, EventType::Deleted);
        assert!(deleted[0].prev.is_some());
        take(
            &mut c,
            Update::Progress {
                stream: stream(),
                resource_version: "20".into(),
            },
            Revision(7),
        );
        assert_eq!(&**c.position(), "20");
    }

    #[test]
    fn it_meets_the_stream_by_position_or_by_content_and_not_before() {
        let index = Index::new(Default::default());
        held(&index, &[("p1", 5)], "30");
        let snapshot = index.snapshot();
        let reached = snapshot.revision();
        let a = ClusterName::from("a");
        let mut c = idle("10");
        // Nothing listed yet: never.
        assert_eq!(c.meets(&snapshot, reached, "pods", &a, true), Meet::Apart);
        take(
            &mut c,
            listed(vec![pruned("p1", 5), pruned("p2", 6)], "10"),
            reached,
        );
        // Behind the stream, and other objects: not yet.
        assert_eq!(c.meets(&snapshot, reached, "pods", &a, true), Meet::Apart);
        take(
            &mut c,
            Update::Deleted {
                stream: stream(),
                object: pruned("p2", 15),
            },
            reached,
        );
        // The same objects now: by content, at the stream's own position.
        assert_eq!(c.meets(&snapshot, reached, "pods", &a, false), Meet::Apart);
        assert_eq!(
            c.meets(&snapshot, reached, "pods", &a, true),
            Meet::After {
                floor: reached,
                skip_to: None,
                position: Arc::from("30")
            }
        );
        // Past the stream: by position, skipping what it has.
        take(
            &mut c,
            Update::Applied {
                stream: stream(),
                object: pruned("p3", 40),
                created: true,
            },
            reached,
        );
        assert_eq!(
            c.meets(&snapshot, reached, "pods", &a, false),
            Meet::After {
                floor: reached,
                skip_to: Some(40),
                position: Arc::from("40")
            }
        );
    }
}
