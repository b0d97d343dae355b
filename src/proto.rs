//! The generated `fleetscope.v1` API types and the descriptor set served by reflection.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("fleetscope.v1");

pub mod wire;
pub use wire::Object;

/// The encoded `FileDescriptorSet` of `proto/`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fleetscope_descriptor");
