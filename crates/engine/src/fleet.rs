//! The engine behind the Fleet seam, and only that: each RPC planned
//! ([`crate::plan`]), read from one snapshot, each object shown as the caller may see
//! it ([`crate::view`]), stating the freshness of the clusters it drew on; Watch is
//! [`crate::subscriber`]'s.

use std::collections::BTreeMap;

use fleetscope_model::access::{ClusterRef, Namespaces};
use fleetscope_model::fleet::{
    ClusterInfo, ClustersAnswer, CountAnswer, CountRequest, GetAnswer, GetRequest, ListAnswer,
    ListRequest, ResourceTypeInfo, Store, StreamInfo, StreamState, Watch, WatchRequest,
};
use fleetscope_model::{Access, ClusterFilter, ClusterName, Fleet, FleetError, ObjectKey, Verb};

use crate::Engine;
use crate::plan::cluster_freshness;
use crate::status::ClusterStatus;
use crate::view::{fleet_object, holds_secrets, shown};

impl Fleet for Engine {
    async fn get(&self, r: GetRequest) -> Result<GetAnswer, FleetError> {
        if r.cluster.is_empty() {
            return Err(FleetError::InvalidArgument(
                "cluster is required: Get reads one object of one cluster (ListClusters names them); to find an object by name in every cluster, List with field_selector metadata.name=NAME".into(),
            ));
        }
        let rt = self.resolve_resource(&r.resource, &r.access)?;
        let cluster = ClusterName::from(r.cluster.as_str());
        let policy = r.access.policy();
        let who = r.access.subject();
        // A cluster the caller is granted nothing in does not exist for them.
        let status = self
            .status
            .cluster(&cluster)
            .filter(|c| {
                policy.sees_cluster(
                    who,
                    ClusterRef {
                        name: &c.name,
                        labels: &c.labels,
                    },
                )
            })
            .ok_or_else(|| FleetError::NotFound(format!("no cluster named {:?}", r.cluster)))?;
        if r.name.is_empty() {
            return Err(FleetError::InvalidArgument("name is required".into()));
        }
        let here = ClusterRef {
            name: &status.name,
            labels: &status.labels,
        };
        let granted = policy
            .namespaces(who, Verb::Get, &rt, here)
            .allows(&r.namespace);
        let key = ObjectKey::new(&rt.name(), &cluster, &r.namespace, &r.name);
        let snapshot = self.holding(&key).await;
        // An object not granted is answered as one that does not exist, word for word,
        // so a caller learns nothing of what they may not read.
        let object = snapshot.get(&key).filter(|_| granted).ok_or_else(|| {
            let place = if r.namespace.is_empty() {
                String::new()
            } else {
                format!(" in namespace {:?}", r.namespace)
            };
            FleetError::NotFound(format!(
                "{} {:?} not found{place} of cluster {:?}",
                rt.name(),
                r.name,
                r.cluster
            ))
        })?;
        Ok(GetAnswer {
            object: shown(
                fleet_object(object, r.projection),
                policy.as_ref(),
                who,
                &status.labels,
            ),
            cluster: cluster_freshness(&status, Some(&rt.name())),
            revision: snapshot.revision(),
        })
    }

    async fn list(&self, r: ListRequest) -> Result<ListAnswer, FleetError> {
        // While a restored index is still being made, a first page that lies within
        // the objects made so far is answered from them, as soon as it does. Each try
        // reads what is made, so the next waits until that has doubled: a page that
        // never fits costs a few reads of the index, not one per prefix offered. (A
        // token reads a pinned snapshot: the whole index, once it is in.)
        if r.after.is_none() {
            self.index.made_some().await;
            let mut tried = 0;
            while let Some(early) = self.index.early(Some(&r.access.caller())) {
                let made = early.state.len();
                if made >= tried * 2 {
                    tried = made.max(1);
                    if let Some(answer) = self.list_early(&r, early.clone()).await? {
                        return Ok(answer);
                    }
                }
                self.index.made_more(&early).await;
            }
        }
        self.index.restored().await;
        let snapshot = self.snapshot_for(&r.after)?;
        let (limit, max_bytes) = (r.limit.max(1), r.max_bytes);
        let after = r.after.clone();
        // A continued list: how many matched after the previous page, as it said.
        let known = r
            .after
            .as_ref()
            .and_then(|_| fleetscope_model::fleet::resumed_remaining(&r.resume));
        let ((page, snapshot), built) = self
            .run_query(&r.query, &r.access, move |query| {
                let after = after.as_ref().map(|(_, key)| key);
                let page = snapshot.page_from(query, after, known, limit, max_bytes);
                (page, snapshot)
            })
            .await?;
        if page.next.is_some() || r.keep_snapshot {
            // The next page reads this snapshot too, for as long as tokens live.
            self.index.pin(snapshot.clone(), &r.access.caller());
        }
        // The next page's remainder is this one's less what it returns.
        let resume = fleetscope_model::fleet::remaining_resume(page.remaining);
        Ok(self.list_answer(&r, built, page, snapshot.revision(), resume))
    }

    async fn count(&self, r: CountRequest) -> Result<CountAnswer, FleetError> {
        self.index.restored().await;
        let snapshot = self.index.snapshot();
        let revision = snapshot.revision();
        let group_by = r.group_by.clone();
        let (counts, built) = self
            .run_query(&r.query, &r.access, move |query| {
                snapshot.count(query, &group_by)
            })
            .await?;
        Ok(CountAnswer {
            groups: counts.groups,
            total: counts.total,
            revision,
            clusters: built.freshness,
            partial: built.partial,
            warnings: built.warnings,
        })
    }

    async fn watch(&self, r: WatchRequest) -> Result<Watch, FleetError> {
        // A Watch resumes from the log: after a restore, once its events are in.
        self.index.history_restored().await;
        crate::subscriber::start(self, r)
    }

    async fn clusters(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> Result<ClustersAnswer, FleetError> {
        self.index.restored().await;
        let snapshot = self.index.snapshot();
        let policy = access.policy();
        let who = access.subject();
        let clusters = self
            .selected(&filter)
            .into_iter()
            .filter_map(|mut c| {
                let here = ClusterRef {
                    name: &c.name,
                    labels: &c.labels,
                };
                if !policy.sees_cluster(who, here) {
                    return None;
                }
                // Each stream as far as the caller may list it: hidden when not at all,
                // its count of the objects they may read.
                let mut counts: BTreeMap<String, u64> = BTreeMap::new();
                let granted: BTreeMap<String, Namespaces> = c
                    .streams
                    .iter()
                    .map(|(name, (rt, _))| {
                        (name.clone(), policy.namespaces(who, Verb::List, rt, here))
                    })
                    .collect();
                for (resource, cluster, ns, n) in snapshot.namespace_counts() {
                    if *cluster == c.name && granted.get(resource).is_some_and(|g| g.allows(ns)) {
                        *counts.entry(resource.to_string()).or_default() += n as u64;
                    }
                }
                // Configured names a cluster does not serve (a CRD not installed) are
                // named only to a caller who may read every type collected there: to
                // others, a name and its error tell of types they are not granted.
                let sees_all =
                    !granted.is_empty() && granted.values().all(|g| matches!(g, Namespaces::All));
                if !sees_all {
                    c.missing.clear();
                }
                c.streams
                    .retain(|name, _| granted.get(name).is_some_and(|g| !g.is_none()));
                Some(cluster_info(c, &counts))
            })
            .collect();
        let sources = self.status.sources();
        Ok(ClustersAnswer {
            clusters,
            sources_loaded: sources.loaded_at,
            sources_error: sources.error,
            store_error: self.status.store_stall().map(|s| (s.error, s.since)),
        })
    }

    async fn resource_types(&self, access: &Access) -> Result<Vec<ResourceTypeInfo>, FleetError> {
        self.index.restored().await;
        let snapshot = self.index.snapshot();
        let labels = self.status.all_labels();
        let policy = access.policy();
        let who = access.subject();
        Ok(self
            .status
            .catalogue()
            .named()
            .filter_map(|named| {
                let rt = &named.resource;
                let name = rt.name();
                // Per cluster, the namespaces the caller may list; a type granted
                // nowhere is not shown at all.
                let granted: BTreeMap<&ClusterName, Namespaces> = labels
                    .iter()
                    .map(|(c, l)| {
                        let here = ClusterRef { name: c, labels: l };
                        (c, policy.namespaces(who, Verb::List, rt, here))
                    })
                    .filter(|(_, g)| !g.is_none())
                    .collect();
                if granted.is_empty() {
                    return None;
                }
                let mut counts: BTreeMap<ClusterName, u64> = BTreeMap::new();
                for (r, c, ns, n) in snapshot.namespace_counts() {
                    if *r == *name && granted.get(c).is_some_and(|g| g.allows(ns)) {
                        *counts.entry(c.clone()).or_default() += n as u64;
                    }
                }
                Some(ResourceTypeInfo {
                    resource: rt.clone(),
                    short_names: named.short_names.clone(),
                    clusters: counts.into_iter().collect(),
                })
            })
            .collect())
    }

    async fn store(&self, access: &Access) -> Result<Store, FleetError> {
        let path = fleetscope_model::access::STORE_ENDPOINT;
        if !access.policy().endpoint(access.subject(), path) {
            return Err(FleetError::PermissionDenied(format!(
                "{} may not read the store's figures: a grant of nonResourceURLs [{path:?}] is needed",
                access.subject()
            )));
        }
        Ok(self
            .store_stats()
            .map_or(Store::InMemory, |s| Store::Persisted(Box::new(s))))
    }
}

impl Engine {
    /// A first page from the objects a restore has made so far ([`Index::early`]),
    /// if one lies within them. The page token's snapshot is the whole index at the
    /// same revision, pinned for the caller once it is in; the remainder is a lower
    /// bound, so the next page counts what follows it anew.
    ///
    /// [`Index::early`]: fleetscope_index::Index::early
    async fn list_early(
        &self,
        r: &ListRequest,
        early: fleetscope_index::Early,
    ) -> Result<Option<ListAnswer>, FleetError> {
        let (limit, max_bytes) = (r.limit.max(1), r.max_bytes);
        let revision = early.state.revision();
        let (page, built) = self
            .run_query(&r.query, &r.access, move |query| {
                early
                    .state
                    .early_page(query, &early.through, limit, max_bytes)
            })
            .await?;
        Ok(page.map(|page| self.list_answer(r, built, page, revision, Vec::new())))
    }

    /// The index to read `key` in: while a restore is under way, the objects made so
    /// far once they reach `key` (every key up to the last made is made, so one not
    /// among them is not held), else the whole index.
    async fn holding(&self, key: &ObjectKey) -> std::sync::Arc<fleetscope_index::State> {
        self.index.made_some().await;
        while let Some(early) = self.index.early(None) {
            if *key <= early.through {
                return early.state;
            }
            self.index.made_more(&early).await;
        }
        self.index.restored().await;
        self.index.snapshot()
    }

    /// A page as the seam answers it: each object shown as the caller may see it.
    fn list_answer(
        &self,
        r: &ListRequest,
        built: crate::plan::Built,
        page: fleetscope_index::Page,
        revision: fleetscope_model::Revision,
        resume: Vec<u8>,
    ) -> ListAnswer {
        let items = page.items.iter().map(|o| fleet_object(o, r.projection));
        let items = if holds_secrets(&built.query.resource) {
            let policy = r.access.policy();
            let labels = self.status.all_labels();
            let none = BTreeMap::new();
            items
                .map(|o| {
                    let l = labels.get(&o.key.cluster).unwrap_or(&none);
                    shown(o, policy.as_ref(), r.access.subject(), l)
                })
                .collect()
        } else {
            items.collect()
        };
        ListAnswer {
            items,
            next: page.next,
            revision,
            remaining: page.remaining,
            clusters: built.freshness,
            partial: built.partial,
            resume,
            warnings: built.warnings,
        }
    }
}

/// One cluster's status as the seam reports it, with its streams' object counts.
fn cluster_info(c: ClusterStatus, counts: &BTreeMap<String, u64>) -> ClusterInfo {
    let whole = cluster_freshness(&c, None);
    let streams = c
        .streams
        .iter()
        .map(|(name, (_, s))| StreamInfo {
            resource: name.clone(),
            state: s.state,
            object_count: counts.get(name).copied().unwrap_or(0),
            resource_version: s.resource_version.clone(),
            last_event: s.last_event,
            last_error: s.last_error.clone().unwrap_or_default(),
            sync_lag: s.sync_lag(),
            sync_method: s.sync_method,
            watch_list_fallback: s.watch_list_fallback.clone().unwrap_or_default(),
        })
        .chain(c.missing.iter().map(|(spec, why)| StreamInfo {
            resource: spec.clone(),
            state: StreamState::NotFound,
            object_count: 0,
            resource_version: String::new(),
            last_event: None,
            last_error: why.clone(),
            sync_lag: None,
            sync_method: None,
            watch_list_fallback: String::new(),
        }))
        .collect();
    ClusterInfo {
        last_error: c.error.clone().unwrap_or_else(|| whole.message.clone()),
        freshness: whole,
        name: c.name,
        labels: c.labels,
        server: c.server,
        kubernetes_version: c.version,
        streams,
        source: c.source,
        source_loaded: c.loaded_at,
        owners: Vec::new(),
    }
}
