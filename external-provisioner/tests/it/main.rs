//! The integration tests of this crate, one binary: a module per area.

mod common;

mod bad_input;
mod binary;
mod capacity;
mod crash;
mod errors;
mod fuzz_regressions;
mod journal;
mod leader;
mod migration;
mod node;
mod provision;
mod secrets;
mod sources;
mod topology;
mod tracing;
