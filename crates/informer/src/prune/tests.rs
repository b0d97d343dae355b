use super::list::{ListError, ListMeta, ListReader};
use super::*;
use proptest::prelude::*;
use serde_json::Value;

fn pods() -> ResourceType {
    ResourceType::new("", "v1", "pods", "Pod", true)
}

#[test]
fn strings_are_read_from_raw_json_with_or_without_escapes() {
    assert_eq!(string_of(r#""web-1""#).as_deref(), Some("web-1"));
    assert_eq!(string_of(r#""""#).as_deref(), Some(""));
    assert_eq!(string_of(r#""a\"b\\c""#).as_deref(), Some(r#"a"b\c"#));
    assert_eq!(string_of(r#""\u00e9t\u00e9""#).as_deref(), Some("été"));
    assert_eq!(string_of("été").as_deref(), None);
    for not_a_string in ["1", "null", "true", "[\"a\"]", "{\"a\":\"b\"}"] {
        assert_eq!(string_of(not_a_string), None, "{not_a_string}");
    }
}

#[test]
fn a_value_that_is_not_an_object_is_named_in_the_error() {
    let err = |raw: &str| {
        prune(raw, &pods(), &Pruning::default())
            .err()
            .map(|e| e.to_string())
    };
    for (raw, what) in [
        ("5", "the object is a number"),
        ("[1, {}]", "the object is an array"),
        ("null", "the object is null"),
        (r#"{"metadata": true}"#, "metadata is a boolean"),
        (r#"{"metadata": "x"}"#, "metadata is a string"),
        (r#"{"metadata": 1.5}"#, "metadata is a number"),
    ] {
        assert_eq!(
            err(raw),
            Some(format!("not a JSON object: {what}")),
            "{raw}"
        );
    }
}

#[test]
fn owner_uids_are_read_from_the_references_that_have_one() {
    let raw = r#"{"metadata":{"name":"p","ownerReferences":[
        {"kind":"ReplicaSet","uid":"rs-1","controller":true}, 5, "x", null, [1, {"uid":"no"}],
        {"kind":"Job"}, {"uid":7}, {"uid":"a\"b", "name":"n"}]}}"#;
    let p = prune(raw, &pods(), &Pruning::default()).unwrap();
    assert_eq!(p.owners, ["rs-1", "a\"b"]);
    // Kept as they came, all of them.
    let v: Value = serde_json::from_str(&p.json).unwrap();
    assert_eq!(
        v["metadata"]["ownerReferences"].as_array().unwrap().len(),
        8
    );
}

#[test]
fn prunes_managed_fields_and_last_applied_and_fills_type() {
    let raw = r#"{"metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"7","labels":{"app":"web"},
        "ownerReferences":[{"uid":"rs-1","kind":"ReplicaSet"}],
        "managedFields":[{"manager":"kubectl"}],
        "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}","keep":"me"}},"spec":{}}"#;
    let p = prune(raw, &pods(), &Pruning::default()).unwrap();
    let v: Value = serde_json::from_str(&p.json).unwrap();
    assert_eq!(v["kind"], "Pod");
    assert_eq!(v["apiVersion"], "v1");
    assert!(v["metadata"].get("managedFields").is_none());
    assert_eq!(
        v["metadata"]["annotations"],
        serde_json::json!({"keep": "me"})
    );
    assert_eq!(
        (
            p.name.as_str(),
            p.namespace.as_str(),
            p.resource_version.as_str()
        ),
        ("p", "n", "7")
    );
    assert_eq!(p.labels, [("app".to_string(), "web".to_string())]);
    assert_eq!(p.owners, ["rs-1"]);
    assert!(
        p.json
            .starts_with(r#"{"apiVersion":"v1","kind":"Pod","metadata""#)
    );
}

#[test]
fn malformed_objects_are_errors_not_panics() {
    for raw in [
        "nope",
        "[1]",
        r#"{"metadata":"x"}"#,
        r#"{"metadata":{}}"#,
        r#"{"spec":{}}"#,
    ] {
        assert!(prune(raw, &pods(), &Pruning::default()).is_err(), "{raw}");
    }
}

#[test]
fn an_object_with_a_key_twice_is_refused_naming_the_key() {
    for (raw, key) in [
        (
            r#"{"metadata":{"name":"a"},"metadata":{"name":"b"}}"#,
            "metadata",
        ),
        (
            r#"{"metadata":{"name":"a"},"spec":{},"spec":{"x":1}}"#,
            "spec",
        ),
        (r#"{"metadata":{"name":"a","name":"b"}}"#, "metadata.name"),
        (
            r#"{"metadata":{"name":"a","labels":{},"labels":{"x":"y"}}}"#,
            "metadata.labels",
        ),
    ] {
        let e = prune(raw, &pods(), &Pruning::default()).unwrap_err();
        assert!(
            matches!(&e, PruneError::DuplicateKey(k) if k == key),
            "{raw}: {e}"
        );
    }
    // Keys of nested objects are the reader's concern, not the object's identity.
    assert!(
        prune(
            r#"{"metadata":{"name":"a"},"spec":{"x":1,"y":2}}"#,
            &pods(),
            &Pruning::default()
        )
        .is_ok()
    );
}

/// What pruning means, said on decoded trees: the object without managedFields
/// and the pruned annotations (and without annotations once none is left), with
/// apiVersion and kind of its type.
fn pruned_tree(raw: &Value, rt: &ResourceType, pruning: &Pruning) -> Value {
    let mut v = raw.clone();
    let meta = v["metadata"].as_object_mut().unwrap();
    if pruning.managed_fields {
        meta.remove("managedFields");
    }
    if let Some(Value::Object(ann)) = meta.get_mut("annotations") {
        for a in &pruning.annotations {
            ann.remove(a);
        }
        if ann.is_empty() {
            meta.remove("annotations");
        }
    }
    v["apiVersion"] = rt.api_version().into();
    v["kind"] = rt.kind.clone().into();
    v
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9./-]{0,12}",
        // Escapes, quotes, control characters and non-ASCII.
        "[a-z\"\\\\\n\t\u{1}é☃]{0,6}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn object() -> impl Strategy<Value = Value> {
    let strings = || proptest::collection::btree_map(text(), text(), 0..4);
    (
        "[a-z][a-z0-9-]{0,10}",
        proptest::option::of(text()),
        proptest::option::of(strings()),
        proptest::option::of(strings()),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(proptest::collection::vec(text(), 0..3)),
        proptest::collection::btree_map("[a-z]{1,8}", json_value(), 0..4),
    )
        .prop_map(
            |(name, namespace, labels, annotations, last_applied, managed, owners, rest)| {
                let mut meta = serde_json::Map::new();
                meta.insert("name".into(), name.into());
                if let Some(ns) = namespace {
                    meta.insert("namespace".into(), ns.into());
                }
                if let Some(l) = labels {
                    meta.insert("labels".into(), serde_json::json!(l));
                }
                let mut ann = annotations.map(|a| serde_json::json!(a));
                if last_applied {
                    ann.get_or_insert_with(|| serde_json::json!({}))
                        ["kubectl.kubernetes.io/last-applied-configuration"] = "{\"a\":1}".into();
                }
                if let Some(a) = ann {
                    meta.insert("annotations".into(), a);
                }
                if managed {
                    meta.insert(
                        "managedFields".into(),
                        serde_json::json!([{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]),
                    );
                }
                if let Some(o) = owners {
                    let refs: Vec<Value> =
                        o.iter().map(|u| serde_json::json!({"uid": u, "kind": "X"})).collect();
                    meta.insert("ownerReferences".into(), refs.into());
                }
                let mut top: serde_json::Map<String, Value> = rest
                    .into_iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                    .collect();
                top.insert("metadata".into(), Value::Object(meta));
                Value::Object(top)
            },
        )
}

#[test]
fn a_list_page_is_pruned_item_by_item_and_bad_items_are_skipped_alone() {
    let good = r#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"5","managedFields":[{"m":1}]},"spec":{"x":[1,2]}}"#;
    let page = format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"9","continue":"tok","remainingItemCount":40}},"items":[{good},7,"s",null,[1,{{"a":2}}],{{"metadata":"x"}},{{"metadata":{{}}}},{{"spec":{{}}}},{{"metadata":{{"name":"d"}},"metadata":{{"name":"e"}}}},{good}],"extra":{{"k":[]}}}}"#
    );
    let (meta, kept, skipped) = read_in_pieces(&page, &[page.len()]).unwrap();
    assert_eq!(
        (
            meta.resource_version.as_str(),
            meta.continue_token.as_deref(),
            meta.remaining_item_count
        ),
        ("9", Some("tok"), Some(40))
    );
    let one = prune(good, &pods(), &Pruning::default()).unwrap();
    assert_eq!(kept, [one.clone(), one]);
    assert_eq!(skipped, 8);
    assert_eq!(
        kept[0].json,
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"n","resourceVersion":"5"},"spec":{"x":[1,2]}}"#
    );

    let empty = r#"{"metadata":{"resourceVersion":"3"},"items":null}"#;
    let (meta, kept, skipped) = read_in_pieces(empty, &[empty.len()]).unwrap();
    assert_eq!(
        (meta.resource_version.as_str(), kept.len(), skipped),
        ("3", 0, 0)
    );
    for broken in ["", "[]", "{\"items\":[{]}", "{\"items\":5}", "{} x"] {
        assert!(
            read_in_pieces(broken, &[broken.len().max(1)]).is_err(),
            "{broken}"
        );
    }
}

/// What a [`ListReader`] makes of `text` fed in pieces of `sizes` (cycled).
fn read_in_pieces(
    text: &str,
    sizes: &[usize],
) -> Result<(ListMeta, Vec<PrunedObject>, usize), ListError> {
    let pruning = Pruning::default();
    let mut reader = ListReader::new(&pods(), &pruning);
    let (mut kept, mut skipped) = (Vec::new(), 0);
    let mut each = |r: Result<PrunedObject, PruneError>| match r {
        Ok(o) => kept.push(o),
        Err(_) => skipped += 1,
    };
    let bytes = text.as_bytes();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = sizes[i % sizes.len()].max(1).min(bytes.len() - at);
        reader.feed(&bytes[at..at + n], &mut each)?;
        at += n;
        i += 1;
    }
    let meta = reader.finish(&mut each)?;
    Ok((meta, kept, skipped))
}

/// What the whole text holds, read the plain way: the list decoded with its items
/// as raw text, each then pruned alone.
fn read_whole(text: &str) -> Result<(ListMeta, Vec<PrunedObject>, usize), serde_json::Error> {
    #[derive(Deserialize)]
    struct Page<'a> {
        #[serde(default)]
        metadata: ListMeta,
        #[serde(borrow, default)]
        items: Option<Vec<&'a RawValue>>,
    }
    let page: Page = serde_json::from_str(text)?;
    let (mut kept, mut skipped) = (Vec::new(), 0);
    for item in page.items.unwrap_or_default() {
        match prune(item.get(), &pods(), &Pruning::default()) {
            Ok(o) => kept.push(o),
            Err(_) => skipped += 1,
        }
    }
    Ok((page.metadata, kept, skipped))
}

fn same(
    a: &(ListMeta, Vec<PrunedObject>, usize),
    b: &(ListMeta, Vec<PrunedObject>, usize),
) -> bool {
    a.0.resource_version == b.0.resource_version
        && a.0.continue_token == b.0.continue_token
        && a.0.remaining_item_count == b.0.remaining_item_count
        && a.1 == b.1
        && a.2 == b.2
}

#[test]
fn a_list_read_as_it_arrives_equals_the_list_read_whole_however_it_is_split() {
    let good = r#"{"metadata":{"name":"a\"}","namespace":"n","resourceVersion":"5","managedFields":[{"m":1}]},"spec":{"x":[1,2],"s":"]}\\"}}"#;
    let page = format!(
        "{{\"kind\":\"PodList\", \"apiVersion\":\"v1\",\n \"metadata\" : {{\"resourceVersion\":\"9\",\"continue\":\"tok\",\"remainingItemCount\":40}},\"items\":[ {good} ,7,\"s\",null,true,[1,{{\"a\":2}}],{{\"metadata\":\"x\"}},{{\"metadata\":{{}}}},{{\"spec\":{{}}}},{good}],\"n\":-1.5e3,\"extra\":{{\"k\":[]}}}} "
    );
    let whole = read_whole(&page).unwrap();
    assert_eq!(whole.1.len(), 2);
    assert_eq!(whole.2, 8);
    for split in 1..page.len() {
        let got = read_in_pieces(&page, &[split, page.len()]).unwrap();
        assert!(same(&got, &whole), "split at {split}");
    }
    let got = read_in_pieces(&page, &[1]).unwrap();
    assert!(same(&got, &whole), "byte by byte");

    let empty = r#"{"metadata":{"resourceVersion":"3"},"items":null}"#;
    assert_eq!(read_in_pieces(empty, &[1]).unwrap().0.resource_version, "3");
    for broken in [
        "",
        "[]",
        "{\"items\":[{]}",
        "{\"items\":5}",
        "{} x",
        "{\"items\":[{}",
        "{\"metadata\":{\"resourceVersion\":3}, \"items\":[]}",
        "{\"items\":[],",
    ] {
        for size in [1, 3, 100] {
            assert!(
                read_in_pieces(broken, &[size]).is_err(),
                "{broken} in pieces of {size}"
            );
        }
    }
}

#[test]
fn watch_events_are_read_in_one_pass_whatever_their_member_order() {
    let pruning = Pruning::default();
    let mut reader = EventReader::new(&pods(), &pruning);
    let object = r#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"7","managedFields":[{}]},"spec":{}}"#;
    let whole = prune(object, &pods(), &pruning).unwrap();
    for line in [
        format!(r#"{{"type":"MODIFIED","object":{object}}}"#),
        format!(r#"{{"object":{object},"type":"MODIFIED"}}"#),
    ] {
        match reader.read(&line).unwrap() {
            WatchEvent::Object { kind, object } => {
                assert_eq!(kind, ObjectEvent::Modified);
                assert_eq!(object.unwrap(), whole);
            }
            other => panic!("{other:?}"),
        }
    }
    let bookmark =
        r#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"9"}}}"#;
    match reader.read(bookmark).unwrap() {
        WatchEvent::Other { kind, object } => {
            assert_eq!(kind, "BOOKMARK");
            assert!(object.get().contains("\"9\""));
        }
        other => panic!("{other:?}"),
    }
    match reader
        .read(r#"{"type":"DELETED","object":{"metadata":{}}}"#)
        .unwrap()
    {
        WatchEvent::Object { kind, object } => {
            assert_eq!(kind, ObjectEvent::Deleted);
            assert!(
                object.is_err(),
                "an object without a name is an error for it alone"
            );
        }
        other => panic!("{other:?}"),
    }
    for bad in [
        "",
        "[]",
        r#"{"type":"ADDED"}"#,
        r#"{"object":{}}"#,
        r#"{"type":5,"object":{}}"#,
        r#"{"type":"ADDED","object":{}} x"#,
    ] {
        assert!(reader.read(bad).is_err(), "{bad}");
    }
}

proptest! {
    #[test]
    fn a_list_of_any_objects_read_in_any_pieces_equals_the_list_read_whole(
        items in proptest::collection::vec(object(), 0..6),
        pretty in any::<bool>(),
        sizes in proptest::collection::vec(1usize..64, 1..8),
    ) {
        let list = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "12"}, "items": items});
        let text = if pretty {
            serde_json::to_string_pretty(&list).unwrap()
        } else {
            serde_json::to_string(&list).unwrap()
        };
        let whole = read_whole(&text).unwrap();
        let got = read_in_pieces(&text, &sizes).unwrap();
        prop_assert!(same(&got, &whole));
    }

    #[test]
    fn pruning_raw_text_equals_pruning_the_decoded_tree(v in object(), pretty in any::<bool>()) {
        let raw = if pretty {
            serde_json::to_string_pretty(&v).unwrap()
        } else {
            serde_json::to_string(&v).unwrap()
        };
        let pruning = Pruning::default();
        let p = prune(&raw, &pods(), &pruning).unwrap();
        let got: Value = serde_json::from_str(&p.json).unwrap();
        prop_assert_eq!(&got, &pruned_tree(&v, &pods(), &pruning));
        let meta = &v["metadata"];
        prop_assert_eq!(p.name.as_str(), meta["name"].as_str().unwrap());
        prop_assert_eq!(p.namespace.as_str(), meta["namespace"].as_str().unwrap_or(""));
        let labels: Vec<(String, String)> = meta["labels"]
            .as_object()
            .map(|l| l.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect())
            .unwrap_or_default();
        prop_assert_eq!(p.labels, labels);
        let owners: Vec<String> = meta["ownerReferences"]
            .as_array()
            .map(|o| o.iter().map(|r| r["uid"].as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        prop_assert_eq!(p.owners, owners);
    }
}

proptest! {
    /// A watch line is a cluster's input: any text is read or refused, never a
    /// panic; any line that reads is an event with its object's name kept.
    #[test]
    fn any_watch_line_is_read_or_refused_without_a_panic(
        line in "\\{\"type\":\"(ADDED|MODIFIED|DELETED|BOOKMARK|ERROR)\",\"object\":\\{[\"a-z:{}\\[\\],0-9]{0,80}\\}\\}|\\PC{0,80}",
    ) {
        let pruning = Pruning::default();
        let mut reader = EventReader::new(&pods(), &pruning);
        let _ = reader.read(&line);
    }
}
