//! Where each cluster's stream of a Watch stands, by member position, when the
//! Watch started from positions or reports them (a router's Watch): which changes
//! the subscriber has already, which streams are sent anew, which are carried by
//! their member's history until they meet this replica's ([`super::catchup`]), and
//! which positions moved without a change the subscriber was sent.

use std::collections::HashMap;
use std::sync::Arc;

use fleetscope_index::{Event, Query, State, number};
use fleetscope_informer::history::HistoryEnd;
use fleetscope_model::{ClusterName, FleetError, ResourceType, Revision};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::catchup::{CatchUp, Caught, Histories, Meet};

/// How often a Watch that reports positions looks for positions that moved with no
/// change.
pub(super) const POSITIONS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

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
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Follow {
    /// Deliver it.
    Deliver,
    /// The subscriber has it already.
    Skip,
    /// The cluster left this replica: the stream ends, so that a router follows the
    /// cluster to where it is served.
    Left,
    /// A re-list's change that cannot apply to where the subscriber stands: its
    /// cluster's stream is sent anew instead.
    Reset,
}

/// What a history read told, for the producer to act on.
pub(super) enum Told {
    /// Nothing to send.
    Nothing,
    /// The history cannot carry the stream: it is sent anew.
    Reset,
    /// Changes to send (those the subscriber's filter and grant let through), then
    /// a look at whether the stream meets this replica's (by content, when the
    /// change was a re-list's).
    Changes(Vec<Event>, bool),
}

/// The streams of one Watch that follows member positions.
pub(super) struct Positions {
    /// Report member positions (a router's Watch).
    report: bool,
    /// The Watch started from member positions.
    positioned: bool,
    /// Where each cluster's stream stands.
    streams: HashMap<ClusterName, Tracked>,
    /// Clusters whose stream is sent anew before anything else.
    resets: Vec<ClusterName>,
    /// The query as the start resolved it (with the caller's reach), for sending a
    /// cluster's stream anew.
    whole: Arc<Query>,
    /// Streams carried by their member's history until they meet this replica's.
    catching: HashMap<ClusterName, CatchUp>,
    /// What the history reads tell.
    caught: mpsc::Receiver<(ClusterName, Caught)>,
    /// Every running stream's history reader (to ask a member where it stands).
    histories: Histories,
}

/// Where a Watch that follows positions starts: each stream's start, those sent anew
/// first, and those read from their member's history.
pub(super) struct Starts {
    /// Report member positions.
    pub(super) report: bool,
    /// Streams that continue this replica's log, by cluster: (floor, skip to,
    /// position).
    pub(super) after: Vec<(ClusterName, Revision, Option<u64>, Arc<str>)>,
    /// Streams sent anew.
    pub(super) resets: Vec<ClusterName>,
    /// Streams carried by their member's history.
    pub(super) catching: HashMap<ClusterName, CatchUp>,
    /// What those reads tell.
    pub(super) caught: mpsc::Receiver<(ClusterName, Caught)>,
}

impl Positions {
    /// The streams of a Watch starting at `starts`, sending a stream anew from
    /// `whole`.
    pub(super) fn new(starts: Starts, whole: Query, histories: Histories) -> Self {
        let positioned =
            !starts.after.is_empty() || !starts.resets.is_empty() || !starts.catching.is_empty();
        Self {
            report: starts.report,
            positioned,
            streams: starts
                .after
                .into_iter()
                .map(|(cluster, floor, skip_to, position)| {
                    (cluster, Tracked::at(floor, skip_to, position))
                })
                .collect(),
            resets: starts.resets,
            whole: Arc::new(whole),
            catching: starts.catching,
            caught: starts.caught,
            histories,
        }
    }

    /// Whether the Watch reports positions (a router's).
    pub(super) fn reports(&self) -> bool {
        self.report
    }

    /// Whether positions are followed: the Watch started from them or reports them.
    pub(super) fn follows(&self) -> bool {
        self.report || self.positioned
    }

    /// Whether the Watch started from positions.
    pub(super) fn positioned(&self) -> bool {
        self.positioned
    }

    /// Whether streams are being carried by their member's history.
    pub(super) fn catching_up(&self) -> bool {
        !self.catching.is_empty()
    }

    /// The clusters whose stream is sent anew before anything else.
    pub(super) fn take_resets(&mut self) -> Vec<ClusterName> {
        std::mem::take(&mut self.resets)
    }

    /// The query as the start resolved it (with the caller's reach).
    pub(super) fn whole(&self) -> &Query {
        &self.whole
    }

    /// The query that sends `cluster`'s stream anew.
    pub(super) fn reset_query(&self, cluster: &ClusterName) -> Query {
        let mut query = (*self.whole).clone();
        query.clusters = Some(vec![cluster.clone()]);
        query
    }

    /// Follows, from `snapshot` (where the Watch starts), every stream it holds of
    /// `resource` that `selects` lets through.
    pub(super) fn track_from(
        &mut self,
        snapshot: &State,
        resource: &str,
        mut selects: impl FnMut(&ClusterName) -> bool,
    ) {
        for (cluster, position) in snapshot.positions_of(resource) {
            if selects(cluster) {
                let tracked = Tracked::at(snapshot.revision(), None, position.clone());
                self.streams.insert(cluster.clone(), tracked);
            }
        }
    }

    /// `cluster`'s stream, sent anew from `snapshot`, now stands where the snapshot
    /// has it: the position the subscriber is told.
    pub(super) fn restarted(
        &mut self,
        cluster: &ClusterName,
        snapshot: &State,
        resource: &str,
    ) -> Arc<str> {
        let position = snapshot
            .position(resource, cluster)
            .cloned()
            .unwrap_or_else(|| Arc::from(""));
        let tracked = Tracked::at(snapshot.revision(), None, position.clone());
        self.streams.insert(cluster.clone(), tracked);
        position
    }

    /// What a change of a cluster the filter selects means to the subscriber:
    /// skipped when its stream has it already; a re-list's change that cannot apply
    /// to where the subscriber stands sends the stream anew instead.
    pub(super) fn follow(&mut self, e: &Event) -> Follow {
        let cluster = &e.object.key.cluster;
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
            // cluster, and this stream is no longer its source. Were it to go on,
            // the cluster taken up here again would come as a list of no position.
            return Follow::Left;
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
                None => return Follow::Reset,
            }
        }
        t.position = e.position.clone().unwrap_or_else(|| Arc::from(""));
        Follow::Deliver
    }

    /// The subscriber was sent a change of `cluster`, with its position.
    pub(super) fn told(&mut self, cluster: &ClusterName) {
        if let Some(t) = self.streams.get_mut(cluster) {
            t.told = t.position.clone();
        }
    }

    /// Every followed stream and where it stands.
    pub(super) fn all(&self) -> Vec<(ClusterName, Arc<str>)> {
        let mut positions: Vec<(ClusterName, Arc<str>)> = self
            .streams
            .iter()
            .map(|(c, t)| (c.clone(), t.position.clone()))
            .collect();
        positions.sort();
        positions
    }

    /// The followed streams whose position moved since the subscriber was last
    /// told: by changes it was not sent (its filter or grant excludes them), or with
    /// no change at all (the member's bookmarks, once `snapshot` stands where the
    /// subscriber does, at `reached`, so every change before them was sent).
    pub(super) fn moved(
        &mut self,
        snapshot: &State,
        reached: Revision,
        resource: &str,
    ) -> Vec<(ClusterName, Arc<str>)> {
        let caught_up = snapshot.revision() == reached;
        let mut moved = Vec::new();
        for (cluster, t) in &mut self.streams {
            if caught_up
                && let Some(now) = snapshot.position(resource, cluster)
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
        moved.sort();
        moved
    }

    /// What the history reads tell next.
    pub(super) async fn next_caught(&mut self) -> Option<(ClusterName, Caught)> {
        self.caught.recv().await
    }

    /// Takes what a history read tells about `cluster`'s stream, at `reached`.
    pub(super) fn caught(
        &mut self,
        cluster: &ClusterName,
        caught: Caught,
        reached: Revision,
        resource: &str,
    ) -> Told {
        let Some(c) = self.catching.get_mut(cluster) else {
            return Told::Nothing;
        };
        match caught {
            Caught::End(end) => {
                self.catching.remove(cluster);
                if end == HistoryEnd::Cancelled {
                    return Told::Nothing;
                }
                tracing::info!(%cluster, %resource, end = ?end, "the member's history cannot carry a Watch from its position (compacted, or not read): its stream is sent anew");
                Told::Reset
            }
            Caught::Update(update) => {
                let by_content = !update.is_change();
                Told::Changes(c.apply(update, reached), by_content)
            }
        }
    }

    /// Looks again whether each stream carried by its history meets this replica's
    /// (see [`CatchUp::meets`]).
    pub(super) fn meet_all(&mut self, snapshot: &State, reached: Revision, resource: &str) {
        let clusters: Vec<ClusterName> = self.catching.keys().cloned().collect();
        for cluster in clusters {
            self.meet(&cluster, snapshot, reached, true, resource);
        }
    }

    /// Hands `cluster`'s stream over from its history to this replica's, if they
    /// meet (see [`CatchUp::meets`]).
    pub(super) fn meet(
        &mut self,
        cluster: &ClusterName,
        snapshot: &State,
        reached: Revision,
        by_content: bool,
        resource: &str,
    ) {
        let Some(c) = self.catching.get(cluster) else {
            return;
        };
        match c.meets(snapshot, reached, resource, cluster, by_content) {
            Meet::Apart => {}
            Meet::After {
                floor,
                skip_to,
                position,
            } => {
                tracing::debug!(%cluster, %resource, %position, "a Watch's stream read from history met this replica's");
                let told = c.position().clone();
                self.catching.remove(cluster);
                let mut t = Tracked::at(floor, skip_to, position);
                t.told = told;
                self.streams.insert(cluster.clone(), t);
            }
        }
    }

    /// Checks each stream whose subscriber stands ahead of this replica against its
    /// member: a position past the member's newest resourceVersion is none the
    /// member can have given (a client's mistake or forgery, which would mute the
    /// cluster), and is the error the Watch ends with. A member that cannot be asked
    /// leaves the position as it is.
    pub(super) async fn beyond_members(
        &self,
        resource: &ResourceType,
        cancel: &CancellationToken,
    ) -> Option<FleetError> {
        let ahead: Vec<(ClusterName, u64)> = self
            .streams
            .iter()
            .filter_map(|(c, t)| Some((c.clone(), t.skip_to?)))
            .collect();
        for (cluster, position) in ahead {
            let Some(history) = self.histories.of(&cluster, &resource.name()) else {
                continue;
            };
            let newest = history.newest(cancel.child_token()).await;
            if let Ok(newest) = newest
                && let Some(n) = number(&newest)
                && position > n
            {
                return Some(FleetError::InvalidArgument(format!(
                    "position {position} of cluster {cluster} ({}) is past its API server's newest resourceVersion {n}: not a position it has given",
                    resource.name()
                )));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use fleetscope_index::Object;
    use fleetscope_model::{EventType, ObjectKey, ObjectState};

    use super::*;

    /// A change of `name` in cluster `c` at `revision`, of member position `at`.
    fn change(c: &str, name: &str, revision: u64, at: Option<&str>) -> Event {
        let input = ObjectState {
            key: ObjectKey::new("pods", &ClusterName::from(c), "ns", name),
            json: format!(r#"{{"metadata":{{"name":"{name}","namespace":"ns"}}}}"#).into(),
            labels: Vec::new(),
            owners: Vec::new(),
            fields: Vec::new(),
        };
        let object = Object::detached(input, Revision(revision));
        let mut e = Event::new(Revision(revision), EventType::Modified, object, None);
        e.position = at.map(Arc::from);
        e
    }

    /// Streams starting after `floor` (skipping to `skip_to`) in each of `clusters`.
    fn positions(report: bool, clusters: &[(&str, u64, Option<u64>, &str)]) -> Positions {
        let (_, caught) = mpsc::channel(1);
        let starts = Starts {
            report,
            after: clusters
                .iter()
                .map(|(c, floor, skip_to, at)| {
                    (
                        ClusterName::from(*c),
                        Revision(*floor),
                        *skip_to,
                        Arc::from(*at),
                    )
                })
                .collect(),
            resets: Vec::new(),
            catching: HashMap::new(),
            caught,
        };
        Positions::new(starts, Query::default(), Histories::default())
    }

    #[test]
    fn a_change_the_subscriber_has_is_skipped_and_a_later_one_moves_its_stream() {
        let mut p = positions(true, &[("a", 10, None, "100")]);
        assert!(p.follows() && p.positioned());
        assert_eq!(p.follow(&change("a", "x", 10, Some("100"))), Follow::Skip);
        assert_eq!(
            p.follow(&change("a", "x", 11, Some("101"))),
            Follow::Deliver
        );
        assert_eq!(p.all(), [(ClusterName::from("a"), Arc::from("101"))]);
        // Not yet told: the move is reported once, then not again.
        let snapshot = State::default();
        let moved = p.moved(&snapshot, Revision(11), "pods");
        assert_eq!(moved, [(ClusterName::from("a"), Arc::from("101"))]);
        assert!(p.moved(&snapshot, Revision(11), "pods").is_empty());
        p.told(&ClusterName::from("a"));
    }

    #[test]
    fn a_subscriber_ahead_skips_to_its_position_and_a_change_of_no_position_resets() {
        let mut p = positions(true, &[("a", 10, Some(105), "105")]);
        assert_eq!(p.follow(&change("a", "x", 11, Some("104"))), Follow::Skip);
        assert_eq!(p.follow(&change("a", "x", 12, Some("105"))), Follow::Skip);
        // A re-list's change cannot apply to where the subscriber stands.
        assert_eq!(p.follow(&change("a", "x", 13, None)), Follow::Reset);
        let mut p = positions(true, &[("a", 10, Some(105), "105")]);
        assert_eq!(
            p.follow(&change("a", "x", 11, Some("106"))),
            Follow::Deliver
        );
        assert_eq!(p.follow(&change("a", "y", 12, None)), Follow::Deliver);
    }

    #[test]
    fn a_cluster_leaving_ends_a_reporting_watch_and_a_new_one_is_followed_from_its_first_change() {
        let mut p = positions(true, &[("a", 10, None, "100")]);
        let mut gone = change("a", "x", 11, None);
        gone.cluster_removed = true;
        assert_eq!(p.follow(&gone), Follow::Left);
        assert_eq!(p.follow(&change("b", "y", 12, Some("7"))), Follow::Deliver);
        assert_eq!(
            p.all(),
            [
                (ClusterName::from("a"), Arc::from("100")),
                (ClusterName::from("b"), Arc::from("7"))
            ]
        );
        // A Watch that only started from positions goes on past a cluster leaving.
        let mut p = positions(false, &[("a", 10, None, "100")]);
        assert_eq!(p.follow(&gone), Follow::Deliver);
    }
}
