//! An in-process Kubernetes API server for tests.

pub mod error;
pub mod patch;
pub mod registry;
pub mod selector;
pub mod store;
