//! The integration tests of this crate, one binary: a module per area.

mod common;

mod bad_input;
mod binary;
mod in_use;
mod migration;
mod modify;
mod resize;
mod secrets;
