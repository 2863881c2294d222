//! A request's way through the sidecar: authentication, authorization, resolution, the class's
//! secret, the driver's call; and every refusal of upstream's status-code table.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;
use testkit::apiserver::TokenIdentity;
use testkit::apiserver::counters::Verb;
use testkit::mockdriver::secret_digest;
use tonic::Code;

use crate::common::*;

/// A 1 MiB volume with blocks 1, 3 and 4 written, a snapshot of it, and a VolumeSnapshot
/// `name` of that snapshot; the snapshot's handle.
async fn written(env: &Env, name: &str, class: Option<&str>) -> String {
    let volume = env.volume(&format!("vol-{name}"), 1 << 20).await;
    env.mock.write_blocks(&volume, [1, 3, 4]).unwrap();
    let handle = env.cut(&format!("snap-{name}"), &volume).await;
    env.snapshot(name, &handle, DRIVER, class).await;
    handle
}

#[tokio::test]
async fn allocated_blocks_reach_an_authorized_client_with_the_class_s_secret() {
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        ..Start::default()
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(env.client(), env.ns());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "backup-credentials"},
        "stringData": {"password": "s3cret"},
        "data": {"password": "czNjcmV0"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    Env::create(
        &env.dynamic("volumesnapshotclasses", None),
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": "with-secret"},
            "driver": DRIVER,
            "deletionPolicy": "Delete",
            "parameters": {
                "csi.storage.k8s.io/snapshotter-secret-name": "backup-credentials",
                "csi.storage.k8s.io/snapshotter-secret-namespace": "${volumesnapshot.namespace}",
            },
        }),
    )
    .await;
    let handle = written(&env, "one", Some("with-secret")).await;
    let mut client = env.connect().await;
    let request = GetMetadataAllocatedRequestExt::max(env.allocated("one"), 2);
    // The class reaches the sidecar by its watch.
    let messages = eventually("the class to be known", || {
        let mut client = client.clone();
        let request = request.clone();
        async move { all_allocated(&mut client, request).await.ok() }
    })
    .await;
    assert_eq!(messages.len(), 2, "split by the driver at max_results");
    assert!(messages.iter().all(|m| m.volume_capacity_bytes == 1 << 20));
    assert!(messages.iter().all(|m| m.block_metadata_type == 1));
    let blocks: Vec<_> = messages.iter().map(|m| m.block_metadata.clone()).collect();
    assert_eq!(
        ranges(&blocks),
        [(BLOCK, BLOCK), (3 * BLOCK, BLOCK), (4 * BLOCK, BLOCK)]
    );

    let calls = env.mock.calls().metadata_calls();
    let call = calls.last().unwrap();
    assert_eq!(call.snapshot_id, handle);
    assert_eq!(call.max_results, 2);
    assert_eq!(call.secrets.get("password"), Some(&secret_digest("s3cret")));

    let metrics = env.metrics().await;
    let line = format!(
        r#"snapshot_metadata_controller_operations_seconds_count{{base_snapshot="",driver_name="{DRIVER}",grpc_status_code="OK",method_name="MetadataAllocated",target_snapshot="{}/one"}}"#,
        env.ns()
    );
    assert!(metrics.contains(&line), "{line} not in\n{metrics}");

    // A second request reads nothing but the secret: the token and the access are remembered,
    // the snapshot, its content and class come from watches.
    let before = env.cluster.counters().snapshot();
    all_allocated(&mut client, request).await.unwrap();
    let after = env.cluster.counters().snapshot();
    let made: Vec<_> = after
        .iter()
        .filter(|(key, count)| before.get(*key) != Some(*count))
        .map(|(key, _)| key.resource.as_str())
        .collect();
    assert_eq!(made, ["secrets"], "requests of a repeated backup call");
}

/// `max_results` on a request, as a chained call.
trait GetMetadataAllocatedRequestExt {
    fn max(self, max: i32) -> Self;
}

impl GetMetadataAllocatedRequestExt
    for external_snapshot_metadata::api::GetMetadataAllocatedRequest
{
    fn max(mut self, max: i32) -> Self {
        self.max_results = max;
        self
    }
}

#[tokio::test]
async fn every_refusal_has_its_code_and_the_sidecar_survives_a_snapshot_without_status() {
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        ..Start::default()
    })
    .await;
    let reviews = env.cluster.reviews();
    reviews.add_token(
        "elsewhere-token",
        TokenIdentity::service_account(NAMESPACE, "backup").audience("elsewhere"),
    );
    reviews.add_token(
        "stranger-token",
        TokenIdentity::service_account(NAMESPACE, "stranger").audience(AUDIENCE),
    );
    written(&env, "mine", None).await;
    let other_handle = {
        let volume = env.volume("vol-other", 1 << 20).await;
        env.cut("snap-other", &volume).await
    };
    env.snapshot("foreign", &other_handle, "other.csi.test", None)
        .await;
    Env::create(
        &env.dynamic("volumesnapshots", Some(env.ns())),
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": "fresh", "namespace": env.ns()},
            "spec": {"source": {"persistentVolumeClaimName": "pvc"}},
        }),
    )
    .await;
    let mut client = env.connect().await;

    let with = |token: &str, snapshot: &str| {
        let mut request = env.allocated(snapshot);
        request.security_token = token.to_string();
        request
    };
    let (code, message) = code_of(&mut client, with("", "mine")).await;
    assert_eq!(
        (code, message.as_str()),
        (Code::InvalidArgument, "securityToken is missing")
    );
    let (code, _) = code_of(&mut client, with("nobody-token", "mine")).await;
    assert_eq!(code, Code::Unauthenticated, "unknown token");
    let (code, _) = code_of(&mut client, with("elsewhere-token", "mine")).await;
    assert_eq!(code, Code::Unauthenticated, "a token for another audience");
    let (code, message) = code_of(&mut client, with("stranger-token", "mine")).await;
    assert_eq!(code, Code::PermissionDenied, "{message}");
    let (code, _) = code_of(&mut client, with(TOKEN, "missing")).await;
    assert_eq!(code, Code::NotFound);
    // What a caller that is not authorized names never becomes a label (a series kept for
    // good); an authorized caller's names do.
    let metrics = env.metrics().await;
    let series = |code: &str, target: &str| {
        format!(
            r#"grpc_status_code="{code}",method_name="MetadataAllocated",target_snapshot="{target}"}}"#
        )
    };
    let ns = env.ns().to_string();
    for code in ["InvalidArgument", "Unauthenticated", "PermissionDenied"] {
        assert!(
            !metrics.contains(&series(code, &format!("{ns}/mine"))),
            "{code}: {metrics}"
        );
        assert!(metrics.contains(&series(code, "")), "{code}: {metrics}");
    }
    assert!(metrics.contains(&series("NotFound", &format!("{ns}/missing"))));
    let (code, message) = code_of(&mut client, with(TOKEN, "fresh")).await;
    assert_eq!(
        (code, message.as_str()),
        (
            Code::Unavailable,
            "the VolumeSnapshot is not yet ready, name: fresh"
        )
    );
    let (code, message) = code_of(&mut client, with(TOKEN, "foreign")).await;
    assert_eq!(code, Code::InvalidArgument, "{message}");
    let mut negative = with(TOKEN, "mine");
    negative.starting_offset = -4096;
    let (code, _) = code_of(&mut client, negative).await;
    assert_eq!(code, Code::InvalidArgument);

    // The driver's own refusal reaches the client unchanged.
    let mut delta = env.delta("no-such-handle", "mine");
    delta.max_results = 1;
    let status = client.get_metadata_delta(delta).await;
    let status = match status {
        Ok(response) => response.into_inner().message().await.unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Still serving after all of them.
    assert!(
        all_allocated(&mut client, with(TOKEN, "mine"))
            .await
            .is_ok()
    );
    let metrics = env.metrics().await;
    assert!(metrics.contains(r#"grpc_status_code="PermissionDenied""#));
    assert!(
        metrics.contains(r#"method_name="MetadataDelta""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn without_an_audience_flag_the_service_object_names_it() {
    let mut env = Env::start(Start::default()).await;
    env.until_ready().await;
    written(&env, "snap", None).await;
    let mut client = env.connect().await;
    let (code, message) = code_of(&mut client, env.allocated("snap")).await;
    assert_eq!(
        code,
        Code::Internal,
        "no SnapshotMetadataService yet: {message}"
    );
    Env::create(
        &env.dynamic("snapshotmetadataservices", None),
        json!({
            "apiVersion": "cbt.storage.k8s.io/v1beta1",
            "kind": "SnapshotMetadataService",
            "metadata": {"name": DRIVER},
            "spec": {"address": "csi-snapshot-metadata.default:6443", "audience": AUDIENCE, "caCert": "Y2E="},
        }),
    )
    .await;
    eventually("the audience to come from the object", || {
        let mut client = client.clone();
        let request = env.allocated("snap");
        async move { all_allocated(&mut client, request).await.ok() }
    })
    .await;
    // While the watch has seen no object, a request reads it, as upstream reads it on every
    // request; once the watch has it, none does.
    let reads = || {
        env.cluster
            .counters()
            .total(Verb::Get, "snapshotmetadataservices")
    };
    let before = reads();
    assert!(
        before >= 1,
        "the object was looked up while the watch had none"
    );
    for _ in 0..3 {
        all_allocated(&mut client, env.allocated("snap"))
            .await
            .unwrap();
    }
    assert_eq!(reads(), before, "watched, not read per request");
}

#[tokio::test]
async fn the_rest_of_the_table_api_failures_classes_secrets_and_driver_errors() {
    use testkit::apiserver::faults::RequestMatch;
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        ..Start::default()
    })
    .await;
    written(&env, "snap", None).await;
    let mut client = env.connect().await;
    let faults = env.cluster.faults();

    // The reviews' own failures are Internal, as upstream's.
    faults.fail_next(RequestMatch::new(Verb::Create, "tokenreviews"), 1, 500);
    let (code, message) = code_of(&mut client, env.allocated("snap")).await;
    assert_eq!(code, Code::Internal, "{message}");
    assert!(
        message.starts_with("failed to authenticate user"),
        "{message}"
    );
    faults.fail_next(
        RequestMatch::new(Verb::Create, "subjectaccessreviews"),
        1,
        500,
    );
    let (code, message) = code_of(&mut client, env.allocated("snap")).await;
    assert_eq!(code, Code::Internal, "{message}");
    assert!(
        message.starts_with("failed to authorize the user"),
        "{message}"
    );

    // A driver error without a gRPC code of its own is Internal; a coded one passes unchanged.
    let method = csi_proto::methods::snapshot_metadata::GET_METADATA_ALLOCATED;
    env.mock
        .faults()
        .fail_next(method, 1, Code::Unknown, "backend exploded");
    let (code, message) = code_of(&mut client, env.allocated("snap")).await;
    assert_eq!(code, Code::Internal, "{message}");
    assert!(
        message.starts_with("failed to get response from CSI driver"),
        "{message}"
    );
    env.mock
        .faults()
        .fail_next(method, 1, Code::ResourceExhausted, "busy");
    let (code, message) = code_of(&mut client, env.allocated("snap")).await;
    assert_eq!((code, message.as_str()), (Code::ResourceExhausted, "busy"));

    // Two default classes of the driver: which one's secret is meant cannot be told.
    for name in ["first", "second"] {
        Env::create(
            &env.dynamic("volumesnapshotclasses", None),
            json!({
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshotClass",
                "metadata": {"name": name, "annotations": {
                    "snapshot.storage.kubernetes.io/is-default-class": "true"}},
                "driver": DRIVER,
                "deletionPolicy": "Delete",
            }),
        )
        .await;
    }
    let message = eventually("both defaults to be seen", || {
        let mut client = client.clone();
        let request = env.allocated("snap");
        async move {
            let status = all_allocated(&mut client, request).await.err()?;
            (status.code() == Code::Unavailable).then(|| status.message().to_string())
        }
    })
    .await;
    assert_eq!(
        message,
        format!("multiple default VolumeSnapshotClasses are set for the CSI driver '{DRIVER}'")
    );

    // A class naming a secret that does not exist.
    Env::create(
        &env.dynamic("volumesnapshotclasses", None),
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": "secretive"},
            "driver": DRIVER,
            "deletionPolicy": "Delete",
            "parameters": {
                "csi.storage.k8s.io/snapshotter-secret-name": "absent",
                "csi.storage.k8s.io/snapshotter-secret-namespace": NAMESPACE,
            },
        }),
    )
    .await;
    written(&env, "classy", Some("secretive")).await;
    let code = eventually("the class to be seen", || {
        let mut client = client.clone();
        let request = env.allocated("classy");
        async move {
            let status = all_allocated(&mut client, request).await.err()?;
            status
                .message()
                .starts_with("failed to get credentials")
                .then(|| status.code())
        }
    })
    .await;
    assert_eq!(code, Code::Unavailable);
}
