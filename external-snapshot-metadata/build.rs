//! Compiles the Kubernetes SnapshotMetadata API with a pure-Rust compiler (no `protoc`).

use std::error::Error;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn Error>> {
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!(
        "cargo:rerun-if-changed={}",
        proto_dir.join("schema.proto").display()
    );
    let files = protox::compile(["schema.proto"], [&proto_dir])?;
    tonic_prost_build::configure().compile_fds(files)?;
    Ok(())
}
