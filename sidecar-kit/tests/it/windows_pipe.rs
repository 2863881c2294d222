//! Windows: CSI endpoints over named pipes, against the mock driver serving a real pipe.
#![cfg(windows)]

use std::time::Duration;

use sidecar_kit::driver::connection::{ConnectOptions, LossPolicy, connect};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::driver::identity;
use sidecar_kit::process::metrics::CsiMetrics;
use testkit::mockdriver::MockDriver;

fn pipe_name(tag: &str) -> String {
    format!(r"\\.\pipe\csi-sidecars-test-{tag}-{}", std::process::id())
}

fn options() -> ConnectOptions {
    ConnectOptions {
        dial_timeout: Some(Duration::from_secs(10)),
        policy: LossPolicy::Reconnect,
    }
}

#[tokio::test]
async fn identity_and_probe_over_a_named_pipe() {
    let name = pipe_name("identity");
    let driver = MockDriver::builder()
        .driver_name("pipe.csi.example.com")
        .serve_named_pipe(&name)
        .await
        .unwrap();
    for address in [name.clone(), name.replace(r"\\.\pipe\", "npipe://./pipe/")] {
        let connection = connect(&address, options()).await.unwrap();
        let client = CsiClient::new(connection, CsiMetrics::new().unwrap());
        assert_eq!(
            identity::driver_name(&client, Some(Duration::from_secs(5)))
                .await
                .unwrap(),
            "pipe.csi.example.com"
        );
        client
            .probe(CallOptions::timeout(Duration::from_secs(5)))
            .await
            .unwrap();
    }
    driver.faults().set_ready(false);
    let connection = connect(&name, options()).await.unwrap();
    let client = CsiClient::new(connection, CsiMetrics::new().unwrap());
    let response = client
        .probe(CallOptions::timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(response.ready, Some(false));
}

#[tokio::test]
async fn dial_waits_for_a_pipe_that_appears_late() {
    let name = pipe_name("late");
    let pending = tokio::spawn({
        let name = name.clone();
        async move { connect(&name, options()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _driver = MockDriver::builder()
        .driver_name("late.csi.example.com")
        .serve_named_pipe(&name)
        .await
        .unwrap();
    let connection = pending.await.unwrap().unwrap();
    let client = CsiClient::new(connection, CsiMetrics::new().unwrap());
    assert_eq!(
        identity::driver_name(&client, None).await.unwrap(),
        "late.csi.example.com"
    );
}

#[tokio::test]
async fn unix_socket_paths_are_windows_paths_here() {
    // Wine has no AF_UNIX: only the address handling is checked here.
    let endpoint = sidecar_kit::driver::endpoint::parse(r"unix://C:\\csi\\csi.sock").unwrap();
    assert_eq!(
        endpoint,
        sidecar_kit::driver::endpoint::Endpoint::Unix(r"C:\csi\csi.sock".into())
    );
}
