//! Command-line handling of the real binary: exit codes and messages.

use std::time::Duration;

use crate::common::process::run_to_exit;

const WAIT: Duration = Duration::from_secs(20);
#[cfg(not(windows))]
const REG: &str = "--kubelet-registration-path=/var/lib/kubelet/plugins/d/csi.sock";
#[cfg(windows)]
const REG: &str = r"--kubelet-registration-path=C:\var\lib\kubelet\plugins\d\csi.sock";

#[tokio::test]
async fn missing_kubelet_registration_path_exits_1() {
    let (status, output) = run_to_exit(&["--csi-address=/csi/csi.sock"], WAIT).await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output.contains("kubelet-registration-path is a required parameter"),
        "{output}"
    );
}

#[tokio::test]
async fn health_port_and_http_endpoint_are_exclusive() {
    let (status, output) =
        run_to_exit(&[REG, "--health-port=9809", "--http-endpoint=:9809"], WAIT).await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output.contains("only one of `--health-port` and `--http-endpoint` can be set"),
        "{output}"
    );
}

#[tokio::test]
async fn bad_values_exit_2_as_go_flag_does() {
    for bad in [
        "--timeout=10",
        "--timeout=-1s",
        "--connection-timeout=soon",
        "--socket-check-interval=5",
        "--health-port=ninety",
        "--no-such-flag",
    ] {
        let (status, output) = run_to_exit(&[REG, bad], WAIT).await;
        assert_eq!(status.code(), Some(2), "{bad}: {output}");
    }
}

#[tokio::test]
async fn unix_scheme_in_kubelet_registration_path_is_refused_with_advice() {
    let (status, output) = run_to_exit(
        &["--kubelet-registration-path=unix:///var/lib/kubelet/plugins/d/csi.sock"],
        WAIT,
    )
    .await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output.contains("pass --kubelet-registration-path=/var/lib/kubelet/plugins/d/csi.sock"),
        "{output}"
    );
}

#[tokio::test]
async fn relative_kubelet_registration_path_is_refused() {
    let (status, output) =
        run_to_exit(&["-kubelet-registration-path", "plugins/d/csi.sock"], WAIT).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let expected = if cfg!(windows) {
        "must be an absolute Windows path with a drive letter"
    } else {
        "must be the absolute path"
    };
    assert!(output.contains(expected), "{output}");
}

#[tokio::test]
async fn kubelet_registration_probe_mode_exits_0_at_once() {
    // No driver, no registration directory: the deprecated probe succeeds regardless.
    let (status, output) = run_to_exit(
        &[
            REG,
            "--mode=kubelet-registration-probe",
            "--csi-address=/nowhere/csi.sock",
        ],
        WAIT,
    )
    .await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains("deprecated"), "{output}");
}

#[tokio::test]
async fn version_prints_and_exits_0() {
    let (status, output) = run_to_exit(&["--version"], WAIT).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains(env!("CARGO_PKG_VERSION")), "{output}");
}

#[tokio::test]
async fn help_documents_the_flags() {
    let (status, output) = run_to_exit(&["--help"], WAIT).await;
    assert_eq!(status.code(), Some(0), "{output}");
    for flag in [
        "--csi-address",
        "--kubelet-registration-path",
        "--plugin-registration-path",
        "--timeout",
        "--http-endpoint",
        "--health-port",
        "--mode",
        "--enable-pprof",
        "--connection-timeout",
        "--driver-startup-timeout",
        "--socket-check-interval",
        "--version",
        "--automaxprocs",
        "--v",
        "--logging-format",
    ] {
        assert!(
            output.contains(flag),
            "{flag} missing from --help:\n{output}"
        );
    }
    assert!(output.contains("no effect"), "{output}");
    assert!(output.contains("[default: 2m]"), "{output}");
}

#[tokio::test]
async fn deprecated_flags_are_accepted_with_warnings() {
    // The deprecated flags parse; the run then fails on the missing driver within its bound.
    let dir = tempfile::tempdir().unwrap();
    let csi = format!("--csi-address={}", dir.path().join("none.sock").display());
    let (status, output) = run_to_exit(
        &[
            REG,
            &csi,
            "--connection-timeout=15s",
            "--enable-pprof",
            "--driver-startup-timeout=200ms",
        ],
        WAIT,
    )
    .await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output.contains("--connection-timeout is deprecated and will have no effect"),
        "{output}"
    );
    assert!(output.contains("--enable-pprof has no effect"), "{output}");
}
