//! The view of an object for a caller: an object as the seam returns it, and a
//! Secret redacted unless the policy reveals its values to the caller.

use std::collections::BTreeMap;

use fleetscope_index::{Event, Object};
use fleetscope_model::Json;
use fleetscope_model::access::{ClusterRef, Policy, Subject};
use fleetscope_model::fleet::{FleetObject, Projection};

/// An object as the seam returns it.
pub(crate) fn fleet_object(o: &Object, projection: Projection) -> FleetObject {
    let json = match projection {
        Projection::Metadata => o.metadata_json(),
        Projection::Full => o.json(),
    };
    // Either holds the metadata: read from the text made, not the object's own again.
    let (uid, resource_version) = fleetscope_index::uid_and_resource_version(&json);
    object_view(o, json, uid, resource_version)
}

/// The object of a Watch event as the seam returns it: its uid, resourceVersion and
/// JSON read once for every subscriber.
pub(crate) fn event_object(e: &Event, projection: Projection) -> FleetObject {
    let (uid, resource_version) = e.uid_and_resource_version();
    let json = match projection {
        Projection::Metadata => e.object.metadata_json(),
        Projection::Full => e.json(),
    };
    object_view(
        &e.object,
        json,
        uid.to_string(),
        resource_version.to_string(),
    )
}

fn object_view(o: &Object, json: Json, uid: String, resource_version: String) -> FleetObject {
    FleetObject {
        key: o.key.clone(),
        revision: o.revision,
        uid,
        resource_version,
        json,
    }
}

/// The name Secrets are collected under.
const SECRETS: &str = "secrets";

/// Whether objects of `resource` carry values that are redacted unless a grant
/// reveals them.
pub(crate) fn holds_secrets(resource: &str) -> bool {
    resource == SECRETS
}

/// A Secret as shown to a caller the policy does not reveal its values to: every
/// value of `data` and `stringData` emptied (the keys stay, so a caller can see what
/// a Secret holds), every other copy of them dropped (kubectl's last-applied
/// annotation holds the whole Secret as applied), and the annotation
/// `fleetscope.io/redacted` saying what was taken. A metadata-only Secret is
/// redacted too: its annotations are the copy it carries.
pub(crate) fn redact_secret(object: &mut FleetObject) {
    let Ok(serde_json::Value::Object(mut v)) = serde_json::from_str(&object.json) else {
        // Not an object: nothing of it is shown.
        object.json = "{}".into();
        return;
    };
    let mut redacted = Vec::new();
    for field in ["data", "stringData"] {
        if let Some(serde_json::Value::Object(values)) = v.get_mut(field) {
            for value in values.values_mut() {
                *value = serde_json::Value::String(String::new());
            }
            redacted.push(field);
        }
    }
    let annotations = match v.get_mut("metadata") {
        Some(serde_json::Value::Object(meta)) => match meta.get_mut("annotations") {
            Some(serde_json::Value::Object(a)) => Some(a),
            _ => None,
        },
        _ => None,
    };
    if let Some(a) = annotations
        && a.remove(LAST_APPLIED).is_some()
    {
        redacted.push(LAST_APPLIED);
    }
    if redacted.is_empty() {
        return;
    }
    if let Some(serde_json::Value::Object(meta)) = v.get_mut("metadata") {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let serde_json::Value::Object(a) = annotations {
            a.insert(
                REDACTED_ANNOTATION.into(),
                serde_json::Value::String(redacted.join(",")),
            );
        }
    }
    object.json = serde_json::Value::Object(v).to_string().into();
}

/// kubectl's record of an object as last applied: on a Secret, its values.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The annotation a redacted Secret carries: which of its fields were emptied.
pub const REDACTED_ANNOTATION: &str = "fleetscope.io/redacted";

/// Shows `object` to a caller: redacted when it is a Secret whose values the policy
/// does not reveal to them.
pub(crate) fn shown(
    mut object: FleetObject,
    policy: &dyn Policy,
    who: &Subject,
    labels: &BTreeMap<String, String>,
) -> FleetObject {
    if holds_secrets(&object.key.resource)
        && !policy.secret_data(
            who,
            ClusterRef {
                name: &object.key.cluster,
                labels,
            },
            &object.key.namespace,
        )
    {
        redact_secret(&mut object);
    }
    object
}

#[cfg(test)]
mod tests {
    use fleetscope_model::access::Everything;
    use fleetscope_model::{ClusterName, ObjectKey, Revision};
    use serde_json::{Value, json};

    use super::*;

    fn object(resource: &str, body: Value) -> FleetObject {
        FleetObject {
            key: ObjectKey::new(resource, &ClusterName::from("c"), "ns", "x"),
            revision: Revision(1),
            uid: String::new(),
            resource_version: String::new(),
            json: body.to_string().into(),
        }
    }

    #[test]
    fn a_redacted_secret_keeps_its_keys_and_says_what_was_taken() {
        let mut s = object(
            "secrets",
            json!({"metadata": {"annotations": {LAST_APPLIED: "{\"data\":{\"p\":\"c2VjcmV0\"}}", "a": "b"}},
                   "data": {"p": "c2VjcmV0"}, "stringData": {"q": "plain"}, "type": "Opaque"}),
        );
        redact_secret(&mut s);
        let v: Value = serde_json::from_str(&s.json).unwrap();
        assert_eq!(v["data"], json!({"p": ""}));
        assert_eq!(v["stringData"], json!({"q": ""}));
        assert_eq!(v["type"], "Opaque");
        let a = &v["metadata"]["annotations"];
        assert!(a.get(LAST_APPLIED).is_none(), "{a}");
        assert_eq!(a["a"], "b");
        assert_eq!(
            a[REDACTED_ANNOTATION],
            format!("data,stringData,{LAST_APPLIED}")
        );
        assert!(!s.json.contains("c2VjcmV0") && !s.json.contains("plain"));
    }

    #[test]
    fn only_secrets_are_redacted_and_only_for_callers_not_granted_their_values() {
        let body = json!({"metadata": {}, "data": {"p": "v"}});
        let who = Subject::unrestricted();
        let labels = BTreeMap::new();
        // Granted: shown whole.
        let s = shown(object("secrets", body.clone()), &Everything, &who, &labels);
        assert_eq!(s.json, body.to_string());
        // Not a Secret: never touched.
        struct Nothing;
        impl Policy for Nothing {
            fn namespaces(
                &self,
                _: &Subject,
                _: fleetscope_model::Verb,
                _: &fleetscope_model::ResourceType,
                _: ClusterRef<'_>,
            ) -> fleetscope_model::access::Namespaces {
                fleetscope_model::access::Namespaces::All
            }
            fn secret_data(&self, _: &Subject, _: ClusterRef<'_>, _: &str) -> bool {
                false
            }
            fn sees_cluster(&self, _: &Subject, _: ClusterRef<'_>) -> bool {
                true
            }
        }
        let c = shown(object("configmaps", body.clone()), &Nothing, &who, &labels);
        assert_eq!(c.json, body.to_string());
        let s = shown(object("secrets", body), &Nothing, &who, &labels);
        assert!(s.json.contains(r#""p":"""#), "{}", s.json);
        // Not an object at all: nothing of it is shown.
        let mut odd = object("secrets", json!(["not", "an", "object"]));
        redact_secret(&mut odd);
        assert_eq!(odd.json, "{}");
    }
}
