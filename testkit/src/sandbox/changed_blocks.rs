//! The "changed blocks" step (KEP-3314): csi-snapshot-metadata tells a backup application which
//! blocks of a block volume changed between two of its snapshots, and which are allocated in
//! the second, over TLS, after a TokenReview and a SubjectAccessReview of the caller.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{
    NAMESPACE, Outcome, STEP_TIMEOUT, Sandbox, SandboxError, object, provision_by_hand,
    snapshot_resource, wait_for,
};
use crate::apiserver::{Access, Subject, TokenIdentity};

/// The step's name.
pub(super) const STEP: &str = "changed blocks";
/// The block-mode claim whose snapshots are compared.
const CLAIM: &str = "sandbox-block";
/// What the backup application's token is issued for (`--audience`).
const AUDIENCE: &str = "sandbox-backup";
/// The backup application's token and service account.
const TOKEN: &str = "sandbox-backup-token";
const BACKUP_ACCOUNT: &str = "sandbox-backup";
/// The mock's block size.
const BLOCK: i64 = 4096;
/// The blocks written before the first snapshot, and before the second.
const FIRST_WRITE: [u64; 5] = [0, 1, 2, 3, 7];
const SECOND_WRITE: [u64; 2] = [3, 10];

/// The running csi-snapshot-metadata: its TLS gRPC port and its HTTP port (`/health`, metrics).
pub(super) struct Server {
    port: u16,
    http_port: u16,
}

/// Starts csi-snapshot-metadata with the test kit's certificate (valid for 127.0.0.1) and the
/// sandbox's audience; `None` (and a skipped step) when it is not built.
pub(super) fn spawn(
    sandbox: &mut Sandbox,
    binary: Option<PathBuf>,
    endpoint: &str,
) -> Result<Option<Server>, SandboxError> {
    let Some(binary) = binary else {
        sandbox.record(
            STEP,
            Outcome::Skipped("binary csi-snapshot-metadata not built".into()),
        );
        return Ok(None);
    };
    let cert = sandbox.work_dir.join("snapshot-metadata-tls.crt");
    let key = sandbox.work_dir.join("snapshot-metadata-tls.key");
    std::fs::write(&cert, crate::tls::CERT)?;
    std::fs::write(&key, crate::tls::KEY)?;
    let port = crate::measure::free_port()?;
    let http_port = crate::measure::free_port()?;
    let kubeconfig = sandbox.kubeconfig().display().to_string();
    sandbox.spawn(
        "external-snapshot-metadata",
        &binary,
        &[
            format!("--csi-address={endpoint}"),
            format!("--kubeconfig={kubeconfig}"),
            format!("--port={port}"),
            format!("--http-endpoint=127.0.0.1:{http_port}"),
            format!("--tls-cert={}", cert.display()),
            format!("--tls-key={}", key.display()),
            format!("--audience={AUDIENCE}"),
        ],
    )?;
    Ok(Some(Server { port, http_port }))
}

/// A block-mode claim; blocks written, snap-1, more blocks written, snap-2; then a backup
/// client asks csi-snapshot-metadata what changed between them and what snap-2 holds.
pub(super) async fn show(
    sandbox: &Sandbox,
    server: &Server,
    provisioner: bool,
) -> Result<Outcome, SandboxError> {
    let client = sandbox.api.client();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let claim: PersistentVolumeClaim = object(json!({
        "metadata": {"name": CLAIM, "namespace": NAMESPACE},
        "spec": {"storageClassName": "sandbox", "volumeMode": "Block",
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))?;
    let claim = claims.create(&PostParams::default(), &claim).await?;
    if !provisioner {
        provision_by_hand(sandbox, &claim).await?;
    }
    let bound = wait_for(|| {
        let claims = claims.clone();
        async move {
            let claim = claims.get(CLAIM).await.ok()?;
            (claim.status?.phase.as_deref() == Some("Bound"))
                .then(|| claim.spec?.volume_name)
                .flatten()
        }
    })
    .await;
    let Some(pv_name) = bound else {
        return Ok(Outcome::Failed(format!(
            "PVC {CLAIM} (volumeMode Block) not bound within {STEP_TIMEOUT:?}"
        )));
    };
    let Some(volume) = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await?
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
    else {
        return Ok(Outcome::Failed(format!("PV {pv_name} has no CSI volume")));
    };

    let write = |blocks: &[u64]| {
        sandbox
            .driver
            .write_blocks(&volume, blocks.iter().copied())
            .map_err(|err| SandboxError::Setup(format!("writing blocks of {volume}: {err}")))
    };
    write(&FIRST_WRITE)?;
    let Some(base) = ready_handle(sandbox, "snap-1").await? else {
        return Ok(not_ready("snap-1"));
    };
    write(&SECOND_WRITE)?;
    if ready_handle(sandbox, "snap-2").await?.is_none() {
        return Ok(not_ready("snap-2"));
    }

    let http_port = server.http_port;
    let serving = wait_for(|| async move {
        crate::measure::http_get(http_port, "/health")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    if serving.is_none() {
        return Ok(Outcome::Failed(format!(
            "csi-snapshot-metadata's /health on port {http_port} did not answer 200 within {STEP_TIMEOUT:?}"
        )));
    }

    // The backup application: a service account whose token is issued for the audience, allowed
    // to get VolumeSnapshots in the namespace.
    let reviews = sandbox.api.reviews();
    reviews.add_token(
        TOKEN,
        TokenIdentity::service_account(NAMESPACE, BACKUP_ACCOUNT).audience(AUDIENCE),
    );
    reviews.allow(
        Subject::user(format!(
            "system:serviceaccount:{NAMESPACE}:{BACKUP_ACCOUNT}"
        )),
        Access::new(
            "get",
            "snapshot.storage.k8s.io",
            "volumesnapshots",
            NAMESPACE,
        ),
    );
    let delta_request = api::GetMetadataDeltaRequest {
        security_token: TOKEN.into(),
        namespace: NAMESPACE.into(),
        base_snapshot_id: base.clone(),
        target_snapshot_name: "snap-2".into(),
        ..Default::default()
    };
    let allocated_request = api::GetMetadataAllocatedRequest {
        security_token: TOKEN.into(),
        namespace: NAMESPACE.into(),
        snapshot_name: "snap-2".into(),
        ..Default::default()
    };
    let port = server.port;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let delta = match ranges(port, api::DELTA, delta_request, deadline).await {
        Ok(ranges) => ranges,
        Err(err) => return Ok(Outcome::Failed(format!("GetMetadataDelta: {err}"))),
    };
    let allocated = match ranges(port, api::ALLOCATED, allocated_request, deadline).await {
        Ok(ranges) => ranges,
        Err(err) => return Ok(Outcome::Failed(format!("GetMetadataAllocated: {err}"))),
    };

    let shown = format!(
        "changed between snap-1 and snap-2: {}; allocated in snap-2: {}",
        list(&delta),
        list(&allocated)
    );
    let expected_delta = expected(SECOND_WRITE);
    let expected_allocated = expected(FIRST_WRITE.into_iter().chain(SECOND_WRITE));
    if delta != expected_delta || allocated != expected_allocated {
        return Ok(Outcome::Failed(format!(
            "{shown}; expected changed {}, allocated {}",
            list(&expected_delta),
            list(&expected_allocated)
        )));
    }
    Ok(Outcome::Ok(format!(
        "PVC {NAMESPACE}/{CLAIM} (volumeMode Block) bound to PV {pv_name}; blocks {FIRST_WRITE:?} written, VolumeSnapshot snap-1 ready (handle {base}), blocks {SECOND_WRITE:?} written, snap-2 ready; backup client {NAMESPACE}/{BACKUP_ACCOUNT} over TLS at 127.0.0.1:{port} (ranges offset+size, bytes): {shown}; metrics at http://127.0.0.1:{http_port}/metrics"
    )))
}

/// Cuts VolumeSnapshot `name` of the block claim; its snapshot handle (base of a delta: from
/// its content's status) once ready, `None` if not within the step timeout.
async fn ready_handle(sandbox: &Sandbox, name: &str) -> Result<Option<String>, SandboxError> {
    let Some(content) = super::cut_snapshot(sandbox, name, CLAIM).await? else {
        return Ok(None);
    };
    let contents: Api<DynamicObject> = Api::all_with(
        sandbox.api.client(),
        &snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    Ok(wait_for(|| {
        let (contents, content) = (contents.clone(), content.clone());
        async move {
            let content = contents.get(&content).await.ok()?;
            let handle = content
                .data
                .get("status")?
                .get("snapshotHandle")?
                .as_str()?;
            Some(handle.to_string())
        }
    })
    .await)
}

fn not_ready(name: &str) -> Outcome {
    Outcome::Failed(format!(
        "VolumeSnapshot {name} of {CLAIM} not ready (with a snapshot handle) within {STEP_TIMEOUT:?}"
    ))
}

/// The `(offset, size)` ranges the mock lists for `blocks` written: one per block, ascending.
fn expected(blocks: impl IntoIterator<Item = u64>) -> Vec<(i64, i64)> {
    let blocks: BTreeSet<u64> = blocks.into_iter().collect();
    blocks
        .into_iter()
        .map(|block| (i64::try_from(block).unwrap_or(i64::MAX) * BLOCK, BLOCK))
        .collect()
}

/// `[12288+4096, 40960+4096]`.
fn list(ranges: &[(i64, i64)]) -> String {
    let items: Vec<String> = ranges
        .iter()
        .map(|(offset, size)| format!("{offset}+{size}"))
        .collect();
    format!("[{}]", items.join(", "))
}

/// Every range of the server stream `method` answers `request` with. Until `deadline`, the
/// call is repeated while the sidecar answers Unavailable (not ready yet, or the snapshot not
/// yet seen ready), as a backup application retries.
async fn ranges<Req>(
    port: u16,
    method: &'static str,
    request: Req,
    deadline: Instant,
) -> Result<Vec<(i64, i64)>, String>
where
    Req: prost::Message + Clone + Send + Sync + 'static,
{
    loop {
        let call = async {
            let channel = connect(port).await?;
            stream(channel, method, request.clone())
                .await
                .map_err(Failure::Status)
        };
        let failure = match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(ranges)) => return Ok(ranges),
            Ok(Err(failure)) => failure,
            Err(_) => return Err(format!("no answer within {STEP_TIMEOUT:?}")),
        };
        let retry = matches!(&failure, Failure::Status(s) if s.code() == tonic::Code::Unavailable)
            || matches!(failure, Failure::Connect(_));
        if !retry || Instant::now() + Duration::from_millis(200) >= deadline {
            return Err(failure.to_string());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("cannot connect over TLS: {0}")]
    Connect(String),
    #[error("{}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
}

/// A channel to 127.0.0.1:`port` over TLS (HTTP/2 by ALPN), trusting only the test kit's CA.
async fn connect(port: u16) -> Result<Channel, Failure> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(crate::tls::CA) {
        let ca = ca.map_err(|e| Failure::Connect(format!("the test CA: {e}")))?;
        roots
            .add(ca)
            .map_err(|e| Failure::Connect(format!("the test CA: {e}")))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Failure::Connect(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    Endpoint::from_static("http://127.0.0.1")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let name = ServerName::try_from("127.0.0.1").map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| Failure::Connect(chain(&e)))
}

/// An error and its sources, `: `-separated.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The ranges of every message of the server stream `method`.
async fn stream<Req>(
    channel: Channel,
    method: &'static str,
    request: Req,
) -> Result<Vec<(i64, i64)>, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("channel not ready: {e}")))?;
    let codec = tonic_prost::ProstCodec::<Req, api::MetadataResponse>::default();
    let mut messages = grpc
        .server_streaming(
            tonic::Request::new(request),
            PathAndQuery::from_static(method),
            codec,
        )
        .await?
        .into_inner();
    let mut ranges = Vec::new();
    while let Some(message) = messages.message().await? {
        ranges.extend(
            message
                .block_metadata
                .iter()
                .map(|b| (b.byte_offset, b.size_bytes)),
        );
    }
    Ok(ranges)
}

/// The messages of `snapshotmetadata.SnapshotMetadata` (external-snapshot-metadata's
/// `proto/schema.proto`) the backup client uses.
mod api {
    pub const ALLOCATED: &str = "/snapshotmetadata.SnapshotMetadata/GetMetadataAllocated";
    pub const DELTA: &str = "/snapshotmetadata.SnapshotMetadata/GetMetadataDelta";

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetMetadataAllocatedRequest {
        #[prost(string, tag = "1")]
        pub security_token: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(string, tag = "3")]
        pub snapshot_name: String,
        #[prost(int64, tag = "4")]
        pub starting_offset: i64,
        #[prost(int32, tag = "5")]
        pub max_results: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetMetadataDeltaRequest {
        #[prost(string, tag = "1")]
        pub security_token: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(string, tag = "3")]
        pub base_snapshot_id: String,
        #[prost(string, tag = "4")]
        pub target_snapshot_name: String,
        #[prost(int64, tag = "5")]
        pub starting_offset: i64,
        #[prost(int32, tag = "6")]
        pub max_results: i32,
    }

    /// `GetMetadataAllocatedResponse` and `GetMetadataDeltaResponse`: the same fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MetadataResponse {
        /// `BlockMetadataType`: 1 FIXED_LENGTH, 2 VARIABLE_LENGTH.
        #[prost(int32, tag = "1")]
        pub block_metadata_type: i32,
        #[prost(int64, tag = "2")]
        pub volume_capacity_bytes: i64,
        #[prost(message, repeated, tag = "3")]
        pub block_metadata: Vec<BlockMetadata>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BlockMetadata {
        #[prost(int64, tag = "1")]
        pub byte_offset: i64,
        #[prost(int64, tag = "2")]
        pub size_bytes: i64,
    }
}
