//! CSI endpoint addresses (`--csi-address`) under both platforms' rules.
//!
//! Properties: parsing never panics; whatever parses renders (`Display`, as logged and as
//! dialled) to an address that parses back to the same endpoint; a unix socket path is
//! absolute for its platform; a named pipe is only accepted on Windows and always has the
//! `\\.\pipe\NAME` form with a non-empty name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecar_kit::driver::endpoint::{Endpoint, Platform, parse_for};

fuzz_target!(|address: &str| {
    for platform in [Platform::Unix, Platform::Windows] {
        let Ok(endpoint) = parse_for(address, platform) else {
            continue;
        };
        let rendered = endpoint.to_string();
        assert_eq!(
            parse_for(&rendered, platform).as_ref(),
            Ok(&endpoint),
            "{address:?} parsed to {endpoint:?}, rendered as {rendered:?} on {platform:?}"
        );
        match &endpoint {
            Endpoint::Unix(path) => {
                let path = path.to_string_lossy();
                match platform {
                    Platform::Unix => assert!(path.starts_with('/'), "{address:?}: {path:?}"),
                    Platform::Windows => assert!(
                        path.starts_with('\\')
                            || matches!(path.as_bytes(), [d, b':', b'\\', ..] if d.is_ascii_alphabetic()),
                        "{address:?}: {path:?}"
                    ),
                }
            }
            Endpoint::NamedPipe(name) => {
                assert_eq!(platform, Platform::Windows, "{address:?}");
                let rest = name.strip_prefix(r"\\.\pipe\").unwrap_or_default();
                assert!(
                    !rest.is_empty() && !rest.contains('/'),
                    "{address:?}: {name:?}"
                );
            }
            Endpoint::Tcp(host_port) => {
                let (host, port) = host_port.rsplit_once(':').unwrap_or_default();
                assert!(
                    !host.is_empty() && port.parse::<u16>().is_ok(),
                    "{address:?}"
                );
            }
        }
    }
});
