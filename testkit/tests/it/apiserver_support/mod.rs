//! Helpers shared by the API server tests: raw HTTP through a kube client,
//! reading watch streams line by line, and bounded waiting.

use std::future::Future;
use std::time::Duration;

use http_body_util::BodyExt;
use kube::Client;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Sends a raw request; returns the status code and the JSON body (Null if not JSON).
pub async fn raw(
    client: &Client,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, Value) {
    raw_accept(client, method, uri, content_type, None, body).await
}

pub async fn raw_accept(
    client: &Client,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    accept: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let resp = client
        .send(req.body(body.as_bytes().to_vec().into()).unwrap())
        .await
        .unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// An open watch (or any streaming response) read as JSON lines.
pub struct Lines {
    body: kube::client::Body,
    buf: Vec<u8>,
    pub status: u16,
}

impl Lines {
    pub async fn open(client: &Client, uri: &str) -> Self {
        Self::open_accept(client, uri, None).await
    }

    pub async fn open_accept(client: &Client, uri: &str, accept: Option<&str>) -> Self {
        let mut req = http::Request::builder().method("GET").uri(uri);
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = client
            .send(req.body(Vec::new().into()).unwrap())
            .await
            .unwrap();
        Self {
            status: resp.status().as_u16(),
            body: resp.into_body(),
            buf: Vec::new(),
        }
    }

    /// The next line, or None when the stream ends. Panics after [`TIMEOUT`].
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let frame = tokio::time::timeout(TIMEOUT, self.body.frame())
                .await
                .expect("watch stalled");
            match frame {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                _ => {
                    if self.buf.is_empty() {
                        return None;
                    }
                    let rest = std::mem::take(&mut self.buf);
                    return Some(serde_json::from_slice(&rest).unwrap());
                }
            }
        }
    }

    /// The next event that is not a BOOKMARK.
    pub async fn next_event(&mut self) -> Option<Value> {
        loop {
            let ev = self.next().await?;
            if ev["type"] != "BOOKMARK" {
                return Some(ev);
            }
        }
    }
}

/// Polls `f` until it returns Some, failing after [`TIMEOUT`].
pub async fn eventually<T, Fut: Future<Output = Option<T>>>(mut f: impl FnMut() -> Fut) -> T {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn obj<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A GET over a bare TCP connection: no client middleware (kube's client
/// retries 429/503/504 by itself).
pub async fn raw_tcp_get(addr: std::net::SocketAddr, path: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}
