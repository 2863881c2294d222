//! Test kit for the CSI sidecars.

pub mod apiserver;
pub mod grpcgo;
#[cfg(unix)]
pub mod kubelet;
pub mod mockdriver;
#[cfg(unix)]
pub mod sandbox;
