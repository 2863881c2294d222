//! The exporter's connections to the collector: TCP or a unix socket, TLS where the settings
//! ask for it, and one exchange over OTLP/gRPC or OTLP/HTTP classified as the specification
//! says a retry is decided. The certificates are read again for each new connection, so that a
//! rotated Secret is used without a restart; a read that fails keeps the last good ones.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};

use super::config::{Collector, Compression, Headers, Protocol, Tls, TraceSettings};

/// Largest answer read from a collector.
const MAX_ANSWER: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{variable} {path}: {reason}")]
    File {
        variable: &'static str,
        path: String,
        reason: String,
    },
    #[error(
        "no CA certificate in the system's store to verify the collector with; name its CA with OTEL_EXPORTER_OTLP_CERTIFICATE"
    )]
    NoRoots,
    #[error("the collector's host {0:?} cannot be verified by TLS")]
    ServerName(String),
    #[error("TLS to the collector: {0}")]
    Tls(String),
}

/// A byte stream to the collector.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Opens connections to the collector.
struct Dialer {
    collector: Collector,
    tls: Option<TlsClient>,
}

struct TlsClient {
    settings: Tls,
    server_name: ServerName<'static>,
    alpn: &'static [u8],
    last_good: Mutex<Arc<rustls::ClientConfig>>,
}

impl Dialer {
    /// Reads the certificates once, so that a bad file stops the start with its reason.
    fn new(settings: &TraceSettings, alpn: &'static [u8]) -> Result<Self, TransportError> {
        let tls = match &settings.tls {
            None => None,
            Some(tls) => {
                let host = match &settings.collector {
                    Collector::Tcp { host, .. } => host.clone(),
                    // Not reached: only TCP endpoints take TLS.
                    Collector::Unix(_) | Collector::UnixAbstract(_) => "localhost".to_string(),
                };
                let server_name = ServerName::try_from(host.clone())
                    .map_err(|_| TransportError::ServerName(host))?;
                Some(TlsClient {
                    last_good: Mutex::new(client_config(tls, alpn)?),
                    settings: tls.clone(),
                    server_name,
                    alpn,
                })
            }
        };
        Ok(Self {
            collector: settings.collector.clone(),
            tls,
        })
    }

    async fn dial(&self) -> io::Result<Box<dyn Io>> {
        let stream: Box<dyn Io> = match &self.collector {
            Collector::Tcp { host, port } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Box::new(stream)
            }
            #[cfg(unix)]
            Collector::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
            #[cfg(windows)]
            Collector::Unix(path) => Box::new(crate::driver::windows::unix_connect(path).await?),
            #[cfg(target_os = "linux")]
            Collector::UnixAbstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                // A local socket: connecting does not wait on a peer.
                let stream = std::os::unix::net::UnixStream::connect_addr(&address)?;
                stream.set_nonblocking(true)?;
                Box::new(tokio::net::UnixStream::from_std(stream)?)
            }
            #[cfg(not(target_os = "linux"))]
            Collector::UnixAbstract(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "abstract unix sockets exist only on Linux",
                ));
            }
        };
        let Some(tls) = &self.tls else {
            return Ok(stream);
        };
        let config = match client_config(&tls.settings, tls.alpn) {
            Ok(config) => {
                *tls.last_good.lock().unwrap_or_else(PoisonError::into_inner) = config.clone();
                config
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the collector's TLS files again; using the ones read before");
                tls.last_good
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            }
        };
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(tls.server_name.clone(), stream)
            .await?;
        Ok(Box::new(stream))
    }
}

/// A client configuration trusting `tls.roots` (or the system's CAs), presenting its client
/// certificate if it has one, and offering `alpn`.
fn client_config(
    tls: &Tls,
    alpn: &'static [u8],
) -> Result<Arc<rustls::ClientConfig>, TransportError> {
    let mut roots = rustls::RootCertStore::empty();
    match &tls.roots {
        Some(path) => {
            for certificate in certificates("OTEL_EXPORTER_OTLP_CERTIFICATE", path)? {
                roots
                    .add(certificate)
                    .map_err(|err| file_error("OTEL_EXPORTER_OTLP_CERTIFICATE", path, err))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    if roots.is_empty() {
        return Err(TransportError::NoRoots);
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|err| TransportError::Tls(err.to_string()))?
    .with_root_certificates(roots);
    let mut config = match &tls.identity {
        Some((certificate, key)) => {
            let chain = certificates("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", certificate)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|err| file_error("OTEL_EXPORTER_OTLP_CLIENT_KEY", key, err))?;
            // The certificate's own faults (an X.509 v1 certificate, a key of another) show
            // here: named by its file.
            builder.with_client_auth_cert(chain, key).map_err(|err| {
                file_error("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", certificate, err)
            })?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

fn certificates(
    variable: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TransportError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|err| file_error(variable, path, err))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| file_error(variable, path, err))?;
    if certificates.is_empty() {
        return Err(file_error(variable, path, "no PEM certificate in it"));
    }
    Ok(certificates)
}

fn file_error(variable: &'static str, path: &Path, reason: impl ToString) -> TransportError {
    TransportError::File {
        variable,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// How one exchange with the collector ended.
#[derive(Debug, PartialEq)]
pub enum Attempt {
    /// Taken; the collector may have refused some spans (`partial_success`).
    Taken { rejected: u64, message: String },
    /// A failure the specification retries: the collector restarting, overloaded, or not
    /// reached. `after`: when the collector said to try again.
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    /// A failure another attempt would repeat (a request the collector refuses).
    Failed(String),
}

/// Sends export requests over one protocol; each attempt may open a new connection.
pub enum Sender {
    Grpc {
        client: TraceServiceClient<Channel>,
        headers: Headers,
    },
    Http(Box<HttpSender>),
}

pub struct HttpSender {
    dialer: Dialer,
    url: http::Uri,
    headers: Headers,
    compression: Compression,
    connection: Option<http1::SendRequest<Full<Bytes>>>,
}

impl Sender {
    /// The sender for `settings`; its connections open on the first export. Must be made inside
    /// the runtime it will run on.
    pub fn new(settings: &TraceSettings) -> Result<Self, TransportError> {
        match settings.protocol {
            Protocol::Grpc => {
                let dialer = Arc::new(Dialer::new(settings, b"h2")?);
                let connector = tower::service_fn(move |_: http::Uri| {
                    let dialer = dialer.clone();
                    async move { dialer.dial().await.map(TokioIo::new) }
                });
                let channel = Endpoint::from(settings.endpoint.clone())
                    .connect_with_connector_lazy(connector);
                let mut client = TraceServiceClient::new(channel);
                if settings.compression == Compression::Gzip {
                    client = client.send_compressed(CompressionEncoding::Gzip);
                }
                Ok(Sender::Grpc {
                    client,
                    headers: settings.headers.clone(),
                })
            }
            Protocol::HttpProtobuf => Ok(Sender::Http(Box::new(HttpSender {
                dialer: Dialer::new(settings, b"http/1.1")?,
                url: settings.endpoint.clone(),
                headers: settings.headers.clone(),
                compression: settings.compression,
                connection: None,
            }))),
        }
    }

    /// One attempt; the caller bounds it in time.
    pub async fn send(&mut self, request: &ExportTraceServiceRequest) -> Attempt {
        match self {
            Sender::Grpc { client, headers } => {
                let mut call = tonic::Request::new(request.clone());
                for (name, value) in &headers.0 {
                    if let (Ok(key), Ok(value)) = (
                        tonic::metadata::AsciiMetadataKey::from_bytes(name.as_str().as_bytes()),
                        tonic::metadata::AsciiMetadataValue::try_from(value.as_bytes()),
                    ) {
                        call.metadata_mut().insert(key, value);
                    }
                }
                match client.export(call).await {
                    Ok(answer) => taken(answer.into_inner()),
                    Err(status) => grpc_failure(&status),
                }
            }
            Sender::Http(sender) => sender.post(request).await,
        }
    }
}

impl HttpSender {
    async fn post(&mut self, request: &ExportTraceServiceRequest) -> Attempt {
        let encoded = request.encode_to_vec();
        let body = match self.compression {
            Compression::None => Bytes::from(encoded),
            Compression::Gzip => match gzip(&encoded) {
                Ok(body) => Bytes::from(body),
                Err(err) => return Attempt::Failed(format!("cannot compress: {err}")),
            },
        };
        let mut post =
            http::Request::post(self.url.path_and_query().map_or("/", |path| path.as_str()))
                .header(http::header::CONTENT_TYPE, "application/x-protobuf");
        if let Some(authority) = self.url.authority() {
            post = post.header(http::header::HOST, authority.as_str());
        }
        if self.compression == Compression::Gzip {
            post = post.header(http::header::CONTENT_ENCODING, "gzip");
        }
        for (name, value) in &self.headers.0 {
            post = post.header(name, value);
        }
        let post = match post.body(Full::new(body)) {
            Ok(post) => post,
            Err(err) => return Attempt::Failed(err.to_string()),
        };
        let connection = match self.connection.take() {
            Some(connection) if !connection.is_closed() => connection,
            _ => match self.connect().await {
                Ok(connection) => connection,
                Err(err) => {
                    return Attempt::Retry {
                        reason: format!("cannot connect: {err}"),
                        after: None,
                    };
                }
            },
        };
        let mut connection = connection;
        if connection.ready().await.is_err() {
            return Attempt::Retry {
                reason: "the connection closed".to_string(),
                after: None,
            };
        }
        let answer = match connection.send_request(post).await {
            Ok(answer) => answer,
            Err(err) => {
                return Attempt::Retry {
                    reason: err.to_string(),
                    after: None,
                };
            }
        };
        let status = answer.status();
        let protobuf = answer
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.contains("protobuf"));
        let after = retry_after(answer.headers());
        // Read (and bound) the answer, so that the connection can carry the next export.
        let body = Limited::new(answer.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map(|body| body.to_bytes());
        if let Ok(body) = body {
            self.connection = Some(connection);
            if status.is_success() {
                let answer = protobuf
                    .then(|| ExportTraceServiceResponse::decode(body).ok())
                    .flatten()
                    .unwrap_or_default();
                return taken(answer);
            }
        }
        let reason = format!("HTTP {status}");
        match status.as_u16() {
            200..=299 => Attempt::Taken {
                rejected: 0,
                message: String::new(),
            },
            429 | 502 | 503 | 504 => Attempt::Retry { reason, after },
            _ => Attempt::Failed(reason),
        }
    }

    async fn connect(&self) -> io::Result<http1::SendRequest<Full<Bytes>>> {
        let stream = self.dialer.dial().await?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

fn gzip(data: &[u8]) -> io::Result<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 4),
        flate2::Compression::fast(),
    );
    encoder.write_all(data)?;
    encoder.finish()
}

fn taken(answer: ExportTraceServiceResponse) -> Attempt {
    let partial = answer.partial_success.unwrap_or_default();
    Attempt::Taken {
        rejected: u64::try_from(partial.rejected_spans).unwrap_or(0),
        message: partial.error_message,
    }
}

/// `Retry-After` in seconds (the HTTP-date form is read as no hint).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// The specification's retryable gRPC codes; RESOURCE_EXHAUSTED only when the collector says
/// when to come back (`google.rpc.RetryInfo`).
fn grpc_failure(status: &tonic::Status) -> Attempt {
    use tonic::Code;
    let reason = format!("{:?}: {}", status.code(), status.message());
    let after = retry_info(status.details());
    match status.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Attempt::Retry { reason, after },
        Code::ResourceExhausted if after.is_some() => Attempt::Retry { reason, after },
        _ => Attempt::Failed(reason),
    }
}

/// `google.rpc.Status`, as far as its details are read.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<prost_types::Duration>,
}

/// The delay of a `RetryInfo` among a status's details.
fn retry_info(details: &[u8]) -> Option<Duration> {
    let status = RpcStatus::decode(details).ok()?;
    let info = status
        .details
        .iter()
        .find(|any| any.type_url.ends_with("/google.rpc.RetryInfo"))?;
    let delay = RetryInfo::decode(info.value.as_slice()).ok()?.retry_delay?;
    let seconds = u64::try_from(delay.seconds).ok()?;
    let nanos = u32::try_from(delay.nanos).ok()?;
    Some(Duration::new(seconds, nanos.min(999_999_999)))
}
