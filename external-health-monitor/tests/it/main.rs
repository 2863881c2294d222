//! The integration tests of this crate, one binary: a module per area.

mod common;

mod binary;
mod nodes;
mod volumes;
