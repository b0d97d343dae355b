//! The gRPC surface end to end: simulated clusters → the real server → real gRPC clients.
//! Health checking and reflection (v1 and v1alpha).

#![allow(clippy::unwrap_used)]

use crate::common;

use common::{Harness, PATIENCE};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn health_reports_serving_for_the_server_and_the_fleet_service() {
    let h = Harness::start(2, 50).await;
    common::wait_serving(&h.url()).await;
    let mut health = HealthClient::new(h.channel().await);
    for service in ["", "fleetscope.v1.Fleet"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope.v1.Nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    h.shutdown().await;
}

#[tokio::test]
async fn reflection_v1_lists_and_describes_the_fleet_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let h = Harness::start(1, 50).await;
    let mut client = ServerReflectionClient::new(h.channel().await);
    let requests = tokio_stream::iter([
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "fleetscope.v1.Fleet".into(),
            )),
        },
    ]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let listed = tokio::time::timeout(PATIENCE, responses.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("{listed:?}")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "fleetscope.v1.Fleet",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    let described = tokio::time::timeout(PATIENCE, responses.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(MessageResponse::FileDescriptorResponse(files)) = described.message_response else {
        panic!("{described:?}")
    };
    let file: prost_types::FileDescriptorProto =
        prost::Message::decode(files.file_descriptor_proto[0].as_slice()).unwrap();
    assert_eq!(file.package(), "fleetscope.v1");
    let service = file.service.iter().find(|s| s.name() == "Fleet").unwrap();
    let rpcs: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        rpcs,
        [
            "Get",
            "List",
            "Count",
            "Watch",
            "ListClusters",
            "ListResourceTypes",
            "GetStore"
        ]
    );
    let watch = service.method.iter().find(|m| m.name() == "Watch").unwrap();
    assert!(watch.server_streaming());
    // Doc comments travel with the descriptor, so `grpcurl describe` shows them.
    let info = file.source_code_info.as_ref().expect("source info kept");
    assert!(
        info.location
            .iter()
            .any(|l| l.leading_comments().contains("consistent snapshot"))
    );
    h.shutdown().await;
}

#[tokio::test]
async fn reflection_v1alpha_serves_older_grpcurl() {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

    let h = Harness::start(1, 50).await;
    let mut client = ServerReflectionClient::new(h.channel().await);
    let requests = tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "fleetscope.v1.WatchEvent".into(),
        )),
    }]);
    let mut responses = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let r = tokio::time::timeout(PATIENCE, responses.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            r.message_response,
            Some(MessageResponse::FileDescriptorResponse(_))
        ),
        "{r:?}"
    );
    h.shutdown().await;
}

/// Health of the server and of the Fleet service, in that order.
async fn health(url: &str) -> [ServingStatus; 2] {
    let channel = tonic::transport::Channel::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut out = [ServingStatus::Unknown; 2];
    for (i, service) in ["", "fleetscope.v1.Fleet"].into_iter().enumerate() {
        out[i] = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
    }
    out
}

fn count_request(resource: &str) -> fleetscope::proto::CountRequest {
    fleetscope::proto::CountRequest {
        query: Some(fleetscope::proto::Query {
            resource: resource.into(),
            ..Default::default()
        }),
        group_by: vec![],
    }
}

#[tokio::test]
async fn while_the_store_loads_every_call_is_unavailable_and_health_is_not_serving() {
    use fleetscope::grpc::FleetService;
    let listener = fleetscope::server::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let fleet = std::sync::Arc::new(fleetscope_model::fleet::Deferred::<
        fleetscope::engine::Engine,
    >::default());
    let service = FleetService::new(fleet.clone(), common::service_config(), stop.clone());
    let (ready, readied) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(fleetscope::server::serve(
        listener,
        service.clone(),
        async move {
            let _ = readied.await;
        },
        {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        },
    ));
    assert_eq!(health(&url).await, [ServingStatus::NotServing; 2]);
    let mut client = fleetscope::proto::fleet_client::FleetClient::connect(url.clone())
        .await
        .unwrap();
    let e = client.count(count_request("configmaps")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("starting"), "{e}");
    let e = client
        .list_clusters(fleetscope::proto::ListClustersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    // Started: answers, and health follows readiness.
    let engine = std::sync::Arc::new(fleetscope::engine::Engine::start(
        Vec::new(),
        common::test_config(&["configmaps"]),
    ));
    fleet.set(engine.clone());
    assert!(
        client
            .list_clusters(fleetscope::proto::ListClustersRequest::default())
            .await
            .is_ok()
    );
    ready.send(()).unwrap();
    common::wait_serving(&url).await;
    stop.cancel();
    server.await.unwrap().unwrap();
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_type_not_yet_known_while_a_cluster_is_being_discovered_is_unavailable_not_not_found() {
    let fleet = fleetscope_sim::SimFleet::start(&fleetscope_sim::FleetSpec::numbered(1, 20, 0.0))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sims = dir.path().join("sims");
    fleet.write_kubeconfig(&sims).unwrap();
    // An API server that accepts connections and never answers: discovery waits.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stuck = dir.path().join("stuck");
    std::fs::write(
        &stuck,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stuck\n  cluster:\n    server: https://{}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: stuck\n  context:\n    cluster: stuck\n    user: u\ncurrent-context: stuck\n",
            silent.local_addr().unwrap()
        ),
    )
    .unwrap();
    let sources = fleetscope::sources::resolve(&[sims, stuck], &[]).unwrap();
    let config = common::test_config(&["configmaps", "widgets.example.com"]);
    let engine = std::sync::Arc::new(fleetscope::engine::Engine::start(sources, config));
    let listener = fleetscope::server::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = fleetscope::grpc::FleetService::new(
        engine.clone(),
        common::service_config(),
        engine.cancelled(),
    );
    let ready = {
        let engine = engine.clone();
        async move { engine.wait_ready().await }
    };
    let cancel = engine.cancelled();
    let server = tokio::spawn(fleetscope::server::serve(
        listener,
        service,
        ready,
        async move { cancel.cancelled().await },
    ));
    let mut client = fleetscope::proto::fleet_client::FleetClient::connect(url.clone())
        .await
        .unwrap();
    // sim-1 is discovered: its configmaps are answered (partially: stuck is pending).
    common::eventually("configmaps counted", async || {
        client.count(count_request("configmaps")).await.is_ok()
    })
    .await;
    // A type sim-1 does not serve may still be served by the cluster being discovered.
    let e = client
        .count(count_request("widgets.example.com"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("stuck"), "{e}");
    assert_eq!(health(&url).await, [ServingStatus::NotServing; 2]);
    // The stuck cluster fails (its connections are closed): it is reported, not waited
    // for; the server is ready, and the type is now known not to be collected.
    drop(silent);
    common::wait_serving(&url).await;
    let e = client
        .count(count_request("widgets.example.com"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    engine.cancelled().cancel();
    server.await.unwrap().unwrap();
    engine.shutdown(std::time::Duration::from_secs(5)).await;
    fleet.shutdown().await;
}
