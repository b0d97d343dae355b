//! Simulator figures: LIST throughput of 100k pods over loopback (plain HTTP and
//! HTTPS, whole and in pages of 500), and the memory of 1M small objects in one
//! cluster. Prints figures; asserts nothing.
//!
//! `cargo bench -p fleetscope-sim --bench sim` (set `SIM_BENCH_PODS` / `SIM_BENCH_OBJECTS` to scale).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use fleetscope_sim::{Cluster, ClusterConfig, SimServer, Workload, WorkloadSpec};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[derive(serde::Deserialize)]
struct Page {
    metadata: PageMeta,
    items: Vec<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct PageMeta {
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

struct Fetch {
    bytes: usize,
    elapsed: Duration,
    items: usize,
}

/// GETs every page of a list, following continue tokens.
async fn fetch_all(
    base: &str,
    token: &str,
    path: &str,
    limit: Option<usize>,
    client: &Client<
        impl hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
        Empty<Bytes>,
    >,
) -> Fetch {
    let start = Instant::now();
    let mut bytes = 0;
    let mut items = 0;
    let mut cont: Option<String> = None;
    loop {
        let mut url = format!("{base}{path}");
        if let Some(l) = limit {
            url.push_str(&format!("?limit={l}"));
            if let Some(c) = &cont {
                url.push_str(&format!("&continue={c}"));
            }
        }
        let req = http::Request::get(url)
            .header("authorization", format!("Bearer {token}"))
            .body(Empty::new())
            .unwrap();
        let resp = client.request(req).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        bytes += body.len();
        // Read only what paging needs, so the figure is the server's, not a JSON decoder's.
        let page: Page = serde_json::from_slice(&body).unwrap();
        items += page.items.len();
        match page.metadata.continue_token {
            Some(c) if limit.is_some() => cont = Some(c),
            _ => break,
        }
    }
    Fetch {
        bytes,
        elapsed: start.elapsed(),
        items,
    }
}

async fn fetch_raw(
    base: &str,
    token: &str,
    path: &str,
    client: &Client<
        impl hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
        Empty<Bytes>,
    >,
) -> (usize, Duration) {
    let start = Instant::now();
    let req = http::Request::get(format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (body.len(), start.elapsed())
}

fn mb_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

async fn list_throughput(pods_wanted: usize) {
    // A workload of N objects holds about 3N/7 pods.
    let objects = pods_wanted * 7 / 3 + 200;
    let mut config = ClusterConfig::new("bench");
    config.tls = false;
    let cluster = Cluster::new(config);
    let t = Instant::now();
    Workload::populate(&cluster, &WorkloadSpec::new(objects, 1)).unwrap();
    let pods = cluster.store.count("pods");
    println!(
        "populated {objects} objects ({pods} pods) in {:.2?}",
        t.elapsed()
    );

    let http_server = SimServer::start_local(cluster.clone()).await.unwrap();
    let token = cluster.admin_token();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let base = http_server.url();
    let mut best = f64::MAX;
    let mut size = 0;
    for _ in 0..5 {
        let (bytes, d) = fetch_raw(&base, &token, "/api/v1/pods", &client).await;
        size = bytes;
        best = best.min(d.as_secs_f64());
    }
    println!(
        "LIST {pods} pods, one response, plain HTTP: {:.1} MB in {:.0} ms = {:.0} MB/s (best of 5, client only reads bytes)",
        size as f64 / 1e6,
        best * 1e3,
        size as f64 / 1e6 / best
    );
    let paged = fetch_all(&base, &token, "/api/v1/pods", Some(500), &client).await;
    assert_eq!(paged.items, pods);
    println!(
        "LIST {pods} pods in pages of 500, plain HTTP: {:.1} MB in {:.0} ms = {:.0} MB/s",
        paged.bytes as f64 / 1e6,
        paged.elapsed.as_secs_f64() * 1e3,
        mb_s(paged.bytes, paged.elapsed)
    );
    http_server.shutdown().await;
}

async fn list_throughput_tls(pods_wanted: usize) {
    let objects = pods_wanted * 7 / 3 + 200;
    let cluster = Cluster::new(ClusterConfig::new("bench-tls"));
    Workload::populate(&cluster, &WorkloadSpec::new(objects, 1)).unwrap();
    let server = SimServer::start_local(cluster.clone()).await.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(server.ca_pem().unwrap()) {
        roots.add(cert).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls_connector(tls);
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(connector);
    let token = cluster.admin_token();
    let mut best = f64::MAX;
    let mut size = 0;
    for _ in 0..5 {
        let (bytes, d) = fetch_raw(&server.url(), &token, "/api/v1/pods", &client).await;
        size = bytes;
        best = best.min(d.as_secs_f64());
    }
    println!(
        "LIST {} pods, one response, HTTPS: {:.1} MB in {:.0} ms = {:.0} MB/s (best of 5)",
        cluster.store.count("pods"),
        size as f64 / 1e6,
        best * 1e3,
        size as f64 / 1e6 / best
    );
    server.shutdown().await;
}

fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.unwrap())
        .collect()
}

fn hyper_rustls_connector(
    tls: rustls::ClientConfig,
) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build()
}

fn memory_of_small_objects(count: usize) {
    let mut config = ClusterConfig::new("mem");
    config.tls = false;
    let cluster = Cluster::new(config);
    let namespaces = 100;
    for i in 0..namespaces {
        cluster
            .store
            .create(
                "namespaces",
                None,
                json!({"metadata": {"name": format!("ns-{i}")}}),
            )
            .unwrap();
    }
    let before = rss_bytes();
    let t = Instant::now();
    let mut json_bytes = 0usize;
    for i in 0..count {
        let ns = format!("ns-{}", i % namespaces);
        let obj = cluster
            .store
            .create("configmaps", Some(&ns), json!({"metadata": {"name": format!("cm-{i}"), "labels": {"app": "a", "i": (i % 10).to_string()}}, "data": {"k": "v"}}))
            .unwrap();
        json_bytes += obj.body.len();
    }
    let elapsed = t.elapsed();
    let after = rss_bytes();
    let grown = after.saturating_sub(before);
    println!(
        "{count} small objects in one cluster: created in {:.1} s ({:.0}/s); resident {:.2} GiB ({:.0} B/object; stored JSON {:.0} B/object)",
        elapsed.as_secs_f64(),
        count as f64 / elapsed.as_secs_f64(),
        grown as f64 / (1u64 << 30) as f64,
        grown as f64 / count as f64,
        json_bytes as f64 / count as f64
    );
}

fn main() {
    let pods = env_usize("SIM_BENCH_PODS", 100_000);
    let objects = env_usize("SIM_BENCH_OBJECTS", 1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "fleetscope-sim benchmark ({} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    rt.block_on(list_throughput(pods));
    rt.block_on(list_throughput_tls(pods));
    memory_of_small_objects(objects);
}
