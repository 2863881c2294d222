//! Windows: the livenessprobe against the mock driver on a named pipe.
#![cfg(windows)]

use std::time::{Duration, Instant};

use crate::common::{Answer, cli, get, mock_on_pipe};
use csi_proto::methods::identity::PROBE;
use livenessprobe::probe::NOT_READY;
use livenessprobe::server::{self, Running};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::Code;

fn pipe_name(tag: &str) -> String {
    format!(r"\\.\pipe\livenessprobe-test-{tag}-{}", std::process::id())
}

async fn start(pipe: &str, extra: &[&str]) -> (Running, CancellationToken) {
    let address = format!("--csi-address={pipe}");
    let mut args = vec![address.as_str(), "--http-endpoint=127.0.0.1:0"];
    args.extend_from_slice(extra);
    let shutdown = CancellationToken::new();
    let running = server::start(&cli(&args), &shutdown)
        .await
        .expect("livenessprobe starts")
        .expect("not cancelled");
    (running, shutdown)
}

fn ok() -> Answer {
    Answer {
        status: 200,
        body: "ok".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_over_a_named_pipe() {
    let pipe = pipe_name("healthz");
    let mock = mock_on_pipe(&pipe).await;
    let (running, shutdown) = start(&pipe, &["--probe-timeout=500ms"]).await;
    let healthz = || get(running.health_address, "/healthz");
    assert_eq!(healthz().await, ok());

    mock.faults().set_ready(false);
    assert_eq!(
        healthz().await,
        Answer {
            status: 500,
            body: NOT_READY.into()
        }
    );
    mock.faults().set_ready(true);

    mock.faults().fail_always(PROBE, Code::Internal, "sick");
    assert_eq!(
        healthz().await,
        Answer {
            status: 500,
            body: "rpc error: code = Internal desc = sick".into()
        }
    );
    mock.faults().clear_failures(PROBE);

    mock.faults().hang(PROBE);
    let started = Instant::now();
    let hung = healthz().await;
    assert_eq!(hung.status, 500);
    assert!(hung.body.contains("DeadlineExceeded"), "{}", hung.body);
    assert!(started.elapsed() < Duration::from_secs(3));
    mock.faults().release(PROBE);

    let mut checks = JoinSet::new();
    for _ in 0..20 {
        checks.spawn(get(running.health_address, "/healthz"));
    }
    while let Some(answer) = checks.join_next().await {
        assert_eq!(answer.unwrap(), ok());
    }
    // A pipe has no file to watch: the one connection served every check.
    assert_eq!(running.prober.dials(), 1);
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_pipe_driver_is_redialed() {
    let pipe = pipe_name("restart");
    let first = mock_on_pipe(&pipe).await;
    let (running, shutdown) = start(&pipe, &["--probe-timeout=1s"]).await;
    assert_eq!(get(running.health_address, "/healthz").await, ok());
    first.shutdown().await.unwrap();
    assert_eq!(get(running.health_address, "/healthz").await.status, 500);

    let second = mock_on_pipe(&pipe).await;
    assert_eq!(get(running.health_address, "/healthz").await, ok());
    assert_eq!(second.calls().count(PROBE), 1);
    shutdown.cancel();
}
