//! The two paths the registrar deals in: the driver socket path it hands to kubelet
//! (`--kubelet-registration-path`), and its own registration socket
//! `<--plugin-registration-path>/<driver>-reg.sock`.
//!
//! Kubelet dials the registered endpoint verbatim as an AF_UNIX path (`net.Dial("unix", endpoint)`,
//! on Windows too), so anything but a plain absolute host path registers fine and then makes every
//! CSI call from kubelet fail. Those forms are refused at start-up instead.

use std::path::{Path, PathBuf};

use sidecar_kit::driver::endpoint::Platform;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error(
        "--kubelet-registration-path={given:?} is a gRPC target, but kubelet dials this value as a plain socket path; pass --kubelet-registration-path={plain}"
    )]
    Scheme { given: String, plain: String },
    #[error(
        "--kubelet-registration-path={given:?} is a named pipe, but kubelet reaches CSI drivers over unix domain sockets only; let the driver listen on a socket such as C:\\var\\lib\\kubelet\\plugins\\<driver>\\csi.sock and pass that path"
    )]
    NamedPipe { given: String },
    #[error(
        "--kubelet-registration-path={given:?} must be the absolute path of the driver socket on the host, such as /var/lib/kubelet/plugins/<driver>/csi.sock"
    )]
    NotAbsolute { given: String },
    #[error(
        "--kubelet-registration-path={given:?} must be an absolute Windows path with a drive letter, as kubelet on the host dials it, such as C:\\var\\lib\\kubelet\\plugins\\<driver>\\csi.sock"
    )]
    NotAbsoluteWindows { given: String },
    #[error("driver name {0:?} cannot name a registration socket: it contains a path separator")]
    DriverName(String),
}

/// Checks `--kubelet-registration-path` against what kubelet on `platform` can dial.
pub fn validate_kubelet_registration_path(
    given: &str,
    platform: Platform,
) -> Result<(), PathError> {
    let lower = given.to_ascii_lowercase();
    if lower.starts_with("npipe:")
        || given.starts_with(r"\\.\pipe\")
        || given.starts_with("//./pipe/")
    {
        return Err(PathError::NamedPipe {
            given: given.to_string(),
        });
    }
    if let Some(rest) = given
        .strip_prefix("unix://")
        .or_else(|| given.strip_prefix("unix:"))
    {
        let plain = match platform {
            // `unix:///C:/x` names `C:/x`.
            Platform::Windows if is_drive_absolute(rest.trim_start_matches('/')) => {
                rest.trim_start_matches('/').to_string()
            }
            _ => rest.to_string(),
        };
        return Err(PathError::Scheme {
            given: given.to_string(),
            plain,
        });
    }
    let absolute = match platform {
        Platform::Unix => given.starts_with('/'),
        Platform::Windows => is_drive_absolute(given),
    };
    match (absolute, platform) {
        (true, _) => Ok(()),
        (false, Platform::Unix) => Err(PathError::NotAbsolute {
            given: given.to_string(),
        }),
        (false, Platform::Windows) => Err(PathError::NotAbsoluteWindows {
            given: given.to_string(),
        }),
    }
}

/// `C:\x` or `C:/x`. A path without a drive (`\var\lib\...`) resolves against kubelet's current
/// drive, and kubelet rejects it with "A socket operation was attempted to an unreachable network".
fn is_drive_absolute(path: &str) -> bool {
    matches!(path.as_bytes(), [drive, b':', b'\\' | b'/', ..] if drive.is_ascii_alphabetic())
}

/// The registration socket of `driver` in `dir`: `<dir>/<driver>-reg.sock`, the name kubelet's
/// plugin watcher and upstream's registrar use.
pub fn registration_socket_path(dir: &Path, driver: &str) -> Result<PathBuf, PathError> {
    if driver.contains(['/', '\\', '\0']) {
        return Err(PathError::DriverName(driver.to_string()));
    }
    Ok(dir.join(format!("{driver}-reg.sock")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_paths() {
        let ok = ["/var/lib/kubelet/plugins/d/csi.sock", "/csi.sock"];
        for path in ok {
            assert_eq!(
                validate_kubelet_registration_path(path, Platform::Unix),
                Ok(()),
                "{path}"
            );
        }
        assert_eq!(
            validate_kubelet_registration_path("unix:///var/lib/d/csi.sock", Platform::Unix),
            Err(PathError::Scheme {
                given: "unix:///var/lib/d/csi.sock".into(),
                plain: "/var/lib/d/csi.sock".into()
            })
        );
        assert!(matches!(
            validate_kubelet_registration_path("unix:/var/lib/d/csi.sock", Platform::Unix),
            Err(PathError::Scheme { plain, .. }) if plain == "/var/lib/d/csi.sock"
        ));
        for bad in ["csi.sock", "var/lib/csi.sock", r"C:\var\lib\csi.sock", ""] {
            assert!(
                matches!(
                    validate_kubelet_registration_path(bad, Platform::Unix),
                    Err(PathError::NotAbsolute { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn windows_paths() {
        let ok = [
            r"C:\var\lib\kubelet\plugins\smb.csi.k8s.io\csi.sock",
            "C:/var/lib/kubelet/plugins/d/csi.sock",
            r"d:\csi.sock",
        ];
        for path in ok {
            assert_eq!(
                validate_kubelet_registration_path(path, Platform::Windows),
                Ok(()),
                "{path}"
            );
        }
        assert_eq!(
            validate_kubelet_registration_path(r"unix://C:\csi\csi.sock", Platform::Windows),
            Err(PathError::Scheme {
                given: r"unix://C:\csi\csi.sock".into(),
                plain: r"C:\csi\csi.sock".into()
            })
        );
        assert!(matches!(
            validate_kubelet_registration_path("unix:///C:/csi/csi.sock", Platform::Windows),
            Err(PathError::Scheme { plain, .. }) if plain == "C:/csi/csi.sock"
        ));
        for bad in [
            r"\var\lib\kubelet\plugins\d\csi.sock",
            "/var/lib/kubelet/plugins/d/csi.sock",
            r"var\lib\csi.sock",
            r"\\server\share\csi.sock",
            "C:csi.sock",
        ] {
            assert!(
                matches!(
                    validate_kubelet_registration_path(bad, Platform::Windows),
                    Err(PathError::NotAbsoluteWindows { .. })
                ),
                "{bad}"
            );
        }
        for pipe in [r"\\.\pipe\csi", "npipe://./pipe/csi", "//./pipe/csi"] {
            assert!(
                matches!(
                    validate_kubelet_registration_path(pipe, Platform::Windows),
                    Err(PathError::NamedPipe { .. })
                ),
                "{pipe}"
            );
        }
    }

    #[test]
    fn messages_say_what_to_pass() {
        let err = validate_kubelet_registration_path(r"unix://C:\csi\csi.sock", Platform::Windows)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(r"pass --kubelet-registration-path=C:\csi\csi.sock"),
            "{err}"
        );
        let err = validate_kubelet_registration_path(r"\var\lib\csi.sock", Platform::Windows)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(r"C:\var\lib\kubelet\plugins\<driver>\csi.sock"),
            "{err}"
        );
    }

    #[test]
    fn socket_names() {
        assert_eq!(
            registration_socket_path(Path::new("/registration"), "hostpath.csi.k8s.io").unwrap(),
            PathBuf::from("/registration/hostpath.csi.k8s.io-reg.sock")
        );
        assert!(registration_socket_path(Path::new("/r"), "a/b").is_err());
        assert!(registration_socket_path(Path::new("/r"), r"a\b").is_err());
    }
}
