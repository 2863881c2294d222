//! TLS, health and shutdown: a certificate rotated under a stream in flight, the gRPC and HTTP
//! health checks, the start-up refusals, SIGTERM.

use std::time::Duration;

use testkit::measure::http_get;

use crate::common::*;

#[tokio::test]
async fn a_rotated_certificate_serves_new_connections_and_drops_no_stream() {
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        ..Start::default()
    })
    .await;
    // Enough messages that the stream waits on the client's reading. Each holds 64 blocks, so
    // its DATA frame is not one of the small frames a client's HTTP/2 stack limits while it
    // does not read (h2 answers a flood of them with GOAWAY ENHANCE_YOUR_CALM).
    let blocks: i64 = 1 << 20;
    let volume = env.volume("big", blocks * BLOCK).await;
    env.mock.fill(&volume).unwrap();
    let handle = env.cut("snap-big", &volume).await;
    env.snapshot("big", &handle, DRIVER, None).await;

    let (mut client, first) = connect(env.port, env.authority.ca_der()).await;
    let mut request = env.allocated("big");
    request.max_results = 64;
    let mut stream = client
        .get_metadata_allocated(request)
        .await
        .unwrap()
        .into_inner();
    let mut seen = 0i64;
    for _ in 0..10 {
        seen += stream
            .message()
            .await
            .unwrap()
            .unwrap()
            .block_metadata
            .len() as i64;
    }
    let before = first.lock().unwrap().clone();

    install(env.certs.path(), &env.authority.server("second"));
    eventually("a new connection to get the new certificate", || async {
        let (_, presented) = connect(env.port, env.authority.ca_der()).await;
        let chain = presented.lock().unwrap().clone();
        (!chain.is_empty() && chain != before).then_some(())
    })
    .await;

    while let Some(message) = stream.message().await.unwrap() {
        seen += message.block_metadata.len() as i64;
    }
    assert_eq!(
        seen, blocks,
        "the stream begun before the rotation completed"
    );
}

#[tokio::test]
async fn health_is_served_on_both_ports_and_sigterm_ends_the_process_cleanly() {
    let mut env = Env::start(Start {
        audience: Some(AUDIENCE),
        ..Start::default()
    })
    .await;
    assert_eq!(
        http_get(env.http_port, "/health").await,
        Some((200, "ok".to_string()))
    );
    let mut health = tonic_health::pb::health_client::HealthClient::new(env.channel().await);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let pid = env.sidecar.id().unwrap() as i32;
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::time::timeout(WAIT, env.sidecar.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn no_certificate_or_a_driver_without_the_service_is_refused_at_start() {
    let (code, _, stderr) = testkit::process::run_to_exit(
        BIN,
        &["--csi-address=/nonexistent.sock", "--tls-key=k"],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(code, 1);
    assert!(stderr.contains("missing TLSCertFile"), "{stderr}");

    let cluster = testkit::apiserver::ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plain = testkit::mockdriver::MockDriver::builder()
        .snapshot_metadata(false)
        .driver_name(DRIVER)
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let authority = Authority::new();
    install(dir.path(), &authority.server("x"));
    let (code, _, stderr) = testkit::process::run_to_exit(
        BIN,
        &[
            &format!("--csi-address={}", plain.endpoint()),
            &format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            &format!("--tls-cert={}", dir.path().join("tls.crt").display()),
            &format!("--tls-key={}", dir.path().join("tls.key").display()),
            "--port=0",
        ],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("port 0") || stderr.contains("--port"),
        "{stderr}"
    );
    let free = testkit::measure::free_port().unwrap();
    let (code, _, stderr) = testkit::process::run_to_exit(
        BIN,
        &[
            &format!("--csi-address={}", plain.endpoint()),
            &format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            &format!("--tls-cert={}", dir.path().join("tls.crt").display()),
            &format!("--tls-key={}", dir.path().join("tls.key").display()),
            &format!("--port={free}"),
            "--http-endpoint=127.0.0.1:0",
        ],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("does not support the SNAPSHOT_METADATA_SERVICE"),
        "{stderr}"
    );
}
