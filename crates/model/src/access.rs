//! Who is asking and what they may read: the [`Subject`] authentication established,
//! and the [`Policy`] in force, which may change while a Watch runs. Front ends hand an
//! [`Access`] to the fleet with every request; the fleet enforces it below the seam, on
//! every object it returns, counts or streams.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::{ClusterName, ResourceType};

/// What a caller does with objects: `Get` one, `List` (and `Count`) many, `Watch` them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// Read one object by name.
    Get,
    /// Read many objects, or count them.
    List,
    /// Stream changes.
    Watch,
}

impl Verb {
    /// Every verb.
    pub const ALL: [Verb; 3] = [Verb::Get, Verb::List, Verb::Watch];

    /// The verb as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who is asking, as authentication established it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    /// The user name (a SPIFFE ID, a certificate's CN, a token's name).
    pub user: String,
    /// The groups the user belongs to.
    pub groups: Vec<String>,
}

impl Subject {
    /// The subject of a caller granted everything (loopback callers with no policy).
    pub fn unrestricted() -> Self {
        Self {
            user: "system:unrestricted".into(),
            groups: Vec::new(),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.user)
    }
}

/// Which namespaces of one cluster a caller may read, for one resource type and verb.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Namespaces {
    /// None at all.
    #[default]
    None,
    /// Every namespace, and cluster-scoped objects.
    All,
    /// Namespaces by name or glob, and cluster-scoped objects only when said.
    Only {
        /// Names or globs.
        patterns: Vec<glob::Pattern>,
        /// Whether cluster-scoped objects (namespace "") are included.
        cluster_scoped: bool,
    },
}

impl Namespaces {
    /// Whether objects of `namespace` ("" for cluster-scoped objects) may be read.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Namespaces::None => false,
            Namespaces::All => true,
            Namespaces::Only {
                patterns,
                cluster_scoped,
            } => {
                if namespace.is_empty() {
                    *cluster_scoped
                } else {
                    patterns.iter().any(|p| p.matches(namespace))
                }
            }
        }
    }

    /// Whether nothing may be read.
    pub fn is_none(&self) -> bool {
        match self {
            Namespaces::None => true,
            Namespaces::All => false,
            Namespaces::Only {
                patterns,
                cluster_scoped,
            } => patterns.is_empty() && !cluster_scoped,
        }
    }

    /// What either allows.
    pub fn union(self, other: Namespaces) -> Namespaces {
        match (self, other) {
            (Namespaces::All, _) | (_, Namespaces::All) => Namespaces::All,
            (Namespaces::None, x) | (x, Namespaces::None) => x,
            (
                Namespaces::Only {
                    mut patterns,
                    cluster_scoped: a,
                },
                Namespaces::Only {
                    patterns: more,
                    cluster_scoped: b,
                },
            ) => {
                for p in more {
                    if !patterns.contains(&p) {
                        patterns.push(p);
                    }
                }
                Namespaces::Only {
                    patterns,
                    cluster_scoped: a || b,
                }
            }
        }
    }
}

/// A cluster's name and labels, as a policy matches it.
#[derive(Debug, Clone, Copy)]
pub struct ClusterRef<'a> {
    /// The name.
    pub name: &'a ClusterName,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
}

/// The grants in force: what each subject may read. Evaluated for every request, and
/// for every event of a running Watch, against the policy in force at that moment.
pub trait Policy: Send + Sync + 'static {
    /// Which namespaces of `cluster` the subject may `verb` objects of `resource` in.
    fn namespaces(
        &self,
        who: &Subject,
        verb: Verb,
        resource: &ResourceType,
        cluster: ClusterRef<'_>,
    ) -> Namespaces;

    /// Whether Secrets' values in `namespace` of `cluster` are shown to the subject
    /// (otherwise they are redacted).
    fn secret_data(&self, who: &Subject, cluster: ClusterRef<'_>, namespace: &str) -> bool;

    /// Whether the subject is granted anything at all in `cluster`.
    fn sees_cluster(&self, who: &Subject, cluster: ClusterRef<'_>) -> bool;
    /// Whether the subject may read an endpoint that is not a resource (its path:
    /// [`METRICS_ENDPOINT`], [`STORE_ENDPOINT`]), as Kubernetes RBAC grants
    /// `nonResourceURLs`. Nothing is granted unless a policy says so.
    fn endpoint(&self, who: &Subject, path: &str) -> bool {
        let _ = (who, path);
        false
    }
}

/// The Prometheus endpoint, as policies name it: it shows every cluster's name and
/// figures, so it needs a grant of its own.
pub const METRICS_ENDPOINT: &str = "/metrics";

/// The store's figures (`GetStore`), as policies name them.
pub const STORE_ENDPOINT: &str = "/store";

/// The policy that grants everything to everyone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Everything;

impl Policy for Everything {
    fn namespaces(&self, _: &Subject, _: Verb, _: &ResourceType, _: ClusterRef<'_>) -> Namespaces {
        Namespaces::All
    }
    fn secret_data(&self, _: &Subject, _: ClusterRef<'_>, _: &str) -> bool {
        true
    }
    fn sees_cluster(&self, _: &Subject, _: ClusterRef<'_>) -> bool {
        true
    }
    fn endpoint(&self, _: &Subject, _: &str) -> bool {
        true
    }
}

/// A caller and the policy it is held to: the one in force now, and each one that
/// replaces it while a request (a Watch) runs.
#[derive(Clone)]
pub struct Access {
    subject: Arc<Subject>,
    policy: tokio::sync::watch::Receiver<Arc<dyn Policy>>,
    /// How the subject was authenticated (`certificate`, `token`, `none`).
    via: &'static str,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Access {
    /// `subject`, held to the policy `policy` carries now and to each one it carries later.
    pub fn new(subject: Subject, policy: tokio::sync::watch::Receiver<Arc<dyn Policy>>) -> Self {
        Self {
            subject: Arc::new(subject),
            policy,
            via: "",
        }
    }

    /// This access, saying how its subject was authenticated (`certificate`,
    /// `token`, `none`): part of [`Access::caller`].
    pub fn authenticated_by(mut self, via: &'static str) -> Self {
        self.via = via;
        self
    }

    /// The whole identity, as what is bound to a caller is keyed (page tokens, page
    /// pins, the Watch cap): how it was authenticated, the user and every group, so
    /// a user of one name by another means, or in other groups, is another caller.
    pub fn caller(&self) -> String {
        let mut groups: Vec<&str> = self.subject.groups.iter().map(String::as_str).collect();
        groups.sort_unstable();
        groups.dedup();
        // Each part with its length before it: no name can pass for two.
        let mut key = self.via.to_string();
        for part in std::iter::once(self.subject.user.as_str()).chain(groups) {
            key.push_str(&format!("/{}:{part}", part.len()));
        }
        key
    }

    /// A caller granted everything, under a policy that never changes: for callers
    /// inside the process (tests, benchmarks), always named as such. There is no
    /// default access: every request says whose it is, so none is served with every
    /// grant by being built without thought.
    pub fn everything() -> Self {
        let (_, policy) = tokio::sync::watch::channel(Arc::new(Everything) as Arc<dyn Policy>);
        Self::new(Subject::unrestricted(), policy)
    }

    /// Who is asking.
    pub fn subject(&self) -> &Subject {
        &self.subject
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<dyn Policy> {
        self.policy.borrow().clone()
    }

    /// The policy in force now, marking it seen: [`Access::changed`] waits for the next.
    pub fn policy_seen(&mut self) -> Arc<dyn Policy> {
        self.policy.borrow_and_update().clone()
    }

    /// Resolves when a policy replaces the one last seen; never, once no policy can
    /// follow (the process serves no more reloads).
    pub async fn changed(&mut self) {
        if self.policy.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Which (cluster, namespace) places of `clusters` the caller may `verb` objects of
    /// `resource` in, under the policy in force now; `None` when every place of every
    /// one of them is allowed (nothing to filter).
    pub fn reach<'a>(
        &self,
        verb: Verb,
        resource: &ResourceType,
        clusters: impl IntoIterator<Item = ClusterRef<'a>>,
    ) -> Option<Reach> {
        let policy = self.policy();
        let mut all = true;
        let map: HashMap<ClusterName, Namespaces> = clusters
            .into_iter()
            .map(|c| {
                let ns = policy.namespaces(&self.subject, verb, resource, c);
                all &= matches!(ns, Namespaces::All);
                (c.name.clone(), ns)
            })
            .collect();
        (!all).then(|| Reach(Arc::new(map)))
    }
}

/// The (cluster, namespace) places a request may read: a cluster not named, none of it.
#[derive(Debug, Clone, Default)]
pub struct Reach(Arc<HashMap<ClusterName, Namespaces>>);

impl Reach {
    /// Whether objects of `namespace` ("" for cluster-scoped) in `cluster` may be read.
    pub fn allows(&self, cluster: &ClusterName, namespace: &str) -> bool {
        self.0.get(cluster).is_some_and(|n| n.allows(namespace))
    }

    /// Whether anything of `cluster` may be read.
    pub fn reaches(&self, cluster: &ClusterName) -> bool {
        self.0.get(cluster).is_some_and(|n| !n.is_none())
    }
}

/// The fields of a Secret that hold its values: emptied for a caller the policy does
/// not reveal them to.
pub const SECRET_VALUE_FIELDS: [&str; 2] = ["data", "stringData"];

/// kubectl's record of an object as last applied: on a Secret, its values. Dropped
/// from a Secret whose values are not revealed.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Whether a field path (as field selectors and `field:` group keys name one) reads
/// something redaction takes from a Secret: a value under [`SECRET_VALUE_FIELDS`] or
/// the [`LAST_APPLIED`] annotation. A path names keys joined by dots (a key may hold
/// dots itself), so any path that can reach them starts with one of these.
pub fn reads_secret_values(path: &str) -> bool {
    let under = |field: &str| {
        path.strip_prefix(field)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    };
    SECRET_VALUE_FIELDS.iter().any(|f| under(f))
        || path
            .strip_prefix("metadata.annotations.")
            .is_some_and(|rest| rest.starts_with(LAST_APPLIED))
}

/// Where Secrets' values are hidden from a caller, so that a query sees each object
/// as the caller is shown it: there, a path that [`reads_secret_values`] is absent
/// (selectors match it as an unset field, group keys read it as empty). Asked per
/// object, of the policy in force at that moment.
#[derive(Clone)]
pub struct Hidden(Arc<HidesIn>);

/// Whether a place (cluster, namespace) hides Secrets' values.
type HidesIn = dyn Fn(&ClusterName, &str) -> bool + Send + Sync;

impl Hidden {
    /// Hidden where `hides(cluster, namespace)` says so.
    pub fn new(hides: impl Fn(&ClusterName, &str) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(hides))
    }

    /// Whether `path` is absent from the objects of `namespace` in `cluster`.
    pub fn hides(&self, cluster: &ClusterName, namespace: &str, path: &str) -> bool {
        reads_secret_values(path) && (self.0)(cluster, namespace)
    }
}

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hidden(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(patterns: &[&str], cluster_scoped: bool) -> Namespaces {
        Namespaces::Only {
            patterns: patterns
                .iter()
                .map(|p| glob::Pattern::new(p).unwrap())
                .collect(),
            cluster_scoped,
        }
    }

    #[test]
    fn namespaces_allow_by_name_glob_and_cluster_scope() {
        let n = only(&["team-a", "web-*"], false);
        assert!(n.allows("team-a"));
        assert!(n.allows("web-1"));
        assert!(!n.allows("team-b"));
        assert!(!n.allows(""), "cluster-scoped objects need saying so");
        assert!(only(&[], true).allows(""));
        assert!(!Namespaces::None.allows("x"));
        assert!(Namespaces::All.allows(""));
        assert!(only(&[], false).is_none());
    }

    #[test]
    fn a_union_allows_what_either_allows() {
        let u = only(&["a"], false).union(only(&["b"], true));
        for ns in ["a", "b", ""] {
            assert!(u.allows(ns), "{ns}");
        }
        assert!(!u.allows("c"));
        assert!(matches!(
            Namespaces::None.union(Namespaces::All),
            Namespaces::All
        ));
    }

    #[test]
    fn everything_needs_no_reach_and_a_narrow_policy_does() {
        let name = ClusterName::from("a");
        let labels = BTreeMap::new();
        let c = ClusterRef {
            name: &name,
            labels: &labels,
        };
        let pods = ResourceType::new("", "v1", "pods", "Pod", true);
        assert!(Access::everything().reach(Verb::List, &pods, [c]).is_none());

        struct OnlyA;
        impl Policy for OnlyA {
            fn namespaces(
                &self,
                _: &Subject,
                _: Verb,
                _: &ResourceType,
                _: ClusterRef<'_>,
            ) -> Namespaces {
                Namespaces::Only {
                    patterns: vec![glob::Pattern::new("a").unwrap()],
                    cluster_scoped: false,
                }
            }
            fn secret_data(&self, _: &Subject, _: ClusterRef<'_>, _: &str) -> bool {
                false
            }
            fn sees_cluster(&self, _: &Subject, _: ClusterRef<'_>) -> bool {
                true
            }
        }
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(OnlyA) as Arc<dyn Policy>);
        let access = Access::new(Subject::unrestricted(), rx);
        let reach = access.reach(Verb::List, &pods, [c]).expect("narrowed");
        assert!(reach.allows(&name, "a"));
        assert!(!reach.allows(&name, "b"));
        assert!(!reach.allows(&ClusterName::from("other"), "a"));
    }

    #[test]
    fn every_path_to_a_secret_value_is_known_and_no_other() {
        for p in [
            "data",
            "data.token",
            "data.a.b",
            "stringData.x",
            "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration",
            "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration.x",
        ] {
            assert!(reads_secret_values(p), "{p}");
        }
        for p in [
            "database",
            "metadata.name",
            "metadata.annotations.other",
            "type",
            "spec.data",
            "",
        ] {
            assert!(!reads_secret_values(p), "{p}");
        }
        let hidden = Hidden::new(|c, ns| c.as_str() == "a" && ns == "x");
        let a = ClusterName::from("a");
        assert!(hidden.hides(&a, "x", "data.token"));
        assert!(!hidden.hides(&a, "y", "data.token"));
        assert!(!hidden.hides(&a, "x", "type"));
    }

    #[test]
    fn a_caller_is_its_whole_identity() {
        let access = |user: &str, groups: &[&str], via| {
            Access::new(
                Subject {
                    user: user.into(),
                    groups: groups.iter().map(|g| g.to_string()).collect(),
                },
                Access::everything().policy,
            )
            .authenticated_by(via)
        };
        let alice = access("alice", &["a", "b"], "certificate");
        assert_eq!(
            alice.caller(),
            access("alice", &["b", "a"], "certificate").caller()
        );
        assert_ne!(
            alice.caller(),
            access("alice", &["a", "b"], "token").caller()
        );
        assert_ne!(
            alice.caller(),
            access("alice", &["a"], "certificate").caller()
        );
        assert_ne!(
            access("a", &["b"], "token").caller(),
            access("a\0b", &[], "token").caller()
        );
    }
}
