//! The resource types a simulated cluster serves, and the discovery documents that describe them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One resource type, as discovery describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group; empty for the core group.
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Plural resource name, e.g. `pods`.
    pub plural: String,
    /// Singular name, e.g. `pod`.
    pub singular: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: Vec<String>,
    /// kubectl categories (`all`).
    pub categories: Vec<String>,
    /// Field paths selectable beyond `metadata.name` and `metadata.namespace`.
    pub selectable_fields: Vec<String>,
}

impl ResourceDef {
    /// A resource type with no short names, categories or extra selectable fields.
    pub fn new(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: Vec::new(),
            categories: Vec::new(),
            selectable_fields: Vec::new(),
        }
    }

    fn short(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    fn all(mut self) -> Self {
        self.categories = vec!["all".into()];
        self
    }

    fn fields(mut self, fields: &[&str]) -> Self {
        self.selectable_fields = fields.iter().map(|s| s.to_string()).collect();
        self
    }

    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The identity used for lookups and counters: `pods`, `deployments.apps`.
    pub fn id(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether a field selector may name this path.
    pub fn is_selectable(&self, path: &str) -> bool {
        matches!(path, "metadata.name")
            || (path == "metadata.namespace" && self.namespaced)
            || self.selectable_fields.iter().any(|f| f == path)
    }

    /// The `APIResource` entry for discovery.
    fn discovery_entry(&self) -> Value {
        // Services and namespaces offer no deletecollection on a real apiserver.
        let verbs: Vec<&str> =
            if self.group.is_empty() && matches!(self.plural.as_str(), "services" | "namespaces") {
                vec![
                    "create", "delete", "get", "list", "patch", "update", "watch",
                ]
            } else {
                vec![
                    "create",
                    "delete",
                    "deletecollection",
                    "get",
                    "list",
                    "patch",
                    "update",
                    "watch",
                ]
            };
        let mut entry = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        });
        if !self.short_names.is_empty() {
            entry["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            entry["categories"] = json!(self.categories);
        }
        entry
    }

    fn status_entry(&self) -> Value {
        json!({
            "name": format!("{}/status", self.plural),
            "singularName": "",
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["get", "patch", "update"],
        })
    }
}

/// The resource types every simulated cluster starts with: core/v1 namespaces, pods,
/// configmaps, services, nodes, secrets and events; apps/v1 deployments and replicasets;
/// rbac.authorization.k8s.io/v1 roles, cluster roles and their bindings;
/// coordination.k8s.io/v1 leases; and
/// `crontabs.stable.example.com`, a custom resource, to prove nothing is hard-wired.
pub fn builtin() -> Vec<ResourceDef> {
    vec![
        ResourceDef::new("", "v1", "namespaces", "Namespace", false)
            .short(&["ns"])
            .fields(&["status.phase"]),
        ResourceDef::new("", "v1", "pods", "Pod", true)
            .short(&["po"])
            .all()
            .fields(&[
                "status.phase",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.podIP",
                "status.nominatedNodeName",
            ]),
        ResourceDef::new("", "v1", "configmaps", "ConfigMap", true).short(&["cm"]),
        ResourceDef::new("", "v1", "services", "Service", true)
            .short(&["svc"])
            .all(),
        ResourceDef::new("", "v1", "nodes", "Node", false)
            .short(&["no"])
            .fields(&["spec.unschedulable"]),
        ResourceDef::new("", "v1", "secrets", "Secret", true).fields(&["type"]),
        ResourceDef::new("", "v1", "events", "Event", true)
            .short(&["ev"])
            .fields(&[
                "involvedObject.kind",
                "involvedObject.name",
                "involvedObject.namespace",
                "involvedObject.uid",
                "reason",
                "type",
            ]),
        ResourceDef::new("apps", "v1", "deployments", "Deployment", true)
            .short(&["deploy"])
            .all(),
        ResourceDef::new("apps", "v1", "replicasets", "ReplicaSet", true)
            .short(&["rs"])
            .all(),
        ResourceDef::new("rbac.authorization.k8s.io", "v1", "roles", "Role", true),
        ResourceDef::new(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
        ),
        ResourceDef::new(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
        ),
        ResourceDef::new(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
        ),
        ResourceDef::new("coordination.k8s.io", "v1", "leases", "Lease", true),
        ResourceDef::new("stable.example.com", "v1", "crontabs", "CronTab", true).short(&["ct"]),
    ]
}

/// `GET /api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `GET /api/v1` and `GET /apis/{group}/{version}`; `None` when nothing is served there.
pub fn resource_list<'a>(
    defs: impl Iterator<Item = &'a ResourceDef>,
    group: &str,
    version: &str,
) -> Option<Value> {
    let mut resources = Vec::new();
    for def in defs.filter(|d| d.group == group && d.version == version) {
        resources.push(def.discovery_entry());
        if matches!(
            def.plural.as_str(),
            "pods" | "deployments" | "replicasets" | "namespaces" | "nodes" | "services"
        ) {
            resources.push(def.status_entry());
        }
    }
    if resources.is_empty() {
        return None;
    }
    resources.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Some(if group.is_empty() {
        // The core group's list carries no apiVersion, as captured.
        json!({"kind": "APIResourceList", "groupVersion": version, "resources": resources})
    } else {
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{group}/{version}"), "resources": resources})
    })
}

fn group_entry(name: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
}

fn groups<'a>(defs: impl Iterator<Item = &'a ResourceDef>) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for def in defs.filter(|d| !d.group.is_empty()) {
        let versions = groups.entry(def.group.clone()).or_default();
        if !versions.contains(&def.version) {
            versions.push(def.version.clone());
        }
    }
    groups
}

/// `GET /apis`.
pub fn api_group_list<'a>(defs: impl Iterator<Item = &'a ResourceDef>) -> Value {
    let groups: Vec<Value> = groups(defs)
        .iter()
        .map(|(name, versions)| group_entry(name, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`; `None` for an unknown group.
pub fn api_group<'a>(defs: impl Iterator<Item = &'a ResourceDef>, group: &str) -> Option<Value> {
    let groups = groups(defs);
    let versions = groups.get(group)?;
    let mut entry = group_entry(group, versions);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_the_group() {
        let defs = builtin();
        let ids: Vec<String> = defs.iter().map(ResourceDef::id).collect();
        assert!(ids.contains(&"pods".to_string()));
        assert!(ids.contains(&"deployments.apps".to_string()));
        assert!(ids.contains(&"crontabs.stable.example.com".to_string()));
    }

    #[test]
    fn core_list_has_no_api_version_but_groups_do() {
        let defs = builtin();
        let core = resource_list(defs.iter(), "", "v1").unwrap();
        assert!(core.get("apiVersion").is_none());
        let apps = resource_list(defs.iter(), "apps", "v1").unwrap();
        assert_eq!(apps["apiVersion"], "v1");
        assert!(resource_list(defs.iter(), "nope", "v1").is_none());
    }
}
