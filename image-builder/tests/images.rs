//! The image-builder binary end to end: layouts for every platform built twice give the same
//! bytes, the amd64 image unpacks and its entrypoint runs, skopeo (when installed) accepts the
//! index and every platform's image, a tampered blob is refused, and SBOMs follow the target.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const TOOL: &str = env!("CARGO_BIN_EXE_image-builder");
const LINUX: [&str; 5] = [
    "linux/amd64",
    "linux/arm64",
    "linux/arm/v7",
    "linux/ppc64le",
    "linux/s390x",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate lives in the workspace")
        .to_owned()
}

/// The binary to package: the static amd64 provisioner when scripts/linux-static.sh has built
/// it (or IMAGE_TEST_BINARY names one), otherwise this crate's own (native) binary, which runs
/// here just as well.
fn subject() -> (String, PathBuf) {
    if let Some(path) = std::env::var_os("IMAGE_TEST_BINARY") {
        let path = PathBuf::from(path);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        return (name, path);
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let static_provisioner =
        target_dir.join("static/x86_64-unknown-linux-musl/release/csi-provisioner");
    if static_provisioner.is_file() {
        return ("csi-provisioner".into(), static_provisioner);
    }
    ("image-builder".into(), PathBuf::from(TOOL))
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the command starts");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn build(out: &Path, name: &str, binary: &Path, extra: &[&str]) -> String {
    let mut command = Command::new(TOOL);
    command.args(["build", "--name", name, "--version", "v0.1.0"]);
    command.args(["--revision", "0123456789abcdef0123456789abcdef01234567"]);
    command.args(["--source", "https://example.invalid/csi-sidecars"]);
    command
        .args(["--created", "1700000000"])
        .arg("--out")
        .arg(out);
    command.args(extra);
    for platform in LINUX.iter().chain(&["windows/amd64"]) {
        command.arg(format!("{platform}={}", binary.display()));
    }
    run(&mut command)
}

/// Every file of a directory tree with its contents.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap().to_owned();
                files.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

fn skopeo() -> bool {
    let present = Command::new("skopeo")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        assert!(
            std::env::var_os("IMAGE_TEST_REQUIRE_SKOPEO").is_none(),
            "IMAGE_TEST_REQUIRE_SKOPEO is set but skopeo is not installed"
        );
        println!(
            "skopeo is not installed: skipping its checks (scripts/images-test.sh installs it)"
        );
    }
    present
}

#[test]
fn reproducible_image_that_runs_and_that_skopeo_reads() {
    let (name, binary) = subject();
    println!("packaging {name} from {}", binary.display());
    let scratch = tempfile::tempdir().unwrap();
    let first = scratch.path().join("first");
    let second = scratch.path().join("second");
    let report = build(&first, &name, &binary, &[]);
    // Building again over the earlier layout replaces it.
    build(&second, &name, &binary, &[]);
    let again = build(&second, &name, &binary, &[]);
    assert_eq!(report, again, "digests differ between two builds");
    assert_eq!(snapshot(&first), snapshot(&second), "layouts differ");
    assert_eq!(report.lines().count(), 1 + LINUX.len() + 1, "{report}");

    let rootfs = scratch.path().join("rootfs");
    let entrypoint = run(Command::new(TOOL)
        .args(["unpack", "--platform", "linux/amd64", "--layout"])
        .arg(&first)
        .arg("--to")
        .arg(&rootfs));
    let entrypoint: Vec<String> = serde_json::from_str(&entrypoint).unwrap();
    assert_eq!(entrypoint, [format!("/{name}")]);
    let program = rootfs.join(&entrypoint[0][1..]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&program).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "world-readable and executable");
    }
    let help = run(Command::new(&program).arg("--help"));
    assert!(help.to_lowercase().contains("usage"), "{help}");

    if skopeo() {
        let reference = format!("oci:{}:latest", first.display());
        let raw = run(Command::new("skopeo").args(["inspect", "--raw", &reference]));
        let index: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(index["manifests"].as_array().unwrap().len(), 6);
        for platform in LINUX.iter().chain(&["windows/amd64"]) {
            let parts: Vec<&str> = platform.split('/').collect();
            let mut command = Command::new("skopeo");
            command.args([
                "inspect",
                "--override-os",
                parts[0],
                "--override-arch",
                parts[1],
            ]);
            if let Some(variant) = parts.get(2) {
                command.args(["--override-variant", variant]);
            }
            let inspected: serde_json::Value =
                serde_json::from_str(&run(command.arg(&reference))).unwrap();
            assert_eq!(inspected["Os"], parts[0], "{platform}");
            assert_eq!(inspected["Architecture"], parts[1], "{platform}");
            assert_eq!(
                inspected["Labels"]["org.opencontainers.image.revision"],
                "0123456789abcdef0123456789abcdef01234567"
            );
        }
    }
}

/// A stand-in binary for the tests that do not run it.
fn stand_in(dir: &Path) -> PathBuf {
    let path = dir.join("stand-in");
    // Pseudo-random, so that it does not compress to almost nothing.
    let mut state = 0x2545_f491_u32;
    let data: Vec<u8> = (0..200_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    std::fs::write(&path, data).unwrap();
    path
}

#[test]
fn multi_call_links_and_windows_layout() {
    let scratch = tempfile::tempdir().unwrap();
    let layout = scratch.path().join("layout");
    build(
        &layout,
        "csi-sidecars",
        &stand_in(scratch.path()),
        &["--alias", "csi-provisioner", "--alias", "livenessprobe"],
    );
    let rootfs = scratch.path().join("rootfs");
    run(Command::new(TOOL)
        .args(["unpack", "--platform", "linux/s390x", "--layout"])
        .arg(&layout)
        .arg("--to")
        .arg(&rootfs));
    for alias in ["csi-provisioner", "livenessprobe"] {
        let target = std::fs::read_link(rootfs.join(alias)).unwrap();
        assert_eq!(target, Path::new("csi-sidecars"));
    }

    let windows = scratch.path().join("windows");
    let entrypoint = run(Command::new(TOOL)
        .args(["unpack", "--platform", "windows/amd64", "--layout"])
        .arg(&layout)
        .arg("--to")
        .arg(&windows));
    // Relative, so that a HostProcess container finds it in its mount point.
    assert_eq!(entrypoint.trim(), r#"["csi-sidecars.exe"]"#);
    assert!(windows.join("Files/csi-sidecars.exe").is_file());
    assert!(windows.join("Hives").is_dir());
    assert!(!windows.join("Files/csi-provisioner").exists());
}

#[test]
fn tampered_blob_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let layout = scratch.path().join("layout");
    let report = build(&layout, "image", &stand_in(scratch.path()), &[]);
    assert!(report.starts_with("index\tsha256:"));
    // Change one byte in the middle of each layer (the only blobs larger than a few KiB).
    for blob in std::fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let path = blob.unwrap().path();
        let mut data = std::fs::read(&path).unwrap();
        if data.len() > 10_000 {
            let middle = data.len() / 2;
            data[middle] ^= 0xff;
            std::fs::write(&path, data).unwrap();
        }
    }
    let output = Command::new(TOOL)
        .args(["unpack", "--platform", "linux/amd64", "--layout"])
        .arg(&layout)
        .arg("--to")
        .arg(scratch.path().join("rootfs"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not match its digest"), "{stderr}");
}

#[test]
fn sbom_follows_the_target_and_leaves_out_build_only_crates() {
    let scratch = tempfile::tempdir().unwrap();
    let sbom = |target: &str| {
        let out = scratch.path().join(format!("{target}.json"));
        run(Command::new(TOOL)
            .args([
                "sbom",
                "--package",
                "livenessprobe",
                "--binary",
                "livenessprobe",
            ])
            .args([
                "--target",
                target,
                "--component",
                "std@1.0.0",
                "--created",
                "0",
            ])
            .arg("--manifest-path")
            .arg(workspace().join("Cargo.toml"))
            .arg("--out")
            .arg(&out));
        let document: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let names: Vec<String> = document["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        (document, names)
    };
    let (linux, linux_names) = sbom("x86_64-unknown-linux-musl");
    assert_eq!(linux["bomFormat"], "CycloneDX");
    assert_eq!(linux["metadata"]["component"]["name"], "livenessprobe");
    for present in ["tokio", "sidecar-kit", "csi-proto", "std"] {
        assert!(
            linux_names.iter().any(|n| n == present),
            "{present} missing"
        );
    }
    // A dev-dependency, proc-macros and a Windows-only crate are not in a Linux binary.
    for absent in [
        "tempfile",
        "testkit",
        "thiserror-impl",
        "tokio-macros",
        "windows-sys",
    ] {
        assert!(!linux_names.iter().any(|n| n == absent), "{absent} listed");
    }
    let (_, windows_names) = sbom("x86_64-pc-windows-gnu");
    assert!(windows_names.iter().any(|n| n == "windows-sys"));
    // The same inputs give the same document.
    let (again, _) = sbom("x86_64-unknown-linux-musl");
    assert_eq!(linux, again);
}
