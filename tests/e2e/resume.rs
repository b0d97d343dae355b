//! A revision means one change forever, as a subscriber sees it. `fleetscope serve`
//! runs as a process over simulated clusters that keep changing; a subscriber keeps the
//! state it rebuilds from its Watch events and resumes from the last revision it
//! received after every restart:
//! - killed with SIGKILL thirty times (compactions and snapshots included), every
//!   resume is accepted and the rebuilt state ends equal to the clusters', with
//!   revisions strictly increasing throughout; so too across five kills with objects
//!   held compressed (`--compress-objects`) over 2,400 configmaps (each restart makes them
//!   on two threads), after which a plain start serves every object's text as the
//!   compressed server did;
//! - restarted without continuing its store (`--no-persist`, or a store moved aside
//!   as damaged), the resume is OUT_OF_RANGE (never NOT_FOUND, never other events) and
//!   a re-list plus a Watch from the list's revision converges;
//! - repeated updates of one multi-megabyte object keep the server's memory within
//!   the event log's byte bound;
//! - a store sled panics on while opening it (its snapshot damaged under a valid
//!   checksum) is moved aside with one log line naming the damage, no panic message
//!   or backtrace, and the server serves, relisted.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::process::Server;
use common::subscriber::{Key, Subscriber, configmaps};
use common::{Churn, ChurnSpec, PATIENCE};
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{GetRequest, ListRequest};
use fleetscope_sim::{FleetSpec, SimFleet};
use serde_json::json;
use tonic::Code;

const KILLS: usize = 30;

/// About 250 changes a second per cluster over 100 configmaps, each with `bytes` of data
/// (large enough that the store snapshots and compacts often).
fn churn(bytes: usize) -> ChurnSpec {
    ChurnSpec {
        names: 100,
        bytes,
        delete_every: 4,
        pause: Duration::from_millis(4),
    }
}

struct Setup {
    fleet: SimFleet,
    dir: tempfile::TempDir,
}

impl Setup {
    async fn start() -> Self {
        Self::with(100).await
    }

    /// Two simulated clusters of `objects` each.
    async fn with(objects: usize) -> Self {
        let fleet = SimFleet::start(&FleetSpec::numbered(2, objects, 0.0))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        fleet
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        Self { fleet, dir }
    }

    fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> std::path::PathBuf {
        self.dir.path().join("serve.log")
    }

    fn serve(&self, args: &[&str]) -> Server {
        // First lists reach the index in parts of a few objects, so kills land between
        // parts as well as between lists.
        let mut all = vec!["--resources", "configmaps", "--list-part", "3"];
        all.extend_from_slice(args);
        Server::start(&self.kubeconfig(), &all, &self.log())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_resuming_after_each_of_thirty_sigkills_ends_equal_to_the_clusters() {
    let setup = Setup::start().await;
    let churn = Churn::start(&setup.fleet, &churn(3_000));
    let data = setup.data();
    let data = data.to_str().unwrap();
    // Compactions at every opportunity; a resume log long enough for any resume.
    let args = [
        "--data-dir",
        data,
        "--compact-share",
        "0",
        "--compact-min-mib",
        "0",
        "--event-log-disk-share",
        "100",
        // The subscriber here is a debug build reading a restart's whole backlog:
        // it is not to be ended for slowness.
        "--subscriber-buffer",
        "1000000",
    ];
    let started = std::time::Instant::now();
    let mut sub = Subscriber::default();
    // A fixed seed: the kill moments vary across rounds and repeat across runs.
    let mut seed: u64 = 0x5eed_1ea5_c0de_0001;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Each third round is killed as a snapshot is being written, each third as the
    // store is being compacted, the rest at a random moment.
    let writes = [
        "fleetscope_store_snapshot_in_progress",
        "fleetscope_store_compaction_in_progress",
    ];
    let mut mid_write = [0usize; 2];
    let mut token: Option<String> = None;
    // At least KILLS rounds, and on until kills have landed in both kinds of write
    // (a compaction is not always begun within the wait for one).
    let mut round = 0;
    // Interrupted writes, as the next start finds them: snapshot chunks to remove,
    // compactions to undo or finish.
    let interrupted = |log: &str| {
        [
            log.matches("snapshot whose writing was interrupted")
                .count(),
            log.matches("removing an unfinished compaction").count()
                + log.matches("finishing a compaction's switch").count(),
        ]
    };
    let landed = |mid_write: &[usize; 2]| {
        let found = interrupted(&std::fs::read_to_string(setup.log()).unwrap_or_default());
        [mid_write[0] + found[0], mid_write[1] + found[1]]
    };
    while round < KILLS || (landed(&mid_write).contains(&0) && round < 3 * KILLS) {
        let metrics = format!("127.0.0.1:{}", common::process::free_port());
        let mut with_metrics = args.to_vec();
        with_metrics.extend(["--metrics-listen", &metrics]);
        let mut server = setup.serve(&with_metrics);
        if let Some(token) = token.take() {
            assert_token_refused(&server.url(), &token, Code::OutOfRange).await;
        }
        // Changes flow again (a restart first replays what the clusters did meanwhile),
        // then the kill lands at a random moment.
        let mut stream = resumed_flowing(&mut sub, &mut server, &setup.log(), round).await;
        let until = tokio::time::Instant::now() + Duration::from_millis(next() % 300);
        sub.read_until(&mut stream, until).await;
        let during = match round % 3 {
            1 => Some(0),
            2 => Some(1),
            _ => None,
        };
        // Whether the server said, just before the kill, that the write was under way.
        let mut under_way = false;
        if let Some(w) = during {
            // A write of this run under way (a start compacts the store at its first
            // write), or one due within a batch or two; one not due within this (the
            // store grows by half between compactions) leaves the kill to land at
            // random, and later rounds try again.
            let give_up = tokio::time::Instant::now() + Duration::from_secs(4);
            while tokio::time::Instant::now() < give_up {
                under_way = common::sample(&metrics, writes[w]).await == Some(1);
                if under_way {
                    break;
                }
                // Reading on, so the server is never held up by its subscriber.
                let until = tokio::time::Instant::now() + Duration::from_millis(1);
                sub.read_until(&mut stream, until).await;
            }
        }
        if round == KILLS / 2 {
            token = Some(page_token(&server.url()).await);
        }
        server.kill();
        sub.drain(&mut stream).await;
        eprintln!(
            "round {round} ended at {:.1} s, {} events so far",
            started.elapsed().as_secs_f64(),
            sub.events
        );
        if let Some(w) = during.filter(|_| under_way) {
            mid_write[w] += 1;
        }
        round += 1;
    }
    churn.stop().await;
    let server = setup.serve(&args);
    let mut stream = sub.watch(&server.url()).await.expect("the last resume");
    sub.converge(&mut stream, &common::truth(&setup.fleet, "configmaps"))
        .await;
    let logged = std::fs::read_to_string(setup.log()).unwrap();
    let snapshots = logged.matches("snapshot written").count();
    let compactions = logged.matches("store compacted").count();
    let [unfinished, unfinished_compactions] = interrupted(&logged);
    eprintln!(
        "{} events over {round} kills; {snapshots} snapshots and {compactions} compactions written; killed while writing a snapshot {} times, while compacting {} times; found at the next start: {unfinished} unfinished snapshots, {unfinished_compactions} unfinished compactions",
        sub.events, mid_write[0], mid_write[1]
    );
    let landed = landed(&mid_write);
    assert!(
        landed[0] > 0,
        "a kill landed while a snapshot was being written"
    );
    assert!(
        landed[1] > 0,
        "a kill landed while the store was being compacted"
    );
    setup.fleet.shutdown().await;
}

/// With `--compress-objects --compress-after 0s` (every state compressed as soon as
/// the packer passes, the index rebuilt from the store and compressed at every start),
/// a subscriber resuming from its last revision after each of five SIGKILLs
/// under churn ends equal to the clusters; a plain start over the same store then
/// serves every object's text exactly as the compressed server did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_objects_held_compressed_a_subscriber_resuming_after_sigkills_ends_equal_to_the_clusters()
 {
    // Enough objects that each restart makes them on both of its threads, from a
    // snapshot of many chunks with the change log replayed across them.
    let setup = Setup::with(8_000).await;
    let churn = Churn::start(&setup.fleet, &churn(3_000));
    let data = setup.data();
    let data = data.to_str().unwrap();
    let compressed = [
        "--data-dir",
        data,
        "--compress-objects",
        "--compress-after",
        "0s",
        "--subscriber-buffer",
        "1000000",
    ];
    let mut sub = Subscriber::default();
    for round in 0..5u64 {
        let mut server = setup.serve(&compressed);
        // Changes flow again, then the kill lands a little later each round.
        let mut stream = resumed_flowing(&mut sub, &mut server, &setup.log(), round).await;
        let until = tokio::time::Instant::now() + Duration::from_millis(20 + 60 * round);
        sub.read_until(&mut stream, until).await;
        server.kill();
        sub.drain(&mut stream).await;
    }
    churn.stop().await;
    let metrics = format!("127.0.0.1:{}", common::process::free_port());
    let mut last = compressed.to_vec();
    last.extend(["--metrics-listen", &metrics]);
    let mut server = setup.serve(&last);
    let mut stream = sub.watch(&server.url()).await.expect("the last resume");
    let truth = common::truth(&setup.fleet, "configmaps");
    assert!(truth.len() > 2 * 1024, "{} configmaps", truth.len());
    sub.converge(&mut stream, &truth).await;
    // Every state has settled: what is listed next is read from compressed objects.
    let compressed_total = || async {
        common::sample(&metrics, "fleetscope_index_objects_compressed_total")
            .await
            .map(|n| n as usize)
    };
    common::eventually(
        format!("nearly every one of {} objects compressed", truth.len()),
        async || {
            let compressed = compressed_total().await;
            if compressed.unwrap_or(0) * 10 >= truth.len() * 9 {
                Ok(())
            } else {
                Err(compressed)
            }
        },
    )
    .await;
    let texts = |objects: Vec<fleetscope::proto::Object>| -> BTreeMap<Key, String> {
        objects
            .into_iter()
            .map(|o| ((o.cluster, o.namespace, o.name), o.json.to_string()))
            .collect()
    };
    let held = texts(list_objects(&server.url()).await.0);
    assert_eq!(held.len(), common::truth(&setup.fleet, "configmaps").len());
    drop(stream);
    server.kill();
    let plain = setup.serve(&["--data-dir", data, "--compress-objects=false"]);
    common::wait_serving(&plain.url()).await;
    assert_eq!(texts(list_objects(&plain.url()).await.0), held);
    setup.fleet.shutdown().await;
}

/// A first page's token (of a list that has more pages).
async fn page_token(url: &str) -> String {
    let mut client = FleetClient::connect(url.to_string()).await.unwrap();
    let page = client
        .list(ListRequest {
            query: Some(configmaps()),
            limit: 2,
            page_token: String::new(),
            keep_snapshot: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!page.next_page_token.is_empty());
    page.next_page_token
}

/// Resumes `sub` from its last revision on `server` (which must take the resume), and
/// reads until a change arrives: changes flow again.
async fn resumed_flowing(
    sub: &mut Subscriber,
    server: &mut Server,
    log: &Path,
    round: impl std::fmt::Display,
) -> tonic::Streaming<fleetscope::proto::WatchEvent> {
    let mut stream = match sub.watch(&server.url()).await {
        Ok(s) => s,
        Err(s) => panic!(
            "round {round}: the resume from revision {:?} was refused: {s}",
            sub.last
        ),
    };
    server.assert_running(log);
    let before = sub.events;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while sub.events == before && tokio::time::Instant::now() < deadline {
        let until = tokio::time::Instant::now() + Duration::from_millis(5);
        sub.read_until(&mut stream, until).await;
    }
    stream
}

/// A token from before a restart is refused (the snapshot it pages is not held),
/// once the server answers at all.
async fn assert_token_refused(url: &str, token: &str, code: Code) {
    let e = common::eventually("the server answers", async || {
        let mut client = FleetClient::connect(url.to_string())
            .await
            .map_err(|e| e.to_string())?;
        let e = client
            .list(ListRequest {
                query: None,
                limit: 2,
                page_token: token.to_string(),
                keep_snapshot: false,
            })
            .await
            .expect_err("a page token from before the restart pages nothing");
        if e.code() == Code::Unavailable {
            return Err(e.to_string());
        }
        Ok(e)
    })
    .await;
    assert_eq!(e.code(), code, "{e}");
    assert!(e.message().contains("again"), "{e}");
}

/// Lists every configmap with paging, retrying while the server starts; returns each
/// object's resourceVersion and the list's revision.
async fn list_all(url: &str) -> (BTreeMap<Key, String>, u64) {
    let (objects, revision) = list_objects(url).await;
    let versions = objects
        .into_iter()
        .map(|o| ((o.cluster, o.namespace, o.name), o.resource_version))
        .collect();
    (versions, revision)
}

/// Every configmap, listed with paging, retrying while the server starts, and the
/// list's revision.
async fn list_objects(url: &str) -> (Vec<fleetscope::proto::Object>, u64) {
    common::eventually("the server lists", async || {
        let mut client = FleetClient::connect(url.to_string()).await.unwrap();
        let (mut out, mut token, mut revision) = (Vec::new(), String::new(), 0);
        loop {
            let page = match client
                .list(ListRequest {
                    query: Some(configmaps()),
                    limit: 50,
                    page_token: token,
                    keep_snapshot: false,
                })
                .await
            {
                Ok(p) => p.into_inner(),
                // Starting: listed again from the first page.
                Err(s) if s.code() == Code::Unavailable => return Err(s),
                Err(s) => panic!("list refused: {s}"),
            };
            revision = page.revision.max(revision);
            out.extend(page.items);
            if page.next_page_token.is_empty() {
                return Ok((out, revision));
            }
            token = page.next_page_token;
        }
    })
    .await
}

/// A subscriber of a server that is restarted without its store (`damage` prepares
/// the restart: moves or spoils the store): its resume is OUT_OF_RANGE, and a list
/// plus a watch from the list's revision converges, with every new revision above
/// every old one.
/// `token_refused`: how a page token of the run before is refused (`OUT_OF_RANGE` when
/// the server kept its token key; `INVALID_ARGUMENT` when the key went with the process).
async fn a_restart_that_does_not_continue_the_store(
    args: &[&str],
    damage: impl Fn(&Path),
    token_refused: Code,
) {
    let setup = Setup::start().await;
    let churn = Churn::start(&setup.fleet, &churn(200));
    let mut sub = Subscriber::default();
    let mut server = setup.serve(args);
    let mut stream = sub.watch(&server.url()).await.unwrap();
    // Some changes after the initial state.
    while sub.last.is_none() || sub.events < 400 {
        let until = tokio::time::Instant::now() + Duration::from_millis(50);
        sub.read_until(&mut stream, until).await;
    }
    let token = page_token(&server.url()).await;
    server.kill();
    sub.drain(&mut stream).await;
    let old = sub.last.unwrap();
    damage(&setup.data());
    let server = setup.serve(args);
    assert_token_refused(&server.url(), &token, token_refused).await;
    // Retryable while starting; then the old revision is refused, never NOT_FOUND and
    // never answered with the new run's events.
    let refused = sub
        .watch(&server.url())
        .await
        .expect_err("an old revision cannot be resumed from a store not continued");
    assert_eq!(refused.code(), Code::OutOfRange, "{refused}");
    assert!(refused.message().contains("list again"), "{refused}");
    churn.stop().await;
    let (listed, revision) = list_all(&server.url()).await;
    assert!(
        revision > old,
        "the new run's revisions ({revision}) are above the old ({old})"
    );
    let mut sub = Subscriber {
        state: listed,
        last: Some(revision),
        ..Default::default()
    };
    let mut stream = sub.watch(&server.url()).await.unwrap();
    sub.converge(&mut stream, &common::truth(&setup.fleet, "configmaps"))
        .await;
    assert!(sub.last.unwrap() > old);
    setup.fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_in_memory_an_old_revision_is_out_of_range_and_a_relist_converges() {
    a_restart_that_does_not_continue_the_store(&["--no-persist"], |_| {}, Code::InvalidArgument)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_damaged_store_is_moved_aside_an_old_revision_is_out_of_range_and_a_relist_converges()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap().to_string();
    a_restart_that_does_not_continue_the_store(
        &["--data-dir", &data],
        |_| {
            // A record no build can read: the store is moved aside at the next start.
            use fleetscope_store::Store;
            let opened = fleetscope_store::SledStore::open(Path::new(&data)).unwrap();
            assert!(opened.moved_aside.is_none());
            opened
                .store
                .write(vec![(b"m:schema".to_vec(), Some(b"spoiled".to_vec()))])
                .unwrap();
        },
        Code::OutOfRange,
    )
    .await;
    let aside = std::fs::read_dir(dir.path().join("data"))
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("db.damaged-"));
    assert!(aside, "the damaged store was moved aside");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_updates_of_a_multi_megabyte_object_keep_memory_within_the_event_log_bound() {
    const BOUND_MIB: u64 = 32;
    const SIZE: usize = 2 << 20;
    const UPDATES: usize = 100;
    let setup = Setup::start().await;
    let server = setup.serve(&["--no-persist", "--event-log-mib", &BOUND_MIB.to_string()]);
    let store = &setup.fleet.servers()[0].cluster().store;
    let big = |i: usize| json!({"metadata": {"name": "big"}, "data": {"v": format!("{i:08}{}", "y".repeat(SIZE))}});
    store.create("configmaps", Some("team-0"), big(0)).unwrap();
    // A subscriber reads every change, as the one that met this did.
    let mut sub = Subscriber::default();
    let mut stream = sub.watch(&server.url()).await.unwrap();
    let reader = tokio::spawn(async move {
        while let Ok(Some(e)) = stream.message().await {
            sub.apply(&e);
        }
    });
    let client = FleetClient::connect(server.url()).await.unwrap();
    let held = |rv: String| {
        let mut client = client.clone();
        async move {
            common::eventually(format!("the server holds {rv}"), async || {
                let got = client
                    .get(GetRequest {
                        cluster: "sim-1".into(),
                        resource: "configmaps".into(),
                        namespace: "team-0".into(),
                        name: "big".into(),
                        ..Default::default()
                    })
                    .await;
                matches!(got, Ok(r) if r.get_ref().object.as_ref().unwrap().resource_version == rv)
            })
            .await
        }
    };
    let rv = store
        .get("configmaps", "team-0", "big")
        .unwrap()
        .rv
        .to_string();
    held(rv).await;
    let before = server.resident_bytes().unwrap();
    let mut last = String::new();
    for i in 1..=UPDATES {
        let o = store.update("configmaps", "team-0", "big", big(i)).unwrap();
        last = o.rv.to_string();
        // Paced by what the server has taken, so the figure is what it keeps.
        if i % 10 == 0 {
            held(last.clone()).await;
        }
    }
    held(last).await;
    let after = server.resident_bytes().unwrap();
    let grown = after.saturating_sub(before);
    // Unbounded, the log alone would hold every version twice (object and previous
    // state): about 400 MB.
    let allowed = (BOUND_MIB << 20) + (64 << 20);
    eprintln!(
        "resident {:.0} MB before, {:.0} MB after {UPDATES} updates of a {} MB object; grown {:.0} MB (allowed {:.0})",
        before as f64 / 1e6,
        after as f64 / 1e6,
        SIZE >> 20,
        grown as f64 / 1e6,
        allowed as f64 / 1e6
    );
    assert!(grown < allowed, "resident memory grew by {grown} bytes");
    reader.abort();
    setup.fleet.shutdown().await;
}

/// CRC-32 (IEEE), as sled checks its snapshot file with.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Damages sled's snapshot of where its pages are, keeping its checksum valid: the
/// first page's log sequence number is set far beyond the log, which sled 0.34 meets
/// with a failed assertion (a panic) while opening.
fn spoil_sled_snapshot(db: &Path) {
    let snap = std::fs::read_dir(db)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with("snap.") && !name.ends_with(".generating")
        })
        .expect("sled wrote a snapshot when it reopened a store with a log");
    let bytes = std::fs::read(&snap).unwrap();
    // The snapshot, then its length (8 bytes) and its CRC-32 (4 bytes).
    let mut content = bytes[..bytes.len() - 12].to_vec();
    // Its stable LSN (8 bytes), the active segment (sled's varint), the first page's
    // tag (1 byte), then that page's LSN (8 bytes).
    let first = content[8];
    let varint = match first {
        0..=240 => 1,
        241..=248 => 2,
        n => usize::from(n) - 246,
    };
    let at = 8 + varint + 1;
    content[at..at + 8].copy_from_slice(&(1i64 << 60).to_le_bytes());
    let mut out = content.clone();
    out.extend_from_slice(&(content.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32(&content).to_le_bytes());
    std::fs::write(&snap, out).unwrap();
}

/// Lists until the server holds every configmap of the clusters.
async fn list_in_full(setup: &Setup, url: &str) -> BTreeMap<Key, String> {
    let want = common::truth(&setup.fleet, "configmaps").len();
    common::eventually("listed in full", async || {
        let (listed, _) = list_all(url).await;
        (listed.len() == want).then_some(listed)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_sled_panics_on_is_moved_aside_with_one_log_line_and_no_backtrace() {
    let setup = Setup::start().await;
    let data = setup.data().to_str().unwrap().to_string();
    let args = ["--data-dir", data.as_str()];
    // Written, then reopened (sled writes its snapshot when it reopens a store whose
    // log has grown), each run ended by SIGKILL.
    for _ in 0..2 {
        let mut server = setup.serve(&args);
        common::wait_serving(&server.url()).await;
        list_in_full(&setup, &server.url()).await;
        server.kill();
    }
    spoil_sled_snapshot(&setup.data().join("db"));
    let before = std::fs::read_to_string(setup.log()).unwrap().len();
    let mut server = setup.serve(&args);
    // It serves, relisted from the clusters.
    common::wait_serving(&server.url()).await;
    list_in_full(&setup, &server.url()).await;
    server.kill();
    let log = std::fs::read_to_string(setup.log()).unwrap()[before..].to_string();
    let damage: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("sled failed while opening it"))
        .collect();
    assert_eq!(damage.len(), 1, "one line names the damage: {log}");
    assert!(damage[0].contains("moved aside"), "{}", damage[0]);
    for noise in ["panicked at", "stack backtrace", "RUST_BACKTRACE"] {
        assert!(!log.contains(noise), "{noise:?} in the log: {log}");
    }
    let aside = std::fs::read_dir(setup.data())
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("db.damaged-"));
    assert!(aside, "the damaged store was moved aside");
    setup.fleet.shutdown().await;
}
