//! A cluster outage in the log, from the outside: `fleetscope serve` as a process over
//! two simulated clusters collecting three types each; one cluster goes offline until
//! every one of its streams has failed, and comes back. The log says so once when it
//! fails (with the address and the cause) and once when it recovers, not a line per
//! stream per retry; the other cluster is not named.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::process::Server;
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{self};

fn streams_of<'a>(
    r: &'a proto::ListClustersResponse,
    name: &str,
) -> Vec<&'a proto::ResourceStream> {
    r.clusters
        .iter()
        .filter(|c| c.name == name)
        .flat_map(|c| &c.streams)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_logged_once_when_it_begins_and_once_when_it_ends() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 40).await;
    let log = dir.path().join("serve.log");
    let mut server = Server::start(
        &kubeconfig,
        &["--no-persist", "--resources", "configmaps,pods,namespaces"],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let mut c = FleetClient::connect(server.url()).await.unwrap();
    let watching = |r: &proto::ListClustersResponse, name: &str| {
        let s = streams_of(r, name);
        s.len() == 3 && s.iter().all(|s| s.state() == proto::StreamState::Watching)
    };
    common::wait_for_clusters(&mut c, "both synced", |r| {
        watching(r, "sim-1") && watching(r, "sim-2")
    })
    .await;

    let sim2 = &fleet.servers()[1];
    sim2.go_offline().await;
    common::wait_for_clusters(&mut c, "every sim-2 stream failed", |r| {
        let s = streams_of(r, "sim-2");
        s.len() == 3 && s.iter().all(|s| s.state() == proto::StreamState::Failed)
    })
    .await;
    sim2.come_online().await.unwrap();
    common::wait_for_clusters(&mut c, "sim-2 back", |r| watching(r, "sim-2")).await;
    server.assert_running(&log);
    // The recovery is logged as the streams come back: wait for the line.
    common::eventually("the recovery is logged", async || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("cluster recovered")
    })
    .await;

    let text = std::fs::read_to_string(&log).unwrap();
    let lines = |what: &str| {
        text.lines()
            .filter(|l| l.contains(what))
            .collect::<Vec<_>>()
    };
    let failing = lines("cluster failing");
    assert_eq!(failing.len(), 1, "{text}");
    assert!(failing[0].contains("sim-2"), "{}", failing[0]);
    assert!(
        failing[0].contains(&sim2.url().trim_end_matches('/').to_string()),
        "the address: {}",
        failing[0]
    );
    let recovered = lines("cluster recovered");
    assert_eq!(recovered.len(), 1, "{text}");
    assert!(
        recovered[0].contains("sim-2") && recovered[0].contains("down_for"),
        "{}",
        recovered[0]
    );
    assert!(
        lines("stream failed").is_empty(),
        "no line per stream: {text}"
    );
    // Nor a line per failed request from kube's client: the one ERROR is fleetscope's.
    let errors = lines(" ERROR ");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(lines("kube_client").is_empty(), "{text}");
    server.kill();
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_api_server_answers_malformed_json_reads_as_an_error_saying_so() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(2, 40).await;
    // sim-2 answers every list and watch of configmaps with a body that is not JSON.
    fleet.servers()[1].cluster().garble(Some("configmaps"));
    let log = dir.path().join("serve.log");
    let server = Server::start(
        &kubeconfig,
        &["--no-persist", "--resources", "configmaps,namespaces"],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let mut c = FleetClient::connect(server.url()).await.unwrap();
    let r = common::wait_for_clusters(&mut c, "sim-2 in error, sim-1 synced", |r| {
        let freshness = |name: &str| {
            r.clusters
                .iter()
                .find(|c| c.name == name)
                .map(|c| c.freshness)
        };
        freshness("sim-1") == Some(proto::Freshness::Synced as i32)
            && freshness("sim-2") == Some(proto::Freshness::Error as i32)
    })
    .await;
    let sim2 = r.clusters.iter().find(|c| c.name == "sim-2").unwrap();
    assert!(!sim2.last_error.is_empty(), "{sim2:#?}");
    assert!(
        !sim2.last_error.contains("initial list in progress"),
        "{sim2:#?}"
    );
    let stream = streams_of(&r, "sim-2")
        .into_iter()
        .find(|s| s.resource == "configmaps")
        .unwrap();
    assert!(!stream.last_error.is_empty(), "{stream:#?}");
    // The API server mends: the stream syncs and the error goes.
    fleet.servers()[1].cluster().garble(None);
    common::wait_for_clusters(&mut c, "sim-2 synced", |r| {
        r.clusters
            .iter()
            .all(|c| c.freshness == proto::Freshness::Synced as i32 && c.last_error.is_empty())
    })
    .await;
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_unreachable_from_the_start_is_logged_once_not_per_request() {
    let (fleet, dir, kubeconfig) = common::fleet_with_an_unreachable_cluster(20).await;
    let log = dir.path().join("serve.log");
    let metrics = format!("127.0.0.1:{}", common::process::free_port());
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--metrics-listen",
            &metrics,
        ],
        &log,
    );
    common::wait_serving(&server.url()).await;
    // Several requests to it have failed (it is retried with backoff).
    let failed = || async {
        let body = common::scrape(&metrics).await?;
        Some(
            body.lines()
                .filter(|l| {
                    l.starts_with(
                        "fleetscope_rest_client_requests_total{cluster=\"gone\",code=\"<error>\"",
                    )
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>(),
        )
    };
    common::eventually("requests to it fail", async || {
        failed().await.unwrap_or(0) >= 3
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert_eq!(
        errors.len(),
        1,
        "one line for the cluster, none per request: {errors:#?}"
    );
    assert!(errors[0].contains("gone"), "{}", errors[0]);
    // A count drawing on it says so, as a list does.
    let out = std::process::Command::new(common::process::BIN)
        .args(["count", "configmaps", "--server", &server.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning: cluster gone is"), "{err}");
    drop(server);
    fleet.shutdown().await;
}
