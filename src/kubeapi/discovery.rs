//! Discovery: `/version`, the groups and their versions, a group version's resources
//! (the collected types the caller may see, each with the verbs `get`, `list` and
//! `watch` and its short names), and aggregated discovery (`apidiscovery.k8s.io`
//! `v2`/`v2beta1`, one answer for every group, which kubectl asks for first).

use std::collections::BTreeMap;

use fleetscope_model::fleet::ResourceTypeInfo;
use serde_json::{Value, json};

/// The verbs served for every type: reads only.
const VERBS: [&str; 3] = ["get", "list", "watch"];

/// fleetscope's version as `/version` answers.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": format!("v1.33.0+fleetscope-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": option_env!("FLEETSCOPE_COMMIT").unwrap_or(""),
        "gitTreeState": "clean",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// The groups of `types`, as `/apis` lists them (the core group is `/api`'s).
pub fn groups(types: &[ResourceTypeInfo]) -> Value {
    let mut by_group: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for t in types
        .iter()
        .map(|t| &t.resource)
        .filter(|t| !t.group.is_empty())
    {
        let versions = by_group.entry(&t.group).or_default();
        if !versions.contains(&t.version.as_str()) {
            versions.push(&t.version);
        }
    }
    let groups: Vec<Value> = by_group
        .into_iter()
        .map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The resources of `group/version` among `types`.
pub fn resources(types: &[ResourceTypeInfo], group: &str, version: &str) -> Value {
    let resources: Vec<Value> = types
        .iter()
        .filter(|t| t.resource.group == group && t.resource.version == version)
        .map(|info| {
            let t = &info.resource;
            json!({
                "name": t.plural, "singularName": t.kind.to_lowercase(), "namespaced": t.namespaced,
                "kind": t.kind, "verbs": VERBS, "shortNames": info.short_names,
            })
        })
        .collect();
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

/// The content type of an aggregated discovery answer at `version`.
pub fn aggregated_content_type(version: &str) -> &'static str {
    match version {
        "v2beta1" => "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        _ => "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    }
}

/// Aggregated discovery at `version` of the core group (`/api`, when `core`) or of
/// the named groups (`/apis`): each group with its versions and their resources.
pub fn aggregated(types: &[ResourceTypeInfo], core: bool, version: &str) -> Value {
    let mut by_group: BTreeMap<&str, BTreeMap<&str, Vec<Value>>> = BTreeMap::new();
    for info in types.iter().filter(|t| t.resource.group.is_empty() == core) {
        let t = &info.resource;
        by_group
            .entry(&t.group)
            .or_default()
            .entry(&t.version)
            .or_default()
            .push(json!({
                "resource": t.plural,
                "responseKind": {"group": t.group, "version": t.version, "kind": t.kind},
                "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": t.kind.to_lowercase(),
                "verbs": VERBS,
                "shortNames": info.short_names,
            }));
    }
    let items: Vec<Value> = by_group
        .into_iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|(v, resources)| json!({"version": v, "resources": resources, "freshness": "Current"}))
                .collect();
            json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetscope_model::ResourceType;

    #[test]
    fn discovery_lists_groups_and_their_resources_with_the_verbs_served() {
        let info = |resource, short: &str| ResourceTypeInfo {
            resource,
            short_names: vec![short.to_string()],
            clusters: Vec::new(),
        };
        let types = [
            info(ResourceType::new("", "v1", "pods", "Pod", true), "po"),
            info(
                ResourceType::new("apps", "v1", "deployments", "Deployment", true),
                "deploy",
            ),
            info(
                ResourceType::new("apps", "v1", "replicasets", "ReplicaSet", true),
                "rs",
            ),
        ];
        let g = groups(&types);
        assert_eq!(g["groups"].as_array().unwrap().len(), 1);
        assert_eq!(
            g["groups"][0]["preferredVersion"]["groupVersion"],
            "apps/v1"
        );
        let r = resources(&types, "apps", "v1");
        assert_eq!(r["groupVersion"], "apps/v1");
        assert_eq!(r["resources"].as_array().unwrap().len(), 2);
        assert_eq!(r["resources"][0]["verbs"], json!(["get", "list", "watch"]));
        assert_eq!(r["resources"][0]["shortNames"], json!(["deploy"]));
        assert_eq!(
            resources(&types, "", "v1")["resources"][0]["namespaced"],
            true
        );
    }

    #[test]
    fn aggregated_discovery_holds_every_group_s_resources_in_one_answer() {
        let info = |resource| ResourceTypeInfo {
            resource,
            short_names: vec!["x".to_string()],
            clusters: Vec::new(),
        };
        let types = [
            info(ResourceType::new("", "v1", "nodes", "Node", false)),
            info(ResourceType::new(
                "apps",
                "v1",
                "deployments",
                "Deployment",
                true,
            )),
        ];
        let core = aggregated(&types, true, "v2");
        assert_eq!(core["apiVersion"], "apidiscovery.k8s.io/v2");
        assert_eq!(core["items"].as_array().unwrap().len(), 1);
        assert_eq!(core["items"][0]["metadata"]["name"], "");
        let node = &core["items"][0]["versions"][0]["resources"][0];
        assert_eq!(
            (
                &node["resource"],
                &node["scope"],
                &node["responseKind"]["kind"]
            ),
            (&json!("nodes"), &json!("Cluster"), &json!("Node"))
        );
        let apis = aggregated(&types, false, "v2beta1");
        assert_eq!(apis["items"][0]["metadata"]["name"], "apps");
        assert_eq!(apis["items"][0]["versions"][0]["version"], "v1");
        assert_eq!(
            apis["items"][0]["versions"][0]["resources"][0]["verbs"],
            json!(["get", "list", "watch"])
        );
    }
}
