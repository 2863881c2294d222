//! Helpers shared by the integration tests: a minimal HTTP client and mock driver set-up.

use std::net::SocketAddr;
#[cfg(unix)]
use std::time::Duration;

use livenessprobe::flags::Cli;
use sidecar_kit::process::flags::{FlagSyntax, parse_from};
use testkit::mockdriver::{MockDriver, MockHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const DRIVER: &str = "hostpath.csi.k8s.io";

/// An HTTP answer: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// `GET path` over a fresh connection, as the kubelet does.
pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to livenessprobe");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status code");
    Answer {
        status,
        body: body.to_string(),
    }
}

/// The localhost address of a server bound to all interfaces.
#[cfg(unix)]
pub fn local(addr: SocketAddr) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], addr.port()))
}

/// Parses a livenessprobe command line.
pub fn cli(args: &[&str]) -> Cli {
    parse_from(
        std::iter::once("livenessprobe").chain(args.iter().copied()),
        FlagSyntax::Go,
    )
    .expect("valid flags")
}

/// A mock driver named [`DRIVER`] at `path`.
#[cfg(unix)]
pub async fn mock_at(path: &std::path::Path) -> MockHandle {
    MockDriver::builder()
        .driver_name(DRIVER)
        .serve_unix(path)
        .await
        .expect("serve mock driver")
}

/// A mock driver named [`DRIVER`] on the named pipe `name`.
#[cfg(windows)]
pub async fn mock_on_pipe(name: &str) -> MockHandle {
    MockDriver::builder()
        .driver_name(DRIVER)
        .serve_named_pipe(name)
        .await
        .expect("serve mock driver")
}

/// Polls `check` until it holds, failing after `limit`.
#[cfg(unix)]
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
