//! What the kubelet's plugin watcher does with a registration socket, for the sandbox and tests:
//! dial it, ask `GetInfo`, check the answer as kubelet does, and report the outcome with
//! `NotifyRegistrationStatus`. The calls go out as kubelet's grpc-go client sends them, with the
//! socket path as `:authority` (see [`crate::grpcgo`]).

use std::path::Path;
use std::time::Duration;

use csi_proto::methods::registration::{GET_INFO, NOTIFY_REGISTRATION_STATUS};
use csi_proto::pluginregistration::{
    CSI_PLUGIN, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::grpcgo::{self, GrpcGoError};

/// The CSI plugin API versions this kubelet accepts.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];
/// Kubelet's timeouts: dialing, and `GetInfo`.
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot dial {path}: {source}")]
    Dial {
        path: String,
        source: tonic::transport::Error,
    },
    #[error("cannot connect to {path}: {source}")]
    Connect { path: String, source: GrpcGoError },
    #[error("{call} failed: {source}")]
    Call {
        call: &'static str,
        source: GrpcGoError,
    },
    #[error("plugin rejected: {0}")]
    Rejected(String),
}

/// A tonic channel to a gRPC server on a unix socket, for calls that need not look like kubelet.
pub async fn dial_unix(socket: &Path) -> Result<Channel, RegistrationError> {
    let path = socket.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            tokio::net::UnixStream::connect(path)
                .await
                .map(TokioIo::new)
        }
    });
    Endpoint::from_static("http://plugin.local")
        .connect_timeout(DIAL_TIMEOUT)
        .connect_with_connector(connector)
        .await
        .map_err(|source| RegistrationError::Dial {
            path: socket.display().to_string(),
            source,
        })
}

/// kubelet's checks of a CSI plugin's `PluginInfo`: `None` when it is acceptable, else the error
/// kubelet would report back.
pub fn validate(info: &PluginInfo) -> Option<String> {
    if info.r#type != CSI_PLUGIN {
        return Some(format!("plugin type {:?} is not {CSI_PLUGIN}", info.r#type));
    }
    if info.name.is_empty() {
        return Some("plugin name is empty".into());
    }
    if info.endpoint.is_empty() {
        return Some("plugin endpoint is empty".into());
    }
    if !info
        .supported_versions
        .iter()
        .any(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
    {
        return Some(format!(
            "none of the versions {:?} is supported",
            info.supported_versions
        ));
    }
    None
}

/// Registers the plugin behind `socket` as kubelet does; returns its `PluginInfo`.
pub async fn register(socket: &Path) -> Result<PluginInfo, RegistrationError> {
    let options = grpcgo::Options {
        timeout: Some(GET_INFO_TIMEOUT),
        ..grpcgo::Options::kubelet(socket)
    };
    let mut client = grpcgo::with_timeout(DIAL_TIMEOUT, grpcgo::dial_unix(socket, options))
        .await
        .map_err(|source| RegistrationError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let info: PluginInfo =
        grpcgo::with_timeout(GET_INFO_TIMEOUT, client.unary(GET_INFO, &InfoRequest {}))
            .await
            .map_err(|source| RegistrationError::Call {
                call: "GetInfo",
                source,
            })?;
    let problem = validate(&info);
    let status = RegistrationStatus {
        plugin_registered: problem.is_none(),
        error: problem.clone().unwrap_or_default(),
    };
    let _: RegistrationStatusResponse = grpcgo::with_timeout(
        NOTIFY_TIMEOUT,
        client.unary(NOTIFY_REGISTRATION_STATUS, &status),
    )
    .await
    .map_err(|source| RegistrationError::Call {
        call: "NotifyRegistrationStatus",
        source,
    })?;
    match problem {
        None => Ok(info),
        Some(problem) => Err(RegistrationError::Rejected(problem)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_as_kubelet() {
        let good = PluginInfo {
            r#type: CSI_PLUGIN.into(),
            name: "d.example.com".into(),
            endpoint: "/var/lib/kubelet/plugins/d/csi.sock".into(),
            supported_versions: vec!["1.0.0".into()],
        };
        assert_eq!(validate(&good), None);
        assert!(
            validate(&PluginInfo {
                r#type: "DevicePlugin".into(),
                ..good.clone()
            })
            .is_some()
        );
        assert!(
            validate(&PluginInfo {
                name: String::new(),
                ..good.clone()
            })
            .is_some()
        );
        assert!(
            validate(&PluginInfo {
                supported_versions: vec!["0.3.0".into()],
                ..good.clone()
            })
            .is_some()
        );
    }
}
