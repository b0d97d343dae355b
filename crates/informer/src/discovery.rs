//! Resource types named as kubectl names them, resolved against a cluster's discovery.

use fleetscope_model::ResourceType;
use kube::Client;
use kube::discovery::{Discovery, Scope, verbs};

/// A type a cluster serves, with whether it can be listed and watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The type.
    pub resource: ResourceType,
    /// Whether `list` and `watch` are both allowed.
    pub watchable: bool,
}

/// Every preferred-version type a cluster serves.
pub(crate) async fn discover(client: &Client) -> Result<Vec<Served>, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            out.push(Served {
                resource: ResourceType {
                    group: ar.group.clone(),
                    version: ar.version.clone(),
                    plural: ar.plural.clone(),
                    kind: ar.kind.clone(),
                    namespaced: caps.scope == Scope::Namespaced,
                },
                watchable: caps.supports_operation(verbs::LIST)
                    && caps.supports_operation(verbs::WATCH),
            });
        }
    }
    out.sort_by(|a, b| a.resource.cmp(&b.resource));
    Ok(out)
}

fn matches_name(spec: &str, rt: &ResourceType) -> bool {
    let spec = spec.to_ascii_lowercase();
    let plural = rt.plural.to_ascii_lowercase();
    let kind = rt.kind.to_ascii_lowercase();
    let parts: Vec<&str> = spec.split('/').collect();
    match parts.as_slice() {
        // group/version/plural-or-kind, or version/plural-or-kind for the core group
        [group, version, name] => {
            *group == rt.group && *version == rt.version && (*name == plural || *name == kind)
        }
        [version, name] => {
            rt.group.is_empty() && *version == rt.version && (*name == plural || *name == kind)
        }
        [name] => match name.split_once('.') {
            Some((n, group)) => group == rt.group && (n == plural || n == kind),
            None => *name == plural || *name == kind,
        },
        _ => false,
    }
}

/// The outcome of resolving specs against one cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The types to watch, each once.
    pub resources: Vec<ResourceType>,
    /// Specs the cluster does not serve as a watchable type, with why.
    pub missing: Vec<(String, String)>,
}

/// Resolves kubectl-style names (`pods`, `deployments.apps`, `apps/v1/deployments`,
/// `Deployment`) and `*` (every listable and watchable type, Secrets excluded unless
/// named) against what a cluster serves. A plain name served by several groups picks
/// the core group first, then the first group in order.
pub fn resolve(specs: &[String], served: &[Served]) -> Resolved {
    let mut out = Resolved::default();
    let add = |rt: &ResourceType, out: &mut Resolved| {
        if !out.resources.contains(rt) {
            out.resources.push(rt.clone());
        }
    };
    for spec in specs.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if spec == "*" {
            for s in served.iter().filter(|s| s.watchable) {
                let is_secret = s.resource.group.is_empty() && s.resource.plural == "secrets";
                if !is_secret {
                    add(&s.resource, &mut out);
                }
            }
            continue;
        }
        let mut found: Vec<&Served> = served
            .iter()
            .filter(|s| matches_name(spec, &s.resource))
            .collect();
        found.sort_by_key(|s| !s.resource.group.is_empty());
        match found.first() {
            Some(s) if s.watchable => add(&s.resource, &mut out),
            Some(_) => out.missing.push((
                spec.to_string(),
                "the cluster does not allow list and watch on it".into(),
            )),
            None => out.missing.push((
                spec.to_string(),
                "the cluster serves no such resource type".into(),
            )),
        }
    }
    out.resources.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Vec<Served> {
        let rt = |g: &str, p: &str, k: &str| ResourceType {
            group: g.into(),
            version: "v1".into(),
            plural: p.into(),
            kind: k.into(),
            namespaced: true,
        };
        vec![
            Served {
                resource: rt("", "pods", "Pod"),
                watchable: true,
            },
            Served {
                resource: rt("", "secrets", "Secret"),
                watchable: true,
            },
            Served {
                resource: rt("", "bindings", "Binding"),
                watchable: false,
            },
            Served {
                resource: rt("apps", "deployments", "Deployment"),
                watchable: true,
            },
            Served {
                resource: rt("example.com", "pods", "Pod"),
                watchable: true,
            },
        ]
    }

    fn names(r: &Resolved) -> Vec<String> {
        r.resources.iter().map(ResourceType::name).collect()
    }

    #[test]
    fn kubectl_style_names_resolve() {
        for (spec, want) in [
            ("pods", "pods"),
            ("Pod", "pods"),
            ("pod", "pods"),
            ("deployments.apps", "deployments.apps"),
            ("apps/v1/deployments", "deployments.apps"),
            ("apps/v1/Deployment", "deployments.apps"),
            ("Deployment", "deployments.apps"),
            ("v1/pods", "pods"),
            ("pods.example.com", "pods.example.com"),
        ] {
            assert_eq!(names(&resolve(&[spec.into()], &served())), [want], "{spec}");
        }
    }

    #[test]
    fn star_takes_watchable_types_but_not_secrets_unless_named() {
        let all = resolve(&["*".into()], &served());
        assert_eq!(
            names(&all),
            ["pods", "deployments.apps", "pods.example.com"],
            "core group first"
        );
        let with = resolve(&["*".into(), "secrets".into()], &served());
        assert!(names(&with).contains(&"secrets".to_string()));
    }

    #[test]
    fn unknown_and_unwatchable_names_are_reported() {
        let r = resolve(
            &["widgets".into(), "bindings".into(), "pods".into()],
            &served(),
        );
        assert_eq!(names(&r), ["pods"]);
        assert_eq!(
            r.missing
                .iter()
                .map(|(s, _)| s.as_str())
                .collect::<Vec<_>>(),
            ["widgets", "bindings"]
        );
    }
}
