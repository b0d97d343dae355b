use std::collections::BTreeMap;

use fleetscope_model::{ClusterName, EventType, FieldSelector, LabelSelector, ObjectKey, Revision};
use proptest::prelude::*;
use serde_json::json;

use super::*;

fn input(
    resource: &str,
    cluster: &str,
    ns: &str,
    name: &str,
    rv: u64,
    labels: &[(&str, &str)],
) -> ObjectState {
    let label_map: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let json = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": ns, "resourceVersion": rv.to_string(), "labels": label_map}, "spec": {"nodeName": format!("n{}", rv % 3)}, "status": {"phase": if rv.is_multiple_of(2) { "Running" } else { "Pending" }}});
    ObjectState {
        key: ObjectKey::new(resource, &ClusterName::from(cluster), ns, name),
        json: json.to_string().into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        owners: vec![format!("owner-{}", rv % 2)],
        fields: vec![("spec.nodeName".into(), format!("n{}", rv % 3))],
    }
}

/// What a store would give back for every object held, each one's JSON as text.
fn saved_inputs(saved: &State) -> Vec<RestoredObject> {
    saved.iter().map(|o| state_of(o).into()).collect()
}

/// An object's state as a store saves it, with its revision.
fn state_of(o: &Object) -> (ObjectState, Revision) {
    let text = |pairs: &[(Arc<str>, Arc<str>)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    (
        ObjectState {
            key: o.key.clone(),
            json: o.json().as_str().into(),
            labels: text(o.labels()),
            owners: o.owners().iter().map(|u| u.to_string()).collect(),
            fields: text(o.fields()),
        },
        o.revision,
    )
}

fn index() -> Index {
    Index::new(Config {
        field_indexes: vec!["spec.nodeName".into()],
        ..Config::default()
    })
}

/// A pod of `cluster`/`ns` named `name`.
fn upsert(cluster: &str, ns: &str, name: &str) -> Change {
    Change::Upsert(input("pods", cluster, ns, name, 1, &[]))
}

fn names(items: &[ObjectRef]) -> Vec<String> {
    items.iter().map(|o| o.key.to_string()).collect()
}

#[test]
fn each_change_gets_the_next_revision_and_no_ops_get_none() {
    let idx = index();
    let e = idx.apply([Change::Upsert(input("pods", "a", "x", "p", 1, &[]))]);
    assert_eq!(
        (e.len(), e[0].revision, e[0].kind),
        (1, Revision(1), EventType::Added)
    );
    assert!(
        idx.apply([Change::Upsert(input("pods", "a", "x", "p", 1, &[]))])
            .is_empty(),
        "same state: no event"
    );
    let e = idx.apply([
        Change::Upsert(input("pods", "a", "x", "p", 2, &[])),
        Change::Delete(ObjectKey::new("pods", &"a".into(), "x", "p")),
    ]);
    assert_eq!(
        e.iter().map(|e| (e.revision.0, e.kind)).collect::<Vec<_>>(),
        [(2, EventType::Modified), (3, EventType::Deleted)]
    );
    assert_eq!(idx.snapshot().revision(), Revision(3));
    assert!(idx.snapshot().is_empty());
}

#[test]
fn replace_diffs_a_relist_into_deletes_modifications_and_adds() {
    let idx = index();
    idx.apply([
        Change::Upsert(input("pods", "a", "x", "gone", 1, &[])),
        Change::Upsert(input("pods", "a", "x", "same", 1, &[])),
        Change::Upsert(input("pods", "a", "x", "changed", 1, &[])),
        Change::Upsert(input("pods", "b", "x", "other-cluster", 1, &[])),
    ]);
    let events = idx.apply([Change::Replace {
        resource: "pods".into(),
        cluster: "a".into(),
        objects: vec![
            input("pods", "a", "x", "same", 1, &[]),
            input("pods", "a", "x", "changed", 2, &[]),
            input("pods", "a", "x", "new", 1, &[]),
        ],
    }]);
    let got: Vec<(String, EventType)> = events
        .iter()
        .map(|e| (e.object.key.name.to_string(), e.kind))
        .collect();
    assert_eq!(
        got,
        [
            ("gone".into(), EventType::Deleted),
            ("changed".into(), EventType::Modified),
            ("new".into(), EventType::Added)
        ]
    );
    assert_eq!(idx.snapshot().len(), 4, "the other cluster is untouched");
}

#[test]
fn snapshots_are_unaffected_by_later_batches() {
    let idx = index();
    idx.apply([Change::Upsert(input(
        "pods",
        "a",
        "x",
        "p",
        1,
        &[("app", "web")],
    ))]);
    let before = idx.snapshot();
    idx.apply([
        Change::Delete(ObjectKey::new("pods", &"a".into(), "x", "p")),
        Change::Upsert(input("pods", "a", "x", "q", 1, &[])),
    ]);
    assert_eq!(
        names(&before.page(&Query::all("pods"), None, 10).items),
        ["a/pods/x/p"]
    );
    assert_eq!(
        before
            .page(
                &Query {
                    labels: LabelSelector::parse("app=web").unwrap(),
                    ..Query::all("pods")
                },
                None,
                10
            )
            .items
            .len(),
        1
    );
    assert_eq!(
        names(&idx.snapshot().page(&Query::all("pods"), None, 10).items),
        ["a/pods/x/q"]
    );
}

#[test]
fn queries_select_by_cluster_namespace_label_and_field_in_key_order() {
    let idx = index();
    let mut batch = Vec::new();
    for (i, c) in ["b", "a", "c"].iter().enumerate() {
        for n in 0..4u64 {
            let app = if n % 2 == 0 { "web" } else { "db" };
            batch.push(Change::Upsert(input(
                "pods",
                c,
                if n < 2 { "ns1" } else { "ns2" },
                &format!("p{n}"),
                n + i as u64,
                &[("app", app)],
            )));
        }
    }
    batch.push(Change::Upsert(input(
        "configmaps",
        "a",
        "ns1",
        "cm",
        1,
        &[("app", "web")],
    )));
    idx.apply(batch);
    let s = idx.snapshot();
    let all = s.page(&Query::all("pods"), None, 100);
    assert_eq!(all.items.len(), 12);
    assert!(
        all.items.windows(2).all(|w| w[0].key < w[1].key),
        "key order"
    );
    let q = Query {
        clusters: Some(vec!["c".into(), "a".into()]),
        namespaces: vec!["ns2".into()],
        ..Query::all("pods")
    };
    assert_eq!(
        names(&s.page(&q, None, 100).items),
        [
            "a/pods/ns2/p2",
            "a/pods/ns2/p3",
            "c/pods/ns2/p2",
            "c/pods/ns2/p3"
        ]
    );
    let q = Query {
        labels: LabelSelector::parse("app in (web)").unwrap(),
        ..Query::all("pods")
    };
    assert_eq!(s.page(&q, None, 100).items.len(), 6);
    let q = Query {
        fields: "status.phase=Running,spec.nodeName!=n9".parse().unwrap(),
        ..Query::all("pods")
    };
    assert_eq!(s.page(&q, None, 100).items.len(), 6);
    let q = Query {
        fields: "spec.nodeName=n0".parse().unwrap(),
        ..Query::all("pods")
    };
    assert!(
        s.page(&q, None, 100)
            .items
            .iter()
            .all(|o| o.fields()[0].1.as_ref() == "n0")
    );
    assert_eq!(
        s.owned_by("owner-0").len(),
        6,
        "pods with an even resourceVersion"
    );
}

/// A snapshot of 25 pods, p00 … p24, all labelled app=web.
fn twenty_five_web_pods() -> Arc<State> {
    let idx = index();
    idx.apply((0..25).map(|i| {
        Change::Upsert(input(
            "pods",
            "a",
            "ns",
            &format!("p{i:02}"),
            i,
            &[("app", "web")],
        ))
    }));
    idx.snapshot()
}

#[test]
fn pages_walk_one_snapshot_with_remaining_counts() {
    let s = twenty_five_web_pods();
    for q in [
        Query::all("pods"),
        Query {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Query::all("pods")
        },
    ] {
        let mut after = None;
        let mut seen = Vec::new();
        loop {
            let page = s.page(&q, after.as_ref(), 10);
            assert_eq!(page.remaining as usize, 25 - seen.len() - page.items.len());
            seen.extend(names(&page.items));
            match page.next {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        assert_eq!(seen.len(), 25);
    }
}

#[test]
fn an_index_s_candidates_are_read_as_pages_need_them_and_every_remainder_is_exact() {
    let idx = Index::new(Config::default());
    idx.apply((0..1000).map(|i| {
        let app = if i % 2 == 0 { "web" } else { "db" };
        Change::Upsert(input(
            "pods",
            "c1",
            "ns",
            &format!("p{i:04}"),
            i,
            &[("app", app)],
        ))
    }));
    let s = idx.snapshot();
    // The label index gives the candidates; the field selector filters them.
    let q = Query {
        labels: LabelSelector::parse("app=web").unwrap(),
        fields: FieldSelector::parse("metadata.name!=p0010").unwrap(),
        ..Query::all("pods")
    };
    let expected: Vec<String> = (0..1000)
        .filter(|i| i % 2 == 0 && *i != 10)
        .map(|i| {
            ObjectKey::new("pods", &ClusterName::from("c1"), "ns", &format!("p{i:04}")).to_string()
        })
        .collect();
    let (seen, remainders) = page_through(&s, &q, 100);
    assert_eq!(seen, expected);
    for (remaining, so_far) in remainders {
        assert_eq!(remaining + so_far, expected.len());
    }
}

/// Every match of `q` in `s`, read `size` at a time, each page's remainder carried to
/// the next as a page token carries it; and after each page, its remainder and how
/// many came so far.
fn page_through(s: &State, q: &Query, size: usize) -> (Vec<String>, Vec<(usize, usize)>) {
    let (mut after, mut known, mut seen, mut remainders) = (None, None, Vec::new(), Vec::new());
    loop {
        let page = s.page_from(q, after.as_ref(), known, size, usize::MAX);
        seen.extend(names(&page.items));
        remainders.push((page.remaining as usize, seen.len()));
        match page.next {
            Some(k) => {
                after = Some(k);
                known = Some(page.remaining);
            }
            None => return (seen, remainders),
        }
    }
}

#[test]
fn pages_are_cut_by_bytes_and_always_move_on() {
    let s = twenty_five_web_pods();
    let largest = s.iter().map(|o| o.wire_size()).max().unwrap();
    for q in [
        Query::all("pods"),
        Query {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Query::all("pods")
        },
    ] {
        // Room for three objects, then for less than one.
        for (max_bytes, most) in [(3 * largest, 3), (1, 1)] {
            let (mut after, mut seen) = (None, Vec::new());
            loop {
                let page = s.page_within(&q, after.as_ref(), 10, max_bytes);
                assert!(!page.items.is_empty() && page.items.len() <= most);
                let bytes: usize = page.items.iter().map(|o| o.wire_size()).sum();
                assert!(page.items.len() == 1 || bytes <= max_bytes);
                assert_eq!(page.remaining as usize, 25 - seen.len() - page.items.len());
                seen.extend(names(&page.items));
                match page.next {
                    Some(k) => after = Some(k),
                    None => break,
                }
            }
            assert_eq!(seen.len(), 25, "{max_bytes}");
            assert!(seen.windows(2).all(|w| w[0] < w[1]));
        }
    }
}

#[test]
fn counts_group_by_cluster_namespace_label_and_field() {
    let idx = index();
    idx.apply([
        Change::Upsert(input("pods", "a", "x", "1", 2, &[("app", "web")])),
        Change::Upsert(input("pods", "a", "y", "2", 4, &[("app", "db")])),
        Change::Upsert(input("pods", "b", "x", "3", 1, &[])),
    ]);
    let s = idx.snapshot();
    let c = s.count(
        &Query::all("pods"),
        &[GroupBy::Cluster, GroupBy::Label("app".into())],
    );
    assert_eq!(c.total, 3);
    let groups: Vec<(Vec<String>, u64)> = c.groups.into_iter().collect();
    assert_eq!(
        groups,
        [
            (vec!["a".into(), "db".into()], 1),
            (vec!["a".into(), "web".into()], 1),
            (vec!["b".into(), "".into()], 1)
        ]
    );
    let c = s.count(
        &Query::all("pods"),
        &[GroupBy::Field("status.phase".into())],
    );
    assert_eq!(c.groups.get(&vec!["Running".to_string()]), Some(&2));
    assert_eq!(
        GroupBy::parse("label:app"),
        Some(GroupBy::Label("app".into()))
    );
    assert_eq!(GroupBy::parse("bogus"), None);
}

#[test]
fn subscriptions_resume_from_the_log_and_expire_past_retention() {
    let idx = Index::new(Config {
        log_retention: 5,
        ..Config::default()
    });
    for i in 0..10 {
        idx.apply([Change::Upsert(input(
            "pods",
            "a",
            "x",
            &format!("p{i}"),
            1,
            &[],
        ))]);
    }
    let mut sub = idx.subscribe(Some(Revision(7))).unwrap();
    assert_eq!(
        sub.feed
            .try_next()
            .unwrap()
            .iter()
            .map(|e| e.revision.0)
            .collect::<Vec<_>>(),
        [8, 9, 10]
    );
    assert_eq!(idx.oldest_resumable(), Revision(5));
    assert!(idx.subscribe(Some(Revision(5))).is_ok());
    assert_eq!(
        idx.subscribe(Some(Revision(4))).err(),
        Some(IndexError::Expired {
            requested: Revision(4),
            oldest: Revision(5)
        })
    );
    assert!(matches!(
        idx.subscribe(Some(Revision(11))),
        Err(IndexError::Future { .. })
    ));
}

#[tokio::test]
async fn live_events_reach_subscribers_and_laggards_are_told() {
    let idx = Index::new(Config {
        subscriber_buffer: 4,
        ..Config::default()
    });
    let mut fast = idx.subscribe(None).unwrap().feed;
    let mut slow = idx.subscribe(None).unwrap().feed;
    for i in 0..10 {
        idx.apply([Change::Upsert(input(
            "pods",
            "a",
            "x",
            &format!("p{i}"),
            1,
            &[],
        ))]);
        let got = fast.next().await.unwrap();
        assert_eq!(
            got.iter().map(|e| e.revision).collect::<Vec<_>>(),
            [Revision(i + 1)],
            "a fast subscriber keeps up"
        );
    }
    assert_eq!(
        slow.next().await.err(),
        Some(FeedError::Behind {
            reached: Revision(0),
            missed: 10
        }),
        "a slow one learns it fell behind"
    );
}

#[test]
fn a_staged_batch_is_invisible_until_published() {
    let idx = index();
    idx.apply([Change::Upsert(input("pods", "c1", "ns", "a", 1, &[]))]);
    let mut feed = idx.subscribe(None).unwrap().feed;
    let staged = idx.stage([Change::Upsert(input("pods", "c1", "ns", "b", 1, &[]))]);
    assert_eq!(staged.revision(), Some(Revision(2)));
    assert_eq!(
        idx.snapshot().revision(),
        Revision(1),
        "readers see the published state"
    );
    assert_eq!(idx.snapshot().len(), 1);
    assert!(
        feed.try_next().unwrap().is_empty(),
        "subscribers see nothing staged"
    );
    assert!(matches!(
        idx.subscribe(Some(Revision(2))),
        Err(IndexError::Future { .. })
    ));
    // The next batch builds on the staged one; both are published in order.
    let mut staged = staged;
    staged.then(idx.stage([Change::Delete(ObjectKey::new(
        "pods",
        &"c1".into(),
        "ns",
        "a",
    ))]));
    idx.publish(staged);
    assert_eq!(idx.snapshot().revision(), Revision(3));
    assert_eq!(
        names(&idx.snapshot().page(&Query::all("pods"), None, 10).items),
        ["c1/pods/ns/b"]
    );
    let got: Vec<_> = feed
        .try_next()
        .unwrap()
        .iter()
        .map(|e| (e.revision.0, e.kind))
        .collect();
    assert_eq!(got, [(2, EventType::Added), (3, EventType::Deleted)]);
}

#[test]
fn a_gap_in_what_is_published_ends_subscribers_behind_it() {
    let idx = index();
    idx.apply([Change::Upsert(input("pods", "c1", "ns", "a", 1, &[]))]);
    let mut behind = idx.subscribe(None).unwrap().feed;
    // Staged, then dropped without being published (a failing store's dropped backlog).
    drop(idx.stage([Change::Upsert(input("pods", "c1", "ns", "b", 1, &[]))]));
    idx.publish(idx.stage([Change::Upsert(input("pods", "c1", "ns", "c", 1, &[]))]));
    assert_eq!(idx.oldest_resumable(), Revision(2));
    assert_eq!(
        behind.try_next().err(),
        Some(FeedError::Expired {
            reached: Revision(1),
            oldest: Revision(2)
        })
    );
    assert!(matches!(
        idx.subscribe(Some(Revision(1))),
        Err(IndexError::Expired { .. })
    ));
}

#[test]
fn the_log_is_bounded_in_bytes() {
    let idx = Index::new(Config {
        log_bytes: 10_000,
        ..Config::default()
    });
    let mut big = input("configmaps", "c1", "ns", "big", 1, &[]);
    for i in 0..50 {
        big.json = format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(2_000)).into();
        idx.apply([Change::Upsert(big.clone())]);
    }
    let (events, bytes) = idx.log_size();
    assert!(bytes <= 10_000, "log holds {bytes} bytes");
    assert!(events >= 2, "the newest events are kept: {events}");
    assert_eq!(idx.oldest_resumable(), Revision(50 - events as u64));
    assert!(matches!(
        idx.subscribe(Some(Revision(10))),
        Err(IndexError::Expired { .. })
    ));
}

#[test]
fn secondary_sets_grow_past_a_few_members_and_shrink_back() {
    let idx = index();
    // Even resource versions: every object has owner-0, node n0/n2 alternating, app=web.
    let all: Vec<ObjectState> = (0..100)
        .map(|i| {
            input(
                "pods",
                "c1",
                "ns",
                &format!("p{i:03}"),
                2 * i,
                &[("app", "web")],
            )
        })
        .collect();
    idx.apply(all.into_iter().map(Change::Upsert));
    let s = idx.snapshot();
    assert_eq!(s.owned_by("owner-0").len(), 100);
    let q = Query {
        labels: LabelSelector::parse("app=web").unwrap(),
        ..Query::all("pods")
    };
    let page = s.page(&q, None, 1000);
    assert_eq!(page.items.len(), 100);
    assert!(page.items.windows(2).all(|w| w[0].key < w[1].key));
    // Delete 95 of them: the sets shrink back to a few members and still answer.
    idx.apply((5..100).map(|i| {
        Change::Delete(ObjectKey::new(
            "pods",
            &ClusterName::from("c1"),
            "ns",
            &format!("p{i:03}"),
        ))
    }));
    let s = idx.snapshot();
    let owned: Vec<String> = s
        .owned_by("owner-0")
        .iter()
        .map(|o| o.key.name.to_string())
        .collect();
    assert_eq!(owned, ["p000", "p001", "p002", "p003", "p004"]);
    assert_eq!(names(&s.page(&q, None, 1000).items).len(), 5);
    let on_n0 = Query {
        fields: "spec.nodeName=n0".parse().unwrap(),
        ..Query::all("pods")
    };
    assert_eq!(s.count(&on_n0, &[]).total, 2);
    // Modifying one keeps exactly one entry for it.
    idx.apply([Change::Upsert(input(
        "pods",
        "c1",
        "ns",
        "p000",
        1000,
        &[("app", "web")],
    ))]);
    assert_eq!(idx.snapshot().owned_by("owner-0").len(), 5);
}

#[test]
fn a_restored_index_answers_as_the_one_it_was_saved_from() {
    let idx = index();
    let cluster = |i: u64| if i.is_multiple_of(2) { "c1" } else { "c2" };
    // More than the runs two threads take objects to make in at a restore.
    idx.apply((0..5000u64).map(|i| {
        let app = if i.is_multiple_of(5) { "web" } else { "db" };
        Change::Upsert(input(
            "pods",
            cluster(i),
            &format!("ns{}", i % 3),
            &format!("p{i}"),
            i,
            &[("app", app)],
        ))
    }));
    idx.apply((0..5000u64).step_by(7).map(|i| {
        Change::Delete(ObjectKey::new(
            "pods",
            &ClusterName::from(cluster(i)),
            &format!("ns{}", i % 3),
            &format!("p{i}"),
        ))
    }));
    let saved = idx.snapshot();
    // Saved out of order: the restore sorts.
    let mut objects = saved_inputs(&saved);
    objects.reverse();
    let config = || Config {
        field_indexes: vec!["spec.nodeName".into()],
        ..Config::default()
    };
    // Restored at an older revision than its newest object's, it continues from that
    // object's (an upsert of p4999, made by whichever thread took it).
    let behind = Index::restore(
        config(),
        Restored {
            revision: Revision(1),
            objects: vec![RestoredRun::Objects(saved_inputs(&saved))],
            events: Vec::new(),
            earlier: None,
            positions: Vec::new(),
        },
    );
    assert_eq!(behind.snapshot().revision(), Revision(5000));
    let restored = Index::restore(
        config(),
        Restored {
            revision: saved.revision(),
            objects: vec![RestoredRun::Objects(objects)],
            events: Vec::new(),
            earlier: None,
            positions: vec![(
                (Arc::from("pods"), ClusterName::from("c1")),
                Arc::from("rv-9"),
            )],
        },
    );
    // Whatever it answers with its label, owner and field indexes being built (the
    // primary set scanned), and once they are in, is what the saved state answers; a
    // state scanning with no secondary index at all answers the same.
    let mut scanning = (*saved).clone();
    scanning.labels = Default::default();
    scanning.owners = Default::default();
    scanning.fields = Default::default();
    scanning.building = true;
    let same = |now: &State| {
        assert_eq!(now.revision(), saved.revision());
        assert_eq!(now.len(), saved.len());
        for q in [
            Query::all("pods"),
            Query {
                labels: LabelSelector::parse("app=web").unwrap(),
                ..Query::all("pods")
            },
            Query {
                fields: "spec.nodeName=n1".parse().unwrap(),
                ..Query::all("pods")
            },
            Query {
                namespaces: vec!["ns2".into()],
                ..Query::all("pods")
            },
        ] {
            assert_eq!(
                names(&now.page(&q, None, usize::MAX).items),
                names(&saved.page(&q, None, usize::MAX).items)
            );
            let groups = [GroupBy::Cluster, GroupBy::Namespace];
            assert_eq!(now.count(&q, &groups), saved.count(&q, &groups));
        }
    };
    same(&scanning);
    same(&restored.snapshot());
    restored.wait_for_indexes();
    let now = restored.snapshot();
    assert!(!now.building);
    same(&now);
    // Made on two threads, the keys of one namespace share one location.
    let held: Vec<_> = now.iter().collect();
    assert!(held.windows(2).all(|w| {
        let (a, b) = (w[0].key.location(), w[1].key.location());
        Arc::ptr_eq(a, b) == (**a == **b)
    }));
    assert_eq!(
        now.owned_by("owner-1").len(),
        saved.owned_by("owner-1").len()
    );
    assert_eq!(
        now.positions_of("pods").collect::<Vec<_>>(),
        [(&ClusterName::from("c1"), &Arc::<str>::from("rv-9"))]
    );
    // And it continues from the saved revision.
    let e = restored.apply([Change::Upsert(input("pods", "c1", "ns0", "new", 1, &[]))]);
    assert_eq!(e[0].revision, saved.revision().next());
}

/// A stored run that holds nothing and is not read until released: a restore that
/// takes it is held there.
#[derive(Debug)]
struct Held(Mutex<std::sync::mpsc::Receiver<()>>);

impl fleetscope_model::StoredRun for Held {
    fn len(&self) -> usize {
        0
    }

    fn visit(&self, _: &mut dyn FnMut(&fleetscope_model::StoredView<'_>)) {
        let _ = lock(&self.0).recv();
    }
}

#[test]
fn a_restore_under_way_answers_first_pages_within_what_it_has_made_and_the_rest_once_whole() {
    let idx = index();
    idx.apply((0..5000u64).map(|i| {
        let app = if i.is_multiple_of(100) { "rare" } else { "db" };
        Change::Upsert(input(
            "pods",
            if i < 2500 { "c1" } else { "c2" },
            "ns",
            &format!("p{i:04}"),
            i,
            &[("app", app)],
        ))
    }));
    let saved = idx.snapshot();
    let mut objects = saved_inputs(&saved);
    let after: Vec<RestoredObject> = objects.split_off(2048);
    let (release, held) = std::sync::mpsc::channel();
    // Two runs of 1,024 objects, then one the restore is held at, then the rest.
    let restoring = Index::restoring(
        Config::default(),
        Restored {
            revision: saved.revision(),
            objects: vec![
                RestoredRun::Objects(objects),
                RestoredRun::Stored(Box::new(Held(Mutex::new(held)))),
                RestoredRun::Objects(after),
            ],
            events: Vec::new(),
            earlier: None,
            positions: Vec::new(),
        },
    );
    assert!(!restoring.is_restored());
    // What it has made so far: at least the first run, never past the held one.
    let deadline = Instant::now() + Duration::from_secs(60);
    let early = loop {
        if let Some(early) = restoring.early(Some("caller-a")) {
            break early;
        }
        assert!(Instant::now() < deadline, "nothing made after a minute");
        std::thread::yield_now();
    };
    let keys = names(&saved.page(&Query::all("pods"), None, usize::MAX).items);
    let through = keys.iter().position(|k| *k == early.through.to_string());
    assert!(matches!(through, Some(1023 | 2047)), "{through:?}");
    assert_eq!(early.state.revision(), saved.revision());
    // A first page within it, as the whole index gives it, with what follows it.
    let q = Query::all("pods");
    let page = early
        .state
        .early_page(&q, &early.through, 500, usize::MAX)
        .unwrap();
    assert_eq!(names(&page.items), keys[..500]);
    assert_eq!(
        page.next.as_ref().map(ToString::to_string),
        Some(keys[499].clone())
    );
    assert!(page.remaining >= 1);
    // An object up to its last key is held there or not at all.
    let key = |name: &str| ObjectKey::new("pods", &ClusterName::from("c1"), "ns", name);
    assert!(early.state.get(&key("p0999")).is_some());
    assert!(key("p0999x") <= early.through);
    assert!(early.state.get(&key("p0999x")).is_none());
    // Not a page that reaches past it, nor one with nothing after it within it (21
    // of the first 2,048 are `rare`, and c2's pods all come after them).
    let rare = Query {
        labels: LabelSelector::parse("app=rare").unwrap(),
        ..Query::all("pods")
    };
    let c2 = Query {
        clusters: Some(vec![ClusterName::from("c2")]),
        ..Query::all("pods")
    };
    for (query, limit) in [(&q, 2048), (&rare, 25), (&c2, 1)] {
        let page = early
            .state
            .early_page(query, &early.through, limit, usize::MAX);
        assert!(page.is_none(), "{query:?} {limit}");
    }
    assert!(!restoring.is_restored());
    // Released, it is whole: every call waits for that, and the caller answered early
    // finds its snapshot pinned for the next page.
    release.send(()).unwrap();
    let whole = restoring.snapshot();
    assert!(restoring.is_restored());
    assert!(restoring.early(Some("caller-b")).is_none());
    assert_eq!(names(&whole.page(&q, None, usize::MAX).items), keys);
    assert_eq!(whole.count(&rare, &[]).total, 50);
    let pinned = restoring
        .pinned(saved.revision())
        .expect("pinned for caller-a");
    let next = pinned.page(&q, page.next.as_ref(), 500);
    assert_eq!(names(&next.items), keys[500..1000]);
    assert_eq!(next.remaining, 4000);
    let e = restoring.apply([Change::Upsert(input("pods", "c1", "ns", "new", 1, &[]))]);
    assert_eq!(e[0].revision, saved.revision().next());
}

/// A stored run whose reading fails (as a bug would).
#[derive(Debug)]
struct Failing;

impl fleetscope_model::StoredRun for Failing {
    fn len(&self) -> usize {
        1
    }

    fn visit(&self, _: &mut dyn FnMut(&fleetscope_model::StoredView<'_>)) {
        panic!("a stored run that cannot be read");
    }
}

/// Every event a new subscriber from `since` is given, and its kind, by name.
fn resumed(idx: &Index, since: Revision) -> Vec<(Revision, EventType, String)> {
    let mut feed = idx.subscribe(Some(since)).unwrap().feed;
    let mut out = Vec::new();
    loop {
        let events = feed.try_next().unwrap();
        if events.is_empty() {
            return out;
        }
        out.extend(
            events
                .iter()
                .map(|e| (e.revision, e.kind, e.object.key.name.to_string())),
        );
    }
}

#[test]
fn a_restored_index_takes_changes_while_its_retained_events_are_made_and_a_watch_resumes_through_both()
 {
    let config = || Config {
        log_retention: 25,
        ..Config::default()
    };
    // Twenty pods made, then ten of them changed.
    let fill = |idx: &Index| {
        idx.apply(
            (0..20).map(|i| Change::Upsert(input("pods", "c1", "ns1", &format!("p{i}"), i, &[]))),
        );
        idx.apply((0..10).map(|i| {
            Change::Upsert(input(
                "pods",
                "c1",
                "ns1",
                &format!("p{i}"),
                100 + i,
                &[("app", "web")],
            ))
        }));
    };
    let saved = Index::new(config());
    fill(&saved);
    let state = saved.snapshot();
    let kept = resumed(&saved, saved.oldest_resumable());
    assert_eq!(kept.len(), 25, "the log keeps its last 25 events");
    assert!(saved.subscribe(Some(Revision(0))).is_err());
    // A store keeps all thirty.
    let wide = Index::new(Config::default());
    fill(&wide);
    let mut feed = wide.subscribe(Some(Revision(0))).unwrap().feed;
    let mut all = Vec::new();
    loop {
        let events = feed.try_next().unwrap();
        if events.is_empty() {
            break;
        }
        all.extend(events);
    }
    assert_eq!(all.len(), 30);
    let events = || -> Vec<RestoredEvent> {
        all.iter()
            .map(|e| RestoredEvent {
                revision: e.revision,
                kind: e.kind,
                object: state_of(&e.object),
                prev: e.prev.as_deref().map(state_of),
            })
            .collect()
    };
    let restored = Index::restore(
        config(),
        Restored {
            revision: state.revision(),
            objects: vec![RestoredRun::Objects(saved_inputs(&state))],
            events: Vec::new(),
            earlier: None,
            positions: Vec::new(),
        },
    );
    let whole = restored.snapshot();
    // A change taken before the retained events are in, which they then go before.
    restored.apply([Change::Delete(ObjectKey::new(
        "pods",
        &ClusterName::from("c1"),
        "ns1",
        "p19",
    ))]);
    restored.restore_history(events(), &whole);
    let mut expected = kept.clone();
    expected.push((state.revision().next(), EventType::Deleted, "p19".into()));
    // Trimmed to the last 25 with the change taken.
    expected.remove(0);
    assert_eq!(resumed(&restored, restored.oldest_resumable()), expected);
    // An event whose state is the one held shares it; the one before is its own.
    let p3 = ObjectKey::new("pods", &ClusterName::from("c1"), "ns1", "p3");
    let mut feed = restored
        .subscribe(Some(restored.oldest_resumable()))
        .unwrap()
        .feed;
    let modified = feed
        .try_next()
        .unwrap()
        .into_iter()
        .find(|e| e.object.key == p3)
        .unwrap();
    assert!(ObjectRef::ptr_eq(
        &modified.object,
        restored.snapshot().get(&p3).unwrap()
    ));
    assert_eq!(modified.prev.as_ref().unwrap().json(), all[3].object.json());
    // Restored whole, the index holds the same events as one restored with them.
    let whole = Index::restore(
        config(),
        Restored {
            revision: state.revision(),
            objects: vec![RestoredRun::Objects(saved_inputs(&state))],
            events: events(),
            earlier: None,
            positions: Vec::new(),
        },
    );
    assert_eq!(resumed(&whole, whole.oldest_resumable()), kept);
    // The same, the older twenty read only once the objects answer, and only as many
    // as the log keeps besides the ten given.
    let asked = Arc::new(Mutex::new(None));
    let (older, newer) = {
        let mut all = events();
        let newer = all.split_off(20);
        (all, newer)
    };
    let earlier: crate::EarlierEvents = {
        let asked = asked.clone();
        Box::new(move |keep| {
            *asked.lock().unwrap() = Some(keep);
            let mut older = older;
            older.drain(..older.len().saturating_sub(keep));
            older
        })
    };
    let split = Index::restore(
        config(),
        Restored {
            revision: state.revision(),
            objects: vec![RestoredRun::Objects(saved_inputs(&state))],
            events: newer,
            earlier: Some(earlier),
            positions: Vec::new(),
        },
    );
    assert_eq!(resumed(&split, split.oldest_resumable()), kept);
    assert_eq!(*asked.lock().unwrap(), Some(15));
    // With as many given as the log keeps, the older ones are never read.
    let mut newest = events();
    newest.drain(..5);
    let never: crate::EarlierEvents = Box::new(|_| panic!("read although the log is full"));
    let full = Index::restore(
        config(),
        Restored {
            revision: state.revision(),
            objects: vec![RestoredRun::Objects(saved_inputs(&state))],
            events: newest,
            earlier: Some(never),
            positions: Vec::new(),
        },
    );
    assert_eq!(resumed(&full, full.oldest_resumable()), kept);
}

#[test]
fn reading_the_log_waits_until_a_restore_s_retained_events_are_in() {
    let idx = Arc::new(index());
    idx.apply([upsert("c1", "ns1", "p0")]);
    let held = idx.restoring.hold_history();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let idx = idx.clone();
        std::thread::spawn(move || tx.send(idx.oldest_resumable()).unwrap())
    };
    // Not before the events are in (the reader may not have started yet either).
    assert!(rx.try_recv().is_err());
    drop(held);
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap(),
        Revision(0)
    );
    reader.join().unwrap();
}

#[test]
fn a_restore_that_fails_leaves_an_index_that_is_never_whole_and_fails_every_read() {
    let restoring = Index::restoring(
        Config::default(),
        Restored {
            revision: Revision(7),
            objects: vec![RestoredRun::Stored(Box::new(Failing))],
            events: Vec::new(),
            earlier: None,
            positions: Vec::new(),
        },
    );
    // Waits for the restore to end, then fails rather than answer from nothing.
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| restoring.snapshot()));
    assert!(read.is_err());
    assert!(!restoring.is_restored());
    assert!(restoring.early(Some("caller")).is_none());
    let staged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        restoring.apply([Change::Upsert(input("pods", "c1", "ns", "p", 1, &[]))])
    }));
    assert!(staged.is_err());
}

#[test]
fn uid_and_resource_version_are_read_from_the_json() {
    let idx = index();
    let mut i = input("pods", "c1", "ns", "p", 7, &[]);
    i.json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","uid":"u-1","resourceVersion":"42"}}"#.into();
    idx.apply([Change::Upsert(i)]);
    let s = idx.snapshot();
    let o = s
        .get(&ObjectKey::new("pods", &ClusterName::from("c1"), "ns", "p"))
        .unwrap();
    assert_eq!(
        o.uid_and_resource_version(),
        ("u-1".to_string(), "42".to_string())
    );
    let mut late = input("pods", "c1", "ns", "r", 9, &[]);
    late.json = r#"{"spec":{"metadata":{"uid":"inner"}},"metadata":{"resourceVersion":"9","uid":"u-9"},"status":{}}"#.into();
    idx.apply([Change::Upsert(late)]);
    let s = idx.snapshot();
    let o = s
        .get(&ObjectKey::new("pods", &ClusterName::from("c1"), "ns", "r"))
        .unwrap();
    assert_eq!(
        o.uid_and_resource_version(),
        ("u-9".to_string(), "9".to_string())
    );
    let mut bare = input("pods", "c1", "ns", "q", 8, &[]);
    bare.json = r#"{"metadata":{"name":"q"}}"#.into();
    idx.apply([Change::Upsert(bare)]);
    let s = idx.snapshot();
    let o = s
        .get(&ObjectKey::new("pods", &ClusterName::from("c1"), "ns", "q"))
        .unwrap();
    assert_eq!(
        (o.uid(), o.resource_version()),
        (String::new(), String::new())
    );
}

#[test]
fn transitions_follow_the_filter() {
    let idx = index();
    let q = Query {
        labels: LabelSelector::parse("app=web").unwrap(),
        ..Query::all("pods")
    };
    let mut kinds = Vec::new();
    for (rv, app) in [(1, "web"), (2, "db"), (3, "web"), (4, "web")] {
        for e in idx.apply([Change::Upsert(input(
            "pods",
            "a",
            "x",
            "p",
            rv,
            &[("app", app)],
        ))]) {
            kinds.push(transition(&q, &e));
        }
    }
    for e in idx.apply([Change::Delete(ObjectKey::new(
        "pods",
        &"a".into(),
        "x",
        "p",
    ))]) {
        kinds.push(transition(&q, &e));
    }
    assert_eq!(
        kinds,
        [
            Some(EventType::Added),
            Some(EventType::Deleted),
            Some(EventType::Added),
            Some(EventType::Modified),
            Some(EventType::Deleted)
        ]
    );
}

#[test]
fn pinned_snapshots_expire_after_their_ttl() {
    let idx = Index::new(Config {
        page_ttl: Duration::ZERO,
        ..Config::default()
    });
    idx.pin(idx.snapshot(), "a");
    assert!(idx.pinned(Revision(0)).is_none());
    let idx = index();
    idx.pin(idx.snapshot(), "a");
    assert!(idx.pinned(Revision(0)).is_some());
}

#[test]
fn pins_are_capped_per_owner_and_in_all_and_expire_on_a_timer() {
    let idx = Index::new(Config {
        max_pinned: 4,
        max_pinned_per_owner: 2,
        ..Config::default()
    });
    let pin_new = |owner: &str| {
        idx.apply([upsert(
            "c",
            "ns",
            &format!("{owner}-{}", idx.snapshot().revision()),
        )]);
        let s = idx.snapshot();
        let r = s.revision();
        idx.pin(s, owner);
        r
    };
    // One owner pinning page after page keeps only its latest two.
    let a: Vec<Revision> = (0..5).map(|_| pin_new("a")).collect();
    assert!(idx.pinned(a[2]).is_none());
    assert!(idx.pinned(a[3]).is_some() && idx.pinned(a[4]).is_some());
    // Others fill the rest; past four in all, the least recently used goes.
    let b = pin_new("b");
    let c = pin_new("c");
    assert_eq!(idx.pinned_count(), 4);
    let d = pin_new("d");
    assert_eq!(idx.pinned_count(), 4);
    assert!(idx.pinned(a[3]).is_none(), "the least recently used went");
    for r in [a[4], b, c, d] {
        assert!(idx.pinned(r).is_some());
    }
    // Expiry runs without another pin.
    let idx = Index::new(Config {
        page_ttl: Duration::ZERO,
        ..Config::default()
    });
    idx.pin(idx.snapshot(), "a");
    idx.expire_pins();
    assert_eq!(idx.pinned_count(), 0);
}

#[test]
fn a_query_past_its_deadline_is_cut_short_and_says_so() {
    let idx = index();
    idx.apply((0..5000).map(|i| upsert("c", "ns", &format!("p{i}"))));
    let s = idx.snapshot();
    // A selector, so the count visits objects (totals need no visit).
    let mut q = Query {
        labels: LabelSelector::parse("!x").unwrap(),
        ..Query::all("pods")
    };
    assert_eq!(s.count(&q, &[]).total, 5000);
    assert_eq!(s.page(&q, None, 10_000).items.len(), 5000);
    q.deadline = Some(std::time::Instant::now());
    assert!(s.page(&q, None, 10_000).items.len() < 5000);
    assert!(s.count(&q, &[]).total < 5000);
    assert!(q.expired());
}

#[test]
fn a_reach_limits_what_is_listed_and_counted() {
    use fleetscope_model::access::{Access, ClusterRef, Namespaces, Policy, Subject};
    use fleetscope_model::{ResourceType, Verb};
    struct OnlyNs;
    impl Policy for OnlyNs {
        fn namespaces(
            &self,
            _: &Subject,
            _: Verb,
            _: &ResourceType,
            c: ClusterRef<'_>,
        ) -> Namespaces {
            if c.name.as_str() == "c" {
                Namespaces::Only {
                    patterns: vec!["ns".parse().unwrap()],
                    cluster_scoped: false,
                }
            } else {
                Namespaces::None
            }
        }
        fn secret_data(&self, _: &Subject, _: ClusterRef<'_>, _: &str) -> bool {
            false
        }
        fn sees_cluster(&self, _: &Subject, _: ClusterRef<'_>) -> bool {
            true
        }
    }
    let idx = index();
    idx.apply([
        upsert("c", "ns", "a"),
        upsert("c", "other", "b"),
        upsert("d", "ns", "c"),
    ]);
    let (_tx, rx) =
        tokio::sync::watch::channel(std::sync::Arc::new(OnlyNs) as std::sync::Arc<dyn Policy>);
    let access = Access::new(Subject::unrestricted(), rx);
    let labels = std::collections::BTreeMap::new();
    let (c, d) = (ClusterName::from("c"), ClusterName::from("d"));
    let pods = ResourceType::new("", "v1", "pods", "Pod", true);
    let reach = access.reach(
        Verb::List,
        &pods,
        [
            ClusterRef {
                name: &c,
                labels: &labels,
            },
            ClusterRef {
                name: &d,
                labels: &labels,
            },
        ],
    );
    let q = Query {
        reach,
        ..Query::all("pods")
    };
    let s = idx.snapshot();
    let page = s.page(&q, None, 10);
    assert_eq!(page.items.len(), 1);
    assert_eq!(&*page.items[0].key.name, "a");
    // Counted from the per-namespace totals, and by visiting objects: the same.
    assert_eq!(s.count(&q, &[GroupBy::Cluster]).total, 1);
    let labelled = Query {
        labels: LabelSelector::parse("!x").unwrap(),
        ..q.clone()
    };
    assert_eq!(s.count(&labelled, &[]).total, 1);
}

// ---- property test against a BTreeMap model ----

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        cluster: u8,
        ns: u8,
        name: u8,
        rv: u64,
        app: u8,
    },
    Delete {
        cluster: u8,
        ns: u8,
        name: u8,
    },
    Relist {
        cluster: u8,
        keep: Vec<(u8, u8, u64, u8)>,
    },
    RemoveCluster {
        cluster: u8,
    },
    /// Objects arriving together (a part of a first list), any of them held or not.
    Add {
        cluster: u8,
        items: Vec<(u8, u8, u64, u8)>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u8, 0..2u8, 0..6u8, 0..4u64, 0..3u8).prop_map(|(cluster, ns, name, rv, app)| Op::Upsert { cluster, ns, name, rv, app }),
        2 => (0..3u8, 0..2u8, 0..6u8).prop_map(|(cluster, ns, name)| Op::Delete { cluster, ns, name }),
        1 => (0..3u8, proptest::collection::vec((0..2u8, 0..6u8, 0..4u64, 0..3u8), 0..6)).prop_map(|(cluster, keep)| Op::Relist { cluster, keep }),
        1 => (0..3u8).prop_map(|cluster| Op::RemoveCluster { cluster }),
        1 => (0..3u8, proptest::collection::vec((0..2u8, 0..6u8, 0..4u64, 0..3u8), 0..6)).prop_map(|(cluster, items)| Op::Add { cluster, items }),
    ]
}

const APPS: [&str; 3] = ["web", "db", "cache"];

/// Owner uids, some a prefix of another.
const OWNERS: [&str; 3] = ["o", "o1", "o10"];

fn mk(cluster: u8, ns: u8, name: u8, rv: u64, app: u8) -> ObjectState {
    let mut i = input(
        "pods",
        &format!("c{cluster}"),
        &format!("ns{ns}"),
        &format!("p{name}"),
        rv,
        &[("app", APPS[app as usize])],
    );
    // No owner, one, or two.
    i.owners = match (rv + u64::from(app)) % 4 {
        0 => vec![],
        1 => vec![OWNERS[0].into()],
        2 => vec![OWNERS[1].into()],
        _ => vec![OWNERS[2].into(), OWNERS[0].into()],
    };
    i
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn index_matches_a_btreemap_model(ops in proptest::collection::vec(op(), 1..60), selector in 0..4usize, compress in any::<bool>()) {
        let config = || Config { field_indexes: vec!["spec.nodeName".into()], compress_objects: compress, ..Config::default() };
        let idx = Index::new(config());
        let mut model: BTreeMap<ObjectKey, ObjectState> = BTreeMap::new();
        let mut replayed: BTreeMap<ObjectKey, ObjectRef> = BTreeMap::new();
        let mut last = Revision(0);
        let mut feed = idx.subscribe(None).unwrap().feed;
        for op in ops {
            let change = match op {
                Op::Upsert { cluster, ns, name, rv, app } => {
                    let i = mk(cluster, ns, name, rv, app);
                    model.insert(i.key.clone(), i.clone());
                    Change::Upsert(i)
                }
                Op::Delete { cluster, ns, name } => {
                    let k = ObjectKey::new("pods", &format!("c{cluster}").into(), &format!("ns{ns}"), &format!("p{name}"));
                    model.remove(&k);
                    Change::Delete(k)
                }
                Op::Relist { cluster, keep } => {
                    let c: ClusterName = format!("c{cluster}").into();
                    model.retain(|k, _| k.cluster != c);
                    // As listed: in any order, a key possibly twice (the last wins).
                    let mut objects = Vec::new();
                    for (ns, name, rv, app) in keep {
                        let i = mk(cluster, ns, name, rv, app);
                        model.insert(i.key.clone(), i.clone());
                        objects.push(i);
                    }
                    Change::Replace { resource: "pods".into(), cluster: c, objects }
                }
                Op::RemoveCluster { cluster } => {
                    let c: ClusterName = format!("c{cluster}").into();
                    model.retain(|k, _| k.cluster != c);
                    Change::RemoveCluster(c)
                }
                Op::Add { cluster, items } => {
                    // In any order, a key possibly twice (the last wins), some held.
                    let objects: Vec<ObjectState> = items
                        .into_iter()
                        .map(|(ns, name, rv, app)| mk(cluster, ns, name, rv, app))
                        .collect();
                    for i in &objects {
                        model.insert(i.key.clone(), i.clone());
                    }
                    Change::Add(objects)
                }
            };
            let events = idx.apply([change]);
            for e in &events {
                prop_assert_eq!(e.revision, last.next(), "revisions are dense and increasing");
                last = e.revision;
                match e.kind {
                    EventType::Deleted => { replayed.remove(&e.object.key); }
                    _ => { replayed.insert(e.object.key.clone(), e.object.clone()); }
                }
            }
            let mut fed = Vec::new();
            loop {
                let got = feed.try_next().unwrap();
                if got.is_empty() { break; }
                fed.extend(got.iter().map(|e| e.revision));
            }
            prop_assert_eq!(fed, events.iter().map(|e| e.revision).collect::<Vec<_>>(), "the feed hands over every event in order");
        }
        let s = idx.snapshot();
        let selectors = ["", "app=web", "app!=web", "app in (db,cache)"];
        let q = Query { labels: LabelSelector::parse(selectors[selector]).unwrap(), ..Query::all("pods") };
        let expected: Vec<String> = model.values().filter(|i| q.labels.matches(i.labels.as_slice())).map(|i| i.key.to_string()).collect();
        let got = names(&s.page(&q, None, 1000).items);
        prop_assert_eq!(&got, &expected);
        // Read page by page, each page's remainder carried to the next (never counted
        // again): the same objects, and every remainder exact.
        for size in [1, 3] {
            let (seen, remainders) = page_through(&s, &q, size);
            prop_assert_eq!(&seen, &expected);
            prop_assert!(remainders.iter().all(|(remaining, so_far)| remaining + so_far == expected.len()));
        }
        // Replaying the events gives the same state, and every object carries its latest input.
        prop_assert_eq!(replayed.keys().collect::<Vec<_>>(), model.keys().collect::<Vec<_>>());
        for (k, i) in &model {
            let held = s.get(k).unwrap();
            let rv: serde_json::Value = serde_json::from_str(&i.json).unwrap();
            prop_assert_eq!(held.resource_version(), rv["metadata"]["resourceVersion"].as_str().unwrap());
            let held = held.json();
            prop_assert_eq!(held.as_str(), i.json.as_str());
        }
        let by_cluster = s.count(&Query::all("pods"), &[GroupBy::Cluster]);
        prop_assert_eq!(by_cluster.total as usize, model.len());
        // Counting from the per-namespace totals agrees with counting objects one by one.
        let groups = [GroupBy::Cluster, GroupBy::Namespace];
        let fast = s.count(&Query::all("pods"), &groups);
        let slow = s.count(&Query { labels: LabelSelector::parse("app!=none").unwrap(), ..Query::all("pods") }, &groups);
        prop_assert_eq!(fast, slow);
        let counted: usize = s.counts().map(|(_, _, n)| n).sum();
        prop_assert_eq!(counted, model.len());
        let owned = |st: &State, uid: &str| st.owned_by(uid).iter().map(|o| o.key.to_string()).collect::<Vec<_>>();
        for uid in OWNERS {
            let expected: Vec<String> = model.values().filter(|i| i.owners.iter().any(|o| o == uid)).map(|i| i.key.to_string()).collect();
            prop_assert_eq!(owned(&s, uid), expected, "objects owned by {}", uid);
        }
        // An index restored from what is held answers every query as this one does.
        let restored = Index::restore(
            config(),
            Restored { revision: s.revision(), objects: vec![RestoredRun::Objects(saved_inputs(&s))], events: Vec::new(), earlier: None, positions: Vec::new() },
        );
        let r = restored.snapshot();
        for selector in selectors {
            let q = Query { labels: LabelSelector::parse(selector).unwrap(), ..Query::all("pods") };
            prop_assert_eq!(names(&r.page(&q, None, 1000).items), names(&s.page(&q, None, 1000).items));
        }
        for node in ["n0", "n1", "n2"] {
            let q = Query { fields: format!("spec.nodeName={node}").parse().unwrap(), ..Query::all("pods") };
            prop_assert_eq!(names(&r.page(&q, None, 1000).items), names(&s.page(&q, None, 1000).items));
        }
        for uid in OWNERS {
            prop_assert_eq!(owned(&r, uid), owned(&s, uid));
        }
        prop_assert_eq!(r.count(&Query::all("pods"), &groups), s.count(&Query::all("pods"), &groups));
        prop_assert_eq!(r.revision(), s.revision());
    }
}

#[test]
fn an_object_is_held_in_nine_words() {
    // Key (location, name), revision, JSON behind the lock that lets it be compressed
    // in place, shared terms and a sole owner's uid: with the shared pointer's count,
    // 80 bytes, an allocator size class of its own.
    assert_eq!(std::mem::size_of::<Object>(), 72);
}

#[test]
fn objects_of_one_owner_share_one_copy_of_its_uid() {
    let idx = index();
    // rv 1 and 3: "owner-1"; rv 2: "owner-0".
    idx.apply(
        [1, 2, 3].map(|rv| Change::Upsert(input("pods", "c", "ns", &format!("p{rv}"), rv, &[]))),
    );
    let state = idx.snapshot();
    let uid = |name: &str| {
        let key = ObjectKey::new("pods", &ClusterName::from("c"), "ns", name);
        state.get(&key).unwrap().owners()[0].clone()
    };
    assert!(crate::terms::Uid::ptr_eq(&uid("p1"), &uid("p3")));
    assert_eq!((&*uid("p1"), &*uid("p2")), ("owner-1", "owner-0"));
}

#[test]
fn holds_any_sees_staged_objects_of_one_type_in_one_cluster() {
    let idx = index();
    let c1: ClusterName = "c1".into();
    assert!(!idx.holds_any("pods", &c1));
    let staged = idx.stage([Change::Add(vec![input("pods", "c1", "ns", "p", 1, &[])])]);
    assert!(idx.holds_any("pods", &c1), "staged, not yet published");
    assert!(!idx.holds_any("pods", &"c2".into()));
    assert!(!idx.holds_any("configmaps", &c1));
    assert!(
        !idx.holds_any("pod", &c1),
        "a prefix of the name is another type"
    );
    idx.publish(staged);
    idx.apply([Change::Delete(ObjectKey::new("pods", &c1, "ns", "p"))]);
    assert!(!idx.holds_any("pods", &c1));
}

/// A watch event of pod `name` in `cluster` at member resourceVersion `rv`.
fn at(cluster: &str, name: &str, rv: u64) -> Change {
    Change::UpsertAt(
        input("pods", cluster, "x", name, rv, &[]),
        Arc::from(rv.to_string()),
    )
}

fn listed(cluster: &str, rv: u64) -> Change {
    Change::Reached {
        resource: Arc::from("pods"),
        cluster: ClusterName::from(cluster),
        resource_version: Arc::from(rv.to_string()),
    }
}

fn start_at(idx: &Index, cluster: &str, rv: &str) -> Start {
    let (_, starts) = idx.subscribe_at("pods", &[(ClusterName::from(cluster), Arc::from(rv))]);
    starts[0]
}

#[test]
fn streams_reach_member_positions_with_their_changes() {
    let idx = index();
    // A first list at 10 of two pods, then watch events at 12 and 15 (a delete).
    let events = idx.apply([
        Change::Add(vec![
            input("pods", "a", "x", "p1", 3, &[]),
            input("pods", "a", "x", "p2", 4, &[]),
        ]),
        listed("a", 10),
    ]);
    let positions: Vec<Option<&str>> = events.iter().map(|e| e.position.as_deref()).collect();
    assert_eq!(
        positions,
        [None, Some("10")],
        "a list's last change carries it"
    );
    let e = idx.apply([at("a", "p3", 12)]);
    assert_eq!(e[0].position.as_deref(), Some("12"));
    let key = ObjectKey::new("pods", &ClusterName::from("a"), "x", "p1");
    let e = idx.apply([Change::DeleteAt(key, Arc::from("15"))]);
    assert_eq!(
        e[0].position.as_deref(),
        Some("15"),
        "a delete's own, not its object's"
    );
    let snapshot = idx.snapshot();
    assert_eq!(
        snapshot
            .position("pods", &ClusterName::from("a"))
            .map(|p| &**p),
        Some("15")
    );
    // A bookmark-like move with nothing changed: a new position, the same revision.
    let revision = snapshot.revision();
    idx.apply([listed("a", 20)]);
    let now = idx.snapshot();
    assert_eq!(now.revision(), revision);
    assert_eq!(
        now.position("pods", &ClusterName::from("a")).map(|p| &**p),
        Some("20")
    );
    // The cluster leaving takes its positions along, and says so on its changes.
    let gone = idx.apply([Change::RemoveCluster(ClusterName::from("a"))]);
    assert!(
        gone.iter()
            .all(|e| e.cluster_removed && e.position.is_none())
    );
    assert_eq!(
        idx.snapshot().position("pods", &ClusterName::from("a")),
        None
    );
}

#[test]
fn a_position_from_before_the_cluster_left_and_came_back_is_not_carried() {
    let idx = index();
    idx.apply([
        Change::Add(vec![
            input("pods", "a", "x", "p1", 3, &[]),
            input("pods", "a", "x", "p2", 4, &[]),
        ]),
        listed("a", 10),
    ]);
    idx.apply([at("a", "p3", 12)]);
    let r12 = idx.snapshot().revision();
    assert_eq!(
        start_at(&idx, "a", "12"),
        Start::After {
            revision: r12,
            skip_to: None
        }
    );
    // The cluster goes to another replica, which deletes p2 at 14; it comes back
    // here by a fresh list at 20 without p2: the log from 12 on never says p2 went.
    idx.apply([Change::RemoveCluster(ClusterName::from("a"))]);
    idx.apply([
        Change::Add(vec![
            input("pods", "a", "x", "p1", 3, &[]),
            input("pods", "a", "x", "p3", 12, &[]),
        ]),
        listed("a", 20),
    ]);
    assert_eq!(start_at(&idx, "a", "12"), Start::Reset);
    assert_eq!(start_at(&idx, "a", "14"), Start::Reset);
    // Where the fresh list stands, and after it, the log carries the stream again.
    let r20 = idx.snapshot().revision();
    assert_eq!(
        start_at(&idx, "a", "20"),
        Start::After {
            revision: r20,
            skip_to: None
        }
    );
    idx.apply([at("a", "p4", 22)]);
    let r22 = idx.snapshot().revision();
    assert_eq!(
        start_at(&idx, "a", "22"),
        Start::After {
            revision: r22,
            skip_to: None
        }
    );
}

#[test]
fn a_member_position_continues_exactly_or_says_it_cannot() {
    let idx = index();
    idx.apply([
        Change::Add(vec![input("pods", "a", "x", "p1", 3, &[])]),
        listed("a", 10),
    ]);
    let r10 = idx.snapshot().revision();
    idx.apply([at("a", "p2", 12)]);
    let r12 = idx.snapshot().revision();
    idx.apply([at("a", "p3", 15)]);
    let r15 = idx.snapshot().revision();
    // Exactly at a change: after it.
    assert_eq!(
        start_at(&idx, "a", "12"),
        Start::After {
            revision: r12,
            skip_to: None
        }
    );
    assert_eq!(
        start_at(&idx, "a", "10"),
        Start::After {
            revision: r10,
            skip_to: None
        }
    );
    // Where the index stands: from now.
    assert_eq!(
        start_at(&idx, "a", "15"),
        Start::After {
            revision: r15,
            skip_to: None
        }
    );
    // Between two changes (a bookmark of another replica): after the earlier.
    assert_eq!(
        start_at(&idx, "a", "13"),
        Start::After {
            revision: r12,
            skip_to: Some(13)
        }
    );
    // Ahead of this index (another replica saw more): from now, skipping to it.
    assert_eq!(
        start_at(&idx, "a", "40"),
        Start::After {
            revision: r15,
            skip_to: Some(40)
        }
    );
    // Before what this index holds of the stream, not a number, never seen: reset.
    assert_eq!(start_at(&idx, "a", "9"), Start::Reset);
    assert_eq!(start_at(&idx, "a", "x9"), Start::Reset);
    assert_eq!(start_at(&idx, "a", ""), Start::Reset);
    assert_eq!(start_at(&idx, "b", "12"), Start::Reset);
    // A re-list after 15 (its diff made from the state at 15): from 15 exactly it
    // applies, and from 13 too (the change at 15 comes first); in a stream whose
    // re-list follows its change at 7 directly, nothing continues exactly from 8.
    idx.apply([
        Change::Add(vec![input("pods", "c", "x", "q1", 3, &[])]),
        listed("c", 5),
    ]);
    idx.apply([at("c", "q2", 7)]);
    let r7 = idx.snapshot().revision();
    idx.apply([
        Change::Replace {
            resource: "pods".into(),
            cluster: ClusterName::from("c"),
            objects: vec![input("pods", "c", "x", "q3", 19, &[])],
        },
        listed("c", 20),
    ]);
    assert_eq!(
        start_at(&idx, "c", "7"),
        Start::After {
            revision: r7,
            skip_to: None
        }
    );
    assert_eq!(start_at(&idx, "c", "8"), Start::Reset);
    idx.apply([
        Change::Replace {
            resource: "pods".into(),
            cluster: ClusterName::from("a"),
            objects: vec![
                input("pods", "a", "x", "p1", 3, &[]),
                input("pods", "a", "x", "p4", 30, &[]),
            ],
        },
        listed("a", 30),
    ]);
    assert_eq!(
        start_at(&idx, "a", "15"),
        Start::After {
            revision: r15,
            skip_to: None
        }
    );
    assert_eq!(
        start_at(&idx, "a", "13"),
        Start::After {
            revision: r12,
            skip_to: Some(13)
        }
    );
    let (subscription, starts) = idx.subscribe_at(
        "pods",
        &[
            (ClusterName::from("a"), Arc::from("15")),
            (ClusterName::from("b"), Arc::from("1")),
        ],
    );
    assert_eq!(
        starts,
        [
            Start::After {
                revision: r15,
                skip_to: None
            },
            Start::Reset
        ]
    );
    assert_eq!(
        subscription.feed.reached(),
        r15,
        "the feed starts at the earliest start"
    );
    // A re-list exactly at the position is no obstacle: its own last change is it.
    assert!(matches!(
        start_at(&idx, "a", "30"),
        Start::After { skip_to: None, .. }
    ));
}

#[test]
fn objects_held_compressed_read_back_exactly() {
    let idx = Index::new(Config {
        compress_objects: true,
        ..Config::default()
    });
    let pods: Vec<ObjectState> = (0..50)
        .map(|i| input("pods", "c1", "ns1", &format!("p{i}"), i, &[("app", "web")]))
        .collect();
    let mut tiny = input("configmaps", "c1", "ns1", "tiny", 1, &[]);
    tiny.json = r#"{"kind":"ConfigMap"}"#.into();
    let secret = input("secrets", "c1", "ns1", "token", 1, &[]);
    let events = idx.apply(
        pods.iter()
            .cloned()
            .chain([tiny.clone(), secret.clone()])
            .map(Change::Upsert),
    );
    assert_eq!(events.len(), 52);
    let s = idx.snapshot();
    settle(&idx);
    for p in &pods {
        let held = s.get(&p.key).unwrap();
        assert!(held.json_compressed(), "{}", p.key);
        assert_eq!(held.json().as_str(), p.json.as_str());
        assert_eq!(held.json_len(), p.json.len());
        let rv: serde_json::Value = serde_json::from_str(&p.json).unwrap();
        assert_eq!(
            held.resource_version(),
            rv["metadata"]["resourceVersion"].as_str().unwrap()
        );
        // A field read from the JSON, not an index.
        let phase = held.field_value("status.phase").unwrap();
        assert_eq!(phase, rv["status"]["phase"].as_str().unwrap());
        let metadata: serde_json::Value = serde_json::from_str(&held.metadata_json()).unwrap();
        assert_eq!(metadata["metadata"], rv["metadata"]);
    }
    // Shorter than is worth compressing: held as it is.
    let tiny_held = s.get(&tiny.key).unwrap();
    assert!(!tiny_held.json_compressed());
    assert_eq!(tiny_held.json().as_str(), tiny.json.as_str());
    // A Secret never becomes a dictionary that would outlive its values.
    assert!(!s.get(&secret.key).unwrap().json_compressed());
    // An event shares the text it made among every subscriber that sends it.
    let e = &events[7];
    assert!(std::ptr::eq(e.json().as_ptr(), e.json().as_ptr()));
    // The same state applied again is no change; a changed one is.
    assert!(idx.apply([Change::Upsert(pods[3].clone())]).is_empty());
    let mut changed = pods[3].clone();
    changed.json = changed.json.replace("\"Pending\"", "\"Failed\"").into();
    let e = idx.apply([Change::Upsert(changed.clone())]);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].object.json().as_str(), changed.json.as_str());
    assert!(!e[0].object.same_json(e[0].prev.as_ref().unwrap()));
    // Restored from what it held, compressed again.
    let restored = Index::restore(
        Config {
            compress_objects: true,
            ..Config::default()
        },
        Restored {
            revision: idx.snapshot().revision(),
            objects: vec![RestoredRun::Objects(saved_inputs(&idx.snapshot()))],
            events: Vec::new(),
            earlier: None,
            positions: Vec::new(),
        },
    );
    let r = restored.snapshot();
    settle(&restored);
    let held = r.get(&changed.key).unwrap();
    assert!(held.json_compressed());
    assert_eq!(held.json().as_str(), changed.json.as_str());
}

/// What a store would give back for every object held, each one's JSON as
/// [`Index::packed_for_store`] stores it.
fn stored_packed(idx: &Index) -> Vec<RestoredObject> {
    let s = idx.snapshot();
    saved_inputs(&s)
        .into_iter()
        .zip(s.iter())
        .map(|(mut o, held)| {
            o.packed = idx.packed_for_store(held);
            if o.packed.is_some() {
                o.state.json = Default::default();
            }
            o
        })
        .collect()
}

#[test]
fn objects_stored_compressed_are_restored_compressed_against_their_type_s_dictionary() {
    let compressing = || Config {
        compress_objects: true,
        ..Config::default()
    };
    let idx = Index::new(compressing());
    // More than the runs two threads take objects to make in at a restore.
    let pods = web_pods(3000);
    let secret = input("secrets", "c1", "ns1", "token", 1, &[]);
    idx.apply(
        pods.iter()
            .cloned()
            .chain([secret.clone()])
            .map(Change::Upsert),
    );
    // Half settled and held compressed, half still text: all stored compressed but
    // the Secret, and the text ones are not compressed where they are held.
    let half = idx.snapshot().get(&pods[1499].key).unwrap().revision;
    while !idx.pack_settled(half, 100) {}
    let stored = stored_packed(&idx);
    let s = idx.snapshot();
    let dictionary = stored[0].packed.as_ref().unwrap().dictionary().clone();
    for (o, held) in stored.iter().zip(s.iter()) {
        let secret_one = o.state.key.resource.as_ref() == "secrets";
        assert_eq!(o.packed.is_none(), secret_one, "{}", o.state.key);
        if let Some(p) = &o.packed {
            assert!(std::sync::Arc::ptr_eq(p.dictionary(), &dictionary));
            assert_eq!(p.text().unwrap(), held.json().as_str());
        }
    }
    assert!(s.get(&pods[0].key).unwrap().json_compressed());
    assert!(!s.get(&pods[2999].key).unwrap().json_compressed());
    let restore = |config: Config| {
        Index::restore(
            config,
            Restored {
                revision: s.revision(),
                objects: vec![RestoredRun::Objects(stored_packed(&idx))],
                events: Vec::new(),
                earlier: None,
                positions: Vec::new(),
            },
        )
    };
    // Held compressed as stored, reading back the same text; a state taken in later
    // is compressed against the dictionary the snapshot gave.
    let restored = restore(compressing());
    assert_eq!(
        restored.compressed_count(),
        3000,
        "restored compressed, counted so"
    );
    let r = restored.snapshot();
    for p in &pods {
        let held = r.get(&p.key).unwrap();
        assert!(held.json_compressed(), "{}", p.key);
        assert_eq!(held.json().as_str(), p.json.as_str());
        assert_eq!(held.json_len(), p.json.len());
    }
    assert!(!r.get(&secret.key).unwrap().json_compressed());
    let mut changed = pods[3].clone();
    changed.json = changed.json.replace("\"Pending\"", "\"Failed\"").into();
    restored.apply([Change::Upsert(changed.clone())]);
    settle(&restored);
    let later = restored.snapshot().get(&changed.key).unwrap().clone();
    let packed = restored.packed_for_store(&later).unwrap();
    assert!(std::sync::Arc::ptr_eq(packed.dictionary(), &dictionary));
    assert_eq!(later.json().as_str(), changed.json.as_str());
    // An index that does not compress holds them as text.
    let text = restore(Config {
        compress_objects: false,
        ..Config::default()
    });
    for p in &pods {
        let held = text.snapshot().get(&p.key).unwrap().clone();
        assert!(!held.json_compressed());
        assert_eq!(held.json().as_str(), p.json.as_str());
        assert!(text.packed_for_store(&held).is_none());
    }
}

/// `n` pods of `c1`/`ns1` labelled `app=web`, named `p00`, `p01`, … in key order.
fn web_pods(n: u64) -> Vec<ObjectState> {
    (0..n)
        .map(|i| {
            input(
                "pods",
                "c1",
                "ns1",
                &format!("p{i:02}"),
                i,
                &[("app", "web")],
            )
        })
        .collect()
}

/// Every state held, settled and compressed.
fn settle(idx: &Index) {
    let now = idx.snapshot().revision();
    while !idx.pack_settled(now, 7) {}
}

#[test]
fn a_state_is_held_as_text_until_it_settles_then_compressed_where_every_holder_sees_it() {
    let idx = Index::new(Config::default());
    let pods = web_pods(20);
    let events = idx.apply(pods[..10].iter().cloned().map(Change::Upsert));
    let first = idx.snapshot().revision();
    let events: Vec<_> = events
        .into_iter()
        .chain(idx.apply(pods[10..].iter().cloned().map(Change::Upsert)))
        .collect();
    let before = idx.snapshot();
    assert!(
        before.iter().all(|o| !o.json_compressed()),
        "text when made"
    );
    // Settled up to the first batch: a pass in steps of three objects considers
    // every object, compressing only the first batch's.
    let mut steps = 1;
    while !idx.pack_settled(first, 3) {
        steps += 1;
    }
    assert_eq!(steps, 7, "20 objects, three at a time");
    assert!(events[..10].iter().all(|e| e.object.json_compressed()));
    assert!(events[10..].iter().all(|e| !e.object.json_compressed()));
    // Nothing more has settled: no pass.
    assert!(idx.pack_settled(first, 3));
    assert!(events[10..].iter().all(|e| !e.object.json_compressed()));
    settle(&idx);
    // Compressed in place: the snapshot taken before, the log's events and the live
    // state hold the same objects, each reading as the text it was made from.
    for (p, e) in pods.iter().zip(&events) {
        let held = before.get(&p.key).unwrap();
        assert!(held.json_compressed(), "{}", p.key);
        assert!(ObjectRef::ptr_eq(held, &e.object));
        assert_eq!(held.json().as_str(), p.json.as_str());
        assert_eq!(e.json().as_str(), p.json.as_str());
        assert_eq!(held.json_len(), p.json.len());
        assert!(idx.snapshot().get(&p.key).unwrap().same_json(held));
        assert_eq!(
            &*fleetscope_model::StoredObject::json(&**held),
            p.json.as_str()
        );
    }
    // The same text applied again is no change, compressed or not.
    assert!(idx.apply([Change::Upsert(pods[0].clone())]).is_empty());
    // A state changed during a pass, behind where the pass is: the new state is
    // left for the next pass; one ahead of it is left too (newer than the pass).
    let changed = |i: usize| {
        let mut c = pods[i].clone();
        c.json = c.json.replace("\"Pending\"", "\"Failed\"").into();
        c.json = c.json.replace("\"Running\"", "\"Failed\"").into();
        let e = idx.apply([Change::Upsert(c.clone())]);
        assert!(!e[0].object.same_json(e[0].prev.as_ref().unwrap()));
        (c, e[0].object.clone())
    };
    let (c1, o1) = changed(1);
    let settled = idx.snapshot().revision();
    assert!(!idx.pack_settled(settled, 5));
    let (c2, o2) = changed(2);
    let (c9, o9) = changed(9);
    while !idx.pack_settled(settled, 5) {}
    assert!(o1.json_compressed());
    assert!(!o2.json_compressed() && !o9.json_compressed());
    settle(&idx);
    for (c, o) in [(c1, o1), (c2, o2), (c9, o9)] {
        assert!(o.json_compressed());
        assert_eq!(o.json().as_str(), c.json.as_str());
    }
}

/// An index holding its objects as text, with five pods.
fn five_pods_as_text() -> Index {
    let idx = Index::new(Config {
        compress_objects: false,
        ..Config::default()
    });
    idx.apply((0..5).map(|i| Change::Upsert(input("pods", "c1", "ns1", &format!("p{i}"), i, &[]))));
    idx
}

#[test]
fn objects_held_as_text_are_never_compressed() {
    let idx = five_pods_as_text();
    assert!(idx.pack_settled(idx.snapshot().revision(), usize::MAX));
    assert!(idx.snapshot().iter().all(|o| !o.json_compressed()));
}

#[test]
fn a_restored_index_compresses_what_it_restored_once_settled() {
    let idx = five_pods_as_text();
    let restored = Index::restore(
        Config::default(),
        Restored {
            revision: idx.snapshot().revision(),
            objects: vec![RestoredRun::Objects(saved_inputs(&idx.snapshot()))],
            events: Vec::new(),
            earlier: None,
            positions: Vec::new(),
        },
    );
    assert!(restored.snapshot().iter().all(|o| !o.json_compressed()));
    settle(&restored);
    let (a, b) = (idx.snapshot(), restored.snapshot());
    assert!(b.iter().all(|o| o.json_compressed()));
    for (a, b) in a.iter().zip(b.iter()) {
        assert_eq!(a.json(), b.json());
    }
}

#[test]
fn an_event_is_held_in_eight_words() {
    // Revision, object, previous state, position, what subscribers read of it (read
    // once, boxed), the kind and whether its cluster left.
    assert_eq!(std::mem::size_of::<Event>(), 64);
}

/// `extra` labels more than the label index takes of one object: `k0000=v0`, …
fn labels_past_the_cap(extra: usize) -> Vec<(String, String)> {
    (0..MAX_INDEXED_LABELS + extra)
        .map(|i| (format!("k{i:04}"), format!("v{i}")))
        .collect()
}

#[test]
fn an_object_with_more_labels_than_the_index_takes_is_held_whole_and_selected_by_a_scan() {
    let idx = index();
    let many = labels_past_the_cap(36);
    let borrowed: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut with_app = borrowed.clone();
    with_app.push(("app", "web"));
    idx.apply([
        Change::Upsert(input("pods", "a", "x", "bomb", 1, &with_app)),
        Change::Upsert(input("pods", "a", "x", "plain", 2, &[("app", "web")])),
        Change::Upsert(input("pods", "a", "x", "other", 3, &[("app", "db")])),
    ]);
    let s = idx.snapshot();
    // The label index holds the plain objects' labels, and the bomb only as unindexed.
    let keys: Vec<String> = s.labels.keys().map(|(_, k)| k.to_string()).collect();
    assert!(keys.len() <= 2, "{keys:?}");
    let q = |selector: &str| {
        let q = Query {
            labels: LabelSelector::parse(selector).unwrap(),
            ..Query::all("pods")
        };
        let mut listed = names(&s.page(&q, None, 100).items);
        listed.sort();
        let counted = s.count(&q, &[GroupBy::Label("k0070".into())]);
        (
            listed,
            counted.total,
            counted.groups.into_keys().collect::<Vec<_>>(),
        )
    };
    let (listed, total, groups) = q("app=web");
    assert_eq!(listed, ["a/pods/x/bomb", "a/pods/x/plain"]);
    assert_eq!(total, 2);
    assert_eq!(groups, [vec![String::new()], vec!["v70".to_string()]]);
    assert_eq!(q("k0099=v99").0, ["a/pods/x/bomb"]);
    assert_eq!(q("k0099").0, ["a/pods/x/bomb"]);
    assert_eq!(q("k0099 in (v99, v1)").0, ["a/pods/x/bomb"]);
    assert_eq!(q("app!=web").0, ["a/pods/x/other"]);
    assert_eq!(q("!k0001").0, ["a/pods/x/other", "a/pods/x/plain"]);
    // What a store keeps of it is every label, so a restore holds it as before.
    let bomb = s
        .get(&ObjectKey::new(
            "pods",
            &ClusterName::from("a"),
            "x",
            "bomb",
        ))
        .unwrap();
    assert!(bomb.labels_unindexed());
    let stored: Vec<(String, String)> = fleetscope_model::StoredObject::labels(&**bomb)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut expected = many.clone();
    expected.push(("app".into(), "web".into()));
    expected.sort();
    assert_eq!(stored, expected);
    // Deleted, it leaves nothing in the label index.
    idx.apply([Change::Delete(ObjectKey::new(
        "pods",
        &ClusterName::from("a"),
        "x",
        "bomb",
    ))]);
    let s = idx.snapshot();
    assert!(s.labels.keys().all(|(_, k)| &**k == "app"));
}

/// The pod `name` of namespace `ns` in cluster `c1`, as `s` holds it.
fn held_pod(s: &State, name: &str) -> ObjectRef {
    s.get(&ObjectKey::new(
        "pods",
        &ClusterName::from("c1"),
        "ns",
        name,
    ))
    .unwrap()
    .clone()
}

#[test]
fn objects_carrying_the_same_values_share_them_and_each_keeps_its_own() {
    let idx = index();
    let many = labels_past_the_cap(6);
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // In key order: runs of the same values, broken by others, and two past the cap.
    let inputs = [
        input("pods", "c1", "ns", "p1", 2, &[("app", "web")]),
        input("pods", "c1", "ns", "p2", 2, &[("app", "web")]),
        input("pods", "c1", "ns", "p3", 2, &[("app", "db")]),
        input("pods", "c1", "ns", "p4", 3, &[("app", "web")]),
        input("pods", "c1", "ns", "p5", 3, &many),
        input("pods", "c1", "ns", "p6", 3, &many),
        input(
            "pods",
            "c1",
            "ns",
            "p7",
            2,
            &[("app", "web"), ("tier", "x")],
        ),
        input("pods", "c1", "ns", "p8", 2, &[("app", "web")]),
    ];
    idx.apply(inputs.iter().cloned().map(Change::Upsert));
    let s = idx.snapshot();
    for i in &inputs {
        let held = s.get(&i.key).unwrap();
        let mut labels: Vec<(String, String)> = fleetscope_model::StoredObject::labels(&**held)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        let mut expected = i.labels.clone();
        expected.sort();
        assert_eq!(labels, expected, "{}", i.key);
        let owners: Vec<String> = held.owners().iter().map(|u| u.to_string()).collect();
        assert_eq!(owners, i.owners, "{}", i.key);
        let fields: Vec<(String, String)> = held
            .fields()
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .collect();
        assert_eq!(fields, i.fields, "{}", i.key);
        assert_eq!(held.labels_unindexed(), i.labels.len() > MAX_INDEXED_LABELS);
    }
    let web = |name: &str| held_pod(&s, name);
    assert!(web("p1").same_terms(&web("p2")) && web("p1").same_terms(&web("p8")));
    assert!(!web("p1").same_terms(&web("p4")) && !web("p1").same_terms(&web("p7")));
}

#[test]
fn an_interner_absorbing_another_keeps_its_own_values_and_shares_the_other_s() {
    let mut mine = terms::Interner::default();
    let mut other = terms::Interner::default();
    let a = mine.get("app");
    let (a_other, b) = (other.get("app"), other.get("web"));
    mine.absorb(other);
    assert!(Arc::ptr_eq(&mine.get("app"), &a));
    assert!(!Arc::ptr_eq(&mine.get("app"), &a_other));
    assert!(Arc::ptr_eq(&mine.get("web"), &b));
}

#[test]
fn objects_with_the_same_labels_in_any_order_share_one_label_set() {
    let idx = index();
    let labels = |o: &Object| o.labels().as_ptr();
    idx.apply([
        Change::Upsert(input(
            "pods",
            "c1",
            "ns",
            "p1",
            1,
            &[("b", "2"), ("a", "1")],
        )),
        Change::Upsert(input(
            "pods",
            "c1",
            "ns",
            "p2",
            1,
            &[("a", "1"), ("b", "2")],
        )),
        Change::Upsert(input(
            "pods",
            "c1",
            "ns",
            "p3",
            1,
            &[("a", "1"), ("b", "3")],
        )),
        Change::Upsert(input("pods", "c1", "ns", "p4", 1, &[("a", "1")])),
    ]);
    let s = idx.snapshot();
    let held = |name: &str| held_pod(&s, name);
    assert_eq!(labels(&held("p1")), labels(&held("p2")));
    assert_ne!(labels(&held("p1")), labels(&held("p3")));
    assert_ne!(labels(&held("p1")), labels(&held("p4")));
    // The sets differ; their keys and values are shared.
    assert!(Arc::ptr_eq(
        &held("p1").labels()[0].0,
        &held("p4").labels()[0].0
    ));
    assert_eq!(
        held("p3")
            .labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["a=1", "b=3"]
    );
}

#[test]
fn objects_added_together_are_added_when_new_and_upserted_when_held() {
    let idx = index();
    let kinds = |events: &[Arc<Event>]| -> Vec<(String, EventType)> {
        events
            .iter()
            .map(|e| (e.object.key.name.to_string(), e.kind))
            .collect()
    };
    // The parts of a first list, in order: nothing held in their range.
    let first = idx.apply([Change::Add(vec![
        input("pods", "c", "x", "p1", 1, &[]),
        input("pods", "c", "x", "p2", 2, &[]),
    ])]);
    let second = idx.apply([Change::Add(vec![
        input("pods", "c", "x", "p4", 4, &[]),
        input("pods", "c", "x", "p3", 3, &[]),
    ])]);
    assert_eq!(
        kinds(&[first, second].concat()),
        [
            ("p1".into(), EventType::Added),
            ("p2".into(), EventType::Added),
            ("p3".into(), EventType::Added),
            ("p4".into(), EventType::Added),
        ]
    );
    // A part over held objects: the new ones added, the held ones upserted, the last
    // of a key given twice winning.
    let mixed = idx.apply([Change::Add(vec![
        input("pods", "c", "x", "p0", 5, &[]),
        input("pods", "c", "x", "p2", 6, &[("app", "a")]),
        input("pods", "c", "x", "p2", 7, &[("app", "b")]),
        input("pods", "c", "x", "p5", 8, &[]),
    ])]);
    assert_eq!(
        kinds(&mixed),
        [
            ("p0".into(), EventType::Added),
            ("p5".into(), EventType::Added),
            ("p2".into(), EventType::Modified),
        ]
    );
    let s = idx.snapshot();
    assert_eq!(s.len(), 6);
    let p2 = s
        .get(&ObjectKey::new("pods", &ClusterName::from("c"), "x", "p2"))
        .unwrap();
    assert_eq!(p2.labels(), [(Arc::from("app"), Arc::from("b"))]);
}

#[test]
fn changes_made_by_lists_are_counted_apart_from_watch_events() {
    let idx = index();
    idx.apply([Change::Add(vec![
        input("pods", "c", "x", "p1", 1, &[]),
        input("pods", "c", "x", "p2", 2, &[]),
    ])]);
    assert_eq!(idx.listed_count(), 2);
    // Watch events are not.
    idx.apply([
        Change::Upsert(input("pods", "c", "x", "p3", 3, &[])),
        Change::Delete(ObjectKey::new("pods", &ClusterName::from("c"), "x", "p1")),
    ]);
    assert_eq!(idx.listed_count(), 2);
    // A relist: its changes only (p3 gone, p2 changed, p4 new; p1 long gone).
    idx.apply([Change::Replace {
        resource: "pods".into(),
        cluster: ClusterName::from("c"),
        objects: vec![
            input("pods", "c", "x", "p2", 5, &[("app", "a")]),
            input("pods", "c", "x", "p4", 6, &[]),
        ],
    }]);
    assert_eq!(idx.listed_count(), 5);
    assert_eq!(idx.snapshot().revision(), Revision(7));
}
