//! The configuration file from the outside: `fleetscope serve --config` as a process
//! over simulated clusters, the file rewritten while it runs (a scope moved, a type
//! added, labels changed, a key misspelt, a restart-only setting changed), checked
//! with a real gRPC client, a running Watch on an unaffected type, the simulated
//! clusters' request counts and the metrics; and `fleetscope config check`.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;

use common::process::{BIN, Server, free_port};
use common::{PATIENCE, replace};
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{self};
use fleetscope_sim::{FleetSpec, SimFleet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use tonic::transport::Channel;

/// Every cluster synced with exactly `types` watching, and labelled `env`.
fn settled(r: &proto::ListClustersResponse, names: &[&str], types: &[&str], env: &str) -> bool {
    let mut have: Vec<&str> = r.clusters.iter().map(|c| c.name.as_str()).collect();
    have.sort();
    have == names
        && r.clusters.iter().all(|c| {
            let mut streams: Vec<&str> = c.streams.iter().map(|s| s.resource.as_str()).collect();
            streams.sort();
            c.freshness == proto::Freshness::Synced as i32
                && streams == types
                && c.streams
                    .iter()
                    .all(|s| s.state == proto::StreamState::Watching as i32)
                && c.labels.get("env").map(String::as_str) == Some(env)
        })
}

/// How many configmaps fleetscope holds in `cluster`, in `namespace` or in all.
async fn configmaps(c: &mut FleetClient<Channel>, cluster: &str, namespace: Option<&str>) -> u64 {
    c.count(proto::CountRequest {
        query: Some(proto::Query {
            resource: "configmaps".into(),
            clusters: vec![cluster.into()],
            namespaces: namespace.into_iter().map(String::from).collect(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .total
}

/// The configmaps of `namespace` in a simulated cluster, read with kube-rs.
async fn truth(kubeconfig: &Path, context: &str, namespace: &str) -> u64 {
    let client = common::kube_client(kubeconfig, context).await;
    let api = kube::Api::<ConfigMap>::namespaced(client, namespace);
    api.list(&Default::default()).await.unwrap().items.len() as u64
}

const FIRST: &str = "\
# What each cluster collects, and how.
resources:
  namespaces:
  configmaps:
    namespace: team-0
clusters:
  labels:
    - match: 'sim-*'
      labels: {env: test}
    - match: second
      labels: {env: test}
  aliases:
    sim-2: second
";

const SECOND: &str = "\
resources:
  namespaces:
  configmaps:
    namespace: team-1
  pods:
clusters:
  labels:
    - match: '*'
      labels: {env: staging}
  aliases:
    sim-2: second
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_applies_at_once_and_leaves_other_streams_alone() {
    let fleet = SimFleet::start(&FleetSpec::numbered(2, 60, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let etc = dir.path().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let file = etc.join("fleetscope.yaml");
    replace(&file, FIRST);
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("serve.log");
    let mut server = Server::start(
        &kubeconfig,
        &[
            "--config",
            file.to_str().unwrap(),
            "--no-persist",
            "--metrics-listen",
            &metrics,
        ],
        &log,
    );
    let url = server.url();
    common::wait_serving(&url).await;
    let mut c = FleetClient::connect(url.clone()).await.unwrap();
    let names = ["second", "sim-1"];
    common::wait_for_clusters(&mut c, "the file's types, labels and alias", |r| {
        settled(r, &names, &["configmaps", "namespaces"], "test")
    })
    .await;
    for (name, context) in [("sim-1", "sim-1"), ("second", "sim-2")] {
        let held = configmaps(&mut c, name, None).await;
        assert!(held > 0);
        assert_eq!(held, configmaps(&mut c, name, Some("team-0")).await);
        assert_eq!(held, truth(&kubeconfig, context, "team-0").await);
    }

    // A Watch on namespaces, a type the change leaves alone.
    let mut namespaces = c
        .watch(proto::WatchRequest {
            query: Some(proto::Query {
                resource: "namespaces".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // And one on configmaps, which the change moves: every status it is told has a
    // reason.
    let mut moved = c
        .watch(proto::WatchRequest {
            query: Some(proto::Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut team_1 = Vec::new();
    for context in ["sim-1", "sim-2"] {
        team_1.push(truth(&kubeconfig, context, "team-1").await);
    }
    let before = common::requests(&fleet);

    // The scope moves to team-1, pods join, the labels change.
    replace(&file, SECOND);
    common::wait_for_clusters(&mut c, "the new types and labels", |r| {
        settled(r, &names, &["configmaps", "namespaces", "pods"], "staging")
    })
    .await;
    for (name, want) in ["sim-1", "second"].into_iter().zip(team_1) {
        assert!(want > 0);
        common::eventually(format!("{name}: team-1 held alone"), async || {
            configmaps(&mut c, name, None).await == want
                && configmaps(&mut c, name, Some("team-1")).await == want
        })
        .await;
    }
    // One streaming list (a WATCH that goes on) per cluster for the moved configmaps,
    // the same for the new pods; no LIST; nothing for namespaces.
    let after = common::requests(&fleet);
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(
            (a.0 - b.0, a.1 - b.1),
            (0, 2),
            "cluster {i}: (LISTs, WATCHes) made by the change"
        );
    }
    // The namespaces Watch saw no object event from it: its first is the next real change.
    let client = common::kube_client(&kubeconfig, "sim-1").await;
    kube::Api::<Namespace>::all(client)
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "after-reload"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    let first = loop {
        let e = tokio::time::timeout(PATIENCE, namespaces.message())
            .await
            .expect("an event")
            .unwrap()
            .unwrap();
        // Nothing of the other types' streams: no cluster status (bookmarks may come).
        assert_ne!(
            e.r#type,
            proto::EventType::ClusterStatus as i32,
            "a namespaces Watch told of other types' streams: {e:?}"
        );
        if e.object.is_some() {
            break e;
        }
    };
    assert_eq!(first.r#type, proto::EventType::Added as i32, "{first:?}");
    assert_eq!(first.object.unwrap().name, "after-reload");
    // The configmaps Watch was told its streams moved and came back, each time
    // saying why.
    let mut back = std::collections::BTreeSet::new();
    let mut away = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while back.len() < 2 {
        let e = tokio::time::timeout_at(deadline, moved.message())
            .await
            .unwrap_or_else(|_| {
                panic!("the configmaps Watch was never told both clusters moved and came back: away {away:?}, back {back:?}")
            })
            .unwrap()
            .unwrap();
        let Some(f) = e
            .cluster
            .filter(|_| e.r#type == proto::EventType::ClusterStatus as i32)
        else {
            continue;
        };
        if f.freshness == proto::Freshness::Synced as i32 {
            if away.contains(&f.cluster) {
                back.insert(f.cluster);
            }
        } else {
            assert!(!f.message.is_empty(), "a status without a reason: {f:?}");
            away.insert(f.cluster);
        }
    }

    // A misspelt key: the last good configuration stays, and everyone is told why.
    replace(
        &file,
        &SECOND.replace("namespace: team-1", "nmespace: team-1"),
    );
    let r = common::wait_for_clusters(&mut c, "the reload error", |r| {
        let input = r.inputs.iter().find(|i| i.name == "config");
        r.sources_error.contains("resources.configmaps.nmespace")
            && input.is_some_and(|i| i.error.contains("resources.configmaps.nmespace"))
    })
    .await;
    let error = r.sources_error.clone();
    assert!(error.contains("did you mean \"namespace\"?"), "{error}");
    assert!(settled(
        &r,
        &names,
        &["configmaps", "namespaces", "pods"],
        "staging"
    ));
    let body = common::scrape(&metrics).await.unwrap();
    assert!(
        body.contains("fleetscope_config_last_reload_successful 0"),
        "{body}"
    );
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("the last good one stays in force")
    );

    // Fixed, with a setting that needs a restart: applied, and the log says so.
    replace(&file, &format!("{SECOND}retention:\n  events: 5000\n"));
    common::wait_for_clusters(&mut c, "the error cleared", |r| {
        let input = r.inputs.iter().find(|i| i.name == "config");
        r.sources_error.is_empty() && input.is_some_and(|i| i.error.is_empty())
    })
    .await;
    let body = common::scrape(&metrics).await.unwrap();
    assert!(
        body.contains("fleetscope_config_last_reload_successful 1"),
        "{body}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("takes effect at the next restart") && text.contains("--event-log"),
        "{text}"
    );
    server.assert_running(&log);
    server.kill();
    fleet.shutdown().await;
}

fn check(file: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["config", "check"]).arg(file);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[tokio::test]
async fn config_check_prints_each_value_with_its_source_and_names_bad_keys() {
    let fleet = SimFleet::start(&FleetSpec::numbered(2, 10, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let file = dir.path().join("fleetscope.yaml");
    std::fs::write(
        &file,
        format!(
            "kubeconfigs: [{}]\ninformer:\n  pageSize: 250\nlisten: 127.0.0.1:7000\nclusters:\n  aliases: {{sim-1: first}}\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let out = check(&file, &[("FLEETSCOPE_LISTEN", "127.0.0.1:7001")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |flag: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(flag))
            .unwrap_or_else(|| panic!("{flag}: {stdout}"))
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(line("--page-size")[2..], ["250", "file"]);
    assert_eq!(
        line("--listen")[2..],
        ["127.0.0.1:7001", "env", "FLEETSCOPE_LISTEN"]
    );
    assert_eq!(line("--event-log")[2..], ["100000", "default"]);
    assert!(stdout.contains("2 cluster(s): first, sim-2"), "{stdout}");

    std::fs::write(&file, "informer:\n  pagesize: 250\n").unwrap();
    let out = check(&file, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown key \"informer.pagesize\" (did you mean \"pageSize\"?)"),
        "{stderr}"
    );
    std::fs::write(
        &file,
        "resources:\n  pods:\n    labelSelector: 'app in web'\n",
    )
    .unwrap();
    let out = check(&file, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("resources.pods.labelSelector") && stderr.contains("position"),
        "{stderr}"
    );
    // The security files it names are checked as serve checks them.
    let policy = file.with_file_name("policy.yaml");
    std::fs::write(&policy, "grants:\n  - subjects: [{user: a}]\n    clusters: [x]\n    namespaces: [y]\n    resources: [pods]\n    verbs: [write]\n").unwrap();
    let kc = kubeconfig.display();
    std::fs::write(
        &file,
        format!(
            "kubeconfigs: [{kc}]\nsecurity:\n  policy: {}\n",
            policy.display()
        ),
    )
    .unwrap();
    let out = check(&file, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("policy.yaml") && stderr.contains("grants[0].verbs[0]"),
        "{stderr}"
    );
    std::fs::write(
        &file,
        format!("kubeconfigs: [{kc}]\nsecurity:\n  clientCa: /nowhere/ca.pem\n"),
    )
    .unwrap();
    let out = check(&file, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--client-ca"));
    // Settings that make no sense, and a file that never ends, are refused by name, by
    // `config check` and by `serve` before it binds a port.
    let port = common::process::free_port().to_string();
    for (settings, named) in [
        ("grpc:\n  idleTimeout: 0s\n", "grpc.idleTimeout"),
        ("grpc:\n  requestTimeout: 0\n", "grpc.requestTimeout"),
        ("grpc:\n  queryTimeout: 0ms\n", "grpc.queryTimeout"),
        (
            "sharding:\n  ring: r\n  leaseDuration: 1s\n  renewPeriod: 5s\n",
            "sharding.leaseDuration",
        ),
        (
            "sharding:\n  ring: r\n  leaseDuration: 10s\n  renewPeriod: 6s\n",
            "sharding.renewPeriod",
        ),
        ("sharding:\n  ring: r\n", "sharding.pageTokenKeyFile"),
        (
            "store:\n  snapshotCpuShare: 2\n",
            "--snapshot-cpu-share must be a number from 0 to 1",
        ),
        (
            "security:\n  policy: /dev/zero\n",
            "/dev/zero: larger than 64 MiB",
        ),
        (
            "security:\n  tokensFile: /dev/zero\n",
            "/dev/zero: larger than 64 MiB",
        ),
    ] {
        std::fs::write(&file, format!("kubeconfigs: [{kc}]\n{settings}")).unwrap();
        let out = check(&file, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{settings}: {stderr}");
        assert!(stderr.contains(named), "{settings}: {stderr}");
        let out = std::process::Command::new(BIN)
            .args(["serve", "--no-persist", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{settings}: serve started");
        assert!(stderr.contains(named), "{settings}: {stderr}");
    }
    fleet.shutdown().await;
}

/// The simulated clusters' configmaps in `namespace`, under the names fleetscope
/// gives the clusters (`renamed`: context → name).
fn truth_in(
    fleet: &SimFleet,
    namespace: &str,
    renamed: &[(&str, &str)],
) -> std::collections::BTreeMap<common::subscriber::Key, String> {
    common::truth(fleet, "configmaps")
        .into_iter()
        .filter(|((_, ns, _), _)| ns == namespace)
        .map(|((cluster, ns, name), rv)| {
            let cluster = renamed
                .iter()
                .find(|(context, _)| *context == cluster)
                .map_or(cluster, |(_, to)| to.to_string());
            ((cluster, ns, name), rv)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_changed_across_a_sigkill_reaches_a_resuming_subscriber() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 60).await;
    let file = dir.path().join("fleetscope.yaml");
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let config = |namespace: &str, alias: &str| {
        format!(
            "resources:\n  configmaps:\n    namespace: {namespace}\nclusters:\n  aliases:\n    sim-2: {alias}\n"
        )
    };
    replace(&file, &config("team-0", "second"));
    let args = [
        "--config",
        file.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    let mut server = Server::start(&kubeconfig, &args, &log);
    let mut sub = common::subscriber::Subscriber::default();
    let mut stream = sub.watch(&server.url()).await.unwrap();
    let before = truth_in(&fleet, "team-0", &[("sim-2", "second")]);
    assert!(!before.is_empty());
    sub.converge(&mut stream, &before).await;

    // SIGKILL; the scope moves to team-1 and sim-2 is renamed while it is down.
    server.kill();
    sub.drain(&mut stream).await;
    replace(&file, &config("team-1", "two"));
    let server = Server::start(&kubeconfig, &args, &log);
    let mut stream = sub.watch(&server.url()).await.unwrap();
    let after = truth_in(&fleet, "team-1", &[("sim-2", "two")]);
    assert!(!after.is_empty());
    sub.converge(&mut stream, &after).await;
    // Each object that left (its namespace, or its cluster's old name) was deleted once.
    for key in before.keys() {
        assert_eq!(sub.deleted.get(key), Some(&1), "{key:?}");
    }
    drop(server);
    fleet.shutdown().await;
}
