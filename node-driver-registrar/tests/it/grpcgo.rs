//! The registration server in-process on a real unix socket, called as kubelet calls it: by a
//! grpc-go-like client that sends the socket path as `:authority`.
#![cfg(unix)]

use std::path::Path;

use csi_proto::methods::registration::{GET_INFO, NOTIFY_REGISTRATION_STATUS};
use csi_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use node_driver_registrar::server::Server;
use node_driver_registrar::service::{RegistrationService, plugin_info};
use node_driver_registrar::socket::RegistrationListener;
use testkit::grpcgo::{self, Client, Options};
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "hostpath.csi.k8s.io";
const ENDPOINT: &str = "/var/lib/kubelet/plugins/csi-hostpath/csi.sock";

async fn get_info<S>(client: &mut Client<S>) -> PluginInfo
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    client
        .unary(GET_INFO, &InfoRequest {})
        .await
        .expect("GetInfo answers")
}

async fn notify<S>(client: &mut Client<S>, registered: bool, error: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _: RegistrationStatusResponse = client
        .unary(
            NOTIFY_REGISTRATION_STATUS,
            &RegistrationStatus {
                plugin_registered: registered,
                error: error.into(),
            },
        )
        .await
        .expect("NotifyRegistrationStatus answers");
}

fn socket_in(dir: &Path) -> std::path::PathBuf {
    dir.join(format!("{DRIVER}-reg.sock"))
}

#[tokio::test]
async fn answers_a_grpc_go_client_that_sends_the_socket_path_as_authority() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(dir.path());
    let (service, mut rejections) = RegistrationService::new(plugin_info(DRIVER, ENDPOINT));
    let server = Server::new(service);
    let stop = CancellationToken::new();
    let accepting =
        server.spawn_accept_loop(RegistrationListener::bind(&socket).unwrap(), stop.clone());

    let expected = plugin_info(DRIVER, ENDPOINT);
    // As kubelet: header blocks whole, and cut into CONTINUATION frames of 7 bytes.
    for fragment in [16_384, 7] {
        let options = Options {
            fragment,
            timeout: Some(std::time::Duration::from_secs(1)),
            ..Options::kubelet(&socket)
        };
        assert!(options.authority.starts_with('/'));
        let mut client = grpcgo::dial_unix(&socket, options).await.unwrap();
        // Several calls on one connection: the later header blocks are dynamic-table indexes.
        assert_eq!(get_info(&mut client).await, expected);
        notify(&mut client, false, "kubelet says no").await;
        assert_eq!(rejections.recv().await.unwrap().error, "kubelet says no");
        assert_eq!(get_info(&mut client).await, expected);
        notify(&mut client, true, "").await;
        assert_eq!(get_info(&mut client).await, expected);
    }

    // An empty :authority, as some clients send, works as well.
    let options = Options {
        authority: String::new(),
        ..Options::kubelet(&socket)
    };
    let mut client = grpcgo::dial_unix(&socket, options).await.unwrap();
    assert_eq!(get_info(&mut client).await, expected);
    drop(client);

    stop.cancel();
    accepting.await.unwrap().unwrap();
    server.shutdown(std::time::Duration::from_secs(5)).await;
}
