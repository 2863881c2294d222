//! The integration tests of this crate, one binary: a module per area.

mod common;

mod bad_input;
mod binary;
mod errors;
mod groups;
mod journal;
mod secrets;
mod snapshot;
