//! Text forms of the mock's settings, as the `csi-mock-driver` flags take
//! them: endpoints, method names, durations, status codes, fault and
//! latency rules, topology segments and byte sizes.

use std::path::PathBuf;
use std::time::Duration;

use csi_proto::methods;
use tonic::Code;

use super::config::Segment;
use super::inject::Faults;

/// A flag value that does not parse; the message says what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(String);

fn error<T>(message: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError(message.into()))
}

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A unix domain socket.
    Unix(PathBuf),
    /// A Windows named pipe, `\\.\pipe\NAME`.
    NamedPipe(String),
}

/// Parses `unix:///path`, `unix:/path`, a bare path, or `\\.\pipe\NAME`.
pub fn parse_endpoint(text: &str) -> Result<Listen, SpecError> {
    const PIPE_PREFIX: &str = r"\\.\pipe\";
    if text
        .get(..PIPE_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(PIPE_PREFIX))
    {
        if text.len() == PIPE_PREFIX.len() {
            return error(format!("endpoint {text:?}: the pipe needs a name"));
        }
        return Ok(Listen::NamedPipe(text.to_owned()));
    }
    let path = text
        .strip_prefix("unix://")
        .or_else(|| text.strip_prefix("unix:"))
        .unwrap_or(text);
    if path.is_empty() {
        return error(format!("endpoint {text:?}: the socket path is empty"));
    }
    if text.contains("://") && !text.starts_with("unix://") {
        return error(format!(
            "endpoint {text:?}: expected unix://PATH, a path or \\\\.\\pipe\\NAME"
        ));
    }
    Ok(Listen::Unix(PathBuf::from(path)))
}

/// Every method the mock serves.
fn all_methods() -> impl Iterator<Item = &'static str> {
    methods::identity::ALL
        .iter()
        .chain(methods::controller::ALL)
        .chain(methods::node::ALL)
        .copied()
}

/// Resolves a full path (`/csi.v1.Controller/CreateVolume`) or a method
/// name (`CreateVolume`) to the full path.
pub fn resolve_method(name: &str) -> Result<&'static str, SpecError> {
    all_methods()
        .find(|path| {
            *path == name
                || path
                    .rsplit_once('/')
                    .is_some_and(|(_, method)| method == name)
        })
        .map_or_else(|| error(format!("unknown CSI method {name:?}")), Ok)
}

/// Parses a duration: a number and a unit among `ns`, `us`, `ms`, `s`,
/// `m`, `h` (`250ms`, `1.5s`); a bare `0` is zero.
pub fn parse_duration(text: &str) -> Result<Duration, SpecError> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text.find(char::is_alphabetic).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return error(format!(
                "duration {text:?}: expected a unit among ns, us, ms, s, m, h"
            ));
        }
    };
    number
        .parse::<f64>()
        .ok()
        .and_then(|n| Duration::try_from_secs_f64(n * scale).ok())
        .map_or_else(
            || error(format!("duration {text:?} is not a valid duration")),
            Ok,
        )
}

const CODES: [(&str, Code); 16] = [
    ("CANCELLED", Code::Cancelled),
    ("UNKNOWN", Code::Unknown),
    ("INVALID_ARGUMENT", Code::InvalidArgument),
    ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
    ("NOT_FOUND", Code::NotFound),
    ("ALREADY_EXISTS", Code::AlreadyExists),
    ("PERMISSION_DENIED", Code::PermissionDenied),
    ("RESOURCE_EXHAUSTED", Code::ResourceExhausted),
    ("FAILED_PRECONDITION", Code::FailedPrecondition),
    ("ABORTED", Code::Aborted),
    ("OUT_OF_RANGE", Code::OutOfRange),
    ("UNIMPLEMENTED", Code::Unimplemented),
    ("INTERNAL", Code::Internal),
    ("UNAVAILABLE", Code::Unavailable),
    ("DATA_LOSS", Code::DataLoss),
    ("UNAUTHENTICATED", Code::Unauthenticated),
];

/// Parses an error status code by name (`RESOURCE_EXHAUSTED`,
/// `ResourceExhausted`, case-insensitive) or number (`8`). OK is not an
/// error and is refused.
pub fn parse_code(text: &str) -> Result<Code, SpecError> {
    if let Ok(number) = text.parse::<i32>() {
        return match Code::from_i32(number) {
            Code::Ok => error(format!("status code {text:?}: OK is not an error")),
            // Unknown numbers map to UNKNOWN; accept only the real one.
            Code::Unknown if number != 2 => error(format!("status code {text:?} does not exist")),
            code => Ok(code),
        };
    }
    let mut normalized: String = text
        .chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_uppercase())
        .collect();
    // Go spells it with one L.
    if normalized == "CANCELED" {
        normalized = "CANCELLED".to_owned();
    }
    CODES
        .iter()
        .find(|(name, _)| name.replace('_', "") == normalized)
        .map(|(_, code)| *code)
        .map_or_else(|| error(format!("unknown status code {text:?}")), Ok)
}

fn split_rule<'a>(text: &'a str, form: &str) -> Result<(&'a str, &'a str), SpecError> {
    text.split_once('=')
        .ok_or_else(|| SpecError(format!("{text:?}: expected {form}")))
}

/// `--latency METHOD=DURATION`; METHOD `*` sets the default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyRule {
    /// `None`: every method without a latency of its own.
    pub method: Option<&'static str>,
    pub delay: Duration,
}

impl LatencyRule {
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let (method, delay) = split_rule(text, "METHOD=DURATION")?;
        Ok(Self {
            method: match method {
                "*" => None,
                name => Some(resolve_method(name)?),
            },
            delay: parse_duration(delay)?,
        })
    }

    pub fn apply(&self, faults: &Faults) {
        match self.method {
            Some(method) => faults.set_latency(method, self.delay),
            None => faults.set_default_latency(self.delay),
        }
    }
}

/// `--fail METHOD=CODE[:N]`: the first N calls of METHOD fail with CODE
/// (every call without N).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailRule {
    pub method: &'static str,
    pub code: Code,
    pub times: Option<u64>,
}

impl FailRule {
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let (method, rest) = split_rule(text, "METHOD=CODE[:N]")?;
        let (code, times) = match rest.split_once(':') {
            Some((code, n)) => match n.parse::<u64>() {
                Ok(n) if n > 0 => (code, Some(n)),
                _ => return error(format!("{text:?}: N must be a positive number")),
            },
            None => (rest, None),
        };
        Ok(Self {
            method: resolve_method(method)?,
            code: parse_code(code)?,
            times,
        })
    }

    pub fn apply(&self, faults: &Faults) {
        let message = format!("injected {:?} failure", self.code);
        match self.times {
            Some(n) => faults.fail_next(self.method, n, self.code, message),
            None => faults.fail_always(self.method, self.code, message),
        }
    }
}

/// Parses a topology segment `KEY=VALUE[,KEY=VALUE...]`.
pub fn parse_segment(text: &str) -> Result<Segment, SpecError> {
    text.split(',')
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => error(format!(
                "topology {text:?}: expected KEY=VALUE[,KEY=VALUE...]"
            )),
        })
        .collect()
}

/// Parses a byte count: a number with an optional binary (`Ki`, `Mi`,
/// `Gi`, `Ti`) or decimal (`k`, `M`, `G`, `T`) suffix, as Kubernetes
/// quantities write them.
pub fn parse_bytes(text: &str) -> Result<i64, SpecError> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let scale: i64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return error(format!("size {text:?}: unknown suffix {suffix:?}")),
    };
    number
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .map_or_else(
            || error(format!("size {text:?} is not a valid byte count")),
            Ok,
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("unix:///run/csi.sock").unwrap(),
            Listen::Unix("/run/csi.sock".into())
        );
        assert_eq!(
            parse_endpoint("unix:/run/csi.sock").unwrap(),
            Listen::Unix("/run/csi.sock".into())
        );
        assert_eq!(
            parse_endpoint("/run/csi.sock").unwrap(),
            Listen::Unix("/run/csi.sock".into())
        );
        assert_eq!(
            parse_endpoint(r"unix://C:\csi\csi.sock").unwrap(),
            Listen::Unix(r"C:\csi\csi.sock".into())
        );
        assert_eq!(
            parse_endpoint(r"\\.\pipe\mock").unwrap(),
            Listen::NamedPipe(r"\\.\pipe\mock".into())
        );
        assert!(parse_endpoint(r"\\.\pipe\").is_err());
        assert!(parse_endpoint("unix://").is_err());
        assert!(parse_endpoint("").is_err());
        assert!(parse_endpoint("tcp://127.0.0.1:1").is_err());
    }

    #[test]
    fn methods() {
        assert_eq!(
            resolve_method("CreateVolume").unwrap(),
            methods::controller::CREATE_VOLUME
        );
        assert_eq!(
            resolve_method("/csi.v1.Identity/Probe").unwrap(),
            methods::identity::PROBE
        );
        assert_eq!(
            resolve_method("NodeGetInfo").unwrap(),
            methods::node::NODE_GET_INFO
        );
        assert!(resolve_method("CreateVolumes").is_err());
        assert!(resolve_method("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("10µs").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "5", "ms", "-1s", "1x", "NaNs"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn codes() {
        assert_eq!(parse_code("UNAVAILABLE").unwrap(), Code::Unavailable);
        assert_eq!(
            parse_code("ResourceExhausted").unwrap(),
            Code::ResourceExhausted
        );
        assert_eq!(
            parse_code("failed_precondition").unwrap(),
            Code::FailedPrecondition
        );
        assert_eq!(parse_code("CANCELED").unwrap(), Code::Cancelled);
        assert_eq!(parse_code("4").unwrap(), Code::DeadlineExceeded);
        assert_eq!(parse_code("2").unwrap(), Code::Unknown);
        for bad in ["0", "OK", "17", "-1", "NOPE"] {
            assert!(parse_code(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rules() {
        assert_eq!(
            LatencyRule::parse("CreateVolume=100ms").unwrap(),
            LatencyRule {
                method: Some(methods::controller::CREATE_VOLUME),
                delay: Duration::from_millis(100)
            }
        );
        assert_eq!(LatencyRule::parse("*=1s").unwrap().method, None);
        assert!(LatencyRule::parse("CreateVolume").is_err());
        assert_eq!(
            FailRule::parse("Probe=FAILED_PRECONDITION").unwrap(),
            FailRule {
                method: methods::identity::PROBE,
                code: Code::FailedPrecondition,
                times: None
            }
        );
        assert_eq!(
            FailRule::parse("CreateVolume=UNAVAILABLE:3").unwrap().times,
            Some(3)
        );
        for bad in [
            "CreateVolume=UNAVAILABLE:0",
            "CreateVolume=OK",
            "Nope=ABORTED",
            "x",
        ] {
            assert!(FailRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn segments_and_sizes() {
        assert_eq!(
            parse_segment("topology.example.com/zone=z1,rack=r1").unwrap(),
            Segment::from([
                ("topology.example.com/zone".into(), "z1".into()),
                ("rack".into(), "r1".into())
            ])
        );
        assert!(parse_segment("zone").is_err());
        assert!(parse_segment("=z1").is_err());
        assert_eq!(parse_bytes("10Gi").unwrap(), 10 << 30);
        assert_eq!(parse_bytes("5G").unwrap(), 5_000_000_000);
        assert_eq!(parse_bytes("123").unwrap(), 123);
        for bad in ["", "Gi", "1Xi", "-1", "99999999999Ti"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
