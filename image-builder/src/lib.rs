//! Builds OCI image layouts for the sidecars without a container engine: one reproducible
//! layer per platform holding the static binary at the path upstream's images use, a
//! multi-arch image index over them, and CycloneDX SBOMs from the binary's Cargo dependency
//! closure. Also reads the layouts back, to unpack a platform's root filesystem.

pub mod oci;
pub mod sbom;
pub mod tar;
mod time;

use std::path::PathBuf;

/// Everything that can go wrong building or reading an image or an SBOM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("path {0:?} cannot be stored in a layer")]
    BadPath(String),
    #[error("{0} is too large for a tar header")]
    TooLarge(String),
    #[error("malformed tar archive: {0}")]
    Tar(&'static str),
    #[error("malformed platform {0:?}: expected os/architecture[/variant]")]
    BadPlatform(String),
    #[error("platform {0} given twice")]
    DuplicatePlatform(String),
    #[error("no platform given")]
    NoPlatform,
    #[error("{0} exists and is not an OCI image layout; refusing to replace it")]
    NotALayout(PathBuf),
    #[error("malformed image layout: {0}")]
    Layout(String),
    #[error("blob {0} does not match its digest")]
    DigestMismatch(String),
    #[error("no image for {platform} under tag {tag}")]
    NoSuchImage { tag: String, platform: String },
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("cargo tree gave an unexpected line: {0:?}")]
    TreeLine(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}
