//! Where spans go and which are kept, from `--tracing-config-file` (the `TracingConfiguration`
//! file kube-apiserver and the kubelet take) and the standard `OTEL_*` environment variables.
//! Pure: the file's text and the environment come in as values.

mod endpoint;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use endpoint::Collector;

/// The API versions kube-apiserver accepts for its tracing file.
const API_VERSIONS: &[&str] = &[
    "apiserver.config.k8s.io/v1",
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1alpha1",
];
/// kube-apiserver's default collector: OTLP/gRPC on `localhost`, which for a sidecar is its pod.
const DEFAULT_FILE_ENDPOINT: &str = "localhost:4317";
/// The OTLP defaults for each protocol (OpenTelemetry's exporter specification).
const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";
const DEFAULT_GRPC_PORT: u16 = 4317;
const DEFAULT_HTTP_ENDPOINT: &str = "http://localhost:4318";
const MAX_QUEUE: usize = 65_536;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TracingConfigError {
    #[error("--tracing-config-file {path}: {reason}")]
    File { path: String, reason: String },
    #[error(
        "--tracing-config-file {path}: samplingRatePerMillion must be between 0 and 1000000, not {value}"
    )]
    SamplingRate { path: String, value: i64 },
    #[error("{origin}: endpoint {value:?}: {reason}")]
    Endpoint {
        origin: String,
        value: String,
        reason: String,
    },
    #[error("{variable}={value:?}: {reason}")]
    Variable {
        variable: &'static str,
        value: String,
        reason: &'static str,
    },
    /// A setting whose value may be secret (headers carry API keys): never shown.
    #[error("{variable}: {reason}")]
    Secret {
        variable: &'static str,
        reason: String,
    },
    /// The exporter could not be set up (its TLS files, its thread).
    #[error("tracing: {0}")]
    Export(String),
    #[error(
        "{first} without {second}: a client certificate needs its key and the key its certificate"
    )]
    HalfIdentity {
        first: &'static str,
        second: &'static str,
    },
}

/// How spans are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// Which root spans are kept; a span with a parent follows its parent where `parent_based`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Share of root traces kept, 0 to 1.
    pub ratio: f64,
    pub parent_based: bool,
}

/// Bounds of the export queue (the `OTEL_BSP_*` variables).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Batching {
    pub max_queue: usize,
    pub max_batch: usize,
    pub delay: Duration,
    pub timeout: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            max_queue: 2048,
            max_batch: 512,
            delay: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
        }
    }
}

/// What a trace hands on with each request (`OTEL_PROPAGATORS`): W3C `traceparent` and
/// `tracestate`, and W3C `baggage`. Both by default, as the specification and kube-apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Propagators {
    pub trace_context: bool,
    pub baggage: bool,
}

impl Default for Propagators {
    fn default() -> Self {
        Self {
            trace_context: true,
            baggage: true,
        }
    }
}

/// TLS to the collector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tls {
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`: the CAs (PEM) trusted instead of the system's.
    pub roots: Option<PathBuf>,
    /// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `…_CLIENT_KEY` (PEM): presented to a
    /// collector that asks for a client certificate.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// Whether export bodies are compressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: sent with every export. Values are often API keys: they are
/// never shown, in logs or in errors.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(http::HeaderName, http::HeaderValue)>);

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| format!("{name}: <redacted>")))
            .finish()
    }
}

/// Everything the exporter needs; `None` from [`resolve`] means tracing is off.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSettings {
    /// For gRPC the server's URI (`http://host:port`, its `:authority`); for HTTP the full URL
    /// spans are posted to.
    pub endpoint: http::Uri,
    /// Where the connection goes.
    pub collector: Collector,
    /// `None`: plain text.
    pub tls: Option<Tls>,
    pub headers: Headers,
    pub compression: Compression,
    /// `OTEL_PROPAGATORS`: what is handed on to the driver and the API server.
    pub propagators: Propagators,
    pub protocol: Protocol,
    pub sampling: Sampling,
    /// `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`); the binary's own
    /// name otherwise.
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES` without `service.name`.
    pub resource: Vec<(String, String)>,
    /// Each export request's bound.
    pub export_timeout: Duration,
    pub batching: Batching,
}

/// kube-apiserver's `TracingConfiguration`, strictly: a misspelt field is an error, not a
/// silently ignored setting.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TracingFile {
    api_version: Option<String>,
    kind: Option<String>,
    endpoint: Option<String>,
    sampling_rate_per_million: Option<i64>,
}

/// Reads the settings from the file's text (`file`: its path and contents) and the environment
/// (`env`: a variable's value by name). The file wins where both speak (the endpoint, which
/// implies OTLP/gRPC as kube-apiserver's, and the sampling); tracing is on when a file is given
/// or an OTLP endpoint variable is set, unless `OTEL_SDK_DISABLED=true` or
/// `OTEL_TRACES_EXPORTER=none` says otherwise without a file.
pub fn resolve(
    file: Option<(&Path, &str)>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<TraceSettings>, TracingConfigError> {
    let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    let from_file = file.map(|(path, text)| read_file(path, text)).transpose()?;
    let traces_endpoint = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let base_endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT");
    let switched_off = env("OTEL_SDK_DISABLED")
        .map(|value| boolean("OTEL_SDK_DISABLED", &value))
        .transpose()?
        == Some(true)
        || env("OTEL_TRACES_EXPORTER")
            .map(|value| exporter(&value))
            .transpose()?
            == Some(Exporter::None);
    if from_file.is_none()
        && (switched_off || (traces_endpoint.is_none() && base_endpoint.is_none()))
    {
        return Ok(None);
    }

    // A signal's own variable wins over the general one.
    let pick = |specific: &'static str, general: &'static str| {
        env(specific)
            .map(|value| (specific, value))
            .or_else(|| env(general).map(|value| (general, value)))
    };
    let (protocol, target) = match &from_file {
        // kube-apiserver's exporter: OTLP/gRPC in plain text.
        Some(file) => {
            let origin = format!("--tracing-config-file {}", file.path);
            (Protocol::Grpc, file_target(&origin, &file.endpoint)?)
        }
        None => {
            let protocol = match pick(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ) {
                Some((variable, value)) => protocol(variable, &value)?,
                None => Protocol::HttpProtobuf,
            };
            let insecure = match pick(
                "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
                "OTEL_EXPORTER_OTLP_INSECURE",
            ) {
                Some((variable, value)) => boolean(variable, &value)?,
                None => false,
            };
            let target = match (protocol, traces_endpoint, base_endpoint) {
                (Protocol::Grpc, Some(url), _) => {
                    grpc_target("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url, insecure)?
                }
                (Protocol::Grpc, None, Some(url)) => {
                    grpc_target("OTEL_EXPORTER_OTLP_ENDPOINT", &url, insecure)?
                }
                (Protocol::Grpc, None, None) => {
                    grpc_target("default", DEFAULT_GRPC_ENDPOINT, insecure)?
                }
                // A signal's own variable is the URL as it is; the base gets the signal's path.
                (Protocol::HttpProtobuf, Some(url), _) => {
                    http_target("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url, url.trim())?
                }
                (Protocol::HttpProtobuf, None, base) => {
                    let base = base.unwrap_or_else(|| DEFAULT_HTTP_ENDPOINT.to_string());
                    let url = format!("{}/v1/traces", base.trim().trim_end_matches('/'));
                    http_target("OTEL_EXPORTER_OTLP_ENDPOINT", &base, &url)?
                }
            };
            (protocol, target)
        }
    };
    let tls = if target.tls {
        let identity = match (
            pick(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            ),
            pick(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            ),
        ) {
            (Some((_, certificate)), Some((_, key))) => {
                Some((PathBuf::from(certificate.trim()), PathBuf::from(key.trim())))
            }
            (Some((first, _)), None) => {
                return Err(TracingConfigError::HalfIdentity {
                    first,
                    second: "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                });
            }
            (None, Some((first, _))) => {
                return Err(TracingConfigError::HalfIdentity {
                    first,
                    second: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                });
            }
            (None, None) => None,
        };
        Some(Tls {
            roots: pick(
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
            )
            .map(|(_, path)| PathBuf::from(path.trim())),
            identity,
        })
    } else {
        None
    };
    let headers = match pick(
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ) {
        Some((variable, value)) => headers(variable, &value)?,
        None => Headers::default(),
    };
    let compression = match pick(
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ) {
        Some((variable, value)) => compression(variable, &value)?,
        None => Compression::None,
    };
    let sampling = match &from_file {
        // kube-apiserver's rule: a root is kept at the given rate, never without one; a span
        // with a parent follows its parent.
        Some(file) => Sampling {
            ratio: file.sampling_per_million as f64 / 1_000_000.0,
            parent_based: true,
        },
        None => sampler(&env)?,
    };

    let mut service_name = env("OTEL_SERVICE_NAME").map(|s| s.trim().to_string());
    let mut resource = Vec::new();
    if let Some(value) = env("OTEL_RESOURCE_ATTRIBUTES") {
        for (key, val) in resource_attributes(&value)? {
            if key == "service.name" {
                service_name.get_or_insert(val);
            } else {
                resource.push((key, val));
            }
        }
    }

    let export_timeout = match pick(
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ) {
        Some((variable, value)) => millis(variable, &value)?,
        None => Duration::from_secs(10),
    };
    Ok(Some(TraceSettings {
        endpoint: target.endpoint,
        collector: target.collector,
        tls,
        headers,
        compression,
        propagators: match env("OTEL_PROPAGATORS") {
            Some(value) => propagators(&value)?,
            None => Propagators::default(),
        },
        protocol,
        sampling,
        service_name,
        resource,
        export_timeout,
        batching: batching(&env)?,
    }))
}

struct FileSettings {
    path: String,
    endpoint: String,
    sampling_per_million: i64,
}

fn read_file(path: &Path, text: &str) -> Result<FileSettings, TracingConfigError> {
    let shown = path.display().to_string();
    let file_error = |reason: String| TracingConfigError::File {
        path: shown.clone(),
        reason,
    };
    let parsed: TracingFile =
        serde_saphyr::from_str(text).map_err(|err| file_error(err.to_string()))?;
    match parsed.kind.as_deref() {
        Some("TracingConfiguration") => {}
        Some(other) => {
            return Err(file_error(format!(
                "kind {other:?} is not TracingConfiguration"
            )));
        }
        None => {
            return Err(file_error(
                "kind is missing (TracingConfiguration)".to_string(),
            ));
        }
    }
    match parsed.api_version.as_deref() {
        Some(version) if API_VERSIONS.contains(&version) => {}
        Some(other) => {
            return Err(file_error(format!(
                "apiVersion {other:?} is not one of {}",
                API_VERSIONS.join(", ")
            )));
        }
        None => return Err(file_error("apiVersion is missing".to_string())),
    }
    let sampling_per_million = parsed.sampling_rate_per_million.unwrap_or(0);
    if !(0..=1_000_000).contains(&sampling_per_million) {
        return Err(TracingConfigError::SamplingRate {
            path: shown,
            value: sampling_per_million,
        });
    }
    Ok(FileSettings {
        endpoint: parsed
            .endpoint
            .unwrap_or_else(|| DEFAULT_FILE_ENDPOINT.to_string()),
        path: shown,
        sampling_per_million,
    })
}

fn endpoint_error(source: &str, value: &str, reason: impl Into<String>) -> TracingConfigError {
    TracingConfigError::Endpoint {
        origin: source.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Where spans are sent and how.
struct Target {
    endpoint: http::Uri,
    collector: Collector,
    tls: bool,
}

/// The `:authority` of gRPC requests to `collector`.
fn grpc_authority(
    source: &str,
    value: &str,
    collector: &Collector,
) -> Result<http::Uri, TracingConfigError> {
    let text = match collector {
        Collector::Tcp { host, port } if host.contains(':') => format!("http://[{host}]:{port}"),
        Collector::Tcp { host, port } => format!("http://{host}:{port}"),
        Collector::Unix(_) | Collector::UnixAbstract(_) => "http://localhost".to_string(),
    };
    text.parse()
        .map_err(|_| endpoint_error(source, value, "not a host name or address"))
}

/// A `TracingConfiguration`'s endpoint: a gRPC target, taken where kube-apiserver takes it.
fn file_target(source: &str, value: &str) -> Result<Target, TracingConfigError> {
    endpoint::kube_validates(value).map_err(|reason| endpoint_error(source, value, reason))?;
    let collector =
        endpoint::grpc_target(value).map_err(|reason| endpoint_error(source, value, reason))?;
    Ok(Target {
        endpoint: grpc_authority(source, value, &collector)?,
        collector,
        tls: false,
    })
}

/// An OTLP/gRPC endpoint variable: `http://` plain text, `https://` TLS; without a scheme,
/// TLS unless `OTEL_EXPORTER_OTLP_INSECURE` is true (the specification's rule). The path is
/// not used; the port is 4317 when none is given.
fn grpc_target(source: &str, value: &str, insecure: bool) -> Result<Target, TracingConfigError> {
    let value = value.trim();
    let (url, tls) = if value.contains("://") {
        let url = parse_url(source, value, value)?;
        let tls = url.scheme_str() == Some("https");
        (url, tls)
    } else {
        (
            parse_url(source, value, &format!("http://{value}"))?,
            !insecure,
        )
    };
    let collector = tcp_collector(&url, DEFAULT_GRPC_PORT);
    Ok(Target {
        endpoint: grpc_authority(source, value, &collector)?,
        collector,
        tls,
    })
}

/// An OTLP/HTTP endpoint: the URL spans are posted to, `http://` or `https://`.
fn http_target(source: &str, shown: &str, url: &str) -> Result<Target, TracingConfigError> {
    let endpoint = parse_url(source, shown, url)?;
    let tls = endpoint.scheme_str() == Some("https");
    let collector = tcp_collector(&endpoint, if tls { 443 } else { 80 });
    Ok(Target {
        endpoint,
        collector,
        tls,
    })
}

fn tcp_collector(url: &http::Uri, default_port: u16) -> Collector {
    let host = url.host().unwrap_or("localhost");
    Collector::Tcp {
        // An IPv6 address without its brackets.
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port: url.port_u16().unwrap_or(default_port),
    }
}

fn parse_url(source: &str, shown: &str, url: &str) -> Result<http::Uri, TracingConfigError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| endpoint_error(source, shown, "not a URL or host:port"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(endpoint_error(
            source,
            shown,
            "the scheme must be http or https",
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(endpoint_error(source, shown, "no host"));
    }
    Ok(uri)
}

/// A boolean variable: `true` or `false` in any case; anything else is refused rather than
/// read as false.
fn boolean(variable: &'static str, value: &str) -> Result<bool, TracingConfigError> {
    match enum_value(value).as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(TracingConfigError::Variable {
            variable,
            value: value.to_string(),
            reason: "must be true or false",
        }),
    }
}

/// `OTEL_PROPAGATORS`: `tracecontext`, `baggage`, or `none`; the others the specification
/// names (`b3`, `jaeger`, `xray`, ...) are refused rather than silently not sent.
fn propagators(value: &str) -> Result<Propagators, TracingConfigError> {
    let mut chosen = Propagators {
        trace_context: false,
        baggage: false,
    };
    for name in value.split(',').map(enum_value) {
        match name.as_str() {
            "tracecontext" => chosen.trace_context = true,
            "baggage" => chosen.baggage = true,
            "none" | "" => {}
            _ => {
                return Err(TracingConfigError::Variable {
                    variable: "OTEL_PROPAGATORS",
                    value: value.to_string(),
                    reason: "unsupported propagator; use tracecontext, baggage or none",
                });
            }
        }
    }
    Ok(chosen)
}

fn compression(variable: &'static str, value: &str) -> Result<Compression, TracingConfigError> {
    match enum_value(value).as_str() {
        "gzip" => Ok(Compression::Gzip),
        "none" => Ok(Compression::None),
        _ => Err(TracingConfigError::Variable {
            variable,
            value: value.to_string(),
            reason: "use gzip or none",
        }),
    }
}

/// Headers that belong to the protocol: set by the exporter, never by the operator.
const RESERVED_HEADERS: &[&str] = &[
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "host",
    "te",
    "transfer-encoding",
    "user-agent",
];

/// `name=value,name2=value2`, values percent-encoded (W3C Baggage's octets), as the
/// specification reads `OTEL_EXPORTER_OTLP_HEADERS`. Errors name the header, never a value.
fn headers(variable: &'static str, value: &str) -> Result<Headers, TracingConfigError> {
    let bad = |reason: String| TracingConfigError::Secret { variable, reason };
    let mut headers = Vec::new();
    for pair in value.split(',').filter(|pair| !pair.trim().is_empty()) {
        let Some((name, raw)) = pair.split_once('=') else {
            return Err(bad(
                "expected name=value pairs separated by commas".to_string()
            ));
        };
        let name = name.trim();
        let header = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| bad(format!("{name:?} is not a header name")))?;
        if RESERVED_HEADERS.contains(&header.as_str()) || header.as_str().starts_with("grpc-") {
            return Err(bad(format!("{header} is set by the exporter itself")));
        }
        let decoded = percent_decode(raw.trim())
            .ok_or_else(|| bad(format!("the value of {header} has a bad percent escape")))?;
        let mut value = http::HeaderValue::from_str(&decoded)
            .map_err(|_| bad(format!("the value of {header} is not a valid header value")))?;
        value.set_sensitive(true);
        headers.push((header, value));
    }
    Ok(Headers(headers))
}

/// An enumerated value as the OpenTelemetry specification reads it: case-insensitively.
fn enum_value(value: &str) -> String {
    value.trim().to_ascii_lowercase()
}

/// What `OTEL_TRACES_EXPORTER` may ask for here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exporter {
    Otlp,
    None,
}

/// `OTEL_TRACES_EXPORTER`: `otlp` (the default) or `none`; any other exporter (`console`,
/// `zipkin`, …) is refused rather than quietly replaced by OTLP. A list (the specification
/// allows several) may name `otlp` and `none` only.
fn exporter(value: &str) -> Result<Exporter, TracingConfigError> {
    let mut chosen = None;
    for name in value.split(',').map(enum_value) {
        match name.as_str() {
            "otlp" => chosen = Some(chosen.unwrap_or(Exporter::Otlp)),
            "none" => chosen = Some(Exporter::None),
            _ => {
                return Err(TracingConfigError::Variable {
                    variable: "OTEL_TRACES_EXPORTER",
                    value: value.to_string(),
                    reason: "unsupported exporter; use otlp or none",
                });
            }
        }
    }
    Ok(chosen.unwrap_or(Exporter::Otlp))
}

fn protocol(variable: &'static str, value: &str) -> Result<Protocol, TracingConfigError> {
    match enum_value(value).as_str() {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        "http/json" => Err(TracingConfigError::Variable {
            variable,
            value: value.to_string(),
            reason: "http/json is not supported; use grpc or http/protobuf",
        }),
        _ => Err(TracingConfigError::Variable {
            variable,
            value: value.to_string(),
            reason: "unknown protocol; use grpc or http/protobuf",
        }),
    }
}

fn sampler(env: &impl Fn(&str) -> Option<String>) -> Result<Sampling, TracingConfigError> {
    let ratio = || -> Result<f64, TracingConfigError> {
        match env("OTEL_TRACES_SAMPLER_ARG") {
            None => Ok(1.0),
            Some(value) => match value.trim().parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
                _ => Err(TracingConfigError::Variable {
                    variable: "OTEL_TRACES_SAMPLER_ARG",
                    value,
                    reason: "must be a number between 0 and 1",
                }),
            },
        }
    };
    let Some(value) = env("OTEL_TRACES_SAMPLER") else {
        return Ok(Sampling {
            ratio: 1.0,
            parent_based: true,
        });
    };
    let (ratio, parent_based) = match enum_value(&value).as_str() {
        "always_on" => (1.0, false),
        "always_off" => (0.0, false),
        "traceidratio" => (ratio()?, false),
        "parentbased_always_on" => (1.0, true),
        "parentbased_always_off" => (0.0, true),
        "parentbased_traceidratio" => (ratio()?, true),
        _ => {
            return Err(TracingConfigError::Variable {
                variable: "OTEL_TRACES_SAMPLER",
                value,
                reason: "unknown sampler; use always_on, always_off, traceidratio or their parentbased_ forms",
            });
        }
    };
    Ok(Sampling {
        ratio,
        parent_based,
    })
}

/// `key1=value1,key2=value2`, values percent-encoded (W3C Baggage's octets).
fn resource_attributes(value: &str) -> Result<Vec<(String, String)>, TracingConfigError> {
    let bad = |reason| TracingConfigError::Variable {
        variable: "OTEL_RESOURCE_ATTRIBUTES",
        value: value.to_string(),
        reason,
    };
    value
        .split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (key, val) = pair
                .split_once('=')
                .ok_or_else(|| bad("expected key=value pairs separated by commas"))?;
            let key = key.trim();
            if key.is_empty() {
                return Err(bad("a key is empty"));
            }
            let val = percent_decode(val.trim())
                .ok_or_else(|| bad("a value has a bad percent escape"))?;
            Ok((key.to_string(), val))
        })
        .collect()
}

fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn millis(variable: &'static str, value: &str) -> Result<Duration, TracingConfigError> {
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 && ms <= 600_000 => Ok(Duration::from_millis(ms)),
        _ => Err(TracingConfigError::Variable {
            variable,
            value: value.to_string(),
            reason: "must be whole milliseconds between 1 and 600000",
        }),
    }
}

fn batching(env: &impl Fn(&str) -> Option<String>) -> Result<Batching, TracingConfigError> {
    let mut batching = Batching::default();
    let count = |variable: &'static str, default: usize| -> Result<usize, TracingConfigError> {
        match env(variable) {
            None => Ok(default),
            Some(value) => match value.trim().parse::<usize>() {
                Ok(n) if n > 0 && n <= MAX_QUEUE => Ok(n),
                _ => Err(TracingConfigError::Variable {
                    variable,
                    value,
                    reason: "must be a count between 1 and 65536",
                }),
            },
        }
    };
    batching.max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", batching.max_queue)?;
    batching.max_batch =
        count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", batching.max_batch)?.min(batching.max_queue);
    if let Some(value) = env("OTEL_BSP_SCHEDULE_DELAY") {
        batching.delay = millis("OTEL_BSP_SCHEDULE_DELAY", &value)?;
    }
    if let Some(value) = env("OTEL_BSP_EXPORT_TIMEOUT") {
        batching.timeout = millis("OTEL_BSP_EXPORT_TIMEOUT", &value)?;
    }
    Ok(batching)
}

#[cfg(test)]
mod tests;
