//! fleetscope: one gRPC view over many Kubernetes clusters.
//!
//! The root package wires the engine crates to the outside world:
//! - [`server::serve`]: the gRPC server (Fleet, health, reflection);
//! - [`grpc::FleetService`]: the `fleetscope.v1.Fleet` implementation;
//! - [`auth`]: identities (client certificates, bearer tokens) and the policy;
//! - [`proto`]: the generated API types.

pub mod auth;
pub mod cli;
pub mod config;
pub mod grpc;
pub mod proto;
pub mod router;
pub mod server;
pub mod shard;
pub mod tasks;
pub mod telemetry;

pub use fleetscope_engine as engine;
pub use fleetscope_engine::{persist, status};

pub use fleetscope_informer::source as sources;

/// mimalloc: less overhead per small allocation and less fragmentation than the
/// system allocator for an index of millions of small objects. Its version 2: version
/// 3 serves an allocation whose size is exactly a size class (the index's 80-byte
/// objects, 160-byte B-tree leaves) from the next class up whenever the current page
/// of its own class is used up, which cost the index about 25 bytes per object at a million pods.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
