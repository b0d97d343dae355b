//! The gRPC surface end to end: simulated clusters → the real server → real gRPC clients.
//! Health checking and reflection (v1 and v1alpha).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Harness, PATIENCE};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn health_reports_serving_for_the_server_and_the_fleet_service() {
    let h = Harness::start(2, 50).await;
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
