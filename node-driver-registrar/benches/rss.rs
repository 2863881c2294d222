//! Memory benchmark (not a timed test): resident set size of the release binary when idle, and
//! after 10 000 GetInfo calls over the registration socket, on fresh connections (as kubelet's
//! connection monitor makes them) and on one connection, and after 1 000 `/healthz` checks.
//!
//! Run with `cargo bench -p node-driver-registrar --bench rss` (Linux: reads VmRSS and VmHWM
//! from /proc/<pid>/status).

#[cfg(target_os = "linux")]
fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(linux::measure());
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("the RSS benchmark reads /proc and runs on Linux only");
}

#[cfg(target_os = "linux")]
mod linux {
    use std::path::Path;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    use csi_proto::pluginregistration::registration_client::RegistrationClient;
    use csi_proto::pluginregistration::{InfoRequest, RegistrationStatus};
    use hyper_util::rt::TokioIo;
    use testkit::mockdriver::MockDriver;
    use testkit::process::CleanEnv;
    use tonic::transport::{Channel, Endpoint};

    const BINARY: &str = env!("CARGO_BIN_EXE_csi-node-driver-registrar");
    const DRIVER: &str = "bench.csi.k8s.io";
    const CALLS: usize = 10_000;
    /// A day of kubelet liveness probes at the usual 10 s period is 8 640.
    const HEALTH_CHECKS: usize = 1_000;
    /// The goal for the idle and loaded resident set, against upstream's 18.6 MiB idle.
    const TARGET_KIB: u64 = 5 * 1024;

    struct Memory {
        rss_kib: u64,
        hwm_kib: u64,
    }

    fn memory(pid: u32) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse().ok())
                .expect("a VmRSS/VmHWM line")
        };
        Memory {
            rss_kib: field("VmRSS:"),
            hwm_kib: field("VmHWM:"),
        }
    }

    async fn connect(path: &Path) -> Channel {
        let path = path.to_path_buf();
        Endpoint::from_static("http://bench.local")
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(TokioIo::new)
                }
            }))
            .await
            .expect("connect to the registration socket")
    }

    /// One liveness probe: each makes the registrar dial its own socket and call GetInfo.
    async fn healthz(port: u16) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to /healthz");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    fn report(label: &str, memory: &Memory) {
        let verdict = if memory.rss_kib <= TARGET_KIB {
            "within"
        } else {
            "over"
        };
        println!(
            "{label:<44} VmRSS {:>6} KiB ({:.2} MiB)  VmHWM {:>6} KiB ({:.2} MiB)  {verdict} the 5 MiB target",
            memory.rss_kib,
            memory.rss_kib as f64 / 1024.0,
            memory.hwm_kib,
            memory.hwm_kib as f64 / 1024.0,
        );
    }

    pub async fn measure() {
        let dir = tempfile::tempdir().expect("temp dir");
        let registry = dir.path().join("plugins_registry");
        std::fs::create_dir(&registry).expect("mkdir");
        let driver_socket = dir.path().join("csi.sock");
        let _driver = MockDriver::builder()
            .driver_name(DRIVER)
            .serve_unix(&driver_socket)
            .await
            .expect("mock driver");

        let http_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|probe| probe.local_addr())
            .expect("a free port")
            .port();
        let mut child = tokio::process::Command::new(BINARY)
            .clean_env()
            .arg(format!("--csi-address={}", driver_socket.display()))
            .arg(format!(
                "--kubelet-registration-path={}",
                driver_socket.display()
            ))
            .arg(format!("--plugin-registration-path={}", registry.display()))
            .arg(format!("--http-endpoint=127.0.0.1:{http_port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the registrar");
        let pid = child.id().expect("pid");
        let socket = registry.join(format!("{DRIVER}-reg.sock"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the registration socket appears");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Let start-up allocations settle before calling it idle.
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("node-driver-registrar memory ({BINARY})");
        report("idle, registration socket listening", &memory(pid));

        let mut client = RegistrationClient::new(connect(&socket).await);
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .expect("notify");
        let started = Instant::now();
        for _ in 0..CALLS {
            let mut client = RegistrationClient::new(connect(&socket).await);
            client.get_info(InfoRequest {}).await.expect("GetInfo");
        }
        let fresh = started.elapsed();
        report(
            &format!("after {CALLS} GetInfo, fresh connection each"),
            &memory(pid),
        );

        let started = Instant::now();
        for _ in 0..CALLS {
            client.get_info(InfoRequest {}).await.expect("GetInfo");
        }
        let reused = started.elapsed();
        report(
            &format!("after {CALLS} more GetInfo on one connection"),
            &memory(pid),
        );
        for _ in 0..HEALTH_CHECKS {
            healthz(http_port).await;
        }
        report(&format!("after {HEALTH_CHECKS} GET /healthz"), &memory(pid));
        println!(
            "(wall time, informational: {:.1} s with fresh connections, {:.1} s on one connection)",
            fresh.as_secs_f64(),
            reused.as_secs_f64()
        );
        child.start_kill().expect("stop the registrar");
        let _ = child.wait().await;
    }
}
