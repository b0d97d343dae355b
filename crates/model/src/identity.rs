//! Identity of clusters, resource types and objects, and fleetscope's global revision.

use std::fmt;
use std::sync::Arc;

/// A cluster's name in fleetscope: its kubeconfig context name, or its configured name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ClusterName {
    fn from(s: &str) -> Self {
        Self(Arc::from(s))
    }
}

impl From<String> for ClusterName {
    fn from(s: String) -> Self {
        Self(Arc::from(s))
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A resource type name that cannot name any type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} is not a resource type name: {why}; expected NAME, NAME.GROUP, VERSION/NAME or GROUP/VERSION/NAME (e.g. pods, deployments.apps, apps/v1/deployments)"
)]
pub struct ResourceNameError {
    /// The name as given.
    pub name: String,
    /// What is wrong with it.
    pub why: String,
}

/// Checks that `name` can name a resource type, as kubectl takes one: a plural, kind
/// or short name, optionally `.GROUP`, or `VERSION/NAME`, or `GROUP/VERSION/NAME`.
/// Each part is made of letters, digits, `-` and `.`, beginning and ending with a
/// letter or digit (as Kubernetes names resources, groups and versions). `*` is not a
/// name; where "every type" is meant, callers accept it before asking.
pub fn check_resource_name(name: &str) -> Result<(), ResourceNameError> {
    let fail = |why: String| {
        Err(ResourceNameError {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() {
        return fail("it is empty".into());
    }
    if name.contains(['*', '?', '[']) {
        return fail("a query names one type, not a pattern".into());
    }
    let parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 3 {
        return fail(format!("it has {} parts separated by '/'", parts.len()));
    }
    for part in parts {
        if part.is_empty() {
            return fail("it has an empty part".into());
        }
        if part.len() > 253 {
            return fail("a part is longer than 253 characters".into());
        }
        if let Some(c) = part
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
        {
            return fail(format!("{c:?} is not allowed"));
        }
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        if !edge(part.chars().next()) || !edge(part.chars().last()) {
            return fail(format!(
                "{part:?} must begin and end with a letter or digit"
            ));
        }
        if part.contains("..") {
            return fail(format!("{part:?} has an empty segment"));
        }
    }
    Ok(())
}

/// A resource type as resolved by discovery.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: String,
    /// API version served, e.g. `v1`.
    pub version: String,
    /// Plural resource name, e.g. `deployments`.
    pub plural: String,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

impl ResourceType {
    /// A type from its parts: `ResourceType::new("apps", "v1", "deployments", "Deployment", true)`.
    pub fn new(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            kind: kind.into(),
            namespaced,
        }
    }

    /// The canonical name: `pods`, `deployments.apps`.
    pub fn name(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// The global revision: each change fleetscope applies gets the next one. It never goes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Revision(pub u64);

impl Revision {
    /// The revision after this one.
    pub fn next(self) -> Self {
        Revision(self.0 + 1)
    }

    /// Where a start that does not continue a store begins: the wall clock in
    /// nanoseconds since the Unix epoch. Every earlier run began at an earlier clock
    /// reading and issued one revision per change since, far fewer than a billion a
    /// second, so this is above anything it could have issued, and a revision from it
    /// is refused (older than the log) rather than taken to mean another change.
    pub fn fresh_start() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Revision(u64::try_from(nanos).unwrap_or(u64::MAX / 2))
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where objects live: a resource type in a cluster's namespace. Shared by every key
/// in it, so a key costs one pointer and its name. Ordered by resource, cluster,
/// namespace; shared strings compare by pointer first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// Canonical resource type name (`pods`, `deployments.apps`).
    pub resource: Arc<str>,
    /// The cluster.
    pub cluster: ClusterName,
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: Arc<str>,
}

/// Content order, with equal shared strings decided by pointer.
fn cmp_shared(a: &Arc<str>, b: &Arc<str>) -> std::cmp::Ordering {
    if Arc::ptr_eq(a, b) {
        std::cmp::Ordering::Equal
    } else {
        a.cmp(b)
    }
}

impl PartialOrd for Location {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Location {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        cmp_shared(&self.resource, &other.resource)
            .then_with(|| cmp_shared(&self.cluster.0, &other.cluster.0))
            .then_with(|| cmp_shared(&self.namespace, &other.namespace))
    }
}

/// An object's identity. Ordered by resource type, cluster, namespace, name: the
/// index's primary order, so a cluster or a namespace is a contiguous range. The
/// location's fields read through the key (`key.cluster`).
#[derive(Debug, Clone)]
pub struct ObjectKey {
    location: Arc<Location>,
    /// The name.
    pub name: Arc<str>,
}

impl ObjectKey {
    /// A key from its parts.
    pub fn new(resource: &str, cluster: &ClusterName, namespace: &str, name: &str) -> Self {
        Self::in_location(
            Arc::new(Location {
                resource: Arc::from(resource),
                cluster: cluster.clone(),
                namespace: Arc::from(namespace),
            }),
            Arc::from(name),
        )
    }

    /// A key in a shared location.
    pub fn in_location(location: Arc<Location>, name: Arc<str>) -> Self {
        Self { location, name }
    }

    /// The key's location.
    pub fn location(&self) -> &Arc<Location> {
        &self.location
    }
}

impl std::ops::Deref for ObjectKey {
    type Target = Location;

    fn deref(&self) -> &Location {
        &self.location
    }
}

impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        (Arc::ptr_eq(&self.location, &other.location) || self.location == other.location)
            && self.name == other.name
    }
}

impl Eq for ObjectKey {}

impl std::hash::Hash for ObjectKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.location.hash(state);
        self.name.hash(state);
    }
}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let location = if Arc::ptr_eq(&self.location, &other.location) {
            std::cmp::Ordering::Equal
        } else {
            self.location.cmp(&other.location)
        };
        location.then_with(|| self.name.cmp(&other.name))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}/{}", self.cluster, self.resource, self.name)
        } else {
            write!(
                f,
                "{}/{}/{}/{}",
                self.cluster, self.resource, self.namespace, self.name
            )
        }
    }
}

/// What a change did to an object, as a watcher sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Created, or started matching a filter.
    Added,
    /// Changed and still matches.
    Modified,
    /// Deleted, or stopped matching a filter.
    Deleted,
}

/// Whether a member resourceVersion is one an API server makes: etcd's revision, a
/// number (a stream could neither resume from nor order anything else).
pub fn is_resource_version(rv: &str) -> bool {
    !rv.is_empty() && rv.bytes().all(|b| b.is_ascii_digit()) && rv.parse::<u64>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_take_kubectls_forms_and_refuse_the_impossible() {
        for good in [
            "pods",
            "Pod",
            "po",
            "deployments.apps",
            "v1/pods",
            "apps/v1/deployments",
            "widgets.example.com",
            "example.com/v1alpha1/widgets",
        ] {
            assert_eq!(check_resource_name(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("", "empty"),
            ("*", "not a pattern"),
            ("pod?", "not a pattern"),
            ("%%%", "'%' is not allowed"),
            ("a/b/c/d", "4 parts"),
            ("apps//deployments", "empty part"),
            (".pods", "begin and end"),
            ("pods.", "begin and end"),
            ("pods..apps", "empty segment"),
            ("my pods", "' ' is not allowed"),
        ] {
            let e = check_resource_name(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.contains("GROUP/VERSION/NAME"), "{e}");
        }
    }

    #[test]
    fn keys_order_by_resource_then_cluster_then_namespace_then_name() {
        let a = ClusterName::from("a");
        let b = ClusterName::from("b");
        let mut keys = [
            ObjectKey::new("pods", &b, "x", "1"),
            ObjectKey::new("configmaps", &b, "x", "1"),
            ObjectKey::new("pods", &a, "y", "0"),
            ObjectKey::new("pods", &a, "x", "2"),
        ];
        keys.sort();
        let shown: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["b/configmaps/x/1", "a/pods/x/2", "a/pods/y/0", "b/pods/x/1"]
        );
    }

    #[test]
    fn canonical_names_carry_the_group() {
        let rt = ResourceType {
            group: "apps".into(),
            version: "v1".into(),
            plural: "deployments".into(),
            kind: "Deployment".into(),
            namespaced: true,
        };
        assert_eq!(
            (rt.name(), rt.api_version()),
            ("deployments.apps".into(), "apps/v1".into())
        );
    }
}
