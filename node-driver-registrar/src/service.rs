//! The `pluginregistration.Registration` service kubelet calls on the registration socket.
//!
//! `GetInfo` answers from memory: kubelet gives it one second at registration and keeps calling
//! it every 10 s afterwards as a liveness signal. A rejection in `NotifyRegistrationStatus` is
//! handed to the owner of the service, which exits so that the container restart registers anew.

use csi_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use csi_proto::pluginregistration::{
    CSI_PLUGIN, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use sidecar_kit::driver::csi::record_code;
use sidecar_kit::telemetry::propagate::server_span;
use tokio::sync::mpsc;
use tonic::{Code, Request, Response, Status};

/// The CSI versions the registrar announces, as upstream.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// Metadata key the /healthz self-check sets, so that its GetInfo calls are not logged as
/// kubelet's.
pub const HEALTH_CHECK_METADATA: &str = "x-registrar-health-check";

/// The answer to GetInfo.
pub fn plugin_info(driver_name: &str, kubelet_registration_path: &str) -> PluginInfo {
    PluginInfo {
        r#type: CSI_PLUGIN.to_string(),
        name: driver_name.to_string(),
        endpoint: kubelet_registration_path.to_string(),
        supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
    }
}

/// Kubelet's verdict on the registration, as reported by NotifyRegistrationStatus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub error: String,
}

pub struct RegistrationService {
    info: PluginInfo,
    rejections: mpsc::Sender<Rejection>,
}

impl RegistrationService {
    /// The service and the receiver of kubelet's rejections.
    pub fn new(info: PluginInfo) -> (Self, mpsc::Receiver<Rejection>) {
        let (rejections, received) = mpsc::channel(1);
        (Self { info, rejections }, received)
    }

    pub fn into_server(self) -> RegistrationServer<Self> {
        RegistrationServer::new(self)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        // The health check asks every few seconds: a trace of each would bury kubelet's.
        if request.metadata().contains_key(HEALTH_CHECK_METADATA) {
            tracing::debug!("GetInfo from the health check");
        } else {
            let span = server_span(
                "pluginregistration.Registration/GetInfo",
                request.metadata(),
            );
            let _inside = span.enter();
            record_code(&span, Code::Ok);
            tracing::info!(
                name = %self.info.name,
                endpoint = %self.info.endpoint,
                versions = ?self.info.supported_versions,
                "GetInfo from kubelet"
            );
        }
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let span = server_span(
            "pluginregistration.Registration/NotifyRegistrationStatus",
            request.metadata(),
        );
        let _inside = span.enter();
        record_code(&span, Code::Ok);
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "kubelet registered the driver");
        } else {
            tracing::error!(
                driver = %self.info.name,
                error = %status.error,
                "kubelet rejected the registration; exiting so that the container restarts and registers again"
            );
            // The first rejection decides; later ones are already on their way out.
            let _ = self.rejections.try_send(Rejection {
                error: status.error,
            });
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_is_what_kubelet_expects() {
        let info = plugin_info("hostpath.csi.k8s.io", "/var/lib/kubelet/plugins/h/csi.sock");
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "hostpath.csi.k8s.io");
        assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/h/csi.sock");
        assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
    }

    #[tokio::test]
    async fn calls() {
        let (service, mut rejections) = RegistrationService::new(plugin_info("d", "/p"));
        let info = service
            .get_info(Request::new(InfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, "d");

        service
            .notify_registration_status(Request::new(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            }))
            .await
            .unwrap();
        assert!(rejections.try_recv().is_err());

        for error in ["first", "second"] {
            service
                .notify_registration_status(Request::new(RegistrationStatus {
                    plugin_registered: false,
                    error: error.into(),
                }))
                .await
                .unwrap();
        }
        assert_eq!(
            rejections.try_recv().unwrap(),
            Rejection {
                error: "first".into()
            }
        );
        assert!(rejections.try_recv().is_err());
    }
}
