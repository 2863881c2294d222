//! `/healthz`: the registration socket seen the way kubelet sees it — the file exists, and a fresh
//! connection to it answers GetInfo with our driver name within `--timeout`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_proto::pluginregistration::{InfoRequest, PluginInfo};
use http::StatusCode;
use hyper_util::rt::TokioIo;
use sidecar_kit::driver::endpoint::Endpoint;
use sidecar_kit::process::http::Reply;
use sidecar_kit::process::metrics::code_label;
use tonic::metadata::MetadataValue;

use crate::service::HEALTH_CHECK_METADATA;

/// Upstream's body for a missing socket.
pub const SOCKET_MISSING: &str = "registration socket does not exist";

/// The verdict of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Ok,
    SocketMissing,
    Failed(String),
}

impl Health {
    /// 200 `ok`, 404 for a missing socket, 500 with the error otherwise, as upstream.
    pub fn reply(&self) -> Reply {
        match self {
            Self::Ok => Reply::ok(),
            Self::SocketMissing => Reply::text(StatusCode::NOT_FOUND, SOCKET_MISSING),
            Self::Failed(error) => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, error.clone()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("error connecting to node-registrar socket {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
    #[error("error getting info from node-registrar socket: {0}")]
    GetInfo(String),
    #[error("no answer from node-registrar socket {path} within {timeout:?}")]
    Timeout { path: PathBuf, timeout: Duration },
}

/// Checks the registration socket at `path` serving `driver_name`.
pub async fn check(path: &Path, driver_name: &str, timeout: Duration) -> Health {
    match std::fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Health::SocketMissing,
        Err(err) => return Health::Failed(format!("cannot stat {}: {err}", path.display())),
    }
    match get_info(path, timeout).await {
        Ok(info) if info.name == driver_name => Health::Ok,
        Ok(info) => Health::Failed(format!("invalid driver name {}", info.name)),
        Err(err) => Health::Failed(err.to_string()),
    }
}

/// Calls GetInfo on the registration socket at `path` over a new connection, as kubelet does,
/// marked as a health check so that the service does not log it as kubelet's.
pub async fn get_info(path: &Path, timeout: Duration) -> Result<PluginInfo, CheckError> {
    let call = async {
        let endpoint = Endpoint::Unix(path.to_path_buf());
        let channel = tonic::transport::Endpoint::from_static("http://registration.local")
            .connect_with_connector(tower::service_fn(move |_| {
                let endpoint = endpoint.clone();
                async move {
                    sidecar_kit::driver::connection::dial(&endpoint)
                        .await
                        .map(TokioIo::new)
                }
            }))
            .await
            .map_err(|err| CheckError::Connect {
                path: path.to_path_buf(),
                reason: error_chain(&err),
            })?;
        let mut request = tonic::Request::new(InfoRequest {});
        request
            .metadata_mut()
            .insert(HEALTH_CHECK_METADATA, MetadataValue::from_static("1"));
        RegistrationClient::new(channel)
            .get_info(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| {
                CheckError::GetInfo(format!(
                    "rpc error: code = {} desc = {}",
                    code_label(status.code()),
                    status.message()
                ))
            })
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(CheckError::Timeout {
                path: path.to_path_buf(),
                timeout,
            })
        })
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text = format!("{text}: {inner}");
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies() {
        assert_eq!(Health::Ok.reply(), Reply::ok());
        let missing = Health::SocketMissing.reply();
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert_eq!(missing.body, "registration socket does not exist");
        let failed = Health::Failed("boom".into()).reply();
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.body, "boom");
    }

    #[tokio::test]
    async fn missing_socket_and_dead_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d-reg.sock");
        assert_eq!(
            check(&path, "d", Duration::from_secs(1)).await,
            Health::SocketMissing
        );
        std::fs::write(&path, "").unwrap();
        let Health::Failed(error) = check(&path, "d", Duration::from_secs(1)).await else {
            panic!("a plain file must fail the check");
        };
        assert!(error.contains("error connecting"), "{error}");
    }
}
