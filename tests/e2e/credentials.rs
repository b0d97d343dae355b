//! Exec credential plugins that misbehave, from the outside: `fleetscope serve` as a
//! process over a kubeconfig whose contexts use a failing plugin (a token on stdout,
//! a secret on stderr) and a hanging one (which starts a child). Neither leaks, hangs
//! the server, or outlives it.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::process::Server;
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{self, ListClustersRequest};
use fleetscope_sim::{FleetSpec, SimFleet};

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A kubeconfig with the fleet's first context as is, and two more on the same
/// server whose users run `failing` and `hanging`.
fn kubeconfig(fleet: &SimFleet, failing: &Path, hanging: &Path) -> String {
    let mut contexts = fleet.contexts();
    contexts.truncate(1);
    let good = contexts[0].clone();
    for name in ["failing", "hanging"] {
        let mut c = good.clone();
        c.name = name.into();
        contexts.push(c);
    }
    let mut kc = fleetscope_sim::kubeconfig(&contexts);
    for (i, plugin) in [(1, failing), (2, hanging)] {
        kc["users"][i]["user"] = serde_json::json!({
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": plugin.display().to_string(),
                "interactiveMode": "Never",
            }
        });
    }
    serde_json::to_string_pretty(&kc).unwrap()
}

/// Whether a process still runs (a zombie waiting to be reaped does not).
fn running(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && stat.split_whitespace().nth(2) != Some("Z")
}

async fn cluster_status(url: &str, name: &str) -> proto::Cluster {
    let mut c = FleetClient::connect(url.to_string()).await.unwrap();
    c.list_clusters(ListClustersRequest {
        clusters: vec![name.into()],
    })
    .await
    .unwrap()
    .into_inner()
    .clusters
    .remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_hanging_plugins_never_leak_hang_or_outlive_the_server() {
    let fleet = SimFleet::start(&FleetSpec::numbered(1, 20, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let failing = script(
        dir.path(),
        "fail-plugin",
        r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"TOPSECRET-abc123"}}'
echo 'login failed for token TOPSECRET-abc123: password=hunter2' >&2
echo 'the password is hunter3, password - hunter4, pw=hunter5' >&2
exit 7"#,
    );
    let hanging = script(
        dir.path(),
        "hang-plugin",
        &format!(
            "sleep 600 &\necho $! >> {p}\necho $$ >> {p}\nwait",
            p = pids.display()
        ),
    );
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, kubeconfig(&fleet, &failing, &hanging)).unwrap();
    let log = dir.path().join("serve.log");

    // With a short plugin timeout: the failing plugin is reported by name and status,
    // the hanging one as an error naming it, and nothing secret reaches a caller.
    let mut server = Server::start(
        &path,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--exec-timeout",
            "1s",
        ],
        &log,
    );
    let url = server.url();
    common::wait_serving(&url).await;
    let (failed, hung) = common::eventually("both clusters reported", async || {
        let failed = cluster_status(&url, "failing").await;
        let hung = cluster_status(&url, "hanging").await;
        if !failed.last_error.is_empty() && hung.freshness == proto::Freshness::Error as i32 {
            Ok((failed, hung))
        } else {
            Err(format!("{failed:#?} {hung:#?}"))
        }
    })
    .await;
    for (error, says) in [
        (&failed.last_error, "fail-plugin"),
        (&failed.last_error, "exit status 7"),
        (&hung.last_error, "hang-plugin"),
        (&hung.last_error, "did not finish"),
    ] {
        assert!(error.contains(says), "{error}");
    }
    let mut c = FleetClient::connect(url.clone()).await.unwrap();
    let listed = c
        .list(proto::ListRequest {
            query: Some(proto::Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let hung_answer = listed
        .clusters
        .iter()
        .find(|f| f.cluster == "hanging")
        .unwrap();
    assert_eq!(hung_answer.freshness, proto::Freshness::Error as i32);
    assert!(
        hung_answer.message.contains("hang-plugin"),
        "answers name the plugin: {}",
        hung_answer.message
    );
    let everything = format!("{failed:?}{hung:?}{listed:?}");
    for secret in ["TOPSECRET", "abc123", "hunter"] {
        assert!(!everything.contains(secret), "{secret} reached a caller");
    }
    server.kill();
    let logged = std::fs::read_to_string(&log).unwrap();
    for secret in ["TOPSECRET", "abc123", "hunter"] {
        assert!(
            !logged.contains(secret),
            "{secret} reached the log:\n{logged}"
        );
    }
    let _ = std::fs::remove_file(&pids);

    // With a long timeout, SIGTERM still ends the server within its grace period
    // while the plugin hangs, and takes the plugin and its child with it.
    let mut server = Server::start(
        &path,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--exec-timeout",
            "10m",
        ],
        &log,
    );
    // (Not ready: a cluster is still connecting through the plugin.)
    let plugin_pids = common::eventually("the hanging plugin runs", async || {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let found: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        (found.len() >= 2).then_some(found)
    })
    .await;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = common::eventually_within(
        Duration::from_secs(30),
        "serve ends within its grace period after SIGTERM",
        async || server.child.try_wait().unwrap(),
    )
    .await;
    assert!(status.success(), "serve ended with {status}");
    for pid in &plugin_pids {
        common::eventually_within(
            Duration::from_secs(20),
            format!("plugin process {pid} ends with the server"),
            async || !running(pid),
        )
        .await;
    }
}
