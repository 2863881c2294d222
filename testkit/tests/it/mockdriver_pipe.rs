//! Windows: the mock serving a real named pipe, reached by several clients
//! in turn, and freeing the name when it stops.
#![cfg(windows)]

use std::time::Duration;

use csi_proto::methods::identity::PROBE;
use csi_proto::v1;
use csi_proto::v1::identity_client::IdentityClient;
use hyper_util::rt::TokioIo;
use testkit::mockdriver::MockDriver;
use tokio::net::windows::named_pipe::ClientOptions;
use tonic::transport::{Channel, Endpoint, Uri};

/// `ERROR_PIPE_BUSY`: all instances are taken; the server offers another.
const ERROR_PIPE_BUSY: i32 = 231;

fn pipe_name(tag: &str) -> String {
    format!(r"\\.\pipe\mockdriver-test-{tag}-{}", std::process::id())
}

async fn connect(name: &str) -> Channel {
    let name = name.to_owned();
    Endpoint::try_from("http://[::1]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let name = name.clone();
            async move {
                loop {
                    match ClientOptions::new().open(&name) {
                        Ok(client) => return Ok::<_, std::io::Error>(TokioIo::new(client)),
                        Err(err) if err.raw_os_error() == Some(ERROR_PIPE_BUSY) => {}
                        Err(err) => return Err(err),
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }))
        .await
        .unwrap()
}

#[tokio::test]
async fn serves_a_named_pipe() {
    let name = pipe_name("serve");
    let mock = MockDriver::builder()
        .driver_name("pipe.csi.example.com")
        .serve_named_pipe(&name)
        .await
        .unwrap();
    assert_eq!(mock.endpoint(), name);
    // Each client takes a pipe instance; the mock keeps offering new ones.
    for _ in 0..3 {
        let mut identity = IdentityClient::new(connect(&name).await);
        let info = identity
            .get_plugin_info(v1::GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, "pipe.csi.example.com");
        identity.probe(v1::ProbeRequest {}).await.unwrap();
    }
    assert_eq!(mock.calls().count(PROBE), 3);
    tokio::time::timeout(Duration::from_secs(10), mock.shutdown())
        .await
        .unwrap()
        .unwrap();

    // The name is free again for a restarted mock.
    let restarted = MockDriver::builder().serve_named_pipe(&name).await.unwrap();
    let mut identity = IdentityClient::new(connect(&name).await);
    identity.probe(v1::ProbeRequest {}).await.unwrap();
    restarted.shutdown().await.unwrap();
}
