//! Failures: every gRPC code into the status, an Event and a retry with backoff; timeouts; bad
//! inputs reported clearly.

use std::time::{Duration, Instant};

use crate::common::*;
use csi_proto::methods::controller::{CONTROLLER_PUBLISH_VOLUME, CONTROLLER_UNPUBLISH_VOLUME};
use serde_json::json;
use sidecar_kit::pipeline::workqueue::Backoff;
use tonic::Code;

/// Whether the server stores `errorCode`. The test kit runs these tests with the gate on
/// ([`error_code_options`]), so there the code must be kept; a real cluster decides.
async fn keeps_error_codes(env: &Env) -> bool {
    let kept = env.keeps_error_codes().await;
    assert!(
        kept || env.cluster.is_real(),
        "the test kit drops errorCode"
    );
    kept
}

#[tokio::test]
async fn every_grpc_code_reaches_the_status_and_an_event_then_the_retry_succeeds() {
    let env = Env::start_with(error_code_options(), mock(), |_| {}).await;
    let codes_kept = keeps_error_codes(&env).await;
    env.create_csinode("node-1", "nid-1").await;
    let codes = [
        (Code::Cancelled, "Canceled"),
        (Code::Unknown, "Unknown"),
        (Code::InvalidArgument, "InvalidArgument"),
        (Code::DeadlineExceeded, "DeadlineExceeded"),
        (Code::NotFound, "NotFound"),
        (Code::AlreadyExists, "AlreadyExists"),
        (Code::PermissionDenied, "PermissionDenied"),
        (Code::ResourceExhausted, "ResourceExhausted"),
        (Code::FailedPrecondition, "FailedPrecondition"),
        (Code::Aborted, "Aborted"),
        (Code::OutOfRange, "OutOfRange"),
        (Code::Unimplemented, "Unimplemented"),
        (Code::Internal, "Internal"),
        (Code::Unavailable, "Unavailable"),
        (Code::DataLoss, "DataLoss"),
        (Code::Unauthenticated, "Unauthenticated"),
    ];
    for (n, (code, name)) in codes.into_iter().enumerate() {
        let va = format!("va-{n}");
        // Failing until the test has seen the error: a single failure's status lasts only until
        // the retry, which a poll may miss.
        env.mock
            .faults()
            .fail_always(CONTROLLER_PUBLISH_VOLUME, code, format!("injected {name}"));
        let handle = env.create_volume(&format!("vol-{n}")).await;
        env.create_csi_pv(&format!("pv-{n}"), &handle).await;
        env.create_pv_va(&va, &format!("pv-{n}"), "node-1").await;
        let expected = format!("rpc error: code = {name} desc = injected {name}");
        let failed = env
            .wait_va(&va, |va| {
                attach_error(va).is_some_and(|(m, _)| m == expected)
            })
            .await;
        assert_eq!(
            attach_error(&failed).unwrap().1,
            codes_kept.then_some(i32::from(code))
        );
        let event = env.wait_event(&va, "AttachFailed", &expected).await;
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.reporting_component.as_deref(), Some("csi-attacher"));
        assert_eq!(
            event.involved_object.kind.as_deref(),
            Some("VolumeAttachment")
        );
        // The retry attaches and clears the error.
        env.mock.faults().clear_failures(CONTROLLER_PUBLISH_VOLUME);
        let va = env.wait_va(&va, attached).await;
        assert!(attach_error(&va).is_none());
    }
    env.stop().await;
}

#[tokio::test]
async fn retries_back_off_and_error_reports_do_not_shorten_the_backoff() {
    let start = Duration::from_millis(200);
    let env = Env::start(mock(), |c| {
        c.backoff = Backoff {
            start,
            max: Duration::from_secs(5),
        }
    })
    .await;
    env.create_csinode("node-1", "nid-1").await;
    env.mock
        .faults()
        .fail_next(CONTROLLER_PUBLISH_VOLUME, 4, Code::Internal, "broken");
    let handle = env.create_volume("v").await;
    env.create_csi_pv("pv-b", &handle).await;
    let began = Instant::now();
    env.create_pv_va("va-b", "pv-b", "node-1").await;
    let va = env.wait_va("va-b", attached).await;
    // Four failures wait 200 + 400 + 800 + 1600 ms before the fifth call succeeds. Had our own
    // status writes re-queued the attachment, the calls would have come at once.
    assert!(
        began.elapsed() >= Duration::from_millis(3000 * 9 / 10),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(env.mock.calls().count(CONTROLLER_PUBLISH_VOLUME), 5);
    assert!(attach_error(&va).is_none());
    // The repeats were folded into one Event. (On a busy real cluster the attacher may also
    // have tried once before its cache had the CSINode: an Event of its own.)
    let event = eventually("four failures counted in one event", || async {
        let events: Vec<_> = env
            .events_for("va-b")
            .await
            .into_iter()
            .filter(|e| e.message.as_deref().is_some_and(|m| m.contains("broken")))
            .collect();
        assert_eq!(events.len(), 1, "{events:#?}");
        events.into_iter().find(|e| e.count == Some(4))
    })
    .await;
    assert_eq!(event.reason.as_deref(), Some("AttachFailed"));
    env.stop().await;
}

#[tokio::test]
async fn a_driver_timeout_is_retried_until_it_succeeds() {
    let env = Env::start_with(error_code_options(), mock(), |c| {
        c.timeout = Duration::from_millis(300)
    })
    .await;
    let codes_kept = keeps_error_codes(&env).await;
    env.create_csinode("node-1", "nid-1").await;
    env.mock.faults().hang(CONTROLLER_PUBLISH_VOLUME);
    let handle = env.create_volume("slow").await;
    env.create_csi_pv("pv-slow", &handle).await;
    env.create_pv_va("va-slow", "pv-slow", "node-1").await;
    let va = env
        .wait_va("va-slow", |va| attach_error(va).is_some())
        .await;
    assert_eq!(
        attach_error(&va).unwrap(),
        (
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded".to_string(),
            codes_kept.then_some(4)
        )
    );
    // The finalizer is already there: a timed-out attach may have succeeded in the driver.
    assert_eq!(finalizers(&va.metadata), [env.finalizer()]);
    env.mock.faults().release(CONTROLLER_PUBLISH_VOLUME);
    let va = env.wait_va("va-slow", attached).await;
    assert!(attach_error(&va).is_none());
    env.stop().await;
}

#[tokio::test]
async fn detach_failures_are_reported_and_retried() {
    let env = Env::start_with(error_code_options(), mock(), |_| {}).await;
    let codes_kept = keeps_error_codes(&env).await;
    env.create_csinode("node-1", "nid-1").await;
    env.attached_volume(1).await;
    let pv = env.pvs().get(&env.n("pv-1")).await.unwrap();
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    // Failing until the test has seen the error, which the successful retry deletes with the
    // VolumeAttachment.
    env.mock.faults().fail_always(
        CONTROLLER_UNPUBLISH_VOLUME,
        Code::Unavailable,
        "backend down",
    );
    env.delete_va("va-1").await;
    let va = env.wait_va("va-1", |va| detach_error(va).is_some()).await;
    assert_eq!(
        detach_error(&va).unwrap(),
        (
            "rpc error: code = Unavailable desc = backend down".to_string(),
            codes_kept.then_some(14)
        )
    );
    assert_eq!(
        finalizers(&va.metadata),
        [env.finalizer()],
        "kept while failing"
    );
    env.wait_event("va-1", "DetachFailed", "backend down").await;
    env.mock
        .faults()
        .clear_failures(CONTROLLER_UNPUBLISH_VOLUME);
    env.wait_va_gone("va-1").await;
    assert!(env.mock.calls().count(CONTROLLER_UNPUBLISH_VOLUME) >= 2);
    assert!(env.mock.state().volumes[&handle].published.is_empty());
    env.stop().await;
}

#[tokio::test]
async fn bad_inputs_get_a_clear_status_and_event_and_nothing_breaks() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    // A VA for a PV that does not exist.
    env.create_pv_va("va-nopv", "pv-nope", "node-1").await;
    // A PV without a CSI source.
    env.create_pv(
        "pv-hostpath",
        json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
               "hostPath": {"path": "/tmp/x"}}),
    )
    .await;
    env.create_pv_va("va-hostpath", "pv-hostpath", "node-1")
        .await;
    // A publish secret that does not exist.
    let handle = env.create_volume("v").await;
    let mut spec = env.csi_pv_spec(&handle);
    spec["csi"]["controllerPublishSecretRef"] =
        json!({"name": "missing", "namespace": env.cluster.namespace()});
    env.create_pv("pv-secret", spec).await;
    env.create_pv_va("va-secret", "pv-secret", "node-1").await;
    // A node without a CSINode.
    let handle = env.create_volume("w").await;
    env.create_csi_pv("pv-nonode", &handle).await;
    env.create_pv_va("va-nonode", "pv-nonode", "node-x").await;
    // Unsupported access modes.
    let handle = env.create_volume("m").await;
    let mut spec = env.csi_pv_spec(&handle);
    spec["accessModes"] = json!(["ReadOnlyMany", "ReadWriteOnce"]);
    env.create_pv("pv-modes", spec).await;
    env.create_pv_va("va-modes", "pv-modes", "node-1").await;

    // Names of cluster-scoped objects carry the test namespace on a real cluster.
    for (va, message) in [
        (
            "va-nopv",
            format!("persistentvolume \"{}\" not found", env.n("pv-nope")),
        ),
        (
            "va-hostpath",
            "pv spec contained non-csi source that was not migrated".to_string(),
        ),
        (
            "va-secret",
            format!(
                "failed to load secret \"{}/missing\": secrets \"missing\" not found",
                env.cluster.namespace()
            ),
        ),
        (
            "va-nonode",
            format!("csinode.storage.k8s.io \"{}\" not found", env.n("node-x")),
        ),
        (
            "va-modes",
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume"
                .to_string(),
        ),
    ] {
        let failed = env
            .wait_va(va, |v| attach_error(v).is_some_and(|(m, _)| m == message))
            .await;
        assert_eq!(attach_error(&failed).unwrap().1, None, "{va}: no gRPC code");
        assert!(!attached(&failed));
        env.wait_event(va, "AttachFailed", &message).await;
    }
    assert_eq!(env.mock.calls().count(CONTROLLER_PUBLISH_VOLUME), 0);
    // Nothing was written to objects the attach could not use.
    for pv in ["pv-hostpath", "pv-secret", "pv-modes"] {
        assert!(pv_finalizers(&env.pvs().get(&env.n(pv)).await.unwrap().metadata).is_empty());
    }
    // The missing pieces show up: the attachments go through.
    env.create_csinode("node-x", "nid-x").await;
    env.wait_va("va-nonode", attached).await;
    env.create_csi_pv("pv-nope", &env.create_volume("late").await)
        .await;
    env.wait_va("va-nopv", attached).await;
    // And everything else still works.
    env.attached_volume(9).await;
    env.stop().await;
}
