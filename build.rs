//! Compiles `proto/` into Rust with protox (no system `protoc` needed) and writes
//! the file descriptor set that server reflection serves; has the linker of a release
//! build place the code a server runs first.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    order_text()?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let descriptors = protox::compile(["fleetscope/v1/fleet.proto"], ["proto"])?;
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
        // Written by hand so that its JSON is shared, not copied per caller.
        .extern_path(".fleetscope.v1.Object", "crate::proto::wire::Object")
        .compile_fds(descriptors)?;
    Ok(())
}

/// The functions a server runs (`link/text-order.txt`, written by `link/text-order.sh`)
/// go first in a release binary's machine code, so that they share pages: the kernel
/// maps 64 KiB of a binary around each page it faults in, and a server runs about 5 MB
/// of the 19 MB, spread over nearly all of it in the linker's own order (over three
/// API servers' 15,605 configmaps, 6.3 MB of code resident instead of 14.2;
/// docs/notes/performance-log.md). LLD's symbol ordering file, for the default linker of
/// x86_64 Linux; names the binary no longer has are skipped. `FLEETSCOPE_LINK_ORDER=off`
/// leaves the order to the linker (for a linker without `--symbol-ordering-file`).
fn order_text() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=link/text-order.txt");
    println!("cargo:rerun-if-env-changed=FLEETSCOPE_LINK_ORDER");
    let release = env::var("PROFILE")? == "release";
    let lld_target = env::var("TARGET")? == "x86_64-unknown-linux-gnu";
    let off = env::var("FLEETSCOPE_LINK_ORDER").is_ok_and(|v| v == "off");
    if release && lld_target && !off {
        let order = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("link/text-order.txt");
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
    Ok(())
}
