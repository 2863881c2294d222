//! The CSI livenessprobe sidecar: serves the driver's Probe as an HTTP health check for the
//! kubelet, a drop-in replacement for upstream's livenessprobe.
//!
//! * [`flags`]: the command line and which servers it asks for.
//! * [`probe`]: one health check over a reused, socket-watching connection.
//! * [`socket`]: identity of the driver's socket file.
//! * [`server`]: start-up (wait for the driver, learn its name) and the HTTP servers.

pub mod entry;
pub mod flags;
pub mod probe;
pub mod server;
pub mod socket;

/// The version `--version` prints.
pub const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));
