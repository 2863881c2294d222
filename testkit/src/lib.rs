//! Test kit for the CSI sidecars.

pub mod apiserver;
pub mod mockdriver;
