//! The client-side rate limit, measured through a real HTTP server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sidecar_kit::cluster::client::Connections;
use sidecar_kit::process::http::{HttpServer, Reply, Routes};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Starts a server that records when each request arrives.
async fn recording_server() -> (String, Arc<Mutex<Vec<Instant>>>, CancellationToken) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let routes = Routes::new().route("/version", move || {
        seen.lock().unwrap().push(Instant::now());
        async {
            Reply::text(
                http::StatusCode::OK,
                r#"{"major":"1","minor":"37","gitVersion":"v1.37.0"}"#,
            )
        }
    });
    let shutdown = CancellationToken::new();
    let addr = HttpServer::spawn("127.0.0.1:0", routes, shutdown.clone())
        .await
        .unwrap();
    (format!("http://{addr}"), arrivals, shutdown)
}

async fn send(client: &kube::Client, count: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..count {
        client.apiserver_version().await.unwrap();
    }
    start.elapsed()
}

#[tokio::test]
async fn qps_and_burst_are_honoured() {
    let (url, arrivals, _shutdown) = recording_server().await;
    let config = kube::Config::new(url.parse().unwrap());
    let client = Connections::new(&config)
        .unwrap()
        .client(&config, 20.0, 5)
        .unwrap();

    let elapsed = send(&client, 25).await;
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 25);
    // 5 at once, then 20 more at 20/s: one second at the least.
    assert!(
        elapsed >= Duration::from_millis(950),
        "25 requests took only {elapsed:?}"
    );
    let burst = arrivals[4].duration_since(arrivals[0]);
    let paced = arrivals[24].duration_since(arrivals[0]);
    assert!(
        burst < Duration::from_millis(400),
        "the burst was paced: {burst:?}"
    );
    // The 20 requests past the burst need 20 tokens at 20/s, earned from the first request on
    // (tokens earned while a slow burst was still going out are spent at once): a second at
    // the least between the first and the last arrival.
    assert!(
        paced >= Duration::from_millis(950),
        "requests after the burst came too fast: {paced:?}"
    );
}

#[tokio::test]
async fn negative_qps_is_unlimited() {
    let (url, arrivals, _shutdown) = recording_server().await;
    let config = kube::Config::new(url.parse().unwrap());
    let connections = Connections::new(&config).unwrap();
    let limited = connections.client(&config, 2.0, 1).unwrap();
    let unlimited = connections.client(&config, -1.0, 1).unwrap();
    // Three requests at 2 QPS with burst 1 need a second; unlimited ones need no waiting at all.
    let slow = send(&limited, 3).await;
    let fast = send(&unlimited, 3).await;
    assert!(slow >= Duration::from_millis(950), "{slow:?}");
    assert!(fast < slow, "unlimited {fast:?} vs limited {slow:?}");
    assert_eq!(arrivals.lock().unwrap().len(), 6);
}

/// As client-go's, a watch takes no token: ten watches at 1 QPS, burst 1, then a read, all
/// answered at once.
#[tokio::test]
async fn watches_take_no_token() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api = testkit::apiserver::ApiServer::start().await.unwrap();
    let config = kube::Config::new(api.url().parse().unwrap());
    let mut config = config;
    config.auth_info.token = Some(testkit::apiserver::ADMIN_TOKEN.to_string().into());
    let client = Connections::new(&config)
        .unwrap()
        .client(&config, 1.0, 1)
        .unwrap();
    let configmaps = kube::Api::<ConfigMap>::namespaced(client, "default");
    let params = kube::api::WatchParams::default();
    let start = Instant::now();
    let mut watches = Vec::new();
    for _ in 0..10 {
        watches.push(configmaps.watch(&params, "0").await.unwrap());
    }
    configmaps.get_opt("absent").await.unwrap();
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_millis(900),
        "ten watches and one read at 1 QPS took {elapsed:?}"
    );
    // The read took the one token: the next one waits for the next.
    let start = Instant::now();
    configmaps.get_opt("absent").await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(800),
        "{:?}",
        start.elapsed()
    );
}
