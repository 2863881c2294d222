//! Command-line handling of the real binary: exit codes and messages.

use std::time::Duration;

use crate::common::process::{run_to_exit, run_to_exit_streams};

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
        "--log-text-info-buffer-size=1K",
        "--log-json-split-stream=yes",
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

/// component-base's split streams: in text, info on stdout and warnings and errors on stderr;
/// in JSON only errors on stderr. Without them everything goes to stderr. The info buffer sizes
/// are accepted.
#[tokio::test]
async fn split_streams_send_messages_by_severity() {
    const INFO: &str = "starting node-driver-registrar";
    const WARNING: &str = "--connection-timeout is deprecated";
    const ERROR: &str = "cannot connect to the CSI driver";
    // A run that warns, starts and fails at once: no driver.
    let dir = tempfile::tempdir().unwrap();
    let csi = format!("--csi-address={}", dir.path().join("none.sock").display());
    let run = [
        REG,
        &csi,
        "--connection-timeout=15s",
        "--driver-startup-timeout=200ms",
    ];
    let cases: [(&[&str], &[&str]); 4] = [
        (&[], &[]),
        (
            &[
                "--log-text-split-stream",
                "--log-text-info-buffer-size=64Ki",
            ],
            &[INFO],
        ),
        (
            &[
                "--logging-format=json",
                "--log-json-split-stream",
                "-log-json-info-buffer-size",
                "1M",
            ],
            &[INFO, WARNING],
        ),
        // A format splits on its own flag only.
        (&["--logging-format=json", "--log-text-split-stream"], &[]),
    ];
    for (flags, on_stdout) in cases {
        let args: Vec<&str> = run.iter().chain(flags).copied().collect();
        let (status, out, err) = run_to_exit_streams(&args, WAIT).await;
        assert_eq!(status.code(), Some(1), "{flags:?}: {err}");
        for message in [INFO, WARNING, ERROR] {
            let (expected, other) = if on_stdout.contains(&message) {
                (&out, &err)
            } else {
                (&err, &out)
            };
            assert!(
                expected.contains(message) && !other.contains(message),
                "{flags:?}: {message:?}\nstdout: {out}\nstderr: {err}"
            );
        }
    }
}
