//! The bad-input inventory of the provisioner (`docs/bad-input.md`): flags, StorageClass
//! parameters, malformed claims and driver answers that break the CSI spec. Each gets its clear
//! message; nothing panics and nothing is lost.

#![cfg(unix)]

use crate::common::{Env, WAIT, mock, requests};
use csi_proto::methods::controller::CREATE_VOLUME;
use csi_proto::methods::identity::GET_PLUGIN_INFO;
use csi_proto::v1;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");

async fn run_to_exit(args: &[&str]) -> (i32, String) {
    let (code, _, stderr) = testkit::process::run_to_exit(BIN, args, WAIT).await;
    (code, stderr)
}

/// A kubeconfig of an API server nobody listens on: the flags checked before the first API
/// request fail on their own.
fn unreachable_kubeconfig(dir: &std::path::Path) -> String {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"http://127.0.0.1:1\"}\n\
         users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
         current-context: x\n",
    )
    .unwrap();
    format!("--kubeconfig={}", path.display())
}

#[tokio::test]
async fn bad_flags_exit_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = unreachable_kubeconfig(dir.path());
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
            "--volume-name-prefix=",
            1,
            "volume name prefix cannot be of length 0",
        ),
        (
            "--volume-name-uuid-length=99",
            1,
            "--volume-name-uuid-length must be -1 or between 1 and 32, not 99",
        ),
        (
            "--leader-election-labels=bad",
            2,
            "invalid label \"bad\": expected key:value",
        ),
        (
            "--retry-interval-start=soon",
            2,
            "invalid duration \"soon\": expected a Go duration",
        ),
        (
            "--feature-gates=Topology=maybe",
            2,
            "invalid value of Topology=maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax",
        ),
        (
            "--feature-gates=Topology",
            2,
            "missing bool value for Topology",
        ),
        (
            "--leader-election-lease-duration=-1s",
            2,
            "negative duration \"-1s\" is not allowed here",
        ),
        ("--kube-api-qps=fast", 2, "invalid float literal"),
        (
            "--worker-threads=-1",
            2,
            "invalid value '-1' for '--worker-threads <N>'",
        ),
        ("--logging-format=xml", 2, "[possible values: text, json]"),
        ("--v=abc", 2, "invalid value 'abc' for '--v <LEVEL>'"),
    ];
    for (flag, code, message) in cases {
        let (exit, stderr) = run_to_exit(&[&kubeconfig, flag]).await;
        assert_eq!(exit, *code, "{flag}: {stderr}");
        assert!(stderr.contains(message), "{flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
    }
}

#[tokio::test]
async fn bad_classes_and_claims_get_clear_events() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let both = env
        .create_class(json!({"parameters": {"csi.storage.k8s.io/fstype": "ext4", "fstype": "xfs"}}))
        .await;
    env.create_claim("both-fstype", &both, json!({})).await;
    let half = env
        .create_class(json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "s"}}))
        .await;
    env.create_claim("half-secret", &half, json!({})).await;
    let dns = env
        .create_class(json!({"parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "Bad_Name",
            "csi.storage.k8s.io/provisioner-secret-namespace": "default"}}))
        .await;
    env.create_claim("bad-secret-name", &dns, json!({})).await;
    let ok = env.create_class(json!({})).await;
    // Claims kube-apiserver refuses never reach a provisioner; the API server's answer is what
    // the user sees (the provisioner's own checks of these are in its decide tests).
    let storage = |q: &str| json!({"spec": {"resources": {"requests": {"storage": q}}}});
    for (claim, extra, code, message) in [
        (
            "negative",
            storage("-1"),
            422,
            "spec.resources[storage]: Invalid value: \"-1\": must be greater than zero",
        ),
        (
            "zebi",
            storage("1Zi"),
            400,
            "quantities must match the regular expression",
        ),
        (
            "mode",
            json!({"spec": {"accessModes": ["ReadWriteSometimes"]}}),
            422,
            "spec.accessModes: Unsupported value: \"ReadWriteSometimes\"",
        ),
        (
            "no-mode",
            json!({"spec": {"accessModes": []}}),
            422,
            "spec.accessModes: Required value: at least 1 access mode is required",
        ),
    ] {
        let err = env.try_create_claim(claim, &ok, extra).await.unwrap_err();
        let kube::Error::Api(status) = err else {
            panic!("{claim}: {err}")
        };
        assert_eq!(status.code, code, "{claim}: {status:?}");
        assert!(
            status.message.contains(message),
            "{claim}: {}",
            status.message
        );
    }
    let big = "x".repeat(200_000);
    env.create_claim(
        "huge-annotation",
        &ok,
        json!({"metadata": {"annotations": {"example.com/big": big}}}),
    )
    .await;

    for (claim, message) in [
        (
            "both-fstype",
            "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys",
        ),
        (
            "half-secret",
            "failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified",
        ),
        ("bad-secret-name", "\"Bad_Name\" is not a valid secret name"),
    ] {
        env.wait_event(claim, "ProvisioningFailed", message).await;
        let pvc = env.pvcs().get(claim).await.unwrap();
        assert_eq!(
            pvc.status.and_then(|s| s.phase).as_deref(),
            Some("Pending"),
            "{claim} stays pending"
        );
    }
    // The huge annotation does not stop anything, and only its claim reached the driver.
    let pv = env.wait_bound("huge-annotation").await;
    let names: Vec<_> = requests(&env.mock, CREATE_VOLUME)
        .into_iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(names, [pv.metadata.name.unwrap()]);
    assert_eq!(
        env.driver_volumes().len(),
        1,
        "one volume, the good claim's"
    );
    env.stop().await;
}

#[tokio::test]
async fn spec_breaking_create_volume_answers() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;

    // An empty volume id: the PV would name no volume, and the volume could never be deleted.
    // The answer is refused and the identical request repeated, which gets the real id.
    env.mock
        .faults()
        .rewrite_answers(CREATE_VOLUME, 1, |answer: &mut v1::CreateVolumeResponse| {
            if let Some(volume) = answer.volume.as_mut() {
                volume.volume_id.clear();
            }
        });
    env.create_claim("empty-id", &class, json!({})).await;
    env.wait_event(
        "empty-id",
        "ProvisioningFailed",
        "CreateVolume answered with an empty volume_id",
    )
    .await;
    let pv = env.wait_bound("empty-id").await;
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    assert_eq!(
        env.driver_volumes_by_id(),
        [handle],
        "one volume, named by the PV"
    );
    let creates = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(creates.len(), 2);
    assert_eq!(creates[0], creates[1], "the identical request again");

    // A negative capacity is less than requested: the volume is deleted and created again.
    env.mock
        .faults()
        .rewrite_answers(CREATE_VOLUME, 1, |answer: &mut v1::CreateVolumeResponse| {
            if let Some(volume) = answer.volume.as_mut() {
                volume.capacity_bytes = -5;
            }
        });
    env.create_claim("negative-capacity", &class, json!({}))
        .await;
    env.wait_event(
        "negative-capacity",
        "ProvisioningFailed",
        "created volume capacity -5 less than requested capacity 1073741824",
    )
    .await;
    let pv = env.wait_bound("negative-capacity").await;
    let capacity = pv.spec.unwrap().capacity.unwrap()["storage"].0.clone();
    assert_eq!(capacity, "1Gi");
    assert_eq!(env.driver_volumes().len(), 2, "no orphaned volume");
    env.stop().await;
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
    let kubeconfig = format!("--kubeconfig={}", env.cluster.kubeconfig_path().display());
    let address = format!("--csi-address={}", env.mock.socket_path().display());
    let (code, stderr) = run_to_exit(&[&kubeconfig, &address]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("driver name is empty"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    env.stop().await;
}
