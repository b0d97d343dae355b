//! A Kubernetes API simulator that speaks the real HTTP API, for fleetscope's tests,
//! benchmarks and `fleetscope demo`. It answers as a real kube-apiserver does: the
//! same paths, shapes, status codes and `Status` bodies.
//!
//! Entry points:
//! - [`Cluster::new`] with a [`ClusterConfig`]: one simulated cluster, with in-process
//!   writes through [`Cluster::store`], fault injection and request counters.
//! - [`SimServer::start`]: serves a cluster over HTTP, and can go offline, come back and restart.
//! - [`Workload::populate`] and [`Workload::churn`]: realistic objects and a change rate.
//! - [`run_controllers`]: the namespace, deployment, replicaset and garbage-collection
//!   controllers a real cluster runs.
//! - [`SimFleet::start`]: several clusters with workloads and controllers, and the
//!   kubeconfig reaching them.

mod cluster;
mod controllers;
mod fleet;
mod http;
mod openapi;
pub mod patch;
pub mod protobuf;
mod request;
pub mod resource;
mod server;
pub mod status;
pub mod store;
mod table;
mod tls;
pub mod validate;
mod watch;
mod workload;

pub use cluster::{
    Cluster, ClusterConfig, FailFor, Inner, ListKind, Token, Verb, WatchListSupport,
};
pub use controllers::run_controllers;
pub use fleet::{Context, FleetSpec, SimFleet, kubeconfig, write_kubeconfig};
pub use resource::ResourceDef;
pub use server::SimServer;
pub use status::ApiError;
pub use tls::{ServerTls, TlsError};
pub use workload::{Workload, WorkloadSpec};
