//! Server-side field validation (`fieldValidation=Strict|Warn|Ignore`), as kubectl
//! asks for it when it creates, replaces, applies or patches with validation on: an
//! object of a built-in type is read as its Kubernetes type (k8s-openapi), and every
//! field the type does not have is reported by its path. `Strict` refuses the request
//! (400, as the apiserver words it), `Warn` answers with `Warning` headers, `Ignore`
//! (and a custom resource, whose schema the simulator does not hold) accepts it.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::resource::ResourceDef;
use crate::status::ApiError;

/// The fields of `object` its type does not have, by path; empty for types the
/// simulator holds no schema for.
pub fn unknown_fields(def: &ResourceDef, object: &Value) -> Vec<String> {
    use k8s_openapi::api::apps::v1 as apps;
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::rbac::v1 as rbac;
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "configmaps") => check::<core::ConfigMap>(object),
        ("", "secrets") => check::<core::Secret>(object),
        ("", "namespaces") => check::<core::Namespace>(object),
        ("", "pods") => check::<core::Pod>(object),
        ("", "services") => check::<core::Service>(object),
        ("", "nodes") => check::<core::Node>(object),
        ("apps", "deployments") => check::<apps::Deployment>(object),
        ("apps", "replicasets") => check::<apps::ReplicaSet>(object),
        ("rbac.authorization.k8s.io", "roles") => check::<rbac::Role>(object),
        ("rbac.authorization.k8s.io", "rolebindings") => check::<rbac::RoleBinding>(object),
        ("rbac.authorization.k8s.io", "clusterroles") => check::<rbac::ClusterRole>(object),
        ("rbac.authorization.k8s.io", "clusterrolebindings") => {
            check::<rbac::ClusterRoleBinding>(object)
        }
        _ => Vec::new(),
    }
}

fn check<T: DeserializeOwned + Serialize>(object: &Value) -> Vec<String> {
    let Ok(typed) = serde_json::from_value::<T>(object.clone()) else {
        // A wrong shape is the type's own error, reported when it is decoded.
        return Vec::new();
    };
    let Ok(back) = serde_json::to_value(&typed) else {
        return Vec::new();
    };
    let mut unknown = Vec::new();
    missing(object, &back, String::new(), &mut unknown);
    unknown
}

/// Paths present (and not null) in `sent` that the typed round trip dropped.
fn missing(sent: &Value, kept: &Value, at: String, out: &mut Vec<String>) {
    match (sent, kept) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match b.get(k) {
                    None if !v.is_null() => out.push(path),
                    None => {}
                    Some(kept) => missing(v, kept, path, out),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                missing(x, y, format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// What the request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Refuse unknown fields.
    Strict,
    /// Accept them, with a warning each.
    Warn,
    /// Accept them.
    Ignore,
}

impl Mode {
    /// The `fieldValidation` query parameter (the apiserver's default is `Warn`).
    pub fn of(param: Option<&str>) -> Result<Self, ApiError> {
        match param {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Strict") => Ok(Self::Strict),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: {other:?} is not one of Ignore, Warn, Strict"
            ))),
        }
    }
}

/// Checks `object` under `mode`: the warnings to send, or the refusal.
pub fn validate(def: &ResourceDef, object: &Value, mode: Mode) -> Result<Vec<String>, ApiError> {
    if mode == Mode::Ignore {
        return Ok(Vec::new());
    }
    let unknown = unknown_fields(def, object);
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let listed: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field {p:?}"))
        .collect();
    match mode {
        Mode::Strict => Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            listed.join(", "),
            kind = def.kind,
            version = def.version,
        ))),
        _ => Ok(listed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployments() -> ResourceDef {
        ResourceDef::new("apps", "v1", "deployments", "Deployment", true)
    }

    #[test]
    fn unknown_fields_are_named_by_path() {
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "labelz": {}},
            "spec": {"replicaz": 2, "selector": {"matchLabels": {"a": "b"}}, "template": {"spec": {"containers": [{"name": "c", "imagez": "i"}]}}}});
        assert_eq!(
            unknown_fields(&deployments(), &d),
            [
                "metadata.labelz",
                "spec.replicaz",
                "spec.template.spec.containers[0].imagez"
            ]
        );
        let e = validate(&deployments(), &d, Mode::Strict).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message
                .contains("strict decoding error: unknown field \"metadata.labelz\""),
            "{}",
            e.message
        );
        assert_eq!(validate(&deployments(), &d, Mode::Warn).unwrap().len(), 3);
        assert!(
            validate(&deployments(), &d, Mode::Ignore)
                .unwrap()
                .is_empty()
        );
        let fine = json!({"metadata": {"name": "x", "creationTimestamp": null}, "spec": {"replicas": 1, "selector": {}, "template": {}}});
        assert!(unknown_fields(&deployments(), &fine).is_empty());
        let crd = ResourceDef::new("stable.example.com", "v1", "crontabs", "CronTab", true);
        assert!(unknown_fields(&crd, &json!({"anything": 1})).is_empty());
        assert!(Mode::of(Some("Loose")).is_err());
    }
}
