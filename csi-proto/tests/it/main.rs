//! The integration tests of this crate, one binary: a module per area.

// Serves over unix sockets, for the unix-only tests.
#[cfg(unix)]
mod common;

mod grpc;
mod redact;
mod wire;
