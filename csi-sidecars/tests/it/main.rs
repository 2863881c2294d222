//! The integration tests of this crate, one binary: a module per area.

mod all_in_one;
mod binary;
mod faults;
mod upstream_flags;
