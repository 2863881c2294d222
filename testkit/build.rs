//! Compiles the Kubernetes API protobuf definitions in `proto/` with a
//! pure-Rust compiler and embeds the encoded descriptor set, which the
//! in-process API server uses to convert objects between JSON and protobuf.

use std::error::Error;
use std::path::PathBuf;

const PROTO_FILES: [&str; 11] = [
    "go_json.proto",
    "runtime.proto",
    "resource.proto",
    "intstr.proto",
    "meta_v1.proto",
    "core_v1.proto",
    "storage_v1.proto",
    "coordination_v1.proto",
    "events_v1.proto",
    "authentication_v1.proto",
    "authorization_v1.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let proto_dir = manifest_dir.join("proto");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }
    let mut compiler = protox::Compiler::new([&proto_dir])?;
    compiler
        .include_imports(true)
        .include_source_info(false)
        .open_files(PROTO_FILES)?;
    let encoded = compiler.encode_file_descriptor_set();
    // Decoding here proves the runtime decode of the embedded bytes works.
    prost_reflect::DescriptorPool::decode(encoded.as_slice())?;
    std::fs::write(out_dir.join("k8s_descriptor_set.bin"), &encoded)?;
    Ok(())
}
