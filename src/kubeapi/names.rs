//! Names in the fleet's view. Two clusters hold objects of the same namespace and name
//! (every cluster has a `default` namespace and a `kube-system/coredns`), and every
//! caching client keys its store by namespace and name (client-go's
//! `MetaNamespaceKeyFunc`, kube-rs's `ObjectRef`): so at `/clusters/*` an object's
//! `metadata.name` carries its cluster, `CLUSTER:NAME`, and a reflector or an informer
//! of the fleet holds each object of each cluster once. `:` never starts a cluster's
//! part of a name by accident: a name is split after the longest cluster name it
//! begins with. In one cluster's view (`/clusters/NAME`) names are as the cluster has
//! them.

use fleetscope_model::selector::{FieldOp, FieldRequirement};
use fleetscope_model::{ClusterName, FieldSelector};

/// What joins a cluster and an object's name in the fleet's view.
pub const SEPARATOR: char = ':';

/// `name` of an object of `cluster`, as the fleet's view names it.
pub fn qualified(cluster: &str, name: &str) -> String {
    format!("{cluster}{SEPARATOR}{name}")
}

/// The cluster and the cluster's own name of the fleet's `qualified` name, among
/// `clusters` (the longest that fits, so a cluster named `a:b` is not taken for `a`).
pub fn split<'q>(qualified: &'q str, clusters: &[ClusterName]) -> Option<(ClusterName, &'q str)> {
    clusters
        .iter()
        .filter_map(|c| {
            let rest = qualified.strip_prefix(c.as_str())?;
            let name = rest.strip_prefix(SEPARATOR)?;
            (!name.is_empty()).then(|| (c.clone(), name))
        })
        .max_by_key(|(c, _)| c.as_str().len())
}

/// A field selector of the fleet's view as the seam reads it: `metadata.name=CLUSTER:NAME`
/// becomes `metadata.name=NAME` in that cluster (returned), and a bare name selects
/// that name in every cluster. `metadata.name!=CLUSTER:NAME` has no such form (the
/// seam would need "another cluster or another name"): refused, saying so.
pub fn field_selector(
    selector: &FieldSelector,
    clusters: &[ClusterName],
) -> Result<(FieldSelector, Option<ClusterName>), String> {
    let mut cluster: Option<ClusterName> = None;
    let mut terms = Vec::new();
    for r in selector.requirements() {
        let split = (r.path == "metadata.name")
            .then(|| split(&r.value, clusters))
            .flatten();
        let Some((c, name)) = split else {
            terms.push(r.to_string());
            continue;
        };
        if r.op == FieldOp::NotEquals {
            return Err(format!(
                "fieldSelector {r}: in the fleet's view a name's cluster is selected with '=' only (or use /clusters/{c} and metadata.name!={name})"
            ));
        }
        if cluster.as_ref().is_some_and(|held| *held != c) {
            return Err(format!(
                "fieldSelector {selector}: names of two clusters ({} and {c}) select nothing",
                cluster.unwrap_or(c.clone())
            ));
        }
        cluster = Some(c);
        terms.push(
            FieldRequirement {
                path: r.path.clone(),
                op: r.op,
                value: name.to_string(),
            }
            .to_string(),
        );
    }
    let rewritten = FieldSelector::parse(&terms.join(","))
        .map_err(|e| format!("fieldSelector {selector}: {e}"))?;
    Ok((rewritten, cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clusters(names: &[&str]) -> Vec<ClusterName> {
        names.iter().map(|n| ClusterName::from(*n)).collect()
    }

    #[test]
    fn a_qualified_name_splits_after_the_longest_cluster_it_begins_with() {
        let cs = clusters(&["prod", "prod:eu", "dev"]);
        assert_eq!(qualified("prod", "web"), "prod:web");
        let got = split("prod:eu:system:controller:x", &cs).unwrap();
        assert_eq!((got.0.as_str(), got.1), ("prod:eu", "system:controller:x"));
        let got = split("prod:system:node", &cs).unwrap();
        assert_eq!((got.0.as_str(), got.1), ("prod", "system:node"));
        assert!(split("web", &cs).is_none());
        assert!(split("staging:web", &cs).is_none());
        assert!(split("prod:", &cs).is_none());
    }

    #[test]
    fn a_field_selector_s_qualified_name_selects_its_cluster() {
        let cs = clusters(&["a", "b"]);
        let s = FieldSelector::parse("metadata.name=a:web,metadata.namespace=shop").unwrap();
        let (s, c) = field_selector(&s, &cs).unwrap();
        assert_eq!(s.to_string(), "metadata.name=web,metadata.namespace=shop");
        assert_eq!(c.unwrap().as_str(), "a");
        // A bare name: every cluster's.
        let s = FieldSelector::parse("metadata.name=web").unwrap();
        let (s, c) = field_selector(&s, &cs).unwrap();
        assert_eq!((s.to_string().as_str(), c), ("metadata.name=web", None));
        // What the seam cannot say is refused, saying why.
        let s = FieldSelector::parse("metadata.name!=a:web").unwrap();
        assert!(field_selector(&s, &cs).unwrap_err().contains("'=' only"));
        let s = FieldSelector::parse("metadata.name=a:web,metadata.name=b:web").unwrap();
        assert!(
            field_selector(&s, &cs)
                .unwrap_err()
                .contains("two clusters")
        );
    }
}
