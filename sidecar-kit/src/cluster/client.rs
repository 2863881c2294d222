//! The Kubernetes client: configuration from `--kubeconfig`, `$KUBECONFIG` or the pod's service
//! account (each binary with its upstream's [`KubeconfigRule`]), and a client-side token-bucket
//! rate limit honouring `--kube-api-qps` and `--kube-api-burst` as client-go's does.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use hyper_rustls::FixedServerNameResolver;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls_pki_types::ServerName;
use tokio::time::{Instant, Sleep};
use tower::retry::RetryLayer;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, Service, ServiceBuilder};
use tracing::Instrument;

use crate::cluster::deadline::{Bounded, Deadline, is_watch};
use crate::cluster::pool::{Pool, Streamed, Timings};
use crate::cluster::token::{TokenFile, TokenLayer};
use crate::process::flags::KubeFlags;
use crate::telemetry::propagate::ApiTraceLayer;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("cannot read kubeconfig {path}: {source}")]
    ReadKubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("invalid kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("no kubeconfig given and no in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("the kubeconfig's proxy-url (host {0:?}) is not supported")]
    Proxy(String),
    #[error("the kubeconfig's tls-server-name {0:?} is not a valid server name")]
    ServerName(String),
    #[error("invalid --master {url:?}: {message}")]
    Master { url: String, message: String },
    #[error(transparent)]
    Token(#[from] crate::cluster::token::TokenError),
}

/// The token file `auth` authenticates with: the one kube would read, when it would (an auth
/// provider, a user name and password or an inline token come first, as in client-go).
fn token_file(auth: &kube::config::AuthInfo) -> Option<&str> {
    let other = auth.auth_provider.is_some()
        || (auth.username.is_some() && auth.password.is_some())
        || auth.token.is_some();
    auth.token_file.as_deref().filter(|_| !other)
}

/// Points the configuration at `--master` when given (upstream's out-of-cluster override of the
/// kubeconfig's server).
pub fn override_master(config: &mut kube::Config, master: &str) -> Result<(), KubeError> {
    if !master.is_empty() {
        config.cluster_url =
            master
                .parse()
                .map_err(|e: http::uri::InvalidUri| KubeError::Master {
                    url: master.to_string(),
                    message: e.to_string(),
                })?;
    }
    Ok(())
}

/// Which kubeconfig a binary reads, when `--kubeconfig` and `$KUBECONFIG` may each name one.
/// Every single sidecar keeps its upstream's rule, so that a pod spec means what it meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeconfigRule {
    /// `--kubeconfig`, else the in-cluster configuration; `$KUBECONFIG` is not read (upstream's
    /// attacher, resizer and snapshotter).
    FlagOnly,
    /// `$KUBECONFIG` over `--kubeconfig`, else the in-cluster configuration (upstream's
    /// provisioner).
    EnvironmentFirst,
    /// `--kubeconfig`, else `$KUBECONFIG`, else the in-cluster configuration, as kubectl reads
    /// them: the all-in-one process, which has no upstream, lets the flag its pod spec gives
    /// win over an environment the image or a wrapper may bring.
    FlagFirst,
}

impl KubeconfigRule {
    /// `--kubeconfig`'s help in a binary that follows the rule.
    pub fn help(self) -> &'static str {
        match self {
            Self::FlagOnly => {
                "Path to a kubeconfig; empty uses the in-cluster configuration ($KUBECONFIG is not read)"
            }
            Self::EnvironmentFirst => {
                "Path to a kubeconfig; $KUBECONFIG, when set, wins over it; with neither the \
                 in-cluster configuration is used"
            }
            Self::FlagFirst => {
                "Path to a kubeconfig; empty uses $KUBECONFIG, then the in-cluster configuration"
            }
        }
    }

    /// The kubeconfig to read (`None`: the in-cluster configuration) from the flag and the
    /// variable's value. Like upstream's, a `$KUBECONFIG` of several paths is not merged: it
    /// names one file.
    pub fn choose(self, flag: &str, environment: Option<&str>) -> Option<String> {
        let flag = Some(flag).filter(|f| !f.is_empty());
        let environment = environment.filter(|e| !e.is_empty());
        let chosen = match self {
            Self::FlagOnly => flag,
            Self::EnvironmentFirst => environment.or(flag),
            Self::FlagFirst => flag.or(environment),
        };
        chosen.map(str::to_string)
    }
}

/// Loads the client configuration: the kubeconfig `rule` chooses, else in-cluster.
pub async fn load_config(
    flags: &KubeFlags,
    rule: KubeconfigRule,
) -> Result<kube::Config, KubeError> {
    let environment = std::env::var("KUBECONFIG").ok();
    let Some(path) = rule.choose(&flags.kubeconfig, environment.as_deref()) else {
        return Ok(kube::Config::incluster()?);
    };
    let kubeconfig = Kubeconfig::read_from(&path).map_err(|source| KubeError::ReadKubeconfig {
        path: path.clone(),
        source,
    })?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| KubeError::Kubeconfig { path, source })
}

/// `config` with the User-Agent client-go gives a program, `<program>/<version> (<os>/<arch>)`:
/// the API server names the field manager of every write after the part before the `/`, so
/// objects show `csi-snapshotter` as upstream's writes do, not `unknown`.
pub fn as_program(config: &kube::Config, program: &str, version: &str) -> kube::Config {
    let mut config = config.clone();
    let agent = format!(
        "{program}/v{version} ({}/{})",
        std::env::consts::OS,
        go_arch()
    );
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config
            .headers
            .retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
    }
    config
}

/// The architecture as Go names it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// The text of a Kubernetes API error as client-go renders it: the Status message.
pub fn api_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// The HTTP code of a Kubernetes API error (`None`: not an answer of the API server).
pub fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Idle connections kept per API server once a burst is over, as client-go keeps
/// (`idleConnsPerHost`); the others close as soon as they are returned.
const IDLE_PER_HOST: usize = 25;

/// TCP keepalive of every API server connection, probing after 30 s idle as client-go's dialer
/// does: an idle connection whose peer is gone is noticed within [`KEEPALIVE_IDLE`] plus
/// [`KEEPALIVE_PROBES`] × [`KEEPALIVE_INTERVAL`] (90 s), not when the kernel gives up hours later.
/// (A connection with a request in flight is bounded by [`crate::cluster::deadline`] instead.)
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_PROBES: u32 = 4;

/// An answer of the API server, its body bounded in time.
type Answer = Response<Bounded<Streamed>>;

type Transport = BoxCloneSyncService<Request<Body>, Answer, BoxError>;

/// The TCP connector of API server connections. Without TCP_NODELAY a request written in two
/// pieces (an HTTP/2 HEADERS frame, then its DATA) waits for the server's delayed ACK of the
/// first before the second is sent: 40 ms or more added to every small write. Go sets it on
/// every TCP connection, so client-go's requests never wait.
fn tcp_connector() -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    http
}

/// TLS to the API server offering HTTP/2 and HTTP/1.1 (ALPN `h2`, `http/1.1`), as client-go
/// does: a server that picks `h2` gets every request and watch of the process multiplexed on
/// one connection; one that does not (or a plain `http://` server) gets HTTP/1.1 connections
/// from the pool. kube's own connector offers HTTP/1.1 only.
fn https_connector(
    config: &kube::Config,
) -> Result<hyper_rustls::HttpsConnector<HttpConnector>, KubeError> {
    let tls = config.rustls_client_config()?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name =
            ServerName::try_from(name.clone()).map_err(|_| KubeError::ServerName(name.clone()))?;
        builder = builder.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    Ok(builder
        .enable_all_versions()
        .wrap_connector(tcp_connector()))
}

/// The connections of a process to its API server, shared by every client it makes from them,
/// as client-go shares one transport between the clients of one TLS configuration.
///
/// A client built on its own keeps a pool of its own, and each keeps every connection a burst
/// opened for 90 s, with its buffers: after 300 operations of each controller, an all-in-one
/// process held 120 more connections to the API server than when idle. Sharing one pool reuses
/// them across controllers (and between a controller's work, its Events and its Lease), and beyond
/// [`IDLE_PER_HOST`] they close once idle. Each client keeps its own rate limit on top.
#[derive(Clone)]
pub struct Connections {
    transport: Transport,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections").finish_non_exhaustive()
    }
}

impl Connections {
    /// Connections with `config`'s server, TLS settings and timeouts. The clients made from
    /// them may differ from `config` in headers and credentials only.
    pub fn new(config: &kube::Config) -> Result<Self, KubeError> {
        Self::with_timings(config, Timings::default())
    }

    /// [`Connections::new`] with other HTTP/2 PING and idle times.
    pub fn with_timings(config: &kube::Config, timings: Timings) -> Result<Self, KubeError> {
        if let Some(proxy) = &config.proxy_url {
            // Only the host: the URL's user part may hold a password.
            return Err(KubeError::Proxy(
                proxy.host().unwrap_or_default().to_string(),
            ));
        }
        let tls = https_connector(config)?;
        let mut connector = TimeoutConnector::new(tls);
        connector.set_connect_timeout(config.connect_timeout);
        connector.set_read_timeout(config.read_timeout);
        connector.set_write_timeout(config.write_timeout);
        connector.set_reset_reader_on_write(config.reset_reader_on_write);
        let mut http1 = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
        http1
            .pool_max_idle_per_host(IDLE_PER_HOST)
            .timer(TokioTimer::new());
        let pool = Pool::new(connector, &http1, timings);
        Ok(Self {
            transport: BoxCloneSyncService::new(Deadline::new(pool)),
        })
    }

    /// What kube's own builder puts in front of its connections: the server's address,
    /// retries of 429/503/504 when the configuration asks for them, credentials, headers.
    fn builder(
        &self,
        config: &kube::Config,
    ) -> Result<
        ClientBuilder<
            impl Service<Request<Body>, Response = Answer, Error = BoxError, Future: Send + 'static>
            + Clone
            + Send
            + 'static,
        >,
        KubeError,
    > {
        // A token file is ours to read (see crate::cluster::token); any other credentials are kube's.
        let token = token_file(&config.auth_info)
            .map(TokenFile::open)
            .transpose()?;
        let kube_auth = match token {
            Some(_) => None,
            None => config.auth_layer()?,
        };
        let service = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(
                config
                    .default_retry
                    .then(|| RetryLayer::new(RetryPolicy::server_retry())),
            )
            .option_layer(token.map(TokenLayer))
            .option_layer(kube_auth)
            .layer(config.extra_headers_layer()?)
            .service(self.transport.clone());
        Ok(ClientBuilder::new(
            service,
            config.default_namespace.clone(),
        ))
    }

    /// A client with its own rate limiter. Give leader election a client of its own so that a
    /// busy controller cannot starve lease renewals.
    pub fn client(
        &self,
        config: &kube::Config,
        qps: f64,
        burst: u32,
    ) -> Result<kube::Client, KubeError> {
        Ok(self
            .builder(config)?
            .with_layer(&RateLimitLayer::new(qps, burst))
            .with_layer(&ApiTraceLayer::new(&config.cluster_url))
            .build())
    }

    /// See [`Clients`].
    pub fn clients(
        &self,
        config: &kube::Config,
        qps: f64,
        burst: u32,
    ) -> Result<Clients, KubeError> {
        let bucket = TokenBucket::new(qps, burst).map(Arc::new);
        let main = self
            .builder(config)?
            .with_layer(&RateLimitLayer {
                bucket: bucket.clone(),
            })
            .with_layer(&ApiTraceLayer::new(&config.cluster_url))
            .build();
        let background = self
            .builder(config)?
            .with_layer(&BackgroundLayer { bucket })
            .with_layer(&ApiTraceLayer::new(&config.cluster_url))
            .build();
        Ok(Clients { main, background })
    }
}

/// Two clients sharing one rate limit: `main` for the work (it waits for its turn, first come
/// first served), `background` for best-effort writes such as Events, which only use tokens the
/// work leaves unused, so that they never delay it.
#[derive(Clone)]
pub struct Clients {
    pub main: kube::Client,
    pub background: kube::Client,
}

/// A token bucket: `burst` requests at once, then `qps` per second. Waiting callers are served
/// in the order they reserved, as client-go's limiter does.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A bucket, or `None` for "no limit" (negative QPS). Zero values take client-go's defaults
    /// (5 QPS, burst 10).
    pub fn new(qps: f64, burst: u32) -> Option<Self> {
        if qps < 0.0 || !qps.is_finite() {
            return None;
        }
        let qps = if qps == 0.0 { 5.0 } else { qps };
        let burst = if burst == 0 { 10.0 } else { f64::from(burst) };
        Some(Self {
            qps,
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                updated: Instant::now(),
            }),
        })
    }

    /// The state, refilled for the time since it was last looked at; `None` when its lock is
    /// poisoned (then nothing is limited).
    fn refilled(&self) -> Option<std::sync::MutexGuard<'_, BucketState>> {
        let mut state = self.state.lock().ok()?;
        let now = Instant::now();
        let refill = now.duration_since(state.updated).as_secs_f64() * self.qps;
        state.tokens = (state.tokens + refill).min(self.burst);
        state.updated = now;
        Some(state)
    }

    /// Takes one token and says how long the caller must wait before using it.
    pub fn reserve(&self) -> Duration {
        let Some(mut state) = self.refilled() else {
            return Duration::ZERO;
        };
        state.tokens -= 1.0;
        if state.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-state.tokens / self.qps)
        }
    }

    /// Takes a token if the caller's turn comes within `limit`, and says how long to wait for
    /// it; `None` (nothing taken) when the callers already waiting would make it later.
    pub fn reserve_within(&self, limit: Duration) -> Option<Duration> {
        let Some(mut state) = self.refilled() else {
            return Some(Duration::ZERO);
        };
        let wait = Duration::from_secs_f64((1.0 - state.tokens).max(0.0) / self.qps);
        if wait > limit {
            return None;
        }
        state.tokens -= 1.0;
        Some(wait)
    }

    /// Takes a token only if one is free now; never goes into debt, so callers waiting in
    /// [`reserve`](Self::reserve) order keep their turn. Otherwise says when to ask again.
    pub fn try_take(&self) -> Result<(), Duration> {
        let Some(mut state) = self.refilled() else {
            return Ok(());
        };
        if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - state.tokens) / self.qps))
        }
    }
}

/// Tower layer letting requests through only on tokens nobody else waits for.
#[derive(Clone, Debug)]
pub struct BackgroundLayer {
    bucket: Option<Arc<TokenBucket>>,
}

impl<S> Layer<S> for BackgroundLayer {
    type Service = Background<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Background {
            inner,
            bucket: self.bucket.clone(),
            wait: None,
            granted: false,
        }
    }
}

/// The service made by [`BackgroundLayer`].
pub struct Background<S> {
    inner: S,
    bucket: Option<Arc<TokenBucket>>,
    wait: Option<Pin<Box<Sleep>>>,
    granted: bool,
}

impl<S, R> Service<R> for Background<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(bucket) = &self.bucket {
            while !self.granted {
                if let Some(wait) = self.wait.as_mut() {
                    ready!(Future::poll(wait.as_mut(), cx));
                    self.wait = None;
                }
                match bucket.try_take() {
                    Ok(()) => self.granted = true,
                    Err(retry) => self.wait = Some(Box::pin(tokio::time::sleep(retry))),
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.granted = false;
        self.inner.call(request)
    }
}

/// Tower layer applying a [`TokenBucket`] before each request is sent, watches excepted: as
/// client-go's (`Request.Watch` never waits for its limiter), a watch costs no token, so that a
/// controller's start-up and its watches' restarts every few minutes take nothing from the
/// writes.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: Option<Arc<TokenBucket>>,
}

impl RateLimitLayer {
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            bucket: TokenBucket::new(qps, burst).map(Arc::new),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
        }
    }
}

/// The service made by [`RateLimitLayer`]: a request other than a watch waits for its token.
#[derive(Clone)]
pub struct RateLimited<S> {
    inner: S,
    bucket: Option<Arc<TokenBucket>>,
}

impl<S, B> Service<Request<B>> for RateLimited<S>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let delay = match &self.bucket {
            Some(bucket) if !is_watch(request.uri()) => bucket.reserve(),
            _ => Duration::ZERO,
        };
        if delay.is_zero() {
            return Box::pin(self.inner.call(request));
        }
        // The service made ready for this call waits with it; a clone takes its place.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        // Inside a traced API request, the wait is a span of its own.
        let waiting = if crate::telemetry::enabled() && !tracing::Span::current().is_none() {
            tracing::info_span!("rate limiter wait", wait_ms = delay.as_millis() as u64)
        } else {
            tracing::Span::none()
        };
        Box::pin(async move {
            tokio::time::sleep(delay).instrument(waiting).await;
            inner.call(request).await
        })
    }
}

/// The data of a secret as the strings CSI requests carry, read with a direct GET (secrets are
/// never cached).
pub async fn secret_data<M: FromIterator<(String, String)>>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<M, kube::Error> {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    let secret = api.get(name).await?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// [`secret_data`], failing with upstream's text.
pub async fn fetch_secret<M: FromIterator<(String, String)>>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<M, String> {
    secret_data(client, namespace, name).await.map_err(|err| {
        format!(
            "error getting secret {name} in namespace {namespace}: {}",
            api_message(&err)
        )
    })
}

/// Implements [`kube::Resource`] for a type of ours that holds `metadata` and projects a custom
/// resource (or any kind without a k8s-openapi type): group, version, kind and plural given.
#[macro_export]
macro_rules! custom_resource {
    ($ty:ty, $scope:ty, $group:expr, $version:expr, $kind:expr, $plural:expr) => {
        impl ::kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_is_refused_without_showing_its_password() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://user:hunter2@proxy.example:3128".parse().unwrap());
        let message = Connections::new(&config).unwrap_err().to_string();
        assert!(message.contains("proxy.example"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[tokio::test]
    async fn api_connections_send_tcp_keepalives_and_no_delay() {
        use std::os::fd::AsRawFd;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let stream = tower::ServiceExt::oneshot(tcp_connector(), uri)
            .await
            .unwrap();
        let fd = stream.inner().as_raw_fd();
        let option = |level, name| {
            let mut value: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `fd` is an open socket, and value/len describe a c_int.
            let rc =
                unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &raw mut len) };
            assert_eq!(rc, 0);
            value
        };
        assert_eq!(option(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(option(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 30);
        assert_eq!(option(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 15);
        assert_eq!(option(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 4);
        assert_eq!(option(libc::IPPROTO_TCP, libc::TCP_NODELAY), 1);
    }

    #[test]
    fn each_rule_chooses_its_kubeconfig() {
        use KubeconfigRule::*;
        let cases = [
            (FlagOnly, "/flag", Some("/env"), Some("/flag")),
            (FlagOnly, "", Some("/env"), None),
            (EnvironmentFirst, "/flag", Some("/env"), Some("/env")),
            (EnvironmentFirst, "/flag", Some(""), Some("/flag")),
            (EnvironmentFirst, "", None, None),
            (FlagFirst, "/flag", Some("/env"), Some("/flag")),
            (FlagFirst, "", Some("/env"), Some("/env")),
            (FlagFirst, "", None, None),
        ];
        for (rule, flag, environment, chosen) in cases {
            assert_eq!(
                rule.choose(flag, environment).as_deref(),
                chosen,
                "{rule:?} {flag:?} {environment:?}"
            );
        }
    }

    #[test]
    fn the_user_agent_names_the_program_as_client_go_does() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config
            .headers
            .push((http::header::USER_AGENT, "old".parse().unwrap()));
        let config = as_program(&config, "csi-snapshotter", "0.1.0");
        let agents: Vec<&str> = config
            .headers
            .iter()
            .filter(|(name, _)| name == http::header::USER_AGENT)
            .filter_map(|(_, value)| value.to_str().ok())
            .collect();
        assert_eq!(agents.len(), 1);
        assert!(
            agents[0].starts_with("csi-snapshotter/v0.1.0 ("),
            "{agents:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_grants_burst_then_qps() {
        let bucket = TokenBucket::new(10.0, 3).unwrap();
        let waits: Vec<Duration> = (0..6).map(|_| bucket.reserve()).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200));
        assert_eq!(waits[5], Duration::from_millis(300));
        tokio::time::advance(Duration::from_secs(10)).await;
        // Refill is capped at the burst.
        let waits: Vec<Duration> = (0..4).map(|_| bucket.reserve()).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert!(!waits[3].is_zero());
    }

    #[tokio::test(start_paused = true)]
    async fn background_takes_only_tokens_nobody_waits_for() {
        let bucket = TokenBucket::new(10.0, 2).unwrap();
        assert_eq!(bucket.try_take(), Ok(()));
        // The work takes the last token and goes into debt for the next.
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::from_millis(100));
        // Background must wait until the debt is paid and a whole token is free.
        let retry = bucket.try_take().unwrap_err();
        assert_eq!(retry, Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(
            bucket.try_take().is_err(),
            "the waiting work request comes first"
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(bucket.try_take(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn background_service_waits_for_a_free_token() {
        use tower::ServiceExt;
        let bucket = Arc::new(TokenBucket::new(10.0, 1).unwrap());
        let _ = bucket.reserve();
        let _ = bucket.reserve();
        let service = BackgroundLayer {
            bucket: Some(bucket),
        }
        .layer(tower::service_fn(|_: ()| async {
            Ok::<_, std::convert::Infallible>(Instant::now())
        }));
        let start = Instant::now();
        let at = service.oneshot(()).await.unwrap();
        assert_eq!(at.duration_since(start), Duration::from_millis(200));
    }

    #[test]
    fn defaults_and_unlimited() {
        assert!(TokenBucket::new(-1.0, 10).is_none());
        let bucket = TokenBucket::new(0.0, 0).unwrap();
        assert_eq!(bucket.qps, 5.0);
        assert_eq!(bucket.burst, 10.0);
    }
}
