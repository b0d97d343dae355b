use std::collections::BTreeMap;
use std::path::Path;

use fleetscope_model::{ClusterName, EventType, ObjectKey, ObjectState, ResourceType, Revision};
use proptest::prelude::*;

use super::*;

fn object(cluster: &str, ns: &str, name: &str, revision: u64) -> ObjectRecord {
    ObjectRecord::new(
        Revision(revision),
        ObjectState {
            key: ObjectKey::new("pods", &ClusterName::from(cluster), ns, name),
            json: format!(r#"{{"metadata":{{"name":"{name}","resourceVersion":"{revision}"}}}}"#)
                .into(),
            labels: vec![("app".into(), "web".into())],
            owners: vec!["rs-1".into()],
            fields: vec![("spec.nodeName".into(), "n1".into())],
        },
    )
}

/// Writes a snapshot of records, each one's JSON as it holds it.
fn snapshot_of(
    store: &dyn Store,
    id: u64,
    revision: Revision,
    objects: &[ObjectRecord],
) -> SnapshotMeta {
    write_snapshot(store, id, revision, objects.iter(), |o| o.packed.clone()).unwrap()
}

/// Writes a snapshot of records and makes it current in place of `old`.
fn current_snapshot(
    store: &dyn Store,
    id: u64,
    revision: Revision,
    objects: &[ObjectRecord],
    old: Option<SnapshotMeta>,
) -> SnapshotMeta {
    let meta = snapshot_of(store, id, revision, objects);
    store
        .commit(&Batch {
            revision,
            snapshot: Some((meta, old)),
            ..Batch::default()
        })
        .unwrap();
    meta
}

fn pods() -> ResourceType {
    ResourceType::new("", "v1", "pods", "Pod", true)
}

fn stream(cluster: &str, rv: &str) -> StreamRecord {
    StreamRecord {
        cluster: ClusterName::from(cluster),
        resource: pods(),
        resource_version: rv.into(),
        selection: "labels=\"app=web\"".into(),
    }
}

/// Consecutive events as one record of the log.
fn run(events: Vec<EventRecord>) -> EventRun {
    EventRun::encode(&events).unwrap()
}

/// Three objects created, with a stream, at revision 3.
fn first_batch() -> Batch {
    Batch {
        revision: Revision(3),
        events: vec![run((1..=3)
            .map(|i| EventRecord {
                revision: Revision(i),
                kind: EventType::Added,
                object: object("c1", "ns", &format!("p{i}"), i),
                prev: None,
            })
            .collect())],
        streams: vec![stream("c1", "100")],
        clusters: Some(vec![ClusterName::from("c1")]),
        field_indexes: Some(vec!["spec.nodeName".into()]),
        discovery: vec![discovery("c1")],
        ..Batch::default()
    }
}

fn discovery(cluster: &str) -> DiscoveryRecord {
    DiscoveryRecord {
        cluster: ClusterName::from(cluster),
        served: vec![
            ServedRecord {
                resource: pods(),
                watchable: true,
                short_names: vec!["po".into()],
                singular: "pod".into(),
            },
            ServedRecord {
                resource: ResourceType::new("", "v1", "bindings", "Binding", true),
                watchable: false,
                short_names: Vec::new(),
                singular: String::new(),
            },
        ],
    }
}

/// p1 changed, p2 deleted, at revision 5.
fn second_batch() -> Batch {
    let changed = object("c1", "ns", "p1", 4);
    let gone = object("c1", "ns", "p2", 5);
    Batch {
        revision: Revision(5),
        events: vec![run(vec![
            EventRecord {
                revision: Revision(4),
                kind: EventType::Modified,
                object: changed,
                prev: Some(object("c1", "ns", "p1", 1)),
            },
            EventRecord {
                revision: Revision(5),
                kind: EventType::Deleted,
                object: gone,
                prev: None,
            },
        ])],
        streams: vec![stream("c1", "105")],
        ..Batch::default()
    }
}

/// A snapshot at revision 5 made current, dropping the record of events 1 to 3.
fn snapshot_at_5(store: &dyn Store, old: Option<SnapshotMeta>) -> SnapshotMeta {
    let objects = [object("c1", "ns", "p1", 4), object("c1", "ns", "p3", 3)];
    let meta = snapshot_of(store, 7, Revision(5), &objects);
    store
        .commit(&Batch {
            revision: Revision(5),
            snapshot: Some((meta, old)),
            drop_events: vec![1],
            ..Batch::default()
        })
        .unwrap();
    meta
}

/// Every retained event a load gives: those held undecoded, then the rest.
fn retained(loaded: &Loaded) -> Vec<EventRecord> {
    let mut events = loaded.earlier_events.decode_newest(usize::MAX).unwrap();
    events.extend(loaded.events.iter().cloned());
    events
}

fn check_after_both(loaded: &Loaded) {
    let events = retained(loaded);
    assert_eq!(loaded.revision, Revision(5));
    let objects = loaded.objects.to_records();
    let names: Vec<(&str, u64)> = objects
        .iter()
        .map(|o| (&*o.state.key.name, o.revision.0))
        .collect();
    assert_eq!(names, [("p1", 4), ("p3", 3)]);
    assert_eq!(objects[0].state.labels, [("app".into(), "web".into())]);
    assert_eq!(events.last().map(|e| e.revision), Some(Revision(5)));
    let modified = events.iter().find(|e| e.revision == Revision(4)).unwrap();
    assert_eq!(
        modified.prev.as_ref().map(|p| p.revision),
        Some(Revision(1))
    );
    assert_eq!(loaded.streams, [stream("c1", "105")]);
    assert_eq!(loaded.clusters, [ClusterName::from("c1")]);
    assert_eq!(
        loaded.field_indexes,
        Some(vec!["spec.nodeName".to_string()])
    );
}

#[test]
fn memory_store_round_trips_batches() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    store.commit(&second_batch()).unwrap();
    // Objects rebuilt from the change log alone.
    let loaded = store.load().unwrap();
    check_after_both(&loaded);
    assert_eq!(loaded.events.len(), 5);
    assert!(loaded.earlier_events.is_empty(), "no snapshot: all decoded");
    // Then from a snapshot: the same objects, and only the kept events.
    let meta = snapshot_at_5(&store, None);
    let loaded = store.load().unwrap();
    check_after_both(&loaded);
    assert_eq!(loaded.snapshot, Some(meta));
    let kept: Vec<u64> = retained(&loaded).iter().map(|e| e.revision.0).collect();
    assert_eq!(kept, [4, 5]);
    // Both are at or before the snapshot: held, decoded only when asked.
    assert!(loaded.events.is_empty());
    assert_eq!(loaded.earlier_events.len(), 2);
    // A newer snapshot replaces the old one's chunks; changes after it replay on top.
    let third = Batch {
        revision: Revision(6),
        events: vec![run(vec![EventRecord {
            revision: Revision(6),
            kind: EventType::Added,
            object: object("c1", "ns", "p0", 6),
            prev: None,
        }])],
        ..Batch::default()
    };
    store.commit(&third).unwrap();
    let loaded = store.load().unwrap();
    let objects = loaded.objects.to_records();
    let names: Vec<&str> = objects.iter().map(|o| &*o.state.key.name).collect();
    assert_eq!(names, ["p0", "p1", "p3"]);
}

#[test]
fn chunks_of_an_unfinished_snapshot_are_ignored_and_deleted() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    // A snapshot written but never made current (a crash before its commit).
    snapshot_of(&store, 9, Revision(3), &[object("c1", "ns", "zz", 1)]);
    let loaded = store.load().unwrap();
    assert_eq!(loaded.objects.len(), 3);
    assert!(store.keys().iter().all(|k| !k.starts_with(b"b:")));
}

#[test]
fn a_gap_in_the_change_log_is_damage() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    store.commit(&second_batch()).unwrap();
    store.overwrite_raw(&codec::event_key(Revision(4)), Vec::new());
    assert!(store.load().unwrap_err().is_damage());
    store
        .write(vec![(codec::event_key(Revision(4)), None)])
        .unwrap();
    let err = store.load().unwrap_err();
    assert!(err.to_string().contains("ends at revision 3"), "{err}");
    store
        .write(vec![(codec::event_key(Revision(1)), None)])
        .unwrap();
    let err = store.load().unwrap_err();
    assert!(err.is_damage(), "{err}");
}

#[test]
fn retained_events_before_the_snapshot_are_verified_at_load_and_decoded_when_asked() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    store.commit(&second_batch()).unwrap();
    snapshot_at_5(&store, None);
    let loaded = store.load().unwrap();
    assert!(loaded.events.is_empty());
    assert_eq!(
        loaded.event_records,
        [(
            4,
            5,
            retained(&loaded).iter().map(EventRecord::json_bytes).sum()
        )]
    );
    // The newest asked for, whole records or not.
    let newest = |keep| -> Vec<u64> {
        let events = loaded.earlier_events.decode_newest(keep).unwrap();
        events.iter().map(|e| e.revision.0).collect()
    };
    assert_eq!(newest(1), [5]);
    assert_eq!(newest(2), [4, 5]);
    assert_eq!(newest(9), [4, 5]);
    assert!(newest(0).is_empty());
    // A held record that is damaged fails the load, as a decoded one does.
    let key = codec::event_key(Revision(4));
    let mut record = store.get(&key).unwrap().unwrap();
    let last = record.len() - 1;
    record[last] ^= 1;
    store.overwrite_raw(&key, record);
    let err = store.load().unwrap_err();
    assert!(
        err.is_damage() && err.to_string().contains("revision 4"),
        "{err}"
    );
}

#[test]
fn a_snapshot_out_of_key_order_is_damage_within_a_chunk_and_across_chunks() {
    let out_of_order = |objects: &[ObjectRecord]| {
        let store = MemoryStore::new();
        store.initialise().unwrap();
        current_snapshot(&store, 1, Revision(0), objects, None);
        let err = store.load().unwrap_err();
        assert!(err.is_damage(), "{err}");
        err.to_string()
    };
    let (a, b) = (object("c", "ns", "a", 0), object("c", "ns", "b", 0));
    let err = out_of_order(&[b.clone(), a.clone()]);
    assert!(
        err.contains("chunk 0: malformed record: objects out of key order"),
        "{err}"
    );
    // Objects of a chunk each: every chunk in order, the two out of it.
    let large = |mut o: ObjectRecord| {
        o.state.json = "x".repeat(CHUNK_BYTES).into();
        o
    };
    let err = out_of_order(&[large(b), large(a)]);
    assert!(
        err.contains("does not hold its 2 objects in order"),
        "{err}"
    );
}

#[test]
fn a_failing_write_changes_nothing() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    store.fail_writes(true);
    let err = store.commit(&second_batch()).unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    store.fail_writes(false);
    let loaded = store.load().unwrap();
    assert_eq!(loaded.revision, Revision(3));
    assert_eq!(loaded.objects.len(), 3);
}

#[test]
fn every_damaged_record_is_detected() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    for key in store.keys() {
        let original = store.raw(&key).unwrap();
        for damage in [
            {
                let mut v = original.clone();
                let last = v.len() - 1;
                v[last] ^= 0x40;
                v
            },
            original[..original.len() / 2].to_vec(),
            Vec::new(),
        ] {
            store.overwrite_raw(&key, damage);
            let err = store.load().unwrap_err();
            assert!(err.is_damage(), "{}: {err}", String::from_utf8_lossy(&key));
        }
        store.overwrite_raw(&key, original);
    }
    assert!(store.load().is_ok());
}

#[test]
fn discovery_answers_are_kept_replaced_and_forgotten() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    assert_eq!(store.load().unwrap().discovery, [discovery("c1")]);
    let mut newer = discovery("c1");
    newer.served.truncate(1);
    store
        .commit(&Batch {
            revision: Revision(3),
            discovery: vec![newer.clone(), discovery("c2")],
            ..Batch::default()
        })
        .unwrap();
    assert_eq!(store.load().unwrap().discovery, [newer, discovery("c2")]);
    store
        .commit(&Batch {
            revision: Revision(3),
            drop_discovery: vec![ClusterName::from("c1"), ClusterName::from("c2")],
            ..Batch::default()
        })
        .unwrap();
    assert!(store.load().unwrap().discovery.is_empty());
}

#[test]
fn a_record_under_another_key_is_damage() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    store.commit(&second_batch()).unwrap();
    let mut e2 = Vec::new();
    store
        .scan(&mut |k, v| {
            if k == codec::event_key(Revision(4)) {
                e2 = v.to_vec();
            }
            Ok(())
        })
        .unwrap();
    store.overwrite_raw(&codec::event_key(Revision(1)), e2);
    let err = store.load().unwrap_err();
    assert!(err.to_string().contains("is for"), "{err}");
}

#[test]
fn an_unknown_schema_is_refused() {
    let store = MemoryStore::new();
    store.overwrite_raw(codec::META_SCHEMA, codec::encode_u64(SCHEMA_VERSION + 1));
    assert!(matches!(
        store.load(),
        Err(StoreError::UnknownSchema { found }) if found == SCHEMA_VERSION + 1
    ));
}

#[test]
fn sled_store_persists_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let opened = SledStore::open(dir.path()).unwrap();
        assert!(opened.moved_aside.is_none());
        assert_eq!(opened.loaded.revision, Revision(0));
        opened.store.commit(&first_batch()).unwrap();
        opened.store.commit(&second_batch()).unwrap();
        snapshot_at_5(&opened.store, None);
        assert!(opened.store.size_on_disk() > 0);
    }
    let opened = SledStore::open(dir.path()).unwrap();
    check_after_both(&opened.loaded);
}

/// Commits one more pod at revision 4, with `streams`' progress; returns it.
fn add_one(store: &SledStore, streams: Vec<StreamRecord>) -> ObjectRecord {
    let added = object("c1", "ns", "p9999", 4);
    store
        .commit(&Batch {
            revision: Revision(4),
            events: vec![run(vec![EventRecord {
                revision: Revision(4),
                kind: EventType::Added,
                object: added.clone(),
                prev: None,
            }])],
            streams,
            ..Batch::default()
        })
        .unwrap();
    added
}

#[test]
fn a_checkpoint_records_the_layout_through_every_write_and_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let (objects, added) = {
        let opened = SledStore::open(dir.path()).unwrap();
        let objects = churned(&opened.store, 10);
        let before = SledStore::layout_recorded_through(dir.path()).unwrap_or(0);
        opened.store.checkpoint().unwrap();
        // Every write so far is covered: an open reads none of them from the log.
        let through = SledStore::layout_recorded_through(dir.path()).unwrap_or(0);
        assert!(
            through > before && through >= opened.store.size_on_disk() / 2,
            "recorded through {through} of the log (before: {before})"
        );
        // Reads and writes go on.
        assert_eq!(opened.store.load().unwrap().objects.to_records(), objects);
        let added = add_one(&opened.store, Vec::new());
        (objects, added)
    };
    let opened = SledStore::open(dir.path()).unwrap();
    assert!(opened.moved_aside.is_none(), "{:?}", opened.moved_aside);
    assert_eq!(
        opened.loaded.objects.to_records(),
        [objects, vec![added]].concat()
    );
    assert_eq!(opened.loaded.revision, Revision(4));
}

#[test]
fn writes_past_the_checkpoint_size_reopen_the_database_and_keep_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let objects = {
        let mut opened = SledStore::open(dir.path()).unwrap();
        opened.store.checkpoint_min = 256 << 10;
        // About 2 MB written: the layout recorded on the way, with no call for it.
        let objects = churned(&opened.store, 20);
        assert!(SledStore::layout_recorded_through(dir.path()).unwrap_or(0) > 0);
        objects
    };
    let opened = SledStore::open(dir.path()).unwrap();
    assert!(opened.moved_aside.is_none(), "{:?}", opened.moved_aside);
    assert_eq!(opened.loaded.objects.to_records(), objects);
}

#[test]
fn a_second_opener_is_refused_while_the_first_holds_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let first = SledStore::open(dir.path()).unwrap();
    let err = SledStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err}");
    assert!(
        err.to_string()
            .contains("in use by another running fleetscope")
    );
    drop(first);
    SledStore::open(dir.path()).unwrap();
}

#[test]
fn a_path_that_is_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, b"not a directory").unwrap();
    let err = SledStore::open(&file).unwrap_err();
    assert!(matches!(err, StoreError::NotADirectory(_)), "{err}");
}

#[test]
fn an_unwritable_directory_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("ro");
    std::fs::create_dir(&locked).unwrap();
    let mut perms = std::fs::metadata(&locked).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o500);
    std::fs::set_permissions(&locked, perms).unwrap();
    // Permissions do not bind a privileged user; a read-only filesystem binds everyone.
    let target = if std::fs::write(locked.join("probe"), b"").is_ok() {
        Path::new("/proc/fleetscope-data").to_path_buf()
    } else {
        locked.join("data")
    };
    let err = SledStore::open(&target).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(
        err.to_string().contains("cannot create data directory"),
        "{err}"
    );
}

/// Damages every file of a closed store with `damage`, then reopens it.
fn reopen_damaged(damage: impl Fn(&Path)) -> Opened {
    let dir = tempfile::tempdir().unwrap();
    {
        let opened = SledStore::open(dir.path()).unwrap();
        opened.store.commit(&first_batch()).unwrap();
        opened.store.commit(&second_batch()).unwrap();
        snapshot_at_5(&opened.store, None);
    }
    for entry in walk(&dir.path().join("db")) {
        damage(&entry);
    }
    let opened = SledStore::open(dir.path()).unwrap();
    // Kept for inspection beside the fresh store.
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("damaged"))
        .collect();
    if opened.moved_aside.is_some() {
        assert_eq!(aside.len(), 1);
    }
    std::mem::forget(dir);
    opened
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn flipped_bytes_are_moved_aside_or_survive_intact() {
    let opened = reopen_damaged(|p| {
        let mut bytes = std::fs::read(p).unwrap();
        let n = bytes.len();
        for i in (n / 3..n).step_by(97) {
            bytes[i] ^= 0x5a;
        }
        std::fs::write(p, bytes).unwrap();
    });
    // Either detected and moved aside (start empty), or what loads is exactly right.
    match opened.moved_aside {
        Some((_, why)) => {
            assert!(!why.is_empty());
            assert!(opened.loaded.objects.is_empty());
        }
        None => check_after_both(&opened.loaded),
    }
    // Whatever happened, the store opened is usable.
    opened.store.commit(&first_batch()).unwrap();
}

#[test]
fn truncated_files_are_moved_aside_or_survive_intact() {
    let opened = reopen_damaged(|p| {
        let len = std::fs::metadata(p).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(len / 2).unwrap();
    });
    match opened.moved_aside {
        Some(_) => assert!(opened.loaded.objects.is_empty()),
        None => {
            // sled may recover a prefix of its log: what loads must still verify and be
            // a state some prefix of the batches produced.
            let revision = opened.loaded.revision.0;
            assert!([0, 3, 5].contains(&revision), "revision {revision}");
            if revision == 5 {
                check_after_both(&opened.loaded);
            }
        }
    }
    opened.store.commit(&first_batch()).unwrap();
}

#[test]
fn an_empty_directory_is_a_new_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("db")).unwrap();
    let opened = SledStore::open(dir.path()).unwrap();
    assert!(opened.moved_aside.is_none());
    assert!(opened.loaded.objects.is_empty());
}

#[test]
fn a_wrong_schema_on_disk_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    {
        let opened = SledStore::open(dir.path()).unwrap();
        opened.store.commit(&first_batch()).unwrap();
        opened
            .store
            .write(vec![(
                codec::META_SCHEMA.to_vec(),
                Some(codec::encode_u64(99)),
            )])
            .unwrap();
    }
    let opened = SledStore::open(dir.path()).unwrap();
    let (aside, why) = opened.moved_aside.clone().expect("moved aside");
    assert!(why.contains("schema version 99"), "{why}");
    assert!(aside.exists());
    assert!(opened.loaded.objects.is_empty());
    // The fresh store is stamped with this build's schema.
    drop(opened);
    let reopened = SledStore::open(dir.path()).unwrap();
    assert!(reopened.moved_aside.is_none());
}

/// Every object of `objects` as the index makes them: records as they are, chunks
/// visited where they lie, each view read back as a record.
fn visited(objects: &Objects) -> Vec<ObjectRecord> {
    use fleetscope_model::StoredRun;
    let (mut out, mut last) = (Vec::new(), None);
    let empty = fleetscope_model::Json::default();
    for run in objects.runs() {
        let mut each = |view: &fleetscope_model::StoredView<'_>| {
            out.push(codec::record_of(view, &mut last, &empty));
        };
        match run {
            Run::Records(records) => out.extend(records.iter().cloned()),
            Run::Chunk(chunk) => chunk.visit(&mut each),
            Run::Patched(patched) => patched.visit(&mut each),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn records_round_trip(
        name in "[a-z0-9.-]{1,40}",
        json in ".{0,200}",
        labels in proptest::collection::vec(("[a-z/.]{1,20}", ".{0,20}"), 0..5),
        revision in any::<u64>(),
    ) {
        let o = ObjectRecord::new(
            Revision(revision),
            ObjectState {
                key: ObjectKey::new("deployments.apps", &ClusterName::from("c"), "", &name),
                json: json.into(),
                labels,
                owners: vec![name.clone()],
                fields: Vec::new(),
            },
        );
        prop_assert_eq!(codec::decode_object(&codec::encode_object(&o)).unwrap(), o.clone());
        let e = EventRecord { revision: Revision(revision), kind: EventType::Deleted, object: o.clone(), prev: Some(o) };
        let mut next = e.clone();
        next.revision = next.revision.next();
        next.prev = None;
        let events = vec![e, next];
        if revision < u64::MAX {
            let record = codec::encode_events(&events).unwrap().2;
            prop_assert_eq!(codec::decode_events(&record).unwrap(), events.clone());
            // Skimmed, it says what decoding it gives, and holds what decodes to it.
            let (skimmed, plain) = codec::skim_events(&record).unwrap();
            prop_assert_eq!(skimmed, codec::Skimmed {
                first: revision,
                last: revision + 1,
                events: 2,
                json_bytes: events.iter().map(EventRecord::json_bytes).sum(),
            });
            prop_assert_eq!(codec::decode_plain_events(&plain).unwrap(), events);
        }
    }

    #[test]
    fn replaying_a_change_log_onto_chunks_gives_what_applying_it_one_by_one_gives(
        held in proptest::collection::btree_set(0u16..400, 0..120),
        cuts in proptest::collection::vec(0usize..120, 0..12),
        changes in proptest::collection::vec((0u16..400, any::<bool>()), 0..60),
    ) {
        let name = |n: u16| format!("p{n:03}");
        let mut model: BTreeMap<String, ObjectRecord> = held
            .iter()
            .map(|n| (name(*n), object("c", "ns", &name(*n), 1)))
            .collect();
        // The snapshot's objects cut into chunks, some of them empty.
        let mut objects: Vec<ObjectRecord> = model.values().cloned().collect();
        let mut chunks = Vec::new();
        let mut cuts = cuts;
        cuts.sort_unstable();
        for cut in cuts.into_iter().rev() {
            chunks.push(objects.split_off(cut.min(objects.len())));
        }
        chunks.push(objects);
        chunks.reverse();
        // A chunk no change falls within is passed on as it is stored.
        let untouched = chunks
            .iter()
            .filter(|c| {
                c.first().zip(c.last()).is_some_and(|(first, last)| {
                    !changes.iter().any(|(n, _)| {
                        (first.state.key.name.as_ref()..=last.state.key.name.as_ref())
                            .contains(&name(*n).as_str())
                    })
                })
            })
            .count();
        let events: Vec<EventRecord> = changes
            .iter()
            .enumerate()
            .map(|(i, (n, delete))| EventRecord {
                revision: Revision(i as u64 + 2),
                kind: if *delete { EventType::Deleted } else { EventType::Modified },
                object: object("c", "ns", &name(*n), i as u64 + 2),
                prev: None,
            })
            .collect();
        for e in &events {
            match e.kind {
                EventType::Deleted => model.remove(&*e.object.state.key.name),
                _ => model.insert(e.object.state.key.name.to_string(), e.object.clone()),
            };
        }
        let touched = chunks.iter().filter(|c| !c.is_empty()).count() - untouched;
        let chunks: Vec<StoredChunk> = chunks.iter().map(|c| objects::chunk_of(c)).collect();
        let replayed = objects::replay(chunks, &events.iter().collect::<Vec<_>>());
        let passed = replayed.runs().iter().filter(|r| matches!(r, Run::Chunk(_))).count();
        prop_assert_eq!(passed, untouched);
        // A touched chunk is read in place with its changes laid over it (unless every
        // object it held is gone), never read out as records.
        let patched = replayed.runs().iter().filter(|r| matches!(r, Run::Patched(_))).count();
        prop_assert!(patched <= touched);
        let expected: Vec<ObjectRecord> = model.into_values().collect();
        // What the index is made from, each run visited as it makes it, is the same.
        prop_assert_eq!(&visited(&replayed), &expected);
        prop_assert_eq!(replayed.len(), expected.len());
        prop_assert_eq!(replayed.json_bytes(), expected.iter().map(ObjectRecord::json_len).sum::<usize>());
        prop_assert_eq!(replayed.into_records(), expected);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = codec::decode_object(&bytes);
        let _ = codec::decode_events(&bytes);
        let _ = codec::skim_events(&bytes);
        let _ = codec::decode_plain_events(&bytes);
        let _ = codec::decode_chunk(&bytes, &codec::Dictionaries::default());
        let _ = codec::decode_dictionary(&bytes);
        let _ = codec::decode_snapshot(&bytes);
        let _ = codec::decode_stream(&bytes);
        let _ = codec::decode_names(&bytes);
    }
}

/// A store whose snapshot was replaced `rounds` times, each time by objects of 2 KiB
/// that barely compress: sled keeps the space of the replaced ones for a while.
fn churned(store: &SledStore, rounds: u64) -> Vec<ObjectRecord> {
    store.commit(&first_batch()).unwrap();
    let mut old = None;
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut last = Vec::new();
    for round in 0..rounds {
        last = (0..300)
            .map(|i| {
                let mut o = object("c1", "ns", &format!("p{i:04}"), 3);
                let noise: String = (0..256)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        format!("{seed:016x}").chars().nth(3).unwrap_or('0')
                    })
                    .collect::<String>()
                    .repeat(8);
                o.state.json = format!(r#"{{"round":{round},"noise":"{noise}"}}"#).into();
                o
            })
            .collect();
        let meta = current_snapshot(store, round + 10, Revision(3), &last, old);
        old = Some(meta);
    }
    last
}

#[test]
fn compaction_reclaims_space_and_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let objects = {
        let opened = SledStore::open(dir.path()).unwrap();
        let objects = churned(&opened.store, 30);
        let (before, after) = opened.store.compact().unwrap();
        assert!(
            after * 2 < before,
            "compaction left {after} bytes of {before}"
        );
        assert_eq!(opened.store.size_on_disk(), after);
        // Reads and writes go on in the compacted store.
        assert_eq!(opened.store.load().unwrap().objects.to_records(), objects);
        let added = add_one(&opened.store, vec![stream("c1", "104")]);
        [objects, vec![added]].concat()
    };
    assert!(!dir.path().join("db.next").exists());
    assert!(!dir.path().join("db.old").exists());
    let opened = SledStore::open(dir.path()).unwrap();
    assert!(opened.moved_aside.is_none(), "{:?}", opened.moved_aside);
    assert_eq!(opened.loaded.objects.to_records(), objects);
    assert_eq!(opened.loaded.revision, Revision(4));
    assert_eq!(opened.loaded.streams, [stream("c1", "104")]);
}

#[test]
fn writes_made_while_a_compaction_copies_the_store_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let opened = SledStore::open(dir.path()).unwrap();
    let store = std::sync::Arc::new(opened.store);
    let mut objects = churned(&store, 10);
    // Compactions one after another, while the main thread keeps committing.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let compactor = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..5 {
                store.compact().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let mut revision = 3;
    while !done.load(std::sync::atomic::Ordering::SeqCst) || revision < 40 {
        revision += 1;
        let added = object("c1", "ns", &format!("q{revision:05}"), revision);
        store
            .commit(&Batch {
                revision: Revision(revision),
                events: vec![run(vec![EventRecord {
                    revision: Revision(revision),
                    kind: EventType::Added,
                    object: added.clone(),
                    prev: None,
                }])],
                streams: vec![stream("c1", &revision.to_string())],
                ..Batch::default()
            })
            .unwrap();
        objects.push(added);
    }
    compactor.join().unwrap();
    let check = |loaded: Loaded| {
        assert_eq!(loaded.objects.to_records(), objects);
        assert_eq!(loaded.revision, Revision(revision));
        assert_eq!(loaded.streams, [stream("c1", &revision.to_string())]);
    };
    check(store.load().unwrap());
    drop(store);
    let opened = SledStore::open(dir.path()).unwrap();
    assert!(opened.moved_aside.is_none(), "{:?}", opened.moved_aside);
    check(opened.loaded);
}

/// A data directory holding a store churned `rounds` times, closed; and its objects.
fn churned_and_closed(rounds: u64) -> (tempfile::TempDir, Vec<ObjectRecord>) {
    let dir = tempfile::tempdir().unwrap();
    let opened = SledStore::open(dir.path()).unwrap();
    let objects = churned(&opened.store, rounds);
    (dir, objects)
}

fn copy_dir(from: &Path, to: &Path) {
    for file in walk(from) {
        let target = to.join(file.strip_prefix(from).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&file, &target).unwrap();
    }
}

#[test]
fn a_compaction_interrupted_by_a_crash_is_undone_or_finished_at_open() {
    let (dir, objects) = churned_and_closed(3);
    let (db, next, old) = (
        dir.path().join("db"),
        dir.path().join("db.next"),
        dir.path().join("db.old"),
    );
    // Crashed while copying: an unfinished db.next beside db.
    std::fs::create_dir_all(&next).unwrap();
    std::fs::write(next.join("conf"), b"half").unwrap();
    {
        let opened = SledStore::open(dir.path()).unwrap();
        assert!(opened.moved_aside.is_none());
        assert_eq!(opened.loaded.objects.to_records(), objects);
        assert!(!next.exists());
    }
    // Crashed between the renames: the finished copy as db.next, the old one as db.old.
    copy_dir(&db, &next);
    std::fs::rename(&db, &old).unwrap();
    {
        let opened = SledStore::open(dir.path()).unwrap();
        assert!(opened.moved_aside.is_none());
        assert_eq!(opened.loaded.objects.to_records(), objects);
        assert!(db.exists() && !next.exists() && !old.exists());
    }
    // Crashed after the switch, before db.old was removed.
    copy_dir(&db, &old);
    let opened = SledStore::open(dir.path()).unwrap();
    assert_eq!(opened.loaded.objects.to_records(), objects);
    assert!(!old.exists());
}

#[test]
fn opening_waits_for_a_database_this_process_still_holds_and_never_takes_it_for_damage() {
    let (dir, objects) = churned_and_closed(2);
    // sled's own lock on its file, held as a database just closed may still hold it
    // (the store closed above may itself still hold it for a moment).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let holder = loop {
        match sled::open(dir.path().join("db")) {
            Ok(db) => break db,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "{e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    };
    let (started, running) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    let opener = std::thread::spawn(move || {
        started.send(()).unwrap();
        SledStore::open(&path)
    });
    running.recv().unwrap();
    drop(holder);
    let opened = opener.join().unwrap().unwrap();
    assert!(opened.moved_aside.is_none());
    assert_eq!(opened.loaded.objects.to_records(), objects);
}

#[test]
fn an_unfinished_sled_snapshot_left_by_a_kill_is_not_damage() {
    let (dir, objects) = churned_and_closed(2);
    // What a kill while sled writes its own snapshot leaves: a partial file.
    std::fs::write(
        dir.path()
            .join("db")
            .join("snap.FFFFFFFFFFFFFFFF.generating"),
        b"partial",
    )
    .unwrap();
    let opened = SledStore::open(dir.path()).unwrap();
    assert!(opened.moved_aside.is_none(), "{:?}", opened.moved_aside);
    assert_eq!(opened.loaded.objects.to_records(), objects);
}

/// A pod of a size worth compressing.
fn pod(name: &str) -> ObjectRecord {
    let mut o = object("c1", "ns", name, 3);
    o.state.json = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"3"}},"spec":{{"containers":[{{"name":"app","image":"registry.example/app:1.2.3"}}],"nodeName":"n1"}}}}"#
    )
    .into();
    o
}

/// `o` with its JSON compressed against `dictionary`, as a snapshot is given it.
fn packed(mut o: ObjectRecord, dictionary: &std::sync::Arc<[u8]>) -> ObjectRecord {
    let p = PackedJson::pack(dictionary, &o.state.json).unwrap();
    o.packed = Some(triomphe::Arc::new(p));
    o.state.json = Default::default();
    o
}

/// A config map, compressed against a dictionary of its own type; three pods
/// compressed against theirs, one against another dictionary, one as text.
fn mixed() -> (Vec<ObjectRecord>, Vec<String>) {
    let of = |text: &str| -> std::sync::Arc<[u8]> { std::sync::Arc::from(text.as_bytes()) };
    let pods = of(&pod("template").state.json);
    let mut cm = pod("settings");
    cm.state.key = ObjectKey::new("configmaps", &ClusterName::from("c1"), "ns", "settings");
    let cm_dictionary = of(&cm.state.json.replace("Pod", "ConfigMap"));
    let objects = vec![
        packed(cm, &cm_dictionary),
        packed(pod("a"), &pods),
        packed(pod("b"), &of(&pod("other").state.json)),
        pod("c"),
        packed(pod("d"), &pods),
    ];
    let texts = objects.iter().map(|o| o.text().into_owned()).collect();
    (objects, texts)
}

#[test]
fn a_snapshot_keeps_compressed_objects_compressed_with_one_dictionary_per_type() {
    let dir = tempfile::tempdir().unwrap();
    let (objects, texts) = mixed();
    {
        let opened = SledStore::open(dir.path()).unwrap();
        opened.store.commit(&first_batch()).unwrap();
        let meta = current_snapshot(&opened.store, 7, Revision(3), &objects, None);
        assert_eq!((meta.objects, meta.dictionaries), (5, 2));
    }
    let opened = SledStore::open(dir.path()).unwrap();
    assert!(opened.moved_aside.is_none());
    let loaded = opened.loaded;
    assert_eq!(loaded.snapshot.unwrap().dictionaries, 2);
    let read: Vec<String> = loaded
        .objects
        .to_records()
        .iter()
        .map(|o| o.text().into_owned())
        .collect();
    assert_eq!(read, texts);
    let objects = loaded.objects.to_records();
    let compressed: Vec<bool> = objects.iter().map(|o| o.packed.is_some()).collect();
    // The pod compressed against a dictionary not its type's is stored as text.
    assert_eq!(compressed, [true, true, false, false, true]);
    let dictionary = |i: usize| objects[i].packed.as_ref().unwrap().dictionary().clone();
    assert!(std::sync::Arc::ptr_eq(&dictionary(1), &dictionary(4)));
    assert!(!std::sync::Arc::ptr_eq(&dictionary(0), &dictionary(1)));
    assert_eq!(objects[1].json_len(), texts[1].len());
    assert!(objects[1].state.json.is_empty());
    // The compressed objects of a chunk share one empty text, not an allocation each.
    assert!(std::ptr::eq(
        objects[0].state.json.as_str(),
        objects[1].state.json.as_str()
    ));
}

#[test]
fn a_store_of_the_layout_before_is_read_and_takes_this_one_at_its_next_snapshot() {
    let store = MemoryStore::new();
    store.overwrite_raw(codec::META_SCHEMA, codec::encode_u64(SCHEMA_READ));
    store.commit(&first_batch()).unwrap();
    let before = [pod("a"), pod("b")];
    let old = SnapshotMeta {
        id: 5,
        revision: Revision(3),
        chunks: 1,
        objects: 2,
        dictionaries: 0,
    };
    let (chunk, meta) = codec::layout_before(&before, &old);
    store.overwrite_raw(&codec::chunk_key(5, 0), chunk);
    store.overwrite_raw(codec::META_SNAPSHOT, meta);
    let loaded = store.load().unwrap();
    assert_eq!(loaded.snapshot, Some(old));
    assert_eq!(loaded.objects.to_records(), before);
    // The next snapshot is written in this layout and the store says so.
    let (objects, texts) = mixed();
    current_snapshot(&store, 6, Revision(3), &objects, Some(old));
    assert!(!store.keys().contains(&codec::chunk_key(5, 0)));
    let loaded = store.load().unwrap();
    let read: Vec<String> = loaded
        .objects
        .to_records()
        .iter()
        .map(|o| o.text().into_owned())
        .collect();
    assert_eq!(read, texts);
    let schema = store.raw(codec::META_SCHEMA).unwrap();
    assert_eq!(codec::decode_u64(&schema).unwrap(), SCHEMA_VERSION);
}

#[test]
fn a_missing_or_damaged_dictionary_is_damage_and_an_unfinished_snapshot_s_are_removed() {
    let store = MemoryStore::new();
    store.initialise().unwrap();
    store.commit(&first_batch()).unwrap();
    let (objects, _) = mixed();
    let meta = current_snapshot(&store, 7, Revision(3), &objects, None);
    // A snapshot written but never made current leaves no dictionary behind.
    snapshot_of(&store, 9, Revision(3), &objects);
    assert!(store.load().is_ok());
    let dictionaries: Vec<Vec<u8>> = store
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(codec::DICTIONARY_PREFIX))
        .collect();
    assert_eq!(
        dictionaries,
        [codec::dictionary_key(7, 0), codec::dictionary_key(7, 1)]
    );
    let raw = |key: &[u8]| store.raw(key).unwrap();
    for key in &dictionaries {
        let original = raw(key);
        let mut flipped = original.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        store.overwrite_raw(key, flipped);
        let err = store.load().unwrap_err();
        assert!(
            err.is_damage() && err.to_string().contains("dictionary record"),
            "{err}"
        );
        store.overwrite_raw(key, original);
    }
    // One gone: the snapshot says how many it has.
    let second = raw(&dictionaries[1]);
    store.write(vec![(dictionaries[1].clone(), None)]).unwrap();
    let err = store.load().unwrap_err();
    assert!(
        err.to_string().contains("has 1 of its 2 dictionaries"),
        "{err}"
    );
    // ... and a chunk whose objects need it cannot be read without it.
    let counted = SnapshotMeta {
        dictionaries: 1,
        ..meta
    };
    store.overwrite_raw(codec::META_SNAPSHOT, codec::encode_snapshot(&counted));
    let err = store.load().unwrap_err();
    assert!(
        err.to_string()
            .contains("dictionary the snapshot does not hold"),
        "{err}"
    );
    store.overwrite_raw(&dictionaries[1], second);
    store.overwrite_raw(codec::META_SNAPSHOT, codec::encode_snapshot(&meta));
    assert!(store.load().is_ok());
}
