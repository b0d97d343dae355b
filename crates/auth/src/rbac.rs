//! Delegated authorization: each cluster's own RBAC, evaluated for the caller as
//! Kubernetes evaluates it, so a user sees through fleetscope what
//! `kubectl auth can-i VERB RESOURCE -n NS --context CLUSTER` allows. fleetscope
//! collects every cluster's Roles, ClusterRoles, RoleBindings and ClusterRoleBindings
//! like any other type, follows them through the `Fleet` seam's own Watch (so this
//! works unchanged over any implementation of the seam), and compiles them again
//! whenever one changes: a binding removed in a cluster takes its objects out of
//! running Watch streams at once.
//!
//! Rules are matched on API group, resource and verb (`*` for any). A rule naming
//! `resourceNames` grants only those objects in Kubernetes; fleetscope grants by
//! namespace, so such a rule grants nothing here (never more than Kubernetes would).
//! A RoleBinding grants in its namespace only; a ClusterRoleBinding everywhere,
//! cluster-scoped objects included. A user may read Secrets' values where RBAC lets
//! them `get` Secrets.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fleetscope_model::access::{ClusterRef, Namespaces, Subject};
use fleetscope_model::fleet::{FleetObject, Query, WatchEvent, WatchRequest};
use fleetscope_model::{Access, ClusterName, EventType, Fleet, ObjectKey, ResourceType};
use futures::StreamExt as _;
use serde::Deserialize;

/// The RBAC types, by the names fleetscope collects them under.
pub const TYPES: [&str; 4] = [
    "clusterroles.rbac.authorization.k8s.io",
    "clusterrolebindings.rbac.authorization.k8s.io",
    "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
];

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    #[serde(default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

impl Rule {
    /// Whether the rule lets anyone read objects of some type here: `get`, `list` or
    /// `watch` on resources (not only named objects, not only `nonResourceURLs` or
    /// self-reviews such as the bindings every authenticated user has).
    fn reads_objects(&self) -> bool {
        const READS: [&str; 4] = ["get", "list", "watch", "*"];
        const REVIEWS: [&str; 3] = [
            "selfsubjectaccessreviews",
            "selfsubjectrulesreviews",
            "selfsubjectreviews",
        ];
        self.resource_names.is_empty()
            && self.verbs.iter().any(|v| READS.contains(&v.as_str()))
            && self
                .resources
                .iter()
                .any(|r| !REVIEWS.contains(&r.as_str()))
    }

    fn allows(&self, verb: &str, rt: &ResourceType) -> bool {
        let any = |v: &[String], x: &str| v.iter().any(|i| i == "*" || i == x);
        self.resource_names.is_empty()
            && any(&self.verbs, verb)
            && any(&self.api_groups, &rt.group)
            && any(&self.resources, &rt.plural)
    }
}

#[derive(Debug, Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Debug, Deserialize)]
struct Role {
    metadata: Meta,
    #[serde(default)]
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RoleRef {
    kind: String,
    name: String,
}

#[derive(Debug, Deserialize)]
struct BindingSubject {
    kind: String,
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Binding {
    metadata: Meta,
    role_ref: RoleRef,
    #[serde(default)]
    subjects: Vec<BindingSubject>,
}

/// Who a binding binds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bound {
    User(String),
    Group(String),
}

impl Bound {
    fn of(s: &BindingSubject, binding_namespace: &str) -> Option<Bound> {
        match s.kind.as_str() {
            "User" => Some(Bound::User(s.name.clone())),
            "Group" => Some(Bound::Group(s.name.clone())),
            "ServiceAccount" => {
                let ns = if s.namespace.is_empty() {
                    binding_namespace
                } else {
                    &s.namespace
                };
                Some(Bound::User(format!(
                    "system:serviceaccount:{ns}:{}",
                    s.name
                )))
            }
            _ => None,
        }
    }

    fn is(&self, who: &Subject) -> bool {
        match self {
            Bound::User(u) => *u == who.user,
            Bound::Group(g) => who.groups.iter().any(|x| x == g),
        }
    }
}

/// One binding with the rules of the role it refers to.
#[derive(Debug, Clone)]
struct Grant {
    subjects: Vec<Bound>,
    rules: Arc<Vec<Rule>>,
}

impl Grant {
    fn is_for(&self, who: &Subject) -> bool {
        self.subjects.iter().any(|s| s.is(who))
    }

    fn allows(&self, who: &Subject, verb: &str, rt: &ResourceType) -> bool {
        self.is_for(who) && self.rules.iter().any(|r| r.allows(verb, rt))
    }
}

/// One cluster's RBAC, compiled.
#[derive(Debug, Clone, Default)]
struct ClusterRbac {
    /// ClusterRoleBindings: everywhere.
    everywhere: Vec<Grant>,
    /// RoleBindings, by namespace.
    namespaced: BTreeMap<String, Vec<Grant>>,
}

/// Every cluster's RBAC, as compiled from the objects held at one revision.
#[derive(Debug, Clone, Default)]
pub struct Rbac {
    clusters: HashMap<ClusterName, ClusterRbac>,
}

fn parse<T: serde::de::DeserializeOwned>(json: &str, what: &str) -> Option<T> {
    match serde_json::from_str(json) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, what, "an RBAC object cannot be read: it grants nothing");
            None
        }
    }
}

impl Rbac {
    /// Compiles the RBAC objects `held`.
    pub fn compile(held: &Held) -> Self {
        let objects = |resource: &str| {
            held.0
                .iter()
                .filter(|(key, _)| &*key.resource == resource)
                .map(|(key, json)| (key.cluster.clone(), json.clone()))
                .collect::<Vec<_>>()
        };
        let mut cluster_roles: HashMap<(ClusterName, String), Arc<Vec<Rule>>> = HashMap::new();
        for (c, json) in objects(TYPES[0]) {
            if let Some(r) = parse::<Role>(&json, "ClusterRole") {
                cluster_roles.insert((c, r.metadata.name), Arc::new(r.rules));
            }
        }
        let mut roles: HashMap<(ClusterName, String, String), Arc<Vec<Rule>>> = HashMap::new();
        for (c, json) in objects(TYPES[2]) {
            if let Some(r) = parse::<Role>(&json, "Role") {
                roles.insert(
                    (c, r.metadata.namespace, r.metadata.name),
                    Arc::new(r.rules),
                );
            }
        }
        let mut out = Rbac::default();
        let grant = |b: &Binding, rules: Arc<Vec<Rule>>| Grant {
            subjects: b
                .subjects
                .iter()
                .filter_map(|s| Bound::of(s, &b.metadata.namespace))
                .collect(),
            rules,
        };
        for (c, json) in objects(TYPES[1]) {
            let Some(b) = parse::<Binding>(&json, "ClusterRoleBinding") else {
                continue;
            };
            if b.role_ref.kind != "ClusterRole" {
                continue;
            }
            if let Some(rules) = cluster_roles.get(&(c.clone(), b.role_ref.name.clone())) {
                let g = grant(&b, rules.clone());
                out.clusters.entry(c).or_default().everywhere.push(g);
            }
        }
        for (c, json) in objects(TYPES[3]) {
            let Some(b) = parse::<Binding>(&json, "RoleBinding") else {
                continue;
            };
            let ns = b.metadata.namespace.clone();
            let rules = match b.role_ref.kind.as_str() {
                "ClusterRole" => cluster_roles.get(&(c.clone(), b.role_ref.name.clone())),
                "Role" => roles.get(&(c.clone(), ns.clone(), b.role_ref.name.clone())),
                _ => None,
            };
            if let Some(rules) = rules {
                let g = grant(&b, rules.clone());
                out.clusters
                    .entry(c)
                    .or_default()
                    .namespaced
                    .entry(ns)
                    .or_default()
                    .push(g);
            }
        }
        out
    }

    /// Where in `cluster` the subject may `verb` objects of `resource`.
    pub fn namespaces(
        &self,
        who: &Subject,
        verb: &str,
        resource: &ResourceType,
        cluster: ClusterRef<'_>,
    ) -> Namespaces {
        let Some(c) = self.clusters.get(cluster.name) else {
            return Namespaces::None;
        };
        if c.everywhere.iter().any(|g| g.allows(who, verb, resource)) {
            return Namespaces::All;
        }
        if !resource.namespaced {
            return Namespaces::None;
        }
        let patterns: Vec<glob::Pattern> = c
            .namespaced
            .iter()
            .filter(|(_, grants)| grants.iter().any(|g| g.allows(who, verb, resource)))
            .filter_map(|(ns, _)| glob::Pattern::new(&glob::Pattern::escape(ns)).ok())
            .collect();
        if patterns.is_empty() {
            Namespaces::None
        } else {
            Namespaces::Only {
                patterns,
                cluster_scoped: false,
            }
        }
    }

    /// Whether the subject may `get` Secrets in `namespace` of `cluster`.
    pub fn secret_data(&self, who: &Subject, cluster: ClusterRef<'_>, namespace: &str) -> bool {
        let secrets = ResourceType::new("", "v1", "secrets", "Secret", true);
        self.namespaces(who, "get", &secrets, cluster)
            .allows(namespace)
    }

    /// Whether the subject may read objects of some type in `cluster`: a binding
    /// that lets it only discover APIs or review itself (as every authenticated user
    /// may) does not make a cluster visible.
    pub fn sees_cluster(&self, who: &Subject, cluster: ClusterRef<'_>) -> bool {
        let reads = |g: &Grant| g.is_for(who) && g.rules.iter().any(Rule::reads_objects);
        self.clusters.get(cluster.name).is_some_and(|c| {
            c.everywhere.iter().any(reads) || c.namespaced.values().flatten().any(reads)
        })
    }
}

/// The fleet's RBAC objects, by key: their JSON.
#[derive(Debug, Default, Clone)]
pub struct Held(BTreeMap<ObjectKey, fleetscope_model::Json>);

impl Held {
    /// Records a change to one of them.
    fn apply(&mut self, kind: EventType, object: FleetObject) {
        match kind {
            EventType::Deleted => {
                self.0.remove(&object.key);
            }
            EventType::Added | EventType::Modified => {
                self.0.insert(object.key, object.json);
            }
        }
    }

    /// Forgets one resource type's objects of a cluster (its stream was reset: they
    /// come again).
    fn forget(&mut self, resource: &str, cluster: &fleetscope_model::ClusterName) {
        self.0
            .retain(|k, _| !(&*k.resource == resource && k.cluster == *cluster));
    }
}

impl<J: Into<fleetscope_model::Json>> FromIterator<(ObjectKey, J)> for Held {
    fn from_iter<T: IntoIterator<Item = (ObjectKey, J)>>(iter: T) -> Self {
        Self(iter.into_iter().map(|(k, j)| (k, j.into())).collect())
    }
}

/// How long to wait before watching again when the fleet cannot be watched yet (it
/// is starting) or a Watch ended.
const RETRY: Duration = Duration::from_millis(100);

/// Follows the fleet's RBAC objects through the seam's own Watch (so it works the
/// same behind a router as over one engine), compiling them once all are known and
/// again whenever one changes (at most once per `settle`), handing each compilation
/// to `publish`, until `stop`.
pub async fn follow<F: Fleet>(
    fleet: Arc<F>,
    publish: impl Fn(Arc<Rbac>) + Send + 'static,
    settle: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        // One Watch per type, each from its current objects.
        let mut watches = Vec::new();
        for resource in TYPES {
            let request = WatchRequest {
                query: Query {
                    resource: resource.to_string(),
                    ..Default::default()
                },
                initial: true,
                // The compiled grants are fleetscope's own reading of every cluster.
                ..WatchRequest::for_caller(Access::everything())
            };
            match fleet.watch(request).await {
                Ok(w) => watches.push(w),
                Err(e) => {
                    tracing::debug!(error = %e, resource, "RBAC objects cannot be watched yet: retrying");
                    break;
                }
            }
        }
        if watches.len() == TYPES.len() {
            let mut events = futures::stream::select_all(
                watches
                    .into_iter()
                    .enumerate()
                    .map(|(i, w)| w.map(move |e| (i, e))),
            );
            let mut held = Held::default();
            let mut initial = [false; TYPES.len()];
            let mut due: Option<tokio::time::Instant> = None;
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => return,
                    next = events.next() => next,
                    _ = async {
                        match due {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        due = None;
                        publish(Arc::new(Rbac::compile(&held)));
                        continue;
                    }
                };
                match next {
                    Some((_, Ok(WatchEvent::Object { kind, object, .. }))) => {
                        held.apply(kind, object);
                        // Changes come in bursts (a cluster listed, a chart applied).
                        if initial.iter().all(|d| *d) && due.is_none() {
                            due = Some(tokio::time::Instant::now() + settle);
                        }
                    }
                    Some((i, Ok(WatchEvent::InitialEventsEnd { .. }))) => {
                        initial[i] = true;
                        if initial.iter().all(|d| *d) {
                            publish(Arc::new(Rbac::compile(&held)));
                        }
                    }
                    Some((_, Ok(WatchEvent::ClusterStatus { .. }))) => {}
                    // Through a router, a cluster's stream that could not continue comes
                    // again whole.
                    Some((i, Ok(WatchEvent::Reset { cluster }))) => {
                        held.forget(TYPES[i], &cluster);
                    }
                    Some((
                        _,
                        Ok(
                            WatchEvent::Positions { .. }
                            | WatchEvent::ResetEnd { .. }
                            | WatchEvent::Bookmark { .. },
                        ),
                    )) => {}
                    // Ended (fell behind, the log moved on): from the present again.
                    Some((_, Err(e))) => {
                        tracing::debug!(error = %e, "an RBAC Watch ended: watching again");
                        break;
                    }
                    None => break,
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn object(
        cluster: &str,
        resource: &str,
        namespace: &str,
        body: serde_json::Value,
    ) -> (ObjectKey, String) {
        let name = body["metadata"]["name"].as_str().unwrap().to_string();
        let mut body = body;
        if !namespace.is_empty() {
            body["metadata"]["namespace"] = json!(namespace);
        }
        (
            ObjectKey::new(resource, &ClusterName::from(cluster), namespace, &name),
            body.to_string(),
        )
    }

    fn who(user: &str, groups: &[&str]) -> Subject {
        Subject {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn at<'a>(name: &'a ClusterName, labels: &'a BTreeMap<String, String>) -> ClusterRef<'a> {
        ClusterRef { name, labels }
    }

    #[test]
    fn bindings_grant_what_kubernetes_rbac_grants() {
        let reader = json!({"metadata": {"name": "cm-reader"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "watch"]}]});
        let held: Held = [
            object("a", TYPES[0], "", reader.clone()),
            object("a", TYPES[0], "", json!({"metadata": {"name": "named"}, "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"], "resourceNames": ["one"]}]})),
            object("a", TYPES[2], "team-1", json!({"metadata": {"name": "pods"}, "rules": [
                {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["list"]}]})),
            object("a", TYPES[3], "team-0", json!({"metadata": {"name": "erin-cm"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-reader"},
                "subjects": [{"kind": "User", "name": "erin"}, {"kind": "ServiceAccount", "name": "bot"}]})),
            object("a", TYPES[3], "team-1", json!({"metadata": {"name": "devs-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
                "subjects": [{"kind": "Group", "name": "devs"}]})),
            object("a", TYPES[1], "", json!({"metadata": {"name": "erin-named"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "named"},
                "subjects": [{"kind": "User", "name": "erin"}]})),
            object("a", TYPES[1], "", json!({"metadata": {"name": "broken"}, "roleRef": 7})),
            object("b", TYPES[0], "", reader),
            // What every authenticated user is bound to: discovery and self-reviews.
            object("b", TYPES[0], "", json!({"metadata": {"name": "system:discovery"}, "rules": [
                {"nonResourceURLs": ["/api", "/apis", "/version"], "verbs": ["get"]}]})),
            object("b", TYPES[0], "", json!({"metadata": {"name": "system:basic-user"}, "rules": [
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]}]})),
            object("b", TYPES[1], "", json!({"metadata": {"name": "system:discovery"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
                "subjects": [{"kind": "Group", "name": "system:authenticated"}]})),
            object("b", TYPES[1], "", json!({"metadata": {"name": "system:basic-user"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:basic-user"},
                "subjects": [{"kind": "Group", "name": "system:authenticated"}]})),
            object("b", TYPES[1], "", json!({"metadata": {"name": "devs-cm"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-reader"},
                "subjects": [{"kind": "Group", "name": "devs"}]})),
        ]
        .into_iter()
        .collect();
        let rbac = Rbac::compile(&held);
        let none = BTreeMap::new();
        let (a, b) = (ClusterName::from("a"), ClusterName::from("b"));
        let cm = ResourceType::new("", "v1", "configmaps", "ConfigMap", true);
        let pods = ResourceType::new("", "v1", "pods", "Pod", true);
        let nodes = ResourceType::new("", "v1", "nodes", "Node", false);
        let erin = who("erin", &["system:authenticated"]);
        let dev = who("dan", &["devs"]);
        // A RoleBinding grants in its namespace only.
        let n = rbac.namespaces(&erin, "list", &cm, at(&a, &none));
        assert!(n.allows("team-0") && !n.allows("team-1") && !n.allows(""));
        assert!(
            rbac.namespaces(&erin, "delete", &cm, at(&a, &none))
                .is_none()
        );
        // A rule with resourceNames grants nothing here.
        assert!(
            rbac.namespaces(&erin, "list", &pods, at(&a, &none))
                .is_none()
        );
        // A Role, bound to a group.
        let n = rbac.namespaces(&dev, "list", &pods, at(&a, &none));
        assert!(n.allows("team-1") && !n.allows("team-0"));
        assert!(
            rbac.namespaces(&dev, "watch", &pods, at(&a, &none))
                .is_none()
        );
        // A RoleBinding never grants cluster-scoped objects.
        assert!(
            rbac.namespaces(&dev, "list", &nodes, at(&a, &none))
                .is_none()
        );
        // A ClusterRoleBinding grants everywhere, in its own cluster only.
        assert!(matches!(
            rbac.namespaces(&dev, "list", &cm, at(&b, &none)),
            Namespaces::All
        ));
        assert!(rbac.namespaces(&erin, "list", &cm, at(&b, &none)).is_none());
        // A service account is its user name.
        let bot = who("system:serviceaccount:team-0:bot", &[]);
        assert!(
            rbac.namespaces(&bot, "get", &cm, at(&a, &none))
                .allows("team-0")
        );
        // Secrets' values: where the caller may get Secrets.
        assert!(rbac.secret_data(&erin, at(&a, &none), "team-0"));
        assert!(!rbac.secret_data(&erin, at(&a, &none), "team-1"));
        assert!(rbac.sees_cluster(&erin, at(&a, &none)));
        // Bound in b only to what every authenticated user is: b does not exist for her.
        assert!(!rbac.sees_cluster(&erin, at(&b, &none)));
        assert!(!rbac.sees_cluster(&who("eve", &[]), at(&a, &none)));
    }
}
