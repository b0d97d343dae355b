//! The catalogue of served types: every resource type collected somewhere in the
//! fleet with kubectl's names for it, and the one resolution of a name a person
//! types (`pods`, `po`, `Pod`, `deployments.apps`, `apps/v1/deployments`) to a type.
//! The informer resolves configured names against a cluster's discovery with
//! [`names`]; queries resolve against a [`Catalogue`], rebuilt when what is collected
//! changes and shared by reference between queries.

use crate::ResourceType;

/// A served type and the names kubectl knows it by besides its plural and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The type.
    pub resource: ResourceType,
    /// Its singular name (`deployment`); empty when the server gives none.
    pub singular: String,
    /// Its short names (`deploy`).
    pub short_names: Vec<String>,
}

/// Whether `spec` names `resource` the way kubectl takes names: a plural, a kind, a
/// singular or a short name (case-insensitive), optionally `.group`-qualified, or
/// `group/version/name` (`version/name` for the core group).
pub fn names(spec: &str, resource: &ResourceType, singular: &str, short_names: &[String]) -> bool {
    let spec = spec.to_ascii_lowercase();
    let plural = resource.plural.to_ascii_lowercase();
    let kind = resource.kind.to_ascii_lowercase();
    let is = |n: &str| {
        n == plural
            || n == kind
            || (!singular.is_empty() && n == singular)
            || short_names.iter().any(|s| s.eq_ignore_ascii_case(n))
    };
    if spec.contains('/') {
        return versioned(&spec).is_some_and(|(group, version, name)| {
            group == resource.group && version == resource.version && is(name)
        });
    }
    match spec.split_once('.') {
        Some((n, group)) => group == resource.group && is(n),
        None => is(&spec),
    }
}

/// A name given with its version, as (group, version, name): `group/version/name`, or
/// `version/name` for the core group (group empty); `None` for any other shape.
pub fn versioned(spec: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = spec.split('/').collect();
    match parts.as_slice() {
        [group, version, name] => Some((group, version, name)),
        [version, name] => Some(("", version, name)),
        _ => None,
    }
}

/// The types collected somewhere, each once, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalogue {
    types: Vec<Named>,
}

impl Catalogue {
    /// A catalogue of `types`; a type given twice is kept once (its first names).
    pub fn new(types: impl IntoIterator<Item = Named>) -> Self {
        let mut all: Vec<Named> = Vec::new();
        for t in types {
            if !all.iter().any(|n| n.resource.name() == t.resource.name()) {
                all.push(t);
            }
        }
        all.sort_by_key(|n| n.resource.name());
        Self { types: all }
    }

    /// Every type, in name order.
    pub fn types(&self) -> impl ExactSizeIterator<Item = &ResourceType> {
        self.types.iter().map(|n| &n.resource)
    }

    /// Every type, with its names.
    pub fn named(&self) -> impl ExactSizeIterator<Item = &Named> {
        self.types.iter()
    }

    /// The type `spec` names: of several, the core group's first, then the first in
    /// name order.
    pub fn resolve(&self, spec: &str) -> Option<&ResourceType> {
        let spec = spec.trim();
        let mut found: Vec<&ResourceType> = self
            .types
            .iter()
            .filter(|n| names(spec, &n.resource, &n.singular, &n.short_names))
            .map(|n| &n.resource)
            .collect();
        found.sort_by_key(|rt| !rt.group.is_empty());
        found.first().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalogue() -> Catalogue {
        let rt = |g: &str, p: &str, k: &str| ResourceType::new(g, "v1", p, k, true);
        let named = |resource, singular: &str, short: &[&str]| Named {
            resource,
            singular: singular.into(),
            short_names: short.iter().map(|s| s.to_string()).collect(),
        };
        Catalogue::new([
            named(rt("example.com", "pods", "Pod"), "", &[]),
            named(rt("", "pods", "Pod"), "pod", &["po"]),
            named(
                rt("apps", "deployments", "Deployment"),
                "deployment",
                &["deploy"],
            ),
            named(rt("", "pods", "Pod"), "", &[]),
        ])
    }

    #[test]
    fn kubectl_style_names_resolve_the_core_group_first() {
        let c = catalogue();
        assert_eq!(c.types().len(), 3);
        for (spec, want) in [
            ("pods", "pods"),
            ("po", "pods"),
            ("Pod", "pods"),
            ("v1/pods", "pods"),
            ("pods.example.com", "pods.example.com"),
            ("example.com/v1/pods", "pods.example.com"),
            ("DEPLOY", "deployments.apps"),
            ("deployment.apps", "deployments.apps"),
            ("apps/v1/Deployment", "deployments.apps"),
            (" deployments ", "deployments.apps"),
        ] {
            assert_eq!(
                c.resolve(spec).map(ResourceType::name).as_deref(),
                Some(want),
                "{spec}"
            );
        }
        for spec in [
            "pod.apps",
            "apps/v2/deployments",
            "a/b/c/d",
            "configmaps",
            "",
        ] {
            assert_eq!(c.resolve(spec), None, "{spec}");
        }
    }
}
