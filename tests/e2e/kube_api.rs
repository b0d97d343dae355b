//! The Kubernetes API over the fleet (`serve --kube-api-listen`), read by the real
//! kubectl as a process: discovery, `get` across the fleet (each object annotated
//! with its cluster; printed from the server's Table, the CLUSTER column first) and
//! in one cluster, selectors, paging with `--chunk-size` (pages of 10 over more), one
//! object, a watch that sees a change made in a cluster, a write refused saying where
//! to write, and an unknown cluster named; kubectl reads the kubeconfig `fleetscope
//! kubeconfig` writes. A kube-rs reflector on a cluster's path holds the cluster's
//! truth across changes and a SIGKILL of `serve`, resuming its watch from the
//! resourceVersion it held without listing again.
//!
//! kubectl is not a build dependency: without it on the PATH the test says so and
//! checks nothing else.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::BufRead as _;
use std::process::{Command, Stdio};

use crate::common;
use common::process::{Server, free_port};

/// The kubeconfig `fleetscope kubeconfig` writes for the server at `grpc` whose
/// Kubernetes API is at `api`, in `path`.
fn kubeconfig(path: &std::path::Path, grpc: &str, api: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetscope"))
        .args(["kubeconfig", "--server", grpc, "--kube-api", api])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::write(path, out.stdout).unwrap();
}

/// `serve` in memory over `clusters` simulated clusters of `objects` each, with
/// `args` and the Kubernetes API on `api`, serving.
struct Serving {
    fleet: fleetscope_sim::SimFleet,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    log: std::path::PathBuf,
    server: Server,
    api: String,
}

async fn serving(clusters: usize, objects: usize, args: &[&str]) -> Serving {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(clusters, objects).await;
    let log = dir.path().join("serve.log");
    let api = format!("127.0.0.1:{}", free_port());
    let mut all = vec!["--no-persist", "--kube-api-listen", api.as_str()];
    all.extend_from_slice(args);
    let server = Server::start(&kubeconfig, &all, &log);
    common::wait_serving(&server.url()).await;
    Serving {
        fleet,
        dir,
        kubeconfig,
        log,
        server,
        api,
    }
}

struct Kubectl(std::path::PathBuf);

impl Kubectl {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `cluster/namespace/name` of every configmap `args` get.
    fn configmaps(&self, args: &[&str]) -> BTreeSet<String> {
        let path = "jsonpath={range .items[*]}{.metadata.annotations.fleetscope\\.io/cluster}/{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}";
        let mut all = vec!["get", "configmaps", "-o", path];
        all.extend_from_slice(args);
        self.ok(&all).lines().map(str::to_string).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_the_fleet_and_each_cluster_through_the_kubernetes_api() {
    if !common::kubectl_installed() {
        eprintln!("kubectl is not on the PATH: nothing checked");
        return;
    }
    let Serving {
        fleet,
        dir,
        kubeconfig: kubeconfig_path,
        log,
        server,
        api,
    } = serving(2, 120, &["--resources", "configmaps,namespaces"]).await;
    let k = Kubectl(dir.path().join("fleetscope.kubeconfig"));
    kubeconfig(&k.0, &server.url(), &format!("http://{api}"));
    let truth: BTreeSet<String> = common::truth(&fleet, "configmaps")
        .into_keys()
        .map(|(c, ns, name)| format!("{c}/{ns}/{name}"))
        .collect();
    assert!(truth.len() > 20, "{}", truth.len());

    // Discovery: the collected types, with the verbs served.
    let resources = k.ok(&["api-resources", "-o", "wide"]);
    let line = resources
        .lines()
        .find(|l| l.starts_with("configmaps "))
        .unwrap_or_else(|| panic!("{resources}"));
    assert!(
        line.contains("get,list,watch") && line.contains(" cm "),
        "{line}"
    );

    // The whole fleet, each object annotated with its cluster; the same in pages.
    let what = common::with_log("kubectl sees every configmap of the fleet", &log);
    common::eventually_blocking(what, || {
        let got = k.configmaps(&["-A"]);
        if got == truth {
            Ok(())
        } else {
            Err(format!("{} of {}", got.len(), truth.len()))
        }
    });
    assert_eq!(k.configmaps(&["-A", "--chunk-size=10"]), truth);
    // A field selector, and one cluster (its objects as the cluster has them).
    let team_1: BTreeSet<String> = truth
        .iter()
        .filter(|k| k.split('/').nth(1) == Some("team-1"))
        .cloned()
        .collect();
    assert!(!team_1.is_empty());
    assert_eq!(
        k.configmaps(&["-A", "--field-selector", "metadata.namespace=team-1"]),
        team_1
    );
    let sim_1: BTreeSet<String> = truth
        .iter()
        .filter(|k| k.starts_with("sim-1/"))
        .map(|k| k.trim_start_matches("sim-1").to_string())
        .collect();
    assert_eq!(k.configmaps(&["--context", "sim-1", "-A"]), sim_1);
    // One object, in its cluster.
    let one = truth.iter().find(|k| k.starts_with("sim-2/")).unwrap();
    let [_, ns, name] = <[&str; 3]>::try_from(one.split('/').collect::<Vec<_>>()).unwrap();
    let got = k.ok(&[
        "--context",
        "sim-2",
        "get",
        "configmap",
        name,
        "-n",
        ns,
        "-o",
        "jsonpath={.metadata.name}",
    ]);
    assert_eq!(got, name);

    // kubectl's own printing: the server's Table, with the CLI's columns and the
    // cluster first in the fleet's view.
    let printed = k.ok(&["get", "configmaps", "-A"]);
    let header: Vec<&str> = printed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAMESPACE", "CLUSTER", "NAME", "DATA", "AGE"],
        "{printed}"
    );
    assert_eq!(printed.lines().count(), truth.len() + 1, "{printed}");
    let printed = k.ok(&["--context", "sim-1", "get", "configmaps", "-n", ns]);
    let header: Vec<&str> = printed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "DATA", "AGE"], "{printed}");

    // A watch of the fleet sees a configmap made in a cluster.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&k.0)
        .args(["get", "configmaps", "-A", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(watch.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    // Its list first: then the change.
    rx.recv_timeout(common::PATIENCE).unwrap();
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "made-while-watched"}, "data": {"a": "b"}}),
    )
    .unwrap();
    let api_of_sim_1: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(
        common::kube_client(&kubeconfig_path, "sim-1").await,
        "team-0",
    );
    api_of_sim_1.create(&Default::default(), &cm).await.unwrap();
    let deadline = std::time::Instant::now() + common::PATIENCE;
    let mut seen = false;
    while !seen && std::time::Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(std::time::Duration::from_secs(1)) {
            seen = l == "configmap/made-while-watched";
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "the watch did not show the new configmap");

    // A write is refused, saying where to write; an unknown cluster is named.
    let out = k.run(&["--context", "sim-1", "create", "configmap", "refused"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("read-only view") && said.contains("cluster sim-1"),
        "{said}"
    );
    let out = k.run(&["get", "--raw", "/clusters/nope/api/v1/configmaps"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("nope") && said.contains("not found"),
        "{said}"
    );
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_s_watches_through_both_front_ends_count_against_one_limit() {
    if !common::kubectl_installed() {
        eprintln!("kubectl is not on the PATH: nothing checked");
        return;
    }
    let Serving {
        fleet,
        dir,
        log,
        server,
        api,
        ..
    } = serving(
        1,
        20,
        &[
            "--resources",
            "configmaps",
            "--grpc-max-watches-per-caller",
            "1",
        ],
    )
    .await;
    let k = Kubectl(dir.path().join("fleetscope.kubeconfig"));
    kubeconfig(&k.0, &server.url(), &format!("http://{api}"));
    // One watch through the Kubernetes API, its list shown: the caller's one place.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&k.0)
        .args(["get", "configmaps", "-A", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    tokio::task::spawn_blocking(move || lines.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // A gRPC Watch of the same caller finds no place.
    let mut client = fleetscope::proto::fleet_client::FleetClient::connect(server.url())
        .await
        .unwrap();
    let refused = client
        .watch(fleetscope::proto::WatchRequest {
            query: Some(fleetscope::proto::Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    // Once the watch ends, its place is free again.
    let _ = watch.kill();
    let _ = watch.wait();
    let what = common::with_log("the gRPC Watch finds the freed place", &log);
    common::eventually(what, async || {
        let r = client
            .watch(fleetscope::proto::WatchRequest {
                query: Some(fleetscope::proto::Query {
                    resource: "configmaps".into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await;
        r.map(|_| ()).map_err(|e| e.code())
    })
    .await;
    drop(server);
    fleet.shutdown().await;
}

/// Configmaps `made`…: created in `cluster`'s team-0 through its own API server.
async fn make_configmaps(kubeconfig: &std::path::Path, cluster: &str, names: &[String]) {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(common::kube_client(kubeconfig, cluster).await, "team-0");
    for name in names {
        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "data": {"a": "b"}}),
        )
        .unwrap();
        api.create(&Default::default(), &cm).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_rs_reflector_of_a_cluster_holds_its_truth_across_changes_and_a_sigkill_without_listing_again()
 {
    use futures::StreamExt as _;
    use kube::runtime::{reflector, watcher};
    let (fleet, dir, kubeconfig_path) = common::fleet_with_kubeconfig(2, 60).await;
    let log = dir.path().join("serve.log");
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    let args = [
        "--data-dir",
        data,
        "--resources",
        "configmaps",
        "--kube-api-listen",
        api.as_str(),
    ];
    let port = free_port();
    let mut server = Server::start_at(port, &kubeconfig_path, &args, &log, &[]);
    common::wait_serving(&server.url()).await;
    // kube-rs, as any Rust backend would use it, on a cluster's path. (On the fleet's
    // path a reflector's store keys objects by namespace and name alone, so objects
    // of the same name in two clusters are one to it.)
    let config = kube::Config::new(format!("http://{api}/clusters/sim-1").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::all(client);
    let (reader, writer) = reflector::store();
    // Every list the watcher makes begins with `Init`.
    let lists = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lists.clone();
    let events = reflector(writer, watcher(configmaps, watcher::Config::default()));
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(e) = events.next().await {
            if matches!(e, Ok(watcher::Event::Init)) {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    let held = || -> BTreeSet<String> {
        reader
            .state()
            .iter()
            .map(|cm| {
                format!(
                    "sim-1/{}/{}",
                    cm.metadata.namespace.clone().unwrap_or_default(),
                    cm.metadata.name.clone().unwrap_or_default()
                )
            })
            .collect()
    };
    let truth = || -> BTreeSet<String> {
        common::truth(&fleet, "configmaps")
            .into_keys()
            .filter(|(c, _, _)| c == "sim-1")
            .map(|(c, ns, name)| format!("{c}/{ns}/{name}"))
            .collect()
    };
    let reaches_truth = async |what: &str| {
        let what = common::with_log(what, &log);
        common::eventually(what, async || {
            let (held, truth) = (held(), truth());
            if held == truth {
                Ok(())
            } else {
                Err(format!(
                    "{} held, {} true; missing {:?}; extra {:?}",
                    held.len(),
                    truth.len(),
                    truth.difference(&held).take(3).collect::<Vec<_>>(),
                    held.difference(&truth).take(3).collect::<Vec<_>>()
                ))
            }
        })
        .await;
    };
    reaches_truth("the reflector holds every configmap of the cluster").await;
    // Changes reach it (another cluster's do not).
    let names = |prefix: &str| (0..5).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    make_configmaps(&kubeconfig_path, "sim-1", &names("before")).await;
    make_configmaps(&kubeconfig_path, "sim-2", &names("before")).await;
    reaches_truth("the reflector follows the cluster's changes").await;
    assert_eq!(lists.load(std::sync::atomic::Ordering::Relaxed), 1);
    // fleetscope killed; changes made while it is down; started again on its data.
    server.kill();
    make_configmaps(&kubeconfig_path, "sim-1", &names("while-down")).await;
    let mut server = Server::start_at(port, &kubeconfig_path, &args, &log, &[]);
    common::wait_serving(&server.url()).await;
    reaches_truth("the reflector resumes and catches up after the restart").await;
    // It resumed its watch from the resourceVersion it held: no list again.
    assert_eq!(
        lists.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the reflector listed again after the restart"
    );
    server.assert_running(&log);
    task.abort();
    drop(server);
    fleet.shutdown().await;
}
