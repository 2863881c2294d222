//! What every CSI sidecar shares, in layers from the process down (the crate's README maps
//! them): the [`runtime`] a sidecar plugs into, the [`process`] and its flags, the CSI
//! [`driver`]'s connection, the Kubernetes [`cluster`]'s clients, the watch → index → queue →
//! worker [`pipeline`], plain [`values`], and the CSI [`migration`] of in-tree volumes.

/// The suite's version: every sidecar of it is released together.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod cluster;
pub mod driver;
pub mod migration;
pub mod pipeline;
pub mod process;
pub mod runtime;
pub mod telemetry;
pub mod values;
