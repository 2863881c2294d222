//! Compiles the protocol definitions with a pure-Rust compiler (no
//! `protoc` needed), generates prost messages with tonic clients and
//! servers, embeds the encoded descriptor set for reflection, and writes
//! one constant per gRPC method path.

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const PROTO_FILES: [&str; 2] = ["csi.proto", "pluginregistration/api.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let proto_dir = manifest_dir.join("proto");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }

    // Source info carries the proto comments into the generated docs.
    let with_docs = compile(&proto_dir, true)?;
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        // Unimplemented RPCs answer UNIMPLEMENTED, as Go's embedded
        // `Unimplemented*Server` does, so test doubles stay small.
        .generate_default_stubs(true)
        .compile_fds_with_config(with_docs.file_descriptor_set(), config)?;

    // The embedded set drops source info: reflection needs names, types
    // and options only.
    let lean = compile(&proto_dir, false)?;
    let encoded = lean.encode_file_descriptor_set();
    // Decoding here proves the runtime decode of the embedded bytes works.
    let pool = prost_reflect::DescriptorPool::decode(encoded.as_slice())?;
    std::fs::write(out_dir.join("file_descriptor_set.bin"), &encoded)?;
    std::fs::write(out_dir.join("methods.rs"), method_constants(&pool)?)?;
    Ok(())
}

fn compile(proto_dir: &Path, source_info: bool) -> Result<protox::Compiler, protox::Error> {
    let mut compiler = protox::Compiler::new([proto_dir])?;
    compiler
        .include_imports(true)
        .include_source_info(source_info)
        .open_files(PROTO_FILES)?;
    Ok(compiler)
}

/// One module per service (snake case of its name) holding `SERVICE`, a
/// SCREAMING_SNAKE constant per method and `ALL`, in declaration order.
fn method_constants(pool: &prost_reflect::DescriptorPool) -> Result<String, Box<dyn Error>> {
    let mut out = String::new();
    let mut modules = Vec::new();
    for service in pool.services() {
        let module = snake_case(service.name());
        if modules.contains(&module) {
            return Err(format!("two services map to module `{module}`").into());
        }
        let full_name = service.full_name();
        writeln!(out, "/// Method paths of the `{full_name}` service.")?;
        writeln!(out, "pub mod {module} {{")?;
        writeln!(out, "    /// Fully-qualified service name.")?;
        writeln!(out, "    pub const SERVICE: &str = {full_name:?};")?;
        let mut constants = Vec::new();
        for method in service.methods() {
            let constant = snake_case(method.name()).to_uppercase();
            if constant == "SERVICE" || constant == "ALL" || constants.contains(&constant) {
                return Err(format!("method constant `{module}::{constant}` collides").into());
            }
            let path = format!("/{full_name}/{}", method.name());
            writeln!(out, "    /// `{path}`")?;
            writeln!(out, "    pub const {constant}: &str = {path:?};")?;
            constants.push(constant);
        }
        writeln!(
            out,
            "    /// Every method path of the service, in declaration order."
        )?;
        writeln!(
            out,
            "    pub const ALL: &[&str] = &[{}];",
            constants.join(", ")
        )?;
        writeln!(out, "}}")?;
        modules.push(module);
    }
    Ok(out)
}

/// `GroupControllerGetCapabilities` -> `group_controller_get_capabilities`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    let chars: Vec<char> = name.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower = i > 0 && !chars[i - 1].is_ascii_uppercase();
            let next_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            let prev_upper = i > 0 && chars[i - 1].is_ascii_uppercase();
            if i > 0 && (prev_lower || (prev_upper && next_lower)) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
