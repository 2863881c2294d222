//! Serving: persistence across restarts, existing listeners, socket
//! cleanup, and state changed behind the clients' back.

// Unix sockets and signals; Windows serves named pipes instead.
#![cfg(unix)]

use crate::mockdriver_common::*;
use csi_proto::v1;
use testkit::mockdriver::{MockDriver, MockError};

#[tokio::test]
async fn state_file_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    let socket = socket_in(&dir);

    let mock = MockDriver::builder()
        .state_file(&state_file)
        .serve_unix(&socket)
        .await
        .unwrap();
    let mut clients = Clients::new(&socket).await;
    let volume = clients
        .controller
        .create_volume(create_request("pvc-kept", 1 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    clients
        .controller
        .controller_publish_volume(publish_request(&volume.volume_id, "node-1"))
        .await
        .unwrap();
    let before = mock.state();
    mock.shutdown().await.unwrap();
    assert!(!socket.exists(), "socket removed on shutdown");
    assert!(state_file.exists());

    let restarted = MockDriver::builder()
        .state_file(&state_file)
        .serve_unix(&socket)
        .await
        .unwrap();
    assert_eq!(restarted.state(), before);
    let mut clients = Clients::new(&socket).await;
    // Same name, same answer: the restarted mock remembers the volume.
    let again = clients
        .controller
        .create_volume(create_request("pvc-kept", 1 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again, volume);
    let listed = clients
        .controller
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.entries[0]
            .status
            .as_ref()
            .unwrap()
            .published_node_ids,
        ["node-1"]
    );
    // New ids do not collide with the remembered ones.
    let second = clients
        .controller
        .create_volume(create_request("pvc-new", 1 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_ne!(second.volume_id, volume.volume_id);
}

#[tokio::test]
async fn serves_an_existing_listener_and_removes_its_socket_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let mock = MockDriver::builder()
        .driver_name("listener.csi.example.com")
        .serve_listener(listener)
        .await
        .unwrap();
    assert_eq!(mock.socket_path(), socket);
    assert_eq!(mock.endpoint(), format!("unix://{}", socket.display()));
    let mut clients = Clients::new(&socket).await;
    let info = clients
        .identity
        .get_plugin_info(v1::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "listener.csi.example.com");
    drop(mock);
    assert!(!socket.exists());
}

#[tokio::test]
async fn replaces_a_stale_socket_but_not_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    // A socket left behind by a process that died.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let mock = MockDriver::builder().serve_unix(&socket).await.unwrap();
    Clients::new(&socket)
        .await
        .identity
        .probe(v1::ProbeRequest {})
        .await
        .unwrap();
    mock.shutdown().await.unwrap();

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"data").unwrap();
    let refused = MockDriver::builder().serve_unix(&file).await;
    assert!(matches!(refused, Err(MockError::NotASocket(_))));
    assert!(file.exists());
}

#[tokio::test]
async fn corrupt_state_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("state.json");
    std::fs::write(&state_file, b"[1, 2").unwrap();
    let refused = MockDriver::builder()
        .state_file(&state_file)
        .serve_unix(socket_in(&dir))
        .await;
    assert!(matches!(refused, Err(MockError::State(_))));
}

#[tokio::test]
async fn state_changed_out_of_band_is_seen_by_clients() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let c = &mut clients.controller;
    let id = c
        .create_volume(create_request("pvc", 1))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    c.controller_publish_volume(publish_request(&id, "n1"))
        .await
        .unwrap();
    // E.g. an administrator detaching the volume behind the attacher.
    mock.update_state(|s| s.volumes.get_mut(&id).unwrap().published.clear())
        .unwrap();
    let listed = c
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.entries[0]
            .status
            .as_ref()
            .unwrap()
            .published_node_ids
            .is_empty()
    );
}
