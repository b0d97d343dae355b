//! `-- kube-api`: the Kubernetes API front end against gRPC, over the same `serve`
//! (release binary) of simulated clusters of pods: every pod listed in pages of 500
//! (objects per second, each way); a kube-rs reflector's first sync of every pod
//! through the fleet's path against reflectors of each cluster directly (time and the
//! client's peak memory, each in a process of its own); and Watch delivery to
//! `FLEET_BENCH_KUBE_SUBSCRIBERS` (200) subscribers, each way, while pods change at
//! 50 per second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::AsyncBufReadExt as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{reflector, watcher};

use super::{
    Proc, Ring, Written, changes_delivered, client_at, counts_all, delay_of, env_usize, free_port,
    kube_client, list_everything, percentile, pod_clusters, pod_serving, run_child,
};

/// A kube-rs client of the fleet's view at the Kubernetes API listening on `api`.
fn fleet_view(api: &str) -> kube::Client {
    kube::Client::try_from(kube::Config::new(
        format!("http://{api}/clusters/*").parse().unwrap(),
    ))
    .unwrap()
}

/// Every pod listed by gRPC and by the Kubernetes API, alternating, three rounds
/// after a warm one: objects per second each way.
async fn alternating(
    grpc: &mut fleetscope_proto::fleet_client::FleetClient<tonic::transport::Channel>,
    kube: &kube::Client,
    total: u64,
) -> (Vec<f64>, Vec<f64>) {
    let (mut by_grpc, mut by_kube) = (Vec::new(), Vec::new());
    for round in 0..4 {
        let (d1, n1) = list_everything(grpc).await;
        let (d2, n2) = list_kube(kube).await;
        assert_eq!((n1 as u64, n2 as u64), (total, total));
        if round > 0 {
            by_grpc.push(total as f64 / d1.as_secs_f64());
            by_kube.push(total as f64 / d2.as_secs_f64());
        }
    }
    (by_grpc, by_kube)
}

/// The part: prints its figures.
pub async fn kube_api() {
    let clusters = 6;
    let pods = env_usize("FLEET_BENCH_KUBE_PODS", 100_000 / clusters);
    let total = (clusters * pods) as u64;
    let dir = tempfile::tempdir().unwrap();
    let (servers, kubeconfig, _) = pod_clusters(clusters, pods, 0, dir.path()).await;
    let kc = kubeconfig.display().to_string();
    let api = format!("127.0.0.1:{}", free_port());
    let args = [
        &pod_serving(&kc)[..],
        &[
            "--kube-api-listen",
            &api,
            "--grpc-max-watches-per-caller",
            "1000",
        ],
    ]
    .concat();
    let (server, port) = Proc::serve(&args);
    let mut grpc = client_at(port).await;
    counts_all(&mut grpc, total).await;
    let kube = fleet_view(&api);
    let (by_grpc, by_kube) = alternating(&mut grpc, &kube, total).await;
    let k = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.0}k", x / 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "kube-api: all {total} pods in pages of 500, objects/s: gRPC List {}; Kubernetes API list {} ({:.2} × gRPC's time, goal ≤ 1.5)",
        k(&by_grpc),
        k(&by_kube),
        mean(&by_grpc) / mean(&by_kube)
    );

    // Through a router over three replicas: the whole list each way.
    let routed_api = format!("127.0.0.1:{}", free_port());
    let ring = Ring::with_routers_given(
        &kc,
        &pod_serving(&kc),
        1,
        (3, 1),
        &["--kube-api-listen", &routed_api],
    );
    let mut routed = client_at(ring.router_port()).await;
    counts_all(&mut routed, total).await;
    let (by_grpc, by_kube) = alternating(&mut routed, &fleet_view(&routed_api), total).await;
    println!(
        "kube-api: through a router over three replicas, objects/s: gRPC List in pages of 500 {}; Kubernetes API list (one answer, written as the router's Watch sends it) {} ({:.2} × gRPC's time); router resident {:.0} MiB, at its peak {:.0} MiB",
        k(&by_grpc),
        k(&by_kube),
        mean(&by_grpc) / mean(&by_kube),
        ring.router_rss().0 as f64 / (1 << 20) as f64,
        ring.router_rss().1 as f64 / (1 << 20) as f64
    );
    drop(ring);

    // A reflector's first sync, each in a process of its own.
    for which in ["direct", "fleet", "direct", "fleet"] {
        let got = run_child(
            &["--reflector-child", which, &kc, &api, &total.to_string()],
            "REFLECTOR ",
        );
        let figures: Vec<f64> = got[0]
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let what = match which {
            "direct" => "one reflector per cluster, from the clusters",
            _ => "one reflector of the fleet's path, from fleetscope",
        };
        println!(
            "kube-api: reflector first sync of {total} pods, {what}: {:.2} s, client peak memory {:.0} MiB",
            figures[0],
            figures[1] / (1 << 20) as f64
        );
    }

    // Watch delivery, each way.
    let subscribers = env_usize("FLEET_BENCH_KUBE_SUBSCRIBERS", 200);
    for (round, name) in [(1, "gRPC Watch"), (2, "Kubernetes API watch")] {
        let written: Arc<std::sync::Mutex<Written>> = Arc::default();
        let delays: Arc<std::sync::Mutex<Vec<Duration>>> = Arc::default();
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(subscribers);
        let mut tasks = Vec::new();
        let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let from = list_kube_page(&kube, "limit=1").await.0;
        for _ in 0..subscribers {
            let (seen, ready) = (delay_of(written.clone(), delays.clone()), ready_tx.clone());
            tasks.push(if round == 1 {
                tokio::spawn(grpc_subscriber(channel.clone(), ready, seen))
            } else {
                tokio::spawn(kube_subscriber(kube.clone(), from.clone(), ready, seen))
            });
        }
        for _ in 0..subscribers {
            ready_rx.recv().await.unwrap();
        }
        let want =
            changes_delivered(&servers, (pods, round), &written, (&delays, subscribers)).await;
        for t in tasks {
            t.abort();
        }
        let mut d = delays.lock().unwrap().clone();
        println!(
            "kube-api: {subscribers} watches of every pod, 500 changes at 50/s, {name}: {} of {want} events; delay p50 {:.1} ms, p99 {:.1} ms",
            d.len(),
            percentile(&mut d, 0.5).as_secs_f64() * 1e3,
            percentile(&mut d, 0.99).as_secs_f64() * 1e3
        );
    }
    drop(server);
}

/// One page of pods of the fleet's path with `query`: its resourceVersion, its
/// `continue`, how many items.
async fn list_kube_page(kube: &kube::Client, query: &str) -> (String, String, usize) {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion", default)]
        resource_version: String,
        #[serde(rename = "continue", default)]
        next: String,
    }
    #[derive(serde::Deserialize)]
    struct Page {
        metadata: Meta,
        items: Vec<serde::de::IgnoredAny>,
    }
    let request = http::Request::get(format!("/api/v1/pods?{query}"))
        .body(Vec::new())
        .unwrap();
    let text = kube.request_text(request).await.unwrap();
    let page: Page = serde_json::from_str(&text).unwrap();
    (
        page.metadata.resource_version,
        page.metadata.next,
        page.items.len(),
    )
}

/// Every pod of the fleet's path in pages of 500: how long, and how many.
async fn list_kube(kube: &kube::Client) -> (Duration, usize) {
    let t = Instant::now();
    let (mut next, mut n) = (String::new(), 0);
    loop {
        let query = match next.as_str() {
            "" => "limit=500".to_string(),
            c => format!("limit=500&continue={c}"),
        };
        let (_, c, items) = list_kube_page(kube, &query).await;
        n += items;
        if c.is_empty() {
            return (t.elapsed(), n);
        }
        next = c;
    }
}

/// A gRPC Watch of every pod from now, calling `seen` with each object's cluster and name.
pub async fn grpc_subscriber(
    channel: tonic::transport::Channel,
    ready: tokio::sync::mpsc::Sender<()>,
    seen: impl Fn(String, String),
) {
    let mut client = fleetscope::proto::fleet_client::FleetClient::new(channel);
    let mut stream = client
        .watch(fleetscope::proto::WatchRequest {
            query: Some(super::pods_query()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let _ = ready.send(()).await;
    while let Ok(Some(e)) = stream.message().await {
        if let Some(o) = e.object {
            seen(o.cluster, o.name);
        }
    }
}

/// A watch of every pod of the fleet's path from `from`, read line by line, calling
/// `seen` with each object's cluster and name (the fleet's name is `CLUSTER:NAME`).
async fn kube_subscriber(
    kube: kube::Client,
    from: String,
    ready: tokio::sync::mpsc::Sender<()>,
    seen: impl Fn(String, String),
) {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default)]
        name: String,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Meta,
    }
    #[derive(serde::Deserialize)]
    struct Event {
        object: Object,
    }
    let request = http::Request::get(format!("/api/v1/pods?watch=true&resourceVersion={from}"))
        .body(Vec::new())
        .unwrap();
    let body = kube.request_stream(request).await.unwrap();
    let _ = ready.send(()).await;
    let mut lines = std::pin::pin!(body.lines());
    while let Some(Ok(line)) = lines.next().await {
        let Ok(e) = serde_json::from_str::<Event>(&line) else {
            continue;
        };
        if let Some((cluster, name)) = e.object.metadata.name.split_once(':') {
            seen(cluster.to_string(), name.to_string());
        }
    }
}

/// `--reflector-child WHICH KUBECONFIG API TOTAL`: kube-rs reflectors of every pod,
/// `direct` (one per cluster of the kubeconfig) or `fleet` (one of fleetscope's fleet
/// path at `API`); prints `REFLECTOR <seconds to every pod held> <peak RSS bytes>`.
pub async fn reflector_child(which: &str, kubeconfig: &str, api: &str, total: usize) {
    let t = Instant::now();
    let path = std::path::Path::new(kubeconfig);
    let clients = if which == "fleet" {
        let url = format!("http://{api}/clusters/*").parse().unwrap();
        vec![kube::Client::try_from(kube::Config::new(url)).unwrap()]
    } else {
        let contexts = kube::config::Kubeconfig::read_from(path).unwrap().contexts;
        let mut clients = Vec::new();
        for c in contexts {
            clients.push(kube_client(path, &c.name).await);
        }
        clients
    };
    let mut stores = Vec::new();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(clients.len());
    for client in clients {
        let (reader, writer) = reflector::store::<Pod>();
        stores.push(reader);
        let done = done_tx.clone();
        tokio::spawn(async move {
            let events = reflector(
                writer,
                watcher(kube::Api::all(client), watcher::Config::default()),
            );
            let mut events = std::pin::pin!(events);
            while let Some(e) = events.next().await {
                if matches!(e, Ok(watcher::Event::InitDone)) {
                    let _ = done.send(()).await;
                }
            }
        });
    }
    for _ in 0..stores.len() {
        done_rx.recv().await.unwrap();
    }
    let held: usize = stores.iter().map(|s| s.state().len()).sum();
    assert_eq!(held, total, "every pod held");
    let peak = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    println!("REFLECTOR {} {peak}", t.elapsed().as_secs_f64());
}
