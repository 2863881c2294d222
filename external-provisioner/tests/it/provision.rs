//! Provisioning and deletion end to end: the controller against the cluster (in-process API
//! server with its PV controller, or a real cluster) and the mock driver over a unix socket.

use std::time::Duration;

use crate::common::{Env, eventually, mock, requests};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::api::{Api, PostParams};
use serde_json::json;
use testkit::apiserver::counters::Verb;
use testkit::apiserver::{Hang, RequestMatch};
use tonic::Code;

#[tokio::test]
async fn provisions_binds_and_deletes() {
    let mut env = Env::start(mock(), &["--extra-create-metadata"], |_| {}).await;
    let class = env
        .create_class(json!({"parameters": {"csi.storage.k8s.io/fstype": "xfs", "kind": "fast"}, "mountOptions": ["noatime"]}))
        .await;
    let pvc = env.create_claim("data", &class, json!({})).await;
    let uid = pvc.metadata.uid.clone().unwrap();
    let pv = env.wait_bound("data").await;
    let name = format!("pvc-{uid}");
    assert_eq!(pv.metadata.name.as_deref(), Some(name.as_str()));
    let ann = pv.metadata.annotations.clone().unwrap();
    assert_eq!(ann["pv.kubernetes.io/provisioned-by"], env.driver.as_str());
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-name"],
        ""
    );
    assert!(
        pv.metadata
            .finalizers
            .clone()
            .unwrap()
            .contains(&"external-provisioner.volume.kubernetes.io/finalizer".to_string())
    );
    let spec = pv.spec.clone().unwrap();
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, env.driver);
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(
        csi.volume_attributes.unwrap()["storage.kubernetes.io/csiProvisionerIdentity"],
        env.identity()
    );
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    assert_eq!(env.driver_volumes(), vec![csi.volume_handle.clone()]);

    let created = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(created.len(), 1, "one CreateVolume per claim");
    let request = &created[0];
    assert_eq!(request["name"], name);
    assert_eq!(request["parameters"]["kind"], "fast");
    assert_eq!(request["parameters"]["csi.storage.k8s.io/pvc/name"], "data");
    assert_eq!(
        request["parameters"]["csi.storage.k8s.io/pvc/namespace"],
        env.namespace()
    );
    assert!(
        request["parameters"]
            .get("csi.storage.k8s.io/fstype")
            .is_none()
    );
    env.wait_event(
        "data",
        "ProvisioningSucceeded",
        &format!("Successfully provisioned volume {name}"),
    )
    .await;

    env.delete_claim("data").await;
    env.wait_pv_gone(&name).await;
    assert!(env.driver_volumes().is_empty(), "the volume was deleted");
    assert_eq!(requests(&env.mock, DELETE_VOLUME).len(), 1);
    env.stop().await;
}

#[tokio::test]
async fn retain_never_calls_the_driver() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({"reclaimPolicy": "Retain"})).await;
    env.create_claim("kept", &class, json!({})).await;
    let pv = env.wait_bound("kept").await;
    let name = pv.metadata.name.clone().unwrap();
    // As upstream's, the PV is written with the deletion finalizer, which a Retain PV then
    // loses.
    let pvs = env.pvs();
    eventually("no deletion finalizer on a Retain PV", || {
        let (pvs, name) = (pvs.clone(), name.clone());
        async move {
            let pv = pvs.get_opt(&name).await.unwrap()?;
            let finalizers = pv.metadata.finalizers.unwrap_or_default();
            (!finalizers
                .contains(&"external-provisioner.volume.kubernetes.io/finalizer".to_string()))
            .then_some(())
        }
    })
    .await;
    env.delete_claim("kept").await;
    eventually("the PV released", || {
        let pvs = pvs.clone();
        let name = name.clone();
        async move {
            let pv = pvs.get_opt(&name).await.unwrap()?;
            (pv.status?.phase.as_deref() == Some("Released")).then_some(())
        }
    })
    .await;
    // A Delete-class volume released after it is deleted: by then the Retain PV's release
    // has been processed too, without a DeleteVolume.
    let deleting = env.create_class(json!({})).await;
    env.create_claim("dropped", &deleting, json!({})).await;
    let dropped = env.wait_bound("dropped").await.metadata.name.unwrap();
    env.delete_claim("dropped").await;
    env.wait_pv_gone(&dropped).await;
    let delete_calls = requests(&env.mock, DELETE_VOLUME);
    assert_eq!(
        delete_calls.len(),
        1,
        "only the Delete-class volume: {delete_calls:?}"
    );
    assert!(env.pvs().get_opt(&name).await.unwrap().is_some());
    assert_eq!(env.driver_volumes().len(), 1, "the retained volume stays");
    env.stop().await;
}

#[tokio::test]
async fn provisioner_secrets_are_templated_fetched_and_recorded() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env
        .create_class(json!({"parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}-creds",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
        }}))
        .await;
    env.create_claim("db", &class, json!({})).await;
    env.wait_event(
        "db",
        "ProvisioningFailed",
        "error getting secret db-creds in namespace",
    )
    .await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db-creds"},
        "stringData": {"password": "hunter2"}, "data": {"password": "aHVudGVyMg=="}
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client(), &env.namespace())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pv = env.wait_bound("db").await;
    let ann = pv.metadata.annotations.unwrap();
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-name"],
        "db-creds"
    );
    assert_eq!(
        ann["volume.kubernetes.io/provisioner-deletion-secret-namespace"],
        env.namespace()
    );
    let logged = requests(&env.mock, CREATE_VOLUME);
    let last = logged.last().unwrap();
    assert_eq!(
        last["secrets"], "***stripped***",
        "the driver got secrets, the log did not"
    );
    assert_eq!(logged.len(), 1, "no CreateVolume before the secret exists");
    env.stop().await;
}

#[tokio::test]
async fn bad_claims_get_clear_events() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let reserved = env
        .create_class(json!({"parameters": {"csi.storage.k8s.io/bogus": "1"}}))
        .await;
    env.create_claim("reserved", &reserved, json!({})).await;
    env.wait_event(
        "reserved",
        "ProvisioningFailed",
        "found unknown parameter key \"csi.storage.k8s.io/bogus\"",
    )
    .await;

    let class = env.create_class(json!({})).await;
    env.create_claim(
        "selector",
        &class,
        json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}}),
    )
    .await;
    env.wait_event(
        "selector",
        "ProvisioningFailed",
        "claim Selector is not supported",
    )
    .await;

    let template = env
        .create_class(json!({"parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "${pvc.unknown}",
            "csi.storage.k8s.io/provisioner-secret-namespace": "x",
        }}))
        .await;
    env.create_claim("template", &template, json!({})).await;
    env.wait_event(
        "template",
        "ProvisioningFailed",
        "invalid tokens: [\"pvc.unknown\"]",
    )
    .await;

    env.create_claim("populated", &class, json!({"spec": {"dataSourceRef": {"apiGroup": "example.com", "kind": "Hello", "name": "h"}}})).await;
    env.wait_event(
        "populated",
        "Provisioning",
        "Assuming an external populator will provision the volume",
    )
    .await;
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME).len(),
        0,
        "no bad claim reached the driver"
    );
    env.stop().await;
}

#[tokio::test]
async fn final_errors_are_retried_and_reported() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    env.mock
        .faults()
        .fail_next(CREATE_VOLUME, 2, Code::Internal, "disk on fire");
    let class = env.create_class(json!({})).await;
    env.create_claim("flaky", &class, json!({})).await;
    env.wait_event(
        "flaky",
        "ProvisioningFailed",
        "rpc error: code = Internal desc = disk on fire",
    )
    .await;
    env.wait_bound("flaky").await;
    assert_eq!(requests(&env.mock, CREATE_VOLUME).len(), 3);
    env.stop().await;
}

#[tokio::test]
async fn invalid_argument_is_infeasible_and_retried_slowly() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    env.mock
        .faults()
        .fail_always(CREATE_VOLUME, Code::InvalidArgument, "no such kind");
    let class = env.create_class(json!({})).await;
    env.create_claim("bad", &class, json!({})).await;
    env.wait_event(
        "bad",
        "ProvisioningFailed",
        "Volume provisioning failed with infeasible error. Retries will be delayed.",
    )
    .await;
    // Backoff max is 2s in tests: within a second there is no second call.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(requests(&env.mock, CREATE_VOLUME).len(), 1);
    env.mock.faults().clear_failures(CREATE_VOLUME);
    env.wait_bound("bad").await;
    env.stop().await;
}

#[tokio::test]
async fn a_claim_deleted_during_an_unanswered_create_leaves_no_volume() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    env.mock.faults().fail_always(
        CREATE_VOLUME,
        Code::DeadlineExceeded,
        "context deadline exceeded",
    );
    let class = env.create_class(json!({})).await;
    let pvc = env.create_claim("gone", &class, json!({})).await;
    let name = format!("pvc-{}", pvc.metadata.uid.unwrap());
    let calls = env.mock.calls().clone();
    eventually("two CreateVolume attempts", || {
        let n = calls.count(CREATE_VOLUME);
        async move { (n >= 2).then_some(()) }
    })
    .await;
    env.delete_claim("gone").await;
    // The driver finishes the volume it may have been creating all along.
    env.mock.faults().clear_failures(CREATE_VOLUME);
    eventually("the volume created and deleted again", || {
        let deletes = calls.count(DELETE_VOLUME);
        async move { (deletes >= 1).then_some(()) }
    })
    .await;
    let creates = requests(&env.mock, CREATE_VOLUME);
    assert!(
        creates.iter().all(|r| r["name"] == name),
        "identical requests: {creates:?}"
    );
    assert!(
        creates.windows(2).all(|w| w[0] == w[1]),
        "identical requests"
    );
    assert!(env.driver_volumes().is_empty(), "no leaked volume");
    // No PV was written for it: a real cluster keeps the claim (deletionTimestamp set) until its
    // pvc-protection finalizer is removed, and such a claim counts as gone.
    assert!(
        env.pvs().get_opt(&name).await.unwrap().is_none(),
        "no PV for a deleted claim"
    );
    if let Some(counters) = env.cluster.counters() {
        assert_eq!(counters.total(Verb::Create, "persistentvolumes"), 0);
    }
    env.stop().await;
}

/// Claims are worked on before the PVs are listed (a cold start among many PVs lists them
/// after the claims): with every list of PVs left unanswered, a new claim is provisioned,
/// once, and a claim whose PV an earlier leader wrote (not bound yet) is not provisioned again:
/// whether its PV exists is asked of the API server.
#[tokio::test]
async fn claims_are_provisioned_while_the_pvs_are_still_listed() {
    let mut env = Env::without_controller(mock()).await;
    let (Some(faults), Some(counters)) = (env.cluster.faults(), env.cluster.counters()) else {
        return;
    };
    let class = env.create_class(json!({})).await;
    let written = env.create_claim("written", &class, json!({})).await;
    let written_pv = format!("pvc-{}", written.metadata.uid.unwrap());
    // Of another class, so that the PV controller binds it to no claim.
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": written_pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "storageClassName": env.unique("unmatched"),
                 "csi": {"driver": env.driver, "volumeHandle": "written-earlier"}},
    }))
    .unwrap();
    env.pvs().create(&PostParams::default(), &pv).await.unwrap();
    faults.hang_next(
        RequestMatch::new(Verb::List, "persistentvolumes"),
        u32::MAX,
        Hang::BeforeServing,
    );
    let config = env.config(&[]).await;
    env.launch(config);
    eventually("the PV list asked for", || async {
        (faults.pending_hangs() < u32::MAX).then_some(())
    })
    .await;

    let created = env.create_claim("new", &class, json!({})).await;
    env.wait_bound("new").await;
    assert_eq!(
        faults.pending_hangs(),
        u32::MAX - counters.lists("persistentvolumes") as u32,
        "every PV list hangs: none was answered"
    );
    let names: Vec<String> = requests(&env.mock, CREATE_VOLUME)
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        names,
        vec![format!("pvc-{}", created.metadata.uid.unwrap())],
        "only the new claim's volume is created"
    );
    let pending = env.pvcs().get("written").await.unwrap();
    assert_eq!(
        pending.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    env.crash().await;
    faults.clear();
    env.pvs()
        .delete(&written_pv, &Default::default())
        .await
        .unwrap();
    env.stop().await;
}

/// Before the PVs are listed the index cannot tell whether a PV names a volume: the cleanup of
/// a volume whose claim was deleted during its CreateVolume waits for the list (an
/// administrator may have re-homed a retained volume), then deletes it.
#[tokio::test]
async fn a_cleanup_waits_for_the_pvs_to_be_listed() {
    let mut env = Env::without_controller(mock()).await;
    let Some(faults) = env.cluster.faults() else {
        return;
    };
    let class = env.create_class(json!({})).await;
    faults.add_latency(
        RequestMatch::new(Verb::List, "persistentvolumes"),
        Duration::from_secs(10),
    );
    let config = env.config(&[]).await;
    env.launch(config);
    env.mock.faults().hang(CREATE_VOLUME);
    env.create_claim("gone", &class, json!({})).await;
    eventually("the CreateVolume call", || async {
        (env.mock.calls().count(CREATE_VOLUME) > 0).then_some(())
    })
    .await;
    env.delete_claim("gone").await;
    eventually("the claim gone", || async {
        env.pvcs()
            .get_opt("gone")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    env.mock.faults().release(CREATE_VOLUME);
    env.wait_event("gone", "ProvisioningFailed", "before the PVs are listed")
        .await;
    eventually("the volume deleted once the PVs are listed", || async {
        env.driver_volumes().is_empty().then_some(())
    })
    .await;
    assert!(env.mock.calls().count(DELETE_VOLUME) >= 1);
    faults.clear();
    env.stop().await;
}
