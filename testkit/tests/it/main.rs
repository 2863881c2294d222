//! The integration tests of this crate, one binary: a module per area.

mod apiserver_support;
// Clients over unix sockets, for the unix-only mock driver tests.
#[cfg(unix)]
mod mockdriver_common;

mod apiserver_cluster;
mod apiserver_crud;
mod apiserver_discovery;
mod apiserver_faults;
mod apiserver_kubectl;
mod apiserver_list;
mod apiserver_patch;
mod apiserver_protobuf;
mod apiserver_pv_controller;
mod apiserver_watch;
mod conformance;
mod grpcgo;
mod mockdriver_binary;
mod mockdriver_faults;
mod mockdriver_pipe;
mod mockdriver_rpcs;
mod mockdriver_serving;
mod sandbox;
mod sandbox_signals;
