use super::*;
use crate::resource::builtin;

fn store() -> Store {
    let s = Store::new("t", builtin(), 100, 64);
    s.create("namespaces", None, json!({"metadata": {"name": "ns"}}))
        .unwrap();
    s
}

#[test]
fn each_write_takes_the_next_resource_version() {
    let s = store();
    let a = s
        .create("configmaps", Some("ns"), json!({"metadata": {"name": "a"}}))
        .unwrap();
    let b = s
        .patch("configmaps", "ns", "a", &json!({"data": {"k": "v"}}))
        .unwrap();
    let c = s.delete("configmaps", "ns", "a").unwrap();
    assert_eq!((a.rv + 1, b.rv + 1), (b.rv, c.rv));
    assert_eq!(s.resource_version(), c.rv);
    assert!(s.get("configmaps", "ns", "a").is_none());
}

#[test]
fn snapshots_read_the_past_by_undoing_history() {
    let s = store();
    let a = s
        .create("configmaps", Some("ns"), json!({"metadata": {"name": "a"}}))
        .unwrap();
    let at = s.resource_version();
    s.patch(
        "configmaps",
        "ns",
        "a",
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .unwrap();
    s.create("configmaps", Some("ns"), json!({"metadata": {"name": "b"}}))
        .unwrap();
    s.delete("configmaps", "ns", "a").unwrap();
    let past = s.snapshot("configmaps", ReadAt::Exact(at)).unwrap();
    assert_eq!(past.objects.len(), 1);
    assert_eq!(past.objects.values().next().unwrap().rv, a.rv);
    let now = s.snapshot("configmaps", ReadAt::Latest).unwrap();
    assert_eq!(
        now.objects
            .keys()
            .map(|k| k.to_string())
            .collect::<Vec<_>>(),
        ["ns/b"]
    );
}

#[test]
fn compaction_expires_older_reads_and_watches() {
    let s = store();
    let before = s.resource_version();
    s.create("configmaps", Some("ns"), json!({"metadata": {"name": "a"}}))
        .unwrap();
    s.compact();
    assert_eq!(
        s.snapshot("configmaps", ReadAt::Exact(before))
            .err()
            .unwrap()
            .code,
        410
    );
    assert_eq!(
        s.subscribe("configmaps", WatchFrom::After(before))
            .err()
            .unwrap()
            .code,
        410
    );
}

#[test]
fn history_is_bounded() {
    let s = Store::new("t", builtin(), 3, 64);
    s.create("namespaces", None, json!({"metadata": {"name": "ns"}}))
        .unwrap();
    for i in 0..10 {
        s.create(
            "configmaps",
            Some("ns"),
            json!({"metadata": {"name": format!("c{i}")}}),
        )
        .unwrap();
    }
    assert_eq!(s.oldest_resource_version(), s.resource_version() - 3);
}

#[test]
fn writes_validate_their_input() {
    let s = store();
    assert_eq!(
        s.create(
            "configmaps",
            Some("nope"),
            json!({"metadata": {"name": "a"}})
        )
        .unwrap_err()
        .code,
        404
    );
    assert_eq!(
        s.create(
            "configmaps",
            Some("ns"),
            json!({"metadata": {"name": "A_b"}})
        )
        .unwrap_err()
        .code,
        422
    );
    assert_eq!(
        s.create("configmaps", Some("ns"), json!([1]))
            .unwrap_err()
            .code,
        400
    );
    assert_eq!(
        s.create(
            "configmaps",
            Some("ns"),
            json!({"kind": "Pod", "metadata": {"name": "a"}})
        )
        .unwrap_err()
        .code,
        400
    );
    s.create("configmaps", Some("ns"), json!({"metadata": {"name": "a"}}))
        .unwrap();
    assert_eq!(
        s.create("configmaps", Some("ns"), json!({"metadata": {"name": "a"}}))
            .unwrap_err()
            .code,
        409
    );
    let stale = json!({"metadata": {"name": "a", "resourceVersion": "1"}});
    assert_eq!(
        s.update("configmaps", "ns", "a", stale).unwrap_err().reason,
        "Conflict"
    );
}

#[test]
fn a_name_the_api_server_refuses_is_refused_with_its_causes() {
    let s = store();
    // As kube-apiserver v1.20 answers `kubectl create configmap Bad_Name`.
    let e = s
        .create(
            "configmaps",
            Some("ns"),
            json!({"metadata": {"name": "Bad_Name"}}),
        )
        .unwrap_err();
    let cause = "Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    assert_eq!(
        e.body(),
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("ConfigMap \"Bad_Name\" is invalid: metadata.name: {cause}"),
            "reason": "Invalid",
            "details": {
                "name": "Bad_Name",
                "kind": "ConfigMap",
                "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": "metadata.name"}]
            },
            "code": 422
        })
    );
    // A name both too long and not a subdomain has both causes; a named group's
    // kind is qualified by it; no name at all is a required value.
    let long = "X".repeat(254);
    let e = s
        .create(
            "deployments.apps",
            Some("ns"),
            json!({"metadata": {"name": long}}),
        )
        .unwrap_err();
    let body = e.body();
    assert!(
        e.message.starts_with(&format!(
            "Deployment.apps \"{long}\" is invalid: [metadata.name: Invalid value: "
        )),
        "{}",
        e.message
    );
    assert_eq!(body["details"]["group"], "apps");
    assert_eq!(body["details"]["causes"].as_array().map(Vec::len), Some(2));
    assert!(
        body["details"]["causes"][0]["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("must be no more than 253 characters"))
    );
    let e = s
        .create("configmaps", Some("ns"), json!({"metadata": {}}))
        .unwrap_err();
    assert_eq!(
        e.message,
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
    assert_eq!(
        e.body()["details"],
        json!({"kind": "ConfigMap", "causes": [{"reason": "FieldValueRequired", "message": "Required value: name or generateName is required", "field": "metadata.name"}]})
    );
}

#[test]
fn generate_name_makes_a_unique_name() {
    let s = store();
    let o = s
        .create(
            "configmaps",
            Some("ns"),
            json!({"metadata": {"generateName": "web-"}}),
        )
        .unwrap();
    assert!(
        o.name.starts_with("web-") && o.name.len() == 9,
        "{}",
        o.name
    );
}

#[test]
fn merge_patch_follows_rfc_7386() {
    let mut v = json!({"a": {"b": 1, "c": 2}, "d": [1]});
    merge_patch(&mut v, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
    assert_eq!(v, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
}
