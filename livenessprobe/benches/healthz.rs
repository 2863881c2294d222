//! Load harness: `/healthz` requests per second and latency of the real livenessprobe binary
//! against the mock driver at zero latency, the driver's own Probe time measured directly over
//! gRPC for comparison, and the livenessprobe's peak RSS after the run.
//!
//! `cargo bench -p livenessprobe --bench healthz` (release build). Optional arguments:
//! `--probes N` (sequential samples per measurement, default 10000), `--concurrency C`
//! (clients of the throughput run, default 8), `--seconds S` (throughput run length, default 5).
//! `LIVENESSPROBE_BIN=/path` measures another build (or any binary with the same flags).
//!
//! Linux only: it serves the mock on a unix socket and reads memory from `/proc`.

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("the healthz harness runs on Linux only");
}

#[cfg(target_os = "linux")]
mod harness {

    use std::net::SocketAddr;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use csi_proto::v1::ProbeRequest;
    use csi_proto::v1::identity_client::IdentityClient;
    use sidecar_kit::driver::connection::{ConnectOptions, LossPolicy, connect};
    use testkit::mockdriver::MockDriver;
    use testkit::process::CleanEnv;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpStream;

    struct Options {
        probes: usize,
        concurrency: usize,
        seconds: u64,
    }

    fn options() -> Options {
        let mut options = Options {
            probes: 10_000,
            concurrency: 8,
            seconds: 5,
        };
        let args: Vec<String> = std::env::args().collect();
        let mut words = args.iter().skip(1);
        while let Some(word) = words.next() {
            let value = |words: &mut std::iter::Skip<std::slice::Iter<String>>| {
                words
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("{word} needs a number"))
            };
            match word.as_str() {
                "--probes" => options.probes = value(&mut words) as usize,
                "--concurrency" => options.concurrency = value(&mut words) as usize,
                "--seconds" => options.seconds = value(&mut words),
                // cargo bench passes --bench; anything else is a filter this harness ignores.
                _ => {}
            }
        }
        options
    }

    /// Latency distribution of a sample set.
    struct Summary {
        p50: Duration,
        p99: Duration,
        max: Duration,
    }

    fn summarize(mut samples: Vec<Duration>) -> Summary {
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        Summary {
            p50: at(0.50),
            p99: at(0.99),
            max: samples[samples.len() - 1],
        }
    }

    fn show(name: &str, s: &Summary) {
        println!(
            "{name:<44} p50 {:>8.1} µs   p99 {:>8.1} µs   max {:>8.1} µs",
            s.p50.as_secs_f64() * 1e6,
            s.p99.as_secs_f64() * 1e6,
            s.max.as_secs_f64() * 1e6
        );
    }

    /// A keep-alive HTTP/1.1 client of one connection.
    struct Client {
        stream: BufReader<TcpStream>,
        request: Vec<u8>,
    }

    impl Client {
        async fn connect(addr: SocketAddr, path: &str) -> Self {
            let stream = TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            Self {
                stream: BufReader::new(stream),
                request: format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").into_bytes(),
            }
        }

        /// One request; returns the status code.
        async fn get(&mut self) -> u16 {
            self.stream
                .get_mut()
                .write_all(&self.request)
                .await
                .unwrap();
            let mut line = String::new();
            self.stream.read_line(&mut line).await.unwrap();
            let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            let mut length = 0usize;
            loop {
                line.clear();
                self.stream.read_line(&mut line).await.unwrap();
                if line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            self.stream.read_exact(&mut body).await.unwrap();
            status
        }
    }

    /// `GET /healthz` on a connection of its own, as the kubelet asks.
    async fn get_fresh(addr: SocketAddr) -> u16 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        std::str::from_utf8(&raw[9..12]).unwrap().parse().unwrap()
    }

    fn memory(pid: u32) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (field("VmHWM:"), field("VmRSS:"))
    }

    fn threads(pid: u32) -> usize {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    struct Probe(Child);

    impl Drop for Probe {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
    pub async fn main() {
        let options = options();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let mock = MockDriver::builder()
            .driver_name("bench.csi.example.com")
            .call_log_limit(0)
            .serve_unix(&socket)
            .await
            .unwrap();

        // The driver's own Probe time over a direct gRPC connection.
        let connection = connect(
            &mock.endpoint(),
            ConnectOptions {
                dial_timeout: Some(Duration::from_secs(5)),
                policy: LossPolicy::Reconnect,
            },
        )
        .await
        .unwrap();
        let mut identity = IdentityClient::new(connection.channel());
        for _ in 0..500 {
            identity.probe(ProbeRequest {}).await.unwrap();
        }
        let mut direct = Vec::with_capacity(options.probes);
        for _ in 0..options.probes {
            let started = Instant::now();
            identity.probe(ProbeRequest {}).await.unwrap();
            direct.push(started.elapsed());
        }
        let direct = summarize(direct);

        // The livenessprobe process.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let binary = std::env::var_os("LIVENESSPROBE_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_livenessprobe").into());
        let child = Command::new(binary)
            .clean_env()
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let probe = Probe(child);
        let pid = probe.0.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "livenessprobe did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (idle_hwm, idle_rss) = memory(pid);

        let mut client = Client::connect(addr, "/healthz").await;
        for _ in 0..500 {
            assert_eq!(client.get().await, 200);
        }
        let mut keepalive = Vec::with_capacity(options.probes);
        for _ in 0..options.probes {
            let started = Instant::now();
            assert_eq!(client.get().await, 200);
            keepalive.push(started.elapsed());
        }
        let keepalive = summarize(keepalive);
        let (hwm_10k, rss_10k) = memory(pid);

        let mut fresh = Vec::with_capacity(options.probes);
        for _ in 0..options.probes {
            let started = Instant::now();
            assert_eq!(get_fresh(addr).await, 200);
            fresh.push(started.elapsed());
        }
        let fresh = summarize(fresh);

        // Throughput: C keep-alive clients for S seconds.
        let run_for = Duration::from_secs(options.seconds);
        let started = Instant::now();
        let mut clients = Vec::new();
        for _ in 0..options.concurrency {
            clients.push(tokio::spawn(async move {
                let mut client = Client::connect(addr, "/healthz").await;
                let mut done = 0u64;
                while started.elapsed() < run_for {
                    assert_eq!(client.get().await, 200);
                    done += 1;
                }
                done
            }));
        }
        let mut total = 0;
        for client in clients {
            total += client.await.unwrap();
        }
        let rate = total as f64 / started.elapsed().as_secs_f64();
        let (hwm, rss) = memory(pid);

        let mut metrics = Client::connect(addr, "/metrics").await;
        assert_eq!(metrics.get().await, 200);

        println!(
            "livenessprobe /healthz against the mock driver (zero latency), {} samples each",
            options.probes
        );
        show("driver Probe, direct gRPC", &direct);
        show("/healthz, keep-alive HTTP connection", &keepalive);
        show("/healthz, new HTTP connection per request", &fresh);
        println!(
            "overhead over the driver's Probe             p50 {:>8.1} µs   p99 {:>8.1} µs (keep-alive); p99 {:.1} µs (new connection)",
            (keepalive.p50.as_secs_f64() - direct.p50.as_secs_f64()) * 1e6,
            (keepalive.p99.as_secs_f64() - direct.p99.as_secs_f64()) * 1e6,
            (fresh.p99.as_secs_f64() - direct.p99.as_secs_f64()) * 1e6,
        );
        println!(
            "throughput, {} clients, {} s: {:.0} requests/s ({total} requests)",
            options.concurrency, options.seconds, rate
        );
        println!(
            "livenessprobe memory: idle VmRSS {idle_rss} KiB (VmHWM {idle_hwm} KiB); after {} probes VmRSS {rss_10k} KiB, VmHWM {hwm_10k} KiB ({:.2} MiB)",
            options.probes + 500,
            hwm_10k as f64 / 1024.0,
        );
        println!(
            "                      after all {} probes VmRSS {rss} KiB, VmHWM {hwm} KiB ({:.2} MiB); {} threads",
            total + 2 * options.probes as u64 + 500,
            hwm as f64 / 1024.0,
            threads(pid)
        );
        drop(probe);
        mock.shutdown().await.unwrap();
    }
}

#[cfg(target_os = "linux")]
fn main() {
    harness::main();
}
