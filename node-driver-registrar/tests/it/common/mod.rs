//! Shared by the integration tests; not every test file uses every helper.

pub mod kubelet;
pub mod process;

use testkit::mockdriver::{MockDriver, MockHandle};

use process::Dirs;

pub const DRIVER: &str = "registrar.test.csi.k8s.io";
pub const NODE_ID: &str = "node-1";

/// The mock CSI driver, listening where `dirs` says the driver socket is.
#[cfg(unix)]
pub async fn start_driver(dirs: &Dirs) -> MockHandle {
    MockDriver::builder()
        .driver_name(DRIVER)
        .node_id(NODE_ID)
        .serve_unix(dirs.driver_socket())
        .await
        .expect("the mock driver serves")
}

/// The mock CSI driver on a named pipe (the mock serves no AF_UNIX sockets on Windows).
#[cfg(windows)]
pub async fn start_driver(dirs: &Dirs) -> MockHandle {
    let name = format!(
        r"\\.\pipe\registrar-test-{}",
        dirs.root
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    MockDriver::builder()
        .driver_name(DRIVER)
        .node_id(NODE_ID)
        .serve_named_pipe(&name)
        .await
        .expect("the mock driver serves")
}

/// Whether this system can serve AF_UNIX sockets: always on unix; on Windows from 10 1803 on, but
/// not under Wine, where only the tests that need no registration socket can run.
pub async fn af_unix_available() -> bool {
    #[cfg(windows)]
    {
        let dir = tempfile::tempdir().expect("a temp dir");
        match sidecar_kit::driver::windows::UnixListener::bind(&dir.path().join("probe.sock")) {
            Ok(_) => true,
            Err(err) => {
                eprintln!("skipped: this system has no AF_UNIX sockets ({err})");
                false
            }
        }
    }
    #[cfg(not(windows))]
    true
}

/// Ends the test early where the registration socket cannot exist (Wine).
#[macro_export]
macro_rules! require_af_unix {
    () => {
        if !$crate::common::af_unix_available().await {
            return;
        }
    };
}
