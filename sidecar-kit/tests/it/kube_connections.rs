//! The connections clients of one process share, counted by a real HTTP server.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sidecar_kit::cluster::client::Connections;
use tokio::net::TcpListener;
use tokio::sync::Barrier;

const VERSION: &str = r#"{"major":"1","minor":"37","gitVersion":"v1.37.0"}"#;

/// Connections the server accepted, and how many of them are still open.
#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    open: AtomicUsize,
}

/// A test server's answers to `/version`: with `together`, each answer but the first waits until
/// that many requests have arrived, so that they are all in flight at once.
#[derive(Clone)]
pub(crate) struct Answers {
    version: &'static str,
    barrier: Option<Arc<Barrier>>,
    answered: Arc<AtomicUsize>,
}

impl Answers {
    pub(crate) fn new(version: &'static str, together: Option<usize>) -> Self {
        Self {
            version,
            barrier: together.map(|n| Arc::new(Barrier::new(n))),
            answered: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The next answer, once it may be given.
    pub(crate) fn answer(
        &self,
    ) -> impl Future<Output = Result<hyper::Response<Full<Bytes>>, Infallible>> + use<> {
        let first = self.answered.fetch_add(1, Ordering::SeqCst) == 0;
        let barrier = self.barrier.clone().filter(|_| !first);
        let version = self.version;
        async move {
            if let Some(barrier) = barrier {
                barrier.wait().await;
            }
            Ok(hyper::Response::new(Full::new(Bytes::from(version))))
        }
    }
}

/// A server answering `/version`; with `together`, each answer but the first waits until that
/// many requests have arrived, so that they are all in flight at once.
async fn counting_server(together: Option<usize>) -> (String, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let counts = Arc::new(Counts::default());
    let answers = Answers::new(VERSION, together);
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.accepted.fetch_add(1, Ordering::SeqCst);
            seen.open.fetch_add(1, Ordering::SeqCst);
            let seen = seen.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_request| answers.answer());
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                seen.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, counts)
}

#[tokio::test]
async fn the_clients_of_one_process_share_their_connections() {
    let (url, counts) = counting_server(None).await;
    let config = kube::Config::new(url.parse().unwrap());
    let connections = Connections::new(&config).unwrap();
    let work = connections.clients(&config, -1.0, 1).unwrap();
    let lease = connections.client(&config, -1.0, 1).unwrap();
    for client in [&work.main, &work.background, &lease, &work.main] {
        client.apiserver_version().await.unwrap();
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 1);

    // Clients built apart each connect on their own.
    let apart = Connections::new(&config)
        .unwrap()
        .client(&config, -1.0, 1)
        .unwrap();
    apart.apiserver_version().await.unwrap();
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn after_a_burst_at_most_25_connections_stay_open() {
    const BURST: usize = 40;
    let (url, counts) = counting_server(Some(BURST)).await;
    let config = kube::Config::new(url.parse().unwrap());
    let client = Connections::new(&config)
        .unwrap()
        .client(&config, -1.0, 1)
        .unwrap();
    // A process's first request goes alone (see `Connections`); the burst follows.
    client.apiserver_version().await.unwrap();
    let requests = (0..BURST).map(|_| {
        let client = client.clone();
        async move { client.apiserver_version().await }
    });
    for answer in futures::future::join_all(requests).await {
        answer.unwrap();
    }
    assert_eq!(counts.accepted.load(Ordering::SeqCst), BURST);
    // The connections beyond the pool's idle limit close once they are returned.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while counts.open.load(Ordering::SeqCst) > 25 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counts.open.load(Ordering::SeqCst), 25);
}

/// A first request that is never answered holds none of the process's other requests back.
#[tokio::test]
async fn an_unanswered_first_request_holds_no_other() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answered = answered.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_request| {
                    let first = answered.fetch_add(1, Ordering::SeqCst) == 0;
                    async move {
                        if first {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(VERSION))))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let config = kube::Config::new(url.parse().unwrap());
    let client = Connections::new(&config)
        .unwrap()
        .client(&config, -1.0, 1)
        .unwrap();
    let hung = tokio::spawn({
        let client = client.clone();
        async move { client.apiserver_version().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = tokio::time::Instant::now();
    client.apiserver_version().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "held {:?}",
        started.elapsed()
    );
    assert!(!hung.is_finished(), "the first is still unanswered");
    hung.abort();
}
