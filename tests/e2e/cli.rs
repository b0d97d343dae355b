//! The `fleetscope` binary as a person runs it: `demo` comes up and answers health
//! checks, `sim` writes a kubeconfig that reaches its clusters, and `serve` refuses
//! bad input with a message naming what is wrong, before binding a port.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::PATIENCE;
use tonic_health::pb::health_check_response::ServingStatus;

const BIN: &str = env!("CARGO_BIN_EXE_fleetscope");

/// Kills the child when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads the child's stdout until a line containing `marker`; returns that line.
fn wait_for_line(child: &mut Child, marker: &str) -> String {
    wait_for_lines(child, marker).pop().unwrap_or_default()
}

/// Reads the child's stdout until a line containing `marker`; returns every line up
/// to it.
fn wait_for_lines(child: &mut Child, marker: &str) -> Vec<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let marker = marker.to_string();
    // Keeps reading to the end, so the child never writes into a closed pipe.
    std::thread::spawn(move || {
        let mut read = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let found = line.contains(&marker);
            read.push(line);
            if found {
                let _ = tx.send(std::mem::take(&mut read));
            }
        }
    });
    rx.recv_timeout(PATIENCE)
        .expect("the expected line was printed")
}

#[tokio::test]
async fn demo_starts_clusters_and_a_healthy_server() {
    // Where the tour's commands run (one writes a kubeconfig there).
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args([
            "demo",
            "--listen",
            // A name, as people write it.
            "localhost:0",
            "--clusters",
            "2",
            "--objects",
            "100",
            "--churn",
            "5",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let banner = wait_for_lines(&mut child, "Ctrl-C stops it");
    let line = banner
        .iter()
        .find(|l| l.contains("gRPC server on "))
        .cloned()
        .unwrap();
    let _running = Running(child);
    let addr = line
        .split("gRPC server on ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches(['(', ' ']);
    // NOT_SERVING until every simulated cluster has been discovered, then SERVING.
    let before = common::wait_serving(&format!("http://{addr}")).await;
    assert!(
        before
            .iter()
            .all(|s| *s == ServingStatus::NotServing as i32),
        "{before:?}"
    );
    // The CLI commands it prints run as printed, in a shell, after its export (not
    // `watch`, which goes on).
    let cli: Vec<&str> = banner
        .iter()
        .skip_while(|l| !l.starts_with("Try"))
        .skip(2)
        .map(|l| l.trim())
        .take_while(|l| !l.is_empty())
        .collect();
    let export = cli
        .iter()
        .find(|l| l.starts_with("export FLEETSCOPE_SERVER="))
        .unwrap();
    // Every fleetscope command of the tour (grpcurl is not installed everywhere).
    let runs: Vec<&&str> = cli
        .iter()
        .filter(|l| !l.starts_with("export") && !l.starts_with("grpcurl") && !l.contains(" watch "))
        .collect();
    assert_eq!(runs.len(), 7, "{cli:#?}");
    let kubectl = common::kubectl_installed();
    let runs = runs
        .into_iter()
        .filter(|l| kubectl || !l.starts_with("kubectl"));
    for command in runs {
        let out = tokio::task::spawn_blocking({
            let script = format!("{export}\n{command}");
            let dir = dir.path().to_path_buf();
            move || {
                Command::new("sh")
                    .args(["-c", &script])
                    .env("PATH", "/usr/bin:/bin")
                    .current_dir(dir)
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.stdout.is_empty() || command.contains(" > "),
            "{command} printed nothing"
        );
    }
}

#[tokio::test]
async fn sim_writes_a_kubeconfig_that_reaches_every_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.kubeconfig");
    let mut child = Command::new(BIN)
        .args([
            "sim",
            "--names",
            "alpha,beta",
            "--objects",
            "100",
            "--kubeconfig-out",
        ])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_line(&mut child, "simulated clusters are running");
    let _running = Running(child);
    let sources = fleetscope::sources::resolve(std::slice::from_ref(&path), &[]).unwrap();
    assert_eq!(
        sources.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["alpha", "beta"]
    );
    for name in ["alpha", "beta"] {
        let client = common::kube_client(&path, name).await;
        let version = client.apiserver_version().await.unwrap();
        assert_eq!(version.major, "1");
    }
}

fn serve_fails_with(args: &[&str], expected: &str) {
    let out = Command::new(BIN)
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("KUBECONFIG")
        .env("FLEETSCOPE_NO_PERSIST", "true")
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve {args:?} should fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(expected),
        "serve {args:?}: expected {expected:?} in {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn serve_refuses_bad_kubeconfigs_and_patterns_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.kubeconfig");
    serve_fails_with(
        &["--kubeconfig", missing.to_str().unwrap()],
        "missing.kubeconfig",
    );
    let garbage = dir.path().join("garbage.kubeconfig");
    std::fs::write(&garbage, "{ not: [ valid").unwrap();
    serve_fails_with(
        &["--kubeconfig", garbage.to_str().unwrap()],
        "garbage.kubeconfig",
    );
    let good = dir.path().join("good.kubeconfig");
    let ctx = fleetscope_sim::Context {
        name: "sim-1".into(),
        server: "https://127.0.0.1:1".into(),
        token: "t".into(),
        ca_pem: None,
    };
    fleetscope_sim::write_kubeconfig(&good, &[ctx]).unwrap();
    serve_fails_with(
        &[
            "--kubeconfig",
            good.to_str().unwrap(),
            "--context",
            "prod-*",
        ],
        "matches no context",
    );
    serve_fails_with(
        &[
            "--kubeconfig",
            good.to_str().unwrap(),
            "--context",
            "prod-[",
        ],
        "not a valid glob",
    );
    let out = Command::new(BIN)
        .args(["serve", "--listen", "not-an-address"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--listen"));
    // Impossible resource type names, refused at start.
    for (name, says) in [("%%%", "'%' is not allowed"), ("a/b/c/d", "4 parts")] {
        serve_fails_with(
            &["--kubeconfig", good.to_str().unwrap(), "--resources", name],
            says,
        );
    }
    // A taken port: said once, with the operating system's reason once.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = Command::new(BIN)
        .args(["serve", "--no-persist", "--kubeconfig"])
        .arg(&good)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot listen on 127.0.0.1:"), "{stderr}");
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
    // An unreadable kubeconfig (missing, a directory): its path once, as given, and
    // the operating system's reason once.
    let dir = tempfile::tempdir().unwrap();
    for path in [dir.path().join("missing"), dir.path().to_path_buf()] {
        let out = Command::new(BIN)
            .args(["serve", "--no-persist", "--kubeconfig"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = format!(
            "fleetscope: kubeconfig {}: cannot be read: ",
            path.display()
        );
        assert!(stderr.starts_with(&expected), "{stderr}");
        assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
        assert!(!stderr.contains('"'), "{stderr}");
    }
}

/// Runs the binary with `args` and `--server`, off the async workers.
async fn run_cli(server: &str, args: &[&str]) -> std::process::Output {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(["--server".into(), server.to_string()]);
    tokio::task::spawn_blocking(move || Command::new(BIN).args(&all).output().unwrap())
        .await
        .unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[tokio::test]
async fn get_prints_as_kubectl_does_with_the_cluster_first() {
    let h = common::Harness::start_with(
        fleetscope_sim::FleetSpec::numbered(2, 200, 0.0),
        common::test_config(&["pods", "configmaps", "deployments.apps", "nodes"]),
        common::service_config(),
    )
    .await;
    h.synced().await;
    let server = h.url();
    let server = server.trim_start_matches("http://");

    // Per-type columns; a short name resolved by discovery.
    let text = stdout(
        &run_cli(
            server,
            &["get", "po", "-l", "app=web", "--cluster", "sim-2"],
        )
        .await,
    );
    let mut lines = text.lines();
    assert_eq!(
        words(lines.next().unwrap()),
        [
            "CLUSTER",
            "NAMESPACE",
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE"
        ]
    );
    let rows: Vec<Vec<&str>> = lines.map(words).collect();
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r[0], "sim-2");
        assert!(r[2].starts_with("web-"), "{r:?}");
        assert!(
            r[3].contains('/') && r[4].chars().all(|c| c.is_ascii_alphabetic() || c == ':'),
            "{r:?}"
        );
    }
    let text = stdout(
        &run_cli(
            server,
            &[
                "get",
                "deploy",
                "-n",
                "team-0",
                "-o",
                "wide",
                "--no-headers",
            ],
        )
        .await,
    );
    let first = words(text.lines().next().unwrap());
    // CLUSTER NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR (one namespace: no NAMESPACE)
    assert_eq!(first.len(), 9, "{text}");
    assert!(
        first[2].contains('/') && first[8].starts_with("app="),
        "{first:?}"
    );
    // describe where events are not collected: said so, the object still described.
    let text = stdout(
        &run_cli(
            server,
            &["describe", "deploy", "-n", "team-0", "--cluster", "sim-1"],
        )
        .await,
    );
    assert!(text.contains("Kind:        Deployment\n"), "{text}");
    assert!(text.contains("Events:      <not collected"), "{text}");
    let text = stdout(
        &run_cli(
            server,
            &[
                "get",
                "nodes",
                "--cluster",
                "sim-1",
                "-L",
                "topology.kubernetes.io/zone",
                "--show-labels",
            ],
        )
        .await,
    );
    let header = words(text.lines().next().unwrap());
    assert_eq!(
        header,
        [
            "CLUSTER", "NAME", "STATUS", "ROLES", "AGE", "VERSION", "LABELS", "ZONE"
        ]
    );
    assert!(
        text.lines()
            .nth(1)
            .unwrap()
            .contains("kubernetes.io/hostname="),
        "{text}"
    );

    // -o json / yaml: a List whose items carry their cluster.
    let text = stdout(&run_cli(server, &["get", "configmaps", "-o", "json"]).await);
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["kind"], "List");
    let total: usize = (0..2).map(|i| h.cluster(i).store.count("configmaps")).sum();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), total, "every page");
    assert!(items.iter().all(|i| {
        i["kind"] == "ConfigMap"
            && i["metadata"]["annotations"]["fleetscope.io/cluster"]
                .as_str()
                .is_some_and(|c| c.starts_with("sim-"))
    }));
    let text = stdout(
        &run_cli(
            server,
            &[
                "get",
                "cm",
                "-n",
                "team-1",
                "--cluster",
                "sim-1",
                "-o",
                "yaml",
            ],
        )
        .await,
    );
    assert!(text.starts_with("apiVersion: v1\nkind: List\n"), "{text}");
    assert!(text.contains("fleetscope.io/cluster: sim-1"), "{text}");

    // -o name, jsonpath, custom-columns, --sort-by, --limit.
    let text = stdout(
        &run_cli(
            server,
            &[
                "get",
                "deployments.apps",
                "--cluster",
                "sim-1",
                "-o",
                "name",
            ],
        )
        .await,
    );
    assert!(
        text.lines()
            .all(|l| l.starts_with("sim-1/deployment.apps/")),
        "{text}"
    );
    let text = stdout(
        &run_cli(
            server,
            &[
                "get",
                "nodes",
                "--cluster",
                "sim-1",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
            ],
        )
        .await,
    );
    let names: Vec<&str> = text.lines().collect();
    assert!(
        !names.is_empty() && names.iter().all(|n| n.starts_with("node-")),
        "{text}"
    );
    let text = stdout(
        &run_cli(
            server,
            &[
                "get",
                "pods",
                "--cluster",
                "sim-1",
                "-o",
                "custom-columns=POD:.metadata.name,NODE:.spec.nodeName",
                "--sort-by",
                ".spec.nodeName",
                "--limit",
                "7",
            ],
        )
        .await,
    );
    let mut lines = text.lines();
    assert_eq!(words(lines.next().unwrap()), ["POD", "NODE"]);
    let nodes: Vec<String> = lines.map(|l| words(l)[1].to_string()).collect();
    assert_eq!(nodes.len(), 7);
    let mut sorted = nodes.clone();
    sorted.sort();
    assert_eq!(nodes, sorted, "sorted by node");

    // A name across the fleet: one, several (said on stderr), none.
    let first = |i: usize, id: &str| {
        let snapshot = h
            .cluster(i)
            .store
            .snapshot(id, fleetscope_sim::store::ReadAt::Latest)
            .unwrap();
        let o = snapshot.objects.values().next().unwrap();
        (o.namespace.clone(), o.name.clone())
    };
    let some_pod = first(0, "pods");
    let text = stdout(&run_cli(server, &["get", "pod", &some_pod.1, "-o", "json"]).await);
    let pod: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(pod["kind"], "Pod", "one object alone, not a List");
    assert_eq!(pod["metadata"]["name"], some_pod.1.as_str());
    let shared = first(0, "configmaps");
    assert_eq!(
        shared,
        first(1, "configmaps"),
        "the clusters' workloads are alike"
    );
    let out = run_cli(server, &["get", "cm", &shared.1]).await;
    let text = stdout(&out);
    assert_eq!(
        text.lines().count(),
        3,
        "a header and one row per cluster: {text}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ambiguous"),
        "{out:?}"
    );
    let out = run_cli(server, &["get", "pod", "no-such-pod"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("Error from server (NotFound): pod \"no-such-pod\" not found"),
        "{out:?}"
    );
    let out = run_cli(server, &["get", "pods", "-n", "nowhere"]).await;
    assert!(out.status.success() && out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No resources found in namespace nowhere."),
        "{out:?}"
    );
    // A cluster the fleet lacks is an error, as kubectl's unknown context.
    let out = run_cli(server, &["get", "pods", "--cluster", "no-such-cluster"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no cluster named \"no-such-cluster\""),
        "{out:?}"
    );

    // Mistakes: a misspelt type, a bad output format, a bad --sort-by.
    let out = run_cli(server, &["get", "podz"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("doesn't have a resource type \"podz\"") && err.contains("did you mean pods"),
        "{err}"
    );
    let out = run_cli(server, &["get", "pods", "-o", "yml"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected table, wide, json"));
    let out = run_cli(server, &["get", "pods", "--sort-by", "{.a["]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sort-by"));

    // kubectl's --context is answered with what to type here.
    let out = run_cli(server, &["get", "pods", "--context", "sim-1"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cluster sim-1"), "{err}");

    // count, clusters and store, as tables and as JSON.
    let text = stdout(&run_cli(server, &["count", "pods", "--group-by", "cluster"]).await);
    assert!(text.contains("sim-1") && text.contains("TOTAL"), "{text}");
    let text = stdout(
        &run_cli(
            server,
            &["count", "po", "--group-by", "cluster", "-o", "json"],
        )
        .await,
    );
    let counted: serde_json::Value = serde_json::from_str(&text).unwrap();
    let pods: u64 = (0..2)
        .map(|i| h.cluster(i).store.count("pods") as u64)
        .sum();
    assert_eq!(counted["total"], pods.to_string());
    // Read as jq 1.6 and JavaScript read JSON (every number a double), the revision
    // is still exact: 64-bit integers are strings, as proto3's JSON mapping has them.
    let revision = h
        .client()
        .await
        .count(fleetscope::proto::CountRequest {
            query: Some(fleetscope::proto::Query {
                resource: "pods".into(),
                ..Default::default()
            }),
            group_by: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .revision;
    let read = Command::new("python3")
        .args([
            "-c",
            "import json,sys; d=json.load(sys.stdin, parse_int=float); print(d['revision'])",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut p| {
            use std::io::Write as _;
            p.stdin.take().unwrap().write_all(text.as_bytes())?;
            p.wait_with_output()
        })
        .expect("python3 reads JSON as a float-based parser would");
    let read: u64 = String::from_utf8_lossy(&read.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(
        revision > 1 << 53,
        "revisions are past a double's precision: {revision}"
    );
    assert_eq!(
        read, revision,
        "the revision as a float-based reader reads it"
    );
    assert_eq!(counted["groups"][0]["key"]["cluster"], "sim-1");
    let text = stdout(&run_cli(server, &["clusters"]).await);
    let mut lines = text.lines();
    assert_eq!(
        words(lines.next().unwrap()),
        [
            "CLUSTER",
            "FRESHNESS",
            "STREAMS",
            "OBJECTS",
            "LAG",
            "VERSION",
            "LABELS",
            "ERROR"
        ]
    );
    assert_eq!(lines.filter(|l| l.contains("SYNCED")).count(), 2, "{text}");
    let text = stdout(&run_cli(server, &["clusters", "-o", "wide"]).await);
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("WATCHING") && l.contains("watch-list"))
            .count(),
        8,
        "every stream says how it synced: {text}"
    );
    assert!(text.lines().next().unwrap().contains("SYNCED-BY"), "{text}");
    let text = stdout(&run_cli(server, &["clusters", "-o", "json"]).await);
    let clusters: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(clusters["clusters"].as_array().unwrap().len(), 2);
    assert_eq!(
        clusters["clusters"][0]["streams"][0]["syncMethod"],
        "watch-list"
    );
    let text = stdout(&run_cli(server, &["store"]).await);
    assert_eq!(text.trim(), "in memory only: nothing is persisted");
    let text = stdout(&run_cli(server, &["store", "-o", "json"]).await);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["persisted"],
        false
    );
    h.shutdown().await;
}

#[tokio::test]
async fn serve_shuts_down_cleanly_on_sigterm_with_a_watch_open() {
    let fleet = fleetscope_sim::SimFleet::start(&fleetscope_sim::FleetSpec::numbered(1, 100, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    fleet.write_kubeconfig(&kc).unwrap();
    let data = dir.path().join("data");
    let (mut child, addr) = spawn_serve(&kc, &data);
    // A second fleetscope on the same data directory is refused, with its own exit status.
    let second = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kc)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(3), "{second:?}");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("in use by another running fleetscope"),
        "{stderr}"
    );
    let mut client =
        fleetscope::proto::fleet_client::FleetClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    // Wait until the type is collected, then hold a Watch open.
    let mut stream = common::eventually("configmaps collected", async || {
        let req = fleetscope::proto::WatchRequest {
            query: Some(fleetscope::proto::Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        client.watch(req).await
    })
    .await
    .into_inner();
    // It holds the cluster's objects before it is stopped.
    common::wait_for_clusters(&mut client, "synced", |r| {
        r.clusters
            .iter()
            .all(|c| c.freshness() == fleetscope::proto::Freshness::Synced)
    })
    .await;
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // The stream ends, and the process exits successfully.
    let end = tokio::time::timeout(PATIENCE, async {
        use tokio_stream::StreamExt;
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    assert!(end.is_ok(), "the watch stream ended");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");

    // What it held was written on the way out: a restart serves it at once and lists nothing.
    let cluster = fleet.servers()[0].cluster();
    let held = cluster.store.count("configmaps") as u64;
    cluster.reset_counters();
    let (child, addr) = spawn_serve(&kc, &data);
    let _running = Running(child);
    // Ready as soon as the store is loaded.
    common::wait_serving(&format!("http://{addr}")).await;
    let mut client =
        fleetscope::proto::fleet_client::FleetClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    let count = client
        .count(fleetscope::proto::CountRequest {
            query: Some(fleetscope::proto::Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            group_by: vec![],
        })
        .await
        .unwrap()
        .into_inner()
        .total;
    assert_eq!(count, held);
    // Neither a LIST nor a streaming list (a WATCH that sends the state first).
    assert_eq!(cluster.requests_of(fleetscope_sim::Verb::List), 0);
    assert_eq!(cluster.lists_of(fleetscope_sim::ListKind::Streaming), 0);
    // The store reports itself.
    let out = Command::new(BIN)
        .args(["store", "--server", &format!("http://{addr}")])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let size: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("size on disk:"))
        .and_then(|v| v.trim().strip_suffix(" MB")?.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(size > 0.0, "{text}");
    assert!(text.contains("last error:"), "{text}");
    // Its version is the client's (one binary), with the commit it was built from.
    let out = Command::new(BIN)
        .args(["version", "--server", &format!("http://{addr}")])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
    };
    let client = line("Client Version: ").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(line("Server Version: "), Some(client.clone()), "{text}");
    assert!(client.starts_with(env!("CARGO_PKG_VERSION")), "{text}");
    if let Some(commit) = option_env!("FLEETSCOPE_COMMIT") {
        assert!(client.ends_with(&format!("(commit {commit})")), "{text}");
    }
    fleet.shutdown().await;
}

/// `serve` over one kubeconfig with a data directory; returns it and its address once it serves.
fn spawn_serve(kc: &std::path::Path, data: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args([
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--resources",
            "configmaps",
            "--kubeconfig",
        ])
        .arg(kc)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The log line names the address; keep draining stderr after it.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("serving fleetscope.v1.Fleet") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(PATIENCE)
        .expect("the server logs its address");
    // One flat JSON object: the message and the fields beside the level.
    let log: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(
        log["message"]
            .as_str()
            .is_some_and(|m| m.contains("serving fleetscope.v1.Fleet"))
            && log["level"] == "INFO"
            && log.get("fields").is_none(),
        "{line}"
    );
    (child, log["addr"].as_str().unwrap().to_string())
}

#[test]
fn serve_refuses_a_data_directory_that_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let kc = dir.path().join("kc");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kc)
        .arg("--data-dir")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a directory"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn version_and_shell_completions_print() {
    let out = Command::new(BIN)
        .args(["version", "--client"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let client = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        client.starts_with(&format!("Client Version: {}", env!("CARGO_PKG_VERSION"))),
        "{client}"
    );
    // With no server to ask: the client's, then why not the server's (as kubectl).
    let out = Command::new(BIN)
        .args(["version", "--server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), client);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the fleetscope server"),
        "{out:?}"
    );
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(BIN)
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["fleetscope", "clusters", "field-selector"] {
            assert!(script.contains(word), "{shell}: no {word:?}");
        }
    }
    let out = Command::new(BIN)
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcsh"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_completes_resource_types_and_cluster_names_from_the_server() {
    let h = common::Harness::start_with(
        fleetscope_sim::FleetSpec::numbered(2, 5, 0.0),
        common::test_config(&["configmaps", "deployments.apps"]),
        common::service_config(),
    )
    .await;
    h.synced().await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("completion.bash");
    let out = Command::new(BIN)
        .args(["completion", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(&script, &out.stdout).unwrap();
    let bin_dir = std::path::Path::new(BIN)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let path = format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default());
    // What bash offers for the line `words`, the cursor on its last word.
    let complete = |words: &[&str]| {
        let words = words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" ");
        let program = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; _fleetscope_from_server fleetscope; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = Command::new("bash")
            .args(["-c", &program])
            .env("PATH", &path)
            .env("FLEETSCOPE_SERVER", h.url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
    };
    let (url, _) = (h.url(), ());
    let resources = ["configmaps", "deployments", "deployments.apps"];
    tokio::task::block_in_place(|| {
        assert_eq!(complete(&["fleetscope", "get", ""]), resources);
        assert_eq!(
            complete(&["fleetscope", "count", "dep"]),
            ["deployments", "deployments.apps"]
        );
        assert_eq!(
            complete(&["fleetscope", "get", "pods", "--cluster", ""]),
            ["sim-1", "sim-2"]
        );
        // The server named on the line is the one asked.
        assert_eq!(
            complete(&["fleetscope", "watch", "--server", &url, "c"]),
            ["configmaps"]
        );
        // Past the type, and for flags, clap's completion as before.
        assert!(
            complete(&["fleetscope", "get", "configmaps", "--fie"])
                .contains(&"--field-selector".to_string())
        );
        assert!(complete(&["fleetscope", "cl"]).contains(&"clusters".to_string()));
    });
    // No server: nothing offered, quickly, and no error at the prompt.
    let out = Command::new(BIN)
        .args(["__complete", "clusters", "--server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "{out:?}"
    );
}

/// `fleetscope serve` on a given port over a data directory, logging to `log`.
/// `fleetscope watch configmaps -o json` against `addr` with `more` flags, its stderr
/// in `errors`: the process, and its stdout's lines as they come.
fn watch_json(
    addr: &str,
    errors: &std::path::Path,
    more: &[&str],
) -> (Running, std::sync::mpsc::Receiver<String>) {
    let mut watch = Running(
        Command::new(BIN)
            .args(["watch", "configmaps", "-o", "json", "--server", addr])
            .args(more)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(errors).unwrap())
            .spawn()
            .unwrap(),
    );
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let out = watch.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            let _ = tx.send(line);
        }
    });
    (watch, lines)
}

/// `serve` on `port` over configmaps, its store in `data` (in memory when `None`).
fn serve_on(
    port: u16,
    kubeconfig: &std::path::Path,
    data: Option<&std::path::Path>,
    log: &std::path::Path,
) -> Running {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Running(
        Command::new(BIN)
            .args([
                "serve",
                "--resources",
                "configmaps",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(match data {
                Some(d) => vec!["--data-dir".into(), d.as_os_str().to_owned()],
                None => vec!["--no-persist".into()],
            })
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_resumes_by_itself_across_a_server_crash() {
    watch_json_resumes_across_a_crash(0).await;
}

/// The same, the server killed right after filling a fresh store with more JSON than a
/// snapshot waits for (1 MiB): the store then holds that first sync as its log alone,
/// and the restart resumes from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_resumes_across_a_crash_right_after_a_large_first_sync() {
    watch_json_resumes_across_a_crash(400).await;
}

/// A `watch -o json` subscriber across a SIGKILL of the server and its restart on the
/// same port and data directory, over one cluster given `preload` configmaps of 4 KiB
/// of data before the server's first start.
async fn watch_json_resumes_across_a_crash(preload: usize) {
    let fleet = fleetscope_sim::SimFleet::start(&fleetscope_sim::FleetSpec::numbered(1, 20, 0.0))
        .await
        .unwrap();
    let big = "x".repeat(4096);
    for i in 0..preload {
        fleet.servers()[0]
            .cluster()
            .store
            .create(
                "configmaps",
                Some("team-0"),
                serde_json::json!({"metadata": {"name": format!("preload-{i}")}, "data": {"k": big}}),
            )
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let (data, log) = (dir.path().join("data"), dir.path().join("serve.log"));
    let port = common::process::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut server = serve_on(port, &kubeconfig, Some(&data), &log);
    common::wait_serving(&format!("http://{addr}")).await;

    let errors = dir.path().join("watch.err");
    let (watch, lines) = watch_json(&addr, &errors, &["--initial"]);
    let store = &fleet.servers()[0].cluster().store;
    // What the server and the CLI said, for a failure's message.
    let said = || {
        let tail = |path: &std::path::Path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(60)..].join("\n")
        };
        format!(
            "\n-- the server's log (both runs), last lines:\n{}\n-- the CLI's stderr:\n{}",
            tail(&log),
            tail(&errors)
        )
    };
    // Each line is one JSON event; waits for the ADDED of `name`.
    let added = |name: &str| {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                .unwrap_or_else(|_| panic!("no ADDED of {name}{}", said()));
            let e: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
            let revision = e["revision"].as_str().and_then(|r| r.parse::<u64>().ok());
            assert!(e["type"].is_string() && revision.is_some(), "{line}");
            if e["type"] == "ADDED" && e["object"]["metadata"]["name"] == name {
                assert_eq!(e["cluster"], "sim-1", "{line}");
                return revision.unwrap_or_default();
            }
        }
    };
    // Created before or after the Watch opens, it is ADDED (with --initial, the
    // current objects come first).
    store
        .create(
            "configmaps",
            Some("team-0"),
            serde_json::json!({"metadata": {"name": "before-crash"}}),
        )
        .unwrap();
    let before = added("before-crash");

    // SIGKILL, and the server comes back on the same port and data directory.
    drop(server);
    server = serve_on(port, &kubeconfig, Some(&data), &log);
    common::wait_serving(&format!("http://{addr}")).await;
    store
        .create(
            "configmaps",
            Some("team-0"),
            serde_json::json!({"metadata": {"name": "after-crash"}}),
        )
        .unwrap();
    let after = added("after-crash");
    assert!(after > before);
    let said = std::fs::read_to_string(&errors).unwrap();
    assert!(
        said.contains("resuming from revision") && said.contains("resumed from revision"),
        "{said}"
    );
    drop(watch);
    drop(server);
    fleet.shutdown().await;
}

/// Runs the CLI until its output satisfies `done` (at most PATIENCE), returning it.
async fn cli_until(server: &str, args: &[&str], done: impl Fn(&str) -> bool) -> String {
    common::eventually(
        format!("fleetscope {} shows what is expected", args.join(" ")),
        async || {
            let out = run_cli(server, args).await;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if out.status.success() && done(&text) {
                Ok(text)
            } else {
                Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
            }
        },
    )
    .await
}

#[tokio::test]
async fn get_takes_several_types_and_type_slash_name_and_describe_shows_events() {
    let h = common::Harness::start_with(
        fleetscope_sim::FleetSpec::numbered(1, 100, 0.0),
        common::test_config(&["pods", "services", "deployments.apps", "events"]),
        common::service_config(),
    )
    .await;
    h.synced().await;
    let server = h.url();
    let server = server.trim_start_matches("http://");

    // A Deployment made in the cluster: its controllers make a ReplicaSet, two pods
    // and the events about them, as a real cluster's do.
    let cluster = h.fleet.servers()[0].cluster();
    cluster
        .store
        .create(
            "namespaces",
            None,
            serde_json::json!({"metadata": {"name": "shop"}}),
        )
        .unwrap();
    cluster
        .store
        .create(
            "deployments.apps",
            Some("shop"),
            serde_json::json!({
                "metadata": {"name": "cart", "labels": {"app": "cart"}},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "cart"}},
                    "template": {"metadata": {"labels": {"app": "cart"}},
                        "spec": {"containers": [{"name": "cart", "image": "cart:1"}]}}},
            }),
        )
        .unwrap();
    cluster
        .store
        .create(
            "services",
            Some("shop"),
            serde_json::json!({"metadata": {"name": "cart"}, "spec": {"selector": {"app": "cart"}, "ports": [{"port": 80}]}}),
        )
        .unwrap();

    // Several types: a table each, in the order named, names prefixed with their type.
    let text = cli_until(server, &["get", "pods,svc", "-n", "shop"], |t| {
        t.matches("pod/cart-").count() == 2 && t.contains("service/cart")
    })
    .await;
    let tables: Vec<&str> = text.split("\n\n").collect();
    assert_eq!(tables.len(), 2, "{text}");
    assert!(
        tables[0].starts_with("CLUSTER") && tables[0].contains("STATUS"),
        "{text}"
    );
    assert!(
        tables[1].starts_with("CLUSTER") && tables[1].contains("CLUSTER-IP"),
        "{text}"
    );
    assert!(
        !tables[0].contains("service/") && !tables[1].contains("pod/"),
        "{text}"
    );

    // TYPE/NAME, several at once; one missing is named, the others still print.
    let pod = text
        .split_whitespace()
        .find(|w| w.starts_with("pod/cart-"))
        .unwrap()
        .to_string();
    let text = stdout(
        &run_cli(
            server,
            &["get", &pod, "svc/cart", "-n", "shop", "-o", "name"],
        )
        .await,
    );
    assert_eq!(text, format!("sim-1/{pod}\nsim-1/service/cart\n"));
    let out = run_cli(server, &["get", "deploy/cart", "deploy/nope", "-n", "shop"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("deployment.apps/cart"));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(r#"Error from server (NotFound): deploy "nope" not found"#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // JSON: one List of every object named.
    let list: serde_json::Value = serde_json::from_slice(
        &run_cli(
            server,
            &["get", "deploy/cart", "svc/cart", "-n", "shop", "-o", "json"],
        )
        .await
        .stdout,
    )
    .unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    // What kubectl refuses, refused alike.
    for (args, expected) in [
        (
            &["get", "pods", "pod/x"][..],
            "no need to specify a resource type",
        ),
        (&["get", "pods,svc", "-w"][..], "watch is only supported"),
        (&["get", "pods,", "-n", "shop"][..], "empty resource type"),
    ] {
        let out = run_cli(server, args).await;
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }

    // describe: the object with its cluster, fields, and the events from its cluster.
    let text = cli_until(server, &["describe", "deploy/cart", "-n", "shop"], |t| {
        t.contains("ScalingReplicaSet") && t.contains("Available Replicas:  2")
    })
    .await;
    assert!(
        text.starts_with("Cluster:     sim-1\nName:        cart\nNamespace:   shop\n"),
        "{text}"
    );
    assert!(text.contains("Kind:        Deployment\n"), "{text}");
    assert!(
        text.contains("Normal")
            && text.contains("deployment-controller")
            && text.contains("Scaled up replica set cart-"),
        "{text}"
    );
    let text = cli_until(server, &["describe", "pods", "-n", "shop"], |t| {
        t.matches("Cluster:     sim-1").count() == 2
    })
    .await;
    assert!(text.contains("Node Name:  node-"), "{text}");
    let out = run_cli(server, &["describe", "svc", "nope", "-n", "shop"]).await;
    assert!(!out.status.success());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_named_that_the_fleet_lacks_is_an_error_in_the_cli_and_a_warning_over_grpc() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 20).await;
    let log = dir.path().join("serve.log");
    let server = common::process::Server::start(
        &kubeconfig,
        &["--no-persist", "--resources", "configmaps"],
        &log,
    );
    let url = server.url();
    common::wait_serving(&url).await;
    let mut c = fleetscope::proto::fleet_client::FleetClient::connect(url.clone())
        .await
        .unwrap();
    common::wait_for_clusters(&mut c, "synced", |r| {
        r.clusters.len() == 2
            && r.clusters
                .iter()
                .all(|c| c.freshness == fleetscope::proto::Freshness::Synced as i32)
    })
    .await;
    let address = url.trim_start_matches("http://");
    // kubectl's habit for a context that does not exist: an error naming it.
    for command in [
        &["get", "configmaps", "--cluster", "sim-9"][..],
        &[
            "get",
            "configmaps",
            "--cluster",
            "sim-1",
            "--cluster",
            "sim-9",
        ],
        &["count", "configmaps", "--cluster", "sim-9"],
        &["describe", "configmaps", "--cluster", "sim-9"],
        &["watch", "configmaps", "--cluster", "sim-9"],
    ] {
        let out = run_cli(address, command).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command:?}: {stderr}");
        assert!(
            stderr.contains("no cluster named \"sim-9\" in the fleet (clusters: sim-1, sim-2)"),
            "{command:?}: {stderr}"
        );
        assert!(!stderr.contains("No resources found"), "{stderr}");
    }
    // A glob that matches nothing is a warning; the answer is empty.
    let out = run_cli(address, &["get", "configmaps", "--cluster", "prod-*"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: no cluster of the fleet matches \"prod-*\""),
        "{stderr}"
    );
    // Over gRPC, the answer says so.
    let query = |clusters: &[&str]| fleetscope::proto::Query {
        resource: "configmaps".into(),
        clusters: clusters.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    };
    let listed = c
        .list(fleetscope::proto::ListRequest {
            query: Some(query(&["sim-1", "sim-9", "x-*"])),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!listed.items.is_empty());
    assert_eq!(
        listed.warnings,
        [
            "no cluster of the fleet is named \"sim-9\"",
            "no cluster of the fleet matches \"x-*\""
        ]
    );
    let counted = c
        .count(fleetscope::proto::CountRequest {
            query: Some(query(&["sim-9"])),
            group_by: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((counted.total, counted.warnings.len()), (0, 1));
    let whole = c
        .count(fleetscope::proto::CountRequest {
            query: Some(query(&["sim-*"])),
            group_by: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(whole.warnings.is_empty(), "{:?}", whole.warnings);
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_lists_again_by_itself_when_its_position_is_gone() {
    let fleet = fleetscope_sim::SimFleet::start(&fleetscope_sim::FleetSpec::numbered(1, 20, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let log = dir.path().join("serve.log");
    let port = common::process::free_port();
    let addr = format!("127.0.0.1:{port}");
    // In memory, as the demo: a restart begins with revisions no earlier run issued.
    let mut server = serve_on(port, &kubeconfig, None, &log);
    common::wait_serving(&format!("http://{addr}")).await;
    let errors = dir.path().join("watch.err");
    let (mut watch, lines) = watch_json(&addr, &errors, &[]);
    // Every (type, name) shown until `name` is shown as `kind`.
    let until = |kind: &str, name: &str| {
        let deadline = std::time::Instant::now() + PATIENCE;
        let mut shown = Vec::new();
        loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                .unwrap_or_else(|_| {
                    panic!(
                        "no {kind} of {name}; shown {shown:?}; the CLI said: {}",
                        std::fs::read_to_string(&errors).unwrap_or_default()
                    )
                });
            let e: serde_json::Value = serde_json::from_str(&line).unwrap();
            let event = (
                e["type"].as_str().unwrap_or_default().to_string(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            shown.push(event.clone());
            if event == (kind.to_string(), name.to_string()) {
                return shown;
            }
        }
    };
    let store = &fleet.servers()[0].cluster().store;
    let create = |name: &str| {
        store
            .create(
                "configmaps",
                Some("team-0"),
                serde_json::json!({"metadata": {"name": name}}),
            )
            .unwrap();
    };
    // The Watch is open once the first change reaches it.
    let mut first = 0;
    let mut shown_before: Vec<String> = common::eventually("the Watch opens", async || {
        first += 1;
        create(&format!("first-{first}"));
        let line = lines
            .recv_timeout(std::time::Duration::from_millis(500))
            .ok()?;
        let e: serde_json::Value = serde_json::from_str(&line).unwrap();
        Some(vec![
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        ])
    })
    .await;
    create("kept");
    create("doomed");
    shown_before.extend(until("ADDED", "doomed").into_iter().map(|(_, n)| n));
    // SIGKILL; while the server is down, one goes, one comes, one changes.
    drop(server);
    store.delete("configmaps", "team-0", "doomed").unwrap();
    create("while-down");
    store
        .update(
            "configmaps",
            "team-0",
            "kept",
            serde_json::json!({"metadata": {"name": "kept", "namespace": "team-0"}, "data": {"k": "v"}}),
        )
        .unwrap();
    server = serve_on(port, &kubeconfig, None, &log);
    common::wait_serving(&format!("http://{addr}")).await;
    // Once the CLI has listed again, a change made then follows what the list told.
    common::eventually("the CLI says it listed again", async || {
        std::fs::read_to_string(&errors)
            .unwrap_or_default()
            .contains("listed again")
    })
    .await;
    create("after-restart");
    let shown = until("ADDED", "after-restart");
    for event in [
        ("DELETED", "doomed"),
        ("ADDED", "while-down"),
        ("MODIFIED", "kept"),
    ] {
        let event = (event.0.to_string(), event.1.to_string());
        assert!(
            shown.contains(&event),
            "{event:?} not in {shown:?}; the CLI said: {}",
            std::fs::read_to_string(&errors).unwrap_or_default()
        );
    }
    // Nothing shown already is shown as new again (what did not change, not at all).
    for name in &shown_before {
        assert!(
            !shown.iter().any(|(k, n)| k == "ADDED" && n == name),
            "{name} shown again: {shown:?}"
        );
    }
    assert_eq!(
        shown
            .iter()
            .filter(|(_, n)| shown_before.contains(n))
            .count(),
        2,
        "of what was shown, only kept and doomed are shown again: {shown:?}"
    );
    let said = std::fs::read_to_string(&errors).unwrap();
    assert!(said.contains("listing again"), "{said}");
    // And it goes on.
    create("later");
    until("ADDED", "later");
    watch.0.kill().unwrap();
    drop(server);
    fleet.shutdown().await;
}
