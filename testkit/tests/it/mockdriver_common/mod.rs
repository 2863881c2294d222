//! Helpers shared by the mock driver tests: clients over a real unix
//! socket and request builders.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_proto::v1;
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use hyper_util::rt::TokioIo;
use testkit::mockdriver::{MockDriver, MockHandle};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel that dials the unix socket at `path`; the URI is required by
/// HTTP/2 but never resolved.
pub async fn connect(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::try_from("http://[::1]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}

pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Clients {
    pub async fn new(path: &Path) -> Self {
        let channel = connect(path).await;
        Self {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        }
    }
}

/// A mock served in a fresh temp dir, with clients connected to it.
/// Bind every field: dropping `mock` stops it, dropping `_dir` deletes
/// the socket's directory.
pub struct Served {
    pub mock: MockHandle,
    pub clients: Clients,
    pub _dir: tempfile::TempDir,
}

pub async fn serve(driver: MockDriver) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let mock = driver
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let clients = Clients::new(mock.socket_path()).await;
    Served {
        mock,
        clients,
        _dir: dir,
    }
}

pub fn mount(mode: Mode) -> v1::VolumeCapability {
    v1::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    }
}

pub fn rwo() -> v1::VolumeCapability {
    mount(Mode::SingleNodeWriter)
}

pub fn create_request(name: &str, required_bytes: i64) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(v1::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rwo()],
        ..Default::default()
    }
}

pub fn publish_request(volume_id: &str, node_id: &str) -> v1::ControllerPublishVolumeRequest {
    v1::ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node_id.into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    }
}

pub fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> tonic::Code {
    result.unwrap_err().code()
}

/// Whether `call` is still unanswered after `wait` (it is dropped then,
/// which cancels it). Tonic servers answer an expired `grpc-timeout` with
/// CANCELLED, so tests bound calls on the client side instead.
pub async fn still_pending_after<F: Future>(wait: Duration, call: F) -> bool {
    tokio::time::timeout(wait, call).await.is_err()
}

/// Waits until `path` exists; false after `timeout`.
pub async fn wait_for_path(path: &Path, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while !path.exists() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

pub fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("csi.sock")
}
