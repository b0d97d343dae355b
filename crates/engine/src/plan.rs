//! A query planned against the engine's current state: its resource name resolved
//! against what is collected, its cluster filter evaluated against the live fleet, the
//! freshness of the clusters it draws on, and where its evaluation runs.

use std::collections::BTreeMap;

use fleetscope_index::State;
use fleetscope_model::access::ClusterRef;
use fleetscope_model::fleet::{ClusterFreshness, Query};
use fleetscope_model::{Access, ClusterFilter, FleetError, ObjectKey, ResourceType, Verb};

use crate::Engine;
use crate::status::{ClusterStatus, Freshness};

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
    /// Names and globs of the query that name no cluster the caller may read.
    pub warnings: Vec<String>,
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
        let catalogue = self.status.catalogue();
        // A type the caller is granted nowhere is answered as one not collected.
        let granted = catalogue
            .resolve(name)
            .filter(|rt| self.granted_somewhere(access, rt));
        if let Some(rt) = granted {
            return Ok(rt.clone());
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
        let types: BTreeMap<String, &ResourceType> = catalogue
            .types()
            .filter(|rt| self.granted_somewhere(access, rt))
            .map(|rt| (rt.name(), rt))
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
    pub(crate) fn selected(&self, filter: &ClusterFilter) -> Vec<ClusterStatus> {
        select(self.status.clusters(), filter)
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
        let everyone = self.status.clusters();
        let warnings = if q.clusters.patterns().is_empty() {
            Vec::new()
        } else {
            // Against every cluster the caller may read some of: one it may not read is
            // to it as one that does not exist.
            let reach = reach_in(access, verb, &rt, &everyone);
            let visible: Vec<&fleetscope_model::ClusterName> = everyone
                .iter()
                .map(|c| &c.name)
                .filter(|c| reach.as_ref().is_none_or(|r| r.reaches(c)))
                .collect();
            q.clusters.unmatched(visible.iter().copied())
        };
        let mut clusters = select(everyone, &q.clusters);
        let reach = reach_in(access, verb, &rt, &clusters);
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
            hidden: crate::view::holds_secrets(&rt.name())
                .then(|| crate::view::hidden(access, &self.status)),
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
                warnings,
            },
        ))
    }

    /// Evaluates a query on a thread of its own, within the engine's places for query
    /// evaluation, so the async workers (Watch streams, health) never wait for it; a
    /// query that cannot start before `deadline` is `UNAVAILABLE` (retry).
    pub(crate) async fn evaluate<T: Send + 'static>(
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

    /// Plans `q`, a List or a Count by `access`, and runs `work` on the planned query
    /// on a query thread ([`Engine::evaluate`]) within the engine's query timeout: one
    /// that runs past it is `DEADLINE_EXCEEDED`. Returns what `work` gave, and the plan.
    pub(crate) async fn run_query<T: Send + 'static>(
        &self,
        q: &Query,
        access: &Access,
        work: impl FnOnce(&fleetscope_index::Query) -> T + Send + 'static,
    ) -> Result<(T, Built), FleetError> {
        let (_, mut built) = self.build(q, access, Verb::List)?;
        let deadline = std::time::Instant::now() + self.query_timeout;
        built.query.deadline = Some(deadline);
        let query = built.query.clone();
        let out = self.evaluate(deadline, move || work(&query)).await?;
        if built.query.expired() {
            return Err(self.too_slow());
        }
        Ok((out, built))
    }

    /// The error of a query whose evaluation ran past its deadline.
    pub(crate) fn too_slow(&self) -> FleetError {
        FleetError::DeadlineExceeded(format!(
            "the query took longer than {:?} to evaluate: narrow it (clusters, namespaces, an indexed field or label), or retry",
            self.query_timeout
        ))
    }

    /// The snapshot a list page reads: the current one, or the one a page continues.
    pub(crate) fn snapshot_for(
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

/// The places of `clusters` the caller may `verb` objects of `rt` in (see
/// [`Access::reach`]).
fn reach_in(
    access: &Access,
    verb: Verb,
    rt: &ResourceType,
    clusters: &[ClusterStatus],
) -> Option<fleetscope_model::access::Reach> {
    access.reach(
        verb,
        rt,
        clusters.iter().map(|c| ClusterRef {
            name: &c.name,
            labels: &c.labels,
        }),
    )
}

/// The clusters of `clusters` a filter selects.
fn select(clusters: Vec<ClusterStatus>, filter: &ClusterFilter) -> Vec<ClusterStatus> {
    clusters
        .into_iter()
        .filter(|c| filter.matches(&c.name, &c.labels))
        .collect()
}
