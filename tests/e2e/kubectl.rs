//! The simulator as a kubectl playground: the real `kubectl` binary against a
//! simulated cluster, one command at a time, each checked in the cluster's store:
//! `create` of each generator (protobuf bodies), `create -f` and `apply -f` with
//! validation on (OpenAPI, and a misspelt field refused by the server), `apply` again (a strategic merge patch; a merge patch for a
//! custom resource), `replace`, `edit`, `patch --type=json|merge|strategic`, `scale`,
//! `label`, `annotate`, `delete`, and `--dry-run=server` changing nothing; and the
//! controllers at work: `rollout status` of a Deployment, its ReplicaSets and pods,
//! scaling, a deleted pod replaced, events for `describe`, the garbage collector and
//! a namespace deletion taking everything in it.
//!
//! kubectl is not a build dependency: without it on the PATH the test says so and
//! checks nothing else.

#![allow(clippy::unwrap_used)]

use crate::common::{self, Kubectl, eventually_blocking};
use fleetscope_sim::{FleetSpec, SimFleet};
use serde_json::Value;

/// An object as the simulated cluster holds it.
fn held(fleet: &SimFleet, id: &str, namespace: &str, name: &str) -> Option<Value> {
    fleet.servers()[0]
        .cluster()
        .store
        .get(id, namespace, name)
        .map(|o| o.value())
}

const DEPLOYMENT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: applied
  namespace: default
spec:
  replicas: 1
  selector:
    matchLabels: {app: applied}
  template:
    metadata:
      labels: {app: applied}
    spec:
      containers:
        - name: main
          image: main:1
        - name: side
          image: side:1
";

/// Runs `commands` with the real kubectl against one simulated cluster (with its
/// workload and controllers), off the async workers (kubectl blocks on the cluster).
async fn with_kubectl(commands: fn(&Kubectl, &SimFleet)) {
    assert!(
        common::kubectl_installed(),
        "kubectl is needed for this test (Debian: apt-get install kubernetes-client; .ci/run installs it)"
    );
    let fleet = SimFleet::start(&FleetSpec::numbered(1, 40, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fleet.write_kubeconfig(&kubeconfig).unwrap();
    let k = std::sync::Arc::new(Kubectl::at(kubeconfig));
    let fleet = std::sync::Arc::new(fleet);
    let (k2, f2) = (k.clone(), fleet.clone());
    tokio::task::spawn_blocking(move || commands(&k2, &f2))
        .await
        .unwrap();
    if let Ok(fleet) = std::sync::Arc::try_unwrap(fleet) {
        fleet.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_is_a_full_client_of_a_simulated_cluster() {
    with_kubectl(playground).await;
}

fn playground(k: &Kubectl, fleet: &SimFleet) {
    let get = |id: &str, ns: &str, name: &str| held(fleet, id, ns, name);

    // create, with each generator kubectl sends as protobuf.
    k.ok(&["create", "namespace", "play"]);
    assert!(get("namespaces", "", "play").is_some());
    k.ok(&[
        "create",
        "configmap",
        "demo",
        "-n",
        "play",
        "--from-literal=a=b",
    ]);
    assert_eq!(get("configmaps", "play", "demo").unwrap()["data"]["a"], "b");
    k.ok(&[
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=password=hunter2",
    ]);
    assert_eq!(
        get("secrets", "default", "s").unwrap()["data"]["password"],
        "aHVudGVyMg=="
    );
    k.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "play",
        "--image=nginx:1",
        "--replicas=2",
        "--port=80",
    ]);
    let web = get("deployments.apps", "play", "web").unwrap();
    assert_eq!(web["spec"]["replicas"], 2);
    assert_eq!(
        web["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        80
    );
    k.ok(&[
        "create",
        "service",
        "clusterip",
        "web",
        "-n",
        "play",
        "--tcp=80:8080",
    ]);
    let svc = get("services", "play", "web").unwrap();
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    assert!(
        svc["spec"]["clusterIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.96."))
    );
    k.ok(&[
        "run",
        "one",
        "-n",
        "play",
        "--image=busybox",
        "--env=A=1",
        "--labels=app=one",
    ]);
    let pod = get("pods", "play", "one").unwrap();
    assert_eq!(pod["status"]["phase"], "Pending");
    assert_eq!(pod["spec"]["containers"][0]["env"][0]["value"], "1");
    // RBAC, as a cluster's owner grants it (and fleetscope's delegated authorization reads it).
    k.ok(&[
        "create",
        "role",
        "cm-reader",
        "-n",
        "play",
        "--verb=get,list,watch",
        "--resource=configmaps",
    ]);
    let role = get("roles.rbac.authorization.k8s.io", "play", "cm-reader").unwrap();
    assert_eq!(role["rules"][0]["resources"][0], "configmaps");
    assert_eq!(role["rules"][0]["verbs"][2], "watch");
    k.ok(&[
        "create",
        "rolebinding",
        "erin",
        "-n",
        "play",
        "--role=cm-reader",
        "--user=erin",
        "--group=devs",
    ]);
    let binding = get("rolebindings.rbac.authorization.k8s.io", "play", "erin").unwrap();
    assert_eq!(binding["roleRef"]["name"], "cm-reader");
    assert_eq!(binding["subjects"][1]["kind"], "Group");
    k.ok(&[
        "create",
        "clusterrole",
        "viewer",
        "--verb=list",
        "--resource=pods,nodes",
    ]);
    k.ok(&[
        "create",
        "clusterrolebinding",
        "viewer",
        "--clusterrole=viewer",
        "--serviceaccount=play:bot",
    ]);
    let crb = get(
        "clusterrolebindings.rbac.authorization.k8s.io",
        "",
        "viewer",
    )
    .unwrap();
    assert_eq!(crb["subjects"][0]["namespace"], "play");

    // create -f and apply -f, validation on; apply again patches.
    let file = k.write("deployment.yaml", DEPLOYMENT);
    k.ok(&["create", "-f", &file, "--dry-run=server"]);
    assert!(
        get("deployments.apps", "default", "applied").is_none(),
        "a dry run changes nothing"
    );
    k.ok(&["apply", "-f", &file]);
    let applied = get("deployments.apps", "default", "applied").unwrap();
    assert!(
        applied["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    k.write("deployment.yaml", &DEPLOYMENT.replace("main:1", "main:2"));
    assert!(k.ok(&["apply", "-f", &file]).contains("configured"));
    let containers = get("deployments.apps", "default", "applied").unwrap()["spec"]["template"]["spec"]["containers"].clone();
    assert_eq!(containers[0]["image"], "main:2");
    assert_eq!(containers[1]["image"], "side:1", "merged by name");
    let out = k.run(&["create", "-f", &file]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("AlreadyExists")
    );
    // Validation on: a misspelt field is refused by name; off, it is accepted.
    let typo = k.write(
        "typo.yaml",
        &DEPLOYMENT
            .replace("name: applied", "name: typo")
            .replace("replicas: 1", "replicaz: 1"),
    );
    let out = k.run(&["create", "-f", &typo]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unknown field \"spec.replicaz\""),
        "{err}"
    );
    assert!(get("deployments.apps", "default", "typo").is_none());
    k.ok(&["create", "-f", &typo, "--validate=false"]);
    assert!(get("deployments.apps", "default", "typo").is_some());
    let crontab = k.write(
        "crontab.yaml",
        "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: tab\n  namespace: default\nspec:\n  image: one\n",
    );
    k.ok(&["apply", "-f", &crontab]);
    k.write(
        "crontab.yaml",
        "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: tab\n  namespace: default\nspec:\n  image: two\n",
    );
    k.ok(&["apply", "-f", &crontab]);
    assert_eq!(
        get("crontabs.stable.example.com", "default", "tab").unwrap()["spec"]["image"],
        "two"
    );

    // patch, each type; scale.
    k.ok(&[
        "patch",
        "deployment",
        "web",
        "-n",
        "play",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
    ]);
    assert_eq!(
        get("deployments.apps", "play", "web").unwrap()["spec"]["replicas"],
        3
    );
    k.ok(&[
        "patch",
        "deployment",
        "web",
        "-n",
        "play",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"tier":"front"}}}"#,
    ]);
    assert_eq!(
        get("deployments.apps", "play", "web").unwrap()["metadata"]["labels"]["tier"],
        "front"
    );
    k.ok(&[
        "patch",
        "deployment",
        "web",
        "-n",
        "play",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"nginx","image":"nginx:2"}]}}}}"#,
    ]);
    let c =
        get("deployments.apps", "play", "web").unwrap()["spec"]["template"]["spec"]["containers"]
            .clone();
    assert_eq!(
        (
            c[0]["image"].as_str(),
            c[0]["ports"][0]["containerPort"].as_i64()
        ),
        (Some("nginx:2"), Some(80))
    );
    let out = k.run(&[
        "patch",
        "deployment",
        "web",
        "-n",
        "play",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/nope"}]"#,
    ]);
    assert!(!out.status.success(), "a failing JSON patch is refused");
    k.ok(&["scale", "deployment", "web", "-n", "play", "--replicas=5"]);
    assert_eq!(
        get("deployments.apps", "play", "web").unwrap()["spec"]["replicas"],
        5
    );
    k.ok(&[
        "scale",
        "deployment",
        "web",
        "-n",
        "play",
        "--replicas=1",
        "--dry-run=server",
    ]);
    assert_eq!(
        get("deployments.apps", "play", "web").unwrap()["spec"]["replicas"],
        5
    );
    // Refusals read as kube-apiserver v1.20 words them (kubectl's output against one).
    const SUBDOMAIN: &str = r"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    let refusals: [(&[&str], String); 3] = [
        (
            &["patch", "deployment", "web", "-n", "play", "--subresource=scale", "--type=merge", "-p", r#"{"spec":{"replicas":-1}}"#],
            "The Scale \"web\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0".into(),
        ),
        (
            &["create", "configmap", "Bad_Name", "-n", "play"],
            format!("error: failed to create configmap: ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": {SUBDOMAIN}"),
        ),
        (
            &["create", "deployment", "ABC", "--image=nginx", "-n", "play"],
            format!("error: failed to create deployment: Deployment.apps \"ABC\" is invalid: metadata.name: Invalid value: \"ABC\": {SUBDOMAIN}"),
        ),
    ];
    for (args, said) in refusals {
        let out = k.run(args);
        assert!(!out.status.success(), "kubectl {}", args.join(" "));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim_end(),
            said,
            "kubectl {}",
            args.join(" ")
        );
    }

    // label, annotate, replace, edit.
    k.ok(&["label", "configmap", "demo", "-n", "play", "team=a"]);
    k.ok(&["annotate", "configmap", "demo", "-n", "play", "note=x"]);
    let cm = get("configmaps", "play", "demo").unwrap();
    assert_eq!(
        (
            cm["metadata"]["labels"]["team"].as_str(),
            cm["metadata"]["annotations"]["note"].as_str()
        ),
        (Some("a"), Some("x"))
    );
    k.ok(&["label", "configmap", "demo", "-n", "play", "team-"]);
    assert!(
        get("configmaps", "play", "demo").unwrap()["metadata"]["labels"]
            .get("team")
            .is_none()
    );
    let yaml = k.ok(&["get", "configmap", "demo", "-n", "play", "-o", "yaml"]);
    let replaced = k.write("replaced.yaml", &yaml.replace("a: b", "a: replaced"));
    k.ok(&["replace", "-f", &replaced]);
    assert_eq!(
        get("configmaps", "play", "demo").unwrap()["data"]["a"],
        "replaced"
    );
    k.ok_with(
        &["edit", "configmap", "demo", "-n", "play"],
        &[
            ("EDITOR", "sed -i s/replaced/edited/"),
            ("KUBE_EDITOR", "sed -i s/replaced/edited/"),
        ],
    );
    assert_eq!(
        get("configmaps", "play", "demo").unwrap()["data"]["a"],
        "edited"
    );

    // delete, after a dry run that changes nothing.
    k.ok(&[
        "delete",
        "configmap",
        "demo",
        "-n",
        "play",
        "--dry-run=server",
    ]);
    assert!(get("configmaps", "play", "demo").is_some());
    k.ok(&["delete", "configmap", "demo", "-n", "play"]);
    assert!(get("configmaps", "play", "demo").is_none());
    let out = k.run(&["get", "configmap", "demo", "-n", "play"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));

    // Reading: tables, short names, explain from OpenAPI, api-resources.
    let table = k.ok(&["get", "deploy", "-n", "play"]);
    assert!(
        table.starts_with("NAME") && table.contains("web"),
        "{table}"
    );
    assert!(k.ok(&["api-resources"]).contains("deployments"));
    assert!(
        k.ok(&["get", "--raw", "/openapi/v3"])
            .contains("apis/apps/v1")
    );
}

/// The objects of type `id` in `namespace`, as the cluster holds them.
fn held_in(fleet: &SimFleet, id: &str, namespace: &str) -> Vec<Value> {
    let store = &fleet.servers()[0].cluster().store;
    store
        .snapshot(id, fleetscope_sim::store::ReadAt::Latest)
        .unwrap()
        .objects
        .values()
        .filter(|o| o.namespace == namespace)
        .map(|o| o.value())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_a_clusters_controllers_at_work() {
    with_kubectl(controllers).await;
}

/// `kubectl rollout status` of a Deployment finishes, saying it rolled out.
fn rolled_out(k: &Kubectl, namespace: &str, deployment: &str) {
    let out = k.ok(&[
        "rollout",
        "status",
        &format!("deployment/{deployment}"),
        "-n",
        namespace,
        "--timeout",
        "60s",
    ]);
    assert!(out.contains("successfully rolled out"), "{out}");
}

fn controllers(k: &Kubectl, fleet: &SimFleet) {
    let pods = |ns: &str| held_in(fleet, "pods", ns);
    let running = |ns: &str| {
        pods(ns)
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
    };

    // Deployment → ReplicaSet → Pods, and `rollout status` finishes.
    k.ok(&["create", "namespace", "shop"]);
    k.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "shop",
        "--image",
        "nginx:1",
        "--replicas",
        "3",
    ]);
    rolled_out(k, "shop", "web");
    assert_eq!(running("shop"), 3);
    let rs = held_in(fleet, "replicasets.apps", "shop");
    assert_eq!(rs.len(), 1);
    let first_rs = rs[0]["metadata"]["name"].as_str().unwrap().to_string();
    assert!(first_rs.starts_with("web-"), "{first_rs}");
    for pod in pods("shop") {
        assert_eq!(
            pod["metadata"]["ownerReferences"][0]["name"],
            first_rs.as_str()
        );
        assert!(pod["spec"]["nodeName"].is_string(), "{pod}");
    }
    let deployment = held(fleet, "deployments.apps", "shop", "web").unwrap();
    assert_eq!(deployment["status"]["availableReplicas"], 3);
    assert_eq!(
        deployment["status"]["observedGeneration"],
        deployment["metadata"]["generation"]
    );
    let table = k.ok(&["get", "pods", "-n", "shop"]);
    assert_eq!(table.matches("Running").count(), 3, "{table}");

    // A new template: a new ReplicaSet, the old one scaled to zero.
    k.ok(&[
        "set",
        "image",
        "deployment/web",
        "nginx=nginx:2",
        "-n",
        "shop",
    ]);
    rolled_out(k, "shop", "web");
    let rs = held_in(fleet, "replicasets.apps", "shop");
    assert_eq!(rs.len(), 2);
    for r in &rs {
        let old = r["metadata"]["name"] == first_rs.as_str();
        assert_eq!(r["spec"]["replicas"], if old { 0 } else { 3 }, "{r}");
    }
    eventually_blocking("three pods of nginx:2 only", || {
        let p = pods("shop");
        p.len() == 3
            && p.iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "nginx:2")
    });
    let history = k.ok(&["rollout", "history", "deployment/web", "-n", "shop"]);
    assert!(history.contains('2'), "{history}");

    // Scaling, and a deleted pod replaced.
    k.ok(&["scale", "deployment/web", "--replicas", "1", "-n", "shop"]);
    rolled_out(k, "shop", "web");
    eventually_blocking("one pod", || pods("shop").len() == 1);
    let victim = pods("shop")[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    k.ok(&["delete", "pod", &victim, "-n", "shop"]);
    eventually_blocking("a replacement pod", || {
        let p = pods("shop");
        p.len() == 1 && p[0]["metadata"]["name"] != victim.as_str()
    });

    // Events, as kubectl describe reads them.
    let described = k.ok(&["describe", "deployment", "web", "-n", "shop"]);
    assert!(
        described.contains("ScalingReplicaSet") && described.contains("Scaled down replica set"),
        "{described}"
    );
    let events = k.ok(&["get", "events", "-n", "shop"]);
    assert!(events.contains("SuccessfulCreate"), "{events}");

    // The garbage collector: a deleted Deployment takes its ReplicaSets and pods.
    k.ok(&["delete", "deployment", "web", "-n", "shop"]);
    eventually_blocking("no replica sets or pods left", || {
        held_in(fleet, "replicasets.apps", "shop").is_empty() && pods("shop").is_empty()
    });

    // The namespace controller: a deleted namespace takes everything in it.
    k.ok(&["create", "namespace", "doomed"]);
    k.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "doomed",
        "--from-literal=a=1",
    ]);
    k.ok(&[
        "create",
        "deployment",
        "api",
        "-n",
        "doomed",
        "--image",
        "api:1",
    ]);
    rolled_out(k, "doomed", "api");
    assert_eq!(running("doomed"), 1);
    k.ok(&["delete", "namespace", "doomed"]);
    eventually_blocking("namespace doomed emptied", || {
        fleet.servers()[0]
            .cluster()
            .store
            .defs()
            .iter()
            .filter(|d| d.namespaced)
            .all(|d| held_in(fleet, &d.id(), "doomed").is_empty())
    });
    let out = k.ok(&["get", "all", "-n", "doomed"]);
    assert!(out.trim().is_empty(), "{out}");
}
