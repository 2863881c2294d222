//! OCI image layouts (image-spec v1.1): one single-layer image per platform, an image index over
//! them, and the layout's `index.json` naming that index by tag. Reading goes the other way and
//! checks every blob against its digest.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::tar::{self, Entry, Kind};
use crate::{Error, time};

pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// distroless/static's search path, so that a command without a folder resolves as it does in
/// upstream's images.
const LINUX_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// An image platform as the image index names it: `linux/arm/v7`, `windows/amd64`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl FromStr for Platform {
    type Err = Error;

    fn from_str(text: &str) -> Result<Platform, Error> {
        let parts: Vec<&str> = text.split('/').collect();
        let valid = |part: &&str| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        };
        match parts.as_slice() {
            [os, architecture] | [os, architecture, _]
                if parts.iter().all(valid) && matches!(*os, "linux" | "windows") =>
            {
                Ok(Platform {
                    os: os.to_string(),
                    architecture: architecture.to_string(),
                    variant: parts.get(2).map(|v| v.to_string()),
                })
            }
            _ => Err(Error::BadPlatform(text.to_owned())),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

impl Platform {
    fn is_windows(&self) -> bool {
        self.os == "windows"
    }

    fn to_json(&self) -> Value {
        let mut platform = json!({"os": self.os, "architecture": self.architecture});
        if let Some(variant) = &self.variant {
            platform["variant"] = json!(variant);
        }
        platform
    }
}

/// What the image says about itself: its labels and annotations, and the time of every
/// timestamp in it.
#[derive(Clone, Debug)]
pub struct Metadata {
    /// The binary's name, which is also the image's title: `csi-provisioner`.
    pub name: String,
    /// The tag `index.json` gives the image index.
    pub tag: String,
    pub version: String,
    pub revision: String,
    pub source: String,
    /// Seconds since the Unix epoch (the commit time, for reproducible images).
    pub created: u64,
}

/// One platform's binary.
#[derive(Clone, Debug)]
pub struct Binary {
    pub platform: Platform,
    pub path: PathBuf,
}

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: &'static str,
    /// `sha256:<hex>`.
    pub digest: String,
    pub size: u64,
}

impl Descriptor {
    fn to_json(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// One platform's image in a built layout.
#[derive(Clone, Debug)]
pub struct Image {
    pub platform: Platform,
    pub manifest: Descriptor,
    /// The compressed layer: what a node pulls.
    pub layer: Descriptor,
    pub binary_size: u64,
}

/// What [`build`] wrote.
#[derive(Clone, Debug)]
pub struct Built {
    pub index: Descriptor,
    pub images: Vec<Image>,
}

/// Writes an OCI image layout at `out` with one image per binary, every Linux image holding
/// the binary at `/<name>` (plus a link `/<alias>` to it per alias, for a multi-call binary) and
/// every Windows image holding `<name>.exe` with a relative entrypoint, as HostProcess
/// containers need. An existing layout at `out` is replaced.
pub fn build(
    out: &Path,
    metadata: &Metadata,
    aliases: &[String],
    binaries: &[Binary],
) -> Result<Built, Error> {
    if binaries.is_empty() {
        return Err(Error::NoPlatform);
    }
    let mut platforms: Vec<&Platform> = binaries.iter().map(|b| &b.platform).collect();
    platforms.sort();
    if let Some(pair) = platforms.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(Error::DuplicatePlatform(pair[0].to_string()));
    }
    prepare(out)?;
    let annotations = annotations(metadata);
    let mut images = Vec::new();
    // Identical layers (one binary for several platforms, as in tests) are compressed once.
    let mut layers: BTreeMap<String, Descriptor> = BTreeMap::new();
    for binary in binaries {
        let data = std::fs::read(&binary.path).map_err(Error::io(&binary.path))?;
        let binary_size = data.len() as u64;
        let (entries, entrypoint) = rootfs(&metadata.name, aliases, &binary.platform, data)?;
        let layer_tar = tar::write(&entries, metadata.created)?;
        let diff_id = sha256(&layer_tar);
        let layer = match layers.get(&diff_id) {
            Some(layer) => layer.clone(),
            None => write_blob(out, LAYER, &gzip(&layer_tar, out)?)?,
        };
        layers.insert(diff_id.clone(), layer.clone());
        let mut config = json!({
            "created": time::rfc3339(metadata.created),
            "architecture": binary.platform.architecture,
            "os": binary.platform.os,
            "config": {
                "Entrypoint": [entrypoint],
                "Labels": annotations,
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{
                "created": time::rfc3339(metadata.created),
                "created_by": format!("image-builder: {}", metadata.name),
            }],
        });
        if let Some(variant) = &binary.platform.variant {
            config["variant"] = json!(variant);
        }
        if !binary.platform.is_windows() {
            config["config"]["Env"] = json!([LINUX_PATH]);
        }
        let config = write_blob(out, CONFIG, &serde_json::to_vec(&config)?)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config.to_json(),
            "layers": [layer.to_json()],
            "annotations": annotations,
        });
        let manifest = write_blob(out, MANIFEST, &serde_json::to_vec(&manifest)?)?;
        images.push(Image {
            platform: binary.platform.clone(),
            manifest,
            layer,
            binary_size,
        });
    }
    let manifests: Vec<Value> = images
        .iter()
        .map(|image| {
            let mut entry = image.manifest.to_json();
            entry["platform"] = image.platform.to_json();
            entry
        })
        .collect();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": manifests,
        "annotations": annotations,
    });
    let index = write_blob(out, INDEX, &serde_json::to_vec(&index)?)?;
    let mut named = annotations.clone();
    named.insert(REF_NAME.to_owned(), metadata.tag.clone());
    let mut entry = index.to_json();
    entry["annotations"] = json!(named);
    let top = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry]});
    write_file(&out.join("index.json"), &serde_json::to_vec(&top)?)?;
    Ok(Built { index, images })
}

fn annotations(metadata: &Metadata) -> BTreeMap<String, String> {
    [
        ("created", time::rfc3339(metadata.created)),
        ("revision", metadata.revision.clone()),
        ("source", metadata.source.clone()),
        ("title", metadata.name.clone()),
        ("version", metadata.version.clone()),
    ]
    .into_iter()
    .map(|(key, value)| (format!("org.opencontainers.image.{key}"), value))
    .collect()
}

/// The layer's entries and the entrypoint for a platform.
fn rootfs(
    name: &str,
    aliases: &[String],
    platform: &Platform,
    data: Vec<u8>,
) -> Result<(Vec<Entry>, String), Error> {
    if name.contains(['/', '\\']) || name.is_empty() {
        return Err(Error::BadPath(name.to_owned()));
    }
    if platform.is_windows() {
        // Windows layers keep the container's files under Files/ and its registry hives under
        // Hives/ (empty here: a HostProcess container uses the host's).
        let exe = format!("{name}.exe");
        let entries = vec![
            Entry::dir("Files", 0o755),
            Entry::dir("Hives", 0o755),
            Entry::file(&format!("Files/{exe}"), 0o755, data),
        ];
        return Ok((entries, exe));
    }
    // World-readable and executable, so that any runAsUser can start it.
    let mut entries = vec![Entry::file(name, 0o755, data)];
    for alias in aliases {
        if alias == name || alias.contains(['/', '\\']) {
            return Err(Error::BadPath(alias.clone()));
        }
        entries.push(Entry::symlink(alias, name));
    }
    Ok((entries, format!("/{name}")))
}

/// Creates an empty layout directory, replacing an earlier layout but nothing else.
fn prepare(out: &Path) -> Result<(), Error> {
    if out.exists() {
        let mut contents = std::fs::read_dir(out).map_err(Error::io(out))?;
        if out.join("oci-layout").is_file() {
            std::fs::remove_dir_all(out).map_err(Error::io(out))?;
        } else if contents.next().is_some() {
            return Err(Error::NotALayout(out.to_owned()));
        }
    }
    let blobs = out.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs).map_err(Error::io(&blobs))?;
    write_file(
        &out.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
}

/// gzip with a fixed header (no name, time 0, unknown OS) so that equal layers compress to
/// equal bytes. The default level: the best one is five times slower on these binaries for 1 %.
fn gzip(data: &[u8], out: &Path) -> Result<Vec<u8>, Error> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).map_err(Error::io(out))?;
    encoder.finish().map_err(Error::io(out))
}

fn sha256(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in hash.iter() {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

fn write_blob(out: &Path, media_type: &'static str, data: &[u8]) -> Result<Descriptor, Error> {
    let digest = sha256(data);
    let path = blob_path(out, &digest)?;
    write_file(&path, data)?;
    Ok(Descriptor {
        media_type,
        digest,
        size: data.len() as u64,
    })
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), Error> {
    std::fs::write(path, data).map_err(Error::io(path))
}

fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf, Error> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|hex| hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| Error::Layout(format!("unsupported digest {digest:?}")))?;
    Ok(layout.join("blobs").join("sha256").join(hex))
}

/// Reads a blob and checks it against its digest.
fn read_blob(layout: &Path, digest: &str) -> Result<Vec<u8>, Error> {
    let path = blob_path(layout, digest)?;
    let data = std::fs::read(&path).map_err(Error::io(&path))?;
    if sha256(&data) != digest {
        return Err(Error::DigestMismatch(digest.to_owned()));
    }
    Ok(data)
}

fn read_json(layout: &Path, digest: &str) -> Result<Value, Error> {
    Ok(serde_json::from_slice(&read_blob(layout, digest)?)?)
}

fn str_field<'a>(value: &'a Value, field: &str) -> Result<&'a str, Error> {
    value[field]
        .as_str()
        .ok_or_else(|| Error::Layout(format!("{field} missing")))
}

/// A platform's image read back from a layout.
#[derive(Debug)]
pub struct Unpacked {
    /// The image configuration.
    pub config: Value,
    /// The layer's entries.
    pub entries: Vec<Entry>,
}

/// Reads the image for `platform` under `tag` from a layout, checking every blob's digest and
/// the layer against the configuration's diff_id.
pub fn read(layout: &Path, tag: &str, platform: &Platform) -> Result<Unpacked, Error> {
    let no_image = || Error::NoSuchImage {
        tag: tag.to_owned(),
        platform: platform.to_string(),
    };
    let top_path = layout.join("index.json");
    let top: Value =
        serde_json::from_slice(&std::fs::read(&top_path).map_err(Error::io(&top_path))?)?;
    let named = top["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|entry| entry["annotations"][REF_NAME] == tag)
        .ok_or_else(no_image)?;
    let mut manifest_digest = str_field(named, "digest")?.to_owned();
    if named["mediaType"] == INDEX {
        let index = read_json(layout, &manifest_digest)?;
        let wanted = platform.to_json();
        let entry = index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|entry| entry["platform"] == wanted)
            .ok_or_else(no_image)?;
        manifest_digest = str_field(entry, "digest")?.to_owned();
    }
    let manifest = read_json(layout, &manifest_digest)?;
    let config = read_json(layout, str_field(&manifest["config"], "digest")?)?;
    if config["os"] != platform.os.as_str() || config["architecture"] != platform.architecture {
        return Err(Error::Layout(format!(
            "the configuration of {manifest_digest} is not for {platform}"
        )));
    }
    let layers = manifest["layers"]
        .as_array()
        .ok_or_else(|| Error::Layout("layers missing".into()))?;
    let diff_ids = config["rootfs"]["diff_ids"]
        .as_array()
        .ok_or_else(|| Error::Layout("diff_ids missing".into()))?;
    if layers.len() != diff_ids.len() {
        return Err(Error::Layout("layers and diff_ids differ in number".into()));
    }
    let mut entries = Vec::new();
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        let compressed = read_blob(layout, str_field(layer, "digest")?)?;
        let mut archive = Vec::new();
        flate2::read::GzDecoder::new(compressed.as_slice())
            .read_to_end(&mut archive)
            .map_err(Error::io(layout))?;
        if diff_id.as_str() != Some(sha256(&archive).as_str()) {
            return Err(Error::DigestMismatch(format!("diff_id {diff_id}")));
        }
        entries.extend(tar::read(&archive)?);
    }
    Ok(Unpacked { config, entries })
}

/// Unpacks a Linux image's root filesystem into `dest` (created if missing).
pub fn unpack(layout: &Path, tag: &str, platform: &Platform, dest: &Path) -> Result<Value, Error> {
    let unpacked = read(layout, tag, platform)?;
    std::fs::create_dir_all(dest).map_err(Error::io(dest))?;
    for entry in &unpacked.entries {
        let path = dest.join(tar::safe_path(&entry.path)?);
        match &entry.kind {
            Kind::Dir => std::fs::create_dir_all(&path).map_err(Error::io(&path))?,
            Kind::File(data) => {
                write_file(&path, data)?;
                set_mode(&path, entry.mode)?;
            }
            // Links stay inside the root, so that later entries cannot be written through
            // one to a place outside it.
            Kind::Symlink(target) => symlink(tar::safe_path(target)?, &path)?,
        }
    }
    Ok(unpacked.config)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(Error::io(path))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> Result<(), Error> {
    Ok(())
}

#[cfg(unix)]
fn symlink(target: &str, path: &Path) -> Result<(), Error> {
    std::os::unix::fs::symlink(target, path).map_err(Error::io(path))
}

#[cfg(not(unix))]
fn symlink(_target: &str, path: &Path) -> Result<(), Error> {
    Err(Error::BadPath(path.display().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms() {
        let arm: Platform = "linux/arm/v7".parse().unwrap();
        assert_eq!(arm.variant.as_deref(), Some("v7"));
        assert_eq!(arm.to_string(), "linux/arm/v7");
        assert_eq!(
            arm.to_json(),
            json!({"os": "linux", "architecture": "arm", "variant": "v7"})
        );
        for bad in [
            "linux",
            "darwin/amd64",
            "linux//v7",
            "linux/amd64/v1/x",
            "Linux/amd64",
        ] {
            assert!(bad.parse::<Platform>().is_err(), "{bad}");
        }
    }

    #[test]
    fn digests_are_sha256_hex() {
        assert_eq!(
            sha256(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(blob_path(Path::new("x"), "sha256:../../etc").is_err());
    }
}
