//! `fleetscope router`: the whole fleet served from a ring of replicas, through the
//! same API. The router is another implementation of the [`Fleet`] seam: it follows
//! the ring's Leases (each replica publishes its address and the clusters it holds
//! ready), keeps one channel per replica, and answers each request from the replicas
//! serving the clusters it selects: `Get` from the cluster's replica, `List` scattered
//! and merged in key order (its page token carries each replica's snapshot and the
//! clusters it was asked for), `Count` summed, `ListClusters` and `ListResourceTypes`
//! merged with each cluster's owners. The caller's identity is passed to the replicas
//! (`x-remote-user`, `x-remote-group`), which authorize as they do for any caller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fleetscope_model::fleet::{
    ClusterFreshness, ClusterInfo, ClustersAnswer, CountAnswer, CountRequest, Fleet, Freshness,
    GetAnswer, GetRequest, ListAnswer, ListRequest, ResourceTypeInfo, Store, Watch, WatchRequest,
    reason,
};
use fleetscope_model::{Access, ClusterFilter, FleetError, Revision};
use tokio::time::Instant;

use fleetscope_grpc::remote::{Remote, Replica, Speaking};
use fleetscope_grpc::token::TokenKey;
use fleetscope_ring::lease::{Member, Observed};
use fleetscope_ring::vocabulary as owner;

mod list;
mod pool;
mod prefetch;
mod shared;
pub mod stats;
mod view;
mod watch;

use view::{View, Views};

/// How the router reaches the replicas.
#[derive(Clone)]
pub struct Upstream {
    /// TLS to the replicas (their CA, and the router's own client certificate, by
    /// which the replicas know it as a router); `None` for plaintext.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// Whether the router passes its callers' identities (it presents a client
    /// certificate the replicas name with `--router-name`).
    pub passes_identity: bool,
    /// The key the ring's replicas sign page tokens with, so that the router can
    /// continue a replica's snapshot from any key.
    pub page_token_key: TokenKey,
    /// How long a call to a replica may take.
    pub timeout: std::time::Duration,
}

/// A fleet served by the replicas of one ring.
#[derive(Clone)]
pub struct Router {
    ring: String,
    observed: tokio::sync::watch::Receiver<Observed>,
    upstream: Upstream,
    connections: Arc<pool::Pools>,
    stats: Arc<stats::Stats>,
    views: Arc<Views>,
    followers: Arc<shared::Followers>,
    prefetched: Arc<prefetch::Prefetched>,
}

impl Router {
    /// A router over the ring `ring`, whose Leases `observed` follows.
    pub fn new(
        ring: String,
        observed: tokio::sync::watch::Receiver<Observed>,
        upstream: Upstream,
    ) -> Self {
        Self {
            ring,
            views: Arc::new(Views::new(observed.clone())),
            observed,
            upstream,
            connections: Arc::default(),
            stats: Arc::default(),
            followers: Arc::default(),
            prefetched: Arc::default(),
        }
    }

    /// The ring now (its live members, each cluster's holders), made again only when
    /// the Leases change or one expires; retryable until the ring's Leases were read
    /// and one replica's taken (before that, the ring's clusters are not known, and
    /// the fleet would read as empty).
    fn view(&self) -> Result<Arc<View>, FleetError> {
        self.views.at(Instant::now(), |observed| {
            if !observed.listed {
                return Err(FleetError::Unavailable(format!(
                    "the router has not read the Leases of ring {} yet; retry",
                    self.ring
                )));
            }
            if observed.ring_clusters().is_none() {
                let why = observed
                    .refusals()
                    .unwrap_or_else(|| "no replica has published one yet".to_string());
                return Err(FleetError::Unavailable(format!(
                    "the router has taken no replica's Lease of ring {} ({why}); retry",
                    self.ring
                )));
            }
            Ok(())
        })
    }

    /// Resolves once the router can answer: the ring's Leases read, one replica's
    /// taken. It never does if the Leases stop being followed first (the router
    /// stopping), so a router that never could answer never reports itself ready.
    pub fn ready(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut observed = self.observed.clone();
        async move {
            let readable = observed
                .wait_for(|o| o.listed && o.ring_clusters().is_some())
                .await
                .is_ok();
            if !readable {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The ring's clusters: those its replicas publish as configured (kept while
    /// every Lease has expired: a coordination outage never empties the fleet), and
    /// any a replica serves.
    fn known(&self, serving: &BTreeMap<String, &Member>) -> BTreeSet<String> {
        let observed = self.observed.borrow();
        observed
            .ring_clusters()
            .into_iter()
            .flatten()
            .cloned()
            .chain(serving.keys().cloned())
            .collect()
    }

    /// The ring's clusters no replica serves now (nobody holds them ready: being
    /// taken up, between owners, or their replica gone): unserved, never absent.
    fn unserved(&self, serving: &BTreeMap<String, &Member>) -> BTreeSet<String> {
        self.known(serving)
            .into_iter()
            .filter(|c| !serving.contains_key(c))
            .collect()
    }

    /// The clusters `filter`'s names select among those served, grouped by the
    /// replica serving them.
    fn plan<'m>(
        filter: &ClusterFilter,
        serving: &BTreeMap<String, &'m Member>,
    ) -> BTreeMap<String, (&'m Member, Vec<String>)> {
        let mut plan: BTreeMap<String, (&Member, Vec<String>)> = BTreeMap::new();
        for (cluster, member) in serving {
            if filter.names_match(cluster) {
                plan.entry(member.identity.clone())
                    .or_insert_with(|| (*member, Vec::new()))
                    .1
                    .push(cluster.clone());
            }
        }
        plan
    }

    /// `call` made for every cluster `filter`'s names select, once per replica with
    /// the clusters it serves; a replica that cannot answer (`UNAVAILABLE`: killed,
    /// before its Lease expires, or fenced) has its clusters asked of their next
    /// holders. The answers, and each cluster no holder could answer for, with why:
    /// an answer without them is partial, never a failure of the whole call.
    async fn spread<'m, T, F, Fut>(
        &self,
        view: &'m View,
        filter: &ClusterFilter,
        call: F,
    ) -> Result<(Vec<T>, BTreeMap<String, String>), FleetError>
    where
        F: Fn(&'m Member, Vec<String>) -> Fut,
        Fut: Future<Output = Result<T, FleetError>>,
    {
        let holders = view.holders();
        let mut failed: BTreeSet<&str> = BTreeSet::new();
        let mut todo: Vec<&str> = holders
            .keys()
            .filter(|c| filter.names_match(c))
            .map(String::as_str)
            .collect();
        let mut out = Vec::new();
        let mut unreached: BTreeMap<String, String> = BTreeMap::new();
        let mut why_failed: BTreeMap<&str, String> = BTreeMap::new();
        let mut not_found: Option<FleetError> = None;
        while !todo.is_empty() {
            let mut plan: BTreeMap<&str, (&'m Member, Vec<String>)> = BTreeMap::new();
            for c in todo.drain(..) {
                let Some(m) = holders[c]
                    .iter()
                    .find(|m| !failed.contains(m.identity.as_str()))
                else {
                    let why = holders[c]
                        .iter()
                        .rev()
                        .find_map(|m| why_failed.get(m.identity.as_str()))
                        .cloned()
                        .unwrap_or_default();
                    unreached.insert(
                        c.to_string(),
                        format!(
                            "no replica of ring {} serving this cluster could answer: {why}",
                            self.ring
                        ),
                    );
                    continue;
                };
                plan.entry(m.identity.as_str())
                    .or_insert_with(|| (*m, Vec::new()))
                    .1
                    .push(c.to_string());
            }
            let calls = plan
                .values()
                .map(|(member, clusters)| call(member, clusters.clone()));
            let answers = futures::future::join_all(calls).await;
            for ((identity, (_, clusters)), answer) in plan.into_iter().zip(answers) {
                let why = match answer {
                    Ok(t) => {
                        out.push(t);
                        continue;
                    }
                    Err(FleetError::Unavailable(why)) => why,
                    // A replica that let the clusters go since the router last read
                    // its Lease collects nothing of them: their next holders answer
                    // (and if every replica says so, so does the router).
                    Err(e @ FleetError::NotFound(_)) => {
                        let why = e.to_string();
                        not_found = Some(e);
                        why
                    }
                    Err(e) => return Err(e),
                };
                tracing::debug!(replica = %identity, %why, "a replica could not answer: asking its clusters' next holders");
                failed.insert(identity);
                why_failed.insert(identity, why);
                todo.extend(
                    clusters
                        .iter()
                        .filter_map(|c| holders.get_key_value(c).map(|(k, _)| k.as_str())),
                );
            }
        }
        if out.is_empty()
            && let Some(e) = not_found
        {
            return Err(e);
        }
        Ok((out, unreached))
    }

    /// `member` as a fleet, asked over the least busy of its connections (see
    /// [`pool`]), holding its place there until dropped.
    fn remote(&self, member: &Member) -> Result<Remote, FleetError> {
        let address = member.annotations.get(owner::ADDRESS).ok_or_else(|| {
            FleetError::Unavailable(format!(
                "replica {} publishes no address on its Lease; retry",
                member.identity
            ))
        })?;
        let (channel, place) = self
            .connections
            .place(address, || self.connect(member, address))?;
        let replica = Replica {
            ring: self.ring.clone(),
            identity: member.identity.clone(),
            address: address.clone(),
        };
        let speaking = Speaking {
            passes_identity: self.upstream.passes_identity,
            page_token_key: self.upstream.page_token_key.clone(),
        };
        Ok(Remote::new(channel, replica, speaking).holding(place))
    }

    /// A new connection (made when first used) to `member` at `address`.
    fn connect(
        &self,
        member: &Member,
        address: &str,
    ) -> Result<tonic::transport::Channel, FleetError> {
        let scheme = if self.upstream.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let bad = |e: tonic::transport::Error| {
            FleetError::Unavailable(format!(
                "replica {} publishes the address {address:?}, which cannot be used: {e}",
                member.identity
            ))
        };
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(bad)?
            .timeout(self.upstream.timeout)
            .connect_timeout(self.upstream.timeout);
        if let Some(tls) = &self.upstream.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(bad)?;
        }
        Ok(endpoint.connect_lazy())
    }

    /// One call to `member`: `call` made on it as a fleet, counted in its figures.
    async fn ask<T, Fut>(
        &self,
        member: &Member,
        call: impl FnOnce(Remote) -> Fut,
    ) -> Result<T, FleetError>
    where
        Fut: Future<Output = Result<T, FleetError>>,
    {
        let started = std::time::Instant::now();
        let answer = match self.remote(member) {
            Ok(remote) => call(remote).await,
            Err(e) => Err(e),
        };
        self.stats.record(
            &member.identity,
            started.elapsed(),
            answer.as_ref().map(|_| ()),
        );
        answer
    }

    /// The ring and the replicas' calls as this router sees them now, for its
    /// metrics.
    pub fn figures(&self) -> stats::RingFigures {
        let view = self.view().unwrap_or_default();
        let members = view.members();
        let serving = view.serving();
        stats::RingFigures {
            members: members.len(),
            unserved: self.unserved(&serving).len(),
            refused: self.observed.borrow().refused().len(),
            connections: self.connections.figures(),
            calls: self.stats.calls(),
        }
    }

    /// Whether the router can answer: the ring's Leases read and one replica's taken
    /// (see [`Router::ready`]); why not, when not.
    pub fn readiness(&self) -> Result<(), String> {
        self.view().map(|_| ()).map_err(|e| e.to_string())
    }

    fn no_owner(&self, cluster: &str) -> FleetError {
        FleetError::Unavailable(format!(
            "cluster {cluster} has no ready replica in ring {}: it is moving or its replica is down; retry",
            self.ring
        ))
    }

    /// Names and globs of `filter` that name no cluster of the ring, served or not.
    fn unmatched(
        &self,
        filter: &fleetscope_model::ClusterFilter,
        serving: &BTreeMap<String, &Member>,
    ) -> Vec<String> {
        let known: Vec<fleetscope_model::ClusterName> = self
            .known(serving)
            .into_iter()
            .map(fleetscope_model::ClusterName::from)
            .collect();
        filter.unmatched(known.iter())
    }

    /// Why nobody serves a cluster, with the Leases of the ring not taken, when any
    /// (a router given another key than the replicas' takes none of theirs).
    fn unserved_why(&self) -> String {
        let mut why = format!("no replica of ring {} serves this cluster now", self.ring);
        if let Some(refusals) = self.observed.borrow().refusals() {
            why.push_str(&format!(" ({refusals})"));
        }
        why
    }

    /// The clusters `asked` of `replica` that its answer says nothing of (none of the
    /// clusters it `answered` for): it let them go since the router read its Lease, so
    /// its answer holds none of their objects.
    fn silent<'a>(
        replica: &str,
        asked: &[String],
        answered: impl IntoIterator<Item = &'a str>,
    ) -> Vec<ClusterFreshness> {
        let answered: BTreeSet<&str> = answered.into_iter().collect();
        asked
            .iter()
            .filter(|c| !answered.contains(c.as_str()))
            .map(|c| {
                Self::unserved_freshness(
                    c,
                    format!("replica {replica} no longer serves this cluster (it moved); retry"),
                )
            })
            .collect()
    }

    /// A cluster of the ring not in an answer, and why.
    fn unserved_freshness(cluster: &str, why: String) -> ClusterFreshness {
        ClusterFreshness {
            cluster: cluster.into(),
            freshness: Freshness::Error,
            stale_since: None,
            message: why,
        }
    }

    /// Each cluster `filter` selects that nobody serves or no holder could answer
    /// for, with why.
    fn missing(
        &self,
        filter: &ClusterFilter,
        serving: &BTreeMap<String, &Member>,
        unreached: BTreeMap<String, String>,
    ) -> Vec<ClusterFreshness> {
        let mut missing: Vec<ClusterFreshness> = unreached
            .into_iter()
            .map(|(c, why)| Self::unserved_freshness(&c, why))
            .collect();
        let unserved = self.unserved(serving);
        if !unserved.is_empty() {
            let why = self.unserved_why();
            missing.extend(
                unserved
                    .into_iter()
                    .filter(|c| filter.names_match(c))
                    .map(|c| Self::unserved_freshness(&c, why.clone())),
            );
        }
        missing
    }
}

impl Fleet for Router {
    async fn get(&self, r: GetRequest) -> Result<GetAnswer, FleetError> {
        let view = self.view()?;
        let holders = view.holders_of(&r.cluster);
        if holders.is_empty() {
            if self.known(&view.serving()).contains(&r.cluster) {
                return Err(self.no_owner(&r.cluster));
            }
            return Err(FleetError::NotFound(format!(
                "no cluster {:?} in the fleet",
                fleetscope_grpc::echo(&r.cluster)
            )));
        }
        // The next holder answers when the serving one cannot (killed, say, before
        // its Lease expires).
        let mut answer = None;
        for m in holders {
            let request = r.clone();
            match self
                .ask(m, |remote| async move { remote.get(request).await })
                .await
            {
                Err(FleetError::Unavailable(why)) => {
                    tracing::debug!(replica = %m.identity, %why, "a holder could not answer a Get: asking the next");
                    answer = Some(Err(FleetError::Unavailable(why)));
                }
                other => {
                    answer = Some(other);
                    break;
                }
            }
        }
        answer.unwrap_or_else(|| Err(self.no_owner(&r.cluster)))
    }

    async fn list(&self, r: ListRequest) -> Result<ListAnswer, FleetError> {
        if r.resume.is_empty() {
            self.first_list_page(r).await
        } else {
            self.next_list_page(r).await
        }
    }

    async fn count(&self, r: CountRequest) -> Result<CountAnswer, FleetError> {
        let view = self.view()?;
        let serving = view.serving();
        let (answers, unreached) = self
            .spread(&view, &r.query.clusters, |member, clusters| {
                let mut request = r.clone();
                request.query.clusters = r.query.clusters.only(&clusters);
                async move {
                    let answer = self
                        .ask(member, |remote| async move { remote.count(request).await })
                        .await?;
                    Ok::<_, FleetError>((member.identity.clone(), clusters, answer))
                }
            })
            .await?;
        let mut groups: BTreeMap<Vec<String>, u64> = BTreeMap::new();
        let mut total = 0;
        let mut clusters = Vec::new();
        let mut partial = false;
        let mut newest = Revision(0);
        let mut silent = Vec::new();
        for (identity, asked, a) in answers {
            silent.extend(Self::silent(
                &identity,
                &asked,
                a.clusters.iter().map(|c| c.cluster.as_str()),
            ));
            for (key, count) in a.groups {
                *groups.entry(key).or_default() += count;
            }
            total += a.total;
            partial |= a.partial;
            newest = newest.max(a.revision);
            clusters.extend(a.clusters);
        }
        let mut missing = self.missing(&r.query.clusters, &serving, unreached);
        missing.extend(silent);
        partial |= !missing.is_empty();
        clusters.extend(missing);
        Ok(CountAnswer {
            groups,
            total,
            revision: newest,
            clusters,
            partial,
            warnings: self.unmatched(&r.query.clusters, &serving),
        })
    }

    async fn watch(&self, r: WatchRequest) -> Result<Watch, FleetError> {
        if r.since.is_some() {
            // A single server's revisions are its own: none names a position across
            // the ring's replicas.
            return Err(FleetError::OutOfRange {
                message: format!(
                    "through a router of ring {}, a Watch resumes from a bookmark's position_token (resume_token), not from a revision",
                    self.ring
                ),
                reason: reason::REVISION_COMPACTED,
                oldest: None,
            });
        }
        let routed = shared::Shared::start(self.clone(), r).await?;
        Ok(Watch::new(
            routed.events(),
            Arc::new(std::sync::atomic::AtomicU64::new(0)),
        ))
    }

    async fn clusters(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> Result<ClustersAnswer, FleetError> {
        let view = self.view()?;
        let members = view.members();
        let serving = view.serving();
        let (answers, unreached) = self
            .spread(&view, &filter, |member, clusters| {
                let filter = ClusterFilter::default().only(&clusters);
                async move {
                    let answer = self
                        .ask(member, |remote| async move {
                            remote.clusters(filter, access).await
                        })
                        .await?;
                    Ok::<_, FleetError>((member.identity.clone(), clusters, answer))
                }
            })
            .await?;
        let mut out = ClustersAnswer::default();
        let mut silent = Vec::new();
        // Owners in the order the assignment ranks them over the live members.
        let live: Vec<String> = members.iter().map(|m| m.identity.clone()).collect();
        for (identity, asked, answer) in answers {
            silent.extend(Self::silent(
                &identity,
                &asked,
                answer.clusters.iter().map(|c| c.name.as_str()),
            ));
            for c in answer.clusters {
                // Only the report of the replica asked for the cluster (another may
                // still hold it while handing it over).
                if !asked.iter().any(|a| a == c.name.as_str()) {
                    continue;
                }
                let mut info = c;
                // The replica answering and every other holding it ready, the one the
                // assignment makes its owner first (rendezvous over the live members,
                // as the replicas rank them), whichever serves it during a move.
                let mut owners: Vec<String> = std::iter::once(identity.clone())
                    .chain(
                        members
                            .iter()
                            .filter(|m| {
                                m.identity != identity
                                    && owner::ready_of(m).contains(info.name.as_str())
                            })
                            .map(|m| m.identity.clone()),
                    )
                    .collect();
                let rank = fleetscope_ring::assign::owners(info.name.as_str(), &live, live.len());
                owners.sort_by_key(|o| rank.iter().position(|r| r == o).unwrap_or(usize::MAX));
                info.owners = owners;
                out.clusters.push(info);
            }
        }
        let mut missing = self.missing(&filter, &serving, unreached);
        missing.extend(silent);
        for freshness in missing {
            out.clusters.push(ClusterInfo {
                name: freshness.cluster.clone(),
                labels: BTreeMap::new(),
                server: String::new(),
                last_error: freshness.message.clone(),
                freshness,
                kubernetes_version: String::new(),
                streams: Vec::new(),
                source: format!("ring {}", self.ring),
                source_loaded: std::time::SystemTime::UNIX_EPOCH,
                owners: Vec::new(),
            });
        }
        out.clusters.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn resource_types(&self, access: &Access) -> Result<Vec<ResourceTypeInfo>, FleetError> {
        let view = self.view()?;
        // The types of the clusters that can be reached (the answer has no place for
        // the others: ListClusters names them).
        let (answers, _) = self
            .spread(
                &view,
                &ClusterFilter::default(),
                |member, clusters| async move {
                    let answer = self
                        .ask(member, |remote| async move {
                            remote.resource_types(access).await
                        })
                        .await?;
                    Ok::<_, FleetError>((clusters, answer))
                },
            )
            .await?;
        let mut merged: BTreeMap<String, ResourceTypeInfo> = BTreeMap::new();
        for (clusters, answer) in answers {
            for t in answer {
                let counts: Vec<_> = t
                    .clusters
                    .iter()
                    .filter(|(c, _)| clusters.iter().any(|s| s == c.as_str()))
                    .cloned()
                    .collect();
                let entry = merged
                    .entry(t.resource.name())
                    .or_insert_with(|| ResourceTypeInfo {
                        resource: t.resource.clone(),
                        short_names: t.short_names.clone(),
                        clusters: Vec::new(),
                    });
                entry.clusters.extend(counts);
            }
        }
        Ok(merged
            .into_values()
            .map(|mut t| {
                t.clusters.sort();
                t
            })
            .collect())
    }

    async fn store(&self, _access: &Access) -> Result<Store, FleetError> {
        // A router holds no store: the replicas each keep their own.
        Ok(Store::Router {
            ring: self.ring.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    #[test]
    fn a_router_whose_leases_stop_being_followed_unread_is_never_ready() {
        let (leases, observed) = tokio::sync::watch::channel(Observed::default());
        let router = Router::new(
            "ring".into(),
            observed,
            Upstream {
                tls: None,
                passes_identity: false,
                page_token_key: TokenKey::new(&[7; 32]),
                timeout: std::time::Duration::from_secs(1),
            },
        );
        let ready = router.ready();
        // The follower stops (the router shutting down) before any Lease was read.
        drop(leases);
        assert!(ready.now_or_never().is_none());
    }
}
