//! The CSI node-driver-registrar: registers a CSI driver with the kubelet's plugin watcher.
//!
//! * [`config`]: flags (upstream's names, defaults and Go syntax) and their validation.
//! * [`paths`]: the endpoint handed to kubelet and the registration socket's name.
//! * [`driver`]: the driver's name, waited for at start-up.
//! * [`service`]: the `pluginregistration.Registration` service.
//! * [`socket`], [`server`]: the registration socket and its gRPC server, generic over streams.
//! * [`health`]: the `/healthz` self-check.
//! * [`run`]: the whole life of the registrar.

pub mod config;
pub mod driver;
pub mod entry;
pub mod health;
pub mod paths;
pub mod run;
pub mod server;
pub mod service;
pub mod socket;

/// The version `--version` prints.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
