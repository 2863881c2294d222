//! The TLS side of the server: the certificate and key from files, reloaded when they change
//! (a rotation by cert-manager swaps the Secret's files; connections already open keep the
//! certificate they were made with, so streams in flight are not dropped), and the accepting of
//! connections with every handshake bounded in time and in number.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// Largest certificate or key file read: a Secret holds at most 1 MiB.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// How often the files are looked at for a change.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);
/// The longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes under way at once; more connections wait in the kernel's backlog.
pub const MAX_HANDSHAKES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no usable PEM private key: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("the key in {key} does not match the certificate in {cert}")]
    Mismatch { cert: PathBuf, key: PathBuf },
}

/// The server's certificate and key files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, TlsError> {
    let read = |source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = fs::metadata(path).map_err(read)?.len();
    if size > MAX_FILE_BYTES {
        return Err(TlsError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    fs::read(path).map_err(read)
}

impl CertFiles {
    /// The certificate chain and key, checked to belong together.
    pub fn load(&self) -> Result<Arc<CertifiedKey>, TlsError> {
        let cert_pem = read_bounded(&self.cert)?;
        let key_pem = read_bounded(&self.key)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .filter_map(Result::ok)
            .collect();
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: self.cert.clone(),
            });
        }
        let key_error = |reason: String| TlsError::Key {
            path: self.key.clone(),
            reason,
        };
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| key_error(e.to_string()))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| key_error(e.to_string()))?;
        let certified = CertifiedKey::new(chain, signing);
        if certified.keys_match().is_err() {
            return Err(TlsError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
            });
        }
        Ok(Arc::new(certified))
    }

    /// What tells a change of either file: its size and modification time (following links,
    /// as a mounted Secret's files are).
    fn stamp(&self) -> Option<[(u64, SystemTime); 2]> {
        let of = |path: &Path| {
            let meta = fs::metadata(path).ok()?;
            Some((meta.len(), meta.modified().ok()?))
        };
        Some([of(&self.cert)?, of(&self.key)?])
    }
}

/// Hands every new handshake the certificate loaded last.
#[derive(Debug)]
pub struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Reloading {
    pub fn new(first: Arc<CertifiedKey>) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(first),
        })
    }

    fn set(&self, key: Arc<CertifiedKey>) {
        match self.current.write() {
            Ok(mut current) => *current = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
    }

    /// The certificate chain served now.
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        match self.current.read() {
            Ok(current) => current.cert.clone(),
            Err(poisoned) => poisoned.into_inner().cert.clone(),
        }
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match self.current.read() {
            Ok(current) => Some(current.clone()),
            Err(poisoned) => Some(poisoned.into_inner().clone()),
        }
    }
}

/// Reloads `files` into `resolver` whenever they change, until `stop`. A change that does not
/// load (a half-written pair during a rotation) keeps the certificate served and is tried again
/// on the next change.
pub async fn reload(files: CertFiles, resolver: Arc<Reloading>, stop: CancellationToken) {
    let mut seen = files.stamp();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RELOAD_INTERVAL) => {}
        }
        let stamp = files.stamp();
        if stamp.is_none() || stamp == seen {
            continue;
        }
        match files.load() {
            Ok(key) => {
                resolver.set(key);
                seen = stamp;
                tracing::info!(cert = %files.cert.display(), key = %files.key.display(), "TLS certificate reloaded");
            }
            Err(err) => {
                tracing::warn!(error = %err, "the changed TLS certificate does not load; still serving the previous one");
            }
        }
    }
}

/// What `--tls-min-version`, `--tls-cipher-suites` and `--tls-curve-preferences` ask for, in
/// the names of Go's crypto/tls, as upstream's flags take them.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Only TLS 1.3 (`VersionTLS13`); otherwise 1.2 and 1.3.
    pub tls13_only: bool,
    /// The TLS 1.2 suites allowed (TLS 1.3's are always on, as in Go); `None`: all.
    pub suites: Option<Vec<rustls::SupportedCipherSuite>>,
    /// The key exchange groups in order of preference; `None`: the defaults.
    pub groups: Option<Vec<&'static dyn rustls::crypto::SupportedKxGroup>>,
}

fn names(text: &str) -> Vec<&str> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

fn suite(name: &str) -> Result<Option<rustls::SupportedCipherSuite>, String> {
    use rustls::crypto::ring::cipher_suite as cs;
    Ok(Some(match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        // TLS 1.3's suites are always on, in Go as here.
        "TLS_AES_128_GCM_SHA256" | "TLS_AES_256_GCM_SHA384" | "TLS_CHACHA20_POLY1305_SHA256" => {
            return Ok(None);
        }
        cbc if cbc.contains("_CBC_") => {
            return Err(format!(
                "--tls-cipher-suites {cbc}: CBC suites are not offered; use an AEAD suite (GCM or CHACHA20_POLY1305)"
            ));
        }
        other => {
            return Err(format!(
                "--tls-cipher-suites: unknown cipher suite {other:?}"
            ));
        }
    }))
}

fn group(name: &str) -> Result<&'static dyn rustls::crypto::SupportedKxGroup, String> {
    use rustls::crypto::ring::kx_group;
    match name {
        "X25519" => Ok(kx_group::X25519),
        "CurveP256" => Ok(kx_group::SECP256R1),
        "CurveP384" => Ok(kx_group::SECP384R1),
        "CurveP521" | "X25519MLKEM768" => Err(format!(
            "--tls-curve-preferences {name}: not offered by this build; use X25519, CurveP256 or CurveP384"
        )),
        other => Err(format!("--tls-curve-preferences: unknown curve {other:?}")),
    }
}

impl Settings {
    /// Reads the three flags; a name Go does not know, or one this build cannot offer, is an
    /// error naming the flag.
    pub fn from_flags(min_version: &str, suites: &str, curves: &str) -> Result<Self, String> {
        let tls13_only = match min_version {
            "" | "VersionTLS12" => false,
            "VersionTLS13" => true,
            "VersionTLS10" | "VersionTLS11" => {
                return Err(format!(
                    "--tls-min-version {min_version}: TLS before 1.2 is not offered"
                ));
            }
            other => {
                return Err(format!(
                    "--tls-min-version {other:?}: expected VersionTLS12 or VersionTLS13"
                ));
            }
        };
        let suites = match names(suites) {
            list if list.is_empty() => None,
            list => Some(
                list.into_iter()
                    .map(suite)
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter()
                    .flatten()
                    .collect(),
            ),
        };
        let groups = match names(curves) {
            list if list.is_empty() => None,
            list => Some(list.into_iter().map(group).collect::<Result<Vec<_>, _>>()?),
        };
        Ok(Self {
            tls13_only,
            suites,
            groups,
        })
    }
}

/// The server's TLS settings: no client certificates (callers prove who they are with a
/// token), HTTP/2 only, as gRPC clients ask by ALPN; versions, suites and groups as `settings`
/// say.
pub fn server_config(
    resolver: Arc<Reloading>,
    settings: &Settings,
) -> Result<ServerConfig, rustls::Error> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suites) = &settings.suites {
        provider.cipher_suites.retain(|offered| {
            offered.version() == &rustls::version::TLS13
                || suites.iter().any(|s| s.suite() == offered.suite())
        });
    }
    if let Some(groups) = &settings.groups {
        provider.kx_groups = groups.clone();
    }
    let versions: &[&rustls::SupportedProtocolVersion] = if settings.tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// How long a connection may stay open with no stream of ours and nothing read from it.
pub const CONNECTION_IDLE: Duration = Duration::from_secs(5 * 60);
/// TCP keepalive on accepted connections: Go's listener default, which upstream's server has.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// What one connection is doing: streams of ours open on it, and when it last did anything.
#[derive(Debug)]
pub struct Activity {
    streams: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            streams: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        }
    }

    fn touch(&self) {
        *sidecar_kit::pipeline::lock(&self.last) = Instant::now();
    }

    /// Since when the connection has been idle: `None` while a stream is open.
    fn idle_since(&self) -> Option<Instant> {
        (self.streams.load(Ordering::Acquire) == 0)
            .then(|| *sidecar_kit::pipeline::lock(&self.last))
    }
}

/// The connection a request came on, as tonic hands it to the request.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: Option<std::net::SocketAddr>,
    activity: Arc<Activity>,
}

impl Peer {
    /// Marks a stream open on the connection until the guard is dropped.
    pub fn stream(&self) -> StreamOpen {
        self.activity.streams.fetch_add(1, Ordering::AcqRel);
        StreamOpen(self.activity.clone())
    }
}

/// A stream open on a connection (see [`Peer::stream`]).
pub struct StreamOpen(Arc<Activity>);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.touch();
        self.0.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A TLS connection tonic serves: closed once idle for `idle` (see [`CONNECTION_IDLE`]); holds
/// its place among the connections allowed until it is dropped.
pub struct Connection {
    tls: TlsStream<TcpStream>,
    activity: Arc<Activity>,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    fn new(tls: TlsStream<TcpStream>, idle: Duration, slot: OwnedSemaphorePermit) -> Self {
        Self {
            tls,
            activity: Arc::new(Activity::new()),
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            _slot: slot,
        }
    }

    /// Whether the connection has been idle for long enough to close; otherwise the timer is
    /// set for the next look (and registered with `cx`).
    fn idle_out(&mut self, cx: &mut Context<'_>) -> bool {
        while self.timer.as_mut().poll(cx).is_ready() {
            let next = match self.activity.idle_since() {
                Some(since) if since.elapsed() >= self.idle => return true,
                Some(since) => since + self.idle,
                None => Instant::now() + self.idle,
            };
            self.timer.as_mut().reset(next.into());
        }
        false
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        Peer {
            addr: self.tls.get_ref().0.peer_addr().ok(),
            activity: self.activity.clone(),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.tls).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.activity.touch();
                }
                Poll::Ready(result)
            }
            Poll::Pending if this.idle_out(cx) => {
                tracing::debug!(peer = ?this.tls.get_ref().0.peer_addr().ok(), idle = ?this.idle, "closing an idle connection");
                // The end of the stream: the HTTP/2 server closes the connection.
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tls).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_shutdown(cx)
    }
}

/// How many connections are served at once and how long one may idle.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max: usize,
    pub idle: Duration,
}

/// How often, at most, turning away connections over the limit is logged.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Accepts connections on `listener` until `stop`, and hands each one whose handshake completes
/// within [`HANDSHAKE_TIMEOUT`] to the receiver; a connection past `limits.max` is closed at
/// once (its client sees Unavailable and may retry) rather than left waiting.
pub fn accept(
    listener: TcpListener,
    config: ServerConfig,
    limits: ConnectionLimits,
    stop: CancellationToken,
) -> mpsc::Receiver<io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(MAX_HANDSHAKES);
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let slots = Arc::new(Semaphore::new(limits.max));
    tokio::spawn(async move {
        let mut last_refusal_logged: Option<Instant> = None;
        let mut refused = 0u64;
        loop {
            let Ok(permit) = handshakes.clone().acquire_owned().await else {
                return;
            };
            let (tcp, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                refused += 1;
                if last_refusal_logged.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL) {
                    tracing::warn!(%peer, max = limits.max, refused, "connection refused: as many connections as --max-connections are open");
                    last_refusal_logged = Some(Instant::now());
                }
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let keepalive = socket2::TcpKeepalive::new()
                .with_time(TCP_KEEPALIVE)
                .with_interval(TCP_KEEPALIVE);
            if let Err(err) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
                tracing::debug!(%peer, error = %err, "cannot set TCP keepalive");
            }
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(Connection::new(tls, limits.idle, slot))).await;
                    }
                    Ok(Err(err)) => tracing::debug!(%peer, error = %err, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_s_tls_flags_are_read_in_go_s_names() {
        let all = Settings::from_flags("", "", "").unwrap();
        assert!(!all.tls13_only && all.suites.is_none() && all.groups.is_none());
        let chosen = Settings::from_flags(
            "VersionTLS13",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256",
            "X25519,CurveP256",
        )
        .unwrap();
        assert!(chosen.tls13_only);
        assert_eq!(chosen.suites.map(|s| s.len()), Some(1));
        assert_eq!(chosen.groups.map(|g| g.len()), Some(2));
        for (version, suites, curves, flag) in [
            ("VersionTLS11", "", "", "--tls-min-version"),
            ("TLS1.2", "", "", "--tls-min-version"),
            ("", "TLS_RSA_WITH_RC4_128_SHA", "", "--tls-cipher-suites"),
            (
                "",
                "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
                "",
                "--tls-cipher-suites",
            ),
            ("", "", "CurveP521", "--tls-curve-preferences"),
            ("", "", "P-256", "--tls-curve-preferences"),
        ] {
            let err = Settings::from_flags(version, suites, curves).unwrap_err();
            assert!(err.starts_with(flag), "{err}");
        }
    }
}
