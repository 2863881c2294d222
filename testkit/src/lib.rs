//! Test kit for the CSI sidecars.

pub mod apiserver;
pub mod grpcgo;
#[cfg(unix)]
pub mod kubelet;
pub mod leaks;
pub mod measure;
pub mod mockdriver;
pub mod otlp;
pub mod pairs;
pub mod population;
pub mod process;
pub mod rng;
#[cfg(unix)]
pub mod sandbox;
pub mod tls;
