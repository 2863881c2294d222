//! VolumeAttributesClass changes end to end: ControllerModifyVolume with the class's
//! parameters, the claim's and the PV's class, and how refusals and missing classes show.

use crate::common::*;
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::mockdriver::MockDriver;

const MODIFY: &str = "/csi.v1.Controller/ControllerModifyVolume";

async fn create_class(env: &Env, name: &str, driver: &str, parameters: serde_json::Value) {
    let api: Api<VolumeAttributesClass> = Api::all(env.client());
    let class =
        json!({"metadata": {"name": env.n(name)}, "driverName": driver, "parameters": parameters});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(class).unwrap(),
    )
    .await
    .unwrap();
}

async fn set_class(env: &Env, claim: &str, class: &str) {
    let patch = json!({"spec": {"volumeAttributesClassName": env.n(class)}});
    env.claims()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_new_class_is_applied_by_the_driver_and_recorded() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    create_class(&env, "fast", &env.driver, json!({"iops": "5000"})).await;
    let handle = env.bound_claim("db", GI, true, json!({})).await;
    set_class(&env, "db", "fast").await;
    let claim = env
        .claim_until("db", "the current class", |c| {
            c["status"]["currentVolumeAttributesClassName"] == env.n("fast").as_str()
        })
        .await;
    assert!(
        claim["status"].get("modifyVolumeStatus").is_none(),
        "{claim:#}"
    );
    assert!(condition(&claim, "ModifyingVolume").is_none(), "{claim:#}");
    assert_eq!(
        env.pv("db").await["spec"]["volumeAttributesClassName"],
        env.n("fast").as_str()
    );
    let volume = &env.mock.state().volumes[&handle];
    assert_eq!(
        volume.mutable_parameters.get("iops").map(String::as_str),
        Some("5000")
    );
    eventually("the Events", || async {
        let reasons = env.event_reasons("db").await;
        (reasons == ["VolumeModify", "VolumeModifySuccessful"]).then_some(())
    })
    .await;
    assert_eq!(env.mock.calls().count(MODIFY), 1);
}

#[tokio::test]
async fn parameters_the_driver_refuses_make_the_change_infeasible() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    create_class(&env, "odd", &env.driver, json!({"colour": "blue"})).await;
    env.bound_claim("x", GI, true, json!({})).await;
    set_class(&env, "x", "odd").await;
    let claim = env
        .claim_until("x", "the infeasible status", |c| {
            c["status"]["modifyVolumeStatus"]["status"] == "Infeasible"
        })
        .await;
    assert_eq!(
        claim["status"]["modifyVolumeStatus"]["targetVolumeAttributesClassName"],
        env.n("odd").as_str()
    );
    let error = condition(&claim, "ModifyVolumeError").expect("the error condition");
    assert_eq!(error["reason"], "InvalidArgument");
    let modifying = condition(&claim, "ModifyingVolume").expect("the modifying condition");
    assert_eq!(
        modifying["message"],
        format!(
            "Modifying volume to {:?} failed. Waiting for retry.",
            env.n("odd")
        )
    );
    assert!(
        claim["status"]
            .get("currentVolumeAttributesClassName")
            .is_none()
    );
}

#[tokio::test]
async fn a_missing_class_leaves_the_change_pending_until_it_exists() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.bound_claim("later", GI, true, json!({})).await;
    set_class(&env, "later", "gold").await;
    env.claim_until("later", "the pending status", |c| {
        c["status"]["modifyVolumeStatus"]["status"] == "Pending"
    })
    .await;
    // Events are written in the background: the status may be there first.
    let missing = eventually("a VolumeModifyFailed Event", || async {
        env.events("later")
            .await
            .into_iter()
            .find(|(_, reason, _)| reason == "VolumeModifyFailed")
    })
    .await;
    assert_eq!(
        missing.2,
        format!("VAC {:?} does not exist.", env.n("gold"))
    );
    assert_eq!(env.mock.calls().count(MODIFY), 0);
    create_class(&env, "gold", &env.driver, json!({"throughput": "100"})).await;
    env.claim_until("later", "the class applied", |c| {
        c["status"]["currentVolumeAttributesClassName"] == env.n("gold").as_str()
    })
    .await;
}

#[tokio::test]
async fn a_class_of_another_driver_is_refused_without_calling_the_driver() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    create_class(
        &env,
        "foreign",
        "someone.else.example.com",
        json!({"iops": "1"}),
    )
    .await;
    env.bound_claim("f", GI, true, json!({})).await;
    set_class(&env, "f", "foreign").await;
    let claim = env
        .claim_until("f", "the infeasible status", |c| {
            c["status"]["modifyVolumeStatus"]["status"] == "Infeasible"
        })
        .await;
    let error = condition(&claim, "ModifyVolumeError").expect("the error condition");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("someone.else.example.com"),
        "{error}"
    );
    assert_eq!(env.mock.calls().count(MODIFY), 0);
}
