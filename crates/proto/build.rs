//! Compiles the workspace's `proto/` into Rust with protox (no system `protoc`
//! needed) and writes the file descriptor set that server reflection serves.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto");
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let descriptors = protox::compile(["fleetscope/v1/fleet.proto"], ["../../proto"])?;
    let descriptor_path = out_dir.join("fleetscope_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        // prost's encoding, each message written into room reserved for it.
        .codec_path("crate::codec::Codec")
        // Written by hand so that its JSON is shared, not copied per caller.
        .extern_path(".fleetscope.v1.Object", "crate::wire::Object")
        .compile_fds(descriptors)?;
    Ok(())
}
