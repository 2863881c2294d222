//! The multi-call binary run for real: each sidecar's own help and version, dispatch by a link's
//! name, a clear error for an unknown name, and a sidecar serving through it.
#![cfg(unix)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sidecar_kit::cluster::client::KubeconfigRule;
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::MockDriver;
use testkit::process::CleanEnv;

const BIN: &str = env!("CARGO_BIN_EXE_csi-sidecars");

fn run(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN).clean_env().args(args).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn each_sidecar_answers_with_its_own_flags() {
    for (name, flag) in [
        ("provisioner", "--volume-name-prefix"),
        ("csi-attacher", "--worker-threads"),
        ("resizer", "--handle-volume-inuse-error"),
        ("snapshotter", "--snapshot-name-prefix"),
        ("registrar", "--kubelet-registration-path"),
        ("livenessprobe", "--probe-timeout"),
    ] {
        let (code, stdout, stderr) = run(&[name, "--help"]);
        assert_eq!(code, 0, "{name}: {stderr}");
        assert!(
            stdout.contains(flag),
            "{name} --help lacks {flag}:\n{stdout}"
        );
    }
    let (code, stdout, _) = run(&["attacher", "--version"]);
    assert_eq!(code, 0);
    assert!(
        stdout.trim().ends_with(env!("CARGO_PKG_VERSION")),
        "{stdout}"
    );
    // A sidecar's flag errors are the sidecar's: exit 2, as Go's flag package.
    let (code, _, stderr) = run(&["provisioner", "--no-such-flag"]);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn usage_and_unknown_sidecars() {
    let (code, stdout, _) = run(&[]);
    assert_eq!(code, 0);
    assert!(stdout.contains("csi-provisioner") && stdout.contains("livenessprobe"));
    let (code, _, stderr) = run(&["volume-populator"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("unknown sidecar \"volume-populator\""),
        "{stderr}"
    );
}

#[test]
fn a_link_named_after_a_sidecar_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("csi-node-driver-registrar");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let output = Command::new(&link)
        .clean_env()
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&output.stdout).contains("--kubelet-registration-path"));
}

#[tokio::test]
async fn the_livenessprobe_serves_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockDriver::builder()
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let port = free_port().unwrap();
    let mut command = tokio::process::Command::new(BIN);
    command.clean_env();
    testkit::process::die_with_parent(&mut command);
    let mut child = command
        .args([
            "livenessprobe".to_string(),
            format!("--csi-address={}", mock.socket_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((200, body)) = http_get(port, "/healthz").await {
            assert_eq!(body.trim(), "ok");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no /healthz through the multi-call binary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    mock.shutdown().await.unwrap();
}

/// Each sidecar of the multi-call binary reads its kubeconfig by its upstream's rule; the
/// all-in-one process, which has no upstream, lets the flag win and falls back to
/// `$KUBECONFIG`, then to the in-cluster configuration. Each one's `--help` words the rule it is
/// seen to follow, and no other.
#[tokio::test]
async fn each_binary_keeps_its_kubeconfig_rule_and_says_so() {
    use testkit::process::{KubeconfigRead::*, kubeconfig_reads};
    let csi = "--csi-address=/nonexistent/csi.sock";
    let cases: [(&[&str], [testkit::process::KubeconfigRead; 3]); 7] = [
        (&["provisioner", csi], [Environment, Environment, Flag]),
        (&["attacher", csi], [Flag, InCluster, Flag]),
        (&["resizer", csi], [Flag, InCluster, Flag]),
        (&["snapshotter", csi], [Flag, InCluster, Flag]),
        (&["health-monitor", csi], [Flag, InCluster, Flag]),
        (
            &["--controllers=provisioner,attacher", csi],
            [Flag, Environment, Flag],
        ),
        (&["--controllers=*", csi], [Flag, Environment, Flag]),
    ];
    for (args, expected) in cases {
        let reads = kubeconfig_reads(BIN, args).await;
        assert_eq!(reads, expected, "{args:?}");
        let seen = rule_reading(reads);
        let help = match args[0] {
            all_in_one if all_in_one.starts_with("--") => run(&["--help"]).1,
            sidecar => run(&[sidecar, "--help"]).1,
        };
        for rule in RULES {
            assert_eq!(
                help.contains(rule.help()),
                rule == seen,
                "{args:?} reads by {seen:?}; its help:\n{help}"
            );
        }
    }
}

const RULES: [KubeconfigRule; 3] = [
    KubeconfigRule::FlagOnly,
    KubeconfigRule::EnvironmentFirst,
    KubeconfigRule::FlagFirst,
];

/// The rule that reads what `reads` saw: with the flag and the variable set, the variable
/// alone, the flag alone.
fn rule_reading(reads: [testkit::process::KubeconfigRead; 3]) -> KubeconfigRule {
    use testkit::process::KubeconfigRead::*;
    let picks = |rule: KubeconfigRule| {
        [("flag", Some("env")), ("", Some("env")), ("flag", None)].map(|(flag, environment)| {
            match rule.choose(flag, environment).as_deref() {
                Some("flag") => Flag,
                Some(_) => Environment,
                None => InCluster,
            }
        })
    };
    RULES
        .into_iter()
        .find(|rule| picks(*rule) == reads)
        .unwrap_or_else(|| panic!("no rule reads {reads:?}"))
}
