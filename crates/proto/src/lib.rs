//! fleetscope's public API, `fleetscope.v1` (`proto/fleetscope/v1/fleet.proto`): the
//! generated message types, the `Fleet` client and server, the hand-written `Object`
//! whose JSON is shared rather than copied ([`wire`]), and the descriptor set that
//! server reflection serves.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("fleetscope.v1");

pub mod codec;
pub mod wire;
pub use wire::Object;

/// Where a server listens by default, and where a client looks for one.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:50051";

/// The encoded `FileDescriptorSet` of `proto/`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fleetscope_descriptor");

/// The response header naming the answering server's version (a router's own, through
/// a router), as `fleetscope version` shows it.
pub const VERSION_HEADER: &str = "fleetscope-version";
