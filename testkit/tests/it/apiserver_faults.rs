//! Fault injection and request counters.

use std::time::{Duration, Instant};

use crate::apiserver_support::{Lines, obj};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Error};
use serde_json::json;
use testkit::apiserver::{ApiError, ApiServer, RequestMatch, Verb};

fn va(name: &str) -> VolumeAttachment {
    obj(
        json!({"metadata": {"name": name}, "spec": {"attacher": "csi.example.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv"}}}),
    )
}

#[tokio::test]
async fn fail_next_requests_with_a_status_body() {
    let server = ApiServer::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.create(&PostParams::default(), &va("a")).await.unwrap();
    vas.create(&PostParams::default(), &va("b")).await.unwrap();
    let faults = server.faults();
    faults.fail_next(
        RequestMatch::new(Verb::Patch, "volumeattachments")
            .subresource("status")
            .name("a"),
        2,
        500,
    );
    let status = Patch::Merge(json!({"status": {"attached": true}}));
    for _ in 0..2 {
        match vas
            .patch_status("a", &PatchParams::default(), &status)
            .await
            .unwrap_err()
        {
            Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (500, "InternalError")),
            e => panic!("{e}"),
        }
    }
    assert_eq!(faults.pending_failures(), 0);
    vas.patch_status("a", &PatchParams::default(), &status)
        .await
        .unwrap();
    faults.fail_next_with(
        RequestMatch::new(Verb::Get, "volumeattachments"),
        1,
        ApiError::from_code(409, "try later"),
    );
    match vas.get("b").await.unwrap_err() {
        Error::Api(s) => assert_eq!((s.code, s.message.as_str()), (409, "try later")),
        e => panic!("{e}"),
    }
    vas.get("b").await.unwrap();
}

#[tokio::test]
async fn latency_delays_matching_requests() {
    let server = ApiServer::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.create(&PostParams::default(), &va("a")).await.unwrap();
    server.faults().add_latency(
        RequestMatch::new(Verb::Get, "volumeattachments").name("a"),
        Duration::from_millis(300),
    );
    let t = Instant::now();
    vas.get("a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    server.faults().clear();
    let t = Instant::now();
    vas.get("a").await.unwrap();
    assert!(t.elapsed() < Duration::from_millis(300));
}

#[tokio::test]
async fn close_watches_of_one_resource() {
    let server = ApiServer::start().await.unwrap();
    let c = server.client();
    let mut vas = Lines::open(&c, "/apis/storage.k8s.io/v1/volumeattachments?watch=1").await;
    let mut pvs = Lines::open(&c, "/api/v1/persistentvolumes?watch=1").await;
    server.faults().close_watches(Some("volumeattachments"));
    assert!(vas.next().await.is_none(), "closed");
    let api: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(c.clone());
    api.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "pv"}, "spec": {"capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d.example.com", "volumeHandle": "h"}}})),
    )
    .await
    .unwrap();
    assert_eq!(
        pvs.next().await.unwrap()["type"],
        "ADDED",
        "other watches stay open"
    );
    server.faults().close_watches(None);
    assert!(pvs.next().await.is_none());
}

#[tokio::test]
async fn counters_count_requests_by_verb_resource_and_subresource() {
    let server = ApiServer::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.create(&PostParams::default(), &va("a")).await.unwrap();
    vas.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["x/y"]}})),
    )
    .await
    .unwrap();
    vas.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"attached": true}})),
    )
    .await
    .unwrap();
    vas.get("a").await.unwrap();
    vas.list(&Default::default()).await.unwrap();
    let c = server.counters();
    assert_eq!(c.get(Verb::Create, "volumeattachments"), 1);
    assert_eq!(c.get(Verb::Patch, "volumeattachments"), 1);
    assert_eq!(
        c.get_subresource(Verb::Patch, "volumeattachments", Some("status")),
        1
    );
    assert_eq!(c.total(Verb::Patch, "volumeattachments"), 2);
    assert_eq!(
        (
            c.get(Verb::Get, "volumeattachments"),
            c.get(Verb::List, "volumeattachments")
        ),
        (1, 1)
    );
    assert_eq!(c.writes(), 3);
    c.reset();
    assert_eq!(c.writes(), 0);
}

#[tokio::test]
async fn too_many_requests_carries_retry_after() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = ApiServer::start().await.unwrap();
    server.faults().fail_next_with(
        RequestMatch::new(Verb::List, "volumeattachments"),
        1,
        ApiError::too_many_requests(3),
    );
    // A raw exchange: the header is what client-go waits on.
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    stream
        .write_all(b"GET /apis/storage.k8s.io/v1/volumeattachments HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("retry-after: 3")),
        "{head}"
    );
    let status: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["details"]["retryAfterSeconds"], 3);
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.list(&Default::default()).await.unwrap();
}

#[tokio::test]
async fn unreachable_cuts_connections_and_watches_until_cleared() {
    let server = ApiServer::start().await.unwrap();
    let c = server.client();
    let mut watch = Lines::open(&c, "/apis/storage.k8s.io/v1/volumeattachments?watch=1").await;
    let vas: Api<VolumeAttachment> = Api::all(c.clone());
    vas.create(&PostParams::default(), &va("before"))
        .await
        .unwrap();
    assert_eq!(watch.next().await.unwrap()["type"], "ADDED");
    let faults = server.faults();
    faults.set_unreachable(true);
    assert!(faults.is_unreachable());
    assert!(watch.next().await.is_none(), "the open watch is cut");
    if let Error::Api(s) = vas.get("before").await.unwrap_err() {
        panic!("an answer while unreachable: {s:?}");
    }
    faults.clear();
    assert!(!faults.is_unreachable());
    vas.get("before").await.unwrap();
}

/// Sends one HTTP/1.1 request on a connection of its own and returns the connection.
async fn send_raw(
    server: &ApiServer,
    method: &str,
    path: &str,
    body: &str,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr(),
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// Whether anything (an answer or the end of the connection) arrives within `wait`.
async fn silent_for(stream: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    tokio::time::timeout(wait, stream.read(&mut byte))
        .await
        .is_err()
}

#[tokio::test]
async fn hung_requests_keep_their_connection_open_and_are_never_answered() {
    use testkit::apiserver::Hang;
    let server = ApiServer::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    let faults = server.faults();
    let creates = RequestMatch::new(Verb::Create, "volumeattachments");
    let body = |name: &str| serde_json::to_string(&va(name)).unwrap();
    let path = "/apis/storage.k8s.io/v1/volumeattachments";

    faults.hang_next(creates.clone(), 1, Hang::BeforeServing);
    let mut before = send_raw(&server, "POST", path, &body("before")).await;
    assert!(silent_for(&mut before, Duration::from_secs(1)).await);
    assert_eq!(faults.pending_hangs(), 0);
    assert!(vas.get_opt("before").await.unwrap().is_none(), "not served");

    faults.hang_next(creates, 1, Hang::AfterServing);
    let mut after = send_raw(&server, "POST", path, &body("after")).await;
    assert!(silent_for(&mut after, Duration::from_secs(1)).await);
    assert!(vas.get_opt("after").await.unwrap().is_some(), "served");
    // Both connections are still open, silent.
    assert!(silent_for(&mut before, Duration::from_millis(100)).await);
    assert!(silent_for(&mut after, Duration::from_millis(100)).await);
    // The hangs were used up: the next create is answered.
    vas.create(&PostParams::default(), &va("next"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_frozen_server_answers_nothing_until_thawed() {
    use tokio::io::AsyncReadExt;
    let server = ApiServer::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.create(&PostParams::default(), &va("a")).await.unwrap();
    let faults = server.faults();
    faults.set_frozen(true);
    // A new connection is accepted, its request read by nobody.
    let mut stream = send_raw(
        &server,
        "GET",
        "/apis/storage.k8s.io/v1/volumeattachments/a",
        "",
    )
    .await;
    assert!(silent_for(&mut stream, Duration::from_secs(1)).await);
    faults.set_frozen(false);
    let mut answer = vec![0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
}

#[tokio::test]
async fn tokens_not_accepted_are_answered_401() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = ApiServer::start().await.unwrap();
    let status_with = |token: Option<&'static str>| {
        let addr = server.addr();
        async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let auth = token
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default();
            let request = format!(
                "GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            answer[9..12].to_string()
        }
    };
    assert_eq!(status_with(None).await, "200", "open by default");
    server.accept_tokens(Some(&["one"]));
    assert_eq!(status_with(None).await, "401");
    assert_eq!(status_with(Some("two")).await, "401");
    assert_eq!(status_with(Some("one")).await, "200");
    assert_eq!(
        status_with(Some(testkit::apiserver::ADMIN_TOKEN)).await,
        "200"
    );
    // The server's own client carries the admin token.
    let vas: Api<VolumeAttachment> = Api::all(server.client());
    vas.list(&Default::default()).await.unwrap();
    server.accept_tokens(Some(&["two"]));
    assert_eq!(status_with(Some("one")).await, "401");
    server.accept_tokens(None);
    assert_eq!(status_with(None).await, "200");
}
