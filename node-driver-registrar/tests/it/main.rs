//! The integration tests of this crate, one binary: a module per area.

#[macro_use]
mod common;

mod flags;
mod grpcgo;
mod healthz;
mod registration;
