//! The ring's Leases in the coordination cluster: one namespace of it, reached with
//! the informer's client for a kubeconfig context, whose exec credential is renewed
//! ahead of its expiry ([`fleetscope_informer::source::renewing_client`]).

use std::time::Duration;

use fleetscope_informer::ClusterSource;
use fleetscope_informer::source::{Renewal, SourceError};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

/// The Leases of one namespace of the coordination cluster.
#[derive(Clone)]
pub struct Leases {
    pub(crate) api: Api<Lease>,
}

impl Leases {
    /// The Leases in `namespace`, through `client`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
        }
    }

    /// The Leases in `namespace` of the cluster `source` names, its exec plugin (if
    /// any) run within `exec_timeout`. When the credential expires, the returned
    /// [`Renewal`] keeps it fresh until `stop`: the caller runs it as a task.
    pub async fn connect(
        source: &ClusterSource,
        namespace: &str,
        exec_timeout: Duration,
        stop: CancellationToken,
    ) -> Result<(Self, Option<Renewal>), SourceError> {
        let (client, renewal) =
            fleetscope_informer::source::renewing_client(source, exec_timeout, stop).await?;
        Ok((Self::new(client, namespace), renewal))
    }
}
