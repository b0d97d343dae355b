//! Bounds on what one client can take, from the outside: `fleetscope serve` as a
//! process, hostile but legitimate requests from real gRPC clients, each answered
//! with a clear status while the server goes on serving others.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::PATIENCE;
use common::process::Server;
use common::subscriber::configmaps;
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{self, WatchRequest};
use tonic::Code;

/// Sends raw bytes as a method's request message.
#[derive(Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut as _;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf as _;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn raw_call(url: &str, method: &'static str, body: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Channel::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc.unary::<Vec<u8>, Vec<u8>, Raw>(
        tonic::Request::new(body),
        http::uri::PathAndQuery::from_static(method),
        Raw,
    )
    .await
    .expect_err("refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_bounded_and_answered_clearly() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 60).await;
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let metrics = format!("127.0.0.1:{}", common::process::free_port());
    let server = Server::start(
        &kubeconfig,
        &[
            "--metrics-listen",
            &metrics,
            "--data-dir",
            data.to_str().unwrap(),
            "--resources",
            "configmaps",
            "--grpc-max-watches-per-caller",
            "2",
            "--watch-stall-timeout",
            "300ms",
        ],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let mut c = FleetClient::connect(server.url()).await.unwrap();
    common::wait_for_clusters(&mut c, "synced", |r| {
        r.clusters
            .iter()
            .all(|c| c.freshness == proto::Freshness::Synced as i32)
            && !r.clusters.is_empty()
    })
    .await;

    // At rest: the data directory is the server's user's alone.
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700);
        let mut pending = vec![data.clone()];
        let mut files = 0;
        while let Some(d) = pending.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    assert_eq!(mode(&p), 0o700, "{p:?}");
                    pending.push(p);
                } else {
                    assert_eq!(mode(&p), 0o600, "{p:?}");
                    files += 1;
                }
            }
        }
        assert!(files > 0);
    }

    // A huge selector is refused, naming the limit, without repeating itself.
    let e = c
        .count(proto::CountRequest {
            query: Some(proto::Query {
                field_selector: "metadata.name!=x,".repeat(80_000),
                ..configmaps()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("limit of 16384"), "{}", e.message());
    assert!(e.message().len() < 1100, "{}", e.message().len());
    let e = c
        .count(proto::CountRequest {
            query: Some(configmaps()),
            group_by: vec!["cluster".into(); 20],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("limit of 8"), "{}", e.message());

    // Malformed protobuf is the client's mistake; an oversized message too large.
    let e = raw_call(
        &server.url(),
        "/fleetscope.v1.Fleet/Count",
        vec![0x0a, 0xff, 0xff, 0xff],
    )
    .await;
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e = raw_call(
        &server.url(),
        "/fleetscope.v1.Fleet/Count",
        vec![0u8; 5 << 20],
    )
    .await;
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");

    // A forged page token is invalid, not expired.
    let e = c
        .list(proto::ListRequest {
            page_token: "eyJyIjoxfQ.AAAA".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Watch streams per caller are capped; ending one frees its place.
    let watch = |c: &mut FleetClient<tonic::transport::Channel>| {
        let mut c = c.clone();
        async move {
            c.watch(WatchRequest {
                query: Some(configmaps()),
                ..Default::default()
            })
            .await
        }
    };
    let first = watch(&mut c).await.unwrap().into_inner();
    let _second = watch(&mut c).await.unwrap().into_inner();
    let e = watch(&mut c).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("2 Watch streams"), "{}", e.message());
    // A stream the client ends leaves the count at once: its place is taken again
    // without retrying, and so are all of them after every one is dropped.
    drop(first);
    let third = watch(&mut c).await.unwrap().into_inner();
    drop(_second);
    drop(third);
    let again = [
        watch(&mut c).await.unwrap().into_inner(),
        watch(&mut c).await.unwrap().into_inner(),
    ];
    drop(again);
    // The same after the client's whole connection goes away, as on a reconnect.
    let mut other = FleetClient::connect(server.url()).await.unwrap();
    let held = [
        watch(&mut other).await.unwrap().into_inner(),
        watch(&mut other).await.unwrap().into_inner(),
    ];
    drop(held);
    drop(other);
    let mut unread = watch(&mut c).await.unwrap().into_inner();
    let _also = watch(&mut c).await.unwrap().into_inner();
    drop(_also);
    let store = &fleet.servers()[0].cluster().store;
    let filler = "x".repeat(4096);
    let mut i = 0;
    // Fed more than the transport buffers hold, until the server gives up on it: then no
    // Watch is open (every other one was dropped).
    common::eventually("the unread Watch is ended", async || {
        let series = "fleetscope_watch_subscribers_dropped_total{reason=\"unread\"}";
        let dropped = common::sample(&metrics, series).await;
        if dropped == Some(1) {
            return Ok(());
        }
        for _ in 0..200 {
            store
                .create(
                    "configmaps",
                    Some("team-0"),
                    serde_json::json!({"metadata": {"name": format!("fill-{i}")}, "data": {"v": filler}}),
                )
                .unwrap();
            i += 1;
        }
        Err(dropped)
    })
    .await;
    let ended = loop {
        match tokio::time::timeout(PATIENCE, unread.message())
            .await
            .expect("in time")
        {
            Ok(Some(_)) => {}
            Ok(None) => panic!("ended without saying why"),
            Err(s) => break s,
        }
    };
    assert_eq!(ended.code(), Code::ResourceExhausted);
    assert!(
        ended.message().contains("since_revision="),
        "{}",
        ended.message()
    );
    // Everyone else is still served.
    let count = c
        .count(proto::CountRequest {
            query: Some(configmaps()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(count.total > 0);
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_are_closed_and_connections_past_the_cap_refused_at_once() {
    use tokio::io::AsyncReadExt as _;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 20).await;
    let log = dir.path().join("serve.log");
    let metrics = format!("127.0.0.1:{}", common::process::free_port());
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--grpc-max-connections",
            "2",
            "--grpc-handshake-timeout",
            "2s",
            "--metrics-listen",
            &metrics,
        ],
        &log,
    );
    // The connections the cap refused, as /metrics counts them.
    let refused = || {
        common::sample(
            &metrics,
            "fleetscope_grpc_connections_refused_total{reason=\"cap\"}",
        )
    };
    common::wait_serving(&server.url()).await;
    let addr = format!("127.0.0.1:{}", server.port);
    // Until the socket closes (EOF or reset).
    async fn closed(s: &mut tokio::net::TcpStream) {
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout(PATIENCE, s.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return,
                Ok(Ok(_)) => {}
                Err(_) => panic!("the socket stayed open"),
            }
        }
    }
    // One client holding a connection, one socket that never speaks: the cap of two.
    let mut c = FleetClient::connect(server.url()).await.unwrap();
    c.list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap();
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // Past the cap: closed at once, and counted.
    common::eventually("the cap is counted", async || {
        if refused().await.unwrap_or(0) > 0 {
            return true;
        }
        let mut over = tokio::net::TcpStream::connect(&addr).await.unwrap();
        closed(&mut over).await;
        false
    })
    .await;
    // The idle socket is closed once its handshake time is up.
    closed(&mut idle).await;
    // Its place is free again: a new client is served.
    common::eventually(
        "a new client is served",
        async || match FleetClient::connect(server.url()).await {
            Ok(mut other) => other
                .list_clusters(proto::ListClustersRequest::default())
                .await
                .is_ok(),
            Err(_) => false,
        },
    )
    .await;
    // The first client was never disturbed.
    c.list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap();
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_drops_its_watches_opens_as_many_again_at_once() {
    const CAP: usize = 300;
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 20).await;
    let log = dir.path().join("serve.log");
    let cap = CAP.to_string();
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--grpc-max-watches-per-caller",
            &cap,
        ],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let open = |channel: tonic::transport::Channel, n: usize| async move {
        let mut streams = Vec::new();
        for _ in 0..n {
            let mut c = FleetClient::new(channel.clone());
            let w = c
                .watch(WatchRequest {
                    query: Some(configmaps()),
                    ..Default::default()
                })
                .await;
            streams.push(w.map(tonic::Response::into_inner));
        }
        streams
    };
    let connect = || async {
        tonic::transport::Channel::from_shared(server.url())
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    // Three rounds: the cap opened, every stream dropped (the last time with its
    // connection, as a client that reconnects), the cap opened again at once.
    let mut channel = connect().await;
    for round in 0..3 {
        let streams = open(channel.clone(), CAP).await;
        let refused: Vec<_> = streams.iter().filter_map(|s| s.as_ref().err()).collect();
        assert!(
            refused.is_empty(),
            "round {round}: {} refused, first: {:?}",
            refused.len(),
            refused.first()
        );
        let over = open(channel.clone(), 1).await.pop().unwrap();
        assert_eq!(
            over.unwrap_err().code(),
            Code::ResourceExhausted,
            "the cap holds"
        );
        drop(streams);
        if round == 1 {
            channel = connect().await;
        }
    }
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_of_more_groups_than_the_limit_is_refused_and_a_coarser_one_answered() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 10).await;
    let store = &fleet.servers()[0].cluster().store;
    let over = fleetscope::grpc::MAX_GROUPS + 1;
    for i in 0..over {
        store
            .create(
                "configmaps",
                Some("team-0"),
                serde_json::json!({"metadata": {"name": format!("g-{i}")}}),
            )
            .unwrap();
    }
    let log = dir.path().join("serve.log");
    let server = Server::start(
        &kubeconfig,
        &["--no-persist", "--resources", "configmaps"],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let mut c = FleetClient::connect(server.url()).await.unwrap();
    let count = |group_by: &str| {
        let mut c = c.clone();
        let group_by = group_by.to_string();
        async move {
            c.count(proto::CountRequest {
                query: Some(configmaps()),
                group_by: vec![group_by],
            })
            .await
        }
    };
    common::eventually(
        "synced",
        async || matches!(count("namespace").await, Ok(r) if r.get_ref().total as usize >= over),
    )
    .await;
    let e = count("field:metadata.name").await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("50000"), "{}", e.message());
    c.list_clusters(proto::ListClustersRequest::default())
        .await
        .unwrap();
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_client_stops_answering_leaves_the_count_after_the_keepalive() {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 20).await;
    let log = dir.path().join("serve.log");
    let server = Server::start(
        &kubeconfig,
        &[
            "--no-persist",
            "--resources",
            "configmaps",
            "--grpc-max-watches-per-caller",
            "1",
            "--grpc-keepalive-interval",
            "1s",
            "--grpc-keepalive-timeout",
            "1s",
        ],
        &log,
    );
    common::wait_serving(&server.url()).await;
    let mut c = FleetClient::connect(server.url()).await.unwrap();
    let watch = |c: &mut FleetClient<tonic::transport::Channel>| {
        let mut c = c.clone();
        async move {
            c.watch(WatchRequest {
                query: Some(configmaps()),
                ..Default::default()
            })
            .await
        }
    };
    // Another process holds the caller's one Watch, then hangs (SIGSTOP): it answers
    // nothing any more, not even HTTP/2 PINGs.
    let mut held = std::process::Command::new(common::process::BIN)
        .args(["watch", "configmaps", "--server", &server.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::eventually("the other process watches", async || {
        match watch(&mut c).await {
            Err(e) if e.code() == Code::ResourceExhausted => true,
            Ok(w) => {
                drop(w);
                false
            }
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &held.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let hung = tokio::time::Instant::now();
    let _mine = common::eventually("the hung client's Watch leaves", async || {
        match watch(&mut c).await {
            Ok(w) => Ok(w),
            Err(e) if e.code() == Code::ResourceExhausted => Err(e),
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    eprintln!(
        "a hung client's Watch left the count {:?} after it hung",
        hung.elapsed()
    );
    let _ = held.kill();
    let _ = held.wait();
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_with_a_label_bomb_costs_about_its_size_and_is_still_selected() {
    let Served {
        fleet,
        dir: _dir,
        log,
        server,
        metrics,
        mut client,
    } = serving_configmaps(&[]).await;
    let c = &mut client;
    let listed = async |c: &mut FleetClient<tonic::transport::Channel>, selector: &str| {
        let mut names: Vec<String> = c
            .list(proto::ListRequest {
                query: Some(proto::Query {
                    label_selector: selector.into(),
                    ..configmaps()
                }),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().items.into_iter().map(|o| o.name).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    let before = server.resident_bytes().unwrap();
    // Two ConfigMaps of 60,000 labels each (about 0.9 MB of JSON each, which an API
    // server takes), one of them with a label the others carry too.
    let store = &fleet.servers()[0].cluster().store;
    for bomb in ["bomb-1", "bomb-2"] {
        let mut labels: serde_json::Map<String, serde_json::Value> = (0..60_000)
            .map(|i| (format!("{bomb}-{i:05}"), serde_json::json!("x")))
            .collect();
        if bomb == "bomb-1" {
            labels.insert("kind".into(), serde_json::json!("bomb-or-plain"));
        }
        store
            .create(
                "configmaps",
                Some("team-0"),
                serde_json::json!({"metadata": {"name": bomb, "labels": labels}}),
            )
            .unwrap();
    }
    store
        .create(
            "configmaps",
            Some("team-0"),
            serde_json::json!({"metadata": {"name": "plain", "labels": {"kind": "bomb-or-plain"}}}),
        )
        .unwrap();
    // Selected by any of their labels, beside objects whose labels are indexed.
    common::eventually("the bombs arrive", async || {
        listed(c, "bomb-2-54321=x").await == ["bomb-2"]
    })
    .await;
    assert_eq!(listed(c, "kind=bomb-or-plain").await, ["bomb-1", "plain"]);
    assert_eq!(listed(c, "bomb-1-00007").await, ["bomb-1"]);
    assert!(
        !listed(c, "!bomb-1-00007")
            .await
            .contains(&"bomb-1".to_string())
    );
    // Served whole.
    let got = c
        .get(proto::GetRequest {
            resource: "configmaps".into(),
            cluster: "sim-1".into(),
            namespace: "team-0".into(),
            name: "bomb-2".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let v: serde_json::Value = serde_json::from_str(&got.object.unwrap().json).unwrap();
    assert_eq!(v["metadata"]["labels"].as_object().unwrap().len(), 60_000);
    // Counted, by stream.
    let series =
        "fleetscope_objects_labels_unindexed_total{cluster=\"sim-1\",resource=\"configmaps\"}";
    assert_eq!(common::sample(&metrics, series).await, Some(2));
    // Once what decoding them took is given back, the two hold a few of their sizes
    // (each took about 80 MB when every label was indexed).
    let grown = || server.resident_bytes().unwrap().saturating_sub(before);
    common::eventually(
        "at most 24 MB more held for two objects of 0.9 MB",
        async || {
            let mb = grown() >> 20;
            if mb <= 24 {
                Ok(())
            } else {
                Err(format!("{mb} MB"))
            }
        },
    )
    .await;
    eprintln!(
        "two objects of 60,000 labels: {:.1} MB more resident",
        grown() as f64 / 1e6
    );
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("more labels than the label index takes")
    );
    drop(server);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_api_server_s_versions_and_oversized_objects_are_dropped_and_counted() {
    let Served {
        fleet,
        dir: _dir,
        log,
        server,
        metrics,
        client: mut c,
    } = serving_configmaps(&["--max-object-bytes", "65536"]).await;
    let cluster = fleet.servers()[0].cluster();
    let event = |kind: &str, name: &str, rv: &str| {
        serde_json::json!({"type": kind, "object": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "team-0", "uid": format!("uid-{name}"), "resourceVersion": rv},
        }})
        .to_string()
    };
    let big = serde_json::json!({"type": "ADDED", "object": {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "huge-line", "namespace": "team-0", "uid": "uid-huge", "resourceVersion": "999999999"},
        "data": {"x": "y".repeat(4 << 20)},
    }})
    .to_string();
    let dropped = async |reason: &str| {
        let series = format!(
            "fleetscope_stream_dropped_total{{cluster=\"sim-1\",resource=\"configmaps\",reason=\"{reason}\"}}"
        );
        common::sample(&metrics, &series).await.unwrap_or(0)
    };
    let names = async |c: &mut FleetClient<tonic::transport::Channel>| -> Vec<String> {
        c.list(proto::ListRequest {
            query: Some(configmaps()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .items
        .into_iter()
        .map(|o| o.name)
        .collect()
    };
    // What no API server sends, on the live watch, each followed by a real change that
    // shows the watch went on past it (repeated, should a watch reconnect between).
    let mut round = 0;
    common::eventually("every hostile line dropped and counted", async || {
        round += 1;
        cluster.send_watch_line("configmaps", &event("ADDED", "abc-rv", "abc"));
        cluster.send_watch_line("configmaps", &event("ADDED", "negative-rv", "-1"));
        cluster.send_watch_line("configmaps", &event("MODIFIED", "behind-rv", "1"));
        cluster.send_watch_line(
            "configmaps",
            r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"zzz"}}}"#,
        );
        cluster.send_watch_line("configmaps", &big);
        // Too large as the cluster stores it, too.
        cluster
            .store
            .create(
                "configmaps",
                Some("team-0"),
                serde_json::json!({"metadata": {"name": format!("large-{round}")}, "data": {"x": "y".repeat(100_000)}}),
            )
            .unwrap();
        let marker = format!("after-{round}");
        cluster
            .store
            .create(
                "configmaps",
                Some("team-0"),
                serde_json::json!({"metadata": {"name": marker}}),
            )
            .unwrap();
        common::eventually(format!("{marker} arrives"), async || {
            names(&mut c).await.contains(&marker)
        })
        .await;
        let counts = [
            dropped("malformed_resource_version").await,
            dropped("backward_resource_version").await,
            dropped("too_large").await,
        ];
        if counts[0] >= 3 && counts[1] >= 1 && counts[2] >= 2 {
            Ok(())
        } else {
            Err(format!("dropped: {} malformed, {} behind, {} too large", counts[0], counts[1], counts[2]))
        }
    })
    .await;
    let held = names(&mut c).await;
    for never in ["abc-rv", "negative-rv", "behind-rv", "huge-line", "large-1"] {
        assert!(
            !held.iter().any(|n| n == never),
            "{never} was taken: {held:?}"
        );
    }
    // The stream stands where the cluster does, and goes on.
    let r = common::list_clusters(&mut c).await;
    assert_eq!(r.clusters[0].freshness, proto::Freshness::Synced as i32);
    let log = std::fs::read_to_string(&log).unwrap();
    for said in [
        "whose resourceVersion is not a number",
        "behind the stream's resourceVersion",
        "larger than the largest object taken",
    ] {
        assert!(log.contains(said), "{said}: {log}");
    }
    drop(server);
    fleet.shutdown().await;
}

/// A `serve` process over one simulated cluster's configmaps, synced.
struct Served {
    fleet: fleetscope_sim::SimFleet,
    dir: tempfile::TempDir,
    log: std::path::PathBuf,
    server: Server,
    /// The metrics listener's address.
    metrics: String,
    client: FleetClient<tonic::transport::Channel>,
}

/// `serve` with `more` flags over one simulated cluster's configmaps, with a metrics
/// listener, once its cluster reads synced.
async fn serving_configmaps(more: &[&str]) -> Served {
    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 10).await;
    let log = dir.path().join("serve.log");
    let metrics = format!("127.0.0.1:{}", common::process::free_port());
    let mut args = vec![
        "--no-persist",
        "--resources",
        "configmaps",
        "--metrics-listen",
        &metrics,
    ];
    args.extend_from_slice(more);
    let server = Server::start(&kubeconfig, &args, &log);
    common::wait_serving(&server.url()).await;
    let mut client = FleetClient::connect(server.url()).await.unwrap();
    common::wait_for_clusters(&mut client, "synced", |r| {
        r.clusters.len() == 1
            && r.clusters
                .iter()
                .all(|c| c.freshness == proto::Freshness::Synced as i32)
    })
    .await;
    Served {
        fleet,
        dir,
        log,
        server,
        metrics,
        client,
    }
}
