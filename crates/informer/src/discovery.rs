//! Resource types named as kubectl names them, resolved against a cluster's discovery.

use fleetscope_model::ResourceType;
use kube::Client;
use serde_json::Value;

/// A type a cluster serves, with whether it can be listed and watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The type.
    pub resource: ResourceType,
    /// Whether `list` and `watch` are both allowed.
    pub watchable: bool,
    /// Its short names (`po`, `deploy`), as discovery gives them.
    pub short_names: Vec<String>,
    /// Its singular name (`pod`), as discovery gives it.
    pub singular: String,
}

impl Served {
    /// A type known only by its parts (no short or singular names).
    pub fn of(resource: ResourceType, watchable: bool) -> Self {
        Self {
            resource,
            watchable,
            short_names: Vec::new(),
            singular: String::new(),
        }
    }
}

/// One built-in type as a [`Served`], from the Kubernetes API's definitions.
fn builtin_type<T>(short_names: &[&str]) -> Served
where
    T: k8s_openapi::Resource,
    T::Scope: 'static,
{
    let namespaced = std::any::TypeId::of::<T::Scope>()
        == std::any::TypeId::of::<k8s_openapi::NamespaceResourceScope>();
    Served {
        resource: ResourceType {
            group: T::GROUP.to_string(),
            version: T::VERSION.to_string(),
            plural: T::URL_PATH_SEGMENT.to_string(),
            kind: T::KIND.to_string(),
            namespaced,
        },
        watchable: true,
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        singular: T::KIND.to_ascii_lowercase(),
    }
}

/// Kubernetes' stable built-in types, as an API server's discovery describes them
/// (plural, kind, scope, short names): a stream named by one of them starts before
/// discovery answers, and discovery then confirms it, or replaces it where the
/// cluster serves the type at another version or not at all.
pub fn builtin() -> Vec<Served> {
    use k8s_openapi::api::{
        apps::v1 as apps, autoscaling::v2 as autoscaling, batch::v1 as batch,
        coordination::v1 as coordination, core::v1 as core, discovery::v1 as discovery,
        networking::v1 as networking, policy::v1 as policy, rbac::v1 as rbac,
        scheduling::v1 as scheduling, storage::v1 as storage,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
    vec![
        builtin_type::<core::ConfigMap>(&["cm"]),
        builtin_type::<core::Endpoints>(&["ep"]),
        builtin_type::<core::Event>(&["ev"]),
        builtin_type::<core::LimitRange>(&["limits"]),
        builtin_type::<core::Namespace>(&["ns"]),
        builtin_type::<core::Node>(&["no"]),
        builtin_type::<core::PersistentVolume>(&["pv"]),
        builtin_type::<core::PersistentVolumeClaim>(&["pvc"]),
        builtin_type::<core::Pod>(&["po"]),
        builtin_type::<core::PodTemplate>(&[]),
        builtin_type::<core::ReplicationController>(&["rc"]),
        builtin_type::<core::ResourceQuota>(&["quota"]),
        builtin_type::<core::Secret>(&[]),
        builtin_type::<core::Service>(&["svc"]),
        builtin_type::<core::ServiceAccount>(&["sa"]),
        builtin_type::<apps::ControllerRevision>(&[]),
        builtin_type::<apps::DaemonSet>(&["ds"]),
        builtin_type::<apps::Deployment>(&["deploy"]),
        builtin_type::<apps::ReplicaSet>(&["rs"]),
        builtin_type::<apps::StatefulSet>(&["sts"]),
        builtin_type::<autoscaling::HorizontalPodAutoscaler>(&["hpa"]),
        builtin_type::<batch::CronJob>(&["cj"]),
        builtin_type::<batch::Job>(&[]),
        builtin_type::<coordination::Lease>(&[]),
        builtin_type::<discovery::EndpointSlice>(&[]),
        builtin_type::<networking::Ingress>(&["ing"]),
        builtin_type::<networking::IngressClass>(&[]),
        builtin_type::<networking::NetworkPolicy>(&["netpol"]),
        builtin_type::<policy::PodDisruptionBudget>(&["pdb"]),
        builtin_type::<rbac::ClusterRole>(&[]),
        builtin_type::<rbac::ClusterRoleBinding>(&[]),
        builtin_type::<rbac::Role>(&[]),
        builtin_type::<rbac::RoleBinding>(&[]),
        builtin_type::<scheduling::PriorityClass>(&["pc"]),
        builtin_type::<storage::CSIDriver>(&[]),
        builtin_type::<storage::CSINode>(&[]),
        builtin_type::<storage::StorageClass>(&["sc"]),
        builtin_type::<storage::VolumeAttachment>(&[]),
        builtin_type::<apiextensions::CustomResourceDefinition>(&["crd", "crds"]),
    ]
}

/// A GET of a discovery document.
async fn get_json(client: &Client, path: &str) -> Result<Value, kube::Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let text = client.request_text(request).await?;
    serde_json::from_str(&text).map_err(kube::Error::SerdeError)
}

/// The resources of one group version's `APIResourceList` (subresources left out).
fn resources_of(list: &Value, group: &str, version: &str) -> Vec<Served> {
    let mut out = Vec::new();
    for r in list["resources"].as_array().into_iter().flatten() {
        let plural = r["name"].as_str().unwrap_or_default();
        if plural.is_empty() || plural.contains('/') {
            continue;
        }
        let verbs: Vec<&str> = r["verbs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        out.push(Served {
            resource: ResourceType {
                group: group.to_string(),
                version: version.to_string(),
                plural: plural.to_string(),
                kind: r["kind"].as_str().unwrap_or_default().to_string(),
                namespaced: r["namespaced"].as_bool().unwrap_or(false),
            },
            watchable: verbs.contains(&"list") && verbs.contains(&"watch"),
            short_names: r["shortNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
            singular: r["singularName"].as_str().unwrap_or_default().to_string(),
        });
    }
    out
}

/// The types one group version serves (`group` empty for the core group): one request,
/// for a type named as `group/version/resource` before a full discovery answers.
pub(crate) async fn group_version(
    client: &Client,
    group: &str,
    version: &str,
) -> Result<Vec<Served>, kube::Error> {
    let path = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    Ok(resources_of(
        &get_json(client, &path).await?,
        group,
        version,
    ))
}

/// The types of several group versions, up to `concurrency` documents at once; the
/// answers in the order asked, whichever arrives first.
pub(crate) async fn group_versions(
    client: &Client,
    wanted: Vec<(String, String)>,
    concurrency: usize,
) -> Vec<(String, String, Result<Vec<Served>, kube::Error>)> {
    use futures::StreamExt;
    futures::stream::iter(wanted)
        .map(|(group, version)| {
            let client = client.clone();
            async move {
                let answer = group_version(&client, &group, &version).await;
                (group, version, answer)
            }
        })
        .buffered(concurrency.max(1))
        .collect()
        .await
}

/// Every type a cluster serves, once, in its preferred version (or, for a type its
/// group's preferred version does not serve, the first version that does), as
/// kubectl resolves names.
#[cfg(test)]
pub(crate) async fn discover(client: &Client) -> Result<Vec<Served>, kube::Error> {
    discover_all(client, DISCOVERY_CONCURRENCY)
        .await
        .map(|d| d.served)
}

/// What a discovery found: the types of every group version that answered, and the
/// group versions that did not (an aggregated API whose server is down), with why.
#[derive(Debug, Default)]
pub(crate) struct Discovered {
    /// The types served, as [`discover`] gives them.
    pub served: Vec<Served>,
    /// `group/version` (or `version` for the core group) of each group version whose
    /// document failed, with why; its types are unknown, not gone.
    pub failed: Vec<(String, String)>,
}

/// How many group-version documents a discovery that streams wait on asks for at once.
/// kube's client speaks HTTP/1.1, so each one in flight holds a connection of its own
/// (kept in the pool afterwards, for the lists and watches); a discovery nothing waits
/// on asks for one at a time, beside the streams.
pub(crate) const DISCOVERY_CONCURRENCY: usize = 8;

/// Discovery as kubectl does it: the root documents, then every group version's
/// document, up to `concurrency` at once; a group version whose document fails (an
/// aggregated API server that is down) is left out and named, and the rest is
/// answered; only the root documents failing fail it.
pub(crate) async fn discover_all(
    client: &Client,
    concurrency: usize,
) -> Result<Discovered, kube::Error> {
    let (core, groups) =
        futures::future::try_join(get_json(client, "/api"), get_json(client, "/apis")).await?;
    // (group, version) of every document, in the order their types are taken: the
    // core group, then each group with its preferred version first.
    let mut wanted: Vec<(String, String)> = core["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|v| (String::new(), v.to_string()))
        .collect();
    for g in groups["groups"].as_array().into_iter().flatten() {
        let name = g["name"].as_str().unwrap_or_default();
        let preferred = g["preferredVersion"]["version"]
            .as_str()
            .unwrap_or_default();
        let mut versions: Vec<&str> = g["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["version"].as_str())
            .collect();
        // The preferred version first, then the others in the server's order.
        versions.sort_by_key(|v| *v != preferred);
        wanted.extend(
            versions
                .into_iter()
                .map(|v| (name.to_string(), v.to_string())),
        );
    }
    let mut failed: Vec<(String, String)> = Vec::new();
    let mut out: Vec<Served> = Vec::new();
    for (group, version, answer) in group_versions(client, wanted, concurrency).await {
        let listed = match answer {
            Ok(listed) => listed,
            Err(e) => {
                let gv = if group.is_empty() {
                    version
                } else {
                    format!("{group}/{version}")
                };
                failed.push((gv, crate::source::chain(&e)));
                continue;
            }
        };
        // Within one group, a type is taken from the first version that serves it.
        for s in listed {
            if !out
                .iter()
                .any(|o| o.resource.group == group && o.resource.plural == s.resource.plural)
            {
                out.push(s);
            }
        }
    }
    out.sort_by(|a, b| a.resource.cmp(&b.resource));
    Ok(Discovered {
        served: out,
        failed,
    })
}

fn matches_name(spec: &str, served: &Served) -> bool {
    fleetscope_model::catalogue::names(
        spec,
        &served.resource,
        &served.singular,
        &served.short_names,
    )
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
        let mut found: Vec<&Served> = served.iter().filter(|s| matches_name(spec, s)).collect();
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
            Served::of(rt("", "pods", "Pod"), true),
            Served::of(rt("", "secrets", "Secret"), true),
            Served::of(rt("", "bindings", "Binding"), false),
            Served {
                short_names: vec!["deploy".into()],
                singular: "deployment".into(),
                ..Served::of(rt("apps", "deployments", "Deployment"), true)
            },
            Served::of(rt("example.com", "pods", "Pod"), true),
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
            ("deploy", "deployments.apps"),
            ("DEPLOY", "deployments.apps"),
            ("deploy.apps", "deployments.apps"),
            ("deployment", "deployments.apps"),
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
