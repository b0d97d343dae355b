//! What a Watch's subscriber may see: the clusters its filter selects (by the labels
//! they have, or had), what the policy in force grants it in each, and how each
//! object is shown to it. Every event is checked against the policy in force: when
//! a new policy takes away (or grants) some of what the subscriber watches, the
//! objects leaving its grant are `Deleted` for it, and those entering it `Added`, at
//! the revision it has reached.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use fleetscope_index::{Index, State};
use fleetscope_model::access::{ClusterRef, Namespaces, Policy};
use fleetscope_model::fleet::{FleetObject, WatchEvent};
use fleetscope_model::{
    Access, ClusterFilter, ClusterName, EventType, FleetError, ResourceType, Revision, Verb,
};

use super::evaluate::Evaluator;
use super::outlet::Outlet;
use crate::status::StatusTable;
use crate::view::{fleet_object, shown};

/// A cluster's labels, by name.
type Labels = BTreeMap<String, String>;

/// Who watches, what it may see, and the policy its events are checked against.
pub(super) struct Grant {
    /// Who watches, and the policies that follow the one in force.
    access: Access,
    /// The policy this subscriber's events are checked against now.
    policy: Arc<dyn Policy>,
    /// The watched type, as policies name it.
    resource: ResourceType,
    /// The clusters the Watch asked for.
    filter: ClusterFilter,
    /// Labels of the clusters seen, kept after a cluster leaves (its DELETEDs are
    /// matched with the labels it had).
    labels: BTreeMap<ClusterName, Labels>,
    /// Whether the filter selects each cluster seen, decided once per cluster (its
    /// labels do not change while it is in the fleet; a status change decides again).
    selected: HashMap<ClusterName, bool>,
    /// What `policy` grants in each cluster seen, decided once per cluster.
    scopes: HashMap<ClusterName, Namespaces>,
    /// A policy that replaces `policy` once the subscriber reaches the snapshot taken
    /// when it came (every event up to it is checked against the old one).
    switch: Option<(Arc<dyn Policy>, Arc<State>)>,
    status: StatusTable,
}

impl Grant {
    /// `access`'s grant of `resource` in the clusters `filter` selects, checked
    /// against `policy` (the one in force at the start) until another comes.
    pub(super) fn new(
        access: Access,
        policy: Arc<dyn Policy>,
        resource: ResourceType,
        filter: ClusterFilter,
        status: StatusTable,
    ) -> Self {
        Self {
            access,
            policy,
            resource,
            filter,
            labels: status.all_labels(),
            selected: HashMap::new(),
            scopes: HashMap::new(),
            switch: None,
            status,
        }
    }

    /// The watched type.
    pub(super) fn resource(&self) -> &ResourceType {
        &self.resource
    }

    /// Whether the filter selects a cluster, by the labels it has (or had).
    pub(super) fn selects(&mut self, cluster: &ClusterName) -> bool {
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

    /// Whether the subscriber is shown objects of `namespace` in `cluster`: the
    /// filter selects the cluster and the policy in force grants the namespace.
    pub(super) fn admits(&mut self, cluster: &ClusterName, namespace: &str) -> bool {
        if !self.selects(cluster) {
            return false;
        }
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
    pub(super) fn show(&self, object: FleetObject) -> FleetObject {
        let none = BTreeMap::new();
        let labels = self.labels.get(&object.key.cluster).unwrap_or(&none);
        shown(object, self.policy.as_ref(), self.access.subject(), labels)
    }

    /// Decides a cluster anew after its status changed (added again, it may have
    /// other labels); whether the subscriber is told of it (selected, and granted
    /// something there).
    pub(super) fn cluster_changed(&mut self, cluster: &ClusterName) -> bool {
        if let Some(labels) = self.status.labels(cluster) {
            self.labels.insert(cluster.clone(), labels);
        }
        self.selected.remove(cluster);
        self.scopes.remove(cluster);
        let policy = self.policy.clone();
        self.selects(cluster) && !self.scope_under(policy.as_ref(), cluster).is_none()
    }

    /// Resolves when a new policy comes into force.
    pub(super) async fn policy_changed(&mut self) {
        self.access.changed().await;
    }

    /// Takes the policy now in force, to be put in force for this subscriber once it
    /// reaches what `index` holds now.
    pub(super) fn take_policy(&mut self, index: &Index) {
        self.switch = Some((self.access.policy_seen(), index.snapshot()));
    }

    /// Puts a pending policy in force once everything up to its snapshot has been
    /// checked against the old one. False once the subscriber is gone.
    pub(super) async fn maybe_switch(
        &mut self,
        reached: Revision,
        eval: &Evaluator,
        outlet: &Outlet,
    ) -> bool {
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
        self.switch_policy(policy, &snapshot, eval, outlet).await
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

    /// Puts a new policy in force, at the revision of `snapshot`, which the subscriber
    /// has reached: what it grants that the old one did not is `Added`, what it takes
    /// away `Deleted`, at that revision. False once the subscriber is gone.
    async fn switch_policy(
        &mut self,
        new: Arc<dyn Policy>,
        snapshot: &State,
        eval: &Evaluator,
        outlet: &Outlet,
    ) -> bool {
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
            return self.still_granted(outlet).await;
        }
        let mut changed = false;
        for o in snapshot.matching(&eval.query, None) {
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
            let object = self.show(fleet_object(o, eval.projection));
            if !outlet
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
        self.still_granted(outlet).await
    }

    /// Whether the policy in force still grants the subscriber this Watch in some
    /// cluster of the fleet; if not, it is ended with `PERMISSION_DENIED` rather than
    /// left streaming bookmarks that reveal the fleet's revision.
    async fn still_granted(&mut self, outlet: &Outlet) -> bool {
        let (policy, subject, resource) = (&self.policy, self.access.subject(), &self.resource);
        let granted = self.status.any_cluster(|name, labels| {
            !policy
                .namespaces(subject, Verb::Watch, resource, ClusterRef { name, labels })
                .is_none()
        });
        if !granted {
            tracing::info!(subscriber = %subject, resource = %resource.name(), "a new policy grants a Watch nothing: ended");
            outlet
                .end(FleetError::PermissionDenied(format!(
                    "the policy in force no longer grants {subject} a Watch of {} in any cluster",
                    resource.name()
                )))
                .await;
        }
        granted
    }
}
