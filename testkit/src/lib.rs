//! Test kit for the CSI sidecars.

pub mod apiserver;
pub mod kubelet;
pub mod mockdriver;
pub mod sandbox;
