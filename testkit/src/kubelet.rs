//! What the kubelet's plugin watcher does with a registration socket, for the sandbox and tests:
//! dial it, ask `GetInfo`, check the answer as kubelet does, and report the outcome with
//! `NotifyRegistrationStatus`.

use std::path::Path;
use std::time::Duration;

use csi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_proto::pluginregistration::{CSI_PLUGIN, InfoRequest, PluginInfo, RegistrationStatus};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// The CSI plugin API versions this kubelet accepts.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot dial {path}: {source}")]
    Dial {
        path: String,
        source: tonic::transport::Error,
    },
    #[error("{call} failed: {status}")]
    Call {
        call: &'static str,
        status: tonic::Status,
    },
    #[error("plugin rejected: {0}")]
    Rejected(String),
}

/// Dials a gRPC server on a unix socket with kubelet's 1 s connection timeout.
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
        .connect_timeout(Duration::from_secs(1))
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
    let mut client = RegistrationClient::new(dial_unix(socket).await?);
    let mut request = tonic::Request::new(InfoRequest {});
    request.set_timeout(Duration::from_secs(1));
    let info = client
        .get_info(request)
        .await
        .map_err(|status| RegistrationError::Call {
            call: "GetInfo",
            status,
        })?
        .into_inner();
    let problem = validate(&info);
    let status = RegistrationStatus {
        plugin_registered: problem.is_none(),
        error: problem.clone().unwrap_or_default(),
    };
    client
        .notify_registration_status(status)
        .await
        .map_err(|status| RegistrationError::Call {
            call: "NotifyRegistrationStatus",
            status,
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
