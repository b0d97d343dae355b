//! Connection failures name their cause: a server whose certificate the kubeconfig's
//! authority did not sign, plain `http://` against an HTTPS server, a port where
//! nothing listens, and credentials the cluster refuses (401) — reported per cluster while the healthy one serves.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::test_config;
use fleetscope_sim::{FleetSpec, SimFleet};

#[tokio::test]
async fn tls_and_connection_failures_name_their_cause() {
    let fleet = SimFleet::start(&FleetSpec::numbered(2, 5, 0.0))
        .await
        .unwrap();
    let contexts = fleet.contexts();
    let (a, b) = (&contexts[0], &contexts[1]);
    assert!(a.server.starts_with("https://") && a.ca_pem.is_some() && b.ca_pem.is_some());
    let mut wrong_ca = a.clone();
    wrong_ca.name = "wrong-ca".into();
    wrong_ca.ca_pem = b.ca_pem.clone();
    let mut plain = a.clone();
    plain.name = "plain".into();
    plain.server = a.server.replacen("https://", "http://", 1);
    let mut refused = a.clone();
    refused.name = "refused".into();
    refused.server = format!("https://127.0.0.1:{}", common::process::free_port());
    let mut bad_token = a.clone();
    bad_token.name = "bad-token".into();
    bad_token.token = "not-a-token-the-cluster-knows".into();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    fleetscope_sim::write_kubeconfig(&path, &[a.clone(), wrong_ca, plain, refused, bad_token])
        .unwrap();
    let sources = fleetscope::sources::resolve(&[path], &[]).unwrap();
    let mut config = test_config(&["configmaps"]);
    config.stream.backoff_cap = Duration::from_millis(200);
    let engine = fleetscope::engine::Engine::start(sources, config);
    let expect = [
        (
            "wrong-ca",
            "signed by an authority the kubeconfig does not trust",
        ),
        ("plain", "it may serve HTTPS"),
        ("refused", "refused: nothing listens there"),
        (
            "bad-token",
            "the cluster does not accept the kubeconfig's credentials (401 Unauthorized)",
        ),
    ];
    for (name, cause) in expect {
        let error = common::eventually(format!("{name}: the error says {cause:?}"), async || {
            let error = engine
                .status_for_tests()
                .cluster(&name.into())
                .and_then(|c| c.error)
                .unwrap_or_default();
            if error.contains(cause) {
                Ok(error)
            } else {
                Err(error)
            }
        })
        .await;
        assert!(!error.contains("Status {"), "{name}: a debug dump: {error}");
    }
    let healthy = engine
        .status_for_tests()
        .cluster(&a.name.as_str().into())
        .unwrap();
    assert!(healthy.error.is_none(), "{:?}", healthy.error);
    engine.shutdown(Duration::from_secs(5)).await;
    fleet.shutdown().await;
}
