#![allow(clippy::unwrap_used)]

use fleetscope_index::Change;
use fleetscope_model::{ObjectKey, ObjectState};
use fleetscope_store::MemoryStore;

use super::*;

fn pod(name: &str, rv: u64) -> Change {
    Change::Upsert(ObjectState {
        key: ObjectKey::new("pods", &ClusterName::from("c1"), "ns", name),
        json: format!(
            r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}}}}"#
        ).into(),
        labels: Vec::new(),
        owners: Vec::new(),
        fields: Vec::new(),
    })
}

/// An index and a persister over a store in memory, as a fresh start makes them.
fn persisted() -> (Arc<Index>, Arc<Persister>, Arc<MemoryStore>) {
    persisted_with(PersistConfig::default())
}

fn persisted_with(config: PersistConfig) -> (Arc<Index>, Arc<Persister>, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    store.initialise().unwrap();
    let base = Revision(1_000);
    let index = Arc::new(Index::starting_after(
        fleetscope_index::Config::default(),
        base,
    ));
    let persister = Arc::new(Persister::new(
        store.clone(),
        config,
        Continued {
            held_json: 0,
            records: Vec::new(),
            snapshot: None,
            change_log: 0,
            revision: base,
        },
        index.clone(),
        StatusTable::default(),
    ));
    persister.write_snapshot_of(index.snapshot());
    (index, persister, store)
}

/// Stages one change and records it, as the ingest does.
fn record(index: &Index, persister: &Persister, change: Change) {
    persister.record(index.stage([change]), [], crate::ProgressLog::default());
}

/// The revisions a subscriber has been handed since it last asked.
fn delivered(feed: &mut fleetscope_index::Feed) -> Vec<u64> {
    feed.try_next()
        .unwrap()
        .iter()
        .map(|e| e.revision.0)
        .collect()
}

/// The names of the objects an index holds, in key order.
pub(crate) fn names(index: &Index) -> Vec<String> {
    index
        .snapshot()
        .iter()
        .map(|o| o.key.name.to_string())
        .collect()
}

#[tokio::test]
async fn a_batch_is_invisible_until_its_write_is_confirmed() {
    let (index, persister, store) = persisted();
    let mut feed = index.subscribe(None).unwrap().feed;
    record(&index, &persister, pod("a", 1));
    assert!(names(&index).is_empty(), "readers see nothing unwritten");
    assert!(feed.try_next().unwrap().is_empty(), "nor do subscribers");
    assert_eq!(index.snapshot().revision(), Revision(1_000));
    persister.flush().await.unwrap();
    assert_eq!(names(&index), ["a"]);
    assert_eq!(delivered(&mut feed), [1_001]);
    // What was published is what the store holds: a restart continues from it.
    let loaded = store.load().unwrap();
    assert_eq!(loaded.revision, Revision(1_001));
    assert_eq!(loaded.objects.len(), 1);
}

#[tokio::test]
async fn a_failed_write_keeps_its_batch_invisible_and_is_retried() {
    let (index, persister, store) = persisted();
    persister.flush().await.unwrap();
    let mut feed = index.subscribe(None).unwrap().feed;
    store.fail_writes(true);
    record(&index, &persister, pod("a", 1));
    assert!(persister.flush().await.is_err());
    assert!(names(&index).is_empty(), "a failed write shows nothing");
    assert!(feed.try_next().unwrap().is_empty());
    // More changes gather behind it; the retry writes them all, in order.
    record(&index, &persister, pod("b", 2));
    assert!(persister.flush().await.is_err());
    store.fail_writes(false);
    persister.flush().await.unwrap();
    assert_eq!(names(&index), ["a", "b"]);
    assert_eq!(delivered(&mut feed), [1_001, 1_002]);
    assert_eq!(store.load().unwrap().objects.len(), 2);
}

#[tokio::test]
async fn reads_of_what_is_durable_go_on_while_writes_fail() {
    let (index, persister, store) = persisted();
    let cancel = CancellationToken::new();
    let writer = tokio::spawn(persister.clone().run(cancel.clone()));
    record(&index, &persister, pod("a", 1));
    let deadline = Instant::now() + Duration::from_secs(60);
    while names(&index).is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    store.fail_writes(true);
    record(&index, &persister, pod("b", 2));
    while persister.stats().last_error.is_none() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The writer keeps failing; readers are answered from what is durable.
    for _ in 0..100 {
        assert_eq!(names(&index), ["a"]);
        assert_eq!(index.snapshot().revision(), Revision(1_001));
    }
    store.fail_writes(false);
    while names(&index).len() < 2 {
        assert!(Instant::now() < deadline, "the retry publishes");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    writer.await.unwrap();
}

#[tokio::test]
async fn a_snapshot_written_beside_the_writes_becomes_current_and_loads_as_the_index() {
    // A snapshot is due after every change.
    let (index, persister, store) = persisted_with(PersistConfig {
        snapshot_share: 0.0,
        snapshot_min_bytes: 0,
        ..PersistConfig::default()
    });
    let cancel = CancellationToken::new();
    let writer = tokio::spawn(persister.clone().run(cancel.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    // Changes keep coming until snapshots taken beside them (after the first, which
    // a fresh store writes with its first batch) are current: ten pods changed over
    // and over, so that the store is soon past filling (see `FILLED_SHARE`).
    while persister.stats().snapshots < 3 {
        assert!(Instant::now() < deadline, "no snapshot became current");
        i += 1;
        record(&index, &persister, pod(&format!("p{}", i % 10), i));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cancel.cancel();
    writer.await.unwrap();
    persister.close().await.unwrap();
    let loaded = store.load().unwrap();
    let held: Vec<String> = loaded
        .objects
        .to_records()
        .iter()
        .map(|o| o.state.key.name.to_string())
        .collect();
    let mut expected = names(&index);
    expected.sort();
    let mut held = held;
    held.sort();
    assert_eq!(
        held, expected,
        "the store loads as the index it was written from"
    );
    assert_eq!(loaded.revision, index.snapshot().revision());
    // The snapshot holds objects compressed as the index compresses them (those
    // changed after it come from the change log as text), and a restored index holds
    // them so, reading back the same JSON.
    let mut loaded = loaded;
    assert!(
        loaded
            .objects
            .to_records()
            .iter()
            .any(|o| o.packed.is_some())
    );
    // The snapshot's chunks are handed on as they are stored (with any changes after
    // it laid over them), their objects made where they lie.
    assert!(loaded.objects.runs().iter().any(|r| matches!(
        r,
        fleetscope_store::Run::Chunk(_) | fleetscope_store::Run::Patched(_)
    )));
    let restored = Index::restore(
        fleetscope_index::Config::default(),
        super::restored(&mut loaded),
    );
    let back = restored.snapshot();
    assert!(back.iter().any(|o| o.json_compressed()));
    for o in index.snapshot().iter() {
        let b = back.get(&o.key).unwrap();
        assert_eq!(b.json(), o.json(), "{}", o.key);
        assert_eq!(b.revision, o.revision, "{}", o.key);
        assert_eq!(b.labels(), o.labels(), "{}", o.key);
        assert_eq!(b.owners(), o.owners(), "{}", o.key);
        assert_eq!(b.fields(), o.fields(), "{}", o.key);
    }
    // Objects made where their chunk holds them share one location per namespace, as
    // those made from records do.
    let held: Vec<_> = back.iter().collect();
    for pair in held.windows(2) {
        let (a, b) = (&pair[0].key, &pair[1].key);
        assert_eq!(
            std::sync::Arc::ptr_eq(a.location(), b.location()),
            **a.location() == **b.location(),
            "{a} and {b}"
        );
    }
}

/// Whether a persister's store, started empty, is still filling.
fn filling(persister: &Persister) -> bool {
    matches!(*lock(&persister.fill), Fill::Filling { .. })
}

/// The revision of the snapshot a persister has gathered to write next.
fn gathered_snapshot(persister: &Persister) -> Option<Revision> {
    lock(&persister.pending)
        .snapshot
        .as_ref()
        .map(|s| s.revision())
}

#[test]
fn a_store_filling_from_empty_neither_snapshots_nor_compacts_until_it_is_filled() {
    // Snapshots due after a change log of half the held JSON; compactions past it.
    let (index, persister, _) = persisted_with(PersistConfig {
        snapshot_min_bytes: 0,
        compact_min_bytes: 0,
        ..PersistConfig::default()
    });
    let initial = gathered_snapshot(&persister);
    for i in 0..100 {
        record(&index, &persister, pod(&format!("p{i}"), i));
    }
    // Each object recorded once: filling, whatever the log's and the file's size.
    assert_eq!(gathered_snapshot(&persister), initial);
    assert!(!persister.compaction_due(50 << 20, 1.0));
    // Changed over and over: filled. The fill's log counts as a snapshot...
    let mut rv = 100;
    while filling(&persister) {
        assert!(rv < 1_000, "never filled");
        record(&index, &persister, pod("p0", rv));
        rv += 1;
    }
    assert_eq!(gathered_snapshot(&persister), initial);
    // ... and the size as compacted: the next compaction once it grows by half.
    assert!(!persister.compaction_due(12 << 20, 1.0));
    assert!(!persister.compaction_due(18 << 20, 1.0));
    assert!(persister.compaction_due(19 << 20, 1.0));
    // A change log past half the held JSON beyond the fill's: a snapshot is due.
    let held = *lock(&persister.held_json);
    for rv in rv..2_000 {
        record(&index, &persister, pod("p1", rv));
        if gathered_snapshot(&persister) != initial {
            break;
        }
    }
    assert_ne!(
        gathered_snapshot(&persister),
        initial,
        "held {held} bytes of JSON"
    );
}

#[test]
fn a_store_that_starts_with_objects_is_not_filling() {
    let store = Arc::new(MemoryStore::new());
    store.initialise().unwrap();
    let index = Arc::new(Index::starting_after(
        fleetscope_index::Config::default(),
        Revision(1_000),
    ));
    let persister = Persister::new(
        store,
        PersistConfig {
            compact_min_bytes: 0,
            ..PersistConfig::default()
        },
        Continued {
            held_json: 4_096,
            records: Vec::new(),
            snapshot: None,
            change_log: 0,
            revision: Revision(1_000),
        },
        index,
        StatusTable::default(),
    );
    assert!(!filling(&persister));
    assert!(persister.compaction_due(50 << 20, 4_096.0));
    assert_eq!(persister.fill_log(1 << 20, 0, 4_096.0, 0), 0);
}

#[test]
fn a_store_filling_from_empty_is_filled_once_it_holds_its_limit() {
    let (index, persister, _) = persisted();
    record(&index, &persister, pod("p0", 1));
    let held = *lock(&persister.held_json) as f64;
    assert_eq!(persister.fill_log(1_000, 0, held, 0), 1_000, "filling");
    // As if it held more than the limit, each object recorded once: filled, its
    // log so far counting as a snapshot, its size taken at the next check.
    *lock(&persister.fill) = Fill::Filling {
        recorded: FILL_MAX_JSON as usize + 1,
    };
    assert_eq!(persister.fill_log(2_000, 0, FILL_MAX_JSON + 1.0, 0), 2_000);
    assert!(!filling(&persister));
    assert_eq!(persister.fill_log(2_500, 0, FILL_MAX_JSON + 1.0, 0), 2_000);
    assert!(!persister.compaction_due(300 << 20, FILL_MAX_JSON + 1.0));
    assert!(persister.compaction_due(451 << 20, FILL_MAX_JSON + 1.0));
}

#[tokio::test(start_paused = true)]
async fn a_write_starts_as_soon_as_there_is_something_to_write() {
    let (index, persister, _store) = persisted();
    let cancel = CancellationToken::new();
    let writer = tokio::spawn(persister.clone().run(cancel.clone()));
    let started = tokio::time::Instant::now();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        record(&index, &persister, pod(name, i as u64));
        while names(&index).len() <= i {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // No timer stands between a change and its write: paused time barely moves.
    assert!(
        started.elapsed() < Duration::from_millis(50),
        "{:?}",
        started.elapsed()
    );
    cancel.cancel();
    writer.await.unwrap();
}

/// A persister whose change log on disk is `change_log` bytes, past filling, with
/// `last` as its last snapshot (taken `ago`, writing it took `took`).
fn with_log(
    config: PersistConfig,
    change_log: usize,
    last: Option<(Duration, Duration)>,
) -> Arc<Persister> {
    let (_, persister, _) = persisted_with(config);
    *lock(&persister.fill) = Fill::Never;
    lock(&persister.disk).change_log = change_log;
    *lock(&persister.last_snapshot) = last.map(|(ago, took)| LastSnapshot {
        current_at: tokio::time::Instant::now() - ago,
        took,
        failed: false,
    });
    // Changes keep coming.
    *lock(&persister.last_change) = Some(tokio::time::Instant::now() + Duration::from_secs(3600));
    persister
}

#[tokio::test]
async fn a_change_log_past_its_bound_is_due_for_a_snapshot_once_the_last_is_far_enough_behind() {
    let config = PersistConfig {
        snapshot_log_bytes: 1_000,
        snapshot_cpu_share: 0.1,
        ..PersistConfig::default()
    };
    let second = Duration::from_secs(1);
    // Under the bound: never due for it.
    let under = with_log(config.clone(), 1_000, None);
    assert_eq!(under.log_snapshot_at(), None);
    // Past it, with no snapshot yet (and no restore under way): at once.
    let first = with_log(config.clone(), 1_001, None);
    assert!(first.snapshot_spaced());
    assert!(first.log_snapshot_at().unwrap() <= tokio::time::Instant::now());
    // The last took 1 s: the next waits 10 s after it (a tenth of a core).
    let soon = with_log(config.clone(), 1_001, Some((5 * second, second)));
    assert!(!soon.snapshot_spaced());
    let at = soon.log_snapshot_at().unwrap();
    let expected = tokio::time::Instant::now() + 5 * second;
    assert!(at <= expected && at + second > expected, "due 5 s from now");
    // Changes that stopped two seconds ago: a burst over, no need to wait; unless
    // the last snapshot failed, which the spacing then paces.
    *lock(&soon.last_change) = Some(tokio::time::Instant::now() - 2 * second);
    lock(&soon.last_snapshot).as_mut().unwrap().failed = true;
    assert_eq!(soon.log_snapshot_at(), Some(at));
    lock(&soon.last_snapshot).as_mut().unwrap().failed = false;
    assert!(soon.log_snapshot_at().unwrap() <= tokio::time::Instant::now());
    let later = with_log(config.clone(), 1_001, Some((11 * second, second)));
    assert!(later.snapshot_spaced());
    // A snapshot being written covers the log it was started for.
    later.covered.store(1_001, Ordering::Relaxed);
    assert_eq!(later.log_snapshot_at(), None);
    // A store that started empty, filled, with no snapshot since: its first sync is
    // paced by the share of the objects alone, and the bound met once changes stop.
    let filled = with_log(config.clone(), 1_001, Some((11 * second, second)));
    *lock(&filled.fill) = Fill::Filled {
        snapshot: 0,
        log: 0,
        size_due: false,
    };
    assert!(!filled.snapshot_spaced());
    let stopped = tokio::time::Instant::now() - second / 2;
    *lock(&filled.last_change) = Some(stopped);
    assert_eq!(filled.log_snapshot_at(), Some(stopped + snapshot::QUIET));
    // A zero share: never for the bound alone.
    let never = with_log(
        PersistConfig {
            snapshot_cpu_share: 0.0,
            ..config
        },
        1_001,
        Some((11 * second, second)),
    );
    assert!(!never.snapshot_spaced());
    assert_eq!(never.log_snapshot_at(), None);
    *lock(&never.last_change) = None;
    assert_eq!(never.log_snapshot_at(), None);
}

#[tokio::test(start_paused = true)]
async fn the_writer_snapshots_a_change_log_past_its_bound_once_changes_stop() {
    // Only the bound makes a snapshot due; the spacing (a million times the last
    // snapshot's writing time) is not waited out once changes have stopped.
    let (index, persister, store) = persisted_with(PersistConfig {
        snapshot_share: f64::INFINITY,
        snapshot_min_bytes: 0,
        snapshot_log_bytes: 4_000,
        snapshot_cpu_share: 1e-6,
        ..PersistConfig::default()
    });
    let cancel = CancellationToken::new();
    let writer = tokio::spawn(persister.clone().run(cancel.clone()));
    // The first change goes with the fresh store's first snapshot; once that is
    // current, the bound is not spaced again for a long while.
    record(&index, &persister, pod("p0", 1));
    while persister.stats().snapshots < 1 || lock(&persister.pending).changes() > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Ten pods changed over and over: past filling (see `FILLED_SHARE`), then a log
    // well past the bound, all recorded before the clock moves.
    for i in 2..=400 {
        record(&index, &persister, pod(&format!("p{}", i % 10), i));
    }
    assert!(!persister.snapshot_spaced());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    while persister.change_log_bytes() > 4_000 || lock(&persister.pending).changes() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the log stayed at {} bytes",
            persister.change_log_bytes()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        persister.stats().snapshots,
        2,
        "the first, then one for the bound"
    );
    cancel.cancel();
    writer.await.unwrap();
    persister.close().await.unwrap();
    let loaded = store.load().unwrap();
    assert!(loaded.change_log_bytes <= 4_000);
    let mut held: Vec<String> = loaded
        .objects
        .to_records()
        .iter()
        .map(|o| o.state.key.name.to_string())
        .collect();
    held.sort();
    let mut expected = names(&index);
    expected.sort();
    assert_eq!(held, expected);
}
