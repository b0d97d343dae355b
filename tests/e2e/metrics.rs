//! Prometheus metrics from the outside: `fleetscope serve` as a process with
//! `--metrics-listen` and a data directory, scraped over HTTP while simulated clusters change, a Watch
//! opens and closes, and a cluster leaves the kubeconfig (its series go with it).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;

use common::process::{Server, free_port};
use common::sample_in;
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{Query, WatchRequest};
use fleetscope_sim::{FleetSpec, SimFleet};
use serde_json::json;

/// Scrapes until `check` holds, or panics with the last scrape.
async fn scrape_until(addr: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    common::eventually(what, async || {
        match common::http_get(addr, "/metrics").await {
            Some((200, body)) if check(&body) => Ok(body),
            other => Err(other),
        }
    })
    .await
}

fn write_kubeconfig(path: &Path, fleet: &SimFleet, names: &[&str]) {
    let contexts: Vec<_> = fleet
        .contexts()
        .into_iter()
        .filter(|c| names.contains(&c.name.as_str()))
        .collect();
    let tmp = path.with_extension("tmp");
    fleetscope_sim::write_kubeconfig(&tmp, &contexts).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_fleet_its_streams_and_its_subscribers() {
    let fleet = SimFleet::start(&FleetSpec::numbered(2, 20, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kube").join("config");
    std::fs::create_dir_all(kubeconfig.parent().unwrap()).unwrap();
    write_kubeconfig(&kubeconfig, &fleet, &["sim-1", "sim-2"]);
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("serve.log");
    let server = Server::start(
        &kubeconfig,
        &[
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--resources",
            "configmaps",
            "--metrics-listen",
            &metrics,
        ],
        &log,
    );
    // Ready once every cluster is discovered; healthy as soon as it answers.
    common::eventually("ready", async || {
        common::http_get(&metrics, "/readyz").await.map(|(c, _)| c) == Some(200)
    })
    .await;
    assert_eq!(common::http_get(&metrics, "/healthz").await.unwrap().0, 200);
    assert_eq!(
        common::http_get(&metrics, "/nothing-here").await.unwrap().0,
        404
    );

    let count = |i: usize| fleet.servers()[i].cluster().store.count("configmaps") as f64;
    let series = |name: &str, cluster: &str, extra: &str| {
        format!("{name}{{cluster=\"{cluster}\",resource=\"configmaps\"{extra}}}")
    };
    let body = scrape_until(&metrics, "both clusters synced", |b| {
        ["sim-1", "sim-2"].iter().enumerate().all(|(i, c)| {
            sample_in(b, &series("fleetscope_stream_synced", c, "")) == Some(1.0)
                && sample_in(b, &series("fleetscope_objects", c, "")) == Some(count(i))
        })
    })
    .await;
    // The process's own figures, as every Prometheus client exposes them.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = sample_in(&body, "process_start_time_seconds").unwrap();
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "{started} against {now}"
    );
    assert!(sample_in(&body, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(sample_in(&body, "process_virtual_memory_bytes").unwrap() > 1e6);
    assert!(sample_in(&body, "process_open_fds").unwrap() >= 3.0);
    assert!(
        sample_in(&body, "process_max_fds").unwrap()
            >= sample_in(&body, "process_open_fds").unwrap()
    );
    assert!(sample_in(&body, "process_cpu_seconds_total").unwrap() > 0.0);
    // The server's tasks, by name: an accept loop per listener (gRPC, metrics), this
    // scrape's connection.
    assert_eq!(
        sample_in(&body, "fleetscope_tasks{task=\"grpc-accept\"}"),
        Some(2.0),
        "{body}"
    );
    assert_eq!(
        sample_in(&body, "fleetscope_tasks{task=\"metrics-listener\"}"),
        Some(1.0)
    );
    assert!(sample_in(&body, "fleetscope_tasks{task=\"metrics-connection\"}").unwrap() >= 1.0);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains(&format!("metrics on http://{metrics}/metrics")),
        "the start-up line names the listener as served"
    );
    assert_eq!(
        sample_in(
            &body,
            &format!(
                "fleetscope_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        Some(1.0),
        "{body}"
    );
    for c in ["sim-1", "sim-2"] {
        let initial = series("fleetscope_relists_total", c, ",reason=\"initial\"");
        assert_eq!(sample_in(&body, &initial), Some(1.0), "{body}");
        let lag = series("fleetscope_sync_lag_seconds", c, "");
        assert_eq!(sample_in(&body, &lag), Some(0.0), "{body}");
    }
    // Every request to an API server counted, client-go's way: at least the LISTs
    // and WATCHes the simulated cluster saw (discovery and /version come on top).
    for (i, c) in ["sim-1", "sim-2"].iter().enumerate() {
        let sim = fleet.servers()[i].cluster();
        let seen = sim.requests_of(fleetscope_sim::Verb::List)
            + sim.requests_of(fleetscope_sim::Verb::Watch);
        let counted = sample_in(
            &body,
            &format!("fleetscope_rest_client_requests_total{{cluster=\"{c}\",code=\"200\",method=\"GET\"}}"),
        )
        .unwrap_or_else(|| panic!("{c}: {body}"));
        assert!(
            counted >= seen as f64 && seen >= 1,
            "{c}: {counted} counted, {seen} seen"
        );
    }
    assert_eq!(sample_in(&body, "fleetscope_watch_subscribers"), Some(0.0));
    assert_eq!(
        sample_in(&body, "fleetscope_config_last_reload_successful"),
        Some(1.0)
    );
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    // The store's writes, as a histogram whose last bucket holds them all.
    let writes = sample_in(&body, "fleetscope_store_write_seconds_count").unwrap();
    assert!(writes >= 1.0, "{body}");
    assert_eq!(
        sample_in(&body, "fleetscope_store_write_seconds_bucket{le=\"+Inf\"}"),
        Some(writes),
        "{body}"
    );
    assert!(sample_in(&body, "fleetscope_store_write_seconds_sum").unwrap() > 0.0);

    // A Watch open: counted while it lasts.
    common::wait_serving(&server.url()).await;
    let mut client = FleetClient::connect(server.url()).await.unwrap();
    let watch = client
        .watch(WatchRequest {
            query: Some(Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    scrape_until(&metrics, "one subscriber", |b| {
        sample_in(b, "fleetscope_watch_subscribers") == Some(1.0)
    })
    .await;

    // A change in sim-1: a watch event of its type, and one object more.
    fleet.servers()[0]
        .cluster()
        .store
        .create(
            "configmaps",
            Some("team-0"),
            json!({"metadata": {"name": "counted"}}),
        )
        .unwrap();
    scrape_until(&metrics, "the ADDED event counted", |b| {
        sample_in(
            b,
            &series("fleetscope_watch_events_total", "sim-1", ",type=\"ADDED\""),
        ) == Some(1.0)
            && sample_in(b, &series("fleetscope_objects", "sim-1", "")) == Some(count(0))
    })
    .await;

    // sim-2 leaves the kubeconfig: its series go with it.
    write_kubeconfig(&kubeconfig, &fleet, &["sim-1"]);
    let body = scrape_until(&metrics, "sim-2's series gone", |b| {
        !b.contains("cluster=\"sim-2\"")
    })
    .await;
    assert_eq!(
        sample_in(&body, &series("fleetscope_stream_synced", "sim-1", "")),
        Some(1.0)
    );

    // The Watch closed: no subscriber now, one ended.
    drop(watch);
    drop(client);
    scrape_until(&metrics, "the subscriber ended", |b| {
        sample_in(b, "fleetscope_watch_subscribers") == Some(0.0)
            && sample_in(b, "fleetscope_watch_subscribers_ended_total") == Some(1.0)
    })
    .await;

    // Every RPC counted by method and code, in go-grpc-prometheus's shape.
    let mut client = FleetClient::connect(server.url()).await.unwrap();
    let count = |resource: &str| fleetscope::proto::CountRequest {
        query: Some(Query {
            resource: resource.into(),
            ..Default::default()
        }),
        group_by: Vec::new(),
    };
    client.count(count("configmaps")).await.unwrap();
    client.count(count("*")).await.unwrap_err();
    let rpc = |method: &str, kind: &str, code: &str| {
        format!(
            "fleetscope_grpc_server_handled_total{{grpc_service=\"fleetscope.v1.Fleet\",grpc_method=\"{method}\",grpc_type=\"{kind}\",grpc_code=\"{code}\"}}"
        )
    };
    let body = scrape_until(&metrics, "the Counts counted", |b| {
        sample_in(b, &rpc("Count", "unary", "OK")) == Some(1.0)
            && sample_in(b, &rpc("Count", "unary", "InvalidArgument")) == Some(1.0)
    })
    .await;
    assert_eq!(
        sample_in(&body, &rpc("Watch", "server_stream", "Canceled")),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample_in(
            &body,
            "fleetscope_grpc_server_handling_seconds_count{grpc_service=\"fleetscope.v1.Fleet\",grpc_method=\"Count\",grpc_type=\"unary\"}"
        ),
        Some(2.0),
        "{body}"
    );
    drop(server);
    fleet.shutdown().await;
}
