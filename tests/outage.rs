//! A cluster outage in the log, from the outside: `fleetscope serve` as a process over
//! two simulated clusters collecting three types each; one cluster goes offline until
//! every one of its streams has failed, and comes back. The log says so once when it
//! fails (with the address and the cause) and once when it recovers, not a line per
//! stream per retry; the other cluster is not named.

#![allow(clippy::unwrap_used)]

mod common;

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
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("cluster recovered")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the recovery is logged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

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
    server.kill();
    fleet.shutdown().await;
}
