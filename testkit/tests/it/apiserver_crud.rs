//! CREATE / GET / UPDATE / DELETE semantics through kube::Api and raw HTTP.

use crate::apiserver_support::{obj, raw};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Error};
use serde_json::json;
use testkit::apiserver::{ApiServer, Options};

fn pvc(name: &str) -> PersistentVolumeClaim {
    obj(
        json!({"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
}

fn api_code(e: Error) -> (u16, String) {
    match e {
        Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn create_assigns_system_fields_and_a_global_resource_version() {
    let server = ApiServer::start().await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let a = pvcs
        .create(&PostParams::default(), &pvc("a"))
        .await
        .unwrap();
    let b = cms
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "b"}})),
        )
        .await
        .unwrap();
    let rv = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.resource_version.clone().unwrap().parse::<u64>().unwrap()
    };
    assert_eq!(
        rv(&b.metadata),
        rv(&a.metadata) + 1,
        "one counter across kinds"
    );
    assert!(a.metadata.uid.is_some() && a.metadata.creation_timestamp.is_some());
    assert_eq!(a.status.unwrap().phase.as_deref(), Some("Pending"));
    let generated = pvcs
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"generateName": "claim-"}, "spec": pvc("x").spec})),
        )
        .await
        .unwrap();
    let name = generated.metadata.name.unwrap();
    assert!(name.starts_with("claim-") && name.len() == "claim-".len() + 5);
    assert_eq!(pvcs.get("a").await.unwrap().metadata.uid, a.metadata.uid);
}

#[tokio::test]
async fn create_errors_match_the_real_server() {
    let server = ApiServer::start().await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "default");
    pvcs.create(&PostParams::default(), &pvc("a"))
        .await
        .unwrap();
    assert_eq!(
        api_code(
            pvcs.create(&PostParams::default(), &pvc("a"))
                .await
                .unwrap_err()
        ),
        (409, "AlreadyExists".into())
    );
    let missing: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "nowhere");
    assert_eq!(
        api_code(
            missing
                .create(&PostParams::default(), &pvc("a"))
                .await
                .unwrap_err()
        ),
        (404, "NotFound".into())
    );
    assert_eq!(
        api_code(
            pvcs.create(&PostParams::default(), &pvc("#%123-invalid-name"))
                .await
                .unwrap_err()
        ),
        (422, "Invalid".into())
    );
    let (code, status) = raw(
        &server.client(),
        "POST",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        Some("application/json"),
        r#"{"metadata":{}}"#,
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(status["details"]["causes"][0]["field"], "metadata.name");
    let (code, status) = raw(
        &server.client(),
        "POST",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        Some("application/json"),
        "{not json",
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    let (code, status) = raw(
        &server.client(),
        "GET",
        "/api/v1/namespaces/default/persistentvolumeclaims/zzz",
        None,
        "",
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(
        status,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "persistentvolumeclaims \"zzz\" not found", "reason": "NotFound",
            "details": {"name": "zzz", "kind": "persistentvolumeclaims"}, "code": 404
        })
    );
    let (code, status) = raw(
        &server.client(),
        "POST",
        "/api/v1/namespaces/default/persistentvolumeclaims/a",
        Some("application/json"),
        "{}",
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
}

#[tokio::test]
async fn update_conflicts_on_stale_resource_version_and_is_unconditional_without_one() {
    let server = ApiServer::start().await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "default");
    let mut a = pvcs
        .create(&PostParams::default(), &pvc("a"))
        .await
        .unwrap();
    a.metadata.labels = Some([("k".to_string(), "1".to_string())].into());
    let updated = pvcs.replace("a", &PostParams::default(), &a).await.unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        a.metadata.resource_version
    );
    let (code, reason) = api_code(
        pvcs.replace("a", &PostParams::default(), &a)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    a.metadata.resource_version = None;
    a.metadata.labels = Some([("k".to_string(), "2".to_string())].into());
    let forced = pvcs.replace("a", &PostParams::default(), &a).await.unwrap();
    assert_eq!(forced.metadata.labels.as_ref().unwrap()["k"], "2");
    let unchanged = pvcs
        .replace("a", &PostParams::default(), &forced)
        .await
        .unwrap();
    assert_eq!(
        unchanged.metadata.resource_version, forced.metadata.resource_version,
        "no-op writes keep the version"
    );
    let (code, _) = api_code(
        pvcs.replace("zzz", &PostParams::default(), &pvc("zzz"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 404);
}

#[tokio::test]
async fn status_subresource_separates_status_from_the_rest() {
    let server = ApiServer::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let va: VolumeAttachment = obj(json!({
        "metadata": {"name": "va"},
        "spec": {"attacher": "csi.example.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv"}},
        "status": {"attached": true}
    }));
    let created = vas.create(&PostParams::default(), &va).await.unwrap();
    assert!(created.status.is_none(), "status is dropped on create");
    let patched = vas
        .patch_status(
            "va",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"attached": true}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .unwrap();
    assert!(patched.status.as_ref().unwrap().attached);
    assert!(
        patched.metadata.labels.is_none(),
        "status writes change only status"
    );
    let main = vas
        .patch(
            "va",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"attached": false}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .unwrap();
    assert!(
        main.status.unwrap().attached,
        "main writes keep the stored status"
    );
    assert_eq!(main.metadata.labels.unwrap()["x"], "y");
}

#[tokio::test]
async fn finalizers_keep_objects_until_the_last_one_is_removed() {
    // Without the pv-protection controller: its write would change the resourceVersion below.
    let server = ApiServer::start_with(Options {
        protection_controllers: false,
        ..Options::default()
    })
    .await
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(server.client());
    let pv: PersistentVolume = obj(
        json!({"metadata": {"name": "pv", "finalizers": ["external-attacher/csi-example-com"]},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                        "csi": {"driver": "csi.example.com", "volumeHandle": "h"}}}),
    );
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let pending = pvs
        .delete("pv", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("object kept");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(0));
    let again = pvs
        .delete("pv", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        again.metadata.resource_version, pending.metadata.resource_version,
        "deleting again is a no-op"
    );
    pvs.patch(
        "pv",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_code(pvs.get("pv").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn delete_preconditions_and_status_response() {
    let server = ApiServer::start().await.unwrap();
    // A kind without protection finalizers: the DELETE removes it at once.
    let pvcs: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let a = pvcs
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "a"}})),
        )
        .await
        .unwrap();
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        api_code(pvcs.delete("a", &wrong_uid).await.unwrap_err()),
        (409, "Conflict".into())
    );
    let wrong_rv = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    assert_eq!(
        api_code(pvcs.delete("a", &wrong_rv).await.unwrap_err()).0,
        409
    );
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: a.metadata.uid.clone(),
            resource_version: a.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    let status = pvcs
        .delete("a", &right)
        .await
        .unwrap()
        .right()
        .expect("a Status for removed objects");
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    assert_eq!(
        api_code(
            pvcs.delete("a", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .0,
        404
    );
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_content() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let (code, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces",
        Some("application/json"),
        r#"{"metadata":{"name":"t"}}"#,
    )
    .await;
    assert_eq!(code, 201);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "t");
    pvcs.create(&PostParams::default(), &pvc("a"))
        .await
        .unwrap();
    let (code, _) = raw(&client, "DELETE", "/api/v1/namespaces/t", None, "").await;
    assert_eq!(code, 200);
    assert_eq!(api_code(pvcs.get("a").await.unwrap_err()).0, 404);
    let (code, _) = raw(&client, "GET", "/api/v1/namespaces/t", None, "").await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn dry_run_validates_without_storing() {
    let server = ApiServer::start().await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "default");
    let rv = server.resource_version();
    pvcs.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &pvc("a"),
    )
    .await
    .unwrap();
    assert_eq!(server.resource_version(), rv);
    assert_eq!(api_code(pvcs.get("a").await.unwrap_err()).0, 404);
}
