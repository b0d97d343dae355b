//! The view of an object for a caller: an object as the seam returns it, and a
//! Secret redacted unless the policy reveals its values to the caller.

use std::collections::BTreeMap;

use fleetscope_index::{Event, Object};
use fleetscope_model::Json;
use fleetscope_model::access::{
    Access, ClusterRef, Hidden, LAST_APPLIED, Policy, SECRET_VALUE_FIELDS, Subject,
};
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
    for field in SECRET_VALUE_FIELDS {
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

/// The annotation a redacted Secret carries: which of its fields were emptied.
pub const REDACTED_ANNOTATION: &str = "fleetscope.io/redacted";

/// Where `access`'s caller is not shown Secrets' values, asked of the policy in force
/// when each object is read (a running Watch follows a new policy at once).
pub(crate) fn hidden(access: &Access, status: &crate::status::StatusTable) -> Hidden {
    let access = access.clone();
    let labels = status.all_labels();
    let status = status.clone();
    Hidden::new(move |cluster, namespace| {
        // A cluster that came after the query began is looked up; one gone reads as
        // unlabelled, which grants no more than its labels would.
        let later;
        let labels = match labels.get(cluster) {
            Some(l) => l,
            None => {
                later = status.labels(cluster).unwrap_or_default();
                &later
            }
        };
        !access.policy().secret_data(
            access.subject(),
            ClusterRef {
                name: cluster,
                labels,
            },
            namespace,
        )
    })
}

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

    /// Nothing a caller receives depends on a Secret's values hidden from them: two
    /// fleets that differ only in the values of Secrets in hidden places give the
    /// same answers (objects as shown in either projection, counts, group keys, the
    /// events a Watch's filter passes), whatever the query.
    mod hidden_values {
        use fleetscope_index::{Change, Config, Index, Query, transition};
        use fleetscope_model::access::{Hidden, LAST_APPLIED};
        use fleetscope_model::{
            ClusterName, FieldSelector, GroupBy, LabelSelector, ObjectKey, ObjectState,
        };
        use proptest::prelude::*;

        use super::super::{fleet_object, redact_secret};
        use fleetscope_model::fleet::Projection;

        const PLACES: [(&str, &str); 4] = [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")];
        const VALUES: [&str; 3] = ["", "czEx", "czIy"];
        const FIELDS: [&str; 8] = [
            "",
            "data.token=czEx",
            "data.token!=czEx",
            "data.token=",
            "stringData.t=czIy",
            "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration!=x",
            "data=,type=Opaque",
            "type=Opaque",
        ];
        const GROUPS: [&str; 5] = [
            "field:data.token",
            "field:stringData.t",
            "label:app",
            "field:type",
            "cluster",
        ];

        fn secret(place: usize, name: usize, label: bool, value: &str) -> ObjectState {
            let (cluster, ns) = PLACES[place];
            let name = format!("s{name}");
            let app = if label { "web" } else { "db" };
            let applied = serde_json::json!({"data": {"token": value}}).to_string();
            let json = serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": "1",
                    "labels": {"app": app}, "annotations": {LAST_APPLIED: applied}},
                "data": {"token": value}, "stringData": {"t": value}, "type": "Opaque"
            });
            ObjectState {
                key: ObjectKey::new("secrets", &ClusterName::from(cluster), ns, &name),
                json: json.to_string().into(),
                labels: vec![("app".into(), app.into())],
                owners: Vec::new(),
                fields: vec![("data.token".into(), value.into())],
            }
        }

        /// What a caller receives, from one fleet.
        fn answers(
            objects: &[ObjectState],
            q: &Query,
            group_by: &[GroupBy],
        ) -> (
            Vec<String>,
            fleetscope_index::Counts,
            Vec<Option<fleetscope_model::EventType>>,
        ) {
            let idx = Index::new(Config {
                field_indexes: vec!["data.token".into()],
                ..Config::default()
            });
            let events = idx.apply(objects.iter().cloned().map(Change::Upsert));
            let passed = events.iter().map(|e| transition(q, e)).collect();
            let s = idx.snapshot();
            let mut shown = Vec::new();
            for o in s.page(q, None, 1000).items {
                for projection in [Projection::Full, Projection::Metadata] {
                    let mut f = fleet_object(&o, projection);
                    let hidden = q
                        .hidden
                        .as_ref()
                        .is_some_and(|h| h.hides(&o.key.cluster, &o.key.namespace, "data"));
                    if hidden {
                        redact_secret(&mut f);
                    }
                    shown.push(f.json.to_string());
                }
            }
            (shown, s.count(q, group_by), passed)
        }

        proptest! {
            #[test]
            fn no_answer_depends_on_a_hidden_value(
                objects in prop::collection::vec((0..4usize, any::<bool>(), 0..3usize, 0..3usize), 1..12),
                hidden_places in 0..16u8,
                fields in 0..FIELDS.len(),
                labelled in any::<bool>(),
                groups in prop::collection::vec(0..GROUPS.len(), 0..3),
            ) {
                let hides = move |c: &ClusterName, ns: &str| {
                    PLACES.iter().position(|p| p.0 == c.as_str() && p.1 == ns)
                        .is_some_and(|i| hidden_places & (1 << i) != 0)
                };
                let q = Query {
                    fields: FieldSelector::parse(FIELDS[fields]).unwrap(),
                    labels: LabelSelector::parse(if labelled { "app=web" } else { "" }).unwrap(),
                    hidden: Some(Hidden::new(hides)),
                    ..Query::all("secrets")
                };
                let group_by: Vec<GroupBy> = groups.iter().map(|g| GroupBy::parse(GROUPS[*g]).unwrap()).collect();
                // Fleet one and fleet two: the same Secrets, with other values where hidden.
                let one: Vec<ObjectState> = objects.iter().enumerate()
                    .map(|(i, (place, label, v1, _))| secret(*place, i, *label, VALUES[*v1]))
                    .collect();
                let two: Vec<ObjectState> = objects.iter().enumerate()
                    .map(|(i, (place, label, v1, v2))| {
                        let (c, ns) = PLACES[*place];
                        let v = if hides(&ClusterName::from(c), ns) { v2 } else { v1 };
                        secret(*place, i, *label, VALUES[*v])
                    })
                    .collect();
                prop_assert_eq!(answers(&one, &q, &group_by), answers(&two, &q, &group_by));
            }
        }

        #[test]
        fn a_value_shown_to_the_caller_is_selected_and_grouped_by() {
            let q = Query {
                fields: FieldSelector::parse("data.token=czEx").unwrap(),
                hidden: Some(Hidden::new(|_, ns| ns == "y")),
                ..Query::all("secrets")
            };
            let objects = [secret(0, 0, true, "czEx"), secret(1, 1, true, "czEx")];
            let group = [GroupBy::parse("field:data.token").unwrap()];
            let (shown, counts, _) = answers(&objects, &q, &group);
            assert_eq!(shown.len(), 2, "one object, in two projections: {shown:?}");
            assert!(shown[0].contains("czEx"), "{}", shown[0]);
            assert_eq!(
                counts.groups.keys().collect::<Vec<_>>(),
                [&vec!["czEx".to_string()]]
            );
            let everywhere = Query { hidden: None, ..q };
            assert_eq!(answers(&objects, &everywhere, &group).1.total, 2);
        }
    }
}
