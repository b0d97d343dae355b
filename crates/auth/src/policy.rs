//! The policy file: grants by subject (users and groups) naming clusters (names,
//! globs, a cluster label selector), namespaces (names, globs, and cluster-scoped
//! objects only when said), resource types and verbs. Whatever no grant allows is
//! denied. Evaluated for every request and every Watch event.
//!
//! ```yaml
//! grants:
//!   - name: team-a reads its namespaces in production   # for people; optional
//!     subjects: [{group: team-a}, {user: "spiffe://example.org/ns/ci/sa/deployer"}]
//!     clusters: ["prod-*"]            # names or globs; and/or
//!     clusterSelector: "env=prod"     # a selector over cluster labels
//!     namespaces: ["team-a", "team-a-*"]
//!     clusterScoped: false            # cluster-scoped objects (nodes, namespaces)
//!     resources: ["pods", "deployments.apps", "*.batch"]
//!     verbs: [get, list, watch]       # or ["*"]
//!     secretData: false               # Secrets' values shown (else redacted)
//!   - name: Prometheus scrapes fleetscope
//!     subjects: [{user: prometheus}]
//!     nonResourceURLs: ["/metrics"]   # and "/store" (GetStore), or "*"
//!     verbs: [get]
//! ```
//!
//! A grant names either resource types (with clusters and namespaces) or
//! `nonResourceURLs`, fleetscope's own endpoints, as Kubernetes RBAC rules do: `/metrics`
//! shows every cluster's name and figures, and `/store` the store's, so each needs a
//! grant of its own.

use std::path::Path;

use fleetscope_model::access::{ClusterRef, Namespaces, Policy, Subject};
use fleetscope_model::{LabelSelector, ResourceType, Verb};
use serde::Deserialize;

use fleetscope_model::yaml::{FileError, document, text_of};

/// Every key a policy file knows, for close-match suggestions.
const KEYS: &[&str] = &[
    "grants",
    "name",
    "subjects",
    "user",
    "group",
    "clusters",
    "clusterSelector",
    "namespaces",
    "clusterScoped",
    "resources",
    "verbs",
    "secretData",
    "nonResourceURLs",
];

/// The endpoints a grant's `nonResourceURLs` may name.
const ENDPOINTS: &[&str] = &[
    fleetscope_model::access::METRICS_ENDPOINT,
    fleetscope_model::access::STORE_ENDPOINT,
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyFile {
    grants: Vec<GrantFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GrantFile {
    #[serde(default)]
    name: String,
    subjects: Vec<SubjectFile>,
    #[serde(default)]
    clusters: Vec<String>,
    #[serde(default)]
    cluster_selector: String,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    cluster_scoped: bool,
    #[serde(default)]
    resources: Vec<String>,
    verbs: Vec<String>,
    #[serde(default)]
    secret_data: bool,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubjectFile {
    user: Option<String>,
    group: Option<String>,
}

/// Who a grant is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    User(String),
    Group(String),
}

/// One grant, checked.
#[derive(Debug, Clone)]
struct Grant {
    subjects: Vec<Who>,
    clusters: Vec<glob::Pattern>,
    cluster_selector: LabelSelector,
    namespaces: Namespaces,
    resources: Vec<String>,
    verbs: Vec<Verb>,
    secret_data: bool,
    /// fleetscope's own endpoints granted (a grant of these names no resources).
    endpoints: Vec<String>,
}

impl Grant {
    fn is_for(&self, who: &Subject) -> bool {
        self.subjects.iter().any(|s| match s {
            Who::User(u) => *u == who.user,
            Who::Group(g) => who.groups.iter().any(|x| x == g),
        })
    }

    fn covers_cluster(&self, c: ClusterRef<'_>) -> bool {
        (self.clusters.is_empty() || self.clusters.iter().any(|p| p.matches(c.name.as_str())))
            && self.cluster_selector.matches(c.labels)
    }

    fn covers_resource(&self, rt: &ResourceType) -> bool {
        self.resources.iter().any(|r| resource_matches(r, rt))
    }
}

/// Whether a policy's resource entry names a type: `*` every type; `plural.group` that
/// type (the core group's types by plural alone); `*.group` every type of a group; a
/// plural alone (`deployments`) that plural in any group.
fn resource_matches(entry: &str, rt: &ResourceType) -> bool {
    if entry == "*" || entry == rt.name() {
        return true;
    }
    match entry.split_once('.') {
        Some(("*", group)) => group == rt.group,
        Some(_) => false,
        None => entry == rt.plural,
    }
}

/// Checks a policy's resource entry: one that could never match a type (a kind, a
/// short or singular name, a version where the group goes) is refused, naming the
/// plural it most likely means.
fn resource_entry(r: &str) -> Result<(), String> {
    let expected = "expected a resource type such as pods, deployments.apps, *.batch or *";
    if r == "*" || r.strip_prefix("*.").is_some_and(|g| !g.is_empty()) {
        return Ok(());
    }
    if fleetscope_model::check_resource_name(r).is_err() || r.contains('/') {
        return Err(format!("{r:?}: {expected}"));
    }
    let (plural, group) = r.split_once('.').unwrap_or((r, ""));
    let is_version = |g: &str| {
        g.strip_prefix('v')
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    };
    if group.split('.').next().is_some_and(is_version) {
        return Err(format!(
            "{r:?}: a resource entry is plural.group, without a version (e.g. {plural} or deployments.apps)"
        ));
    }
    let named = |s: &fleetscope_informer::discovery::Served| {
        (s.resource.kind == plural
            || s.singular == plural.to_ascii_lowercase()
            || s.short_names.iter().any(|n| n == plural))
            && (group.is_empty() || s.resource.group == group)
            && s.resource.plural != plural
    };
    if let Some(s) = fleetscope_informer::discovery::builtin()
        .iter()
        .find(|s| named(s))
    {
        return Err(format!(
            "{r:?} is not a resource entry: policies name types by plural, here {:?}",
            s.resource.name()
        ));
    }
    if plural.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(format!(
            "{r:?}: resource types are lower-case plurals (pods, not Pod): {expected}"
        ));
    }
    Ok(())
}

/// A policy file's grants.
#[derive(Debug, Clone, Default)]
pub struct PolicyGrants {
    grants: Vec<Grant>,
}

fn value(path: &Path, key: String, message: impl Into<String>) -> FileError {
    FileError::Value {
        path: path.to_path_buf(),
        key,
        message: message.into(),
    }
}

fn patterns(path: &Path, key: &str, items: &[String]) -> Result<Vec<glob::Pattern>, FileError> {
    items
        .iter()
        .enumerate()
        .map(|(j, p)| {
            if p.is_empty() {
                return Err(value(path, format!("{key}[{j}]"), "an empty name"));
            }
            glob::Pattern::new(p).map_err(|e| {
                value(
                    path,
                    format!("{key}[{j}]"),
                    format!("{p:?} is not a valid glob: {e}"),
                )
            })
        })
        .collect()
}

impl PolicyGrants {
    /// Reads a policy file. Every error names the file and the key.
    pub fn load(path: &Path) -> Result<Self, FileError> {
        Self::parse(path, &text_of(path)?)
    }

    /// Parses a policy document read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, FileError> {
        let Some(file) = document::<PolicyFile>(path, text, KEYS)? else {
            return Err(value(
                path,
                "grants".into(),
                "the policy is empty: it must list its grants (an empty list denies everything)",
            ));
        };
        let grants = file
            .grants
            .into_iter()
            .enumerate()
            .map(|(i, g)| Self::grant(path, i, g))
            .collect::<Result<_, _>>()?;
        Ok(Self { grants })
    }

    fn grant(path: &Path, i: usize, mut g: GrantFile) -> Result<Grant, FileError> {
        let at = |key: &str| format!("grants[{i}].{key}");
        let subjects = std::mem::take(&mut g.subjects)
            .into_iter()
            .enumerate()
            .map(|(j, s)| match (s.user, s.group) {
                (Some(u), None) if !u.is_empty() => Ok(Who::User(u)),
                (None, Some(g)) if !g.is_empty() => Ok(Who::Group(g)),
                _ => Err(value(
                    path,
                    at(&format!("subjects[{j}]")),
                    "expected one of user: NAME or group: NAME",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if subjects.is_empty() {
            return Err(value(
                path,
                at("subjects"),
                "a grant is for at least one user or group",
            ));
        }
        if !g.non_resource_urls.is_empty() {
            return Self::endpoint_grant(path, i, g, subjects);
        }
        if g.clusters.is_empty() && g.cluster_selector.is_empty() {
            return Err(value(
                path,
                at("clusters"),
                "name the clusters (names or globs; [\"*\"] for every cluster) or give a clusterSelector",
            ));
        }
        let clusters = patterns(path, &at("clusters"), &g.clusters)?;
        let cluster_selector = LabelSelector::parse(&g.cluster_selector)
            .map_err(|e| value(path, at("clusterSelector"), e.to_string()))?;
        if g.namespaces.is_empty() && !g.cluster_scoped {
            return Err(value(
                path,
                at("namespaces"),
                "name the namespaces (names or globs; [\"*\"] for every namespace) or set clusterScoped: true",
            ));
        }
        let namespaces = if g.cluster_scoped && g.namespaces.iter().any(|n| n == "*") {
            Namespaces::All
        } else {
            Namespaces::Only {
                patterns: patterns(path, &at("namespaces"), &g.namespaces)?,
                cluster_scoped: g.cluster_scoped,
            }
        };
        if g.resources.is_empty() {
            return Err(value(
                path,
                at("resources"),
                "name the resource types ([\"*\"] for every type)",
            ));
        }
        for (j, r) in g.resources.iter().enumerate() {
            resource_entry(r).map_err(|m| value(path, at(&format!("resources[{j}]")), m))?;
        }
        let mut verbs = Vec::new();
        for (j, v) in g.verbs.iter().enumerate() {
            match v.as_str() {
                "*" => verbs.extend(Verb::ALL),
                "get" => verbs.push(Verb::Get),
                "list" => verbs.push(Verb::List),
                "watch" => verbs.push(Verb::Watch),
                other => {
                    return Err(value(
                        path,
                        at(&format!("verbs[{j}]")),
                        format!("{other:?}: expected get, list, watch or *"),
                    ));
                }
            }
        }
        if verbs.is_empty() {
            return Err(value(
                path,
                at("verbs"),
                "name the verbs: get, list, watch (or *)",
            ));
        }
        let _ = g.name;
        Ok(Grant {
            subjects,
            clusters,
            cluster_selector,
            namespaces,
            resources: g.resources,
            verbs,
            secret_data: g.secret_data,
            endpoints: Vec::new(),
        })
    }

    /// A grant of `nonResourceURLs`: fleetscope's own endpoints, read with `get`.
    fn endpoint_grant(
        path: &Path,
        i: usize,
        g: GrantFile,
        subjects: Vec<Who>,
    ) -> Result<Grant, FileError> {
        let at = |key: &str| format!("grants[{i}].{key}");
        let mixed = [
            ("clusters", !g.clusters.is_empty()),
            ("clusterSelector", !g.cluster_selector.is_empty()),
            ("namespaces", !g.namespaces.is_empty()),
            ("clusterScoped", g.cluster_scoped),
            ("resources", !g.resources.is_empty()),
            ("secretData", g.secret_data),
        ];
        if let Some((key, _)) = mixed.iter().find(|(_, given)| *given) {
            return Err(value(
                path,
                at(key),
                "a grant of nonResourceURLs names no resources, clusters or namespaces: give those in a grant of their own",
            ));
        }
        for (j, u) in g.non_resource_urls.iter().enumerate() {
            if u != "*" && !ENDPOINTS.contains(&u.as_str()) {
                return Err(value(
                    path,
                    at(&format!("nonResourceURLs[{j}]")),
                    format!("{u:?}: expected one of {} or *", ENDPOINTS.join(", ")),
                ));
            }
        }
        for (j, v) in g.verbs.iter().enumerate() {
            if v != "get" && v != "*" {
                return Err(value(
                    path,
                    at(&format!("verbs[{j}]")),
                    format!("{v:?}: nonResourceURLs are read with get (or *)"),
                ));
            }
        }
        if g.verbs.is_empty() {
            return Err(value(path, at("verbs"), "name the verb: get"));
        }
        Ok(Grant {
            subjects,
            clusters: Vec::new(),
            cluster_selector: LabelSelector::default(),
            namespaces: Namespaces::None,
            resources: Vec::new(),
            verbs: Vec::new(),
            secret_data: false,
            endpoints: g.non_resource_urls,
        })
    }

    /// How many grants.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// Whether there are none (everything is denied).
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }
}

impl Policy for PolicyGrants {
    fn namespaces(
        &self,
        who: &Subject,
        verb: Verb,
        resource: &ResourceType,
        cluster: ClusterRef<'_>,
    ) -> Namespaces {
        self.grants
            .iter()
            .filter(|g| {
                g.verbs.contains(&verb)
                    && g.is_for(who)
                    && g.covers_resource(resource)
                    && g.covers_cluster(cluster)
            })
            .fold(Namespaces::None, |acc, g| acc.union(g.namespaces.clone()))
    }

    fn secret_data(&self, who: &Subject, cluster: ClusterRef<'_>, namespace: &str) -> bool {
        let secrets = ResourceType::new("", "v1", "secrets", "Secret", true);
        self.grants.iter().any(|g| {
            g.secret_data
                && g.is_for(who)
                && g.covers_resource(&secrets)
                && g.covers_cluster(cluster)
                && g.namespaces.allows(namespace)
        })
    }

    fn sees_cluster(&self, who: &Subject, cluster: ClusterRef<'_>) -> bool {
        self.grants
            .iter()
            .any(|g| g.endpoints.is_empty() && g.is_for(who) && g.covers_cluster(cluster))
    }

    fn endpoint(&self, who: &Subject, path: &str) -> bool {
        self.grants
            .iter()
            .any(|g| g.is_for(who) && g.endpoints.iter().any(|e| e == "*" || e == path))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fleetscope_model::ClusterName;
    use proptest::prelude::*;

    use super::*;

    fn policy(text: &str) -> PolicyGrants {
        PolicyGrants::parse(Path::new("policy.yaml"), text).unwrap()
    }

    fn error(text: &str) -> String {
        PolicyGrants::parse(Path::new("policy.yaml"), text)
            .unwrap_err()
            .to_string()
    }

    fn user(name: &str, groups: &[&str]) -> Subject {
        Subject {
            user: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn pods() -> ResourceType {
        ResourceType::new("", "v1", "pods", "Pod", true)
    }

    const TWO_TEAMS: &str = r#"
grants:
  - name: team a
    subjects: [{group: team-a}]
    clusters: ["prod-*"]
    namespaces: ["team-a", "team-a-*"]
    resources: ["pods", "deployments.apps"]
    verbs: [get, list, watch]
  - subjects: [{user: bob}]
    clusterSelector: "env=dev"
    namespaces: ["*"]
    clusterScoped: true
    resources: ["*"]
    verbs: ["*"]
    secretData: true
"#;

    #[test]
    fn grants_select_by_subject_cluster_namespace_type_and_verb() {
        let p = policy(TWO_TEAMS);
        let none = BTreeMap::new();
        let dev: BTreeMap<String, String> = [("env".to_string(), "dev".to_string())].into();
        let prod = ClusterName::from("prod-1");
        let c = ClusterRef {
            name: &prod,
            labels: &none,
        };
        let alice = user("alice", &["team-a"]);
        let ns = p.namespaces(&alice, Verb::List, &pods(), c);
        assert!(ns.allows("team-a") && ns.allows("team-a-web"));
        assert!(!ns.allows("team-b") && !ns.allows(""));
        let secrets = ResourceType::new("", "v1", "secrets", "Secret", true);
        assert!(p.namespaces(&alice, Verb::List, &secrets, c).is_none());
        let other = ClusterName::from("staging");
        let s = ClusterRef {
            name: &other,
            labels: &none,
        };
        assert!(p.namespaces(&alice, Verb::List, &pods(), s).is_none());
        assert!(!p.sees_cluster(&alice, s));
        assert!(p.sees_cluster(&alice, c));
        assert!(!p.secret_data(&alice, c, "team-a"));
        let bob = user("bob", &[]);
        let d = ClusterRef {
            name: &other,
            labels: &dev,
        };
        assert!(matches!(
            p.namespaces(&bob, Verb::Watch, &secrets, d),
            Namespaces::All
        ));
        assert!(p.secret_data(&bob, d, "x"));
        assert!(p.namespaces(&bob, Verb::Watch, &secrets, s).is_none());
        let nobody = user("eve", &["team-b"]);
        assert!(p.namespaces(&nobody, Verb::Get, &pods(), c).is_none());
    }

    #[test]
    fn resource_entries_match_by_name_group_or_plural() {
        let deploy = ResourceType::new("apps", "v1", "deployments", "Deployment", true);
        assert!(resource_matches("*", &deploy));
        assert!(resource_matches("deployments.apps", &deploy));
        assert!(resource_matches("deployments", &deploy));
        assert!(resource_matches("*.apps", &deploy));
        assert!(!resource_matches("*.batch", &deploy));
        assert!(!resource_matches("pods", &deploy));
        assert!(resource_matches("pods", &pods()));
        assert!(!resource_matches("pods.apps", &pods()));
    }

    #[test]
    fn bad_policies_name_the_file_and_the_key() {
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    clusters: [x]\n    namespaces: [y]\n    resources: [pods]\n    verbs: [read]\n",
        );
        assert!(
            e.contains("policy.yaml") && e.contains("grants[0].verbs[0]") && e.contains("\"read\""),
            "{e}"
        );
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    clusters: [x]\n    namespace: [y]\n    resources: [pods]\n    verbs: [get]\n",
        );
        assert!(
            e.contains("grants.0.namespace") && e.contains("namespaces"),
            "{e}"
        );
        let e = error(
            "grants:\n  - subjects: [{user: a, group: b}]\n    clusters: [x]\n    namespaces: [y]\n    resources: [pods]\n    verbs: [get]\n",
        );
        assert!(e.contains("grants[0].subjects[0]"), "{e}");
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    namespaces: [y]\n    resources: [pods]\n    verbs: [get]\n",
        );
        assert!(e.contains("grants[0].clusters"), "{e}");
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    clusters: [\"prod-[\"]\n    namespaces: [y]\n    resources: [pods]\n    verbs: [get]\n",
        );
        assert!(e.contains("grants[0].clusters[0]"), "{e}");
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    clusters: [x]\n    clusterSelector: \"env in\"\n    namespaces: [y]\n    resources: [pods]\n    verbs: [get]\n",
        );
        assert!(e.contains("grants[0].clusterSelector"), "{e}");
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    clusters: [x]\n    resources: [pods]\n    verbs: [get]\n",
        );
        assert!(e.contains("grants[0].namespaces"), "{e}");
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    clusters: [x]\n    namespaces: [y]\n    resources: [\"apps/v1/x\"]\n    verbs: [get]\n",
        );
        assert!(e.contains("grants[0].resources[0]"), "{e}");
        let e = error("grants: [\n");
        assert!(e.contains("policy.yaml"), "{e}");
        let e = error("");
        assert!(e.contains("empty"), "{e}");
        assert!(policy("grants: []").is_empty());
    }

    /// A grant as plain data, and the plain reading of what it allows.
    #[derive(Debug, Clone)]
    struct Plain {
        users: Vec<String>,
        groups: Vec<String>,
        clusters: Vec<String>,
        env: Option<String>,
        namespaces: Vec<String>,
        cluster_scoped: bool,
        resources: Vec<String>,
        verbs: Vec<String>,
    }

    fn glob_or_name(pattern: &str, name: &str) -> bool {
        match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => pattern == name,
        }
    }

    impl Plain {
        fn allows(
            &self,
            who: &Subject,
            verb: &str,
            resource: &str,
            cluster: &str,
            env: &str,
            ns: &str,
        ) -> bool {
            let subject = self.users.contains(&who.user)
                || self.groups.iter().any(|g| who.groups.contains(g));
            let cluster_ok = (self.clusters.is_empty()
                || self.clusters.iter().any(|c| glob_or_name(c, cluster)))
                && self.env.as_ref().is_none_or(|e| e == env);
            let ns_ok = if ns.is_empty() {
                self.cluster_scoped
            } else {
                self.namespaces.iter().any(|n| glob_or_name(n, ns))
            };
            let verb_ok = self.verbs.iter().any(|v| v == "*" || v == verb);
            let resource_ok = self.resources.iter().any(|r| r == "*" || r == resource);
            subject && cluster_ok && ns_ok && verb_ok && resource_ok
        }

        fn yaml(&self) -> String {
            let mut subjects: Vec<String> = self
                .users
                .iter()
                .map(|u| format!("{{user: {u}}}"))
                .collect();
            subjects.extend(self.groups.iter().map(|g| format!("{{group: {g}}}")));
            let list = |v: &[String]| {
                v.iter()
                    .map(|x| format!("{x:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut y = format!("  - subjects: [{}]\n", subjects.join(", "));
            if !self.clusters.is_empty() {
                y += &format!("    clusters: [{}]\n", list(&self.clusters));
            }
            if let Some(e) = &self.env {
                y += &format!("    clusterSelector: \"env={e}\"\n");
            }
            y += &format!(
                "    namespaces: [{}]\n    clusterScoped: {}\n    resources: [{}]\n    verbs: [{}]\n",
                list(&self.namespaces),
                self.cluster_scoped,
                list(&self.resources),
                list(&self.verbs)
            );
            y
        }
    }

    fn some_of(items: &'static [&'static str], min: usize) -> impl Strategy<Value = Vec<String>> {
        proptest::sample::subsequence(items, min..=items.len().min(3))
            .prop_map(|v| v.into_iter().map(str::to_string).collect())
    }

    fn plain() -> impl Strategy<Value = Plain> {
        (
            some_of(&["alice", "bob"], 0),
            some_of(&["ops", "dev"], 0),
            some_of(&["prod-*", "dev", "*"], 0),
            proptest::option::of(proptest::sample::select(vec![
                "eu".to_string(),
                "us".to_string(),
            ])),
            some_of(&["a", "b-*", "*"], 0),
            any::<bool>(),
            some_of(&["pods", "configmaps", "*"], 1),
            some_of(&["get", "list", "watch", "*"], 1),
        )
            .prop_filter("a valid grant", |(u, g, c, e, n, cs, _, _)| {
                let nobody = u.is_empty() && g.is_empty();
                let nowhere = c.is_empty() && e.is_none();
                let no_namespace = n.is_empty() && !*cs;
                !(nobody || nowhere || no_namespace)
            })
            .prop_map(
                |(users, groups, clusters, env, namespaces, cluster_scoped, resources, verbs)| {
                    Plain {
                        users,
                        groups,
                        clusters,
                        env,
                        namespaces,
                        cluster_scoped,
                        resources,
                        verbs,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn the_policy_allows_exactly_what_some_plain_grant_allows(
            grants in proptest::collection::vec(plain(), 0..5),
            user in proptest::sample::select(vec!["alice", "bob", "carol"]),
            groups in some_of(&["ops", "dev"], 0),
            verb in proptest::sample::select(vec!["get", "list", "watch"]),
            resource in proptest::sample::select(vec!["pods", "configmaps"]),
            cluster in proptest::sample::select(vec!["prod-1", "dev", "staging"]),
            env in proptest::sample::select(vec!["eu", "us"]),
            ns in proptest::sample::select(vec!["", "a", "b-1", "c"]),
        ) {
            let text = if grants.is_empty() {
                "grants: []\n".to_string()
            } else {
                format!("grants:\n{}", grants.iter().map(Plain::yaml).collect::<String>())
            };
            let p = policy(&text);
            let who = Subject { user: user.to_string(), groups: groups.clone() };
            let name = ClusterName::from(cluster);
            let labels: BTreeMap<String, String> = [("env".to_string(), env.to_string())].into();
            let c = ClusterRef { name: &name, labels: &labels };
            let rt = ResourceType::new("", "v1", resource, "Kind", true);
            let v = match verb { "get" => Verb::Get, "list" => Verb::List, _ => Verb::Watch };
            let expected = grants.iter().any(|g| g.allows(&who, verb, resource, cluster, env, ns));
            prop_assert_eq!(p.namespaces(&who, v, &rt, c).allows(ns), expected, "{}", text);
        }
    }

    #[test]
    fn resource_entries_that_could_never_match_are_refused_naming_the_plural() {
        let grant = |r: &str| {
            format!(
                "grants:\n  - subjects: [{{user: a}}]\n    clusters: [x]\n    namespaces: [y]\n    resources: [pods, {r}]\n    verbs: [get]\n"
            )
        };
        for (entry, says) in [
            ("Pod", "\"pods\""),
            ("po", "\"pods\""),
            ("deployment", "\"deployments.apps\""),
            ("deploy.apps", "\"deployments.apps\""),
            ("secrets.v1", "without a version"),
            ("Widget", "lower-case plurals"),
        ] {
            let e = error(&grant(entry));
            assert!(
                e.contains("grants[0].resources[1]") && e.contains(says),
                "{entry}: {e}"
            );
        }
        for fine in [
            "widgets.example.com",
            "\"*.batch\"",
            "deployments.apps",
            "\"*\"",
            "nodes",
        ] {
            policy(&grant(fine));
        }
    }

    #[test]
    fn endpoints_need_a_grant_of_their_own_which_grants_nothing_else() {
        let p = policy(
            "grants:\n  - subjects: [{user: prom}]\n    nonResourceURLs: [/metrics]\n    verbs: [get]\n  - subjects: [{user: ops}]\n    nonResourceURLs: [\"*\"]\n    verbs: [\"*\"]\n",
        );
        let (prom, ops, other) = (user("prom", &[]), user("ops", &[]), user("x", &[]));
        assert!(p.endpoint(&prom, "/metrics"));
        assert!(!p.endpoint(&prom, "/store"));
        assert!(p.endpoint(&ops, "/store") && p.endpoint(&ops, "/metrics"));
        assert!(!p.endpoint(&other, "/metrics"));
        let name = ClusterName::from("prod-1");
        let labels = BTreeMap::new();
        let c = ClusterRef {
            name: &name,
            labels: &labels,
        };
        assert!(
            !p.sees_cluster(&prom, c),
            "an endpoint grant shows no cluster"
        );
        assert!(p.namespaces(&prom, Verb::List, &pods(), c).is_none());
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    nonResourceURLs: [/metrics]\n    clusters: [x]\n    verbs: [get]\n",
        );
        assert!(e.contains("grants[0].clusters"), "{e}");
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    nonResourceURLs: [/healthz]\n    verbs: [get]\n",
        );
        assert!(
            e.contains("grants[0].nonResourceURLs[0]") && e.contains("/metrics"),
            "{e}"
        );
        let e = error(
            "grants:\n  - subjects: [{user: a}]\n    nonResourceURLs: [/metrics]\n    verbs: [list]\n",
        );
        assert!(e.contains("grants[0].verbs[0]"), "{e}");
    }

    proptest! {
        /// The policy file is operator input: any text near its shape is a clear error
        /// or a policy, never a panic.
        #[test]
        fn any_policy_text_parses_or_is_an_error(
            text in "(grants:\n)?(  - (subjects|clusters|namespaces|resources|verbs|nonResourceURLs|clusterSelector|clusterScoped|secretData): [a-zA-Z0-9*./\\[\\] ,{}:=!-]{0,60}\n){0,6}\\PC{0,20}",
        ) {
            let _ = PolicyGrants::parse(Path::new("policy.yaml"), &text);
        }
    }
}
