//! Prometheus metrics, read from the engine at each scrape (so a cluster that leaves
//! takes its series with it); the server serves them beside `/healthz` and `/readyz`
//! on their own listener (`--metrics-listen`).
//!
//! Names follow Prometheus conventions (`_total` counters, base units) and the shapes
//! client-go made familiar: per cluster and resource type, `fleetscope_objects`,
//! `fleetscope_stream_synced`, `fleetscope_sync_lag_seconds`,
//! `fleetscope_watch_events_total{type}` and `fleetscope_relists_total{reason}`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fleetscope_engine::Engine;
use fleetscope_model::fleet::{Deferred, Freshness};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::grpc::Subscribers;

/// What the metrics are read from: the engine once started (a server's), the router
/// (a router's), and the gRPC service's Watch streams.
pub struct Sources {
    /// The engine, set once started; none in a router.
    pub engine: Option<Arc<Deferred<Engine>>>,
    /// The router, in a router.
    pub router: Option<Arc<crate::router::Router>>,
    /// The service's Watch streams.
    pub subscribers: Arc<Subscribers>,
    /// The server's inputs that reload.
    pub inputs: fleetscope_model::inputs::Inputs,
    /// The shard as this replica sees it, when it is a replica of a ring.
    pub shard: Option<tokio::sync::watch::Receiver<crate::shard::owner::ShardStatus>>,
    /// The server's own figures, read at each scrape.
    pub server: fn() -> ServerFigures,
}

/// The server's figures as metrics read them: its connections' admission and
/// closing, and its tasks.
#[derive(Debug, Clone, Default)]
pub struct ServerFigures {
    /// Connections refused at admission since start, by reason.
    pub refused: Vec<(&'static str, u64)>,
    /// Connections closed idle since start.
    pub closed_idle: u64,
    /// Connections closed for making no authenticated call in time, since start.
    pub closed_unauthenticated: u64,
    /// The server's tasks running now, by name.
    pub tasks: Vec<(&'static str, usize)>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field(
                "started",
                &self.engine.as_ref().is_some_and(|e| e.get().is_some()),
            )
            .field("subscribers", &self.subscribers)
            .finish()
    }
}

/// A registry holding every fleetscope metric, and the gRPC server's metrics in it
/// (for [`super::grpc::GrpcLayer`]).
pub fn registry(sources: Sources) -> (Registry, Arc<super::grpc::GrpcMetrics>) {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(FleetCollector(sources)));
    let grpc = super::grpc::GrpcMetrics::register(&mut registry);
    (registry, grpc)
}

/// Reads every figure from the engine when scraped.
#[derive(Debug)]
struct FleetCollector(Sources);

/// Writes one metric family of const values, one per label set.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    values: impl IntoIterator<Item = (Vec<(&'static str, String)>, M)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in values {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes one metric without labels.
fn single<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    value: M,
) -> Result<(), std::fmt::Error> {
    value.encode(encoder.encode_descriptor(name, help, None, kind)?)
}

/// A histogram read at scrape time.
#[derive(Debug)]
struct HistogramValue<'a>(&'a fleetscope_model::fleet::Histogram);

impl EncodeMetric for HistogramValue<'_> {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.0.sum,
            self.0.count(),
            &self.0.buckets(),
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(seconds)
        .unwrap_or(0.0)
}

/// The process's figures, as every Prometheus client library exposes them
/// (`process_*`), read from /proc at each scrape; none where /proc is not there.
fn process(e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Ok(());
    };
    // The fields after the command's closing parenthesis, from the state (field 3).
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let number = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Clock ticks are 100 a second on Linux; pages 4 KiB where it runs.
    const TICKS: f64 = 100.0;
    let page = 4096.0;
    let (utime, stime, starttime, vsize, rss) =
        (number(11), number(12), number(19), number(20), number(21));
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()) as f64;
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    single(
        e,
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds.",
        MetricType::Counter,
        ConstCounter::new((utime + stime) / TICKS),
    )?;
    for (name, help, value) in [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            rss * page,
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            vsize,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors.",
            open_fds,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors.",
            max_fds,
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            boot + starttime / TICKS,
        ),
    ] {
        single(e, name, help, MetricType::Gauge, ConstGauge::new(value))?;
    }
    Ok(())
}

/// A router's figures: the ring as it sees it, its connections and each replica's
/// calls.
fn router_metrics(
    e: &mut DescriptorEncoder,
    r: &crate::router::stats::RingFigures,
) -> Result<(), std::fmt::Error> {
    let count = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    single(
        e,
        "fleetscope_router_members",
        "Live replicas of the ring, as this router counts them (their Leases sealed with the ring's key and renewed within the lease duration).",
        MetricType::Gauge,
        count(r.members),
    )?;
    single(
        e,
        "fleetscope_router_clusters_unserved",
        "Clusters of the ring no replica serves now (answers drawing on them are partial).",
        MetricType::Gauge,
        count(r.unserved),
    )?;
    single(
        e,
        "fleetscope_router_leases_refused",
        "Leases of the ring not taken: not sealed with this router's ring key, edited since, or written back from an older copy.",
        MetricType::Gauge,
        count(r.refused),
    )?;
    let by_address = |value: fn(&(usize, usize)) -> usize| {
        r.connections
            .iter()
            .map(move |(a, f)| (vec![("address", a.clone())], count(value(f))))
    };
    family(
        e,
        "fleetscope_router_replica_connections",
        "Connections open to each replica address (another opens once each carries 100 calls).",
        MetricType::Gauge,
        by_address(|f| f.0),
    )?;
    family(
        e,
        "fleetscope_router_replica_calls_open",
        "Calls open to each replica address now (a Watch's stream counts while it runs).",
        MetricType::Gauge,
        by_address(|f| f.1),
    )?;
    family(
        e,
        "fleetscope_router_replica_request_duration_seconds",
        "How long each call to a replica took to its answer (a Watch: to its start), answered or not.",
        MetricType::Histogram,
        r.calls.iter().map(|(replica, c)| {
            (
                vec![("replica", replica.clone())],
                HistogramValue(&c.latency),
            )
        }),
    )?;
    family(
        e,
        "fleetscope_router_replica_errors",
        "Calls to a replica that failed, by gRPC code.",
        MetricType::Counter,
        r.calls.iter().flat_map(|(replica, c)| {
            c.errors.iter().map(move |(code, n)| {
                (
                    vec![("replica", replica.clone()), ("code", code.clone())],
                    ConstCounter::new(*n),
                )
            })
        }),
    )?;
    Ok(())
}

/// A replica's view of its ring.
fn shard_metrics(
    e: &mut DescriptorEncoder,
    s: &crate::shard::owner::ShardStatus,
) -> Result<(), std::fmt::Error> {
    let count = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    single(
        e,
        "fleetscope_shard_members",
        "Live replicas of the ring, as this replica sees their Leases.",
        MetricType::Gauge,
        count(s.members.len()),
    )?;
    single(
        e,
        "fleetscope_shard_owned_clusters",
        "Clusters this replica owns by the ring's assignment.",
        MetricType::Gauge,
        count(s.owned.len()),
    )?;
    single(
        e,
        "fleetscope_shard_held_clusters",
        "Clusters this replica runs: those it owns, and those it hands over until their new owners hold them ready.",
        MetricType::Gauge,
        count(s.held.len()),
    )?;
    single(
        e,
        "fleetscope_shard_unowned_clusters",
        "Configured clusters no live replica of the ring publishes ready: nobody serves them.",
        MetricType::Gauge,
        count(s.unowned.len()),
    )?;
    single(
        e,
        "fleetscope_shard_moves",
        "Clusters this replica took up or let go as the ring changed.",
        MetricType::Counter,
        ConstCounter::new(s.moves),
    )?;
    single(
        e,
        "fleetscope_shard_lease_renew_failures",
        "Renewals of this replica's Lease that failed (the coordination cluster unreachable, or a lost race).",
        MetricType::Counter,
        ConstCounter::new(s.renew_failures),
    )?;
    single(
        e,
        "fleetscope_shard_fenced",
        "1 while this replica has not renewed its Lease within the lease duration and answers for no cluster.",
        MetricType::Gauge,
        ConstGauge::new(i64::from(s.fenced)),
    )
}

impl Collector for FleetCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sources = &self.0;
        server_metrics(&mut e, &sources.subscribers, sources.server)?;
        input_metrics(&mut e, &sources.inputs.borrow())?;
        if let Some(shard) = &sources.shard {
            shard_metrics(&mut e, &shard.borrow())?;
        }
        if let Some(router) = &sources.router {
            router_metrics(&mut e, &router.figures())?;
        }
        let Some(engine) = sources.engine.as_ref().and_then(|e| e.get()) else {
            // Starting: the engine's figures come once it is.
            return Ok(());
        };
        // One summary, read at once: what the engine reports to operators.
        let observed = engine.observe();
        stream_metrics(&mut e, &observed)?;
        let dropped = observed.watches_dropped;
        family(
            &mut e,
            "fleetscope_watch_subscribers_dropped",
            "Watch streams the server ended for not keeping up, by reason: unread (events left unread for --watch-stall-timeout), behind (fell further behind than the event log holds). Each is told where to resume.",
            MetricType::Counter,
            [("unread", dropped.unread), ("behind", dropped.behind)]
                .map(|(reason, n)| (vec![("reason", reason.to_string())], ConstCounter::new(n))),
        )?;
        cluster_metrics(&mut e, &observed)?;
        if let Some(store) = &observed.store {
            store_metrics(&mut e, store)?;
        }
        Ok(())
    }
}

/// The process and its server: the build, Watch streams, connections, tasks.
fn server_metrics(
    e: &mut DescriptorEncoder,
    subscribers: &Subscribers,
    server: fn() -> ServerFigures,
) -> Result<(), std::fmt::Error> {
    family(
        e,
        "fleetscope_build_info",
        "The fleetscope build: 1, labelled with its version.",
        MetricType::Gauge,
        [(
            vec![("version", env!("CARGO_PKG_VERSION").to_string())],
            ConstGauge::new(1i64),
        )],
    )?;
    single(
        e,
        "fleetscope_watch_subscribers",
        "Watch streams open now.",
        MetricType::Gauge,
        ConstGauge::new(subscribers.active()),
    )?;
    single(
        e,
        "fleetscope_watch_subscribers_ended",
        "Watch streams ended, for any reason (client gone, fallen behind, shutdown).",
        MetricType::Counter,
        ConstCounter::new(subscribers.ended()),
    )?;
    process(e)?;
    let figures = server();
    family(
        e,
        "fleetscope_grpc_connections_refused",
        "Connections closed at admission (gRPC and metrics listeners), by reason: cap (--grpc-max-connections), address_cap (--grpc-max-connections-per-address), reserved (only the places kept for callers with a client certificate were left).",
        MetricType::Counter,
        figures
            .refused
            .iter()
            .map(|(why, n)| (vec![("reason", (*why).to_string())], ConstCounter::new(*n))),
    )?;
    single(
        e,
        "fleetscope_grpc_connections_closed_idle",
        "gRPC connections closed with a GOAWAY after --grpc-idle-timeout with no call open.",
        MetricType::Counter,
        ConstCounter::new(figures.closed_idle),
    )?;
    single(
        e,
        "fleetscope_grpc_connections_closed_unauthenticated",
        "gRPC connections closed with a GOAWAY for making no authenticated call within --grpc-handshake-timeout, or to make room for a newer connection while none had.",
        MetricType::Counter,
        ConstCounter::new(figures.closed_unauthenticated),
    )?;
    family(
        e,
        "fleetscope_tasks",
        "Tasks of the server running now, by name (listeners, connections, reloaders, readiness, signals); the engine's own are not counted here.",
        MetricType::Gauge,
        figures.tasks.into_iter().map(|(task, n)| {
            (
                vec![("task", task.to_string())],
                ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)),
            )
        }),
    )?;
    Ok(())
}

/// Each input of the server that reloads, and how its last reload went.
fn input_metrics(
    e: &mut DescriptorEncoder,
    inputs: &[fleetscope_model::inputs::InputStatus],
) -> Result<(), std::fmt::Error> {
    let by_input = |value: fn(&fleetscope_model::inputs::InputStatus) -> f64| {
        inputs.iter().map(move |i| {
            (
                vec![("input", i.input.to_string())],
                ConstGauge::new(value(i)),
            )
        })
    };
    family(
        e,
        "fleetscope_config_reloads",
        "Reloads of each input of the server (config: the configuration file; sources: the kubeconfigs; tokens; policy; tls), each after its files' content changed or on SIGHUP.",
        MetricType::Counter,
        inputs.iter().map(|i| {
            (
                vec![("input", i.input.to_string())],
                ConstCounter::new(i.reloads),
            )
        }),
    )?;
    family(
        e,
        "fleetscope_config_input_last_reload_successful",
        "1 when the last reload of the input succeeded (or it was not reloaded yet), 0 when it failed: the version before stays in force.",
        MetricType::Gauge,
        by_input(|i| f64::from(u8::from(i.error.is_none()))),
    )?;
    family(
        e,
        "fleetscope_config_input_loaded_timestamp_seconds",
        "When the version of the input in force was loaded, in seconds since the epoch.",
        MetricType::Gauge,
        by_input(|i| unix_seconds(i.loaded_at)),
    )?;
    Ok(())
}

/// Each cluster's streams: objects, sync, lag, events, lists.
///
/// (Long for a reason: a table, one metric family after another, each its name, help
/// and values.)
fn stream_metrics(
    e: &mut DescriptorEncoder,
    observed: &fleetscope_engine::Observation,
) -> Result<(), std::fmt::Error> {
    let streams: Vec<_> = observed
        .clusters
        .iter()
        .cloned()
        .flat_map(|c| {
            let cluster = c.name.to_string();
            c.streams
                .into_values()
                .map(move |(rt, s)| (cluster.clone(), rt.name(), s))
        })
        .collect();
    let labels = |cluster: &str, resource: &str| {
        vec![
            ("cluster", cluster.to_string()),
            ("resource", resource.to_string()),
        ]
    };
    // A counter of every stream, one series per value of `key`.
    let by_stream =
        |key: &'static str,
         values: fn(&fleetscope_engine::status::StreamCounts) -> Vec<(&'static str, u64)>| {
            streams.iter().flat_map(move |(c, r, s)| {
                values(&s.counts).into_iter().map(move |(value, n)| {
                    let mut l = labels(c, r);
                    l.push((key, value.to_string()));
                    (l, ConstCounter::new(n))
                })
            })
        };
    family(
        e,
        "fleetscope_objects",
        "Objects held, by cluster and resource type.",
        MetricType::Gauge,
        observed.objects.iter().map(|(r, c, n)| {
            (
                labels(c.as_str(), r),
                ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX)),
            )
        }),
    )?;
    family(
        e,
        "fleetscope_stream_synced",
        "1 when the stream's list is complete and its watch current, else 0.",
        MetricType::Gauge,
        streams.iter().map(|(c, r, s)| {
            let synced = i64::from(s.freshness() == Freshness::Synced);
            (labels(c, r), ConstGauge::new(synced))
        }),
    )?;
    family(
        e,
        "fleetscope_sync_lag_seconds",
        "How far behind its cluster the stream may be: 0 while its watch is current, else the time since it was last known current.",
        MetricType::Gauge,
        streams.iter().filter_map(|(c, r, s)| {
            s.sync_lag()
                .map(|lag| (labels(c, r), ConstGauge::new(seconds(lag))))
        }),
    )?;
    family(
        e,
        "fleetscope_watch_events",
        "Watch events received from the clusters, by type.",
        MetricType::Counter,
        by_stream("type", |c| {
            vec![
                ("ADDED", c.added),
                ("MODIFIED", c.modified),
                ("DELETED", c.deleted),
            ]
        }),
    )?;
    family(
        e,
        "fleetscope_relists",
        "Lists made by the streams, by reason: initial (nothing to resume from), expired (410 Gone) or confirm (a replica confirming its streams after a pause).",
        MetricType::Counter,
        by_stream("reason", |c| {
            vec![
                ("initial", c.initial_lists),
                ("expired", c.expired_lists),
                ("confirm", c.confirm_lists),
            ]
        }),
    )?;
    family(
        e,
        "fleetscope_stream_dropped",
        "Objects and watch events a stream dropped of what its cluster sent, by reason: too_large (--max-object-bytes), malformed_resource_version, backward_resource_version.",
        MetricType::Counter,
        by_stream("reason", |c| {
            let d = &c.dropped;
            vec![
                ("too_large", d.too_large),
                ("malformed_resource_version", d.malformed_version),
                ("backward_resource_version", d.backward_version),
            ]
        }),
    )?;
    family(
        e,
        "fleetscope_objects_labels_unindexed",
        "Objects stored with more labels than the label index takes of one object: held, served and selected by a scan.",
        MetricType::Counter,
        streams
            .iter()
            .map(|(c, r, s)| (labels(c, r), ConstCounter::new(s.counts.unindexed_labels))),
    )?;
    Ok(())
}

/// The clusters' API requests, the cluster sources' reload and the index's packer.
fn cluster_metrics(
    e: &mut DescriptorEncoder,
    observed: &fleetscope_engine::Observation,
) -> Result<(), std::fmt::Error> {
    let clusters = &observed.clusters;
    family(
        e,
        "fleetscope_rest_client_requests",
        "Requests to the clusters' API servers, by HTTP method and response code (<error> when none came).",
        MetricType::Counter,
        clusters.iter().flat_map(|c| {
            c.requests.snapshot().into_iter().map(|(method, code, n)| {
                (
                    vec![
                        ("cluster", c.name.to_string()),
                        ("code", code),
                        ("method", method),
                    ],
                    ConstCounter::new(n),
                )
            })
        }),
    )?;
    let sources = &observed.sources;
    single(
        e,
        "fleetscope_config_last_reload_successful",
        "1 when the last reload of the configuration file and kubeconfigs succeeded, 0 when it failed (the configuration before it stays in force).",
        MetricType::Gauge,
        ConstGauge::new(i64::from(sources.error.is_none())),
    )?;
    if let Some(at) = sources.loaded_at {
        single(
            e,
            "fleetscope_config_last_reload_success_timestamp_seconds",
            "When the cluster sources in force were loaded, in seconds since the epoch.",
            MetricType::Gauge,
            ConstGauge::new(unix_seconds(at)),
        )?;
    }
    single(
        e,
        "fleetscope_index_objects_compressed",
        "Object states the index compressed once they settled (index.compressObjects).",
        MetricType::Counter,
        ConstCounter::new(observed.objects_compressed),
    )?;
    Ok(())
}

/// The store's size, writes and their failures.
fn store_metrics(
    e: &mut DescriptorEncoder,
    s: &fleetscope_engine::persist::PersistStats,
) -> Result<(), std::fmt::Error> {
    let one = ConstGauge::new;
    single(
        e,
        "fleetscope_store_size_bytes",
        "Bytes the store takes on disk, as of its last write.",
        MetricType::Gauge,
        one(s.size_on_disk as f64),
    )?;
    single(
        e,
        "fleetscope_store_pending_changes",
        "Changes gathered and not yet written (nor visible).",
        MetricType::Gauge,
        one(s.pending as f64),
    )?;
    single(
        e,
        "fleetscope_store_write_failing",
        "1 while the store's writes fail (nothing newer than the last write is visible; writes are retried), 0 while they succeed.",
        MetricType::Gauge,
        ConstGauge::new(i64::from(s.last_error.is_some())),
    )?;
    single(
        e,
        "fleetscope_store_write_errors",
        "Store writes that failed (each is retried).",
        MetricType::Counter,
        ConstCounter::new(s.write_errors),
    )?;
    single(
        e,
        "fleetscope_store_writes",
        "Store writes (each durable before what it holds is visible).",
        MetricType::Counter,
        ConstCounter::new(s.flushes),
    )?;
    single(
        e,
        "fleetscope_store_write_seconds",
        "How long store writes take.",
        MetricType::Histogram,
        HistogramValue(&s.write_seconds),
    )?;
    single(
        e,
        "fleetscope_store_last_write_seconds",
        "How long the last store write took.",
        MetricType::Gauge,
        one(seconds(s.last_flush)),
    )?;
    single(
        e,
        "fleetscope_store_snapshot_in_progress",
        "1 while a snapshot of the index is being written, 0 otherwise.",
        MetricType::Gauge,
        ConstGauge::new(i64::from(s.snapshot_in_progress)),
    )?;
    single(
        e,
        "fleetscope_store_compaction_in_progress",
        "1 while the store is being compacted, 0 otherwise.",
        MetricType::Gauge,
        ConstGauge::new(i64::from(s.compaction_in_progress)),
    )?;
    single(
        e,
        "fleetscope_store_max_write_seconds",
        "The longest store write since start.",
        MetricType::Gauge,
        one(seconds(s.max_flush)),
    )?;
    Ok(())
}
