//! Where spans go and which are kept, from `--tracing-config-file` (the `TracingConfiguration`
//! file kube-apiserver and the kubelet take) and the standard `OTEL_*` environment variables.
//! Pure: the file's text and the environment come in as values.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The API versions kube-apiserver accepts for its tracing file.
const API_VERSIONS: &[&str] = &[
    "apiserver.config.k8s.io/v1",
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1alpha1",
];
/// kube-apiserver's default collector: OTLP/gRPC on the node.
const DEFAULT_FILE_ENDPOINT: &str = "localhost:4317";
/// The OTLP defaults for each protocol (OpenTelemetry's exporter specification).
const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";
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
        reason: &'static str,
    },
    #[error("{variable}={value:?}: {reason}")]
    Variable {
        variable: &'static str,
        value: String,
        reason: &'static str,
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

/// Everything the exporter needs; `None` from [`resolve`] means tracing is off.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSettings {
    /// For gRPC the server's URI (`http://host:port`); for HTTP the full URL spans are posted to.
    pub endpoint: http::Uri,
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
    let switched_off = env("OTEL_SDK_DISABLED").is_some_and(|v| enum_value(&v) == "true")
        || env("OTEL_TRACES_EXPORTER")
            .map(|value| exporter(&value))
            .transpose()?
            == Some(Exporter::None);
    if from_file.is_none()
        && (switched_off || (traces_endpoint.is_none() && base_endpoint.is_none()))
    {
        return Ok(None);
    }

    let (protocol, endpoint) = match &from_file {
        Some(file) => {
            let source = format!("--tracing-config-file {}", file.path);
            (Protocol::Grpc, grpc_endpoint(&source, &file.endpoint)?)
        }
        None => {
            let protocol = match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
                Some(value) => protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", &value)?,
                None => match env("OTEL_EXPORTER_OTLP_PROTOCOL") {
                    Some(value) => protocol("OTEL_EXPORTER_OTLP_PROTOCOL", &value)?,
                    None => Protocol::HttpProtobuf,
                },
            };
            let endpoint = match (protocol, traces_endpoint, base_endpoint) {
                (Protocol::Grpc, Some(url), _) => {
                    grpc_endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url)?
                }
                (Protocol::Grpc, None, Some(url)) => {
                    grpc_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", &url)?
                }
                (Protocol::Grpc, None, None) => grpc_endpoint("default", DEFAULT_GRPC_ENDPOINT)?,
                // A signal's own variable is the URL as it is; the base gets the signal's path.
                (Protocol::HttpProtobuf, Some(url), _) => {
                    http_endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url)?
                }
                (Protocol::HttpProtobuf, None, base) => {
                    let base = base.unwrap_or_else(|| DEFAULT_HTTP_ENDPOINT.to_string());
                    let url = format!("{}/v1/traces", base.trim().trim_end_matches('/'));
                    parse_url("OTEL_EXPORTER_OTLP_ENDPOINT", &base, &url)?
                }
            };
            (protocol, endpoint)
        }
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

    let export_timeout = match env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
        Some(value) => millis("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", &value)?,
        None => match env("OTEL_EXPORTER_OTLP_TIMEOUT") {
            Some(value) => millis("OTEL_EXPORTER_OTLP_TIMEOUT", &value)?,
            None => Duration::from_secs(10),
        },
    };
    Ok(Some(TraceSettings {
        endpoint,
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

fn endpoint_error(source: &str, value: &str, reason: &'static str) -> TracingConfigError {
    TracingConfigError::Endpoint {
        origin: source.to_string(),
        value: value.to_string(),
        reason,
    }
}

/// A gRPC collector's address: `host:port` (kube-apiserver's form) or `http://host:port`.
fn grpc_endpoint(source: &str, value: &str) -> Result<http::Uri, TracingConfigError> {
    let value = value.trim();
    let with_scheme = if value.contains("://") {
        value.to_string()
    } else {
        format!("http://{value}")
    };
    let uri = parse_url(source, value, &with_scheme)?;
    if uri.port_u16().is_none() {
        return Err(endpoint_error(source, value, "no port (host:port)"));
    }
    Ok(uri)
}

fn http_endpoint(source: &str, value: &str) -> Result<http::Uri, TracingConfigError> {
    parse_url(source, value, value.trim())
}

fn parse_url(source: &str, shown: &str, url: &str) -> Result<http::Uri, TracingConfigError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| endpoint_error(source, shown, "not a URL or host:port"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(endpoint_error(
                source,
                shown,
                "TLS to the collector is not supported; send to a collector agent on the node or in the pod over plain http",
            ));
        }
        _ => return Err(endpoint_error(source, shown, "the scheme must be http")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(endpoint_error(source, shown, "no host"));
    }
    Ok(uri)
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
