//! A Watch through the router: the replicas' streams merged, and a position that
//! survives every move. Through a router a subscriber stands, in each cluster, at a
//! resourceVersion of that cluster's API server (the member's own position, the same
//! on every replica): every event carries its cluster's, and bookmarks carry them all
//! as a token signed with the ring's key, which any router takes back. When a cluster
//! moves (a replica gone, fenced, draining, or the ring grown) or a replica's stream
//! breaks, the router asks whichever replica serves the cluster now to continue from
//! the position it reached; that replica continues exactly from its own event log, or
//! says it cannot (`RESET`, the cluster's current objects, `RESET_END`): never a gap.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use fleetscope_model::fleet::{Projection, Query, WatchEvent, WatchRequest};
use fleetscope_model::{Access, ClusterName, Fleet as _, FleetError, Revision};
use futures::stream::{BoxStream, SelectAll};
use futures::{StreamExt as _, stream};
use tokio_util::sync::CancellationToken;

use super::Router;
use fleetscope_grpc::token::{seal, unseal};

/// How often a routed Watch looks for clusters to follow elsewhere, and sends its
/// position when it moved.
pub(super) const TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// What a position token holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Token {
    /// The query and projection it was made for, protobuf-encoded, base64.
    q: String,
    /// (cluster, member resourceVersion; empty when not known).
    v: Vec<(String, String)>,
}

/// One replica stream's items: its generation, and an event, an error, or its end.
type Item = (u64, Option<Result<WatchEvent, FleetError>>);

/// A routed Watch in progress.
pub(super) struct Routed {
    router: Router,
    query: Query,
    projection: Projection,
    access: Access,
    /// The query as tokens carry it.
    fingerprint: String,
    /// Where the subscriber stands in each cluster, as delivered to it.
    positions: BTreeMap<String, Arc<str>>,
    /// Which stream (replica, generation) each cluster's events are taken from.
    owner: BTreeMap<String, (String, u64)>,
    /// The clusters the subscriber was told are followed from no replica.
    unserved: BTreeSet<String>,
    /// Open streams, by generation, and how to end each.
    live: BTreeMap<u64, CancellationToken>,
    streams: SelectAll<BoxStream<'static, Item>>,
    next_generation: u64,
    /// Streams still to send the end of their initial objects.
    initial: BTreeSet<u64>,
    /// Streams that sent the end of their initial objects and are still to send the
    /// positions those stand at (a replica sends them next), so the first token
    /// holds every cluster's position.
    initial_positions: BTreeSet<u64>,
    /// Whether the initial objects' end is still to be sent.
    initial_pending: bool,
    /// The newest revision a replica reported (informational only).
    newest: Revision,
    /// The position moved since the last token sent.
    dirty: bool,
    out: std::collections::VecDeque<WatchEvent>,
    tick: tokio::time::Interval,
    ended: bool,
    /// Pass on the positions the replicas report (as [`WatchEvent::Positions`]), for
    /// a Watch that others read (a follower of the replicas).
    passes_positions: bool,
}

impl Routed {
    /// A routed Watch of `r` following nothing yet.
    fn new(router: Router, r: &WatchRequest) -> Self {
        let fingerprint = fleetscope_grpc::remote::fingerprint(&r.query, r.projection);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            router,
            query: r.query.clone(),
            projection: r.projection,
            access: r.access.clone(),
            fingerprint,
            positions: BTreeMap::new(),
            owner: BTreeMap::new(),
            unserved: BTreeSet::new(),
            live: BTreeMap::new(),
            streams: SelectAll::new(),
            next_generation: 0,
            initial: BTreeSet::new(),
            initial_positions: BTreeSet::new(),
            initial_pending: false,
            newest: Revision(0),
            dirty: false,
            out: std::collections::VecDeque::new(),
            tick,
            ended: false,
            passes_positions: false,
        }
    }

    /// Opens a routed Watch from its initial objects or from now (one resumed from a
    /// token is [`Self::resumed`]).
    pub(super) async fn start(router: Router, r: &WatchRequest) -> Result<Self, FleetError> {
        let mut routed = Self::new(router, r);
        routed.open_all(r.initial).await?;
        Ok(routed)
    }

    /// Opens a routed Watch from now whose every event, and every position the
    /// replicas report, others read.
    pub(super) async fn shared(router: Router, r: &WatchRequest) -> Result<Self, FleetError> {
        let mut routed = Self::new(router, r);
        routed.passes_positions = true;
        routed.open_all(false).await?;
        Ok(routed)
    }

    /// Opens a routed Watch continuing from `positions` (cluster: member position).
    pub(super) async fn resumed(
        router: Router,
        r: &WatchRequest,
        positions: BTreeMap<String, Arc<str>>,
    ) -> Result<Self, FleetError> {
        let mut routed = Self::new(router, r);
        routed.positions = positions;
        routed.follow().await?;
        Ok(routed)
    }

    /// Follows every selected cluster from the replica serving it now, from now or
    /// from its initial objects.
    async fn open_all(&mut self, initial: bool) -> Result<(), FleetError> {
        let view = self.router.view()?;
        let serving = view.serving();
        let plan = Router::plan(&self.query.clusters, &serving);
        let opened = plan.values().map(|(member, clusters)| {
            let mut request = self.request(clusters);
            request.initial = initial;
            let router = &self.router;
            async move {
                let stream = router
                    .ask(member, |remote| async move { remote.watch(request).await })
                    .await?;
                Ok::<_, FleetError>((member.identity.clone(), clusters.clone(), stream))
            }
        });
        let opened = futures::future::try_join_all(opened).await?;
        for (identity, clusters, stream) in opened {
            let g = self.add(identity, &clusters, stream);
            if initial {
                self.initial.insert(g);
            }
        }
        self.initial_pending = initial;
        if initial && self.initial.is_empty() {
            self.initial_done();
        }
        Ok(())
    }

    /// Where the subscriber stands in each cluster, as delivered to it so far (and
    /// as events still queued for it take it).
    pub(super) fn positions(&self) -> &BTreeMap<String, Arc<str>> {
        &self.positions
    }

    /// The clusters the subscriber was told are followed from no replica.
    pub(super) fn told_unserved(&self) -> &BTreeSet<String> {
        &self.unserved
    }

    /// Whether everything taken was delivered and the initial objects are all sent:
    /// the subscriber stands exactly at [`Self::positions`].
    pub(super) fn quiet(&self) -> bool {
        self.out.is_empty()
            && !self.initial_pending
            && self.initial.is_empty()
            && self.initial_positions.is_empty()
    }

    /// The request following `clusters` from one replica, with positions reported.
    fn request(&self, clusters: &[String]) -> WatchRequest {
        let mut request = WatchRequest::for_caller(self.access.clone());
        request.query = self.query.clone();
        request.query.clusters = self.query.clusters.only(clusters);
        request.projection = self.projection;
        request.report_positions = true;
        request
    }

    /// Where the subscriber stands, as a token.
    fn token(&self) -> String {
        token(
            &self.router,
            &self.access,
            &self.fingerprint,
            &self.positions,
        )
    }

    /// Takes `stream` (of replica `identity`) as the source of `clusters`' events.
    fn add(
        &mut self,
        identity: String,
        clusters: &[String],
        stream: fleetscope_model::fleet::Watch,
    ) -> u64 {
        let g = self.next_generation;
        self.next_generation += 1;
        let cancel = CancellationToken::new();
        // The stream holds its place on its connection until it is dropped.
        let items = stream
            .take_until(cancel.clone().cancelled_owned())
            .map(move |item| (g, Some(item)))
            .chain(stream::once(async move { (g, None) }));
        self.streams.push(items.boxed());
        self.live.insert(g, cancel);
        for c in clusters {
            self.owner.insert(c.clone(), (identity.clone(), g));
        }
        g
    }

    /// The initial objects are all sent: says so, and where the subscriber stands.
    fn initial_done(&mut self) {
        self.initial_pending = false;
        let token = self.token();
        self.out.push_back(WatchEvent::InitialEventsEnd {
            revision: self.newest,
            token: token.clone(),
        });
        self.out.push_back(WatchEvent::Bookmark { token });
        self.dirty = false;
    }

    /// Follows each selected cluster from the replica serving it now, continuing from
    /// where the subscriber stands; ends streams no cluster is taken from any more.
    /// A stream whose replica no longer holds a cluster ready (it let the cluster go,
    /// or its Lease expired) or that broke is no longer that cluster's source: nothing
    /// more of the cluster is taken from it. A selected cluster no replica can be
    /// followed from is reported to the subscriber (`CLUSTER_STATUS`, stale, saying
    /// why) until it is followed again (then `CLUSTER_STATUS` synced, naming the
    /// replica).
    async fn follow(&mut self) -> Result<(), FleetError> {
        let view = self.router.view()?;
        let holders = view.holders();
        let known = self.router.known(&view.serving());
        let to_follow = self.needing_streams(&known, &holders);
        self.open(to_follow, &holders).await?;
        self.end_idle();
        Ok(())
    }

    /// The selected clusters whose stream must be opened anew: none yet, broken, or
    /// from a replica that no longer holds the cluster ready (or leaves while another
    /// holds it). A stream from any holder that stays goes on (a holder ranked higher
    /// appearing is no reason to move). Those no replica holds are said unserved.
    fn needing_streams(
        &mut self,
        known: &BTreeSet<String>,
        holders: &BTreeMap<String, Vec<&fleetscope_ring::lease::Member>>,
    ) -> Vec<String> {
        let mut to_follow = Vec::new();
        let selected: Vec<&String> = known
            .iter()
            .filter(|c| self.query.clusters.names_match(c))
            .collect();
        for cluster in selected {
            let ready = holders.get(cluster);
            let current = self.owner.get(cluster).is_some_and(|(id, g)| {
                self.live.contains_key(g)
                    && ready.is_some_and(|ready| {
                        ready.iter().any(|m| {
                            m.identity == *id
                                && (!fleetscope_ring::vocabulary::leaving(m)
                                    || ready
                                        .iter()
                                        .all(|m| fleetscope_ring::vocabulary::leaving(m)))
                        })
                    })
            });
            if current {
                continue;
            }
            self.owner.remove(cluster);
            if ready.is_some() {
                to_follow.push(cluster.clone());
            } else {
                self.unserved(cluster, self.router.unserved_why());
            }
        }
        to_follow
    }

    /// Opens a stream for each of `to_follow` from its first holder; from the next
    /// when that one cannot be reached (killed, before its Lease expires); said
    /// unserved when none can.
    async fn open(
        &mut self,
        mut to_follow: Vec<String>,
        holders: &BTreeMap<String, Vec<&fleetscope_ring::lease::Member>>,
    ) -> Result<(), FleetError> {
        let mut failed: BTreeSet<String> = BTreeSet::new();
        let mut last_error: Option<FleetError> = None;
        while !to_follow.is_empty() {
            let mut wanted: BTreeMap<String, (fleetscope_ring::lease::Member, Vec<String>)> =
                BTreeMap::new();
            for cluster in std::mem::take(&mut to_follow) {
                let Some(member) = holders[&cluster]
                    .iter()
                    .find(|m| !failed.contains(&m.identity))
                else {
                    // Every holder failed: said, and tried again at the next look.
                    let why = last_error
                        .as_ref()
                        .map_or_else(String::new, ToString::to_string);
                    self.unserved(
                        &cluster,
                        format!("no replica holding this cluster could be followed: {why}"),
                    );
                    continue;
                };
                wanted
                    .entry(member.identity.clone())
                    .or_insert_with(|| ((*member).clone(), Vec::new()))
                    .1
                    .push(cluster);
            }
            for (identity, (member, clusters)) in wanted {
                let mut request = self.request(&clusters);
                request.positions = Some(self.positions_of(&clusters));
                let opened = self
                    .router
                    .ask(&member, |remote| async move { remote.watch(request).await })
                    .await;
                match opened {
                    Ok(stream) => {
                        tracing::debug!(replica = %identity, clusters = ?clusters, "a routed Watch follows clusters from a replica");
                        for c in &clusters {
                            self.served_again(c, &identity);
                        }
                        self.add(identity, &clusters, stream);
                    }
                    Err(e) if permanent(&e) => return Err(e),
                    Err(e) => {
                        tracing::debug!(replica = %identity, error = %e, "a routed Watch could not follow clusters from a replica: trying the next holder");
                        failed.insert(identity);
                        last_error = Some(e);
                        to_follow.extend(holders.keys().filter(|c| clusters.contains(c)).cloned());
                    }
                }
            }
        }
        Ok(())
    }

    /// Where the subscriber stands in each of `clusters` (empty where not known).
    fn positions_of(&self, clusters: &[String]) -> Vec<(ClusterName, Arc<str>)> {
        clusters
            .iter()
            .map(|c| {
                let at = self
                    .positions
                    .get(c)
                    .cloned()
                    .unwrap_or_else(|| Arc::from(""));
                (ClusterName::from(c.as_str()), at)
            })
            .collect()
    }

    /// Ends the streams no cluster is taken from any more.
    fn end_idle(&mut self) {
        let drawn: HashSet<u64> = self.owner.values().map(|(_, g)| *g).collect();
        let idle: Vec<u64> = self
            .live
            .keys()
            .filter(|g| !drawn.contains(g))
            .copied()
            .collect();
        for g in idle {
            if let Some(cancel) = self.live.remove(&g) {
                cancel.cancel();
            }
            self.initial_ended(g);
        }
    }

    /// Tells the subscriber, once, that `cluster` is followed from no replica now.
    fn unserved(&mut self, cluster: &str, why: String) {
        if self.unserved.insert(cluster.to_string()) {
            tracing::debug!(%cluster, %why, "a routed Watch follows a cluster from no replica");
            self.out.push_back(WatchEvent::ClusterStatus {
                cluster: fleetscope_model::fleet::ClusterFreshness {
                    cluster: ClusterName::from(cluster),
                    freshness: fleetscope_model::fleet::Freshness::Stale,
                    stale_since: Some(std::time::SystemTime::now()),
                    message: format!("{why}; its changes follow once a replica serves it"),
                },
                revision: self.newest,
            });
        }
    }

    /// Tells the subscriber that `cluster`, said unserved, is followed again.
    fn served_again(&mut self, cluster: &str, replica: &str) {
        if self.unserved.remove(cluster) {
            self.out.push_back(WatchEvent::ClusterStatus {
                cluster: fleetscope_model::fleet::ClusterFreshness {
                    cluster: ClusterName::from(cluster),
                    freshness: fleetscope_model::fleet::Freshness::Synced,
                    stale_since: None,
                    message: format!("served again by replica {replica}"),
                },
                revision: self.newest,
            });
        }
    }

    /// A stream that will send no more initial objects.
    fn initial_ended(&mut self, g: u64) {
        self.initial_positions.remove(&g);
        if self.initial.remove(&g) && self.initial.is_empty() && self.initial_pending {
            self.initial_done();
        }
    }

    /// Whether an event of `cluster` from stream `g` is the subscriber's.
    fn takes(&self, cluster: &str, g: u64) -> bool {
        self.owner.get(cluster).is_some_and(|(_, o)| *o == g)
    }

    /// What one replica's item means to the subscriber.
    fn take(
        &mut self,
        g: u64,
        item: Option<Result<WatchEvent, FleetError>>,
    ) -> Result<(), FleetError> {
        let e = match item {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                if self.live.contains_key(&g) && permanent(&e) {
                    return Err(e);
                }
                let replica = self
                    .owner
                    .values()
                    .find(|(_, o)| *o == g)
                    .map(|(id, _)| id.clone())
                    .unwrap_or_default();
                tracing::debug!(%replica, error = %e, "a replica's stream of a routed Watch broke: following its clusters again");
                self.broken(g);
                return Ok(());
            }
            None => {
                self.broken(g);
                return Ok(());
            }
        };
        if !self.live.contains_key(&g) {
            return Ok(());
        }
        if let Some(revision) = revision_of(&e) {
            self.newest = self.newest.max(revision);
        }
        let positioned = matches!(
            e,
            WatchEvent::Positions { .. } | WatchEvent::Bookmark { .. }
        );
        if !positioned && self.initial_positions.remove(&g) {
            // Anything but the positions after the initial objects: no more to wait for.
            self.initial_ended(g);
        }
        self.deliver(g, e);
        Ok(())
    }

    /// What an event of stream `g`, live, means to the subscriber: its own cluster's
    /// changes passed on with their positions noted, the positions of its initial
    /// objects awaited, a reset passed on.
    fn deliver(&mut self, g: u64, e: WatchEvent) {
        match e {
            WatchEvent::Object {
                kind,
                object,
                revision,
                position,
            } => {
                if !self.takes(object.key.cluster.as_str(), g) {
                    return;
                }
                if let Some(rv) = &position {
                    self.positions
                        .insert(object.key.cluster.to_string(), rv.clone());
                    self.dirty = true;
                }
                self.out.push_back(WatchEvent::Object {
                    kind,
                    object,
                    revision,
                    position,
                });
            }
            WatchEvent::InitialEventsEnd { .. } => {
                if self.initial.contains(&g) {
                    self.initial_positions.insert(g);
                }
            }
            WatchEvent::Positions {
                positions,
                revision,
            } => {
                let mut taken = Vec::new();
                for (cluster, rv) in positions {
                    if self.takes(cluster.as_str(), g) {
                        self.positions.insert(cluster.to_string(), rv.clone());
                        self.dirty = true;
                        taken.push((cluster, rv));
                    }
                }
                if self.passes_positions && !taken.is_empty() {
                    self.out.push_back(WatchEvent::Positions {
                        positions: taken,
                        revision,
                    });
                }
                if self.initial_positions.remove(&g) {
                    self.initial_ended(g);
                }
            }
            // A replica's own position token means nothing through a router.
            WatchEvent::Bookmark { .. } => {
                if self.initial_positions.remove(&g) {
                    self.initial_ended(g);
                }
            }
            WatchEvent::Reset { cluster } => {
                if !self.takes(cluster.as_str(), g) {
                    return;
                }
                self.positions.insert(cluster.to_string(), Arc::from(""));
                self.dirty = true;
                self.out.push_back(WatchEvent::Reset { cluster });
            }
            WatchEvent::ResetEnd {
                cluster,
                position,
                revision,
            } => {
                if !self.takes(cluster.as_str(), g) {
                    return;
                }
                self.positions.insert(cluster.to_string(), position.clone());
                self.dirty = true;
                self.out.push_back(WatchEvent::ResetEnd {
                    cluster,
                    position,
                    revision,
                });
            }
            WatchEvent::ClusterStatus { cluster, revision } => {
                if self.takes(cluster.cluster.as_str(), g) {
                    self.out
                        .push_back(WatchEvent::ClusterStatus { cluster, revision });
                }
            }
        }
    }

    /// Stream `g` ended or broke: its clusters are followed again (from the same
    /// replica, or the one serving them now) at the next look.
    fn broken(&mut self, g: u64) {
        if let Some(cancel) = self.live.remove(&g) {
            cancel.cancel();
        }
        self.initial_ended(g);
    }

    /// The next event for the subscriber; `None` once the Watch has ended.
    pub(super) async fn next(&mut self) -> Option<Result<WatchEvent, FleetError>> {
        loop {
            if let Some(e) = self.out.pop_front() {
                return Some(Ok(e));
            }
            if self.ended {
                return None;
            }
            let outcome = tokio::select! {
                item = self.streams.next(), if !self.streams.is_empty() => match item {
                    Some((g, item)) => self.take(g, item),
                    None => Ok(()),
                },
                _ = self.tick.tick() => {
                    let followed = self.follow().await;
                    if followed.is_ok() && self.dirty && !self.initial_pending {
                        self.dirty = false;
                        self.out.push_back(WatchEvent::Bookmark { token: self.token() });
                    }
                    followed
                }
            };
            if let Err(e) = outcome {
                self.ended = true;
                return Some(Err(e));
            }
        }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        for cancel in self.live.values() {
            cancel.cancel();
        }
    }
}

/// The positions a routed Watch resumes from: the token's (when it is this caller's
/// and this query's) and those reached after it.
pub(super) fn resume_positions(
    router: &Router,
    access: &Access,
    fingerprint: &str,
    resume: &fleetscope_model::fleet::Resume,
) -> Result<BTreeMap<String, Arc<str>>, FleetError> {
    let bad = || {
        FleetError::InvalidArgument(
            "resume_token was not issued to this caller for this query by a router of this ring: pass back a BOOKMARK's position_token unchanged, with the same query".into(),
        )
    };
    let payload = unseal(
        &router.upstream.page_token_key,
        &access.caller(),
        &resume.token,
    )
    .ok_or_else(bad)?;
    let t: Token = serde_json::from_slice(&payload).map_err(|_| bad())?;
    if t.q != fingerprint {
        return Err(bad());
    }
    let mut positions: BTreeMap<String, Arc<str>> =
        t.v.into_iter().map(|(c, rv)| (c, Arc::from(rv))).collect();
    for (cluster, rv) in &resume.after {
        positions.insert(cluster.to_string(), rv.clone());
    }
    Ok(positions)
}

/// `positions` as a token for `access`'s caller and the query of `fingerprint`.
pub(super) fn token(
    router: &Router,
    access: &Access,
    fingerprint: &str,
    positions: &BTreeMap<String, Arc<str>>,
) -> String {
    let t = Token {
        q: fingerprint.to_string(),
        v: positions
            .iter()
            .map(|(c, rv)| (c.clone(), rv.to_string()))
            .collect(),
    };
    let payload = serde_json::to_vec(&t).unwrap_or_default();
    seal(&router.upstream.page_token_key, &access.caller(), &payload)
}

/// The revision an event of a replica names, if any.
fn revision_of(e: &WatchEvent) -> Option<Revision> {
    match e {
        WatchEvent::Object { revision, .. }
        | WatchEvent::InitialEventsEnd { revision, .. }
        | WatchEvent::Positions { revision, .. }
        | WatchEvent::ResetEnd { revision, .. }
        | WatchEvent::ClusterStatus { revision, .. } => Some(*revision),
        WatchEvent::Reset { .. } | WatchEvent::Bookmark { .. } => None,
    }
}

/// Whether a replica's refusal is the Watch's own (its query, its caller's grants),
/// not a moment of the ring's.
fn permanent(e: &FleetError) -> bool {
    matches!(
        e,
        FleetError::InvalidArgument(_) | FleetError::NotFound(_) | FleetError::PermissionDenied(_)
    )
}
