//! The bad-input inventory of the attacher (`docs/bad-input.md`): flags and driver answers that
//! break the CSI spec. Each gets its clear message and exit code; nothing panics.

#![cfg(unix)]

use crate::common::*;
use csi_proto::methods::identity::GET_PLUGIN_INFO;
use csi_proto::v1;

const BIN: &str = env!("CARGO_BIN_EXE_csi-attacher");

async fn run_to_exit(args: &[&str]) -> (i32, String) {
    let (code, _, stderr) = testkit::process::run_to_exit(BIN, args, WAIT).await;
    (code, stderr)
}

#[tokio::test]
async fn bad_flags_exit_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    // An API server nobody listens on: the flags checked before the first request fail alone.
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"http://127.0.0.1:1\"}\n\
         users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
         current-context: x\n",
    )
    .unwrap();
    let kubeconfig = format!("--kubeconfig={}", path.display());
    let cases: &[(&str, i32, &str)] = &[
        (
            "--csi-address=tcp://x",
            1,
            "CSI address \"tcp://x\": expected an absolute socket path, unix://PATH, a named pipe or dns:///HOST:PORT",
        ),
        ("--csi-address=", 1, "empty CSI address"),
        (
            "--csi-address=unix://",
            1,
            "CSI address \"unix://\": the socket path must be absolute",
        ),
        (
            "--leader-election-labels=a=b=c",
            2,
            "invalid label \"a=b=c\": expected key:value",
        ),
        (
            "--retry-interval-max=soon",
            2,
            "invalid duration \"soon\": expected a Go duration",
        ),
        (
            "--feature-gates=ReleaseLeaderElectionOnExit=maybe",
            2,
            "strconv.ParseBool: parsing \"maybe\": invalid syntax",
        ),
        (
            "--leader-election-lease-duration=-1s",
            2,
            "negative duration \"-1s\" is not allowed here",
        ),
        // A provisioner flag given to the attacher.
        ("--volume-name-prefix=pvc", 2, "volume-name-prefix"),
    ];
    for (flag, code, message) in cases {
        let (exit, stderr) = run_to_exit(&[&kubeconfig, flag]).await;
        assert_eq!(exit, *code, "{flag}: {stderr}");
        assert!(stderr.contains(message), "{flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
    }
}

#[tokio::test]
async fn a_driver_with_an_empty_name_is_refused_at_start() {
    let driver = mock();
    driver.faults().rewrite_answers(
        GET_PLUGIN_INFO,
        u64::MAX,
        |answer: &mut v1::GetPluginInfoResponse| answer.name.clear(),
    );
    let env = Env::without_controller(driver).await;
    let kubeconfig = format!("--kubeconfig={}", env.kubeconfig_path().display());
    let address = format!("--csi-address={}", env.mock.endpoint());
    let (code, stderr) = run_to_exit(&[&kubeconfig, &address]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("driver name is empty"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    env.stop().await;
}

/// Row 67: a VolumeAttachment for this driver whose PV is another driver's. As upstream, the
/// attacher does not judge the PV's driver; it asks its own driver, which does not know the
/// volume: the answer lands in attachError, nothing is published and the attacher goes on.
#[tokio::test]
async fn an_attachment_for_a_pv_of_another_driver_gets_the_drivers_refusal() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    let mut spec = env.csi_pv_spec("foreign-volume");
    spec["csi"]["driver"] = serde_json::json!("other.csi.example.com");
    env.create_pv("pv-foreign", spec).await;
    env.create_pv_va("va-foreign", "pv-foreign", "node-1").await;
    let va = env
        .wait_va("va-foreign", |va| attach_error(va).is_some())
        .await;
    let (message, _) = attach_error(&va).unwrap();
    assert!(message.contains("foreign-volume"), "{message}");
    assert!(!attached(&va));
    assert!(
        env.mock
            .state()
            .volumes
            .values()
            .all(|v| v.published.is_empty())
    );
    // Still serving: an attachment of its own volumes goes through.
    env.attached_volume(1).await;
    env.stop().await;
}
