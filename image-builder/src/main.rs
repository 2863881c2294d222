//! `image-builder`: OCI image layouts and SBOMs for the sidecars, without a container engine.
//! See the crate's README.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use image_builder::oci::{self, Binary, Metadata, Platform};
use image_builder::{Error, sbom};

#[derive(Parser)]
#[command(
    version,
    about = "Reproducible OCI image layouts and SBOMs for the CSI sidecars"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes an OCI image layout with a multi-arch image index over one image per binary.
    /// Prints the index digest, then per platform: platform, manifest digest, binary bytes,
    /// compressed layer bytes (tab-separated).
    Build {
        /// The layout directory; an earlier layout there is replaced.
        #[arg(long)]
        out: PathBuf,
        /// The binary's name in the image: `/NAME` on Linux, `NAME.exe` on Windows.
        #[arg(long)]
        name: String,
        /// Links to the binary at `/ALIAS` in Linux images (for a multi-call binary).
        #[arg(long = "alias")]
        aliases: Vec<String>,
        #[arg(long, default_value = "latest")]
        tag: String,
        #[arg(long)]
        version: String,
        #[arg(long)]
        revision: String,
        #[arg(long)]
        source: String,
        /// Seconds since the Unix epoch for every timestamp (and file time) in the image.
        #[arg(long, env = "SOURCE_DATE_EPOCH", default_value_t = 0)]
        created: u64,
        /// PLATFORM=PATH, e.g. linux/arm/v7=target/…/csi-provisioner.
        #[arg(required = true, value_parser = parse_binary)]
        binaries: Vec<Binary>,
    },
    /// Writes a CycloneDX SBOM of a binary's dependency closure on a target.
    Sbom {
        #[arg(long, default_value = "Cargo.toml")]
        manifest_path: PathBuf,
        #[arg(long)]
        package: String,
        #[arg(long)]
        binary: String,
        /// The Rust target triple.
        #[arg(long)]
        target: String,
        /// NAME@VERSION of a component that is not a crate of the graph (e.g. std@1.96.0).
        #[arg(long = "component", value_parser = parse_component)]
        components: Vec<(String, String)>,
        #[arg(long, env = "SOURCE_DATE_EPOCH", default_value_t = 0)]
        created: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// Unpacks a platform's root filesystem from a layout and prints its entrypoint as JSON.
    Unpack {
        #[arg(long)]
        layout: PathBuf,
        #[arg(long, default_value = "latest")]
        tag: String,
        #[arg(long, default_value = "linux/amd64")]
        platform: Platform,
        #[arg(long)]
        to: PathBuf,
    },
}

fn parse_binary(text: &str) -> Result<Binary, String> {
    let (platform, path) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected PLATFORM=PATH"))?;
    Ok(Binary {
        platform: platform.parse().map_err(|e: Error| e.to_string())?,
        path: path.into(),
    })
}

fn parse_component(text: &str) -> Result<(String, String), String> {
    match text.split_once('@') {
        Some((name, version)) if !name.is_empty() && !version.is_empty() => {
            Ok((name.to_owned(), version.to_owned()))
        }
        _ => Err(format!("{text:?}: expected NAME@VERSION")),
    }
}

fn run(command: Command) -> Result<(), Error> {
    match command {
        Command::Build {
            out,
            name,
            aliases,
            tag,
            version,
            revision,
            source,
            created,
            binaries,
        } => {
            let metadata = Metadata {
                name,
                tag,
                version,
                revision,
                source,
                created,
            };
            let built = oci::build(&out, &metadata, &aliases, &binaries)?;
            println!("index\t{}", built.index.digest);
            for image in &built.images {
                println!(
                    "{}\t{}\t{}\t{}",
                    image.platform, image.manifest.digest, image.binary_size, image.layer.size
                );
            }
        }
        Command::Sbom {
            manifest_path,
            package,
            binary,
            target,
            components,
            created,
            out,
        } => {
            let request = sbom::Request {
                manifest_path,
                package,
                binary,
                target,
                extra: components,
                created,
            };
            let document = sbom::generate(&request)?;
            let mut text = serde_json::to_vec_pretty(&document)?;
            text.push(b'\n');
            std::fs::write(&out, text).map_err(|source| Error::Io { path: out, source })?;
        }
        Command::Unpack {
            layout,
            tag,
            platform,
            to,
        } => {
            let config = oci::unpack(&layout, &tag, &platform, &to)?;
            println!("{}", config["config"]["Entrypoint"]);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("image-builder: {error}");
            ExitCode::FAILURE
        }
    }
}
