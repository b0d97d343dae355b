//! fleetscope: one gRPC view over many Kubernetes clusters.
//!
//! The root package wires the engine crates to the outside world:
//! - [`server::serve`]: the gRPC server (Fleet, health, reflection);
//! - [`grpc::FleetService`]: the `fleetscope.v1.Fleet` implementation (`fleetscope-grpc`);
//! - [`auth`]: identities (client certificates, bearer tokens) and the policy;
//! - [`proto`]: the API (`fleetscope-proto`).

// clap turns doc comments into help text: the command line is documented by `--help`.
#[allow(missing_docs)]
pub mod command;
pub mod config;
pub mod memory;
pub mod server;
pub mod shard;
pub mod tasks;
pub mod telemetry;

pub use fleetscope_auth as auth;
pub use fleetscope_auth::peer;
pub use fleetscope_cli as cli;
pub use fleetscope_engine as engine;
pub use fleetscope_engine::{persist, status};
pub use fleetscope_grpc as grpc;
pub use fleetscope_proto as proto;
pub use fleetscope_router as router;

pub use fleetscope_informer::source as sources;
