//! OpenTelemetry traces from the outside: `fleetscope serve` as a process with the
//! standard `OTEL_*` variables pointing at a real OTLP/gRPC trace receiver (a tonic
//! server implementing the collector's TraceService, from `opentelemetry-proto`). An
//! RPC carrying W3C trace context becomes a server span in that trace; each list a
//! stream makes is a span naming its cluster and type; the resource carries the
//! service name and attributes from the environment.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::{Arc, Mutex};

use common::process::Server;
use fleetscope::proto::fleet_client::FleetClient;
use fleetscope::proto::{CountRequest, Query};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, Span, span::SpanKind};

/// An OTLP trace receiver keeping everything it is sent.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<ResourceSpans>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap()
            .extend(request.into_inner().resource_spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// Every span received, with its resource's attributes.
    fn spans(&self) -> Vec<(Vec<KeyValue>, Span)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|rs| {
                let resource = rs
                    .resource
                    .clone()
                    .map(|r| r.attributes)
                    .unwrap_or_default();
                rs.scope_spans
                    .iter()
                    .flat_map(|ss| ss.spans.clone())
                    .map(move |s| (resource.clone(), s))
            })
            .collect()
    }

    /// Waits for a span `matching`, or panics with what was received.
    async fn wait(&self, what: &str, matching: impl Fn(&Span) -> bool) -> (Vec<KeyValue>, Span) {
        let what = format!("{what}: received");
        common::eventually(what, async || {
            let spans = self.spans();
            let names: Vec<String> = spans.iter().map(|(_, s)| s.name.clone()).collect();
            spans.into_iter().find(|(_, s)| matching(s)).ok_or(names)
        })
        .await
    }
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key)? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpcs_and_lists_are_exported_over_otlp_in_the_callers_trace() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let (fleet, dir, kubeconfig) = common::fleet_with_kubeconfig(1, 30).await;
    let log = dir.path().join("serve.log");
    let mut server = Server::start_with_env(
        &kubeconfig,
        &["--no-persist", "--resources", "configmaps"],
        &log,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "fleetscope-under-test"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    common::wait_serving(&server.url()).await;

    // A Count in the caller's trace.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut client = FleetClient::connect(server.url()).await.unwrap();
    let mut request = tonic::Request::new(CountRequest {
        query: Some(Query {
            resource: "configmaps".into(),
            ..Default::default()
        }),
        group_by: Vec::new(),
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    client.count(request).await.unwrap();

    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let (resource, rpc) = receiver
        .wait("the Count's span", |s| {
            s.name == "fleetscope.v1.Fleet/Count"
        })
        .await;
    assert_eq!(hex(&rpc.trace_id), trace_id, "in the caller's trace");
    assert_eq!(
        hex(&rpc.parent_span_id),
        parent_id,
        "a child of the caller's span"
    );
    assert_eq!(rpc.kind, SpanKind::Server as i32);
    assert_eq!(text(&rpc.attributes, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attribute(&rpc.attributes, "rpc.grpc.status_code"),
        Some(&any_value::Value::IntValue(0))
    );
    assert_eq!(
        text(&resource, "service.name").as_deref(),
        Some("fleetscope-under-test")
    );
    assert_eq!(
        text(&resource, "deployment.environment").as_deref(),
        Some("test")
    );

    // The stream's first list, named by its cluster and type, with what it held.
    let (_, list) = receiver.wait("the list's span", |s| s.name == "list").await;
    assert_eq!(text(&list.attributes, "cluster").as_deref(), Some("sim-1"));
    assert_eq!(
        text(&list.attributes, "resource").as_deref(),
        Some("configmaps")
    );
    let held = fleet.servers()[0].cluster().store.count("configmaps") as i64;
    assert_eq!(
        attribute(&list.attributes, "objects"),
        Some(&any_value::Value::IntValue(held))
    );
    // An RPC without trace context starts its own trace.
    client
        .count(CountRequest {
            query: Some(Query {
                resource: "configmaps".into(),
                ..Default::default()
            }),
            group_by: Vec::new(),
        })
        .await
        .unwrap();
    common::eventually("the second Count exported", async || {
        receiver
            .spans()
            .iter()
            .filter(|(_, s)| s.name == "fleetscope.v1.Fleet/Count")
            .count()
            >= 2
    })
    .await;
    let own: Vec<Span> = receiver
        .spans()
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| s.name == "fleetscope.v1.Fleet/Count" && hex(&s.trace_id) != trace_id)
        .collect();
    assert_eq!(own.len(), 1);
    assert!(own[0].parent_span_id.is_empty());
    server.assert_running(&log);
    server.kill();
    fleet.shutdown().await;
}
