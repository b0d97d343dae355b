//! The `fleetscope` binary as a person runs it: `demo` comes up and answers health
//! checks, `sim` writes a kubeconfig that reaches its clusters, and `serve` refuses
//! bad input with a message naming what is wrong, before binding a port.

#![allow(clippy::unwrap_used)]

mod common;

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
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let marker = marker.to_string();
    // Keeps reading to the end, so the child never writes into a closed pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line.contains(&marker) {
                let _ = tx.send(line);
            }
        }
    });
    rx.recv_timeout(PATIENCE)
        .expect("the expected line was printed")
}

#[tokio::test]
async fn demo_starts_clusters_and_a_healthy_server() {
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
    let line = wait_for_line(&mut child, "gRPC server on ");
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
}

#[tokio::test]
async fn client_commands_print_kubectl_like_output() {
    let h = common::Harness::start(2, 200).await;
    h.synced().await;
    let server = h.url();
    let run = |args: Vec<String>| async move {
        tokio::task::spawn_blocking(move || Command::new(BIN).args(&args).output().unwrap())
            .await
            .unwrap()
    };
    let out = run(vec![
        "get".into(),
        "pods".into(),
        "-l".into(),
        "app=web".into(),
        "--cluster".into(),
        "sim-2".into(),
        "--server".into(),
        server.clone(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["CLUSTER", "NAMESPACE", "NAME", "AGE"]
    );
    let rows: Vec<&str> = lines.collect();
    assert!(
        !rows.is_empty()
            && rows
                .iter()
                .all(|l| l.starts_with("sim-2") && l.contains("web-")),
        "{text}"
    );

    let out = run(vec![
        "get".into(),
        "configmaps".into(),
        "-o".into(),
        "json".into(),
        "--server".into(),
        server.clone(),
    ])
    .await;
    let text = String::from_utf8(out.stdout).unwrap();
    let total: usize = (0..2).map(|i| h.cluster(i).store.count("configmaps")).sum();
    assert_eq!(text.lines().count(), total, "every page");
    assert!(text.lines().all(|l| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["kind"] == "ConfigMap")
    }));

    let out = run(vec![
        "count".into(),
        "pods".into(),
        "--group-by".into(),
        "cluster".into(),
        "--server".into(),
        server.clone(),
    ])
    .await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("sim-1") && text.contains("TOTAL"), "{text}");

    let out = run(vec!["clusters".into(), "--server".into(), server.clone()]).await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines().filter(|l| l.contains("WATCHING")).count() >= 6,
        "{text}"
    );

    let out = run(vec![
        "get".into(),
        "podz".into(),
        "--server".into(),
        server.clone(),
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("did you mean pods"));

    let out = run(vec!["store".into(), "--server".into(), server.clone()]).await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.trim(), "in memory only: nothing is persisted");
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
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut stream = loop {
        let req = fleetscope::proto::WatchRequest {
            query: Some(fleetscope::proto::Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match client.watch(req).await {
            Ok(s) => break s.into_inner(),
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never collected: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    // It holds the cluster's objects before it is stopped.
    loop {
        let clusters = client
            .list_clusters(fleetscope::proto::ListClustersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .clusters;
        if clusters
            .iter()
            .all(|c| c.freshness() == fleetscope::proto::Freshness::Synced)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never synced");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
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
    assert_eq!(cluster.requests_of(fleetscope_sim::Verb::List), 0);
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
    let log: serde_json::Value = serde_json::from_str(&line).unwrap();
    (child, log["fields"]["addr"].as_str().unwrap().to_string())
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
    let out = Command::new(BIN).arg("version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("fleetscope {}", env!("CARGO_PKG_VERSION"))
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
