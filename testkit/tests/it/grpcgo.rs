//! The mock CSI driver called by a grpc-go-like client with a path as `:authority`, and the
//! same client against a bare h2 server, which shows what the adapter is for.
#![cfg(unix)]

use std::convert::Infallible;
use std::time::Duration;

use csi_proto::methods::identity::{GET_PLUGIN_INFO, PROBE};
use csi_proto::methods::node::NODE_GET_INFO;
use csi_proto::v1::{
    GetPluginInfoRequest, GetPluginInfoResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    ProbeRequest, ProbeResponse,
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use testkit::grpcgo::{self, GrpcGoError, Options};
use testkit::mockdriver::MockDriver;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn mock_driver_answers_a_client_that_sends_a_path_authority() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let driver = MockDriver::builder()
        .driver_name("grpcgo.csi.example.com")
        .node_id("node-7")
        .serve_unix(&socket)
        .await
        .unwrap();
    for authority in [socket.display().to_string(), String::new()] {
        let options = Options {
            authority,
            fragment: 5,
            ..Options::kubelet(&socket)
        };
        let mut client = grpcgo::dial_unix(&socket, options).await.unwrap();
        let info: GetPluginInfoResponse = grpcgo::with_timeout(
            WAIT,
            client.unary(GET_PLUGIN_INFO, &GetPluginInfoRequest {}),
        )
        .await
        .unwrap();
        assert_eq!(info.name, "grpcgo.csi.example.com");
        let node: NodeGetInfoResponse =
            grpcgo::with_timeout(WAIT, client.unary(NODE_GET_INFO, &NodeGetInfoRequest {}))
                .await
                .unwrap();
        assert_eq!(node.node_id, "node-7");
        let _: ProbeResponse = grpcgo::with_timeout(WAIT, client.unary(PROBE, &ProbeRequest {}))
            .await
            .unwrap();
    }
    assert_eq!(driver.calls().count(GET_PLUGIN_INFO), 2);
    driver.shutdown().await.unwrap();
}

/// Serves each connection on `socket` with hyper's HTTP/2 and a handler that answers 200,
/// through the adapter or not.
async fn bare_h2_server(socket: &std::path::Path, adapter: bool) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|_request| async {
                Ok::<_, Infallible>(hyper::Response::new(
                    http_body_util::Empty::<bytes::Bytes>::new(),
                ))
            });
            let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            tokio::spawn(async move {
                let _ = if adapter {
                    builder
                        .serve_connection(
                            TokioIo::new(h2_authority::AuthorityFix::new(stream)),
                            service,
                        )
                        .await
                } else {
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                };
            });
        }
    })
}

#[tokio::test]
async fn h2_alone_resets_a_path_authority_and_the_adapter_fixes_it() {
    let dir = tempfile::tempdir().unwrap();
    for adapter in [false, true] {
        let socket = dir.path().join(format!("h2-{adapter}.sock"));
        let server = bare_h2_server(&socket, adapter).await;
        let mut client = grpcgo::dial_unix(&socket, Options::kubelet(&socket))
            .await
            .unwrap();
        let answer = grpcgo::with_timeout(WAIT, client.call("/x.Y/Z", b"")).await;
        if adapter {
            let response = answer.unwrap();
            assert!(
                response
                    .trailers
                    .iter()
                    .any(|h| h.name == b":status" && h.value == b"200")
            );
        } else {
            // PROTOCOL_ERROR: what kubelet got from a registrar without the adapter.
            assert!(matches!(answer, Err(GrpcGoError::Reset(0x1))), "{answer:?}");
        }
        server.abort();
    }
}
