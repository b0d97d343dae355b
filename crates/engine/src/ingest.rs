//! The one ordered writer: informers' updates → batches of index changes, made
//! visible in memory at once or, with a store, once durable; and the stream progress
//! each batch implies, reported to the status table when the batch is visible.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use fleetscope_index::{Change, Index};
use fleetscope_informer::PrunedObject;
use fleetscope_informer::stream::{ListReason, StreamId, Update};
use fleetscope_model::selector::field_in_json;
use fleetscope_model::{ClusterName, Location, ObjectKey, ObjectState, ResourceType};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::persist::Persister;
use crate::progress::{Progress, ProgressLog};
use crate::status::{StatusTable, StreamCounts};

/// Stored objects carry the field-index values of the configuration that stored them;
/// when the configured paths differ, the values are read again from each object's JSON.
pub(crate) fn reindex_fields(loaded: &mut fleetscope_store::Loaded, paths: &[String]) {
    if loaded.field_indexes.as_deref() == Some(paths) {
        return;
    }
    // Read out as records: each one's fields are made again.
    let mut objects = std::mem::take(&mut loaded.objects).into_records();
    let records = objects.iter_mut().chain(
        loaded
            .events
            .iter_mut()
            .flat_map(|e| std::iter::once(&mut e.object).chain(e.prev.as_mut())),
    );
    let mut redone = 0usize;
    for o in records {
        o.state.fields = field_values(&o.text(), paths);
        redone += 1;
    }
    loaded.objects = fleetscope_store::Objects::from(objects);
    if redone > 0 {
        tracing::info!(
            objects = redone,
            "field indexes changed since the store was written: values read again"
        );
    }
}

/// The configured field-index values of an object, read at any nesting depth.
fn field_values(json: &str, paths: &[String]) -> Vec<(String, String)> {
    paths
        .iter()
        .filter_map(|p| Some((p.clone(), field_in_json(json, p)?)))
        .collect()
}

/// An object's key, sharing the stream's resource name and cluster.
fn stream_key(stream: &StreamId, o: &PrunedObject) -> ObjectKey {
    StreamKeys::new(stream).key(o)
}

/// Keys of one stream's objects: consecutive objects of one namespace (as a list gives
/// them) share one location, so the index finds its shared copy without a lookup.
struct StreamKeys<'a> {
    stream: &'a StreamId,
    last: Option<Arc<Location>>,
}

impl<'a> StreamKeys<'a> {
    fn new(stream: &'a StreamId) -> Self {
        Self { stream, last: None }
    }

    fn key(&mut self, o: &PrunedObject) -> ObjectKey {
        let location = match &self.last {
            Some(l) if *l.namespace == *o.namespace => l.clone(),
            _ => self
                .last
                .insert(Arc::new(Location {
                    resource: self.stream.name.clone(),
                    cluster: self.stream.cluster.clone(),
                    namespace: Arc::from(o.namespace.as_str()),
                }))
                .clone(),
        };
        ObjectKey::in_location(location, Arc::from(o.name.as_str()))
    }
}

/// A first list arriving in parts ([`Update::ListPart`]).
struct Parts {
    /// Which list.
    list: u64,
    state: PartsState,
}

enum PartsState {
    /// Nothing of the stream was held when the list began: its parts go into the
    /// index as they arrive.
    Applied,
    /// Something was: the parts are gathered and the whole list replaces what is held
    /// at its end, as a re-list does.
    Gathered(Vec<ObjectState>),
}

/// A list's objects as the index takes them, keyed in the stream.
pub(crate) fn inputs(stream: &StreamId, objects: Vec<PrunedObject>) -> Vec<ObjectState> {
    let mut keys = StreamKeys::new(stream);
    objects
        .into_iter()
        .map(|o| to_input(keys.key(&o), o))
        .collect()
}

/// One object of `stream` as the index takes it.
pub(crate) fn input(stream: &StreamId, o: PrunedObject) -> ObjectState {
    to_input(stream_key(stream, &o), o)
}

/// A member's history, as a Watch carried by it takes it: each update of the read
/// converted here, as the stream's own updates are, so the Watch's side deals in
/// the index's objects only.
#[derive(Debug, Clone)]
pub(crate) enum Past {
    /// The objects at exactly the position the read started from.
    State(Vec<ObjectState>),
    /// An object created or changed, and the member position of the change.
    Applied(ObjectState, Arc<str>),
    /// An object deleted (its last state), and the member position of the change.
    Deleted(ObjectState, Arc<str>),
    /// The member's position moved with no change (a bookmark), or the read said
    /// something that changes nothing (`None`).
    Progress(Option<Arc<str>>),
}

impl Past {
    /// Whether it is a change of one object (not a state to compare whole).
    pub(crate) fn is_change(&self) -> bool {
        matches!(self, Past::Applied(..) | Past::Deleted(..))
    }
}

/// One update of a member's history read, as a Watch takes it.
pub(crate) fn past(update: Update) -> Past {
    let position = |o: &PrunedObject| Arc::from(o.resource_version.as_str());
    match update {
        Update::Listed {
            stream, objects, ..
        } => Past::State(inputs(&stream, objects)),
        Update::Applied { stream, object, .. } => {
            let at = position(&object);
            Past::Applied(input(&stream, object), at)
        }
        Update::Deleted { stream, object } => {
            let at = position(&object);
            Past::Deleted(input(&stream, object), at)
        }
        Update::Progress {
            resource_version, ..
        } => Past::Progress(Some(Arc::from(resource_version.as_str()))),
        _ => Past::Progress(None),
    }
}

/// An object as the index takes it: everything it needs was read in the prune pass.
/// Its JSON is held from here in an allocation of its own, made as the ingest takes
/// it, among the index's, rather than where the prune pass made it.
fn to_input(key: ObjectKey, o: PrunedObject) -> ObjectState {
    ObjectState {
        key,
        json: o.json.into(),
        labels: o.labels,
        owners: o.owners,
        fields: o.fields,
    }
}

/// The one ordered writer: drains what is waiting, applies it as one batch, then
/// records stream progress, so status never runs ahead of the index.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn ingest(
    index: Arc<Index>,
    status: StatusTable,
    persister: Option<Arc<Persister>>,
    mut rx: mpsc::Receiver<Update>,
    batch: usize,
    keep_removed: bool,
    cancel: CancellationToken,
) {
    let mut writer = Writer {
        index,
        status,
        keep_removed,
        cancel,
        parts: HashMap::new(),
    };
    loop {
        let first = tokio::select! {
            u = rx.recv() => match u { Some(u) => u, None => return },
            _ = writer.cancel.cancelled() => return,
        };
        let mut b = Batch::default();
        writer.take(&mut b, first);
        let mut taken = 1;
        while taken < batch {
            match rx.try_recv() {
                Ok(u) => writer.take(&mut b, u),
                Err(_) => break,
            }
            taken += 1;
        }
        writer.finish(b, persister.as_deref()).await;
    }
}

/// What the writer keeps between batches.
struct Writer {
    index: Arc<Index>,
    status: StatusTable,
    /// Whether a cluster no longer configured keeps its objects.
    keep_removed: bool,
    /// Set when the engine stops.
    cancel: CancellationToken,
    /// First lists arriving in parts, by stream.
    parts: HashMap<StreamKey, Parts>,
}

/// A stream by cluster and resource name.
type StreamKey = (ClusterName, Arc<str>);

fn key_of(stream: &StreamId) -> StreamKey {
    (stream.cluster.clone(), stream.name.clone())
}

/// Where a stream resumes (its resourceVersion and selection), or `None`: it lists.
type ResumePoint = (ClusterName, ResourceType, Option<(String, Arc<str>)>);

/// One batch in the making.
#[derive(Default)]
struct Batch {
    /// The index changes, in order.
    changes: Vec<Change>,
    /// The progress each stream made, recorded once the batch is applied, so status
    /// never runs ahead of the index.
    after: Vec<(Arc<StreamId>, Progress)>,
    /// Clusters no longer configured.
    gone: Vec<ClusterName>,
    /// What each stream received, for metrics.
    counts: HashMap<StreamKey, (ResourceType, StreamCounts)>,
    /// Resume points of streams that end with their cluster.
    dropped: Vec<ResumePoint>,
    /// Streams whose objects this batch changes (not yet staged).
    touched: HashSet<StreamKey>,
}

impl Batch {
    fn count(&mut self, stream: &StreamId, f: impl FnOnce(&mut StreamCounts)) {
        let (_, c) = self
            .counts
            .entry(key_of(stream))
            .or_insert_with(|| (stream.resource.clone(), StreamCounts::default()));
        f(c);
    }

    /// The resume points the batch implies, written with its events.
    fn resume_points(&self) -> Vec<ResumePoint> {
        self.after
            .iter()
            .filter_map(|(stream, progress)| {
                let rv = match progress {
                    Progress::Listed(rv) | Progress::Event(rv) | Progress::Bookmark(rv)
                        if !rv.is_empty() =>
                    {
                        Some((rv.clone(), stream.selection.clone()))
                    }
                    Progress::Dropped => None,
                    _ => return None,
                };
                Some((stream.cluster.clone(), stream.resource.clone(), rv))
            })
            .chain(self.dropped.iter().cloned())
            .collect()
    }
}

impl Writer {
    /// Adds one update to the batch.
    fn take(&mut self, b: &mut Batch, u: Update) {
        match u {
            Update::ListPart {
                stream,
                list,
                objects,
            } => self.list_part(b, &stream, list, objects),
            Update::ClusterGone { cluster } => self.cluster_gone(b, cluster),
            Update::Listed {
                stream,
                objects,
                parts,
                resource_version,
                reason,
                method,
                fallback,
            } => {
                if method.is_some() {
                    self.status
                        .update_stream(&stream.cluster, &stream.resource, |s| {
                            s.sync_method = method;
                            s.watch_list_fallback = fallback;
                        });
                }
                self.listed(b, stream, objects, parts, resource_version, reason);
            }
            Update::Applied {
                stream,
                object,
                created,
            } => applied(b, stream, object, created),
            Update::Deleted { stream, object } => deleted(b, stream, object),
            Update::Progress {
                stream,
                resource_version,
            } => {
                // The stream's state is the member's at the bookmark: a position a
                // subscriber may stand at.
                if !resource_version.is_empty() {
                    b.changes.push(Change::Reached {
                        resource: stream.name.clone(),
                        cluster: stream.cluster.clone(),
                        resource_version: Arc::from(resource_version.as_str()),
                    });
                }
                b.after.push((stream, Progress::Bookmark(resource_version)))
            }
            Update::State {
                stream,
                state,
                error,
            } => b.after.push((stream, Progress::State(state, error))),
            Update::Dropped { stream, drops } => b.count(&stream, |c| c.dropped.add(&drops)),
        }
    }

    /// A part of a first list: applied as it arrives only if nothing of the stream is
    /// held (nor staged, nor changed by this batch, nor left by an abandoned list);
    /// otherwise gathered and diffed against what is held at its end, as any re-list.
    fn list_part(
        &mut self,
        b: &mut Batch,
        stream: &StreamId,
        list: u64,
        objects: Vec<PrunedObject>,
    ) {
        let id = key_of(stream);
        let objects = inputs(stream, objects);
        unindexed_labels(b, stream, &objects);
        let state = match self.parts.remove(&id) {
            Some(p) if p.list == list => p.state,
            earlier => {
                if earlier.is_none()
                    && !b.touched.contains(&id)
                    && !self.index.holds_any(&stream.name, &stream.cluster)
                {
                    PartsState::Applied
                } else {
                    PartsState::Gathered(Vec::new())
                }
            }
        };
        let state = match state {
            PartsState::Applied => {
                b.changes.push(Change::Add(objects));
                PartsState::Applied
            }
            PartsState::Gathered(mut held) => {
                held.extend(objects);
                PartsState::Gathered(held)
            }
        };
        b.touched.insert(id.clone());
        self.parts.insert(id, Parts { list, state });
    }

    /// A cluster no longer configured: its objects deleted (unless kept), its streams'
    /// resume points dropped. The engine stopping is not a cluster leaving: what is
    /// stored stays for the next start.
    fn cluster_gone(&mut self, b: &mut Batch, cluster: ClusterName) {
        self.parts.retain(|(c, _), _| *c != cluster);
        if self.cancel.is_cancelled() {
            tracing::debug!(%cluster, "cluster loop ended by the engine stopping");
            return;
        }
        if self.keep_removed {
            tracing::info!(%cluster, "cluster no longer configured: keeping its objects");
        } else {
            tracing::info!(%cluster, "cluster no longer configured: deleting its objects");
            b.changes.push(Change::RemoveCluster(cluster.clone()));
            if let Some(c) = self.status.cluster(&cluster) {
                b.dropped.extend(
                    c.streams
                        .values()
                        .map(|(rt, _)| (cluster.clone(), rt.clone(), None)),
                );
            }
        }
        b.gone.push(cluster);
    }

    /// A whole list (or the end of one in parts): what it holds replaces the stream's
    /// objects, except after parts applied over nothing, when the rest is added.
    fn listed(
        &mut self,
        b: &mut Batch,
        stream: Arc<StreamId>,
        objects: Vec<PrunedObject>,
        listed_parts: Option<u64>,
        resource_version: String,
        reason: ListReason,
    ) {
        match reason {
            ListReason::Initial => b.count(&stream, |c| c.initial_lists += 1),
            ListReason::Expired => b.count(&stream, |c| c.expired_lists += 1),
            ListReason::Confirm => b.count(&stream, |c| c.confirm_lists += 1),
            ListReason::Dropped => {}
        }
        let id = key_of(&stream);
        let mut objects = inputs(&stream, objects);
        unindexed_labels(b, &stream, &objects);
        match (self.parts.remove(&id), listed_parts) {
            (
                Some(Parts {
                    list,
                    state: PartsState::Applied,
                }),
                Some(n),
            ) if list == n => b.changes.push(Change::Add(objects)),
            (earlier, _) => {
                if let Some(Parts {
                    list,
                    state: PartsState::Gathered(mut gathered),
                }) = earlier
                    && Some(list) == listed_parts
                {
                    gathered.append(&mut objects);
                    objects = gathered;
                }
                b.changes.push(Change::Replace {
                    resource: stream.name.to_string(),
                    cluster: stream.cluster.clone(),
                    objects,
                });
            }
        }
        b.touched.insert(id);
        let progress = if resource_version.is_empty() {
            Progress::Dropped
        } else {
            b.changes.push(Change::Reached {
                resource: stream.name.clone(),
                cluster: stream.cluster.clone(),
                resource_version: Arc::from(resource_version.as_str()),
            });
            Progress::Listed(resource_version)
        };
        b.after.push((stream, progress));
    }

    /// Applies the batch: visible at once in memory, or once durable with a store,
    /// with the stream progress it implies.
    async fn finish(&self, b: Batch, persister: Option<&Persister>) {
        for ((cluster, _), (rt, c)) in &b.counts {
            self.status.update_stream(cluster, rt, |s| s.counts.add(c));
        }
        let resume_points = b.resume_points();
        let mut log = ProgressLog::default();
        for (stream, progress) in b.after {
            log.push(stream, progress);
        }
        for cluster in b.gone {
            log.gone(cluster, self.keep_removed);
        }
        match persister {
            // Visible once durable: the persister publishes the batch and its progress.
            Some(p) => {
                p.record(self.index.stage(b.changes), resume_points, log);
                p.backpressure().await;
            }
            None => {
                self.index.apply(b.changes);
                log.apply(&self.status);
            }
        }
    }
}

/// An object created or updated by a watch event.
fn applied(b: &mut Batch, stream: Arc<StreamId>, object: PrunedObject, created: bool) {
    if created {
        b.count(&stream, |c| c.added += 1);
    } else {
        b.count(&stream, |c| c.modified += 1);
    }
    let rv = object.resource_version.clone();
    let input = input(&stream, object);
    unindexed_labels(b, &stream, std::slice::from_ref(&input));
    b.touched.insert(key_of(&stream));
    b.changes.push(if rv.is_empty() {
        Change::Upsert(input)
    } else {
        Change::UpsertAt(input, Arc::from(rv.as_str()))
    });
    b.after.push((stream, Progress::Event(rv)));
}

/// Counts and reports each object with more labels than the label index takes of one
/// object: held, served and selected by a scan, at a cost bounded by its size.
fn unindexed_labels(b: &mut Batch, stream: &StreamId, objects: &[ObjectState]) {
    for o in objects
        .iter()
        .filter(|o| o.labels.len() > fleetscope_index::MAX_INDEXED_LABELS)
    {
        b.count(stream, |c| c.unindexed_labels += 1);
        tracing::warn!(
            object = %o.key,
            labels = o.labels.len(),
            max = fleetscope_index::MAX_INDEXED_LABELS,
            "an object carries more labels than the label index takes: they are held, served and selected by a scan"
        );
    }
}

/// An object deleted by a watch event.
fn deleted(b: &mut Batch, stream: Arc<StreamId>, object: PrunedObject) {
    b.count(&stream, |c| c.deleted += 1);
    b.touched.insert(key_of(&stream));
    let key = stream_key(&stream, &object);
    b.changes.push(if object.resource_version.is_empty() {
        Change::Delete(key)
    } else {
        Change::DeleteAt(key, Arc::from(object.resource_version.as_str()))
    });
    b.after
        .push((stream, Progress::Event(object.resource_version)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::tests::names;

    /// Field-index values are read again from each stored object's JSON when the
    /// configured paths changed, whether a snapshot holds it compressed or as text.
    #[test]
    fn changed_field_indexes_are_read_again_from_compressed_and_plain_objects() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns"},"spec":{"nodeName":"node-7","containers":[{"name":"app","image":"registry.example/app:1"}]}}"#;
        let state = ObjectState {
            key: ObjectKey::new("pods", &ClusterName::from("c1"), "ns", "p"),
            json: json.into(),
            labels: Vec::new(),
            owners: Vec::new(),
            fields: vec![("status.phase".into(), "Running".into())],
        };
        let plain =
            fleetscope_store::ObjectRecord::new(fleetscope_model::Revision(3), state.clone());
        let dictionary: Arc<[u8]> = Arc::from(json.replace("node-7", "node-1").as_bytes());
        let mut packed = fleetscope_store::ObjectRecord::new(
            fleetscope_model::Revision(3),
            ObjectState {
                json: Default::default(),
                ..state
            },
        );
        packed.packed = Some(
            fleetscope_model::PackedJson::pack(&dictionary, json)
                .unwrap()
                .into(),
        );
        let mut loaded = fleetscope_store::Loaded {
            objects: vec![plain, packed].into(),
            field_indexes: Some(vec!["status.phase".into()]),
            ..Default::default()
        };
        let paths = vec!["spec.nodeName".to_string()];
        reindex_fields(&mut loaded, &paths);
        let objects = loaded.objects.to_records();
        for o in &objects {
            assert_eq!(
                o.state.fields,
                [("spec.nodeName".to_string(), "node-7".to_string())]
            );
        }
        assert!(objects[1].packed.is_some(), "still held compressed");
    }

    /// A cluster loop that ends as the engine stops may say its cluster is gone (it
    /// sees its source dropped): the ingest, stopping, deletes nothing for it.
    #[tokio::test]
    async fn a_cluster_gone_while_stopping_deletes_nothing() {
        for round in 0..20 {
            let index = Arc::new(Index::new(Default::default()));
            let cluster = ClusterName::from("c1");
            let staged = index.stage([Change::Upsert(ObjectState {
                key: ObjectKey::new("configmaps", &cluster, "ns", "cm"),
                json: r#"{"metadata":{"name":"cm","namespace":"ns"}}"#.into(),
                labels: Vec::new(),
                owners: Vec::new(),
                fields: Vec::new(),
            })]);
            index.publish(staged);
            let (tx, rx) = mpsc::channel(4);
            tx.send(Update::ClusterGone {
                cluster: cluster.clone(),
            })
            .await
            .unwrap();
            // Stopping, with the update already waiting: either may be taken first.
            let cancel = CancellationToken::new();
            cancel.cancel();
            ingest(
                index.clone(),
                StatusTable::default(),
                None,
                rx,
                16,
                false,
                cancel,
            )
            .await;
            assert_eq!(index.snapshot().len(), 1, "round {round}");
        }
    }

    fn configmap(name: &str) -> PrunedObject {
        PrunedObject {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: "1".into(),
            json: format!(r#"{{"metadata":{{"name":"{name}","namespace":"ns"}}}}"#),
            labels: Vec::new(),
            owners: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// Runs the ingest over `updates`, in batches of `batch`, until they are applied.
    async fn ingest_all(index: &Arc<Index>, updates: Vec<Update>, batch: usize) {
        let (tx, rx) = mpsc::channel(updates.len().max(1));
        for u in updates {
            tx.send(u).await.unwrap();
        }
        drop(tx);
        ingest(
            index.clone(),
            StatusTable::default(),
            None,
            rx,
            batch,
            false,
            CancellationToken::new(),
        )
        .await;
    }

    /// A first list in parts: applied as they arrive, the rest added at its end. A list
    /// whose parts follow an abandoned one's is gathered and replaces what is held, so
    /// what the abandoned list left is deleted; so is a list whose stream held objects.
    #[tokio::test]
    async fn lists_in_parts_are_applied_as_they_arrive_only_over_nothing_held() {
        let stream = Arc::new(StreamId::new(
            ClusterName::from("c1"),
            ResourceType::new("", "v1", "configmaps", "ConfigMap", true),
        ));
        let part = |list: u64, names: &[&str]| Update::ListPart {
            stream: stream.clone(),
            list,
            objects: names.iter().map(|n| configmap(n)).collect(),
        };
        let listed = |parts: Option<u64>, names: &[&str]| Update::Listed {
            stream: stream.clone(),
            objects: names.iter().map(|n| configmap(n)).collect(),
            parts,
            resource_version: "9".into(),
            reason: ListReason::Initial,
            method: None,
            fallback: None,
        };
        for batch in [1, 64] {
            // Parts of list 1 are applied as they come; its end adds the rest.
            let index = Arc::new(Index::new(Default::default()));
            ingest_all(&index, vec![part(1, &["a", "b"])], batch).await;
            assert_eq!(names(&index), ["a", "b"], "batch {batch}");
            let index = Arc::new(Index::new(Default::default()));
            ingest_all(
                &index,
                vec![
                    part(1, &["a", "b"]),
                    part(1, &["c"]),
                    listed(Some(1), &["d"]),
                ],
                batch,
            )
            .await;
            assert_eq!(names(&index), ["a", "b", "c", "d"], "batch {batch}");
            // List 1 abandoned after a part; list 2 is gathered and replaces it whole.
            let index = Arc::new(Index::new(Default::default()));
            ingest_all(
                &index,
                vec![
                    part(1, &["a", "b"]),
                    part(2, &["b", "c"]),
                    listed(Some(2), &["d"]),
                ],
                batch,
            )
            .await;
            assert_eq!(names(&index), ["b", "c", "d"], "batch {batch}");
            // List 1 abandoned after a part, then listed whole (a fall back to LIST).
            let index = Arc::new(Index::new(Default::default()));
            ingest_all(
                &index,
                vec![part(1, &["a", "b"]), listed(None, &["b", "c"])],
                batch,
            )
            .await;
            assert_eq!(names(&index), ["b", "c"], "batch {batch}");
            // Something held: the parts wait for the end, which replaces what is held.
            let index = Arc::new(Index::new(Default::default()));
            ingest_all(&index, vec![listed(None, &["old", "b"])], batch).await;
            ingest_all(&index, vec![part(3, &["a"])], batch).await;
            assert_eq!(names(&index), ["b", "old"], "not applied before its end");
            ingest_all(
                &index,
                vec![part(3, &["a"]), listed(Some(3), &["c"])],
                batch,
            )
            .await;
            assert_eq!(names(&index), ["a", "c"], "batch {batch}");
        }
    }

    fn writer(keep_removed: bool) -> Writer {
        Writer {
            index: Arc::new(Index::new(Default::default())),
            status: StatusTable::default(),
            keep_removed,
            cancel: CancellationToken::new(),
            parts: HashMap::new(),
        }
    }

    fn stream() -> Arc<StreamId> {
        Arc::new(StreamId::new(
            ClusterName::from("c1"),
            ResourceType::new("", "v1", "configmaps", "ConfigMap", true),
        ))
    }

    #[test]
    fn watch_events_are_upserts_and_deletes_with_their_progress_and_counts() {
        let (s, mut b) = (stream(), Batch::default());
        let mut updated = configmap("a");
        updated.resource_version = "7".into();
        applied(&mut b, s.clone(), configmap("a"), true);
        applied(&mut b, s.clone(), updated, false);
        deleted(&mut b, s.clone(), configmap("b"));
        assert!(matches!(
            &b.changes[..],
            [Change::UpsertAt(_, a), Change::UpsertAt(_, b), Change::DeleteAt(k, c)]
                if &*k.name == "b" && (&**a, &**b, &**c) == ("1", "7", "1")
        ));
        let rvs: Vec<_> = b
            .after
            .iter()
            .map(|(_, p)| match p {
                Progress::Event(rv) => rv.as_str(),
                _ => "other",
            })
            .collect();
        assert_eq!(rvs, ["1", "7", "1"]);
        let (_, c) = &b.counts[&key_of(&s)];
        assert_eq!((c.added, c.modified, c.deleted), (1, 1, 1));
        assert!(b.touched.contains(&key_of(&s)));
        assert_eq!(b.resume_points().len(), 3);
    }

    #[test]
    fn a_cluster_gone_is_deleted_unless_kept_and_never_while_stopping() {
        let cluster = ClusterName::from("c1");
        let mut w = writer(false);
        let mut b = Batch::default();
        w.cluster_gone(&mut b, cluster.clone());
        assert!(matches!(&b.changes[..], [Change::RemoveCluster(c)] if *c == cluster));
        assert_eq!(b.gone, std::slice::from_ref(&cluster));
        let mut w = writer(true);
        let mut b = Batch::default();
        w.cluster_gone(&mut b, cluster.clone());
        assert!(b.changes.is_empty());
        assert_eq!(b.gone, std::slice::from_ref(&cluster));
        let mut w = writer(false);
        w.cancel.cancel();
        let mut b = Batch::default();
        w.cluster_gone(&mut b, cluster);
        assert!(b.changes.is_empty() && b.gone.is_empty());
    }

    #[test]
    fn a_list_replaces_the_stream_and_says_where_it_resumes() {
        let s = stream();
        let mut w = writer(false);
        let mut b = Batch::default();
        w.listed(
            &mut b,
            s.clone(),
            vec![configmap("a")],
            None,
            "9".into(),
            ListReason::Expired,
        );
        assert!(matches!(
            &b.changes[..],
            [Change::Replace { objects, .. }, Change::Reached { resource_version, .. }]
                if objects.len() == 1 && &**resource_version == "9"
        ));
        assert!(matches!(&b.after[..], [(_, Progress::Listed(rv))] if rv == "9"));
        assert_eq!(b.counts[&key_of(&s)].1.expired_lists, 1);
        assert_eq!(
            b.resume_points(),
            [(
                s.cluster.clone(),
                s.resource.clone(),
                Some(("9".to_string(), s.selection.clone()))
            )]
        );
        // No resourceVersion: the type is gone; its resume point is dropped.
        let mut b = Batch::default();
        w.listed(
            &mut b,
            s.clone(),
            Vec::new(),
            None,
            String::new(),
            ListReason::Dropped,
        );
        assert!(matches!(&b.after[..], [(_, Progress::Dropped)]));
        assert_eq!(
            b.resume_points(),
            [(s.cluster.clone(), s.resource.clone(), None)]
        );
        // A state change is progress, not a resume point.
        let mut b = Batch::default();
        w.take(
            &mut b,
            Update::State {
                stream: s.clone(),
                state: fleetscope_informer::StreamState::Failed,
                error: Some("boom".into()),
            },
        );
        assert!(b.resume_points().is_empty() && b.changes.is_empty());
    }

    #[test]
    fn parts_over_nothing_held_are_added_and_over_something_held_gathered() {
        let s = stream();
        let mut w = writer(false);
        let mut b = Batch::default();
        w.list_part(&mut b, &s, 1, vec![configmap("a")]);
        w.list_part(&mut b, &s, 1, vec![configmap("b")]);
        assert!(matches!(&b.changes[..], [Change::Add(_), Change::Add(_)]));
        // A new list while the first's parts are in this batch: gathered.
        w.list_part(&mut b, &s, 2, vec![configmap("c")]);
        assert_eq!(b.changes.len(), 2);
        assert!(matches!(
            &w.parts[&key_of(&s)],
            Parts { list: 2, state: PartsState::Gathered(g) } if g.len() == 1
        ));
    }
}
