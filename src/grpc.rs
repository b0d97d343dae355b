//! The `fleetscope.v1.Fleet` service. Every RPC the cluster engine does not back yet
//! answers `UNIMPLEMENTED`, so clients see the full contract and a clear answer.

use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status};

use crate::proto::fleet_server::Fleet;
use crate::proto::{
    CountRequest, CountResponse, GetRequest, GetResponse, ListClustersRequest,
    ListClustersResponse, ListRequest, ListResourceTypesRequest, ListResourceTypesResponse,
    ListResponse, WatchEvent, WatchRequest,
};

/// The Fleet service over the configured cluster sources.
#[derive(Debug, Clone, Default)]
pub struct FleetService {
    clusters: Vec<String>,
}

impl FleetService {
    /// A service over the named clusters.
    pub fn new(clusters: Vec<String>) -> Self {
        Self { clusters }
    }

    /// The clusters configured.
    pub fn clusters(&self) -> &[String] {
        &self.clusters
    }
}

fn not_served(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "fleetscope.v1.Fleet/{rpc} is not served by this build: the cluster engine (informers and index) is not wired in yet"
    ))
}

/// The stream type of `Watch`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Fleet for FleetService {
    async fn get(&self, _: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        Err(not_served("Get"))
    }

    async fn list(&self, _: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        Err(not_served("List"))
    }

    async fn count(&self, _: Request<CountRequest>) -> Result<Response<CountResponse>, Status> {
        Err(not_served("Count"))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(not_served("Watch"))
    }

    async fn list_clusters(
        &self,
        _: Request<ListClustersRequest>,
    ) -> Result<Response<ListClustersResponse>, Status> {
        Err(not_served("ListClusters"))
    }

    async fn list_resource_types(
        &self,
        _: Request<ListResourceTypesRequest>,
    ) -> Result<Response<ListResourceTypesResponse>, Status> {
        Err(not_served("ListResourceTypes"))
    }
}
