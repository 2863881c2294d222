//! Runs the real `csi-node-driver-registrar` binary and reads its JSON logs. The binary dies
//! with the test process, even one killed outright.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::process::{CleanEnv, die_with_parent};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

pub const BINARY: &str = env!("CARGO_BIN_EXE_csi-node-driver-registrar");

/// One line of the registrar's stderr: a JSON log record, or plain text (flag errors).
#[derive(Clone, Debug)]
pub struct LogLine {
    pub raw: String,
    pub json: Option<Value>,
}

impl LogLine {
    pub fn message(&self) -> &str {
        self.json
            .as_ref()
            .and_then(|json| json.get("message"))
            .and_then(Value::as_str)
            .unwrap_or(&self.raw)
    }

    pub fn field(&self, name: &str) -> Option<&str> {
        self.json.as_ref()?.get(name)?.as_str()
    }
}

pub struct Registrar {
    child: Child,
    lines: mpsc::UnboundedReceiver<LogLine>,
    pub seen: Vec<LogLine>,
}

impl Registrar {
    /// Starts the binary with `args` and JSON logs.
    pub fn spawn<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Self::spawn_with_env(args, &[])
    }

    /// [`Registrar::spawn`] with the variables `env` set.
    pub fn spawn_with_env<I, S>(args: I, env: &[(&str, String)]) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut child = die_with_parent(
            Command::new(BINARY)
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .clean_env()
                .args(args)
                .arg("--logging-format=json")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true),
        )
        .spawn()
        .expect("the registrar binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (sender, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(raw)) = reader.next_line().await {
                let json = serde_json::from_str(&raw).ok();
                if sender.send(LogLine { raw, json }).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a log line whose message contains `text`.
    pub async fn wait_for_log(&mut self, text: &str, timeout: Duration) -> LogLine {
        if let Some(line) = self.seen.iter().find(|l| l.message().contains(text)) {
            return line.clone();
        }
        let found = tokio::time::timeout(timeout, async {
            while let Some(line) = self.lines.recv().await {
                self.seen.push(line.clone());
                if line.message().contains(text) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!("no log line containing {text:?}; seen:\n{}", self.dump()),
        }
    }

    /// Every log line so far, draining what is buffered.
    pub fn dump(&mut self) -> String {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        self.seen
            .iter()
            .map(|l| l.raw.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Whether a log line so far contains `text`.
    pub fn logged(&mut self, text: &str) -> bool {
        self.dump();
        self.seen.iter().any(|l| l.message().contains(text))
    }

    /// The address the HTTP server reported it listens on.
    pub async fn http_address(&mut self) -> SocketAddr {
        let line = self
            .wait_for_log("serving HTTP", Duration::from_secs(20))
            .await;
        line.field("address")
            .expect("the HTTP log line has an address")
            .parse()
            .expect("a socket address")
    }

    /// Waits for the process to exit, collecting the rest of its logs.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let status = match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.expect("wait for the registrar"),
            Err(_) => panic!(
                "the registrar did not exit within {timeout:?}; logs:\n{}",
                self.dump()
            ),
        };
        // The reader ends at EOF once the process is gone.
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_secs(5), self.lines.recv()).await
        {
            self.seen.push(line);
        }
        status
    }

    #[cfg(unix)]
    pub fn signal(&self, signal: i32) {
        let pid = self.child.id().expect("the registrar is running") as i32;
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

/// Runs the binary to completion with `args`; returns its status and its stdout and stderr
/// together.
pub async fn run_to_exit(args: &[&str], timeout: Duration) -> (ExitStatus, String) {
    let (status, out, err) = run_to_exit_streams(args, timeout).await;
    (status, format!("{out}{err}"))
}

/// Runs the binary to completion with `args`; returns its status, stdout and stderr.
pub async fn run_to_exit_streams(args: &[&str], timeout: Duration) -> (ExitStatus, String, String) {
    let mut child = die_with_parent(
        Command::new(BINARY)
            .clean_env()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true),
    )
    .spawn()
    .expect("the registrar binary starts");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let collect = async {
        let mut out = String::new();
        let mut err = String::new();
        let (a, b) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        a.and(b).expect("read output");
        let status = child.wait().await.expect("wait");
        (status, out, err)
    };
    tokio::time::timeout(timeout, collect)
        .await
        .expect("the registrar exits in time")
}

/// GET `path` over plain HTTP/1.1; returns the status code and body.
pub async fn http_get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to the HTTP server");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        stream.read_to_string(&mut response),
    )
    .await
    .expect("the HTTP answer in time")
    .expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("an HTTP status line");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Waits until `condition` holds, checking every 20 ms.
pub async fn eventually(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let reached = tokio::time::timeout(timeout, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(reached.is_ok(), "{what} did not happen within {timeout:?}");
}

/// Directories of one test: the kubelet's plugin registry and the driver's socket directory.
pub struct Dirs {
    pub root: tempfile::TempDir,
}

impl Dirs {
    pub fn new() -> Self {
        let root = tempfile::tempdir().expect("a temp dir");
        std::fs::create_dir(root.path().join("plugins_registry")).expect("mkdir");
        std::fs::create_dir(root.path().join("plugins")).expect("mkdir");
        Self { root }
    }

    pub fn registry(&self) -> PathBuf {
        self.root.path().join("plugins_registry")
    }

    pub fn driver_socket(&self) -> PathBuf {
        self.root.path().join("plugins").join("csi.sock")
    }

    pub fn registration_socket(&self, driver: &str) -> PathBuf {
        self.registry().join(format!("{driver}-reg.sock"))
    }
}

/// The flags every test passes: the driver socket serves as both --csi-address and the host
/// path kubelet dials.
pub fn base_args(dirs: &Dirs, csi_address: &str, kubelet_path: &Path) -> Vec<String> {
    vec![
        format!("--csi-address={csi_address}"),
        format!("--kubelet-registration-path={}", kubelet_path.display()),
        format!("--plugin-registration-path={}", dirs.registry().display()),
    ]
}
