//! Real Kubernetes clients against the simulator over HTTPS with bearer tokens, from
//! the kubeconfig `fleetscope sim` writes: kube-rs (what fleetscope's informers use)
//! and kubectl.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;

use common::PATIENCE;
use fleetscope_sim::{FleetSpec, SimFleet, Verb};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use kube::discovery::Discovery;

async fn client_for(kubeconfig: &std::path::Path, context: &str) -> Client {
    common::kube_client(kubeconfig, context).await
}

async fn fleet() -> (SimFleet, tempfile::TempDir, std::path::PathBuf) {
    let fleet = SimFleet::start(&FleetSpec::numbered(2, 600, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&path).unwrap();
    (fleet, dir, path)
}

#[tokio::test]
async fn kube_rs_discovers_lists_in_pages_and_watches() {
    let (fleet, _dir, path) = fleet().await;
    let client = client_for(&path, "sim-1").await;

    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let kinds: Vec<String> = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .map(|(ar, _)| ar.plural)
        .collect();
    for want in [
        "pods",
        "configmaps",
        "deployments",
        "replicasets",
        "crontabs",
        "nodes",
    ] {
        assert!(kinds.iter().any(|k| k == want), "{want} in {kinds:?}");
    }

    let pods: Api<Pod> = Api::all(client.clone());
    let mut names = Vec::new();
    let mut params = ListParams::default().limit(50);
    loop {
        let page = tokio::time::timeout(PATIENCE, pods.list(&params))
            .await
            .unwrap()
            .unwrap();
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => break,
        }
    }
    assert_eq!(
        names.len(),
        fleet.servers()[0].cluster().store.count("pods")
    );
    let pod = pods
        .list(&ListParams::default().limit(1))
        .await
        .unwrap()
        .items
        .remove(0);
    assert!(
        pod.spec.unwrap().node_name.unwrap().starts_with("node-"),
        "typed decoding of realistic pods"
    );

    let web: Api<Deployment> = Api::namespaced(client.clone(), "team-0");
    let selected = web
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert!(!selected.items.is_empty());
    assert!(
        selected
            .items
            .iter()
            .all(|d| d.metadata.labels.as_ref().unwrap()["app"] == "web")
    );

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team-1");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = cms
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("from-kube-rs".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let first = tokio::time::timeout(PATIENCE, events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match first {
        WatchEvent::Added(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("from-kube-rs")),
        other => panic!("expected Added, got {other:?}"),
    }

    let crontabs = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.plural == "crontabs")
        .unwrap()
        .0;
    let dynamic: Api<DynamicObject> = Api::all_with(client, &crontabs);
    assert!(
        dynamic
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    fleet.shutdown().await;
}

#[tokio::test]
async fn kube_rs_sees_forbidden_and_expired_as_kubernetes_errors() {
    let (fleet, _dir, path) = fleet().await;
    let cluster = fleet.servers()[1].cluster().clone();
    cluster.set_denied(&cluster.admin_token(), "pods", true);
    let client = client_for(&path, "sim-2").await;
    let pods: Api<Pod> = Api::all(client.clone());
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"))
        }
        other => panic!("expected 403, got {other:?}"),
    }
    let cms: Api<ConfigMap> = Api::all(client);
    let old = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    cluster
        .store
        .patch(
            "configmaps",
            "team-0",
            &cluster_first_configmap(&cluster),
            &serde_json::json!({"data": {"x": "y"}}),
        )
        .unwrap();
    cluster.compact();
    let mut stream = cms
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(PATIENCE, stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert_eq!(cluster.requests(Verb::Watch, "configmaps"), 1);
    fleet.shutdown().await;
}

fn cluster_first_configmap(cluster: &fleetscope_sim::Cluster) -> String {
    let snap = cluster
        .store
        .snapshot("configmaps", fleetscope_sim::store::ReadAt::Latest)
        .unwrap();
    snap.objects
        .values()
        .find(|o| o.namespace == "team-0")
        .unwrap()
        .name
        .clone()
}

fn kubectl() -> Option<Command> {
    let found = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "kubectl is needed for this test (Debian: apt-get install kubernetes-client; .ci/run installs it)"
    );
    Some(Command::new("kubectl"))
}

#[tokio::test]
async fn kubectl_gets_pods_configmaps_and_a_raw_watch() {
    let (fleet, _dir, path) = fleet().await;
    let kc = path.display().to_string();
    let run = |args: &[&str]| {
        let kc = kc.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut cmd = kubectl()?;
                let out = cmd
                    .arg("--kubeconfig")
                    .arg(&kc)
                    .args(&args)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "kubectl {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                Some(String::from_utf8(out.stdout).unwrap())
            })
            .await
            .unwrap()
        }
    };
    let Some(pods) = run(&["--context", "sim-1", "get", "pods", "-A"]).await else {
        return;
    };
    let header: Vec<&str> = pods.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert_eq!(
        pods.lines().count() - 1,
        fleet.servers()[0].cluster().store.count("pods")
    );

    let cms = run(&[
        "--context",
        "sim-2",
        "get",
        "configmaps",
        "-n",
        "team-0",
        "-l",
        "app=web",
    ])
    .await
    .unwrap();
    assert!(cms.lines().skip(1).all(|l| l.starts_with("web-")), "{cms}");
    assert!(cms.lines().count() > 1);

    let raw = run(&[
        "--context",
        "sim-1",
        "get",
        "--raw",
        "/api/v1/configmaps?watch=1&timeoutSeconds=1",
    ])
    .await
    .unwrap();
    let first: serde_json::Value = serde_json::from_str(raw.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["kind"], "ConfigMap");
    fleet.shutdown().await;
}
