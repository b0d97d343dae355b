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
pub mod kubeapi;
pub mod memory;
pub mod server;
pub mod shard;
pub mod tasks;
pub mod telemetry;

/// This build's version: the package's, with the commit it was built from when known
/// (`0.1.0 (commit 1a2b3c4d5e6f)`).
pub fn version() -> String {
    match option_env!("FLEETSCOPE_COMMIT") {
        Some(commit) => format!("{} (commit {commit})", env!("CARGO_PKG_VERSION")),
        None => env!("CARGO_PKG_VERSION").to_string(),
    }
}

pub use fleetscope_auth as auth;
pub use fleetscope_auth::peer;
pub use fleetscope_cli as cli;
pub use fleetscope_engine as engine;
pub use fleetscope_engine::{persist, status};
pub use fleetscope_grpc as grpc;
pub use fleetscope_proto as proto;
pub use fleetscope_router as router;

pub use fleetscope_informer::source as sources;
