//! What the simulated API server does to an object written to it, as a real one
//! does: its namespace resolved, its name checked (a DNS subdomain, a generated name's
//! suffix), its defaults and server-set metadata filled in, a merge patch applied.

use serde_json::{Map, Value, json};

use crate::resource::ResourceDef;
use crate::status::ApiError;

pub(super) fn metadata_mut<'v>(
    def: &ResourceDef,
    value: &'v mut Value,
) -> Result<&'v mut Map<String, Value>, ApiError> {
    let Some(obj) = value.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && kind != def.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the object ({kind}) does not match the resource ({})",
            def.kind
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && av != def.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version of the object ({av}) does not match the resource ({})",
            def.api_version()
        )));
    }
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    meta.as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

pub(super) fn resolve_namespace(
    def: &ResourceDef,
    from_path: Option<&str>,
    meta: &Map<String, Value>,
) -> Result<String, ApiError> {
    let in_body = meta
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    if !def.namespaced {
        return Ok(String::new());
    }
    match (from_path, in_body) {
        (Some(p), Some(b)) if p != b => Err(ApiError::bad_request(format!(
            "the namespace of the provided object does not match the namespace sent on the request ({b} != {p})"
        ))),
        (Some(p), _) => Ok(p.to_string()),
        (None, Some(b)) => Ok(b.to_string()),
        (None, None) => Err(ApiError::bad_request(
            "a namespace is required to create a namespaced object",
        )),
    }
}

pub(super) fn validate_name(def: &ResourceDef, name: &str) -> Result<(), ApiError> {
    // RBAC objects are named as path segments (`system:discovery`), as the API server
    // validates them (ValidateRBACName).
    if def.group == "rbac.authorization.k8s.io" {
        return if name.is_empty() || name == "." || name == ".." || name.contains(['/', '%']) {
            Err(ApiError::invalid(
                &def.group,
                &def.kind,
                name,
                &[format!(
                    "metadata.name: Invalid value: \"{name}\": may not be '.' or '..', and may not contain '/' or '%'"
                )],
            ))
        } else {
            Ok(())
        };
    }
    // As IsDNS1123Subdomain words its errors, each a cause of its own.
    let mut errors = Vec::new();
    if name.len() > 253 {
        errors.push(format!(
            "metadata.name: Invalid value: \"{name}\": must be no more than 253 characters"
        ));
    }
    let subdomain = name.split('.').all(|p| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    });
    if !subdomain {
        errors.push(format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&def.group, &def.kind, name, &errors))
    }
}

pub(super) fn random_suffix() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// The defaults the apiserver fills in on create for the core types that need them
/// to read as they would on a real cluster: a Service's type, cluster IP and port
/// protocols, a new Pod's Pending phase and policies.
pub(super) fn defaults(plural: &str, value: &mut Value, rv: u64) {
    match plural {
        "services" => {
            let spec = &mut value["spec"];
            if spec
                .get("type")
                .is_none_or(|t| t.as_str().is_none_or(str::is_empty))
            {
                spec["type"] = json!("ClusterIP");
            }
            let external = spec["type"] == "ExternalName";
            if !external
                && spec
                    .get("clusterIP")
                    .is_none_or(|ip| ip.as_str().is_none_or(str::is_empty))
            {
                let ip = format!("10.96.{}.{}", 100 + (rv / 250) % 150, rv % 250 + 1);
                spec["clusterIP"] = json!(ip);
                spec["clusterIPs"] = json!([ip]);
            }
            if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports {
                    if p.get("protocol").is_none() {
                        p["protocol"] = json!("TCP");
                    }
                    if p.get("targetPort").is_none() {
                        p["targetPort"] = p["port"].clone();
                    }
                }
            }
            if spec.get("sessionAffinity").is_none() {
                spec["sessionAffinity"] = json!("None");
            }
            if value.get("status").is_none() {
                value["status"] = json!({"loadBalancer": {}});
            }
        }
        "pods" => {
            let spec = &mut value["spec"];
            for (k, v) in [
                ("restartPolicy", "Always"),
                ("dnsPolicy", "ClusterFirst"),
                ("schedulerName", "default-scheduler"),
            ] {
                if spec.get(k).is_none() {
                    spec[k] = json!(v);
                }
            }
            if value
                .get("status")
                .is_none_or(|s| s.as_object().is_some_and(|m| m.is_empty()))
            {
                value["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
        }
        _ => {}
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(map) = target {
        for (k, v) in patch {
            if v.is_null() {
                map.remove(k);
            } else {
                merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}
