//! CycloneDX 1.5 SBOMs for one binary on one target: the crates `cargo tree` says are compiled
//! into it (normal dependencies for that target with the features that package's own build
//! resolves; no build scripts, proc-macros or dev-dependencies), with their licences and
//! Cargo.lock checksums, and the dependency edges between them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{Error, time};

/// What to describe.
#[derive(Clone, Debug)]
pub struct Request {
    /// The workspace's `Cargo.toml`.
    pub manifest_path: PathBuf,
    /// The Cargo package the binary comes from.
    pub package: String,
    /// The binary's name.
    pub binary: String,
    /// The Rust target triple it was built for.
    pub target: String,
    /// Components that are not crates of the graph, e.g. `std@1.96.0` for a standard library
    /// built with the binary.
    pub extra: Vec<(String, String)>,
    /// Seconds since the Unix epoch for the SBOM's timestamp.
    pub created: u64,
}

/// A crate of the dependency closure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crate {
    pub name: String,
    pub version: String,
    pub license: String,
    pub repository: String,
    /// A path dependency (a crate of this workspace) rather than a published one.
    pub local: bool,
}

impl Crate {
    fn bom_ref(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// The crates and edges of a dependency closure.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub crates: BTreeMap<String, Crate>,
    pub edges: BTreeSet<(String, String)>,
    /// The root's bom-ref.
    pub root: String,
}

const SEPARATOR: char = '\t';

/// Runs `cargo tree` for the request and parses its output.
pub fn closure(request: &Request) -> Result<Graph, Error> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let format = ["{p}", "{l}", "{r}"].join(&SEPARATOR.to_string());
    let mut command = Command::new(cargo);
    command
        .arg("tree")
        .arg("--locked")
        .arg("--manifest-path")
        .arg(&request.manifest_path)
        .args(["-p", &request.package, "--target", &request.target])
        .args(["-e", "normal,no-proc-macro", "--prefix", "depth"])
        .args(["--format", &format, "--color", "never"]);
    let shown = format!(
        "cargo tree -p {} --target {}",
        request.package, request.target
    );
    let output = command.output().map_err(|e| Error::Command {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if !output.status.success() {
        return Err(Error::Command {
            command: shown,
            detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    parse_tree(&String::from_utf8_lossy(&output.stdout))
}

/// Parses `cargo tree --prefix depth` lines of `{p}\t{l}\t{r}`.
pub fn parse_tree(text: &str) -> Result<Graph, Error> {
    let mut graph = Graph::default();
    let mut stack: Vec<String> = Vec::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let bad = || Error::TreeLine(line.to_owned());
        // A subtree already shown is marked, not repeated.
        let body = line.strip_suffix(" (*)").unwrap_or(line);
        let digits = body.chars().take_while(char::is_ascii_digit).count();
        let depth: usize = body[..digits].parse().map_err(|_| bad())?;
        let mut fields = body[digits..].split(SEPARATOR);
        let package = fields.next().ok_or_else(bad)?;
        let license = fields.next().unwrap_or_default().trim();
        let repository = fields.next().unwrap_or_default().trim();
        let mut words = package.splitn(3, ' ');
        let name = words.next().filter(|n| !n.is_empty()).ok_or_else(bad)?;
        let version = words
            .next()
            .and_then(|v| v.strip_prefix('v'))
            .ok_or_else(bad)?;
        // Published crates have no source note; workspace crates show their folder.
        let local = words.next().is_some_and(|source| source.starts_with("(/"));
        let krate = Crate {
            name: name.to_owned(),
            version: version.to_owned(),
            license: license.to_owned(),
            repository: repository.to_owned(),
            local,
        };
        let id = krate.bom_ref();
        if depth > stack.len() {
            return Err(bad());
        }
        stack.truncate(depth);
        match stack.last() {
            Some(parent) => {
                graph.edges.insert((parent.clone(), id.clone()));
            }
            None if graph.root.is_empty() => graph.root = id.clone(),
            None => return Err(bad()),
        }
        stack.push(id.clone());
        graph.crates.entry(id).or_insert(krate);
    }
    if graph.root.is_empty() {
        return Err(Error::TreeLine(String::new()));
    }
    Ok(graph)
}

/// `name@version` → SHA-256 of the published crate, from Cargo.lock.
pub fn lock_checksums(lock: &str) -> BTreeMap<String, String> {
    let mut checksums = BTreeMap::new();
    let (mut name, mut version) = (None, None);
    for line in lock.lines() {
        let value = |key: &str| {
            line.strip_prefix(key)
                .and_then(|rest| rest.trim().strip_prefix('='))
                .map(|v| v.trim().trim_matches('"').to_owned())
        };
        if line.starts_with("[[package]]") {
            (name, version) = (None, None);
        } else if let Some(v) = value("name") {
            name = Some(v);
        } else if let Some(v) = value("version") {
            version = Some(v);
        } else if let Some(sum) = value("checksum")
            && let (Some(n), Some(v)) = (&name, &version)
        {
            checksums.insert(format!("{n}@{v}"), sum);
        }
    }
    checksums
}

/// The SBOM of a request's binary as CycloneDX JSON.
pub fn generate(request: &Request) -> Result<Value, Error> {
    let graph = closure(request)?;
    let lock_path = request
        .manifest_path
        .parent()
        .unwrap_or(Path::new("."))
        .join("Cargo.lock");
    let lock = std::fs::read_to_string(&lock_path).map_err(Error::io(&lock_path))?;
    Ok(document(request, &graph, &lock_checksums(&lock)))
}

/// Builds the CycloneDX document; a pure function of its inputs, so that it is reproducible.
pub fn document(request: &Request, graph: &Graph, checksums: &BTreeMap<String, String>) -> Value {
    let component = |krate: &Crate, kind: &str| {
        let mut c = json!({
            "type": kind,
            "bom-ref": krate.bom_ref(),
            "name": krate.name,
            "version": krate.version,
        });
        if !krate.license.is_empty() {
            // Old manifests separate alternatives with '/', which is no SPDX expression.
            let expression = krate.license.replace(" / ", " OR ").replace('/', " OR ");
            c["licenses"] = json!([{"expression": expression}]);
        }
        if !krate.local {
            c["purl"] = json!(format!("pkg:cargo/{}@{}", krate.name, krate.version));
        }
        if let Some(sum) = checksums.get(&krate.bom_ref()) {
            c["hashes"] = json!([{"alg": "SHA-256", "content": sum}]);
        }
        if !krate.repository.is_empty() {
            c["externalReferences"] = json!([{"type": "vcs", "url": krate.repository}]);
        }
        c
    };
    let root = graph.crates.get(&graph.root);
    let mut metadata_component = match root {
        Some(krate) => component(krate, "application"),
        None => json!({"type": "application", "bom-ref": graph.root}),
    };
    metadata_component["name"] = json!(request.binary);
    metadata_component["properties"] = json!([
        {"name": "cargo:package", "value": request.package},
        {"name": "rust:target", "value": request.target},
    ]);
    let mut components: Vec<Value> = graph
        .crates
        .values()
        .filter(|krate| krate.bom_ref() != graph.root)
        .map(|krate| component(krate, "library"))
        .collect();
    let mut depends: BTreeMap<String, Vec<String>> = graph
        .crates
        .keys()
        .map(|id| (id.clone(), Vec::new()))
        .collect();
    for (from, to) in &graph.edges {
        depends.entry(from.clone()).or_default().push(to.clone());
    }
    for (name, version) in &request.extra {
        let id = format!("{name}@{version}");
        components
            .push(json!({"type": "library", "bom-ref": id, "name": name, "version": version}));
        depends.entry(id.clone()).or_default();
        depends.entry(graph.root.clone()).or_default().push(id);
    }
    let dependencies: Vec<Value> = depends
        .into_iter()
        .map(|(id, on)| json!({"ref": id, "dependsOn": on}))
        .collect();
    let body = json!({
        "components": components,
        "dependencies": dependencies,
        "component": metadata_component,
    });
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": serial(&body),
        "version": 1,
        "metadata": {
            "timestamp": time::rfc3339(request.created),
            "tools": {"components": [{
                "type": "application",
                "name": env!("CARGO_PKG_NAME"),
                "version": env!("CARGO_PKG_VERSION"),
            }]},
            "component": body["component"],
        },
        "components": body["components"],
        "dependencies": body["dependencies"],
    })
}

/// A UUID (version 8: custom) derived from the content, so that the same SBOM keeps its
/// serial number.
fn serial(body: &Value) -> String {
    let hash = Sha256::digest(body.to_string().as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = "0livenessprobe v0.1.0 (/src/livenessprobe)\tApache-2.0\t\n\
        1sidecar-kit v0.1.0 (/src/sidecar-kit)\tApache-2.0\t\n\
        2tokio v1.54.0\tMIT\thttps://example.invalid/tokio\n\
        3bytes v1.11.0\tMIT\thttps://example.invalid/bytes\n\
        1tokio v1.54.0\tMIT\thttps://example.invalid/tokio (*)\n\
        1old v0.1.0\tMIT/Apache-2.0\t\n";

    #[test]
    fn parses_depths_and_dedup_marks() {
        let graph = parse_tree(TREE).unwrap();
        assert_eq!(graph.root, "livenessprobe@0.1.0");
        assert_eq!(graph.crates.len(), 5);
        assert!(graph.crates["sidecar-kit@0.1.0"].local);
        assert!(!graph.crates["tokio@1.54.0"].local);
        assert_eq!(
            graph.crates["tokio@1.54.0"].repository,
            "https://example.invalid/tokio"
        );
        let edges: Vec<_> = graph
            .edges
            .iter()
            .map(|(a, b)| format!("{a}>{b}"))
            .collect();
        assert_eq!(
            edges,
            [
                "livenessprobe@0.1.0>old@0.1.0",
                "livenessprobe@0.1.0>sidecar-kit@0.1.0",
                "livenessprobe@0.1.0>tokio@1.54.0",
                "sidecar-kit@0.1.0>tokio@1.54.0",
                "tokio@1.54.0>bytes@1.11.0",
            ]
        );
        assert!(parse_tree("2skipped v1.0.0\t\t\n").is_err());
        assert!(parse_tree("").is_err());
    }

    #[test]
    fn document_is_stable_and_complete() {
        let graph = parse_tree(TREE).unwrap();
        let request = Request {
            manifest_path: "Cargo.toml".into(),
            package: "livenessprobe".into(),
            binary: "livenessprobe".into(),
            target: "x86_64-unknown-linux-musl".into(),
            extra: vec![("std".into(), "1.96.0".into())],
            created: 0,
        };
        let sums = lock_checksums(
            "[[package]]\nname = \"tokio\"\nversion = \"1.54.0\"\nsource = \"x\"\nchecksum = \"abc\"\n",
        );
        let doc = document(&request, &graph, &sums);
        assert_eq!(doc, document(&request, &graph, &sums));
        assert_eq!(doc["metadata"]["component"]["name"], "livenessprobe");
        let components = doc["components"].as_array().unwrap();
        assert_eq!(components.len(), 5);
        let tokio = components.iter().find(|c| c["name"] == "tokio").unwrap();
        assert_eq!(tokio["purl"], "pkg:cargo/tokio@1.54.0");
        assert_eq!(tokio["hashes"][0]["content"], "abc");
        let old = components.iter().find(|c| c["name"] == "old").unwrap();
        assert_eq!(old["licenses"][0]["expression"], "MIT OR Apache-2.0");
        let kit = components
            .iter()
            .find(|c| c["name"] == "sidecar-kit")
            .unwrap();
        assert!(kit.get("purl").is_none());
        let serial = doc["serialNumber"].as_str().unwrap();
        assert_eq!(serial.len(), "urn:uuid:".len() + 36);
    }
}
