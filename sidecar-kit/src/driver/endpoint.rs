//! CSI endpoint addresses, as upstream's `--csi-address` accepts them, plus Windows named pipes.
//!
//! | form                                    | meaning                         |
//! |-----------------------------------------|---------------------------------|
//! | `/run/csi/socket`                       | unix socket (absolute path)     |
//! | `unix:///run/csi/socket`, `unix:/path`  | unix socket                     |
//! | `unix://C:\csi\csi.sock`, `C:\csi\csi.sock`, `unix:/csi/csi.sock` | AF_UNIX on Windows |
//! | `\\.\pipe\csi`, `npipe://./pipe/csi`    | named pipe (Windows only)       |
//! | `dns:///host:port`, `tcp://host:port`   | TCP, as gRPC name resolution    |

use std::fmt;
use std::path::PathBuf;

/// The operating system whose address rules apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    Unix,
    Windows,
}

impl Platform {
    pub const fn current() -> Self {
        if cfg!(windows) {
            Self::Windows
        } else {
            Self::Unix
        }
    }
}

/// Where the CSI driver listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix domain socket (AF_UNIX, also on Windows).
    Unix(PathBuf),
    /// A Windows named pipe, as `\\.\pipe\name`.
    NamedPipe(String),
    /// A TCP `host:port`.
    Tcp(String),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::NamedPipe(name) => f.write_str(name),
            Self::Tcp(addr) => write!(f, "tcp://{addr}"),
        }
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("empty CSI address")]
    Empty,
    #[error("CSI address {0:?}: named pipes are only supported on Windows")]
    PipeNotSupported(String),
    #[error(
        "CSI address {0:?}: a named pipe must look like \\\\.\\pipe\\NAME or npipe://./pipe/NAME"
    )]
    BadPipe(String),
    #[error("CSI address {0:?}: the socket path must be absolute")]
    RelativePath(String),
    #[error(
        "CSI address {0:?}: expected an absolute socket path, unix://PATH, a named pipe or dns:///HOST:PORT"
    )]
    Unsupported(String),
}

/// Parses an address with this platform's rules.
pub fn parse(address: &str) -> Result<Endpoint, EndpointError> {
    parse_for(address, Platform::current())
}

/// Parses an address with the rules of `platform` (so both rule sets are testable anywhere).
pub fn parse_for(address: &str, platform: Platform) -> Result<Endpoint, EndpointError> {
    let address = address.trim();
    if address.is_empty() {
        return Err(EndpointError::Empty);
    }
    if let Some(pipe) = named_pipe(address) {
        let pipe = pipe.map_err(|_| EndpointError::BadPipe(address.to_string()))?;
        return match platform {
            Platform::Windows => Ok(Endpoint::NamedPipe(pipe)),
            Platform::Unix => Err(EndpointError::PipeNotSupported(address.to_string())),
        };
    }
    if let Some(rest) = address
        .strip_prefix("dns:///")
        .or_else(|| address.strip_prefix("tcp://"))
    {
        return tcp(rest).ok_or_else(|| EndpointError::Unsupported(address.to_string()));
    }
    let path = address
        .strip_prefix("unix://")
        .or_else(|| address.strip_prefix("unix:"))
        .unwrap_or(address);
    match platform {
        Platform::Unix if path.starts_with('/') => Ok(Endpoint::Unix(PathBuf::from(path))),
        Platform::Windows => {
            let path = windows_path(path);
            // A root-relative path (`unix:/csi/csi.sock`) names the current drive, as on Windows.
            if is_windows_absolute(&path) || path.starts_with('\\') {
                Ok(Endpoint::Unix(PathBuf::from(path)))
            } else {
                Err(EndpointError::RelativePath(address.to_string()))
            }
        }
        Platform::Unix if path.len() != address.len() => {
            Err(EndpointError::RelativePath(address.to_string()))
        }
        Platform::Unix => {
            tcp(address).ok_or_else(|| EndpointError::Unsupported(address.to_string()))
        }
    }
}

/// `Some` when the address is meant as a named pipe; the inner result says whether it is well formed.
fn named_pipe(address: &str) -> Option<Result<String, ()>> {
    let name = if let Some(rest) = address.strip_prefix("npipe://") {
        let rest = rest.trim_start_matches(['/', '\\']);
        rest.strip_prefix("./pipe/")
            .or_else(|| rest.strip_prefix(".\\pipe\\"))
    } else if address.starts_with(r"\\.\pipe\") || address.starts_with("//./pipe/") {
        Some(&address[9..])
    } else {
        return None;
    };
    Some(match name {
        Some(name) if !name.is_empty() => Ok(format!(r"\\.\pipe\{}", name.replace('/', "\\"))),
        _ => Err(()),
    })
}

fn tcp(host_port: &str) -> Option<Endpoint> {
    let (host, port) = host_port.rsplit_once(':')?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return None;
    }
    Some(Endpoint::Tcp(host_port.to_string()))
}

/// Normalises a Windows path written in a manifest: `/C:/x` or `C:/x` become `C:\x`, and
/// doubled backslashes (an unquoted `C:\\csi` in YAML) become single ones.
fn windows_path(path: &str) -> String {
    let path = match path.as_bytes() {
        [b'/', drive, b':', ..] if drive.is_ascii_alphabetic() => &path[1..],
        _ => path,
    };
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        let c = if c == '/' { '\\' } else { c };
        if !(c == '\\' && out.ends_with('\\')) {
            out.push(c);
        }
    }
    out
}

fn is_windows_absolute(path: &str) -> bool {
    matches!(path.as_bytes(), [drive, b':', b'\\', ..] if drive.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_rules() {
        let ok: &[(&str, Endpoint)] = &[
            ("/run/csi/socket", Endpoint::Unix("/run/csi/socket".into())),
            (
                "unix:///csi/csi.sock",
                Endpoint::Unix("/csi/csi.sock".into()),
            ),
            ("unix:/csi/csi.sock", Endpoint::Unix("/csi/csi.sock".into())),
            (
                "dns:///127.0.0.1:10000",
                Endpoint::Tcp("127.0.0.1:10000".into()),
            ),
            (
                "tcp://localhost:9000",
                Endpoint::Tcp("localhost:9000".into()),
            ),
            ("localhost:9000", Endpoint::Tcp("localhost:9000".into())),
        ];
        for (address, expected) in ok {
            assert_eq!(
                parse_for(address, Platform::Unix).as_ref(),
                Ok(expected),
                "{address}"
            );
        }
        assert_eq!(parse_for("", Platform::Unix), Err(EndpointError::Empty));
        assert!(matches!(
            parse_for(r"\\.\pipe\csi", Platform::Unix),
            Err(EndpointError::PipeNotSupported(_))
        ));
        assert!(matches!(
            parse_for("npipe://./pipe/csi", Platform::Unix),
            Err(EndpointError::PipeNotSupported(_))
        ));
        assert!(matches!(
            parse_for("unix://csi.sock", Platform::Unix),
            Err(EndpointError::RelativePath(_))
        ));
        assert!(matches!(
            parse_for("csi.sock", Platform::Unix),
            Err(EndpointError::Unsupported(_))
        ));
    }

    #[test]
    fn windows_rules() {
        let ok: &[(&str, Endpoint)] = &[
            (
                r"unix://C:\\csi\\csi.sock",
                Endpoint::Unix(r"C:\csi\csi.sock".into()),
            ),
            (
                r"unix://C:\csi\csi.sock",
                Endpoint::Unix(r"C:\csi\csi.sock".into()),
            ),
            (
                "unix:///C:/var/lib/kubelet/plugins/d/csi.sock",
                Endpoint::Unix(r"C:\var\lib\kubelet\plugins\d\csi.sock".into()),
            ),
            (
                r"C:\var\lib\kubelet\plugins_registry\d-reg.sock",
                Endpoint::Unix(r"C:\var\lib\kubelet\plugins_registry\d-reg.sock".into()),
            ),
            (
                r"\\.\pipe\csi-driver",
                Endpoint::NamedPipe(r"\\.\pipe\csi-driver".into()),
            ),
            (
                "//./pipe/csi-driver",
                Endpoint::NamedPipe(r"\\.\pipe\csi-driver".into()),
            ),
            (
                "npipe://./pipe/csi-driver",
                Endpoint::NamedPipe(r"\\.\pipe\csi-driver".into()),
            ),
            (
                "npipe:////./pipe/csi-driver",
                Endpoint::NamedPipe(r"\\.\pipe\csi-driver".into()),
            ),
        ];
        for (address, expected) in ok {
            assert_eq!(
                parse_for(address, Platform::Windows).as_ref(),
                Ok(expected),
                "{address}"
            );
        }
        assert_eq!(
            parse_for("unix:/csi/csi.sock", Platform::Windows),
            Ok(Endpoint::Unix(r"\csi\csi.sock".into()))
        );
        assert!(matches!(
            parse_for("unix://csi.sock", Platform::Windows),
            Err(EndpointError::RelativePath(_))
        ));
        assert!(matches!(
            parse_for(r"\\.\pipe\", Platform::Windows),
            Err(EndpointError::BadPipe(_))
        ));
        assert!(matches!(
            parse_for("npipe://./other/x", Platform::Windows),
            Err(EndpointError::BadPipe(_))
        ));
    }

    #[test]
    fn display_round_trips_unix() {
        let endpoint = parse_for("/csi/csi.sock", Platform::Unix).unwrap();
        assert_eq!(endpoint.to_string(), "unix:///csi/csi.sock");
        assert_eq!(
            parse_for(&endpoint.to_string(), Platform::Unix).unwrap(),
            endpoint
        );
    }
}
