//! The Kubernetes API over the fleet (`serve --kube-api-listen`), read by the real
//! kubectl as a process: discovery, `get` across the fleet (each object annotated
//! with its cluster; printed from the server's Table, the CLUSTER column first) and
//! in one cluster, selectors, paging with `--chunk-size` (pages of 10 over more), one
//! object, a watch that sees a change made in a cluster, a write refused saying where
//! to write, and an unknown cluster named; kubectl reads the kubeconfig `fleetscope
//! kubeconfig` writes; its other outputs, `get --raw`, `describe`, `api-resources`
//! and a refused `apply`. kube-rs reflectors on a cluster's path and on the fleet's
//! (names carrying their cluster) hold their truth across changes and a SIGKILL of
//! `serve`, resuming their watches from the resourceVersions they held without
//! listing again; a metadata-only reflector holds the fleet's metadata.
//!
//! kubectl is not a build dependency: without it on the PATH the test says so and
//! checks nothing else.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::BufRead as _;
use std::process::{Command, Stdio};

use crate::common;
use common::Kubectl;
use common::process::{Server, free_port};

/// The kubeconfig `fleetscope kubeconfig` writes for the server at `grpc` whose
/// Kubernetes API is at `api`, in `path`.
pub(crate) fn kubeconfig(path: &std::path::Path, grpc: &str, api: &str) {
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

/// `serve` over `clusters` simulated clusters of `objects` each, its store in a data
/// directory and the Kubernetes API on a port of its own, started again on both (and
/// the same data) by [`Persisted::restart`] after a [`Server::kill`].
pub(crate) struct Persisted {
    pub(crate) fleet: fleetscope_sim::SimFleet,
    _dir: tempfile::TempDir,
    pub(crate) kubeconfig: std::path::PathBuf,
    pub(crate) log: std::path::PathBuf,
    pub(crate) api: String,
    args: Vec<String>,
}

impl Persisted {
    /// Started with `more` arguments, serving.
    pub(crate) async fn start(clusters: usize, objects: usize, more: &[&str]) -> (Self, Server) {
        let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(clusters, objects).await;
        let log = dir.path().join("serve.log");
        let data = dir.path().join("data").display().to_string();
        let api = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<String> = ["--data-dir", &data, "--resources", "configmaps"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        args.extend(more.iter().map(|a| a.to_string()));
        args.extend(["--kube-api-listen".to_string(), api.clone()]);
        let server = Self::serve(free_port(), &kubeconfig, &args, &log).await;
        let s = Self {
            fleet,
            _dir: dir,
            kubeconfig,
            log,
            api,
            args,
        };
        (s, server)
    }

    async fn serve(
        port: u16,
        kubeconfig: &std::path::Path,
        args: &[String],
        log: &std::path::Path,
    ) -> Server {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Server::start_at(port, kubeconfig, &args, log, &[]);
        common::wait_serving(&server.url()).await;
        server
    }

    /// `server` started again (after a kill) on the same ports and data, serving.
    pub(crate) async fn restart(&self, server: &mut Server) {
        *server = Self::serve(server.port, &self.kubeconfig, &self.args, &self.log).await;
    }
}

/// `cluster/namespace/name` of every configmap kubectl gets with `args`.
fn configmaps(k: &Kubectl, args: &[&str]) -> BTreeSet<String> {
    let path = "jsonpath={range .items[*]}{.metadata.annotations.fleetscope\\.io/cluster}/{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}";
    let mut all = vec!["get", "configmaps", "-o", path];
    all.extend_from_slice(args);
    k.ok(&all).lines().map(str::to_string).collect()
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
    let k = Kubectl::at(dir.path().join("fleetscope.kubeconfig"));
    kubeconfig(&k.kubeconfig, &server.url(), &format!("http://{api}"));
    // In the fleet's view each name carries its cluster (names repeat across clusters).
    let truth: BTreeSet<String> = common::truth(&fleet, "configmaps")
        .into_keys()
        .map(|(c, ns, name)| format!("{c}/{ns}/{c}:{name}"))
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
        let got = configmaps(&k, &["-A"]);
        if got == truth {
            Ok(())
        } else {
            Err(format!("{} of {}", got.len(), truth.len()))
        }
    });
    assert_eq!(configmaps(&k, &["-A", "--chunk-size=10"]), truth);
    // A label selector (the workload's configmaps carry their app's label).
    let web: BTreeSet<String> = truth
        .iter()
        .filter(|k| k.rsplit(':').next().unwrap().starts_with("web-"))
        .cloned()
        .collect();
    assert!(!web.is_empty());
    assert_eq!(configmaps(&k, &["-A", "-l", "app=web"]), web);
    // A field selector, and one cluster (its objects as the cluster has them).
    let team_1: BTreeSet<String> = truth
        .iter()
        .filter(|k| k.split('/').nth(1) == Some("team-1"))
        .cloned()
        .collect();
    assert!(!team_1.is_empty());
    assert_eq!(
        configmaps(&k, &["-A", "--field-selector", "metadata.namespace=team-1"]),
        team_1
    );
    let sim_1: BTreeSet<String> = truth
        .iter()
        .filter(|k| k.starts_with("sim-1/"))
        .map(|k| k.trim_start_matches("sim-1").replace("sim-1:", ""))
        .collect();
    assert_eq!(configmaps(&k, &["--context", "sim-1", "-A"]), sim_1);
    // One object, in its cluster.
    let one = truth.iter().find(|k| k.starts_with("sim-2/")).unwrap();
    let [_, ns, qualified] = <[&str; 3]>::try_from(one.split('/').collect::<Vec<_>>()).unwrap();
    let name = qualified.trim_start_matches("sim-2:");
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
    // The same object in the fleet's view, by the name the fleet's list gave it; a
    // bare name there says how names read.
    let got = k.ok(&["get", "configmap", qualified, "-n", ns, "-o", "name"]);
    assert_eq!(got.trim(), format!("configmap/{qualified}"));
    let out = k.run(&["get", "configmap", name, "-n", ns]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("CLUSTER:NAME"),
        "{said}"
    );
    assert_eq!(
        configmaps(
            &k,
            &[
                "-n",
                ns,
                "--field-selector",
                &format!("metadata.name={qualified}")
            ]
        ),
        BTreeSet::from([one.clone()])
    );

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
        .arg(&k.kubeconfig)
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
            seen = l == "configmap/sim-1:made-while-watched";
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
    let Serving {
        fleet,
        log,
        server,
        api,
        dir: _dir,
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
    // One watch through the Kubernetes API: once its answer begins, it holds the
    // caller's one place (a watch is admitted before it is answered).
    let watch = {
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(&api).await.unwrap();
        let request = "GET /clusters/*/api/v1/configmaps?watch=true HTTP/1.1\r\nHost: x\r\n\r\n";
        s.write_all(request.as_bytes()).await.unwrap();
        let mut s = tokio::io::BufReader::new(s);
        let mut status = String::new();
        s.read_line(&mut status).await.unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        s
    };
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
    // Once the watch ends (its connection closed), its place is free again.
    drop(watch);
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

/// A kube-rs reflector of configmaps at `url`, as any Rust backend would run it,
/// counting the lists its watcher makes (each begins with `Init`).
pub(crate) struct Reflector {
    reader: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::ConfigMap>,
    lists: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl Reflector {
    pub(crate) fn start(url: &str) -> Self {
        use futures::StreamExt as _;
        use kube::runtime::{reflector, watcher};
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::all(client);
        let (reader, writer) = reflector::store();
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
        Self {
            reader,
            lists,
            task,
        }
    }

    /// `cluster/namespace/name` of what the store holds: the cluster from the
    /// fleet's annotation (none on a cluster's path).
    pub(crate) fn held(&self) -> BTreeSet<String> {
        self.reader
            .state()
            .iter()
            .map(|cm| {
                let m = &cm.metadata;
                let cluster = m
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("fleetscope.io/cluster"))
                    .cloned()
                    .unwrap_or_default();
                format!(
                    "{cluster}/{}/{}",
                    m.namespace.clone().unwrap_or_default(),
                    m.name.clone().unwrap_or_default()
                )
            })
            .collect()
    }

    /// How what the store holds differs from `truth`, if it does.
    pub(crate) fn differs(&self, truth: &BTreeSet<String>) -> Result<(), String> {
        let held = self.held();
        if held == *truth {
            return Ok(());
        }
        Err(format!(
            "{} held, {} true; missing {:?}; extra {:?}",
            held.len(),
            truth.len(),
            truth.difference(&held).take(3).collect::<Vec<_>>(),
            held.difference(truth).take(3).collect::<Vec<_>>()
        ))
    }

    /// Waits until the store holds `truth()` (its log in the failure: `log`).
    pub(crate) async fn reaches(
        &self,
        what: &str,
        log: &std::path::Path,
        truth: impl Fn() -> BTreeSet<String>,
    ) {
        let what = common::with_log(what, log);
        common::eventually(what, async || self.differs(&truth())).await;
    }

    pub(crate) fn lists(&self) -> usize {
        self.lists.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_reflectors_of_a_cluster_and_of_the_fleet_hold_their_truth_across_changes_and_a_sigkill_without_listing_again()
 {
    let (s, mut server) = Persisted::start(2, 60, &[]).await;
    let (fleet, log, api, kubeconfig_path) = (&s.fleet, &s.log, &s.api, &s.kubeconfig);
    // On a cluster's path, names as the cluster has them; on the fleet's, each object
    // of each cluster once, though the two clusters' objects share their names.
    let one = Reflector::start(&format!("http://{api}/clusters/sim-1"));
    let all = Reflector::start(&format!("http://{api}/clusters/*"));
    let truth = |of_fleet: bool| -> BTreeSet<String> {
        common::truth(fleet, "configmaps")
            .into_keys()
            .filter(|(c, _, _)| of_fleet || c == "sim-1")
            .map(|(c, ns, name)| match of_fleet {
                true => format!("{c}/{ns}/{c}:{name}"),
                false => format!("/{ns}/{name}"),
            })
            .collect()
    };
    let shared = |a: &BTreeSet<String>| {
        a.iter()
            .filter_map(|k| k.rsplit_once(':').map(|(_, n)| n.to_string()))
            .collect::<BTreeSet<_>>()
            .len()
    };
    let reaches_truth = async |what: &str| {
        let what = common::with_log(what, log);
        common::eventually(what, async || {
            one.differs(&truth(false))?;
            all.differs(&truth(true))
        })
        .await;
    };
    reaches_truth("the reflectors hold every configmap of the cluster and of the fleet").await;
    // Changes reach them (another cluster's only the fleet's), names shared or not.
    let names = |prefix: &str| (0..5).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    make_configmaps(kubeconfig_path, "sim-1", &names("before")).await;
    make_configmaps(kubeconfig_path, "sim-2", &names("before")).await;
    reaches_truth("the reflectors follow the clusters' changes").await;
    let held = all.held();
    assert!(
        shared(&held) < held.len(),
        "the two clusters share no name: the test proves nothing"
    );
    assert_eq!((one.lists(), all.lists()), (1, 1));
    // fleetscope killed; changes made while it is down; started again on its data.
    server.kill();
    make_configmaps(kubeconfig_path, "sim-1", &names("while-down")).await;
    s.restart(&mut server).await;
    reaches_truth("the reflectors resume and catch up after the restart").await;
    // They resumed their watches from the resourceVersions they held: no list again.
    assert_eq!(
        (one.lists(), all.lists()),
        (1, 1),
        "a reflector listed again after the restart"
    );
    server.assert_running(log);
    one.task.abort();
    all.task.abort();
    drop(server);
    s.fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_s_outputs_raw_reads_describe_api_resources_and_a_refused_apply() {
    if !common::kubectl_installed() {
        eprintln!("kubectl is not on the PATH: nothing checked");
        return;
    }
    let Serving {
        fleet,
        dir,
        server,
        api,
        ..
    } = serving(
        2,
        30,
        &[
            "--resources",
            "configmaps,namespaces,events,pods,deployments.apps,replicasets.apps,services,nodes,secrets",
        ],
    )
    .await;
    let k = Kubectl::at(dir.path().join("fleetscope.kubeconfig"));
    kubeconfig(&k.kubeconfig, &server.url(), &format!("http://{api}"));
    let truth = common::truth(&fleet, "configmaps");
    let ((cluster, ns, name), _) = truth.iter().next().unwrap();
    let qualified = format!("{cluster}:{name}");
    common::eventually_blocking("kubectl sees the fleet's configmaps", || {
        let n = k
            .ok(&["get", "configmaps", "-A", "-o", "name"])
            .lines()
            .count();
        if n == truth.len() {
            Ok(())
        } else {
            Err(format!("{n} of {}", truth.len()))
        }
    });

    // -o yaml / json of one object, in its cluster and in the fleet.
    let yaml = k.ok(&[
        "--context",
        cluster,
        "get",
        "configmap",
        name,
        "-n",
        ns,
        "-o",
        "yaml",
    ]);
    assert!(yaml.contains(&format!("  name: {name}\n")), "{yaml}");
    let json: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "configmap", &qualified, "-n", ns, "-o", "json"]))
            .unwrap();
    assert_eq!(
        (
            &json["metadata"]["name"],
            &json["metadata"]["annotations"]["fleetscope.io/cluster"]
        ),
        (&serde_json::json!(qualified), &serde_json::json!(cluster))
    );
    // A List as json, every item there; -o wide; -o name.
    let list: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "configmaps", "-A", "-o", "json"])).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), truth.len());
    let wide = k.ok(&["get", "namespaces", "-o", "wide"]);
    assert!(
        wide.lines().next().unwrap().starts_with("CLUSTER"),
        "{wide}"
    );
    let names = k.ok(&["--context", cluster, "get", "namespaces", "-o", "name"]);
    assert!(
        names.lines().any(|l| l == format!("namespace/{ns}")),
        "{names}"
    );

    // get --raw: discovery and a path as an API server answers it; aggregated
    // discovery for those who ask for it (kubectl does, first).
    let raw: serde_json::Value = serde_json::from_str(&k.ok(&["get", "--raw", "/api/v1"])).unwrap();
    assert_eq!(raw["kind"], "APIResourceList");
    let raw: serde_json::Value = serde_json::from_str(&k.ok(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/{ns}/configmaps/{qualified}"),
    ]))
    .unwrap();
    assert_eq!(raw["metadata"]["name"], qualified.as_str());
    let (code, body) = common::http_get_with(
        &api,
        "/clusters/*/apis",
        &[(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )],
    )
    .await
    .unwrap();
    let aggregated: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (code, &aggregated["kind"]),
        (200, &serde_json::json!("APIGroupDiscoveryList")),
        "{body}"
    );
    let resources = k.ok(&["api-resources", "--no-headers", "-o", "name"]);
    let mut resources: Vec<&str> = resources.lines().collect();
    resources.sort();
    assert_eq!(
        resources,
        [
            "configmaps",
            "deployments.apps",
            "events",
            "namespaces",
            "nodes",
            "pods",
            "replicasets.apps",
            "secrets",
            "services"
        ]
    );
    // Every collected type, across the fleet (the CLUSTER column first) and in one
    // cluster.
    for r in &resources {
        let fleet_wide = k.ok(&["get", r, "-A"]);
        // (A type with no objects prints "No resources found" on stderr.)
        assert!(
            fleet_wide.is_empty()
                || fleet_wide.starts_with("NAMESPACE   CLUSTER")
                || fleet_wide.starts_with("CLUSTER"),
            "{r}: {fleet_wide}"
        );
        let one = k.ok(&["--context", cluster, "get", r, "-A"]);
        let header = one.lines().next().unwrap_or("");
        assert!(
            !header.split_whitespace().any(|w| w == "CLUSTER"),
            "{r}: {one}"
        );
    }

    // describe, in the cluster and in the fleet.
    let described = k.ok(&[
        "--context",
        cluster,
        "describe",
        "configmap",
        name,
        "-n",
        ns,
    ]);
    assert!(
        described.contains("Name:") && described.contains(name.as_str()),
        "{described}"
    );
    let described = k.ok(&["describe", "configmap", &qualified, "-n", ns]);
    assert!(described.contains(&qualified), "{described}");

    // apply: refused, saying the view is read-only and where to write.
    let manifest = dir.path().join("cm.yaml");
    std::fs::write(
        &manifest,
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: {ns}\ndata:\n  a: b\n"),
    )
    .unwrap();
    // kubectl first asks for the schema: refused as a method not allowed (kubectl
    // says so in its own words); without validation, the write itself says where.
    let manifest = manifest.to_str().unwrap();
    let out = k.run(&["--context", cluster, "apply", "-f", manifest]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("does not allow this method"),
        "{said}"
    );
    let out = k.run(&[
        "--context",
        cluster,
        "apply",
        "--validate=false",
        "-f",
        manifest,
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("read-only view") && said.contains(cluster.as_str()),
        "{said}"
    );
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_rs_metadata_reflector_of_the_fleet_holds_every_object_s_metadata() {
    use futures::StreamExt as _;
    use kube::core::PartialObjectMeta;
    use kube::runtime::{reflector, watcher};
    let Serving {
        fleet,
        log,
        server,
        api,
        kubeconfig,
        dir: _dir,
    } = serving(2, 30, &["--resources", "configmaps"]).await;
    let client = kube::Client::try_from(kube::Config::new(
        format!("http://{api}/clusters/*").parse().unwrap(),
    ))
    .unwrap();
    let configmaps: kube::Api<PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>> =
        kube::Api::all(client);
    // A list of metadata alone.
    let listed = configmaps.list(&Default::default()).await.unwrap();
    assert!(!listed.items.is_empty());
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(configmaps, watcher::Config::default()));
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while events.next().await.is_some() {}
    });
    let truth = || -> BTreeSet<String> {
        common::truth(&fleet, "configmaps")
            .into_keys()
            .map(|(c, ns, name)| format!("{ns}/{c}:{name}"))
            .collect()
    };
    make_configmaps(&kubeconfig, "sim-2", &["watched-metadata".to_string()]).await;
    let what = common::with_log("the metadata reflector holds the fleet", &log);
    common::eventually(what, async || {
        let held: BTreeSet<String> = reader
            .state()
            .iter()
            .map(|m| {
                let m = &m.metadata;
                format!(
                    "{}/{}",
                    m.namespace.clone().unwrap_or_default(),
                    m.name.clone().unwrap_or_default()
                )
            })
            .collect();
        let truth = truth();
        if held == truth && held.contains("team-0/sim-2:watched-metadata") {
            Ok(())
        } else {
            Err(format!("{} held, {} true", held.len(), truth.len()))
        }
    })
    .await;
    task.abort();
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_rs_reflector_whose_position_is_no_longer_held_lists_again_and_holds_the_truth() {
    // A short event log: what changes while fleetscope is down outruns it.
    let (s, mut server) = Persisted::start(2, 20, &["--event-log", "20"]).await;
    let (fleet, log, api, kubeconfig_path) = (&s.fleet, &s.log, &s.api, &s.kubeconfig);
    let all = Reflector::start(&format!("http://{api}/clusters/*"));
    let truth = || -> BTreeSet<String> {
        common::truth(fleet, "configmaps")
            .into_keys()
            .map(|(c, ns, name)| format!("{c}/{ns}/{c}:{name}"))
            .collect()
    };
    let reaches_truth = async |what: &str| all.reaches(what, log, truth).await;
    reaches_truth("the reflector holds the fleet").await;
    assert_eq!(all.lists(), 1);
    server.kill();
    let names: Vec<String> = (0..40).map(|i| format!("while-down-{i}")).collect();
    make_configmaps(kubeconfig_path, "sim-1", &names).await;
    s.restart(&mut server).await;
    // Its position is gone (410): it lists again, and holds the truth.
    reaches_truth("the reflector lists again and holds the fleet").await;
    assert!(all.lists() >= 2, "the reflector never listed again");
    server.assert_running(log);
    all.task.abort();
    drop(server);
    s.fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_continue_is_410_expired_with_a_continue_that_goes_on_in_the_current_snapshot() {
    let Serving {
        fleet,
        log,
        server,
        api,
        kubeconfig,
        dir: _dir,
    } = serving(1, 30, &["--resources", "configmaps"]).await;
    let get = async |path: &str| -> (u16, serde_json::Value) {
        let (code, body) = common::http_get(&api, path).await.unwrap();
        (code, serde_json::from_str(&body).unwrap())
    };
    let names = |list: &serde_json::Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let path = "/clusters/*/api/v1/namespaces/team-1/configmaps";
    for name in ["a-0", "a-1", "a-2"] {
        make_in(&kubeconfig, "team-1", name).await;
    }
    let what = common::with_log("team-1's configmaps are served", &log);
    common::eventually(what, async || {
        let (_, l) = get(path).await;
        if names(&l).len() >= 3 { Ok(()) } else { Err(l) }
    })
    .await;
    let (code, first) = get(&format!("{path}?limit=1")).await;
    assert_eq!(code, 200, "{first}");
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let last = names(&first).pop().unwrap();
    // The caller's pinned snapshots are bounded: 33 newer lists push that one out.
    for i in 0..33 {
        make_in(&kubeconfig, "team-1", &format!("pin-{i:02}")).await;
        let what = common::with_log(format!("pin-{i:02} is served"), &log);
        common::eventually(what, async || {
            let (_, l) = get(&format!(
                "{path}?fieldSelector=metadata.name%3Dsim-1:pin-{i:02}"
            ))
            .await;
            if names(&l).len() == 1 { Ok(()) } else { Err(l) }
        })
        .await;
        let (code, _) = get(&format!("{path}?limit=1")).await;
        assert_eq!(code, 200);
    }
    let (code, expired) = get(&format!("{path}?limit=500&continue={token}")).await;
    assert_eq!(
        (code, &expired["reason"]),
        (410, &serde_json::json!("Expired")),
        "{expired}"
    );
    // Its continue goes on after the same object, in the current snapshot.
    let go_on = expired["metadata"]["continue"].as_str().unwrap();
    let (code, rest) = get(&format!("{path}?limit=500&continue={go_on}")).await;
    assert_eq!(code, 200, "{rest}");
    let rest = names(&rest);
    assert!(rest.iter().all(|n| *n > last), "{last}: {rest:?}");
    let truth: Vec<String> = common::truth(&fleet, "configmaps")
        .into_keys()
        .filter(|(_, ns, n)| ns == "team-1" && format!("sim-1:{n}") > last)
        .map(|(c, _, n)| format!("{c}:{n}"))
        .collect();
    assert_eq!(rest, truth);
    drop(server);
    fleet.shutdown().await;
}

/// A configmap `name` in `namespace` of sim-1, made through its own API server.
async fn make_in(kubeconfig: &std::path::Path, namespace: &str, name: &str) {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(common::kube_client(kubeconfig, "sim-1").await, namespace);
    let cm = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    api.create(&Default::default(), &cm).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_leaves_a_cluster_out_says_so_in_a_warning() {
    let (fleet, dir, kc) = common::fleet_with_an_unreachable_cluster(20).await;
    let log = dir.path().join("serve.log");
    let api = format!("127.0.0.1:{}", free_port());
    let args = [
        "--no-persist",
        "--resources",
        "configmaps",
        "--kube-api-listen",
        &api,
    ];
    let server = Server::start(&kc, &args, &log);
    common::wait_serving(&server.url()).await;
    // The raw answer: its headers.
    let head = async || -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(&api).await.unwrap();
        let request =
            "GET /clusters/*/api/v1/configmaps HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        s.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let text = String::from_utf8_lossy(&raw).to_string();
        text.split_once("\r\n\r\n").unwrap().0.to_ascii_lowercase()
    };
    let what = common::with_log("the list warns that gone is left out", &log);
    let warned = common::eventually(what, async || {
        let h = head().await;
        if h.contains("warning: 299 - \"fleetscope: not synced") && h.contains("gone") {
            Ok(h)
        } else {
            Err(h)
        }
    })
    .await;
    assert!(!warned.contains("sim-1"), "{warned}");
    // kubectl prints it.
    if common::kubectl_installed() {
        let k = Kubectl::at(dir.path().join("fleetscope.kubeconfig"));
        kubeconfig(&k.kubeconfig, &server.url(), &format!("http://{api}"));
        let out = k.run(&["get", "configmaps", "-A"]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && said.contains("Warning") && said.contains("gone"),
            "{said}"
        );
    }
    drop(server);
    fleet.shutdown().await;
}
