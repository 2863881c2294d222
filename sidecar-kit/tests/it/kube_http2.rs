//! HTTP/2 to the API server, as client-go speaks it: over TLS with ALPN `h2`, every request of
//! the process on one connection; HTTP/1.1 with a server that offers only that; and a
//! connection that stops answering found by its PINGs, closed and replaced.
//!
//! The servers present the test kit's certificate ([`testkit::tls`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http_body_util::{Either, StreamBody};
use hyper::body::Frame;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use sidecar_kit::cluster::client::Connections;
use sidecar_kit::cluster::pool::Timings;

use crate::kube_connections::Answers;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const VERSION: &str = r#"{"major":"1","minor":"34","gitVersion":"v1.34.9"}"#;

/// Connections a server accepted, how many are open, and how many spoke HTTP/2.
#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    open: AtomicUsize,
    h2: AtomicUsize,
}

/// What `/flood` answers: more than hyper's default HTTP/2 windows let a client hold unread
/// on three streams (2 MiB a stream, 5 MiB the connection), less than client-go's (4 MiB).
const FLOOD_BYTES: usize = 3 << 20;
static FLOOD_CHUNK: [u8; 16 * 1024] = [b'x'; 16 * 1024];

/// A list of ConfigMaps of [`TRICKLE_BYTES`] in all, sent in [`TRICKLE_TIME`]: longer than any
/// request may take in total, so it completes only if reads are bounded by their progress.
const TRICKLE_BYTES: usize = 200 << 20;
const TRICKLE_TIME: Duration = Duration::from_secs(45);
const TRICKLE_ITEMS: usize = 2000;

/// The item of the trickled list that is no ConfigMap (a number where a string belongs).
const UNREADABLE_ITEM: usize = 1000;

/// The trickled list: its head, [`TRICKLE_ITEMS`] ConfigMaps of about 100 KiB, its tail, one
/// item every [`TRICKLE_TIME`] / [`TRICKLE_ITEMS`].
fn trickled_list() -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    let value = "v".repeat(TRICKLE_BYTES / TRICKLE_ITEMS - 120);
    let item = move |i: usize| {
        let comma = if i == 0 { "" } else { "," };
        let value = if i == UNREADABLE_ITEM {
            i.to_string()
        } else {
            format!("\"{value}\"")
        };
        Bytes::from(format!(
            r#"{comma}{{"metadata":{{"name":"cm-{i}","namespace":"default"}},"data":{{"value":{value}}}}}"#
        ))
    };
    let head = Bytes::from_static(br#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"7"},"items":["#);
    let pace = TRICKLE_TIME / TRICKLE_ITEMS as u32;
    let items = futures::stream::iter(0..TRICKLE_ITEMS).then(move |i| {
        let item = item(i);
        async move {
            tokio::time::sleep(pace).await;
            item
        }
    });
    futures::stream::once(async move { head })
        .chain(items)
        .chain(futures::stream::once(async { Bytes::from_static(b"]}") }))
        .map(|bytes| Ok(Frame::data(bytes)))
}

/// A TLS server offering `alpn`, answering `/version`, `/flood` ([`FLOOD_BYTES`]), `/hold` (an
/// answer whose body never ends, as a watch's, and so is a watch of ConfigMaps) and the
/// ConfigMaps ([`trickled_list`]); with
/// `together`, each `/version` answer but the first waits until that many requests have
/// arrived, so that they are all in flight at once; with `streams`, its HTTP/2 connections
/// carry at most that many streams each.
async fn tls_server(
    alpn: &[&[u8]],
    together: Option<usize>,
    streams: Option<u32>,
) -> (u16, Arc<Counts>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(testkit::tls::server_config(alpn));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let counts = Arc::new(Counts::default());
    let answers = Answers::new(VERSION, together);
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.accepted.fetch_add(1, Ordering::SeqCst);
            let (acceptor, seen, answers) = (acceptor.clone(), seen.clone(), answers.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                seen.open.fetch_add(1, Ordering::SeqCst);
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let answers = answers.clone();
                    async move {
                        let watch = request.uri().query().is_some_and(|q| q.contains("watch="));
                        let body: BoxStream<'static, Result<Frame<Bytes>, Infallible>> =
                            match request.uri().path() {
                                "/flood" => {
                                    let frames = (0..FLOOD_BYTES / FLOOD_CHUNK.len())
                                        .map(|_| Ok(Frame::data(Bytes::from_static(&FLOOD_CHUNK))));
                                    futures::stream::iter(frames).boxed()
                                }
                                "/hold" => futures::stream::pending().boxed(),
                                "/api/v1/configmaps" if watch => futures::stream::pending().boxed(),
                                "/api/v1/configmaps" => trickled_list().boxed(),
                                _ => {
                                    return answers.answer().await.map(|r| r.map(Either::Left));
                                }
                            };
                        Ok(hyper::Response::new(Either::Right(StreamBody::new(body))))
                    }
                });
                let io = TokioIo::new(stream);
                if h2 {
                    seen.h2.fetch_add(1, Ordering::SeqCst);
                    let _ = http2::Builder::new(TokioExecutor::new())
                        .max_concurrent_streams(streams)
                        .serve_connection(io, service)
                        .await;
                } else {
                    let _ = http1::Builder::new().serve_connection(io, service).await;
                }
                seen.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (port, counts)
}

/// The configuration of a server on `port` with the tests' certificate.
fn config(port: u16) -> kube::Config {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
    config.root_cert = Some(vec![
        CertificateDer::from_pem_slice(testkit::tls::CA)
            .unwrap()
            .to_vec(),
    ]);
    config.tls_server_name = Some("apiserver.test".into());
    config
}

/// `count` requests at once through the clients of one process.
async fn at_once(connections: &Connections, config: &kube::Config, count: usize) {
    let work = connections.clients(config, -1.0, 1).unwrap();
    let lease = connections.client(config, -1.0, 1).unwrap();
    let clients = [work.main, work.background, lease];
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..count {
        let client = clients[i % clients.len()].clone();
        requests.spawn(async move { client.apiserver_version().await });
    }
    while let Some(answer) = requests.join_next().await {
        answer.unwrap().unwrap();
    }
}

/// Waits until `count` connections are open.
async fn open(counts: &Counts, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while counts.open.load(Ordering::SeqCst) != count {
        assert!(
            Instant::now() < deadline,
            "{} connections open, not {count}",
            counts.open.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_request_of_a_process_shares_one_http2_connection() {
    let (port, counts) = tls_server(&[b"h2", b"http/1.1"], None, None).await;
    let config = config(port);
    let connections = Connections::new(&config).unwrap();
    // Eight at once from the start: the first dials, the others wait for its answer and then
    // share its connection (the protocol is known only once TLS has picked it).
    at_once(&connections, &config, 8).await;
    at_once(&connections, &config, 8).await;
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 1, "one connection");
    open(&counts, 1).await;
    assert_eq!(counts.h2.load(Ordering::SeqCst), 1, "spoken in HTTP/2");
}

#[tokio::test]
async fn requests_in_flight_at_once_are_streams_of_one_connection() {
    let (port, counts) = tls_server(&[b"h2", b"http/1.1"], Some(8), None).await;
    let config = config(port);
    let connections = Connections::new(&config).unwrap();
    at_once(&connections, &config, 1).await;
    // Each answer waits until all eight have arrived: they are in flight together.
    at_once(&connections, &config, 8).await;
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_server_without_http2_gets_http1() {
    let (port, counts) = tls_server(&[b"http/1.1"], Some(8), None).await;
    let config = config(port);
    let connections = Connections::new(&config).unwrap();
    at_once(&connections, &config, 1).await;
    at_once(&connections, &config, 8).await;
    // HTTP/1.1 carries one request at a time: eight in flight need eight connections.
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 8);
    open(&counts, 8).await;
    assert_eq!(counts.h2.load(Ordering::SeqCst), 0);
}

/// A TCP proxy to `port` whose connections can be frozen (nothing forwarded either way, the
/// sockets left open, as when the path to the server is black-holed); connections made after
/// a freeze are forwarded.
async fn freezable_proxy(port: u16) -> (u16, Arc<Notify>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    let freeze = Arc::new(Notify::new());
    let accepted = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(Mutex::new(Vec::new()));
    let (f, a) = (freeze.clone(), accepted.clone());
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let (freeze, held) = (f.clone(), held.clone());
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)).await else {
                    return;
                };
                let frozen = freeze.notified();
                tokio::pin!(frozen);
                frozen.as_mut().enable();
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = frozen => held.lock().unwrap().push((client, server)),
                }
            });
        }
    });
    (proxy_port, freeze, accepted)
}

#[tokio::test]
async fn a_connection_that_stops_answering_is_replaced_after_its_pings_fail() {
    let (port, counts) = tls_server(&[b"h2", b"http/1.1"], None, None).await;
    let (proxy, freeze, through) = freezable_proxy(port).await;
    let config = config(proxy);
    let timings = Timings {
        ping_interval: Duration::from_millis(200),
        ping_timeout: Duration::from_millis(300),
        ..Timings::default()
    };
    let connections = Connections::with_timings(&config, timings).unwrap();
    let client = connections.client(&config, -1.0, 1).unwrap();
    client.apiserver_version().await.unwrap();
    assert_eq!(through.load(Ordering::SeqCst), 1);

    freeze.notify_waiters();
    // The request on the frozen connection fails when its PING goes unanswered, well before
    // the request's own 30 s limit; the next one gets a new connection.
    let started = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
            Ok(Ok(_)) => break,
            Ok(Err(_)) => {}
            Err(_) => panic!("a request hung on the frozen connection"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never recovered"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "recovered only after {:?}",
        started.elapsed()
    );
    assert_eq!(through.load(Ordering::SeqCst), 2, "a new connection");
    assert_eq!(counts.h2.load(Ordering::SeqCst), 2);
}

/// Three watches whose events the process has not read yet (a slow consumer) hold their
/// streams' data; with client-go's windows the other requests on the one connection, a Lease
/// renewal among them, still go through. With hyper's defaults the three took the whole
/// connection window and every other answer waited.
#[tokio::test]
async fn streams_not_read_do_not_stall_the_other_requests_of_the_connection() {
    let (port, counts) = tls_server(&[b"h2"], None, None).await;
    let config = config(port);
    let connections = Connections::new(&config).unwrap();
    let client = connections.client(&config, -1.0, 1).unwrap();
    client.apiserver_version().await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(ask(&client, "/flood").await);
    }
    let renewal = connections.client(&config, -1.0, 1).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), renewal.apiserver_version()).await;
    assert!(
        matches!(answer, Ok(Ok(_))),
        "a request behind three unread streams: {answer:?}"
    );
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 1, "one connection");
    // The held streams are read to their end: nothing was lost while they waited.
    for response in held {
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap();
        assert_eq!(body.to_bytes().len(), FLOOD_BYTES);
    }
}

/// `path` asked on `client`: the answer's head (its body left unread).
async fn ask(client: &kube::Client, path: &str) -> http::Response<kube::client::Body> {
    let request = http::Request::get(path)
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    client.send(request).await.unwrap()
}

/// kube-apiserver caps the streams of a connection (100); a process with more requests in
/// flight than that, watches among them, opens another connection instead of queueing
/// renewals behind its watches, and closes it once the load is gone.
#[tokio::test]
async fn a_server_that_caps_its_streams_gets_more_connections_which_close_when_the_load_ends() {
    let (port, counts) = tls_server(&[b"h2"], None, Some(10)).await;
    let config = config(port);
    let timings = Timings {
        idle: Duration::from_millis(300),
        ..Timings::default()
    };
    let connections = Connections::with_timings(&config, timings).unwrap();
    let client = connections.client(&config, -1.0, 1).unwrap();
    client.apiserver_version().await.unwrap();
    // Forty watches, ten a connection: four connections, full.
    let mut watches = Vec::new();
    for _ in 0..40 {
        let watch = tokio::time::timeout(Duration::from_secs(10), ask(&client, "/hold"));
        watches.push(watch.await.expect("a watch queued behind the others"));
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 4);
    // A renewal and other requests still go through at once, on a fifth connection.
    let renewal = connections.client(&config, -1.0, 1).unwrap();
    for _ in 0..5 {
        let answer =
            tokio::time::timeout(Duration::from_secs(5), renewal.apiserver_version()).await;
        assert!(matches!(answer, Ok(Ok(_))), "{answer:?}");
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 5);
    open(&counts, 5).await;
    // The load ends but for five watches of the first connection: the others close once idle.
    watches.truncate(5);
    open(&counts, 1).await;
    // What is still open is the connection of the watches left, which has room again.
    client.apiserver_version().await.unwrap();
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 5);
    drop(watches);
}

/// A list from the watch cache comes whole in one answer: 200 MB sent over 45 s take longer
/// than any request may in total, and still complete, since they keep moving. Its objects reach
/// the watch's subscriber as they arrive, but for one that is no ConfigMap, which is left out
/// rather than failing the list.
#[tokio::test]
async fn a_large_list_trickled_over_45_seconds_syncs_without_its_unreadable_object() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use sidecar_kit::pipeline::{Change, Pipeline};
    let (port, _) = tls_server(&[b"h2"], None, None).await;
    let config = config(port);
    let connections = Connections::new(&config).unwrap();
    let client = connections.client(&config, -1.0, 1).unwrap();
    let names = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut pipeline = Pipeline::new();
    let listed = names.clone();
    pipeline.watch(
        kube::Api::<ConfigMap>::all(client),
        kube::runtime::watcher::Config::default(),
        move |change| {
            if let Change::Listed(o) = change {
                listed
                    .lock()
                    .unwrap()
                    .push(o.metadata.name.clone().unwrap_or_default());
            }
        },
    );
    let started = Instant::now();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let synced = tokio::time::timeout(TRICKLE_TIME * 3, pipeline.wait_synced(&shutdown)).await;
    assert_eq!(synced, Ok(true), "synced");
    assert!(started.elapsed() >= TRICKLE_TIME, "{:?}", started.elapsed());
    let names = names.lock().unwrap().clone();
    assert_eq!(names.len(), TRICKLE_ITEMS - 1);
    assert!(!names.contains(&format!("cm-{UNREADABLE_ITEM}")));
    assert_eq!(names.last().map(String::as_str), Some("cm-1999"));
    pipeline.stop().await;
}

/// The test kit's API server over HTTPS caps the streams of a connection as kube-apiserver
/// does: 150 watches and a read beside them all go through.
#[tokio::test]
async fn more_watches_than_the_test_kits_api_server_allows_a_connection_all_go_through() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::WatchParams;
    let api = testkit::apiserver::ApiServer::start_with(testkit::apiserver::Options {
        tls: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(api.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.scheme_str(), Some("https"));
    let connections = Connections::new(&config).unwrap();
    let client = connections.client(&config, -1.0, 1).unwrap();
    let configmaps = kube::Api::<ConfigMap>::namespaced(client.clone(), "default");
    let limit = testkit::apiserver::MAX_STREAMS as usize;
    let params = WatchParams::default();
    let mut watches = Vec::new();
    for _ in 0..limit + 50 {
        let watch = tokio::time::timeout(Duration::from_secs(10), configmaps.watch(&params, "0"));
        watches.push(
            watch
                .await
                .expect("a watch queued behind the others")
                .unwrap(),
        );
    }
    let everything = Default::default();
    let read = tokio::time::timeout(Duration::from_secs(10), configmaps.list(&everything));
    assert!(matches!(read.await, Ok(Ok(_))));
    drop(watches);
}
