//! The integration tests of this crate, one binary: a module per area.

mod common;

mod attach;
mod bad_input;
mod binary;
mod errors;
mod migration;
mod resilience;
mod secrets;
