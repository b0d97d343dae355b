//! The ring as a router reads it: the live members and, for each cluster some member
//! holds ready, its holders in the order they serve it. Made once when the Leases
//! change or one of them expires ([`Views`]), not per request: a request reads the
//! holders of its clusters without parsing every Lease or weighing every cluster again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fleetscope_ring::lease::{Member, Observed};
use fleetscope_ring::vocabulary as owner;
use tokio::sync::watch;
use tokio::time::Instant;

/// The ring at one moment.
#[derive(Debug, Default)]
pub struct View {
    members: Vec<Member>,
    /// Each cluster some member holds ready, with its holders (indexes into
    /// `members`) in the order they serve it.
    holders: BTreeMap<String, Vec<usize>>,
}

impl View {
    /// The view of the live `members`: each cluster's ready holders, those not
    /// leaving first, each group by rendezvous weight (so every router orders them
    /// alike). The first serves; the next take a request the first cannot answer.
    pub fn new(members: Vec<Member>) -> Self {
        let mut ready: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, m) in members.iter().enumerate() {
            for c in owner::ready_of(m) {
                ready.entry(c).or_default().push(i);
            }
        }
        let holders = ready
            .into_iter()
            .map(|(cluster, holders)| {
                let ids: Vec<String> = holders
                    .iter()
                    .map(|&i| members[i].identity.clone())
                    .collect();
                let ranked = fleetscope_ring::assign::owners(cluster, &ids, ids.len());
                let mut ordered: Vec<usize> = ranked
                    .iter()
                    .filter_map(|id| {
                        holders
                            .iter()
                            .copied()
                            .find(|&i| members[i].identity == *id)
                    })
                    .collect();
                // Stable: the rendezvous order within each group.
                ordered.sort_by_key(|&i| owner::leaving(&members[i]));
                (cluster.to_string(), ordered)
            })
            .collect();
        Self { members, holders }
    }

    /// The live members, by identity.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Each cluster's ready holders, in the order they serve it.
    pub fn holders(&self) -> BTreeMap<String, Vec<&Member>> {
        self.holders
            .iter()
            .map(|(c, hs)| (c.clone(), hs.iter().map(|&i| &self.members[i]).collect()))
            .collect()
    }

    /// `cluster`'s ready holders, in the order they serve it (none: nobody serves it).
    pub fn holders_of(&self, cluster: &str) -> Vec<&Member> {
        self.holders
            .get(cluster)
            .into_iter()
            .flatten()
            .map(|&i| &self.members[i])
            .collect()
    }

    /// The replica serving each cluster some member holds ready.
    pub fn serving(&self) -> BTreeMap<String, &Member> {
        self.holders
            .iter()
            .filter_map(|(c, hs)| Some((c.clone(), &self.members[*hs.first()?])))
            .collect()
    }
}

/// The last [`View`] made from a ring's Leases, made anew when they change or the
/// first Lease alive in it expires.
pub struct Views {
    last: Mutex<(watch::Receiver<Observed>, Option<Kept>)>,
}

/// A view, and until when it holds (`None`: until the Leases change).
type Kept = (Arc<View>, Option<Instant>);

impl Views {
    /// Views of the Leases `observed` follows.
    pub fn new(observed: watch::Receiver<Observed>) -> Self {
        Self {
            last: Mutex::new((observed, None)),
        }
    }

    /// The view at `now`, when `ready` accepts the Leases as they are (otherwise its
    /// error, and nothing kept).
    pub fn at<E>(
        &self,
        now: Instant,
        ready: impl FnOnce(&Observed) -> Result<(), E>,
    ) -> Result<Arc<View>, E> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let (observed, kept) = &mut *last;
        // A sender gone reads as changed: the view is made from what it left.
        let changed = observed.has_changed().unwrap_or(true);
        if let Some((view, until)) = kept.as_ref()
            && !changed
            && until.is_none_or(|u| now < u)
        {
            return Ok(view.clone());
        }
        let leases = observed.borrow_and_update();
        if let Err(e) = ready(&leases) {
            *kept = None;
            return Err(e);
        }
        let view = Arc::new(View::new(leases.alive(now)));
        let until = leases.alive_until(now);
        drop(leases);
        *kept = Some((view.clone(), until));
        Ok(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(identity: &str, ready: &[&str]) -> Member {
        Member {
            identity: identity.into(),
            annotations: BTreeMap::from([(owner::READY.to_string(), ready.join(","))]),
        }
    }

    #[test]
    fn each_cluster_s_holders_are_ranked_once_the_same_as_asked_one_by_one() {
        let view = View::new(vec![
            member("a", &["c1", "c2"]),
            member("b", &["c2", "c3"]),
            member("c", &["c1", "c2", "c3"]),
        ]);
        let all = view.holders();
        assert_eq!(all.len(), 3);
        for (cluster, holders) in &all {
            let one: Vec<&str> = view
                .holders_of(cluster)
                .iter()
                .map(|m| m.identity.as_str())
                .collect();
            let ids: Vec<&str> = holders.iter().map(|m| m.identity.as_str()).collect();
            assert_eq!(one, ids);
            assert_eq!(view.serving()[cluster].identity, ids[0]);
        }
        assert_eq!(all["c2"].len(), 3);
        assert!(view.holders_of("c4").is_empty());
    }
}
