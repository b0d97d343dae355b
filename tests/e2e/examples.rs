//! The Rust examples as a user runs them (`cargo run --example …`), against `serve`
//! as a process: `examples/mirror.rs` over gRPC and `examples/kube_mirror.rs` (a
//! kube-rs reflector) over the Kubernetes API each list the fleet, follow changes
//! across a SIGKILL of `serve` without listing again, and end holding the clusters'
//! truth.

#![allow(clippy::unwrap_used)]

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use crate::common;

/// The example `name`, built as `cargo test --workspace` builds it (built here when
/// only this test binary was).
fn example(name: &str) -> PathBuf {
    let profile_dir = std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let built = Command::new(env!("CARGO"))
            .args(["build", "--offline", "--example", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(built.success(), "cargo build --example {name}");
    }
    path
}

/// An example running, its stdout's lines sent as they come.
struct Running {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(name: &str, args: &[&str]) -> Self {
        let mut child = Command::new(example(name))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line (from now) starting with `prefix`.
    async fn line(&mut self, prefix: &str) -> String {
        let deadline = std::time::Instant::now() + common::PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let got = {
                let lines = &self.lines;
                tokio::task::block_in_place(|| lines.recv_timeout(left))
            };
            match got {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(_) => panic!("no line {prefix:?}; printed: {:?}", self.seen),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number in `line` after `word`.
fn number_after(line: &str, word: &str) -> usize {
    line.split(word)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.trim_end_matches(';').parse().ok())
        .unwrap_or_else(|| panic!("{word:?} in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_examples_follow_the_fleet_across_a_sigkill_and_hold_its_truth() {
    let (s, mut server) = crate::kube_api::Persisted::start(2, 20, &[]).await;
    let (fleet, log, api, kubeconfig) = (&s.fleet, &s.log, &s.api, &s.kubeconfig);
    let truth = || common::truth(fleet, "configmaps").len();
    let before = truth();
    // Each follows 30 changes: 10 before the kill, 10 while fleetscope is down, 10 after.
    let mut grpc = Running::start("mirror", &["--server", &server.url(), "--changes", "30"]);
    let kube_api = format!("http://{api}");
    let mut kube = Running::start("kube_mirror", &["--server", &kube_api, "--changes", "30"]);
    let listed = grpc.line("listed:").await;
    assert_eq!(number_after(&listed, "listed:"), before, "{listed}");
    let listed = kube.line("listed:").await;
    assert_eq!(number_after(&listed, "listed:"), before, "{listed}");
    assert!(listed.ends_with("of 2 clusters"), "{listed}");
    let batch = |i: usize| {
        (0..10)
            .map(|j| format!("example-{i}-{j}"))
            .collect::<Vec<_>>()
    };
    make(kubeconfig, "sim-1", &batch(0)).await;
    server.kill();
    make(kubeconfig, "sim-2", &batch(1)).await;
    s.restart(&mut server).await;
    make(kubeconfig, "sim-1", &batch(2)).await;
    for (what, running) in [("mirror", &mut grpc), ("kube_mirror", &mut kube)] {
        let done = running.line("followed").await;
        assert_eq!(
            (
                number_after(&done, "followed"),
                number_after(&done, "holding")
            ),
            (30, truth()),
            "{what}: {done}"
        );
        // One list in all: each resumed from where it stood.
        assert_eq!(
            running
                .seen
                .iter()
                .filter(|l| l.starts_with("listed:"))
                .count(),
            1,
            "{what} listed again: {:?}",
            running.seen
        );
    }
    server.assert_running(log);
    drop(server);
    s.fleet.shutdown().await;
}

/// Configmaps `names`, created in `cluster`'s team-0 through its own API server.
async fn make(kubeconfig: &std::path::Path, cluster: &str, names: &[String]) {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(common::kube_client(kubeconfig, cluster).await, "team-0");
    for name in names {
        let cm = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        api.create(&Default::default(), &cm).await.unwrap();
    }
}
