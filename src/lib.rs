//! fleetscope: one gRPC view over many Kubernetes clusters.
//!
//! The root package wires the engine crates to the outside world:
//! - [`server::serve`]: the gRPC server (Fleet, health, reflection);
//! - [`grpc::FleetService`]: the `fleetscope.v1.Fleet` implementation;
//! - [`proto`]: the generated API types.

pub mod client;
pub mod engine;
pub mod grpc;
pub mod persist;
pub mod proto;
pub mod server;
pub mod status;
pub mod telemetry;

pub use fleetscope_informer::source as sources;

/// mimalloc: less overhead per small allocation and less fragmentation than the
/// system allocator for an index of millions of small objects.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
