//! The CSI client all sidecars call the driver through: every call is timed into
//! `csi_sidecar_operations_seconds`, bounded by its timeout (also sent to the driver as the gRPC
//! deadline), and at `-v=5` logged with its request and response, secrets stripped.

use std::future::Future;
use std::time::Duration;

use csi_proto::methods;
use csi_proto::v1::{
    self, controller_client::ControllerClient, group_controller_client::GroupControllerClient,
    identity_client::IdentityClient, node_client::NodeClient,
};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::Instrument;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::driver::connection::DriverConnection;
use crate::driver::endpoint::Endpoint;
use crate::process::metrics::{CsiMetrics, code_label};

/// The message a call that ran out of time fails with (the text gRPC-Go uses).
pub const DEADLINE_MESSAGE: &str = "context deadline exceeded";

/// A measured, logged client of one driver connection. Cheap to clone.
#[derive(Clone)]
pub struct CsiClient {
    connection: DriverConnection,
    metrics: CsiMetrics,
    /// Cap on the logged response length; negative means no cap (`--max-grpc-log-length`).
    max_log_length: i64,
}

/// Per-call settings.
#[derive(Clone, Copy, Debug)]
pub struct CallOptions {
    /// `None` lets the call run until the driver answers.
    pub timeout: Option<Duration>,
    /// The `migrated` label value, for calls on behalf of a migrated in-tree volume.
    pub migrated: bool,
}

impl CallOptions {
    pub fn timeout(timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            migrated: false,
        }
    }
}

impl CsiClient {
    pub fn new(connection: DriverConnection, metrics: CsiMetrics) -> Self {
        Self {
            connection,
            metrics,
            max_log_length: -1,
        }
    }

    pub fn with_max_log_length(mut self, max_log_length: i64) -> Self {
        self.max_log_length = max_log_length;
        self
    }

    pub fn connection(&self) -> &DriverConnection {
        &self.connection
    }

    pub fn metrics(&self) -> &CsiMetrics {
        &self.metrics
    }

    /// Calls one unary method: `method` is its full path (from `csi_proto::methods`) and `call`
    /// performs it on the channel with the generated client.
    pub async fn unary<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        request: Req,
        options: CallOptions,
        call: F,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message + prost::Name,
        Resp: prost::Message + prost::Name,
        F: FnOnce(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let logging = tracing::enabled!(tracing::Level::TRACE);
        if logging {
            tracing::trace!(method, request = %csi_proto::redact::sanitize(&request), "GRPC call");
        }
        let mut request = tonic::Request::new(request);
        if let Some(timeout) = options.timeout {
            request.set_timeout(timeout);
        }
        let span = traced_call(method, self.connection.endpoint(), &mut request);
        let started = Instant::now();
        let pending = call(self.connection.channel(), request).instrument(span.clone());
        let result = match options.timeout {
            Some(timeout) => match tokio::time::timeout(timeout, pending).await {
                Ok(result) => result,
                Err(_) => Err(Status::deadline_exceeded(DEADLINE_MESSAGE)),
            },
            None => pending.await,
        }
        .map(tonic::Response::into_inner)
        .map_err(|status| match options.timeout {
            // tonic's own deadline enforcement reports Cancelled; callers and metrics expect the
            // gRPC meaning, DeadlineExceeded.
            Some(timeout) if status.code() == Code::Cancelled && started.elapsed() >= timeout => {
                Status::deadline_exceeded(DEADLINE_MESSAGE)
            }
            _ => status,
        });
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        record_code(&span, code);
        self.metrics.observe(
            method,
            code_label(code),
            started.elapsed(),
            options.migrated,
        );
        if logging {
            match &result {
                Ok(response) => {
                    let text = truncate(csi_proto::redact::sanitize(response), self.max_log_length);
                    tracing::trace!(method, response = %text, "GRPC response");
                }
                Err(status) => tracing::trace!(
                    method,
                    code = code_label(status.code()),
                    message = status.message(),
                    "GRPC error"
                ),
            }
        }
        result
    }

    pub async fn get_plugin_info(
        &self,
        options: CallOptions,
    ) -> Result<v1::GetPluginInfoResponse, Status> {
        self.unary(
            methods::identity::GET_PLUGIN_INFO,
            v1::GetPluginInfoRequest {},
            options,
            |ch, r| async move { IdentityClient::new(ch).get_plugin_info(r).await },
        )
        .await
    }

    pub async fn get_plugin_capabilities(
        &self,
        options: CallOptions,
    ) -> Result<v1::GetPluginCapabilitiesResponse, Status> {
        self.unary(
            methods::identity::GET_PLUGIN_CAPABILITIES,
            v1::GetPluginCapabilitiesRequest {},
            options,
            |ch, r| async move { IdentityClient::new(ch).get_plugin_capabilities(r).await },
        )
        .await
    }

    pub async fn probe(&self, options: CallOptions) -> Result<v1::ProbeResponse, Status> {
        self.unary(
            methods::identity::PROBE,
            v1::ProbeRequest {},
            options,
            |ch, r| async move { IdentityClient::new(ch).probe(r).await },
        )
        .await
    }

    pub async fn controller_get_capabilities(
        &self,
        options: CallOptions,
    ) -> Result<v1::ControllerGetCapabilitiesResponse, Status> {
        self.unary(
            methods::controller::CONTROLLER_GET_CAPABILITIES,
            v1::ControllerGetCapabilitiesRequest {},
            options,
            |ch, r| async move {
                ControllerClient::new(ch)
                    .controller_get_capabilities(r)
                    .await
            },
        )
        .await
    }

    pub async fn controller_publish_volume(
        &self,
        request: v1::ControllerPublishVolumeRequest,
        options: CallOptions,
    ) -> Result<v1::ControllerPublishVolumeResponse, Status> {
        self.unary(
            methods::controller::CONTROLLER_PUBLISH_VOLUME,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).controller_publish_volume(r).await },
        )
        .await
    }

    pub async fn controller_unpublish_volume(
        &self,
        request: v1::ControllerUnpublishVolumeRequest,
        options: CallOptions,
    ) -> Result<v1::ControllerUnpublishVolumeResponse, Status> {
        self.unary(
            methods::controller::CONTROLLER_UNPUBLISH_VOLUME,
            request,
            options,
            |ch, r| async move {
                ControllerClient::new(ch)
                    .controller_unpublish_volume(r)
                    .await
            },
        )
        .await
    }

    pub async fn list_volumes(
        &self,
        request: v1::ListVolumesRequest,
        options: CallOptions,
    ) -> Result<v1::ListVolumesResponse, Status> {
        self.unary(
            methods::controller::LIST_VOLUMES,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).list_volumes(r).await },
        )
        .await
    }

    pub async fn controller_get_volume(
        &self,
        request: v1::ControllerGetVolumeRequest,
        options: CallOptions,
    ) -> Result<v1::ControllerGetVolumeResponse, Status> {
        self.unary(
            methods::controller::CONTROLLER_GET_VOLUME,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).controller_get_volume(r).await },
        )
        .await
    }

    pub async fn create_volume(
        &self,
        request: v1::CreateVolumeRequest,
        options: CallOptions,
    ) -> Result<v1::CreateVolumeResponse, Status> {
        self.unary(
            methods::controller::CREATE_VOLUME,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).create_volume(r).await },
        )
        .await
    }

    pub async fn delete_volume(
        &self,
        request: v1::DeleteVolumeRequest,
        options: CallOptions,
    ) -> Result<v1::DeleteVolumeResponse, Status> {
        self.unary(
            methods::controller::DELETE_VOLUME,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).delete_volume(r).await },
        )
        .await
    }

    pub async fn create_snapshot(
        &self,
        request: v1::CreateSnapshotRequest,
        options: CallOptions,
    ) -> Result<v1::CreateSnapshotResponse, Status> {
        self.unary(
            methods::controller::CREATE_SNAPSHOT,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).create_snapshot(r).await },
        )
        .await
    }

    pub async fn delete_snapshot(
        &self,
        request: v1::DeleteSnapshotRequest,
        options: CallOptions,
    ) -> Result<v1::DeleteSnapshotResponse, Status> {
        self.unary(
            methods::controller::DELETE_SNAPSHOT,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).delete_snapshot(r).await },
        )
        .await
    }

    pub async fn list_snapshots(
        &self,
        request: v1::ListSnapshotsRequest,
        options: CallOptions,
    ) -> Result<v1::ListSnapshotsResponse, Status> {
        self.unary(
            methods::controller::LIST_SNAPSHOTS,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).list_snapshots(r).await },
        )
        .await
    }

    pub async fn group_controller_get_capabilities(
        &self,
        options: CallOptions,
    ) -> Result<v1::GroupControllerGetCapabilitiesResponse, Status> {
        self.unary(
            methods::group_controller::GROUP_CONTROLLER_GET_CAPABILITIES,
            v1::GroupControllerGetCapabilitiesRequest {},
            options,
            |ch, r| async move {
                GroupControllerClient::new(ch)
                    .group_controller_get_capabilities(r)
                    .await
            },
        )
        .await
    }

    pub async fn create_volume_group_snapshot(
        &self,
        request: v1::CreateVolumeGroupSnapshotRequest,
        options: CallOptions,
    ) -> Result<v1::CreateVolumeGroupSnapshotResponse, Status> {
        self.unary(
            methods::group_controller::CREATE_VOLUME_GROUP_SNAPSHOT,
            request,
            options,
            |ch, r| async move {
                GroupControllerClient::new(ch)
                    .create_volume_group_snapshot(r)
                    .await
            },
        )
        .await
    }

    pub async fn delete_volume_group_snapshot(
        &self,
        request: v1::DeleteVolumeGroupSnapshotRequest,
        options: CallOptions,
    ) -> Result<v1::DeleteVolumeGroupSnapshotResponse, Status> {
        self.unary(
            methods::group_controller::DELETE_VOLUME_GROUP_SNAPSHOT,
            request,
            options,
            |ch, r| async move {
                GroupControllerClient::new(ch)
                    .delete_volume_group_snapshot(r)
                    .await
            },
        )
        .await
    }

    pub async fn get_volume_group_snapshot(
        &self,
        request: v1::GetVolumeGroupSnapshotRequest,
        options: CallOptions,
    ) -> Result<v1::GetVolumeGroupSnapshotResponse, Status> {
        self.unary(
            methods::group_controller::GET_VOLUME_GROUP_SNAPSHOT,
            request,
            options,
            |ch, r| async move {
                GroupControllerClient::new(ch)
                    .get_volume_group_snapshot(r)
                    .await
            },
        )
        .await
    }

    pub async fn get_capacity(
        &self,
        request: v1::GetCapacityRequest,
        options: CallOptions,
    ) -> Result<v1::GetCapacityResponse, Status> {
        self.unary(
            methods::controller::GET_CAPACITY,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).get_capacity(r).await },
        )
        .await
    }

    pub async fn controller_expand_volume(
        &self,
        request: v1::ControllerExpandVolumeRequest,
        options: CallOptions,
    ) -> Result<v1::ControllerExpandVolumeResponse, Status> {
        self.unary(
            methods::controller::CONTROLLER_EXPAND_VOLUME,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).controller_expand_volume(r).await },
        )
        .await
    }

    pub async fn controller_modify_volume(
        &self,
        request: v1::ControllerModifyVolumeRequest,
        options: CallOptions,
    ) -> Result<v1::ControllerModifyVolumeResponse, Status> {
        self.unary(
            methods::controller::CONTROLLER_MODIFY_VOLUME,
            request,
            options,
            |ch, r| async move { ControllerClient::new(ch).controller_modify_volume(r).await },
        )
        .await
    }

    pub async fn node_get_capabilities(
        &self,
        options: CallOptions,
    ) -> Result<v1::NodeGetCapabilitiesResponse, Status> {
        self.unary(
            methods::node::NODE_GET_CAPABILITIES,
            v1::NodeGetCapabilitiesRequest {},
            options,
            |ch, r| async move { NodeClient::new(ch).node_get_capabilities(r).await },
        )
        .await
    }

    pub async fn node_get_info(
        &self,
        options: CallOptions,
    ) -> Result<v1::NodeGetInfoResponse, Status> {
        self.unary(
            methods::node::NODE_GET_INFO,
            v1::NodeGetInfoRequest {},
            options,
            |ch, r| async move { NodeClient::new(ch).node_get_info(r).await },
        )
        .await
    }
}

/// Caps a logged text at `max` characters (negative: no cap), saying that it was cut.
fn truncate(text: String, max: i64) -> String {
    let Ok(max) = usize::try_from(max) else {
        return text;
    };
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}[response body too large, log truncated]", &text[..cut]),
        None => text,
    }
}

/// A gRPC error as grpc-go renders it (`rpc error: code = Internal desc = ...`), which
/// upstream's Events, status messages and logs show.
/// The client span of the CSI call `method` about to send `request`, its context in the
/// request's metadata; a disabled span when tracing is off. End it with [`record_code`].
pub fn traced_call<M: prost::Message + prost::Name>(
    method: &'static str,
    endpoint: &Endpoint,
    request: &mut tonic::Request<M>,
) -> tracing::Span {
    if !crate::telemetry::enabled() {
        return tracing::Span::none();
    }
    let parent = tracing::Span::current();
    if !parent.is_none() && !crate::telemetry::sampled(&parent) {
        // The driver is told the trace is not sampled, and nothing else is built.
        crate::telemetry::propagate::inject_metadata(&parent, request.metadata_mut());
        return tracing::Span::none();
    }
    let span = call_span(method, endpoint, request.get_ref());
    crate::telemetry::propagate::inject_metadata(&span, request.metadata_mut());
    span
}

/// Records the gRPC code a traced call ended with.
pub fn record_code(span: &tracing::Span, code: Code) {
    if !span.is_none() {
        span.record("rpc.grpc.status_code", code as i32);
        if code != Code::Ok {
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// The client span of one CSI call: OpenTelemetry's RPC attributes and the handles the request
/// names (never a secret).
fn call_span<M: prost::Message + prost::Name>(
    method: &'static str,
    endpoint: &Endpoint,
    request: &M,
) -> tracing::Span {
    let path = method.trim_start_matches('/');
    let (service, name) = path.split_once('/').unwrap_or(("", path));
    // OpenTelemetry's names for where the call went: the socket's path or the pipe's name,
    // or a TCP address.
    let (address, port, transport) = match endpoint {
        Endpoint::Unix(path) => (path.to_string_lossy(), None, "unix"),
        Endpoint::NamedPipe(name) => (name.as_str().into(), None, "pipe"),
        Endpoint::Tcp(address) => match address.rsplit_once(':') {
            Some((host, port)) => (host.into(), port.parse::<u16>().ok(), "tcp"),
            None => (address.as_str().into(), None, "tcp"),
        },
    };
    let span = tracing::info_span!(
        "csi call",
        otel.name = path,
        otel.kind = "client",
        otel.status_code = Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = name,
        rpc.grpc.status_code = Empty,
        server.address = %address,
        server.port = port,
        network.transport = transport,
    );
    // A call with no operation around it is a root of its own, sampled on its own.
    if crate::telemetry::sampled(&span) {
        crate::telemetry::attribute_work_done();
        for (field, value) in csi_proto::redact::identifiers(request) {
            span.set_attribute(format!("csi.{field}"), value);
        }
    }
    span
}

pub fn go_error(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        crate::process::metrics::code_label(status.code()),
        status.message()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation() {
        assert_eq!(truncate("abcdef".into(), -1), "abcdef");
        assert_eq!(truncate("abcdef".into(), 6), "abcdef");
        assert_eq!(
            truncate("abcdef".into(), 3),
            "abc[response body too large, log truncated]"
        );
        assert_eq!(
            truncate("äöü".into(), 1),
            "ä[response body too large, log truncated]"
        );
    }
}
