//! Sustained write throughput of the in-process API server with 50 open
//! watches: concurrent tasks create and then update ConfigMaps through
//! kube::Client; every watch receives every event. Prints writes/s.
//!
//! `cargo bench -p testkit --bench apiserver [-- SECONDS WRITERS WATCHES]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use testkit::apiserver::{ApiServer, Verb};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .filter(|a| !a.starts_with('-'))
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (seconds, writers, watches) = (arg(1, 5), arg(2, 8), arg(3, 50));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(seconds, writers, watches))
}

async fn run(seconds: u64, writers: u64, watches: u64) -> Result<(), Box<dyn std::error::Error>> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let events = Arc::new(AtomicU64::new(0));
    for _ in 0..watches {
        let req = http::Request::get("/api/v1/namespaces/default/configmaps?watch=1")
            .body(Vec::new().into())?;
        let mut body = client.send(req).await?.into_body();
        let events = events.clone();
        tokio::spawn(async move {
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    events.fetch_add(
                        data.iter().filter(|b| **b == b'\n').count() as u64,
                        Ordering::Relaxed,
                    );
                }
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        tasks.push(tokio::spawn(async move {
            let mut writes = 0u64;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let name = format!("w{w}-{i}");
                let cm: ConfigMap =
                    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"n": "0"}}))
                        .map_err(kube::Error::SerdeError)?;
                let mut created = api.create(&PostParams::default(), &cm).await?;
                created.data = Some([("n".to_string(), "1".to_string())].into());
                api.replace(&name, &PostParams::default(), &created).await?;
                writes += 2;
                i += 1;
            }
            Ok::<u64, kube::Error>(writes)
        }));
    }
    let mut writes = 0;
    for t in tasks {
        writes += t.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Let the watches drain what is already committed.
    let expected = writes * watches;
    let drain_deadline = Instant::now() + Duration::from_secs(30);
    while events.load(Ordering::Relaxed) < expected && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let counters = server.counters();
    println!("writers: {writers}, open watches: {watches}, duration: {elapsed:.2} s");
    println!(
        "writes: {writes} ({} creates, {} updates) -> {:.0} writes/s",
        counters.get(Verb::Create, "configmaps"),
        counters.get(Verb::Update, "configmaps"),
        writes as f64 / elapsed
    );
    println!(
        "watch events delivered: {} of {expected} ({:.0} events/s)",
        events.load(Ordering::Relaxed),
        events.load(Ordering::Relaxed) as f64 / elapsed
    );
    server.shutdown().await;
    Ok(())
}
