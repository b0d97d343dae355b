//! The engine behind the Fleet seam: resource names resolved against what is
//! collected, cluster filters evaluated against the live fleet, every answer read
//! from one snapshot and stating the freshness of the clusters it drew on.

use std::collections::BTreeMap;

use fleetscope_index::{Object, State};
use fleetscope_informer::discovery::{self, Served};
use fleetscope_model::access::{ClusterRef, Namespaces, Policy, Subject};
use fleetscope_model::fleet::{
    ClusterFreshness, ClusterInfo, ClustersAnswer, CountAnswer, CountRequest, FleetObject,
    GetAnswer, GetRequest, ListAnswer, ListRequest, Projection, Query, ResourceTypeInfo,
    StoreStats, StreamInfo, StreamState, Watch, WatchRequest,
};
use fleetscope_model::{
    Access, ClusterFilter, ClusterName, Fleet, FleetError, ObjectKey, ResourceType, Verb,
};

use crate::Engine;
use crate::status::{ClusterStatus, Freshness};

/// An object as the seam returns it; `meta` is its uid and resourceVersion when
/// already read (a Watch event carries them), else they are read from its JSON.
pub(crate) fn fleet_object(
    o: &Object,
    projection: Projection,
    meta: Option<(&str, &str)>,
) -> FleetObject {
    let json = match projection {
        Projection::Metadata => o.metadata_json(),
        Projection::Full => o.json.to_string(),
    };
    let (uid, resource_version) = match meta {
        Some((uid, rv)) => (uid.to_string(), rv.to_string()),
        None => o.uid_and_resource_version(),
    };
    FleetObject {
        key: o.key.clone(),
        revision: o.revision,
        uid,
        resource_version,
        json,
    }
}

/// The name Secrets are collected under.
const SECRETS: &str = "secrets";

/// Whether objects of `resource` carry values that are redacted unless a grant
/// reveals them.
pub(crate) fn holds_secrets(resource: &str) -> bool {
    resource == SECRETS
}

/// A Secret as shown to a caller the policy does not reveal its values to: every
/// value of `data` and `stringData` emptied (the keys stay, so a caller can see what
/// a Secret holds), every other copy of them dropped (kubectl's last-applied
/// annotation holds the whole Secret as applied), and the annotation
/// `fleetscope.io/redacted` saying what was taken. A metadata-only Secret is
/// redacted too: its annotations are the copy it carries.
pub(crate) fn redact_secret(object: &mut FleetObject) {
    let Ok(serde_json::Value::Object(mut v)) = serde_json::from_str(&object.json) else {
        // Not an object: nothing of it is shown.
        object.json = "{}".into();
        return;
    };
    let mut redacted = Vec::new();
    for field in ["data", "stringData"] {
        if let Some(serde_json::Value::Object(values)) = v.get_mut(field) {
            for value in values.values_mut() {
                *value = serde_json::Value::String(String::new());
            }
            redacted.push(field);
        }
    }
    let annotations = match v.get_mut("metadata") {
        Some(serde_json::Value::Object(meta)) => match meta.get_mut("annotations") {
            Some(serde_json::Value::Object(a)) => Some(a),
            _ => None,
        },
        _ => None,
    };
    if let Some(a) = annotations
        && a.remove(LAST_APPLIED).is_some()
    {
        redacted.push(LAST_APPLIED);
    }
    if redacted.is_empty() {
        return;
    }
    if let Some(serde_json::Value::Object(meta)) = v.get_mut("metadata") {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let serde_json::Value::Object(a) = annotations {
            a.insert(
                REDACTED_ANNOTATION.into(),
                serde_json::Value::String(redacted.join(",")),
            );
        }
    }
    object.json = serde_json::Value::Object(v).to_string();
}

/// kubectl's record of an object as last applied: on a Secret, its values.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The annotation a redacted Secret carries: which of its fields were emptied.
pub const REDACTED_ANNOTATION: &str = "fleetscope.io/redacted";

/// Shows `object` to a caller: redacted when it is a Secret whose values the policy
/// does not reveal to them.
pub(crate) fn shown(
    mut object: FleetObject,
    policy: &dyn Policy,
    who: &Subject,
    labels: &BTreeMap<String, String>,
) -> FleetObject {
    if holds_secrets(&object.key.resource)
        && !policy.secret_data(
            who,
            ClusterRef {
                name: &object.key.cluster,
                labels,
            },
            &object.key.namespace,
        )
    {
        redact_secret(&mut object);
    }
    object
}

/// A cluster's freshness for one type (or as a whole), as answers state it.
pub(crate) fn cluster_freshness(c: &ClusterStatus, resource: Option<&str>) -> ClusterFreshness {
    let (freshness, stale_since, message) = c.freshness(resource);
    ClusterFreshness {
        cluster: c.name.clone(),
        freshness,
        stale_since,
        message,
    }
}

/// A query made concrete against the engine's current state.
pub(crate) struct Built {
    /// The index query; `clusters` lists the clusters the filter selects now.
    pub query: fleetscope_index::Query,
    /// The clusters' freshness for the type.
    pub freshness: Vec<ClusterFreshness>,
    /// Whether some selected cluster is not synced.
    pub partial: bool,
}

impl Engine {
    /// Whether the caller is granted objects of `rt` in some cluster, for some verb.
    fn granted_somewhere(&self, access: &Access, rt: &ResourceType) -> bool {
        let policy = access.policy();
        self.status.any_cluster(|name, labels| {
            let here = ClusterRef { name, labels };
            Verb::ALL
                .iter()
                .any(|v| !policy.namespaces(access.subject(), *v, rt, here).is_none())
        })
    }

    /// Resolves a kubectl-style name against the types collected somewhere and granted
    /// to the caller somewhere: a type it is granted nowhere is answered as one not
    /// collected (and never named in a hint). A type not known while clusters are
    /// still being discovered is `Unavailable`, not `NotFound`.
    pub(crate) fn resolve_resource(
        &self,
        name: &str,
        access: &Access,
    ) -> Result<ResourceType, FleetError> {
        if name.trim().is_empty() {
            return Err(FleetError::InvalidArgument(
                "query.resource is required, e.g. \"pods\" or \"deployments.apps\"".into(),
            ));
        }
        fleetscope_model::check_resource_name(name.trim())
            .map_err(|e| FleetError::InvalidArgument(format!("query.resource: {e}")))?;
        let types = self.status.types();
        let names = self.status.type_names();
        let served: Vec<Served> = types
            .values()
            .map(|rt| {
                let (short_names, singular) = names
                    .get(&(rt.group.clone(), rt.plural.clone()))
                    .cloned()
                    .unwrap_or_default();
                Served {
                    short_names,
                    singular,
                    ..Served::of(rt.clone(), true)
                }
            })
            .collect();
        let resolved = discovery::resolve(&[name.to_string()], &served);
        let granted = resolved
            .resources
            .into_iter()
            .next()
            .filter(|rt| self.granted_somewhere(access, rt));
        if let Some(rt) = granted {
            return Ok(rt);
        }
        // Not known yet is not unknown: a cluster still being discovered may serve it.
        let discovering: Vec<String> = self
            .status
            .clusters()
            .into_iter()
            .filter(|c| c.discovering())
            .map(|c| c.name.to_string())
            .collect();
        if !discovering.is_empty() {
            return Err(FleetError::Unavailable(format!(
                "resource type {name:?} is not known yet: fleetscope is still discovering cluster(s) {}; retry shortly",
                discovering.join(", ")
            )));
        }
        let lower = name.to_ascii_lowercase();
        let types: BTreeMap<String, ResourceType> = types
            .into_iter()
            .filter(|(_, rt)| self.granted_somewhere(access, rt))
            .collect();
        let mut close: Vec<(usize, &String)> = types
            .keys()
            .map(|k| (strsim::levenshtein(&lower, k), k))
            .filter(|(d, k)| *d <= 3 || k.starts_with(&lower))
            .collect();
        close.sort();
        let hint = if close.is_empty() {
            format!(
                "collected types: {}",
                types.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        } else {
            format!(
                "did you mean {}?",
                close
                    .iter()
                    .map(|(_, k)| k.as_str())
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Err(FleetError::NotFound(format!(
            "resource type {name:?} is not collected from any cluster; {hint}"
        )))
    }

    /// The clusters a filter selects now.
    fn selected(&self, filter: &ClusterFilter) -> Vec<ClusterStatus> {
        self.status
            .clusters()
            .into_iter()
            .filter(|c| filter.matches(&c.name, &c.labels))
            .collect()
    }

    /// Resolves a query against the collected types and the live fleet, for a caller
    /// who will `verb` its objects: the clusters drawn on are those the filter selects
    /// and the caller may read some of, and only the places they may read are read.
    pub(crate) fn build(
        &self,
        q: &Query,
        access: &Access,
        verb: Verb,
    ) -> Result<(ResourceType, Built), FleetError> {
        let rt = self.resolve_resource(&q.resource, access)?;
        let mut clusters = self.selected(&q.clusters);
        let reach = access.reach(
            verb,
            &rt,
            clusters.iter().map(|c| ClusterRef {
                name: &c.name,
                labels: &c.labels,
            }),
        );
        if let Some(reach) = &reach {
            clusters.retain(|c| reach.reaches(&c.name));
        }
        let query = fleetscope_index::Query {
            resource: rt.name(),
            clusters: if q.clusters.is_everything() && reach.is_none() {
                None
            } else {
                Some(clusters.iter().map(|c| c.name.clone()).collect())
            },
            reach,
            deadline: None,
            namespaces: q
                .namespaces
                .iter()
                .filter(|n| !n.is_empty())
                .cloned()
                .collect(),
            labels: q.labels.clone(),
            fields: q.fields.clone(),
        };
        let freshness: Vec<ClusterFreshness> = clusters
            .iter()
            .map(|c| cluster_freshness(c, Some(&rt.name())))
            .collect();
        let partial = freshness.iter().any(|f| f.freshness != Freshness::Synced);
        Ok((
            rt,
            Built {
                query,
                freshness,
                partial,
            },
        ))
    }

    /// Evaluates a query on a thread of its own, within the engine's places for query
    /// evaluation, so the async workers (Watch streams, health) never wait for it; a
    /// query that cannot start before `deadline` is `UNAVAILABLE` (retry).
    async fn evaluate<T: Send + 'static>(
        &self,
        deadline: std::time::Instant,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, FleetError> {
        let busy = || {
            FleetError::Unavailable(
                "fleetscope is busy evaluating other queries: retry with backoff".into(),
            )
        };
        let place = tokio::time::timeout_at(deadline.into(), self.queries.clone().acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        tokio::task::spawn_blocking(move || {
            let _place = place;
            work()
        })
        .await
        .map_err(|_| FleetError::Unavailable("evaluating the query failed: retry".into()))
    }

    /// The error of a query whose evaluation ran past its deadline.
    fn too_slow(&self) -> FleetError {
        FleetError::DeadlineExceeded(format!(
            "the query took longer than {:?} to evaluate: narrow it (clusters, namespaces, an indexed field or label), or retry",
            self.query_timeout
        ))
    }

    /// The snapshot a list page reads: the current one, or the one a page continues.
    fn snapshot_for(
        &self,
        after: &Option<(fleetscope_model::Revision, ObjectKey)>,
    ) -> Result<std::sync::Arc<State>, FleetError> {
        match after {
            None => Ok(self.index.snapshot()),
            Some((revision, _)) => self.index.pinned(*revision).ok_or_else(|| {
                FleetError::OutOfRange {
                    message: format!(
                        "the page token expired: its snapshot at revision {revision} is no longer held; start the list again"
                    ),
                    reason: fleetscope_model::fleet::reason::PAGE_SNAPSHOT_RELEASED,
                    oldest: None,
                }
            }),
        }
    }
}

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
        let snapshot = self.index.snapshot();
        let key = ObjectKey::new(&rt.name(), &cluster, &r.namespace, &r.name);
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
                fleet_object(object, r.projection, None),
                policy.as_ref(),
                who,
                &status.labels,
            ),
            cluster: cluster_freshness(&status, Some(&rt.name())),
            revision: snapshot.revision(),
        })
    }

    async fn list(&self, r: ListRequest) -> Result<ListAnswer, FleetError> {
        let snapshot = self.snapshot_for(&r.after)?;
        let (_, mut built) = self.build(&r.query, &r.access, Verb::List)?;
        let deadline = std::time::Instant::now() + self.query_timeout;
        built.query.deadline = Some(deadline);
        let (limit, max_bytes) = (r.limit.max(1), r.max_bytes);
        let (query, after) = (built.query.clone(), r.after.clone());
        let (page, snapshot) = self
            .evaluate(deadline, move || {
                let after = after.as_ref().map(|(_, key)| key);
                let page = snapshot.page_within(&query, after, limit, max_bytes);
                (page, snapshot)
            })
            .await?;
        if built.query.expired() {
            return Err(self.too_slow());
        }
        if page.next.is_some() {
            // The next page reads this snapshot too, for as long as tokens live.
            self.index.pin(snapshot.clone(), &r.access.caller());
        }
        let items = page
            .items
            .iter()
            .map(|o| fleet_object(o, r.projection, None));
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
        Ok(ListAnswer {
            items,
            next: page.next,
            revision: snapshot.revision(),
            remaining: page.remaining,
            clusters: built.freshness,
            partial: built.partial,
        })
    }

    async fn count(&self, r: CountRequest) -> Result<CountAnswer, FleetError> {
        let (_, mut built) = self.build(&r.query, &r.access, Verb::List)?;
        let deadline = std::time::Instant::now() + self.query_timeout;
        built.query.deadline = Some(deadline);
        let snapshot = self.index.snapshot();
        let revision = snapshot.revision();
        let (query, group_by) = (built.query.clone(), r.group_by.clone());
        let counts = self
            .evaluate(deadline, move || snapshot.count(&query, &group_by))
            .await?;
        if built.query.expired() {
            return Err(self.too_slow());
        }
        Ok(CountAnswer {
            groups: counts.groups,
            total: counts.total,
            revision,
            clusters: built.freshness,
            partial: built.partial,
        })
    }

    async fn watch(&self, r: WatchRequest) -> Result<Watch, FleetError> {
        crate::subscriber::start(self, r)
    }

    async fn clusters(
        &self,
        filter: ClusterFilter,
        access: &Access,
    ) -> Result<ClustersAnswer, FleetError> {
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
        let snapshot = self.index.snapshot();
        let labels = self.status.all_labels();
        let policy = access.policy();
        let who = access.subject();
        Ok(self
            .status
            .types()
            .into_values()
            .filter_map(|rt| {
                let name = rt.name();
                // Per cluster, the namespaces the caller may list; a type granted
                // nowhere is not shown at all.
                let granted: BTreeMap<&ClusterName, Namespaces> = labels
                    .iter()
                    .map(|(c, l)| {
                        let here = ClusterRef { name: c, labels: l };
                        (c, policy.namespaces(who, Verb::List, &rt, here))
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
                    resource: rt,
                    clusters: counts.into_iter().collect(),
                })
            })
            .collect())
    }

    async fn store(&self, access: &Access) -> Result<Option<StoreStats>, FleetError> {
        let path = fleetscope_model::access::STORE_ENDPOINT;
        if !access.policy().endpoint(access.subject(), path) {
            return Err(FleetError::PermissionDenied(format!(
                "{} may not read the store's figures: a grant of nonResourceURLs [{path:?}] is needed",
                access.subject()
            )));
        }
        Ok(self.store_stats())
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
    }
}
