//! A List through a router: the first page asks every replica that holds a selected
//! cluster, and each later page asks only those whose objects come next, continuing
//! each replica's snapshot by the replica page token the router's own page token
//! carries; a replica left unasked for a while is asked for one object so that it
//! keeps its snapshot until the list reaches its clusters.

use std::collections::BTreeMap;

use fleetscope_model::fleet::{ClusterFreshness, FleetObject, ListAnswer, ListRequest, reason};
use fleetscope_model::{Fleet as _, FleetError, ObjectKey, Revision};

use fleetscope_ring::lease::Member;

use super::{Router, prefetch};

/// Where a routed list continues: for each replica drawn on, the snapshot it listed
/// from and the clusters it was asked for.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Positions {
    /// replica identity, its snapshot's revision, its clusters.
    s: Vec<(String, u64, Vec<String>)>,
    /// For each of `s`, how many of its matches follow the page returned, so that
    /// the replica's next page need not count them again (absent in a token of an
    /// earlier version: the replica then counts).
    #[serde(default)]
    r: Vec<u64>,
    /// For each of `s`, when the router last asked it for this list (seconds since
    /// the epoch): a replica keeps a list's snapshot for a while after its last use
    /// only, so one not asked for a while (its clusters come later in the list) is
    /// asked again before it lets the snapshot go.
    #[serde(default)]
    t: Vec<u64>,
}

/// How long a routed list may leave a replica unasked before it asks it again, to
/// keep its snapshot: well under the replicas' five minutes.
pub(super) const KEEP_SNAPSHOT_EVERY: u64 = 60;

/// Seconds since the epoch, now.
pub(super) fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The replicas of a routed list (by index) to ask again so they keep its snapshot:
/// those with something still to give, not asked since `KEEP_SNAPSHOT_EVERY` before
/// `now` (or never, by a token of an earlier version).
pub(super) fn to_keep(positions: &Positions, now: u64) -> Vec<usize> {
    (0..positions.s.len())
        .filter(|&i| positions.r.get(i).is_some_and(|r| *r > 0))
        .filter(|&i| {
            positions
                .t
                .get(i)
                .is_none_or(|t| now.saturating_sub(*t) >= KEEP_SNAPSHOT_EVERY)
        })
        .collect()
}

impl Router {
    /// A routed list's first page: every replica serving a selected cluster (or its
    /// next holder when that one cannot answer: killed, before its Lease expires)
    /// lists a page from a snapshot of its own, kept for the pages after; the page is
    /// the merge's first `limit`, and each replica's position remembers how many of
    /// its matches follow it.
    pub(super) async fn first_list_page(&self, r: ListRequest) -> Result<ListAnswer, FleetError> {
        let view = self.view()?;
        let serving = view.serving();
        let limit = r.limit.max(1);
        let (pages, unreached) = self
            .spread(&view, &r.query.clusters, |member, clusters| {
                let request = first_page(&r, &clusters, limit);
                self.page_of(member, clusters, request)
            })
            .await?;
        // The clusters selected that no page comes from: drawn on, and missing.
        let mut missing = self.missing(&r.query.clusters, &serving, unreached);
        let mut items: Vec<(usize, FleetObject)> = Vec::new();
        let mut clusters = Vec::new();
        let mut partial = false;
        let mut positions = Positions {
            s: Vec::new(),
            r: Vec::new(),
            t: Vec::new(),
        };
        for (i, (identity, asked, page)) in pages.into_iter().enumerate() {
            positions.t.push(now_seconds());
            missing.extend(Self::silent(
                &identity,
                &asked,
                page.clusters.iter().map(|c| c.cluster.as_str()),
            ));
            positions.r.push(page.remaining);
            partial |= page.partial;
            clusters.extend(page.clusters);
            positions.s.push((identity, page.revision.0, asked));
            items.extend(page.items.into_iter().map(|o| (i, o)));
        }
        partial |= !missing.is_empty();
        clusters.extend(missing);
        items.sort_by(|a, b| a.1.key.cmp(&b.1.key));
        let taken = fits(items.iter().map(|(_, o)| o), limit, r.max_bytes);
        // What each replica gave beyond the page follows it there too.
        for (i, _) in items.drain(taken..) {
            positions.r[i] += 1;
        }
        let items: Vec<FleetObject> = items.into_iter().map(|(_, o)| o).collect();
        self.ask_ahead(&view, &positions, &r, items.last());
        Ok(self.routed_page(items, clusters, partial, positions, &r, &serving))
    }

    /// A routed list's next page, from the snapshots its first page took. A cluster's
    /// objects are contiguous in key order and each was listed from one replica, so
    /// the page is read cluster by cluster from the last key on: the replica of the
    /// next clusters is asked for what the page still needs of them, and the next
    /// replica only once those are exhausted; no replica is asked for objects the
    /// page will not hold.
    pub(super) async fn next_list_page(&self, r: ListRequest) -> Result<ListAnswer, FleetError> {
        let view = self.view()?;
        let serving = view.serving();
        let limit = r.limit.max(1);
        let mut positions: Positions = serde_json::from_slice(&r.resume)
            .map_err(|_| FleetError::InvalidArgument("page_token: not a routed list's".into()))?;
        let after = r
            .after
            .as_ref()
            .map(|(_, key)| key.clone())
            .ok_or_else(|| FleetError::InvalidArgument("page_token: no position".into()))?;
        let asked = self.still_held(&view, &positions)?;
        if positions.r.len() != positions.s.len() {
            // A token of an earlier version carries no remainders: each replica counts
            // its own once.
            positions.r = self.remainders(&positions, &asked, &after, &r).await?;
        }
        let runs = runs_from(&positions, &after.cluster);
        let mut items: Vec<FleetObject> = Vec::new();
        let mut clusters = Vec::new();
        let mut partial = false;
        let mut missing = Vec::new();
        let mut bytes = 0;
        for (i, run) in runs {
            if positions.r[i] == 0 {
                continue;
            }
            let (identity, revision, _) = &positions.s[i];
            // What follows in the whole replica: the replica need not count it.
            let request = continued(
                &r,
                (*revision, &run),
                &after,
                limit - items.len(),
                Some(positions.r[i]),
            );
            let (_, _, page) = self
                .page_ahead_or_now(asked[i], run.clone(), request)
                .await?;
            missing.extend(Self::silent(
                identity,
                &run,
                page.clusters.iter().map(|c| c.cluster.as_str()),
            ));
            partial |= page.partial;
            clusters.extend(page.clusters);
            let more_in_run = page.next.is_some();
            let got: Vec<FleetObject> = page.items;
            let mut taken = 0;
            for o in &got {
                let held = items.len() + taken;
                if held >= limit || (held > 0 && bytes + size(o) > r.max_bytes) {
                    break;
                }
                bytes += size(o);
                taken += 1;
            }
            positions.r[i] = positions.r[i].saturating_sub(taken as u64);
            positions.t.resize(positions.s.len(), 0);
            positions.t[i] = now_seconds();
            let cut = taken < got.len();
            items.extend(got.into_iter().take(taken));
            if more_in_run || cut || items.len() >= limit {
                break;
            }
        }
        partial |= !missing.is_empty();
        clusters.extend(missing);
        self.keep_snapshots(&mut positions, &asked, &after, &r)
            .await;
        self.ask_ahead(&view, &positions, &r, items.last());
        Ok(self.routed_page(items, clusters, partial, positions, &r, &serving))
    }

    /// The replicas a routed list drew on, each still holding every cluster it was
    /// asked for: its snapshot is its own, exact only while it does.
    fn still_held<'m>(
        &self,
        view: &'m super::View,
        positions: &Positions,
    ) -> Result<Vec<&'m Member>, FleetError> {
        let members = view.members();
        let holders = view.holders();
        let mut asked = Vec::new();
        for (identity, _, clusters) in &positions.s {
            let holds = |c: &String| {
                holders
                    .get(c)
                    .is_some_and(|hs| hs.iter().any(|m| m.identity == *identity))
            };
            if let Some(c) = clusters.iter().find(|c| !holds(c)) {
                return Err(FleetError::OutOfRange {
                    message: format!(
                        "cluster {c} moved from replica {identity} since this list began, so its snapshot cannot be continued: list again"
                    ),
                    reason: reason::PAGE_SNAPSHOT_RELEASED,
                    oldest: None,
                });
            }
            asked.push(
                members
                    .iter()
                    .find(|m| m.identity == *identity)
                    .ok_or_else(|| self.no_owner(identity))?,
            );
        }
        Ok(asked)
    }

    /// Asks each replica of a routed list not asked for a while for one object, so
    /// that it keeps the list's snapshot until the list reaches its clusters (what it
    /// answers is not needed: a replica that cannot answer fails the list when it is
    /// reached, as it would have anyway).
    pub(super) async fn keep_snapshots(
        &self,
        positions: &mut Positions,
        asked: &[&Member],
        after: &ObjectKey,
        r: &ListRequest,
    ) {
        let now = now_seconds();
        let keep = to_keep(positions, now);
        let calls = keep.iter().map(|&i| {
            let (_, revision, cs) = &positions.s[i];
            let request = continued(r, (*revision, cs), after, 1, Some(positions.r[i]));
            self.page_of(asked[i], cs.clone(), request)
        });
        let answers = futures::future::join_all(calls).await;
        positions.t.resize(positions.s.len(), 0);
        for (&i, answer) in keep.iter().zip(answers) {
            if answer.is_ok() {
                positions.t[i] = now;
            }
        }
    }

    /// How many objects follow `after` in each replica of `positions` (each counts),
    /// for a list continued from a token that carries no remainders.
    pub(super) async fn remainders(
        &self,
        positions: &Positions,
        asked: &[&Member],
        after: &ObjectKey,
        r: &ListRequest,
    ) -> Result<Vec<u64>, FleetError> {
        let calls = positions
            .s
            .iter()
            .zip(asked)
            .map(|((_, revision, cs), member)| {
                let request = continued(r, (*revision, cs), after, 1, None);
                self.page_of(member, cs.clone(), request)
            });
        let pages = futures::future::try_join_all(calls).await?;
        Ok(pages
            .iter()
            .map(|(_, _, p)| p.items.len() as u64 + p.remaining)
            .collect())
    }

    /// A routed list's page: `items`, and the token's positions when more follow.
    pub(super) fn routed_page(
        &self,
        items: Vec<FleetObject>,
        clusters: Vec<ClusterFreshness>,
        partial: bool,
        positions: Positions,
        r: &ListRequest,
        serving: &BTreeMap<String, &Member>,
    ) -> ListAnswer {
        let remaining: u64 = positions.r.iter().sum();
        let next: Option<ObjectKey> = if remaining > 0 {
            items.last().map(|o| o.key.clone())
        } else {
            None
        };
        ListAnswer {
            items,
            next,
            // Every page of the list names the same revision: the newest snapshot.
            revision: Revision(positions.s.iter().map(|p| p.1).max().unwrap_or(0)),
            remaining,
            clusters,
            partial,
            resume: serde_json::to_vec(&positions).unwrap_or_default(),
            warnings: self.unmatched(&r.query.clusters, serving),
        }
    }

    /// `member`'s page for `request`: the one asked ahead, when there is one that
    /// came (one that failed is asked again), or asked now.
    async fn page_ahead_or_now(
        &self,
        member: &Member,
        clusters: Vec<String>,
        request: ListRequest,
    ) -> Result<(String, Vec<String>, ListAnswer), FleetError> {
        if let Some(coming) = self
            .prefetched
            .take(&prefetch::key(&member.identity, &request))
            && let Ok(Ok(page)) = coming.await
        {
            return Ok((member.identity.clone(), clusters, page));
        }
        self.page_of(member, clusters, request).await
    }

    /// Asks ahead, when more follow the page ending with `last`, for what the next
    /// page will ask a replica first: the objects after `last` of the clusters
    /// listed next from one replica, as many as a page holds.
    fn ask_ahead(
        &self,
        view: &super::View,
        positions: &Positions,
        r: &ListRequest,
        last: Option<&FleetObject>,
    ) {
        let Some(last) = last else { return };
        let Some((i, run)) = runs_from(positions, &last.key.cluster)
            .into_iter()
            .find(|(i, _)| positions.r.get(*i).is_some_and(|n| *n > 0))
        else {
            return;
        };
        let (identity, revision, _) = &positions.s[i];
        let Some(member) = view
            .members()
            .iter()
            .find(|m| m.identity == *identity)
            .cloned()
        else {
            return;
        };
        let request = continued(
            r,
            (*revision, &run),
            &last.key,
            r.limit.max(1),
            Some(positions.r[i]),
        );
        let (tx, coming) = tokio::sync::oneshot::channel();
        self.prefetched
            .put(prefetch::key(identity, &request), coming);
        let router = self.clone();
        tokio::spawn(async move {
            let page = router.page_of(&member, run, request).await;
            let _ = tx.send(page.map(|(_, _, page)| page));
        });
    }

    /// `member`'s List page for `clusters`, with who answered and what it was asked.
    pub(super) async fn page_of(
        &self,
        member: &Member,
        clusters: Vec<String>,
        request: ListRequest,
    ) -> Result<(String, Vec<String>, ListAnswer), FleetError> {
        let page = self
            .ask(member, |remote| async move { remote.list(request).await })
            .await?;
        Ok((member.identity.clone(), clusters, page))
    }
}

/// A replica's first page of the routed list `r` for `clusters`, its snapshot kept
/// for the pages after it.
pub(super) fn first_page(r: &ListRequest, clusters: &[String], limit: usize) -> ListRequest {
    let mut request = r.clone();
    request.query.clusters = r.query.clusters.only(clusters);
    request.limit = limit;
    request.after = None;
    request.resume = Vec::new();
    request.keep_snapshot = true;
    request
}

/// The request continuing the routed list `r` in one replica's snapshot: the
/// snapshot at `revision` of `clusters`, after `after`, at most `limit` objects, and
/// how many of its matches follow `after` when known (the replica then need not count
/// them); the snapshot kept either way.
pub(super) fn continued(
    r: &ListRequest,
    (revision, clusters): (u64, &[String]),
    after: &ObjectKey,
    limit: usize,
    known: Option<u64>,
) -> ListRequest {
    let mut request = first_page(r, clusters, limit);
    request.after = Some((Revision(revision), after.clone()));
    request.resume = known
        .map(fleetscope_model::fleet::remaining_resume)
        .unwrap_or_default();
    request
}

/// How many of `items`, in order, a page of at most `limit` objects and `max_bytes`
/// holds (at least one, however large, so paging always moves on).
pub(super) fn fits<'a>(
    items: impl Iterator<Item = &'a FleetObject>,
    limit: usize,
    max_bytes: usize,
) -> usize {
    let (mut taken, mut bytes) = (0, 0);
    for o in items {
        if taken >= limit || (taken > 0 && bytes + size(o) > max_bytes) {
            break;
        }
        bytes += size(o);
        taken += 1;
    }
    taken
}

/// The size a page counts for an object: its JSON and its key.
pub(super) fn size(o: &FleetObject) -> usize {
    o.json.len() + o.key.cluster.as_str().len() + o.key.namespace.len() + o.key.name.len()
}

/// The runs of clusters from `from` on, in order, each listed from one replica (by
/// its index in `positions`).
fn runs_from(
    positions: &Positions,
    from: &fleetscope_model::ClusterName,
) -> Vec<(usize, Vec<String>)> {
    let mut order: Vec<(&str, usize)> = positions
        .s
        .iter()
        .enumerate()
        .flat_map(|(i, (_, _, cs))| cs.iter().map(move |c| (c.as_str(), i)))
        .filter(|(c, _)| *c >= from.as_str())
        .collect();
    order.sort_unstable();
    let mut runs: Vec<(usize, Vec<String>)> = Vec::new();
    for (c, i) in order {
        match runs.last_mut() {
            Some((j, cs)) if *j == i => cs.push(c.to_string()),
            _ => runs.push((i, vec![c.to_string()])),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routed_list_asks_again_only_replicas_left_unasked_that_still_have_objects() {
        let positions = Positions {
            s: (0..4).map(|i| (format!("r{i}"), 1, Vec::new())).collect(),
            r: vec![5, 5, 0, 5],
            t: vec![
                1_000,
                1_000 - KEEP_SNAPSHOT_EVERY,
                0,
                1_000 - KEEP_SNAPSHOT_EVERY + 1,
            ],
        };
        // r1 was asked a while ago; r2 has nothing left; r0 and r3 recently.
        assert_eq!(to_keep(&positions, 1_000), vec![1]);
        // A token of an earlier version: every replica with objects left.
        let earlier = Positions {
            t: Vec::new(),
            ..positions
        };
        assert_eq!(to_keep(&earlier, 1_000), vec![0, 1, 3]);
    }
}
