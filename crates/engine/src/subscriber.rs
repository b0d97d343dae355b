//! Watch semantics, below the seam: the initial objects (if asked) then every change
//! after the start, in revision order, from the event log and then live; the filter
//! applied to transitions (an object leaving it is `Deleted`, one entering it
//! `Added`); the cluster filter evaluated against the live fleet, so a cluster added
//! later is followed; cluster freshness changes as events; a subscriber that falls
//! behind ended with a resumable error, one whose start has left the log refused.
//! Every event is checked against the policy in force: when a new policy takes away
//! (or grants) some of what a subscriber watches, the objects leaving its grant are
//! `Deleted` for it, and those entering it `Added`, at the revision it has reached.
//!
//! Filters are evaluated on the engine's query threads, as List and Count are, not on
//! the async workers: the initial objects a page at a time, and the live events of a
//! costly filter (a field selector, or many label terms) a batch at a time. So many
//! Watches with heavy filters take their turn with the queries and never hold up
//! another client's call.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fleetscope_index::{
    Event, FeedError, Index, IndexError, Start, State, Subscription, number, transition,
};
use fleetscope_model::access::{ClusterRef, Namespaces, Policy};
use fleetscope_model::fleet::{FleetObject, Projection, Watch, WatchEvent, WatchRequest, reason};
use fleetscope_model::{
    Access, ClusterFilter, ClusterName, EventType, FleetError, ResourceType, Revision, Verb,
};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::catchup::{CatchUp, Caught, Meet};
use crate::status::{ClusterFreshness, StatusTable};
use crate::view::{event_object, fleet_object, shown};
use fleetscope_informer::Update;
use fleetscope_informer::history::HistoryEnd;
use fleetscope_model::fleet::Freshness;

/// Starts a Watch: subscribes at once (so a bad start is an error of the call), and
/// spawns its producer.
///
/// (A revision the index cannot resume from is refused by [`refused`].)
pub(crate) fn start(engine: &Engine, r: WatchRequest) -> Result<Watch, FleetError> {
    if r.resume.is_some() {
        return Err(FleetError::InvalidArgument(
            "resume_token is a router's position; a server resumes from since_revision".into(),
        ));
    }
    let mut access = r.access;
    // Who reads members' histories for this Watch (see [`crate::catchup::Histories`]).
    let caller = access.caller();
    // The policy in force now is the one the start is held to; a later one is a change.
    let policy = access.policy_seen();
    let (resource, built) = engine.build(&r.query, &access, Verb::Watch)?;
    let since = if r.initial { None } else { r.since };
    // From member positions: where each cluster's stream starts; those that cannot
    // continue exactly (and those selected but not given) are sent anew first.
    let mut streams = HashMap::new();
    let mut resets = Vec::new();
    // Streams this replica's log does not carry from the subscriber's position: read
    // from the member's history where its stream runs here.
    let mut histories = Vec::new();
    let subscription = match r.positions {
        Some(mut given) => {
            for c in engine.selected(&r.query.clusters) {
                if !given.iter().any(|(g, _)| *g == c.name) {
                    given.push((c.name, Arc::from("")));
                }
            }
            let (subscription, starts) = engine.index.subscribe_at(&resource.name(), &given);
            for ((cluster, position), start) in given.into_iter().zip(starts) {
                match start {
                    Start::After { revision, skip_to } => {
                        streams.insert(cluster, Tracked::at(revision, skip_to, position));
                    }
                    Start::Reset => match engine.histories.of(&cluster, &resource.name()) {
                        Some(history) if number(&position).is_some() => {
                            histories.push((cluster, position, history));
                        }
                        _ => resets.push(cluster),
                    },
                }
            }
            subscription
        }
        None => engine.index.subscribe(since).map_err(refused)?,
    };
    let positioned = !streams.is_empty() || !resets.is_empty() || !histories.is_empty();
    let whole = Arc::new(built.query.clone());
    // The cluster filter is evaluated per event against the live fleet, so a
    // matching cluster added later is followed too; the index query reads all.
    let initial = (r.initial && !positioned).then(|| built.query.clone());
    // The live events are checked per cluster by the producer, under the policy in
    // force when each arrives.
    let mut query = built.query;
    query.clusters = None;
    query.reach = None;
    // A short hand-off: the subscriber's real bound is the index's subscriber buffer
    // and event log, which it pulls from.
    let (tx, rx) = mpsc::channel(8);
    let reached = Arc::new(AtomicU64::new(0));
    let stalled: Arc<std::sync::Mutex<Option<FleetError>>> = Arc::default();
    let (caught_tx, caught) = mpsc::channel(64);
    let catching = histories
        .into_iter()
        .map(|(cluster, position, history)| {
            tracing::debug!(%cluster, resource = %resource.name(), %position, "a Watch's stream read from the member's history");
            let read = engine.histories.read(
                history,
                position.clone(),
                &caller,
                &engine.tasks,
                &engine.cancel,
            );
            let c = CatchUp::start(
                read,
                cluster.clone(),
                position,
                subscription.snapshot.revision(),
                caught_tx.clone(),
                &engine.tasks,
                &engine.cancel,
            );
            (cluster, c)
        })
        .collect();
    let watched = resource.name();
    let told = engine
        .status
        .clusters()
        .into_iter()
        .map(|c| {
            let (freshness, _, message) = c.freshness(Some(&watched));
            (c.name, (freshness, message))
        })
        .collect();
    let producer = Producer {
        histories: engine.histories.clone(),
        reached: reached.clone(),
        costly: costly(&query),
        query: Arc::new(query),
        pool: engine.queries.clone(),
        projection: r.projection,
        filter: r.query.clusters,
        labels: engine.status.all_labels(),
        selected: HashMap::new(),
        access,
        policy,
        resource,
        scopes: HashMap::new(),
        told,
        switch: None,
        index: engine.index.clone(),
        status: engine.status.clone(),
        initial,
        statuses: engine.status.subscribe(),
        cancel: engine.cancelled(),
        tx,
        stall: engine.subscriber_stall,
        stalled: stalled.clone(),
        dropped: engine.dropped.clone(),
        report: r.report_positions,
        positioned,
        streams,
        resets,
        whole,
        catching,
        caught,
    };
    // Tracked with the engine's tasks: a shutdown waits for it (it ends with the
    // engine's cancellation, or when its subscriber goes).
    let span =
        tracing::info_span!("task", task = "watch-producer", resource = %producer.resource.name());
    engine.tasks.spawn(tracing::Instrument::instrument(
        producer.run(subscription),
        span,
    ));
    let mut rx = rx;
    Ok(Watch::new(
        futures::stream::poll_fn(move |cx| match rx.poll_recv(cx) {
            // Ended for not reading: what was handed over, then why.
            std::task::Poll::Ready(None) => std::task::Poll::Ready(
                stalled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .map(Err),
            ),
            other => other,
        }),
        reached,
    ))
}

/// What a producer hands over.
type Delivery = Result<WatchEvent, FleetError>;

/// Where one cluster's stream of a subscriber stands, by member position.
struct Tracked {
    /// Its changes at or before this revision are the subscriber's already.
    floor: Revision,
    /// Its changes at or before this member resourceVersion are too (the subscriber
    /// stood between two of them, or ahead of this fleet).
    skip_to: Option<u64>,
    /// The member resourceVersion reached; empty when not known (inside a re-list).
    position: Arc<str>,
    /// The position the subscriber was last told (by an event or positions).
    told: Arc<str>,
}

impl Tracked {
    /// A stream whose subscriber knows it stands at `position`, after `floor`.
    fn at(floor: Revision, skip_to: Option<u64>, position: Arc<str>) -> Self {
        Self {
            floor,
            skip_to,
            told: position.clone(),
            position,
        }
    }
}

/// What a subscriber that follows member positions does with a change.
enum Follow {
    /// Deliver it.
    Deliver,
    /// The subscriber has it already (or was just sent its stream anew).
    Skip,
    /// The subscriber is gone.
    Gone,
}

/// How often a Watch that reports positions looks for positions that moved with no
/// change.
const POSITIONS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Objects of the initial state evaluated per turn on a query thread.
const INITIAL_PAGE: usize = 1024;

/// Whether evaluating `query` against each live event is worth a query thread: a
/// field selector (which may read the object's JSON), or more than a few label terms.
fn costly(query: &fleetscope_index::Query) -> bool {
    !query.fields.is_empty() || query.labels.requirements().len() > 8
}

/// One subscriber's producer.
struct Producer {
    /// Every running stream's history reader (to ask a member where it stands).
    histories: crate::catchup::Histories,
    query: Arc<fleetscope_index::Query>,
    /// Whether `query`'s live evaluation runs on a query thread.
    costly: bool,
    /// The engine's query threads' places.
    pool: Arc<tokio::sync::Semaphore>,
    projection: Projection,
    filter: ClusterFilter,
    /// Labels of the clusters seen, kept after a cluster leaves (its DELETEDs are
    /// matched with the labels it had).
    labels: BTreeMap<ClusterName, BTreeMap<String, String>>,
    /// Whether the filter selects each cluster seen, decided once per cluster (its
    /// labels do not change while it is in the fleet; a status change decides again).
    selected: HashMap<ClusterName, bool>,
    /// Who watches, and the policies that follow the one in force.
    access: Access,
    /// The policy this subscriber's events are checked against now.
    policy: Arc<dyn Policy>,
    /// The watched type, as policies name it.
    resource: ResourceType,
    /// What `policy` grants in each cluster seen, decided once per cluster.
    scopes: HashMap<ClusterName, Namespaces>,
    /// Each cluster's freshness for the watched type, as the Watch stood at its start
    /// or was last told.
    told: HashMap<ClusterName, (Freshness, String)>,
    /// A policy that replaces `policy` once the subscriber reaches the snapshot taken
    /// when it came (every event up to it is checked against the old one).
    switch: Option<(Arc<dyn Policy>, Arc<State>)>,
    index: Arc<Index>,
    status: StatusTable,
    /// The query for the initial state (drawing on the clusters selected at start).
    initial: Option<fleetscope_index::Query>,
    statuses: broadcast::Receiver<crate::status::FreshnessChange>,
    cancel: CancellationToken,
    tx: mpsc::Sender<Delivery>,
    /// Where it has read to, stored after everything up to it was handed over.
    reached: Arc<AtomicU64>,
    /// How long a hand-off may wait for the subscriber to read.
    stall: std::time::Duration,
    /// Why the producer ended the subscriber for not reading, for its stream to say.
    stalled: Arc<std::sync::Mutex<Option<FleetError>>>,
    /// The engine's counts of Watches ended for not keeping up.
    dropped: Arc<crate::DroppedCounts>,
    /// Report member positions (a router's Watch).
    report: bool,
    /// The Watch started from member positions.
    positioned: bool,
    /// Where each cluster's stream stands, when positions are followed.
    streams: HashMap<ClusterName, Tracked>,
    /// Clusters whose stream is sent anew before anything else.
    resets: Vec<ClusterName>,
    /// The query as the start resolved it (with the caller's reach), for sending a
    /// cluster's stream anew.
    whole: Arc<fleetscope_index::Query>,
    /// Streams carried by their member's history until they meet this replica's.
    catching: HashMap<ClusterName, CatchUp>,
    /// What the history reads tell.
    caught: mpsc::Receiver<(ClusterName, Caught)>,
}

impl Producer {
    /// Whether the filter selects a cluster, by the labels it has (or had).
    fn selects(&mut self, cluster: &ClusterName) -> bool {
        if self.filter.is_everything() {
            return true;
        }
        if let Some(&yes) = self.selected.get(cluster) {
            return yes;
        }
        if !self.labels.contains_key(cluster)
            && let Some(labels) = self.status.labels(cluster)
        {
            self.labels.insert(cluster.clone(), labels);
        }
        let none = BTreeMap::new();
        let labels = self.labels.get(cluster).unwrap_or(&none);
        let yes = self.filter.matches(cluster, labels);
        self.selected.insert(cluster.clone(), yes);
        yes
    }

    /// What `policy` grants the subscriber in a cluster.
    fn scope_under(&mut self, policy: &dyn Policy, cluster: &ClusterName) -> Namespaces {
        self.selects(cluster);
        let none = BTreeMap::new();
        let labels = self.labels.get(cluster).unwrap_or(&none);
        policy.namespaces(
            self.access.subject(),
            Verb::Watch,
            &self.resource,
            ClusterRef {
                name: cluster,
                labels,
            },
        )
    }

    /// A cluster's change of freshness as it concerns the watched type, if it changes
    /// what this Watch was last told of (or would have been, at its start).
    fn as_watched(&mut self, change: crate::status::FreshnessChange) -> Option<ClusterFreshness> {
        let watched = change
            .by_type
            .as_ref()
            .and_then(|types| types.get(&self.resource.name()).cloned());
        let c = change.overall;
        let c = match (watched, self.status.cluster(&c.cluster)) {
            // Its stream as it stood at the change.
            (Some(watched), _) => watched,
            (None, Some(status)) => {
                let (freshness, stale_since, message) =
                    status.freshness(Some(&self.resource.name()));
                ClusterFreshness {
                    cluster: c.cluster,
                    freshness,
                    stale_since,
                    message,
                }
            }
            // Gone from the fleet: said as it is.
            (None, None) => c,
        };
        let now = (c.freshness, c.message.clone());
        if self.told.get(&c.cluster) == Some(&now) {
            return None;
        }
        self.told.insert(c.cluster.clone(), now);
        Some(c)
    }

    /// Whether the policy in force grants the subscriber objects of `namespace` in `cluster`.
    fn granted(&mut self, cluster: &ClusterName, namespace: &str) -> bool {
        if let Some(scope) = self.scopes.get(cluster) {
            return scope.allows(namespace);
        }
        let policy = self.policy.clone();
        let scope = self.scope_under(policy.as_ref(), cluster);
        let yes = scope.allows(namespace);
        self.scopes.insert(cluster.clone(), scope);
        yes
    }

    /// An object as this subscriber is shown it.
    fn show(&self, object: FleetObject) -> FleetObject {
        let none = BTreeMap::new();
        let labels = self.labels.get(&object.key.cluster).unwrap_or(&none);
        shown(object, self.policy.as_ref(), self.access.subject(), labels)
    }

    /// What a change means to this subscriber, if anything, given what it means to
    /// its filter (`kind`, from [`Producer::transitions`]).
    fn event(&mut self, e: &Event, kind: Option<EventType>) -> Option<WatchEvent> {
        let key = &e.object.key;
        if !self.selects(&key.cluster) || !self.granted(&key.cluster, &key.namespace) {
            return None;
        }
        let kind = kind?;
        Some(WatchEvent::Object {
            kind,
            object: self.show(event_object(e, self.projection)),
            revision: e.revision,
            // A change of no position of its own (a re-list's) leaves the stream's
            // position unknown until the re-list's last.
            position: self
                .report
                .then(|| e.position.clone().unwrap_or_else(|| Arc::from(""))),
        })
    }

    /// Whether positions are followed: the Watch started from them or reports them.
    fn follows(&self) -> bool {
        self.report || self.positioned
    }

    /// What a change means to a subscriber that follows positions: skipped when its
    /// stream has it already; a re-list's change that cannot apply to where the
    /// subscriber stands sends the stream anew instead.
    async fn follow(&mut self, e: &Event) -> Follow {
        let cluster = &e.object.key.cluster;
        if !self.selects(cluster) {
            return Follow::Deliver;
        }
        // A change at or before where the subscriber's stream starts is its already,
        // whatever it was: a replay from an earlier start can hold this replica
        // letting the cluster go before it took the cluster up again.
        let before = |floor: Revision| e.revision <= floor;
        if self.streams.get(cluster).is_some_and(|t| before(t.floor))
            || self
                .catching
                .get(cluster)
                .is_some_and(|c| before(c.floor()))
        {
            return Follow::Skip;
        }
        if e.cluster_removed && self.report {
            // The cluster left this fleet (to another replica): no change of the
            // cluster, and this stream is no longer its source. It ends, retryably,
            // so that a router follows the cluster to where it is served and
            // continues the others from where they stand; were it to go on, the
            // cluster taken up here again would come as a list of no position.
            self.end(FleetError::Unavailable(format!(
                "cluster {cluster} left this replica: follow it where it is served now"
            )))
            .await;
            return Follow::Gone;
        }
        if self.catching.contains_key(cluster) {
            // Its history brings the subscriber to where this stream stands.
            return Follow::Skip;
        }
        let Some(t) = self.streams.get_mut(cluster) else {
            // A stream first met now (a cluster joining): it stands where this puts it.
            let tracked = Tracked {
                floor: Revision(0),
                skip_to: None,
                told: Arc::from(""),
                position: e.position.clone().unwrap_or_else(|| Arc::from("")),
            };
            self.streams.insert(cluster.clone(), tracked);
            return Follow::Deliver;
        };
        if let Some(to) = t.skip_to {
            match e.position.as_deref().and_then(number) {
                Some(x) if x <= to => return Follow::Skip,
                Some(_) => t.skip_to = None,
                None => {
                    let cluster = cluster.clone();
                    let snapshot = self.index.snapshot();
                    return if self.reset(cluster, snapshot).await {
                        Follow::Skip
                    } else {
                        Follow::Gone
                    };
                }
            }
        }
        t.position = e.position.clone().unwrap_or_else(|| Arc::from(""));
        Follow::Deliver
    }

    /// Sends the objects of `snapshot` that `query` selects, as `Added`, a page per
    /// turn of a query thread. False once the subscriber is gone.
    async fn send_objects(&self, snapshot: &Arc<State>, query: fleetscope_index::Query) -> bool {
        let query = Arc::new(query);
        let mut after: Option<fleetscope_model::ObjectKey> = None;
        loop {
            let (state, query, from, projection) = (
                snapshot.clone(),
                query.clone(),
                after.take(),
                self.projection,
            );
            let Some(page) = self
                .on_pool(move || {
                    state
                        .matching(&query, from.as_ref())
                        .take(INITIAL_PAGE)
                        .map(|o| (fleet_object(o, projection), o.revision))
                        .collect::<Vec<_>>()
                })
                .await
            else {
                return false;
            };
            let more = page.len() == INITIAL_PAGE;
            for (object, revision) in page {
                after = Some(object.key.clone());
                let e = WatchEvent::Object {
                    kind: EventType::Added,
                    object: self.show(object),
                    revision,
                    position: None,
                };
                if !self.send(e).await {
                    return false;
                }
            }
            if !more {
                return true;
            }
        }
    }

    /// Sends one cluster's stream anew from `snapshot`: the reset, its objects, and
    /// where it stands; what the snapshot holds is then the subscriber's. False once
    /// the subscriber is gone.
    async fn reset(&mut self, cluster: ClusterName, snapshot: Arc<State>) -> bool {
        tracing::debug!(%cluster, resource = %self.resource.name(), "a Watch's stream sent anew");
        if !self
            .send(WatchEvent::Reset {
                cluster: cluster.clone(),
            })
            .await
        {
            return false;
        }
        let mut query = (*self.whole).clone();
        query.clusters = Some(vec![cluster.clone()]);
        if !self.send_objects(&snapshot, query).await {
            return false;
        }
        let position = snapshot
            .position(&self.resource.name(), &cluster)
            .cloned()
            .unwrap_or_else(|| Arc::from(""));
        let tracked = Tracked::at(snapshot.revision(), None, position.clone());
        self.streams.insert(cluster.clone(), tracked);
        self.send(WatchEvent::ResetEnd {
            cluster,
            position,
            revision: snapshot.revision(),
        })
        .await
    }

    /// Tells the followed streams whose position moved since the subscriber was last
    /// told: by changes it was not sent (its filter or grant excludes them), or with
    /// no change at all (the member's bookmarks, once the index stands where the
    /// subscriber does, so every change before them was sent). False once the
    /// subscriber is gone.
    async fn positions_moved(&mut self, reached: Revision) -> bool {
        let snapshot = self.index.snapshot();
        let caught_up = snapshot.revision() == reached;
        let name = self.resource.name();
        let mut moved = Vec::new();
        for (cluster, t) in &mut self.streams {
            if caught_up
                && let Some(now) = snapshot.position(&name, cluster)
                && let (Some(now_n), Some(was)) = (number(now), number(&t.position))
                && now_n > was
            {
                // Past where the subscriber stood, with nothing in between.
                t.skip_to = None;
                t.position = now.clone();
            }
            if t.skip_to.is_none() && !t.position.is_empty() && t.position != t.told {
                t.told = t.position.clone();
                moved.push((cluster.clone(), t.position.clone()));
            }
        }
        if moved.is_empty() {
            return true;
        }
        moved.sort();
        self.send(WatchEvent::Positions {
            positions: moved,
            revision: reached,
        })
        .await
    }

    /// Takes what a history read tells about `cluster`'s stream: sends the changes the
    /// subscriber's filter and grant let through, and hands the stream over to this
    /// replica's where they meet; a history that cannot be read sends the stream
    /// anew. False once the subscriber is gone.
    async fn caught(&mut self, cluster: ClusterName, caught: Caught, reached: Revision) -> bool {
        let Some(c) = self.catching.get_mut(&cluster) else {
            return true;
        };
        match caught {
            Caught::End(end) => {
                self.catching.remove(&cluster);
                if end == HistoryEnd::Cancelled {
                    return true;
                }
                tracing::info!(%cluster, resource = %self.resource.name(), end = ?end, "the member's history cannot carry a Watch from its position (compacted, or not read): its stream is sent anew");
                self.reset(cluster, self.index.snapshot()).await
            }
            Caught::Update(update) => {
                let by_content = !matches!(update, Update::Applied { .. } | Update::Deleted { .. });
                let events = c.apply(update, reached);
                for e in &events {
                    let kind = transition(&self.query, e);
                    if let Some(ev) = self.event(e, kind)
                        && !self.send(ev).await
                    {
                        return false;
                    }
                }
                self.meet(&cluster, reached, by_content);
                true
            }
        }
    }

    /// Hands `cluster`'s stream over from its history to this replica's, if they
    /// meet (see [`CatchUp::meets`]).
    fn meet(&mut self, cluster: &ClusterName, reached: Revision, by_content: bool) {
        let Some(c) = self.catching.get(cluster) else {
            return;
        };
        let snapshot = self.index.snapshot();
        match c.meets(
            &snapshot,
            reached,
            &self.resource.name(),
            cluster,
            by_content,
        ) {
            Meet::Apart => {}
            Meet::After {
                floor,
                skip_to,
                position,
            } => {
                tracing::debug!(%cluster, resource = %self.resource.name(), %position, "a Watch's stream read from history met this replica's");
                let told = c.position().clone();
                self.catching.remove(cluster);
                let mut t = Tracked::at(floor, skip_to, position);
                t.told = told;
                self.streams.insert(cluster.clone(), t);
            }
        }
    }

    /// Tells where every followed stream stands, at `revision`.
    async fn send_positions(&self, revision: Revision) -> bool {
        let mut positions: Vec<(ClusterName, Arc<str>)> = self
            .streams
            .iter()
            .map(|(c, t)| (c.clone(), t.position.clone()))
            .collect();
        positions.sort();
        self.send(WatchEvent::Positions {
            positions,
            revision,
        })
        .await
    }

    /// What each event means to the filter: evaluated here when that is cheap, on a
    /// query thread when the filter is costly. `None` once the engine stops.
    async fn transitions(&self, events: &[Arc<Event>]) -> Option<Vec<Option<EventType>>> {
        if !self.costly {
            return Some(events.iter().map(|e| transition(&self.query, e)).collect());
        }
        let (query, events) = (self.query.clone(), events.to_vec());
        self.on_pool(move || events.iter().map(|e| transition(&query, e)).collect())
            .await
    }

    /// Runs `work` on one of the engine's query threads, once one is free; `None`
    /// when the engine stops first.
    async fn on_pool<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let place = tokio::select! {
            p = self.pool.clone().acquire_owned() => p.ok()?,
            _ = self.cancel.cancelled() => return None,
        };
        tokio::task::spawn_blocking(move || {
            let _place = place;
            work()
        })
        .await
        .ok()
    }

    /// Puts a new policy in force, at the revision of `snapshot`, which the subscriber
    /// has reached: what it grants that the old one did not is `Added`, what it takes
    /// away `Deleted`, at that revision. False once the subscriber is gone.
    async fn switch_policy(&mut self, new: Arc<dyn Policy>, snapshot: &State) -> bool {
        let at = snapshot.revision();
        let old = std::mem::replace(&mut self.policy, new.clone());
        // What each policy grants in every cluster known: most new policies leave a
        // given subscriber's grants as they were, and then its objects need not be
        // visited. A cluster known only from the snapshot is decided as it is met.
        let mut clusters: Vec<ClusterName> = self.labels.keys().cloned().collect();
        clusters.extend(self.status.all_labels().into_keys());
        clusters.sort();
        clusters.dedup();
        let mut before: HashMap<ClusterName, Namespaces> = HashMap::new();
        let mut after: HashMap<ClusterName, Namespaces> = HashMap::new();
        for c in clusters {
            if self.selects(&c) {
                before.insert(c.clone(), self.scope_under(old.as_ref(), &c));
                after.insert(c.clone(), self.scope_under(new.as_ref(), &c));
            }
        }
        if before == after {
            self.scopes = after;
            return self.still_granted().await;
        }
        let mut changed = false;
        let query = self.query.clone();
        for o in snapshot.matching(&query, None) {
            let cluster = &o.key.cluster;
            if !self.selects(cluster) {
                continue;
            }
            if !before.contains_key(cluster) {
                let scope = self.scope_under(old.as_ref(), cluster);
                before.insert(cluster.clone(), scope);
                let scope = self.scope_under(new.as_ref(), cluster);
                after.insert(cluster.clone(), scope);
            }
            let was = before
                .get(cluster)
                .is_some_and(|s| s.allows(&o.key.namespace));
            let is = after
                .get(cluster)
                .is_some_and(|s| s.allows(&o.key.namespace));
            let kind = match (was, is) {
                (true, false) => EventType::Deleted,
                (false, true) => EventType::Added,
                _ => continue,
            };
            changed = true;
            let object = self.show(fleet_object(o, self.projection));
            if !self
                .send(WatchEvent::Object {
                    kind,
                    object,
                    revision: at,
                    position: None,
                })
                .await
            {
                return false;
            }
        }
        self.scopes = after;
        if changed {
            tracing::debug!(subscriber = %self.access.subject(), revision = %at, "a new policy changed what a Watch may see");
        }
        self.still_granted().await
    }

    /// Whether the policy in force still grants the subscriber this Watch in some
    /// cluster of the fleet; if not, it is ended with `PERMISSION_DENIED` rather than
    /// left streaming bookmarks that reveal the fleet's revision.
    async fn still_granted(&mut self) -> bool {
        let (policy, subject, resource) = (&self.policy, self.access.subject(), &self.resource);
        let granted = self.status.any_cluster(|name, labels| {
            !policy
                .namespaces(subject, Verb::Watch, resource, ClusterRef { name, labels })
                .is_none()
        });
        if !granted {
            tracing::info!(subscriber = %subject, resource = %resource.name(), "a new policy grants a Watch nothing: ended");
            self.end(FleetError::PermissionDenied(format!(
                "the policy in force no longer grants {subject} a Watch of {} in any cluster",
                resource.name()
            )))
            .await;
        }
        granted
    }

    /// Puts a pending policy in force once everything up to its snapshot has been
    /// checked against the old one. False once the subscriber is gone.
    async fn maybe_switch(&mut self, reached: Revision) -> bool {
        let due = self
            .switch
            .as_ref()
            .is_some_and(|(_, snapshot)| snapshot.revision() <= reached);
        if !due {
            return true;
        }
        let Some((policy, snapshot)) = self.switch.take() else {
            return true;
        };
        self.switch_policy(policy, &snapshot).await
    }

    /// Hands one event over; false once the subscriber is gone, or has left its
    /// events unread for the stall bound (then it is ended, resumably).
    async fn send(&self, event: WatchEvent) -> bool {
        match tokio::time::timeout(self.stall, self.tx.send(Ok(event))).await {
            Ok(sent) => sent.is_ok(),
            Err(_) => {
                let reached = self.reached.load(Ordering::Acquire);
                self.dropped.unread.fetch_add(1, Ordering::Relaxed);
                tracing::info!(stall = ?self.stall, %reached, "a Watch left its events unread: ended");
                *self.stalled.lock().unwrap_or_else(|e| e.into_inner()) = Some(
                    FleetError::ResourceExhausted {
                        message: format!(
                            "the Watch left its events unread for {:?} and was ended; last delivered revision {reached}: resume with since_revision={reached}",
                            self.stall
                        ),
                        reason: reason::WATCH_STALLED,
                        resume_from: Some(fleetscope_model::Revision(reached)),
                    },
                );
                false
            }
        }
    }

    /// Records that everything up to `revision` has been handed over.
    fn reach(&self, revision: Revision) {
        self.reached.store(revision.0, Ordering::Release);
    }

    /// Ends the subscriber with `error`: sent after what it has not read yet, or,
    /// when it does not read, kept for its stream to yield once it does.
    async fn end(&self, error: FleetError) {
        match self.tx.try_reserve() {
            Ok(slot) => slot.send(Err(error)),
            Err(_) => *self.stalled.lock().unwrap_or_else(|e| e.into_inner()) = Some(error),
        }
    }

    /// Checks each stream whose subscriber stands ahead of this replica against its
    /// member: a position past the member's newest resourceVersion is none the member
    /// can have given (a client's mistake or forgery, which would mute the cluster):
    /// the Watch ends with `INVALID_ARGUMENT` saying so. A member that cannot be asked
    /// leaves the position as it is. False once the subscriber is ended.
    async fn check_ahead(&mut self) -> bool {
        let ahead: Vec<(ClusterName, u64)> = self
            .streams
            .iter()
            .filter_map(|(c, t)| Some((c.clone(), t.skip_to?)))
            .collect();
        for (cluster, position) in ahead {
            let Some(history) = self.histories.of(&cluster, &self.resource.name()) else {
                continue;
            };
            let newest = history.newest(self.cancel.child_token()).await;
            if let Ok(newest) = newest
                && let Some(n) = number(&newest)
                && position > n
            {
                self.end(FleetError::InvalidArgument(format!(
                    "position {position} of cluster {cluster} ({}) is past its API server's newest resourceVersion {n}: not a position it has given",
                    self.resource.name()
                )))
                .await;
                return false;
            }
        }
        true
    }

    async fn run(mut self, subscription: Subscription) {
        let Subscription { snapshot, mut feed } = subscription;
        if !self.check_ahead().await {
            return;
        }
        if let Some(initial) = self.initial.take() {
            if !self.send_objects(&snapshot, initial).await {
                return;
            }
            let at = snapshot.revision();
            let end = WatchEvent::InitialEventsEnd {
                revision: at,
                token: String::new(),
            };
            if !self.send(end).await {
                return;
            }
            self.reach(at);
        } else {
            self.reach(feed.reached());
        }
        for cluster in std::mem::take(&mut self.resets) {
            if !self.reset(cluster, snapshot.clone()).await {
                return;
            }
        }
        if self.report {
            if !self.positioned {
                // From the snapshot the Watch starts at: every selected stream it has.
                let name = self.resource.name();
                let held: Vec<(ClusterName, Arc<str>)> = snapshot
                    .positions_of(&name)
                    .map(|(c, rv)| (c.clone(), rv.clone()))
                    .collect();
                for (cluster, position) in held {
                    if self.selects(&cluster) {
                        let tracked = Tracked::at(snapshot.revision(), None, position);
                        self.streams.insert(cluster, tracked);
                    }
                }
            }
            if !self
                .send_positions(feed.reached().max(snapshot.revision()))
                .await
            {
                return;
            }
        }
        drop(snapshot);
        // Positions that move without a change (the member's bookmarks) are told
        // now and then, once the subscriber has every change before them.
        let mut moved = tokio::time::interval(POSITIONS_EVERY);
        moved.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = moved.tick(), if self.report || !self.catching.is_empty() => {
                    let clusters: Vec<ClusterName> = self.catching.keys().cloned().collect();
                    for cluster in clusters {
                        self.meet(&cluster, feed.reached(), true);
                    }
                    if self.report && !self.positions_moved(feed.reached()).await {
                        return;
                    }
                }
                Some((cluster, caught)) = self.caught.recv() => {
                    if !self.caught(cluster, caught, feed.reached()).await {
                        return;
                    }
                }
                _ = self.tx.closed() => return,
                r = feed.next() => match r {
                    Ok(events) => {
                        let Some(kinds) = self.transitions(&events).await else {
                            return;
                        };
                        for (e, kind) in events.iter().zip(kinds) {
                            // Changes after a new policy's snapshot are checked against it.
                            if !self.maybe_switch(Revision(e.revision.0.saturating_sub(1))).await {
                                return;
                            }
                            if self.follows() {
                                match self.follow(e).await {
                                    Follow::Deliver => {}
                                    Follow::Skip => continue,
                                    Follow::Gone => return,
                                }
                            }
                            if let Some(ev) = self.event(e, kind) {
                                if !self.send(ev).await {
                                    return;
                                }
                                if self.report
                                    && let Some(t) = self.streams.get_mut(&e.object.key.cluster)
                                {
                                    t.told = t.position.clone();
                                }
                            }
                        }
                        if !self.maybe_switch(feed.reached()).await {
                            return;
                        }
                        // The position moves past changes that did not match too.
                        self.reach(feed.reached());
                    }
                    Err(e @ FeedError::Behind { reached, .. }) => {
                        self.dropped.behind.fetch_add(1, Ordering::Relaxed);
                        return self.end(FleetError::ResourceExhausted {
                            message: e.to_string(),
                            reason: reason::WATCH_BEHIND,
                            resume_from: Some(reached),
                        }).await;
                    }
                    Err(e @ FeedError::Expired { oldest, .. }) => {
                        return self.end(FleetError::OutOfRange {
                            message: e.to_string(),
                            reason: reason::REVISION_COMPACTED,
                            oldest: Some(oldest),
                        }).await;
                    }
                    Err(FeedError::Closed) => return,
                },
                _ = self.access.changed() => {
                    let policy = self.access.policy_seen();
                    let snapshot = self.index.snapshot();
                    self.switch = Some((policy, snapshot));
                    // Idle and caught up: in force at once.
                    if !self.maybe_switch(feed.reached()).await {
                        return;
                    }
                }
                c = self.statuses.recv() => {
                    let Ok(c) = c else { continue };
                    // What the change means for this Watch's type: a change of other
                    // types' streams is none of its business.
                    let Some(c) = self.as_watched(c) else { continue };
                    // A cluster added (again) may have other labels: decide anew.
                    if let Some(labels) = self.status.labels(&c.cluster) {
                        self.labels.insert(c.cluster.clone(), labels);
                    }
                    self.selected.remove(&c.cluster);
                    self.scopes.remove(&c.cluster);
                    let policy = self.policy.clone();
                    if self.selects(&c.cluster)
                        && !self.scope_under(policy.as_ref(), &c.cluster).is_none()
                    {
                        let ev = WatchEvent::ClusterStatus { cluster: c, revision: feed.reached() };
                        if !self.send(ev).await {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// A revision the index cannot start a Watch from, as the fleet refuses it.
fn refused(e: IndexError) -> FleetError {
    match e {
        IndexError::Expired { oldest, .. } => FleetError::OutOfRange {
            message: e.to_string(),
            reason: reason::REVISION_COMPACTED,
            oldest: Some(oldest),
        },
        IndexError::Future { .. } => FleetError::OutOfRange {
            message: e.to_string(),
            reason: reason::REVISION_IN_FUTURE,
            oldest: None,
        },
    }
}

#[cfg(test)]
mod tests {
    //! Watch semantics through the seam, without a transport: an engine with no
    //! clusters of its own, fed changes directly, watched through [`Fleet::watch`].

    use std::collections::BTreeMap;
    use std::time::Duration;

    use fleetscope_index::Change;
    use fleetscope_model::ObjectState;
    use fleetscope_model::fleet::{Query, WatchEvent, WatchRequest};
    use fleetscope_model::{
        ClusterFilter, ClusterName, EventType, Fleet, FleetError, LabelSelector, ObjectKey,
        ResourceType, Revision,
    };
    use futures::StreamExt;

    use crate::{Engine, EngineConfig};

    const PATIENCE: Duration = Duration::from_secs(30);

    fn pods() -> ResourceType {
        ResourceType::new("", "v1", "pods", "Pod", true)
    }

    fn engine(buffer: usize) -> Engine {
        let mut config = EngineConfig::default();
        config.index.subscriber_buffer = buffer;
        Engine::start(Vec::new(), config)
    }

    /// A cluster that collects pods, as its discovery would register it.
    fn join(e: &Engine, cluster: &str, labels: &[(&str, &str)]) {
        let name = ClusterName::from(cluster);
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        e.status.add_cluster(&name, "test", labels);
        e.status.update_stream(&name, &pods(), |_| {});
    }

    fn pod(cluster: &str, name: &str, app: &str) -> Change {
        let json = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"ns","uid":"uid-{name}","resourceVersion":"7","labels":{{"app":"{app}"}}}}}}"#
        );
        Change::Upsert(ObjectState {
            key: ObjectKey::new("pods", &ClusterName::from(cluster), "ns", name),
            json,
            labels: vec![("app".into(), app.into())],
            owners: Vec::new(),
            fields: Vec::new(),
        })
    }

    fn query(clusters: &[&str], labels: &str) -> Query {
        Query {
            resource: "pods".into(),
            clusters: ClusterFilter::parse(
                &clusters.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
                "",
            )
            .unwrap(),
            labels: LabelSelector::parse(labels).unwrap(),
            ..Query::default()
        }
    }

    /// A live watch (no initial objects, from now) of `query`.
    async fn live(e: &Engine, query: Query) -> fleetscope_model::fleet::Watch {
        e.watch(WatchRequest {
            query,
            ..WatchRequest::for_caller(fleetscope_model::Access::everything())
        })
        .await
        .unwrap()
    }

    async fn next(w: &mut fleetscope_model::fleet::Watch) -> WatchEvent {
        tokio::time::timeout(PATIENCE, w.next())
            .await
            .expect("an event in time")
            .expect("the watch goes on")
            .expect("no error")
    }

    /// The next object event (skipping cluster status events): kind, cluster/name, revision.
    async fn next_object(w: &mut fleetscope_model::fleet::Watch) -> (EventType, String, Revision) {
        loop {
            if let WatchEvent::Object {
                kind,
                object,
                revision,
                ..
            } = next(w).await
            {
                assert_eq!(object.uid, format!("uid-{}", object.key.name));
                assert_eq!(object.resource_version, "7");
                return (
                    kind,
                    format!("{}/{}", object.key.cluster, object.key.name),
                    revision,
                );
            }
        }
    }

    #[tokio::test]
    async fn backlog_then_live_in_revision_order() {
        let e = engine(1000);
        join(&e, "a", &[]);
        let start = e.index.snapshot().revision();
        e.index
            .apply([pod("a", "p1", "web"), pod("a", "p2", "web")]);
        let mut w = e
            .watch(WatchRequest {
                query: query(&[], ""),
                since: Some(start),
                ..WatchRequest::for_caller(fleetscope_model::Access::everything())
            })
            .await
            .unwrap();
        e.index.apply([pod("a", "p3", "web")]);
        let mut last = start;
        for name in ["a/p1", "a/p2", "a/p3"] {
            let (kind, got, revision) = next_object(&mut w).await;
            assert_eq!((kind, got.as_str()), (EventType::Added, name));
            assert!(revision > last, "revisions increase");
            last = revision;
        }
    }

    #[tokio::test]
    async fn initial_objects_then_the_end_marker_then_changes() {
        let e = engine(1000);
        join(&e, "a", &[]);
        e.index.apply([pod("a", "p1", "web"), pod("a", "p2", "db")]);
        let mut w = e
            .watch(WatchRequest {
                query: query(&[], "app=web"),
                initial: true,
                ..WatchRequest::for_caller(fleetscope_model::Access::everything())
            })
            .await
            .unwrap();
        assert_eq!(next_object(&mut w).await.1, "a/p1");
        let at = e.index.snapshot().revision();
        match next(&mut w).await {
            WatchEvent::InitialEventsEnd { revision, .. } => assert_eq!(revision, at),
            other => panic!("expected the end of the initial objects, got {other:?}"),
        }
        e.index.apply([pod("a", "p3", "web")]);
        assert_eq!(next_object(&mut w).await.1, "a/p3");
    }

    #[tokio::test]
    async fn filters_apply_to_transitions() {
        let e = engine(1000);
        join(&e, "a", &[]);
        let mut w = live(&e, query(&[], "app=web")).await;
        e.index.apply([pod("a", "p1", "web")]);
        assert_eq!(next_object(&mut w).await.0, EventType::Added);
        e.index.apply([pod("a", "p1", "db")]);
        assert_eq!(next_object(&mut w).await.0, EventType::Deleted);
        e.index.apply([pod("a", "p2", "db")]);
        e.index.apply([pod("a", "p1", "web")]);
        let (kind, name, _) = next_object(&mut w).await;
        assert_eq!((kind, name.as_str()), (EventType::Added, "a/p1"));
    }

    #[tokio::test]
    async fn a_cluster_added_later_is_followed_by_a_matching_glob() {
        let e = engine(1000);
        join(&e, "prod-1", &[]);
        let mut w = live(&e, query(&["prod-*"], "")).await;
        join(&e, "prod-2", &[]);
        join(&e, "dev", &[]);
        e.index
            .apply([pod("dev", "d1", "web"), pod("prod-2", "p1", "web")]);
        // The new cluster's status and its object, in either order; nothing of "dev".
        let (mut saw_status, mut saw_object) = (false, false);
        while !(saw_status && saw_object) {
            match next(&mut w).await {
                WatchEvent::ClusterStatus { cluster, .. } => {
                    assert_ne!(cluster.cluster.as_str(), "dev");
                    saw_status |= cluster.cluster.as_str() == "prod-2";
                }
                WatchEvent::Object { object, kind, .. } => {
                    assert_eq!(kind, EventType::Added);
                    assert_eq!(object.key.cluster.as_str(), "prod-2");
                    saw_object = true;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        // A cluster removed: its objects' deletes still reach the watch.
        e.index
            .apply([Change::RemoveCluster(ClusterName::from("prod-2"))]);
        let (kind, name, _) = next_object(&mut w).await;
        assert_eq!((kind, name.as_str()), (EventType::Deleted, "prod-2/p1"));
    }

    #[tokio::test]
    async fn an_oversized_batch_does_not_end_a_subscriber_but_falling_behind_does() {
        let e = engine(4);
        join(&e, "a", &[]);
        let mut w = live(&e, query(&[], "")).await;
        // One batch of 20, more than the buffer of 4: delivered whole.
        e.index
            .apply((0..20).map(|i| pod("a", &format!("big-{i}"), "web")));
        for _ in 0..20 {
            next_object(&mut w).await;
        }
        // Then, not reading, it falls behind change after change: ended, resumably.
        for i in 0..200 {
            e.index.apply([pod("a", &format!("small-{i}"), "web")]);
        }
        let ended = tokio::time::timeout(PATIENCE, async {
            loop {
                match w.next().await {
                    Some(Err(e)) => return e,
                    Some(Ok(_)) => {}
                    None => panic!("ended without an error"),
                }
            }
        })
        .await
        .expect("ended in time");
        assert!(
            matches!(ended, FleetError::ResourceExhausted { .. }),
            "{ended}"
        );
        assert!(ended.to_string().contains("since_revision="), "{ended}");
    }

    #[tokio::test]
    async fn a_start_older_than_the_log_is_out_of_range() {
        let mut config = EngineConfig::default();
        config.index.log_retention = 2;
        let e = Engine::start(Vec::new(), config);
        join(&e, "a", &[]);
        let start = e.index.snapshot().revision();
        for i in 0..10 {
            e.index.apply([pod("a", &format!("p{i}"), "web")]);
        }
        let refused = e
            .watch(WatchRequest {
                query: query(&[], ""),
                since: Some(start),
                ..WatchRequest::for_caller(fleetscope_model::Access::everything())
            })
            .await
            .err()
            .expect("refused");
        assert!(
            matches!(refused, FleetError::OutOfRange { .. }),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn a_bookmark_never_runs_ahead_of_an_event_still_to_be_yielded() {
        let e = engine(1000);
        join(&e, "a", &[]);
        let mut w = live(&e, query(&[], "")).await;
        e.index.apply([pod("a", "p1", "web")]);
        let published = e.index.snapshot().revision();
        // Wait until the producer has handed the event over and moved on.
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match w.bookmark(&mut cx) {
                // The event is still to come: no bookmark may claim its revision.
                None => break,
                Some(r) => assert!(r < published, "bookmark {r} ahead of an undelivered event"),
            }
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (_, name, revision) = next_object(&mut w).await;
        assert_eq!((name.as_str(), revision), ("a/p1", published));
        assert_eq!(w.bookmark(&mut cx), Some(published));
    }

    /// A policy granting pods of the listed (cluster, namespace) places, and Secret
    /// values nowhere.
    struct Places(Vec<(&'static str, &'static str)>);

    impl fleetscope_model::access::Policy for Places {
        fn namespaces(
            &self,
            _: &fleetscope_model::access::Subject,
            _: fleetscope_model::Verb,
            _: &ResourceType,
            cluster: fleetscope_model::access::ClusterRef<'_>,
        ) -> fleetscope_model::access::Namespaces {
            let patterns: Vec<glob::Pattern> = self
                .0
                .iter()
                .filter(|(c, _)| *c == cluster.name.as_str())
                .map(|(_, n)| glob::Pattern::new(n).unwrap())
                .collect();
            fleetscope_model::access::Namespaces::Only {
                patterns,
                cluster_scoped: false,
            }
        }
        fn secret_data(
            &self,
            _: &fleetscope_model::access::Subject,
            _: fleetscope_model::access::ClusterRef<'_>,
            _: &str,
        ) -> bool {
            false
        }
        fn sees_cluster(
            &self,
            _: &fleetscope_model::access::Subject,
            cluster: fleetscope_model::access::ClusterRef<'_>,
        ) -> bool {
            self.0.iter().any(|(c, _)| *c == cluster.name.as_str())
        }
    }

    type PolicyTx =
        tokio::sync::watch::Sender<std::sync::Arc<dyn fleetscope_model::access::Policy>>;

    fn held_to(places: Vec<(&'static str, &'static str)>) -> (fleetscope_model::Access, PolicyTx) {
        let (tx, rx) = tokio::sync::watch::channel(std::sync::Arc::new(Places(places))
            as std::sync::Arc<dyn fleetscope_model::access::Policy>);
        let subject = fleetscope_model::access::Subject {
            user: "alice".into(),
            groups: Vec::new(),
        };
        (fleetscope_model::Access::new(subject, rx), tx)
    }

    fn pod_in(cluster: &str, namespace: &str, name: &str) -> Change {
        let json = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{namespace}","uid":"uid-{name}","resourceVersion":"7"}}}}"#
        );
        Change::Upsert(ObjectState {
            key: ObjectKey::new("pods", &ClusterName::from(cluster), namespace, name),
            json,
            labels: Vec::new(),
            owners: Vec::new(),
            fields: Vec::new(),
        })
    }

    #[tokio::test]
    async fn a_watch_sees_only_its_grant_and_follows_a_new_policy_at_once() {
        let e = engine(1000);
        join(&e, "a", &[]);
        join(&e, "b", &[]);
        e.index.apply([
            pod_in("a", "team", "p1"),
            pod_in("a", "other", "p2"),
            pod_in("b", "team", "p3"),
        ]);
        let (access, policy) = held_to(vec![("a", "team")]);
        let mut w = e
            .watch(WatchRequest {
                query: query(&[], ""),
                initial: true,
                ..WatchRequest::for_caller(access)
            })
            .await
            .unwrap();
        assert_eq!(next_object(&mut w).await.1, "a/p1");
        assert!(matches!(
            next(&mut w).await,
            WatchEvent::InitialEventsEnd { .. }
        ));
        // Changes outside the grant are never sent; one inside is.
        e.index
            .apply([pod_in("a", "other", "p4"), pod_in("b", "team", "p5")]);
        e.index.apply([pod_in("a", "team", "p6")]);
        assert_eq!(next_object(&mut w).await.1, "a/p6");
        // A new policy: a/team taken away, b/team granted. The objects leaving are
        // DELETED, those entering ADDED, at the revision reached; then it is followed.
        let at = e.index.snapshot().revision();
        policy.send_replace(std::sync::Arc::new(Places(vec![("b", "team")])));
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let (kind, name, revision) = next_object(&mut w).await;
            assert_eq!(revision, at);
            seen.insert((name, format!("{kind:?}")));
        }
        let expected: std::collections::BTreeSet<(String, String)> = [
            ("a/p1", EventType::Deleted),
            ("a/p6", EventType::Deleted),
            ("b/p3", EventType::Added),
            ("b/p5", EventType::Added),
        ]
        .into_iter()
        .map(|(n, k)| (n.to_string(), format!("{k:?}")))
        .collect();
        assert_eq!(seen, expected);
        e.index.apply([pod_in("a", "team", "p7")]);
        e.index.apply([pod_in("b", "team", "p8")]);
        assert_eq!(next_object(&mut w).await.1, "b/p8");
    }

    #[tokio::test]
    async fn a_type_a_cluster_does_not_serve_is_named_only_to_who_reads_everything_there() {
        let e = engine(1000);
        join(&e, "a", &[]);
        e.index.apply([pod_in("a", "team", "p1")]);
        e.status.update(&ClusterName::from("a"), |c| {
            c.missing = vec![("widgets.example.com".into(), "not served".into())];
        });
        let everything = fleetscope_model::Access::everything();
        let (narrow, _policy) = held_to(vec![("a", "team")]);
        for (access, named) in [(everything, true), (narrow, false)] {
            let answer = e.clusters(ClusterFilter::default(), &access).await.unwrap();
            let text = format!("{:?}", answer.clusters);
            assert_eq!(text.contains("widgets"), named, "{text}");
        }
    }

    #[tokio::test]
    async fn list_count_and_get_answer_only_the_grant() {
        use fleetscope_model::fleet::{CountRequest, GetRequest, ListRequest};
        let e = engine(1000);
        join(&e, "a", &[]);
        join(&e, "b", &[]);
        e.index.apply([
            pod_in("a", "team", "p1"),
            pod_in("a", "other", "p2"),
            pod_in("b", "team", "p3"),
        ]);
        let (access, _policy) = held_to(vec![("a", "team")]);
        let list = e
            .list(ListRequest {
                query: query(&[], ""),
                limit: 100,
                max_bytes: usize::MAX,
                ..ListRequest::for_caller(access.clone())
            })
            .await
            .unwrap();
        let names: Vec<String> = list.items.iter().map(|o| o.key.to_string()).collect();
        assert_eq!(list.items.len(), 1, "{names:?}");
        assert_eq!(
            list.clusters.len(),
            1,
            "only the cluster granted is drawn on"
        );
        let count = e
            .count(CountRequest {
                query: query(&[], ""),
                group_by: vec![fleetscope_model::GroupBy::Namespace],
                access: access.clone(),
            })
            .await
            .unwrap();
        assert_eq!(count.total, 1);
        assert_eq!(count.groups.len(), 1);
        let get = |cluster: &str, namespace: &str, name: &str| GetRequest {
            resource: "pods".into(),
            cluster: cluster.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..GetRequest::for_caller(access.clone())
        };
        assert!(e.get(get("a", "team", "p1")).await.is_ok());
        // Not granted reads exactly as not there.
        let hidden = e.get(get("a", "other", "p2")).await.unwrap_err();
        let missing = e.get(get("a", "other", "nope")).await.unwrap_err();
        assert_eq!(
            hidden.to_string().replace("p2", "X"),
            missing.to_string().replace("nope", "X")
        );
        let hidden = e.get(get("b", "team", "p3")).await.unwrap_err();
        let missing = e.get(get("c", "team", "p3")).await.unwrap_err();
        assert_eq!(
            hidden.to_string().replace("\"b\"", "?"),
            missing.to_string().replace("\"c\"", "?")
        );
        let clusters = e.clusters(ClusterFilter::default(), &access).await.unwrap();
        let names: Vec<&str> = clusters.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(clusters.clusters[0].streams[0].object_count, 1);
        let types = e.resource_types(&access).await.unwrap();
        assert_eq!(types.len(), 1);
        assert_eq!(types[0].clusters, vec![(ClusterName::from("a"), 1)]);
    }

    #[test]
    fn a_secret_shown_without_its_values_keeps_its_keys_and_says_so() {
        let mut o = fleetscope_model::fleet::FleetObject {
            key: ObjectKey::new("secrets", &ClusterName::from("a"), "ns", "s"),
            revision: Revision(1),
            uid: String::new(),
            resource_version: String::new(),
            json: r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"password":"aHVudGVyMg=="},"stringData":{"token":"t0p"}}"#.into(),
        };
        crate::view::redact_secret(&mut o);
        let v: serde_json::Value = serde_json::from_str(&o.json).unwrap();
        assert_eq!(v["data"]["password"], "");
        assert_eq!(v["stringData"]["token"], "");
        assert_eq!(
            v["metadata"]["annotations"]["fleetscope.io/redacted"],
            "data,stringData"
        );
        assert!(!o.json.contains("aHVudGVyMg"));
    }

    #[test]
    fn a_redacted_secret_loses_its_last_applied_copy_in_full_and_metadata_form() {
        let applied = r#"{\"apiVersion\":\"v1\",\"data\":{\"password\":\"aHVudGVyMg==\"},\"kind\":\"Secret\"}"#;
        for body in [r#","data":{"password":"aHVudGVyMg=="}"#, ""] {
            let mut o = fleetscope_model::fleet::FleetObject {
                key: ObjectKey::new("secrets", &ClusterName::from("a"), "ns", "s"),
                revision: Revision(1),
                uid: String::new(),
                resource_version: String::new(),
                json: format!(
                    r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"s","annotations":{{"kubectl.kubernetes.io/last-applied-configuration":"{applied}","keep":"me"}}}}{body}}}"#
                ).into(),
            };
            crate::view::redact_secret(&mut o);
            assert!(!o.json.contains("aHVudGVyMg"), "{}", o.json);
            let v: serde_json::Value = serde_json::from_str(&o.json).unwrap();
            let a = &v["metadata"]["annotations"];
            assert_eq!(a["keep"], "me");
            let said = a["fleetscope.io/redacted"].as_str().unwrap();
            assert!(
                said.ends_with("kubectl.kubernetes.io/last-applied-configuration"),
                "{said}"
            );
        }
    }

    #[tokio::test]
    async fn a_watch_left_unread_is_ended_and_told_where_to_resume() {
        let config = EngineConfig {
            subscriber_stall: Duration::from_millis(100),
            ..EngineConfig::default()
        };
        let e = Engine::start(Vec::new(), config);
        join(&e, "a", &[]);
        let before = e.index.subscriber_count();
        let mut w = live(&e, query(&[], "")).await;
        assert_eq!(e.index.subscriber_count(), before + 1);
        for i in 0..50 {
            e.index.apply([pod("a", &format!("p{i}"), "web")]);
        }
        // Nobody reads: the producer gives up, and its subscription goes.
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while e.index.subscriber_count() > before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the unread Watch is ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Reading now: what was handed over, then why it ended, resumably.
        let mut delivered = 0;
        let ended = loop {
            match tokio::time::timeout(PATIENCE, w.next())
                .await
                .expect("in time")
            {
                Some(Ok(_)) => delivered += 1,
                Some(Err(err)) => break err,
                None => panic!("ended without saying why"),
            }
        };
        assert!(delivered > 0 && delivered < 50, "{delivered}");
        assert!(
            matches!(ended, FleetError::ResourceExhausted { .. }),
            "{ended}"
        );
        assert!(ended.to_string().contains("since_revision="), "{ended}");
        assert!(w.next().await.is_none());
    }

    #[tokio::test]
    async fn a_query_past_its_deadline_is_deadline_exceeded_not_a_partial_answer() {
        use fleetscope_model::fleet::{CountRequest, ListRequest};
        let config = EngineConfig {
            query_timeout: Duration::from_nanos(1),
            ..EngineConfig::default()
        };
        let e = Engine::start(Vec::new(), config);
        join(&e, "a", &[]);
        e.index
            .apply((0..5000).map(|i| pod("a", &format!("p{i}"), "web")));
        let q = query(&[], "app=web,tier!=db");
        let count = e
            .count(CountRequest {
                query: q.clone(),
                ..CountRequest::for_caller(fleetscope_model::Access::everything())
            })
            .await
            .unwrap_err();
        assert!(matches!(count, FleetError::DeadlineExceeded(_)), "{count}");
        let list = e
            .list(ListRequest {
                query: q,
                limit: 10_000,
                max_bytes: usize::MAX,
                ..ListRequest::for_caller(fleetscope_model::Access::everything())
            })
            .await
            .unwrap_err();
        assert!(matches!(list, FleetError::DeadlineExceeded(_)), "{list}");
    }

    /// A watch event of pod `name` in `cluster` at member resourceVersion `rv`.
    fn pod_at(cluster: &str, name: &str, rv: u64) -> Change {
        let Change::Upsert(input) = pod(cluster, name, "web") else {
            unreachable!()
        };
        Change::UpsertAt(input, std::sync::Arc::from(rv.to_string()))
    }

    fn positioned(e: &Engine, positions: &[(&str, &str)]) -> WatchRequest {
        let _ = e;
        WatchRequest {
            query: query(&[], ""),
            positions: Some(
                positions
                    .iter()
                    .map(|(c, rv)| (ClusterName::from(*c), std::sync::Arc::from(*rv)))
                    .collect(),
            ),
            report_positions: true,
            ..WatchRequest::for_caller(fleetscope_model::Access::everything())
        }
    }

    /// The next event that is not a cluster's status.
    async fn next_change(w: &mut fleetscope_model::fleet::Watch) -> WatchEvent {
        loop {
            match next(w).await {
                WatchEvent::ClusterStatus { .. } => {}
                e => return e,
            }
        }
    }

    fn object_at(e: &WatchEvent) -> (String, Option<&str>) {
        match e {
            WatchEvent::Object {
                object, position, ..
            } => (object.key.name.to_string(), position.as_deref()),
            other => panic!("expected an object, got {other:?}"),
        }
    }

    /// Reads a cluster sent anew, which must come next: the cluster the reset names,
    /// each object it sends with the position it carries, and the cluster and
    /// position its end gives.
    async fn reset_of(
        w: &mut fleetscope_model::fleet::Watch,
    ) -> (String, Vec<(String, Option<String>)>, (String, String)) {
        let cluster = match next_change(w).await {
            WatchEvent::Reset { cluster } => cluster.to_string(),
            other => panic!("expected a reset, got {other:?}"),
        };
        let mut objects = Vec::new();
        loop {
            match next_change(w).await {
                WatchEvent::ResetEnd {
                    cluster: ended,
                    position,
                    ..
                } => return (cluster, objects, (ended.to_string(), position.to_string())),
                e => {
                    let (name, position) = object_at(&e);
                    objects.push((name, position.map(str::to_string)));
                }
            }
        }
    }
    #[tokio::test]
    async fn from_a_member_position_the_changes_after_it_follow_with_theirs() {
        let e = engine(1000);
        join(&e, "a", &[]);
        e.index
            .apply([pod_at("a", "p1", 11), pod_at("a", "p2", 12)]);
        e.index.apply([pod_at("a", "p3", 13)]);
        let mut w = e.watch(positioned(&e, &[("a", "11")])).await.unwrap();
        match next_change(&mut w).await {
            WatchEvent::Positions { positions, .. } => {
                assert_eq!(
                    positions,
                    [(ClusterName::from("a"), std::sync::Arc::from("11"))]
                );
            }
            other => panic!("expected the positions, got {other:?}"),
        }
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("p2".into(), Some("12"))
        );
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("p3".into(), Some("13"))
        );
        e.index.apply([pod_at("a", "p4", 20)]);
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("p4".into(), Some("20"))
        );
        // Between two changes: what is at or before the position is not sent again.
        let mut w = e.watch(positioned(&e, &[("a", "12")])).await.unwrap();
        next_change(&mut w).await;
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("p3".into(), Some("13"))
        );
    }

    #[tokio::test]
    async fn a_position_from_before_this_replica_let_the_cluster_go_is_not_carried() {
        let e = engine(1000);
        join(&e, "a", &[]);
        e.index
            .apply([pod_at("a", "p1", 11), pod_at("a", "p2", 12)]);
        // The cluster goes to another replica, which sees p2 deleted; it comes back
        // here by a fresh list, without p2.
        e.index
            .apply([Change::RemoveCluster(ClusterName::from("a"))]);
        join(&e, "a", &[]);
        e.index.apply([pod_at("a", "p1", 20)]);
        // A subscriber standing at 12 is sent the cluster anew (no history of the
        // member here), never the fresh list as news with p2 left standing.
        let mut w = e.watch(positioned(&e, &[("a", "12")])).await.unwrap();
        assert_eq!(
            reset_of(&mut w).await,
            (
                "a".into(),
                vec![("p1".into(), None)],
                ("a".into(), "20".into())
            )
        );
    }

    #[tokio::test]
    async fn a_position_with_no_history_here_is_reset_and_a_cluster_leaving_ends_the_stream() {
        let e = engine(1000);
        join(&e, "a", &[]);
        e.index
            .apply([pod_at("a", "p1", 11), pod_at("a", "p2", 12)]);
        let mut w = e.watch(positioned(&e, &[("a", "5")])).await.unwrap();
        assert_eq!(
            reset_of(&mut w).await,
            (
                "a".into(),
                vec![("p1".into(), None), ("p2".into(), None)],
                ("a".into(), "12".into())
            )
        );
        assert!(matches!(
            next_change(&mut w).await,
            WatchEvent::Positions { .. }
        ));
        // Ahead of this fleet (another replica saw 30): changes up to it are skipped.
        let mut ahead = e.watch(positioned(&e, &[("a", "30")])).await.unwrap();
        next_change(&mut ahead).await;
        e.index
            .apply([pod_at("a", "p3", 25), pod_at("a", "p4", 31)]);
        assert_eq!(
            object_at(&next_change(&mut ahead).await),
            ("p4".into(), Some("31"))
        );
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("p3".into(), Some("25"))
        );
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("p4".into(), Some("31"))
        );
        // The cluster leaving this fleet is no change of it: nothing of it is
        // reported, and the stream ends, retryably (a router follows the cluster
        // where it is served now); the cluster taken up here again is never sent on
        // it as a list of no position.
        e.index
            .apply([Change::RemoveCluster(ClusterName::from("a"))]);
        join(&e, "a", &[]);
        e.index.apply([pod_at("a", "p1", 40)]);
        loop {
            match tokio::time::timeout(PATIENCE, w.next()).await.unwrap() {
                Some(Ok(WatchEvent::ClusterStatus { .. } | WatchEvent::Positions { .. })) => {}
                Some(Err(FleetError::Unavailable(why))) => {
                    assert!(why.contains("cluster a left this replica"), "{why}");
                    break;
                }
                other => panic!("the stream went on after its cluster left: {other:?}"),
            }
        }
        assert!(w.next().await.is_none());
    }

    #[tokio::test]
    async fn a_replay_from_another_cluster_s_start_never_repeats_what_a_stream_holds() {
        let e = engine(1000);
        join(&e, "a", &[]);
        join(&e, "b", &[]);
        e.index.apply([pod_at("b", "q1", 5)]);
        e.index.apply([pod_at("a", "p1", 11)]);
        // This replica let the cluster go and took it up again since b's position.
        e.index
            .apply([Change::RemoveCluster(ClusterName::from("a"))]);
        join(&e, "a", &[]);
        e.index
            .apply([pod_at("a", "p1", 20), pod_at("a", "p2", 21)]);
        e.index.apply([pod_at("b", "q2", 6)]);
        // b starts long before a: the replay holds a leaving and coming back, none of
        // which is news to a subscriber standing at 21 in a.
        let mut w = e
            .watch(positioned(&e, &[("b", "5"), ("a", "21")]))
            .await
            .unwrap();
        assert!(matches!(
            next_change(&mut w).await,
            WatchEvent::Positions { .. }
        ));
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("q2".into(), Some("6"))
        );
        e.index.apply([pod_at("a", "p3", 22)]);
        assert_eq!(
            object_at(&next_change(&mut w).await),
            ("p3".into(), Some("22"))
        );
    }
}
