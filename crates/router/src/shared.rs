//! Routed Watches of one caller and one query read one follower of the replicas: a
//! change reaches the router once, is decoded once, and is handed to each of them
//! (as a single server hands it to its subscribers), where each Watch of its own
//! would have had its own stream from each replica, the same change arriving, and
//! decoded, once per Watch.
//!
//! The follower (a [`Routed`] Watch from now, on its own task, started once a second
//! Watch of the same caller and query is open) writes what it takes into a log of the
//! last [`HELD`] events, with each cluster's position before the first and after the
//! last. A Watch reads the log from where it joined, and takes from it only what it
//! has not had: by member position, an object event at or before the position it
//! stands at in that cluster is one it had already. A Watch joins from now at once;
//! from a position token, when the log reaches back to every position it holds; with
//! its initial objects, it follows the replicas on its own until they are sent and it
//! stands still, then joins where the log holds its positions. A Watch that falls
//! behind the log (a subscriber that does not read) follows the replicas on its own
//! again from where it stands: it never holds the others back, and misses nothing.
//! A Watch alone of its kind follows the replicas on its own, as it would through a
//! follower, with no stream more.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use fleetscope_model::fleet::{ClusterFreshness, Freshness, WatchEvent, WatchRequest};
use fleetscope_model::{ClusterName, FleetError, Revision};
use tokio::sync::watch as signal;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::Router;
use super::watch::{Routed, TICK, resume_positions, token};

/// How many events the log holds: a Watch further behind follows the replicas on
/// its own.
const HELD: usize = 4096;

/// How many events a Watch takes from the log at once.
const READ_AT_ONCE: usize = 256;

/// How often a Watch following the replicas on its own looks for a place in the log,
/// at most.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// The Watches of each caller and query, while any is open.
#[derive(Default)]
pub(super) struct Followers(Mutex<HashMap<Key, Weak<Interest>>>);

/// What every open Watch of one caller and query holds: their follower, while one
/// of them reads it. A follower is started only for two Watches or more: a Watch
/// alone follows the replicas on its own, as it would through its follower.
struct Interest {
    follower: Mutex<Weak<Member>>,
}

/// A caller and a query (with its projection and its clusters).
type Key = (String, String);

/// What a follower writes and its readers read.
struct Feed {
    log: Mutex<Log>,
    /// The sequence number the next event will have, sent as it grows.
    grew: signal::Sender<u64>,
}

/// What a Watch reading a follower holds: while any does, the follower runs.
struct Member {
    feed: Arc<Feed>,
    _stop: DropGuard,
}

/// The last events a follower took.
#[derive(Default)]
struct Log {
    /// The sequence number of the first event held.
    start: u64,
    events: VecDeque<WatchEvent>,
    /// Each cluster's position before the first event held (or the first it had,
    /// when the log began with the cluster nowhere).
    base: BTreeMap<String, Arc<str>>,
    /// Each cluster's position after the last.
    head: BTreeMap<String, Arc<str>>,
    /// The clusters said followed from no replica, after the last.
    unserved: BTreeMap<String, (ClusterFreshness, Revision)>,
    /// How many `RESET`s of each cluster the log holds.
    resets: HashMap<String, usize>,
    /// Set when the follower ended: with the error it ended with.
    end: Option<Option<FleetError>>,
}

impl Log {
    /// The sequence number the next event will have.
    fn next(&self) -> u64 {
        self.start + self.events.len() as u64
    }

    /// Takes `e` (and lets the oldest go past [`HELD`]).
    fn push(&mut self, e: WatchEvent) {
        // A cluster's first position: the log reaches back to it.
        let mut first = BTreeMap::new();
        moved(&mut first, &e);
        for (cluster, position) in first {
            self.base.entry(cluster).or_insert(position);
        }
        moved(&mut self.head, &e);
        match &e {
            WatchEvent::ClusterStatus { cluster, revision } => {
                if cluster.freshness == Freshness::Synced {
                    self.unserved.remove(cluster.cluster.as_str());
                } else {
                    self.unserved
                        .insert(cluster.cluster.to_string(), (cluster.clone(), *revision));
                }
            }
            WatchEvent::Reset { cluster } => {
                *self.resets.entry(cluster.to_string()).or_default() += 1;
            }
            _ => {}
        }
        self.events.push_back(e);
        while self.events.len() > HELD {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.start += 1;
            moved(&mut self.base, &old);
            if let WatchEvent::Reset { cluster } = &old
                && let Some(n) = self.resets.get_mut(cluster.as_str())
            {
                *n -= 1;
                if *n == 0 {
                    self.resets.remove(cluster.as_str());
                }
            }
        }
    }

    /// Where a Watch standing at `at` (cluster: member position) reads from, if the
    /// log can carry it: every cluster the log follows has a position in `at`, and
    /// each is the log's own, ahead of it (what the log holds up to it is skipped),
    /// or behind it within the log's reach with no `RESET` of it in between. `None`
    /// when the Watch must follow the replicas on its own for now.
    fn place(&self, at: &BTreeMap<String, Arc<str>>) -> Option<u64> {
        if self.end.is_some() {
            return None;
        }
        let mut from = self.next();
        for (cluster, head) in &self.head {
            let mine = at.get(cluster)?;
            if mine == head {
                continue;
            }
            let (mine, head) = (number(mine)?, number(head)?);
            if mine > head {
                continue;
            }
            let base = self.base.get(cluster).and_then(|b| number(b))?;
            if base > mine || self.resets.contains_key(cluster) {
                return None;
            }
            from = self.start;
        }
        // A cluster the Watch stands in that the log has no position of: not yet.
        if at.keys().any(|c| !self.head.contains_key(c)) {
            return None;
        }
        Some(from)
    }
}

/// How `e` moves a cluster's position in `positions` (as a routed Watch's own do).
fn moved(positions: &mut BTreeMap<String, Arc<str>>, e: &WatchEvent) {
    match e {
        WatchEvent::Object {
            object,
            position: Some(p),
            ..
        } => {
            positions.insert(object.key.cluster.to_string(), p.clone());
        }
        WatchEvent::Reset { cluster } => {
            positions.insert(cluster.to_string(), Arc::from(""));
        }
        WatchEvent::ResetEnd {
            cluster, position, ..
        } => {
            positions.insert(cluster.to_string(), position.clone());
        }
        WatchEvent::Positions { positions: p, .. } => {
            for (cluster, rv) in p {
                positions.insert(cluster.to_string(), rv.clone());
            }
        }
        _ => {}
    }
}

/// A member position as a number, when it is one (a Kubernetes resourceVersion is).
fn number(position: &str) -> Option<u64> {
    position.parse().ok()
}

/// Whether `position` is past `standing` in one cluster's stream: a number greater,
/// or anything where the Watch stands nowhere yet; text that is not a number is past
/// unless it is the same.
fn past(position: &str, standing: Option<&Arc<str>>) -> bool {
    match standing {
        None => true,
        Some(s) if s.is_empty() => true,
        Some(s) => match (number(position), number(s)) {
            (Some(p), Some(s)) => p > s,
            _ => position != &**s,
        },
    }
}

impl Followers {
    /// What the Watches of `r`'s caller and query hold.
    fn interest(&self, r: &WatchRequest) -> Arc<Interest> {
        let key: Key = (
            r.access.caller(),
            format!(
                "{}|{:?}|{:?}",
                fleetscope_grpc::remote::fingerprint(&r.query, r.projection),
                r.query.clusters.patterns(),
                r.query.clusters.selector(),
            ),
        );
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(interest) = all.get(&key).and_then(Weak::upgrade) {
            return interest;
        }
        all.retain(|_, i| i.strong_count() > 0);
        let interest = Arc::new(Interest {
            follower: Mutex::new(Weak::new()),
        });
        all.insert(key, Arc::downgrade(&interest));
        interest
    }
}

impl Interest {
    /// The follower running now, if any.
    fn running(&self) -> Option<Arc<Member>> {
        let member = self
            .follower
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade()?;
        let ended = member.feed.lock().end.is_some();
        (!ended).then_some(member)
    }

    /// Whether another Watch of this caller and query is open.
    fn shared(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) > 1
    }

    /// The follower running now, started (from now, for `r`) if none runs.
    async fn follower(&self, router: &Router, r: &WatchRequest) -> Result<Arc<Member>, FleetError> {
        if let Some(member) = self.running() {
            return Ok(member);
        }
        let routed = Routed::shared(router.clone(), r).await?;
        // Another Watch started one meanwhile: this one is not needed.
        if let Some(member) = self.running() {
            return Ok(member);
        }
        let (grew, _) = signal::channel(0);
        let feed = Arc::new(Feed {
            log: Mutex::new(Log::default()),
            grew,
        });
        let stop = CancellationToken::new();
        let member = Arc::new(Member {
            feed: feed.clone(),
            _stop: stop.clone().drop_guard(),
        });
        *self.follower.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&member);
        tokio::spawn(follow(routed, feed, stop));
        Ok(member)
    }
}

impl Feed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs a follower until no Watch reads it, or it ends.
async fn follow(mut routed: Routed, feed: Arc<Feed>, stop: CancellationToken) {
    loop {
        let item = tokio::select! {
            () = stop.cancelled() => return,
            item = routed.next() => item,
        };
        let (next, ended) = {
            let mut log = feed.lock();
            match item {
                Some(Ok(e)) => log.push(e),
                Some(Err(e)) => log.end = Some(Some(e)),
                None => log.end = Some(None),
            }
            (log.next(), log.end.is_some())
        };
        feed.grew.send_replace(next);
        if ended {
            return;
        }
    }
}

/// A routed Watch: reading its caller's and query's follower, or following the
/// replicas on its own until it can.
pub(super) struct Shared {
    router: Router,
    request: WatchRequest,
    fingerprint: String,
    interest: Arc<Interest>,
    mode: Mode,
    out: VecDeque<WatchEvent>,
    ended: bool,
}

/// How a routed Watch follows the replicas now.
enum Mode {
    /// On its own; it last looked for a place in the log then.
    Alone(Box<Routed>, Option<Instant>),
    /// Through the follower's log.
    Reading(Reader),
}

/// A Watch reading a follower's log.
struct Reader {
    member: Arc<Member>,
    /// The next event's sequence number.
    next: u64,
    /// Events before this one were the log's when the Watch joined: of those, only
    /// object events past where it stands, and positions, are its.
    joined: u64,
    /// Where it stands in each cluster, as delivered to it.
    positions: BTreeMap<String, Arc<str>>,
    /// Clusters sent anew now (between `RESET` and `RESET_END`).
    resetting: BTreeSet<String>,
    /// Clusters it was told are followed from no replica.
    unserved: BTreeSet<String>,
    /// Its position moved since the last token it was sent.
    dirty: bool,
    grew: signal::Receiver<u64>,
    tick: tokio::time::Interval,
}

impl Reader {
    fn new(
        member: Arc<Member>,
        from: u64,
        joined: u64,
        positions: BTreeMap<String, Arc<str>>,
        unserved: BTreeSet<String>,
    ) -> Self {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let grew = member.feed.grew.subscribe();
        Self {
            member,
            next: from,
            joined,
            dirty: !positions.is_empty(),
            positions,
            resetting: BTreeSet::new(),
            unserved,
            grew,
            tick,
        }
    }

    /// What event `seq` of the log, `e`, is to this Watch; `None` when it had it
    /// already, or it is the follower's own.
    fn admit(&mut self, seq: u64, e: WatchEvent) -> Option<WatchEvent> {
        let before = seq < self.joined;
        match e {
            WatchEvent::Object {
                ref object,
                ref position,
                ..
            } => {
                let cluster = object.key.cluster.as_str();
                if !before && self.resetting.contains(cluster) {
                    return Some(e);
                }
                match position {
                    Some(p) => {
                        if !past(p, self.positions.get(cluster)) {
                            return None;
                        }
                        self.positions.insert(cluster.to_string(), p.clone());
                        self.dirty = true;
                    }
                    None if before => return None,
                    None => {}
                }
                Some(e)
            }
            WatchEvent::Positions { positions, .. } => {
                for (cluster, rv) in positions {
                    if past(&rv, self.positions.get(cluster.as_str())) {
                        self.positions.insert(cluster.to_string(), rv);
                        self.dirty = true;
                    }
                }
                None
            }
            WatchEvent::Bookmark { .. } | WatchEvent::InitialEventsEnd { .. } => None,
            _ if before => None,
            WatchEvent::Reset { ref cluster } => {
                self.resetting.insert(cluster.to_string());
                self.positions.insert(cluster.to_string(), Arc::from(""));
                self.dirty = true;
                Some(e)
            }
            WatchEvent::ResetEnd {
                ref cluster,
                ref position,
                ..
            } => {
                self.resetting.remove(cluster.as_str());
                self.positions.insert(cluster.to_string(), position.clone());
                self.dirty = true;
                Some(e)
            }
            WatchEvent::ClusterStatus { ref cluster, .. } => {
                if cluster.freshness == Freshness::Synced {
                    self.unserved.remove(cluster.cluster.as_str());
                } else {
                    self.unserved.insert(cluster.cluster.to_string());
                }
                Some(e)
            }
        }
    }
}

/// The `CLUSTER_STATUS` events that take a Watch told `told` are unserved to what
/// the log says now.
fn unserved_now(log: &Log, told: &BTreeSet<String>) -> Vec<WatchEvent> {
    let mut events: Vec<WatchEvent> = log
        .unserved
        .iter()
        .filter(|(c, _)| !told.contains(*c))
        .map(|(_, (freshness, revision))| WatchEvent::ClusterStatus {
            cluster: freshness.clone(),
            revision: *revision,
        })
        .collect();
    events.extend(
        told.iter()
            .filter(|c| !log.unserved.contains_key(*c))
            .map(|c| WatchEvent::ClusterStatus {
                cluster: ClusterFreshness {
                    cluster: ClusterName::from(c.as_str()),
                    freshness: Freshness::Synced,
                    stale_since: None,
                    message: "served again".to_string(),
                },
                revision: Revision(0),
            }),
    );
    events
}

/// A Watch standing at `at` (told `told` are unserved) reading `member`'s log, if
/// the log can carry it; with the statuses that take it to the log's.
fn place(
    member: &Arc<Member>,
    at: &BTreeMap<String, Arc<str>>,
    told: &BTreeSet<String>,
) -> Option<(Reader, Vec<WatchEvent>)> {
    let log = member.feed.lock();
    let from = if at.is_empty() {
        log.next()
    } else {
        log.place(at)?
    };
    let statuses = unserved_now(&log, told);
    let unserved = log.unserved.keys().cloned().collect();
    let next = log.next();
    drop(log);
    let reader = Reader::new(member.clone(), from, next, at.clone(), unserved);
    Some((reader, statuses))
}

impl Shared {
    /// Opens a routed Watch of `r`: through its caller's and query's follower when
    /// another of theirs is open (from now at once, from a position token when the
    /// follower's log reaches it), on its own otherwise and until it can.
    pub(super) async fn start(router: Router, r: WatchRequest) -> Result<Self, FleetError> {
        let interest = router.followers.interest(&r);
        let fingerprint = fleetscope_grpc::remote::fingerprint(&r.query, r.projection);
        let mut request = r.clone();
        request.resume = None;
        request.initial = false;
        let mut out = VecDeque::new();
        let mode = match (&r.resume, r.initial) {
            (None, false) if interest.shared() => {
                let member = interest.follower(&router, &request).await?;
                let at = member.feed.lock().head.clone();
                match place(&member, &at, &BTreeSet::new()) {
                    Some((reader, statuses)) => {
                        out.extend(statuses);
                        // A Watch from now stands where it joined: its first token
                        // holds that.
                        Mode::Reading(reader)
                    }
                    None => Mode::Alone(Box::new(Routed::start(router.clone(), &r).await?), None),
                }
            }
            (Some(resume), _) => {
                let positions = resume_positions(&router, &r.access, &fingerprint, resume)?;
                let joined = interest
                    .running()
                    .and_then(|member| place(&member, &positions, &BTreeSet::new()));
                match joined {
                    Some((mut reader, statuses)) => {
                        out.extend(statuses);
                        reader.dirty = false;
                        Mode::Reading(reader)
                    }
                    None => Mode::Alone(
                        Box::new(Routed::resumed(router.clone(), &r, positions).await?),
                        None,
                    ),
                }
            }
            _ => Mode::Alone(Box::new(Routed::start(router.clone(), &r).await?), None),
        };
        Ok(Self {
            router,
            request,
            fingerprint,
            interest,
            mode,
            out,
            ended: false,
        })
    }

    /// Joins the follower's log, when another Watch of the same caller and query is
    /// open and this one, following the replicas on its own, stands where the log
    /// can carry it (the follower started if none runs).
    async fn join(&mut self) {
        let Mode::Alone(routed, looked) = &mut self.mode else {
            return;
        };
        if !routed.quiet()
            || looked.is_some_and(|at| at.elapsed() < LOOK_EVERY)
            || !self.interest.shared()
        {
            return;
        }
        *looked = Some(Instant::now());
        let member = match self.interest.follower(&self.router, &self.request).await {
            Ok(member) => member,
            Err(e) => {
                tracing::debug!(error = %e, "a routed Watch could not start its query's follower: following the replicas on its own");
                return;
            }
        };
        let Some((mut reader, statuses)) =
            place(&member, routed.positions(), routed.told_unserved())
        else {
            return;
        };
        // The token it was sent last holds these positions already.
        reader.dirty = false;
        self.out.extend(statuses);
        tracing::debug!(
            "a routed Watch following the replicas on its own joins its query's follower"
        );
        self.mode = Mode::Reading(reader);
    }

    /// Reads what the log holds for this Watch; `false` when it has nothing new.
    /// A Watch the log has let go past follows the replicas on its own again.
    async fn read(&mut self) -> Result<bool, FleetError> {
        let Mode::Reading(reader) = &mut self.mode else {
            return Ok(false);
        };
        let taken: Option<Vec<WatchEvent>> = {
            let log = reader.member.feed.lock();
            match reader.next.checked_sub(log.start) {
                None => None,
                Some(skip) => {
                    let skip = usize::try_from(skip).unwrap_or(usize::MAX);
                    let taken: Vec<WatchEvent> = log
                        .events
                        .iter()
                        .skip(skip)
                        .take(READ_AT_ONCE)
                        .cloned()
                        .collect();
                    if taken.is_empty()
                        && let Some(end) = &log.end
                    {
                        self.ended = true;
                        return end.clone().map_or(Ok(true), Err);
                    }
                    Some(taken)
                }
            }
        };
        let Some(taken) = taken else {
            let positions = reader.positions.clone();
            tracing::debug!(
                "a routed Watch fell behind its query's follower: following the replicas on its own"
            );
            let routed = Routed::resumed(self.router.clone(), &self.request, positions).await?;
            self.mode = Mode::Alone(Box::new(routed), None);
            return Ok(true);
        };
        if taken.is_empty() {
            return Ok(false);
        }
        for e in taken {
            let seq = reader.next;
            reader.next += 1;
            if let Some(e) = reader.admit(seq, e) {
                self.out.push_back(e);
            }
        }
        Ok(true)
    }

    /// The next event for the subscriber; `None` once the Watch has ended.
    async fn next(&mut self) -> Option<Result<WatchEvent, FleetError>> {
        loop {
            if let Some(e) = self.out.pop_front() {
                return Some(Ok(e));
            }
            if self.ended {
                return None;
            }
            self.join().await;
            let outcome = match &mut self.mode {
                Mode::Alone(routed, _) => match routed.next().await {
                    Some(Ok(e)) => {
                        self.out.push_back(e);
                        Ok(())
                    }
                    Some(Err(e)) => Err(e),
                    None => {
                        self.ended = true;
                        Ok(())
                    }
                },
                Mode::Reading(_) => match self.read().await {
                    Ok(true) => Ok(()),
                    Ok(false) => {
                        self.wait().await;
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = outcome {
                self.ended = true;
                return Some(Err(e));
            }
        }
    }

    /// Waits for the log to grow, or for the time to send the position.
    async fn wait(&mut self) {
        let Mode::Reading(reader) = &mut self.mode else {
            return;
        };
        tokio::select! {
            changed = reader.grew.changed() => {
                if changed.is_err() {
                    self.ended = true;
                }
            }
            _ = reader.tick.tick() => {
                if reader.dirty {
                    reader.dirty = false;
                    self.out.push_back(WatchEvent::Bookmark {
                        token: token(&self.router, &self.request.access, &self.fingerprint, &reader.positions),
                    });
                }
            }
        }
    }

    /// The Watch as a stream.
    pub(super) fn events(
        self,
    ) -> impl futures::Stream<Item = Result<WatchEvent, FleetError>> + Send + 'static {
        futures::stream::unfold(self, |mut s| async move {
            let e = s.next().await?;
            Some((e, s))
        })
    }
}

#[cfg(test)]
mod tests {
    use fleetscope_model::fleet::FleetObject;
    use fleetscope_model::{EventType, ObjectKey};

    use super::*;

    fn object(cluster: &str, name: &str, position: Option<&str>) -> WatchEvent {
        WatchEvent::Object {
            kind: EventType::Modified,
            object: FleetObject {
                key: ObjectKey::new("pods", &ClusterName::from(cluster), "ns", name),
                revision: Revision(1),
                uid: String::new(),
                resource_version: position.unwrap_or_default().to_string(),
                json: "{}".into(),
            },
            revision: Revision(1),
            position: position.map(Arc::from),
        }
    }

    fn positions(at: &[(&str, &str)]) -> BTreeMap<String, Arc<str>> {
        at.iter()
            .map(|(c, p)| ((*c).to_string(), Arc::from(*p)))
            .collect()
    }

    fn moved_to(at: &[(&str, &str)]) -> WatchEvent {
        WatchEvent::Positions {
            positions: at
                .iter()
                .map(|(c, p)| (ClusterName::from(*c), Arc::from(*p)))
                .collect(),
            revision: Revision(1),
        }
    }

    fn names(events: &[WatchEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                WatchEvent::Object { object, .. } => object.key.name.to_string(),
                WatchEvent::Reset { cluster } => format!("reset {cluster}"),
                WatchEvent::ResetEnd { cluster, .. } => format!("reset end {cluster}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// A log of a and b at 10 and 20, then a:11 (x), b:21 (y), a:12 (z).
    fn log() -> Log {
        let mut log = Log::default();
        log.push(moved_to(&[("a", "10"), ("b", "20")]));
        log.push(object("a", "x", Some("11")));
        log.push(object("b", "y", Some("21")));
        log.push(object("a", "z", Some("12")));
        log
    }

    /// A Watch standing at `at` reading from `from`, having joined at `joined`.
    fn reader(from: u64, joined: u64, at: &[(&str, &str)]) -> Reader {
        let (grew, _) = signal::channel(0);
        let member = Arc::new(Member {
            feed: Arc::new(Feed {
                log: Mutex::new(Log::default()),
                grew,
            }),
            _stop: CancellationToken::new().drop_guard(),
        });
        Reader::new(member, from, joined, positions(at), BTreeSet::new())
    }

    /// What `reader` takes of `log`, from where it reads.
    fn admitted(log: &Log, reader: &mut Reader) -> Vec<WatchEvent> {
        let from = reader.next;
        log.events
            .iter()
            .skip(usize::try_from(from - log.start).unwrap())
            .cloned()
            .zip(from..)
            .filter_map(|(e, seq)| reader.admit(seq, e))
            .collect()
    }

    /// What a Watch placed at `at` reads of `log`.
    fn read(log: &Log, at: &[(&str, &str)]) -> Option<Vec<WatchEvent>> {
        let from = log.place(&positions(at))?;
        Some(admitted(log, &mut reader(from, log.next(), at)))
    }

    #[tokio::test]
    async fn a_watch_behind_the_log_reads_what_it_has_not_had_and_one_ahead_skips_it() {
        let log = log();
        assert_eq!(log.head, positions(&[("a", "12"), ("b", "21")]));
        // Where the log stands: nothing from before.
        assert_eq!(
            names(&read(&log, &[("a", "12"), ("b", "21")]).unwrap()),
            Vec::<String>::new()
        );
        // Behind in a, where the log stands in b.
        assert_eq!(
            names(&read(&log, &[("a", "11"), ("b", "21")]).unwrap()),
            ["z"]
        );
        // Behind in both, from before the first event.
        assert_eq!(
            names(&read(&log, &[("a", "10"), ("b", "20")]).unwrap()),
            ["x", "y", "z"]
        );
        // Ahead in a (it had z and more): only what follows.
        let mut log = log;
        let from = log.place(&positions(&[("a", "14"), ("b", "21")])).unwrap();
        assert_eq!(from, log.next());
        log.push(object("a", "had", Some("13")));
        log.push(object("a", "new", Some("15")));
        log.push(object("b", "new-b", Some("22")));
        let mut reader = reader(from, from, &[("a", "14"), ("b", "21")]);
        assert_eq!(names(&admitted(&log, &mut reader)), ["new", "new-b"]);
        assert_eq!(reader.positions, positions(&[("a", "15"), ("b", "22")]));
    }

    #[test]
    fn the_log_cannot_carry_a_watch_from_before_its_reach_or_across_a_reset_or_without_a_position()
    {
        let mut log = log();
        // A cluster it stands nowhere in, or the log has no position of.
        assert_eq!(log.place(&positions(&[("a", "12")])), None);
        assert_eq!(
            log.place(&positions(&[("a", "12"), ("b", "21"), ("c", "1")])),
            None
        );
        assert_eq!(log.place(&positions(&[("a", ""), ("b", "21")])), None);
        // Positions that are not numbers: only where the log stands.
        let mut text = Log::default();
        text.push(moved_to(&[("a", "p")]));
        assert_eq!(text.place(&positions(&[("a", "p")])), Some(1));
        assert_eq!(text.place(&positions(&[("a", "q")])), None);
        // Let the first events go: a Watch at a:10 is out of reach.
        for i in 0..HELD {
            log.push(object("b", "fill", Some(&(100 + i).to_string())));
        }
        assert_eq!(log.start, 4);
        assert_eq!(log.base, positions(&[("a", "12"), ("b", "21")]));
        assert_eq!(log.place(&positions(&[("a", "10"), ("b", "21")])), None);
        assert!(
            log.place(&positions(&[("a", "12"), ("b", "150")]))
                .is_some()
        );
        // A reset of b held: behind in b is out of reach; at or ahead of it is not.
        log.push(WatchEvent::Reset {
            cluster: ClusterName::from("b"),
        });
        log.push(WatchEvent::ResetEnd {
            cluster: ClusterName::from("b"),
            position: Arc::from("5000"),
            revision: Revision(1),
        });
        assert_eq!(log.place(&positions(&[("a", "12"), ("b", "150")])), None);
        assert_eq!(
            log.place(&positions(&[("a", "12"), ("b", "5000")])),
            Some(log.next())
        );
        // An ended follower carries no one.
        log.end = Some(None);
        assert_eq!(log.place(&positions(&[("a", "12"), ("b", "5000")])), None);
    }

    #[tokio::test]
    async fn a_reset_after_joining_is_passed_on_whole_and_statuses_follow_the_log() {
        let mut log = log();
        let at = [("a", "12"), ("b", "21")];
        let from = log.place(&positions(&at)).unwrap();
        log.push(WatchEvent::Reset {
            cluster: ClusterName::from("a"),
        });
        log.push(object("a", "current", None));
        log.push(WatchEvent::ResetEnd {
            cluster: ClusterName::from("a"),
            position: Arc::from("9"),
            revision: Revision(1),
        });
        log.push(object("a", "after", Some("10")));
        let mut reader = reader(from, from, &at);
        assert_eq!(
            names(&admitted(&log, &mut reader)),
            ["reset a", "current", "reset end a", "after"]
        );
        // A status the log holds is told to a Watch joining, and taken back.
        log.push(WatchEvent::ClusterStatus {
            cluster: ClusterFreshness {
                cluster: ClusterName::from("b"),
                freshness: Freshness::Stale,
                stale_since: None,
                message: "gone".into(),
            },
            revision: Revision(3),
        });
        assert_eq!(unserved_now(&log, &BTreeSet::new()).len(), 1);
        let told: BTreeSet<String> = ["b".to_string(), "c".to_string()].into();
        let statuses = unserved_now(&log, &told);
        assert_eq!(statuses.len(), 1);
        assert!(matches!(
            &statuses[0],
            WatchEvent::ClusterStatus { cluster, .. }
                if cluster.cluster.as_str() == "c" && cluster.freshness == Freshness::Synced
        ));
    }
}
