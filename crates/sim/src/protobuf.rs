//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! as kubectl's typed clients send them (`kubectl create configmap|secret|namespace|
//! deployment|service|role|clusterrole|rolebinding|clusterrolebinding`, `kubectl
//! run`): the `k8s\0` envelope around a `runtime.Unknown`
//! naming the kind, decoded with the Kubernetes protobuf types of `k8s-pb` and turned
//! into the object's JSON.
//!
//! Every field of the decoded message is either turned into JSON or refused: a
//! converter takes each field it knows out of the message, and anything left is a
//! 415 naming the kind, so nothing a client sent is ever dropped silently (send such
//! an object as JSON instead).

use std::collections::BTreeMap;

use base64::Engine;
use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::rbac::v1 as rbac;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Map, Value, json};

use crate::status::ApiError;

/// The content type of protobuf bodies.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

fn refused(why: impl std::fmt::Display) -> ApiError {
    ApiError::unsupported_media_type(&format!(
        "{CONTENT_TYPE} ({why}; send it as application/json)"
    ))
}

/// Decodes a protobuf request body into the object's JSON.
///
/// (Long for a reason: a table, one arm per kind kubectl sends as protobuf, each
/// its fields.)
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let raw = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request("the protobuf body does not start with the k8s envelope")
    })?;
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(raw).map_err(|e| {
        ApiError::bad_request(format!("the protobuf envelope does not decode: {e}"))
    })?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let bytes = unknown.raw.unwrap_or_default();
    let bad = |e: prost::DecodeError| {
        ApiError::bad_request(format!(
            "the {kind} in the protobuf body does not decode: {e}"
        ))
    };
    let (mut object, rest_is_empty) = match kind.as_str() {
        "ConfigMap" => {
            let mut m = core::ConfigMap::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            put(&mut o, "data", strings(std::mem::take(&mut m.data)));
            put(
                &mut o,
                "binaryData",
                bytes_map(std::mem::take(&mut m.binary_data)),
            );
            put(&mut o, "immutable", m.immutable.take().map(Value::Bool));
            (o, meta_left && blank(&m))
        }
        "Secret" => {
            let mut m = core::Secret::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            put(&mut o, "data", bytes_map(std::mem::take(&mut m.data)));
            put(
                &mut o,
                "stringData",
                strings(std::mem::take(&mut m.string_data)),
            );
            put(&mut o, "type", m.r#type.take().map(Value::String));
            put(&mut o, "immutable", m.immutable.take().map(Value::Bool));
            (o, meta_left && blank(&m))
        }
        "Namespace" => {
            let mut m = core::Namespace::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let mut left = true;
            if let Some(mut spec) = m.spec.take() {
                let finalizers = std::mem::take(&mut spec.finalizers);
                if !finalizers.is_empty() {
                    o.insert("spec".into(), json!({"finalizers": finalizers}));
                }
                left &= blank(&spec);
            }
            left &= m.status.take().is_none_or(|s| blank(&s));
            (o, meta_left && left && blank(&m))
        }
        "Service" => {
            let mut m = core::Service::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let mut left = true;
            if let Some(spec) = m.spec.take() {
                let (spec, spec_left) = service_spec(spec);
                o.insert("spec".into(), spec);
                left &= spec_left;
            }
            left &= m.status.take().is_none_or(|s| blank(&s));
            (o, meta_left && left && blank(&m))
        }
        "Pod" => {
            let mut m = core::Pod::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let mut left = true;
            if let Some(spec) = m.spec.take() {
                let (spec, spec_left) = pod_spec(spec);
                o.insert("spec".into(), spec);
                left &= spec_left;
            }
            left &= m.status.take().is_none_or(|s| blank(&s));
            (o, meta_left && left && blank(&m))
        }
        "Deployment" => {
            let mut m = apps::Deployment::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let mut left = true;
            if let Some(mut spec) = m.spec.take() {
                let mut s = Map::new();
                put(&mut s, "replicas", spec.replicas.take().map(Value::from));
                if let Some(sel) = spec.selector.take() {
                    let (sel, sel_left) = label_selector(sel);
                    s.insert("selector".into(), sel);
                    left &= sel_left;
                }
                if let Some(mut t) = spec.template.take() {
                    let mut template = Map::new();
                    let (tm, tm_left) = meta_json(t.metadata.take());
                    left &= tm_left;
                    template.insert("metadata".into(), Value::Object(tm));
                    if let Some(ps) = t.spec.take() {
                        let (ps, ps_left) = pod_spec(ps);
                        template.insert("spec".into(), ps);
                        left &= ps_left;
                    }
                    left &= blank(&t);
                    s.insert("template".into(), Value::Object(template));
                }
                if let Some(mut strategy) = spec.strategy.take() {
                    let mut st = Map::new();
                    put(&mut st, "type", strategy.r#type.take().map(Value::String));
                    left &= strategy.rolling_update.take().is_none_or(|r| blank(&r));
                    s.insert("strategy".into(), Value::Object(st));
                }
                put(
                    &mut s,
                    "minReadySeconds",
                    spec.min_ready_seconds.take().map(Value::from),
                );
                put(
                    &mut s,
                    "revisionHistoryLimit",
                    spec.revision_history_limit.take().map(Value::from),
                );
                put(
                    &mut s,
                    "progressDeadlineSeconds",
                    spec.progress_deadline_seconds.take().map(Value::from),
                );
                put(&mut s, "paused", spec.paused.take().map(Value::Bool));
                left &= blank(&spec);
                o.insert("spec".into(), Value::Object(s));
            }
            left &= m.status.take().is_none_or(|s| blank(&s));
            (o, meta_left && left && blank(&m))
        }
        "Role" => {
            let mut m = rbac::Role::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let (rules, rules_left) = policy_rules(std::mem::take(&mut m.rules));
            o.insert("rules".into(), rules);
            (o, meta_left && rules_left && blank(&m))
        }
        "ClusterRole" => {
            let mut m = rbac::ClusterRole::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let (rules, rules_left) = policy_rules(std::mem::take(&mut m.rules));
            o.insert("rules".into(), rules);
            // Aggregation is the controller's to fill in; the simulator runs none.
            let aggregation_left = m.aggregation_rule.take().is_none();
            (o, meta_left && rules_left && aggregation_left && blank(&m))
        }
        "RoleBinding" => {
            let mut m = rbac::RoleBinding::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let left = binding(&mut o, std::mem::take(&mut m.subjects), m.role_ref.take());
            (o, meta_left && left && blank(&m))
        }
        "ClusterRoleBinding" => {
            let mut m = rbac::ClusterRoleBinding::decode(bytes.as_slice()).map_err(bad)?;
            let (mut o, meta_left) = object(m.metadata.take());
            let left = binding(&mut o, std::mem::take(&mut m.subjects), m.role_ref.take());
            (o, meta_left && left && blank(&m))
        }
        other => {
            return Err(refused(format!(
                "protobuf bodies are read for ConfigMap, Secret, Namespace, Service, Pod, Deployment, Role, ClusterRole, RoleBinding and ClusterRoleBinding, not {other:?}"
            )));
        }
    };
    if !rest_is_empty {
        return Err(refused(format!(
            "the {kind} sets fields the simulator does not read from protobuf"
        )));
    }
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(object))
}

/// An RBAC role's rules; the flag says nothing else was set.
fn policy_rules(rules: Vec<rbac::PolicyRule>) -> (Value, bool) {
    let mut left = true;
    let rules = rules
        .into_iter()
        .map(|mut r| {
            let mut o = Map::new();
            put(&mut o, "verbs", list(std::mem::take(&mut r.verbs)));
            put(&mut o, "apiGroups", list(std::mem::take(&mut r.api_groups)));
            put(&mut o, "resources", list(std::mem::take(&mut r.resources)));
            put(
                &mut o,
                "resourceNames",
                list(std::mem::take(&mut r.resource_names)),
            );
            put(
                &mut o,
                "nonResourceURLs",
                list(std::mem::take(&mut r.non_resource_ur_ls)),
            );
            left &= blank(&r);
            Value::Object(o)
        })
        .collect();
    (Value::Array(rules), left)
}

/// A binding's subjects and role reference into `o`; true when nothing else was set.
fn binding(
    o: &mut Map<String, Value>,
    subjects: Vec<rbac::Subject>,
    role_ref: Option<rbac::RoleRef>,
) -> bool {
    let mut left = true;
    let subjects: Vec<Value> = subjects
        .into_iter()
        .map(|mut s| {
            let mut j = Map::new();
            put(&mut j, "kind", s.kind.take().map(Value::String));
            put(&mut j, "apiGroup", s.api_group.take().map(Value::String));
            put(&mut j, "name", s.name.take().map(Value::String));
            put(&mut j, "namespace", s.namespace.take().map(Value::String));
            left &= blank(&s);
            Value::Object(j)
        })
        .collect();
    put(o, "subjects", Value::Array(subjects));
    if let Some(mut r) = role_ref {
        let mut j = Map::new();
        put(&mut j, "apiGroup", r.api_group.take().map(Value::String));
        put(&mut j, "kind", r.kind.take().map(Value::String));
        put(&mut j, "name", r.name.take().map(Value::String));
        left &= blank(&r);
        o.insert("roleRef".into(), Value::Object(j));
    }
    left
}

/// Whether a message sets nothing: Go's encoder writes empty strings, zeros and
/// empty messages for fields that are not pointers, so a field counts as set only
/// when its value is not empty. Read from the wire: a length-delimited field that is
/// empty, or that parses as a message setting nothing, is empty.
fn blank<M: Message>(m: &M) -> bool {
    empty_wire(&m.encode_to_vec())
}

fn empty_wire(mut b: &[u8]) -> bool {
    while !b.is_empty() {
        let Ok(key) = prost::encoding::decode_varint(&mut b) else {
            return false;
        };
        match key & 7 {
            0 => match prost::encoding::decode_varint(&mut b) {
                Ok(0) => {}
                _ => return false,
            },
            1 => {
                if b.len() < 8 || b[..8].iter().any(|x| *x != 0) {
                    return false;
                }
                b = &b[8..];
            }
            5 => {
                if b.len() < 4 || b[..4].iter().any(|x| *x != 0) {
                    return false;
                }
                b = &b[4..];
            }
            2 => {
                let Ok(len) = prost::encoding::decode_varint(&mut b) else {
                    return false;
                };
                let Ok(len) = usize::try_from(len) else {
                    return false;
                };
                if b.len() < len || !empty_wire(&b[..len]) {
                    return false;
                }
                b = &b[len..];
            }
            _ => return false,
        }
    }
    true
}

/// Inserts `v` when it says something (not null, not an empty map or list).
fn put(o: &mut Map<String, Value>, key: &str, v: impl Into<Option<Value>>) {
    match v.into() {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(Value::String(t)) if t.is_empty() => {}
        Some(v) => {
            o.insert(key.into(), v);
        }
    }
}

fn strings(m: BTreeMap<String, String>) -> Value {
    Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

fn bytes_map(m: BTreeMap<String, Vec<u8>>) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    Value::Object(
        m.into_iter()
            .map(|(k, v)| (k, Value::String(b64.encode(v))))
            .collect(),
    )
}

fn list(v: Vec<String>) -> Value {
    Value::Array(v.into_iter().map(Value::String).collect())
}

fn object(m: Option<meta::ObjectMeta>) -> (Map<String, Value>, bool) {
    let (meta, left) = meta_json(m);
    let mut o = Map::new();
    o.insert("metadata".into(), Value::Object(meta));
    (o, left)
}

/// The metadata a client may set on a new object; the flag says nothing else was set.
fn meta_json(m: Option<meta::ObjectMeta>) -> (Map<String, Value>, bool) {
    let mut o = Map::new();
    let Some(mut m) = m else { return (o, true) };
    put(&mut o, "name", m.name.take().map(Value::String));
    put(
        &mut o,
        "generateName",
        m.generate_name.take().map(Value::String),
    );
    put(&mut o, "namespace", m.namespace.take().map(Value::String));
    put(&mut o, "labels", strings(std::mem::take(&mut m.labels)));
    put(
        &mut o,
        "annotations",
        strings(std::mem::take(&mut m.annotations)),
    );
    put(
        &mut o,
        "finalizers",
        list(std::mem::take(&mut m.finalizers)),
    );
    put(
        &mut o,
        "resourceVersion",
        m.resource_version.take().map(Value::String),
    );
    // Set by the server whatever a client says.
    m.uid = None;
    m.creation_timestamp = None;
    m.generation = None;
    (o, blank(&m))
}

fn label_selector(mut s: meta::LabelSelector) -> (Value, bool) {
    let mut o = Map::new();
    put(
        &mut o,
        "matchLabels",
        strings(std::mem::take(&mut s.match_labels)),
    );
    let expressions: Vec<Value> = std::mem::take(&mut s.match_expressions)
        .into_iter()
        .map(|e| json!({"key": e.key, "operator": e.operator, "values": e.values}))
        .collect();
    put(&mut o, "matchExpressions", Value::Array(expressions));
    (Value::Object(o), blank(&s))
}

fn int_or_string(v: IntOrString) -> Value {
    match v.r#type {
        Some(1) => Value::String(v.str_val.unwrap_or_default()),
        _ => Value::from(v.int_val.unwrap_or_default()),
    }
}

fn quantities(m: BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>) -> Value {
    Value::Object(
        m.into_iter()
            .map(|(k, q)| (k, Value::String(q.string.unwrap_or_default())))
            .collect(),
    )
}

fn service_spec(mut s: core::ServiceSpec) -> (Value, bool) {
    let mut o = Map::new();
    let ports: Vec<Value> = std::mem::take(&mut s.ports)
        .into_iter()
        .map(|p| {
            let mut m = Map::new();
            put(&mut m, "name", p.name.map(Value::String));
            put(&mut m, "protocol", p.protocol.map(Value::String));
            put(&mut m, "appProtocol", p.app_protocol.map(Value::String));
            put(&mut m, "port", p.port.map(Value::from));
            put(&mut m, "targetPort", p.target_port.map(int_or_string));
            put(&mut m, "nodePort", p.node_port.map(Value::from));
            Value::Object(m)
        })
        .collect();
    put(&mut o, "ports", Value::Array(ports));
    put(&mut o, "selector", strings(std::mem::take(&mut s.selector)));
    put(&mut o, "clusterIP", s.cluster_ip.take().map(Value::String));
    put(
        &mut o,
        "clusterIPs",
        list(std::mem::take(&mut s.cluster_ips)),
    );
    put(&mut o, "type", s.r#type.take().map(Value::String));
    put(
        &mut o,
        "externalIPs",
        list(std::mem::take(&mut s.external_ips)),
    );
    put(
        &mut o,
        "externalName",
        s.external_name.take().map(Value::String),
    );
    put(
        &mut o,
        "sessionAffinity",
        s.session_affinity.take().map(Value::String),
    );
    put(
        &mut o,
        "loadBalancerIP",
        s.load_balancer_ip.take().map(Value::String),
    );
    put(
        &mut o,
        "externalTrafficPolicy",
        s.external_traffic_policy.take().map(Value::String),
    );
    put(
        &mut o,
        "internalTrafficPolicy",
        s.internal_traffic_policy.take().map(Value::String),
    );
    put(
        &mut o,
        "ipFamilyPolicy",
        s.ip_family_policy.take().map(Value::String),
    );
    put(
        &mut o,
        "ipFamilies",
        list(std::mem::take(&mut s.ip_families)),
    );
    (Value::Object(o), blank(&s))
}

fn pod_spec(mut s: core::PodSpec) -> (Value, bool) {
    let mut o = Map::new();
    let mut left = true;
    let containers = |list: Vec<core::Container>, left: &mut bool| -> Value {
        Value::Array(
            list.into_iter()
                .map(|c| {
                    let (c, c_left) = container(c);
                    *left &= c_left;
                    c
                })
                .collect(),
        )
    };
    let init = containers(std::mem::take(&mut s.init_containers), &mut left);
    put(&mut o, "initContainers", init);
    let main = containers(std::mem::take(&mut s.containers), &mut left);
    o.insert("containers".into(), main);
    put(
        &mut o,
        "restartPolicy",
        s.restart_policy.take().map(Value::String),
    );
    put(
        &mut o,
        "terminationGracePeriodSeconds",
        s.termination_grace_period_seconds.take().map(Value::from),
    );
    put(&mut o, "dnsPolicy", s.dns_policy.take().map(Value::String));
    put(
        &mut o,
        "nodeSelector",
        strings(std::mem::take(&mut s.node_selector)),
    );
    put(
        &mut o,
        "serviceAccountName",
        s.service_account_name.take().map(Value::String),
    );
    put(&mut o, "nodeName", s.node_name.take().map(Value::String));
    put(
        &mut o,
        "schedulerName",
        s.scheduler_name.take().map(Value::String),
    );
    put(&mut o, "hostname", s.hostname.take().map(Value::String));
    put(
        &mut o,
        "priorityClassName",
        s.priority_class_name.take().map(Value::String),
    );
    if let Some(sc) = s.security_context.take() {
        left &= blank(&sc);
        o.insert("securityContext".into(), json!({}));
    }
    (Value::Object(o), left && blank(&s))
}

fn container(mut c: core::Container) -> (Value, bool) {
    let mut o = Map::new();
    put(&mut o, "name", c.name.take().map(Value::String));
    put(&mut o, "image", c.image.take().map(Value::String));
    put(&mut o, "command", list(std::mem::take(&mut c.command)));
    put(&mut o, "args", list(std::mem::take(&mut c.args)));
    put(
        &mut o,
        "workingDir",
        c.working_dir.take().map(Value::String),
    );
    let ports: Vec<Value> = std::mem::take(&mut c.ports)
        .into_iter()
        .map(|p| {
            let mut m = Map::new();
            put(&mut m, "name", p.name.map(Value::String));
            put(&mut m, "containerPort", p.container_port.map(Value::from));
            put(&mut m, "hostPort", p.host_port.map(Value::from));
            put(&mut m, "protocol", p.protocol.map(Value::String));
            put(&mut m, "hostIP", p.host_ip.map(Value::String));
            Value::Object(m)
        })
        .collect();
    put(&mut o, "ports", Value::Array(ports));
    let mut left = true;
    let env: Vec<Value> = std::mem::take(&mut c.env)
        .into_iter()
        .map(|e| {
            left &= e.value_from.is_none();
            let mut m = Map::new();
            put(&mut m, "name", e.name.map(Value::String));
            put(&mut m, "value", e.value.map(Value::String));
            Value::Object(m)
        })
        .collect();
    put(&mut o, "env", Value::Array(env));
    if let Some(mut r) = c.resources.take() {
        let mut m = Map::new();
        put(&mut m, "limits", quantities(std::mem::take(&mut r.limits)));
        put(
            &mut m,
            "requests",
            quantities(std::mem::take(&mut r.requests)),
        );
        left &= blank(&r);
        o.insert("resources".into(), Value::Object(m));
    }
    put(
        &mut o,
        "imagePullPolicy",
        c.image_pull_policy.take().map(Value::String),
    );
    put(
        &mut o,
        "terminationMessagePath",
        c.termination_message_path.take().map(Value::String),
    );
    put(
        &mut o,
        "terminationMessagePolicy",
        c.termination_message_policy.take().map(Value::String),
    );
    put(&mut o, "stdin", c.stdin.take().map(Value::Bool));
    put(&mut o, "stdinOnce", c.stdin_once.take().map(Value::Bool));
    put(&mut o, "tty", c.tty.take().map(Value::Bool));
    (Value::Object(o), left && blank(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut out = MAGIC.to_vec();
        out.extend(unknown.encode_to_vec());
        out
    }

    fn named(name: &str) -> Option<meta::ObjectMeta> {
        Some(meta::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        })
    }

    #[test]
    fn a_configmap_and_a_deployment_decode_as_kubectl_sends_them() {
        let cm = core::ConfigMap {
            metadata: named("demo"),
            data: [("a".to_string(), "b".to_string())].into(),
            ..Default::default()
        };
        let v = decode(&envelope("v1", "ConfigMap", cm.encode_to_vec())).unwrap();
        assert_eq!(
            v,
            json!({"metadata": {"name": "demo"}, "data": {"a": "b"}, "apiVersion": "v1", "kind": "ConfigMap"})
        );
        let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        let d = apps::Deployment {
            metadata: Some(meta::ObjectMeta {
                name: Some("web".into()),
                labels: labels.clone(),
                ..Default::default()
            }),
            spec: Some(apps::DeploymentSpec {
                replicas: Some(2),
                selector: Some(meta::LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(core::PodTemplateSpec {
                    metadata: Some(meta::ObjectMeta {
                        labels,
                        ..Default::default()
                    }),
                    spec: Some(core::PodSpec {
                        containers: vec![core::Container {
                            name: Some("nginx".into()),
                            image: Some("nginx".into()),
                            resources: Some(Default::default()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                strategy: Some(Default::default()),
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        let v = decode(&envelope("apps/v1", "Deployment", d.encode_to_vec())).unwrap();
        assert_eq!(v["spec"]["replicas"], 2);
        assert_eq!(v["spec"]["selector"]["matchLabels"]["app"], "web");
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["image"],
            "nginx"
        );
        assert_eq!(v["kind"], "Deployment");
    }

    #[test]
    fn fields_not_read_and_other_kinds_are_refused_not_dropped() {
        let cm = core::Pod {
            metadata: named("p"),
            spec: Some(core::PodSpec {
                containers: vec![core::Container {
                    name: Some("c".into()),
                    liveness_probe: Some(core::Probe {
                        initial_delay_seconds: Some(5),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = decode(&envelope("v1", "Pod", cm.encode_to_vec())).unwrap_err();
        assert_eq!(e.code, 415, "{}", e.message);
        // An empty message, as Go writes one for a struct it holds by value, sets nothing.
        let mut empty = cm.clone();
        empty.spec.as_mut().unwrap().containers[0].liveness_probe = Some(Default::default());
        assert!(decode(&envelope("v1", "Pod", empty.encode_to_vec())).is_ok());
        let e = decode(&envelope("batch/v1", "Job", Vec::new())).unwrap_err();
        assert_eq!(e.code, 415);
        assert_eq!(decode(b"not protobuf").unwrap_err().code, 400);
        assert_eq!(decode(b"k8s\0\xff\xff").unwrap_err().code, 400);
    }
}
