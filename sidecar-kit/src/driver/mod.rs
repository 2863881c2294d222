//! The CSI driver's side: `--csi-address` (unix sockets, Windows named pipes and AF_UNIX), the gRPC
//! channel that ends the process when lost, timed calls, the identity service.

pub mod connection;
pub mod csi;
pub mod endpoint;
pub mod identity;
#[cfg(windows)]
pub mod windows;
