//! The integration tests of this crate, one binary: a module per area.

mod csi_client;
mod kube_connections;
mod kube_http2;
mod kube_rate_limit;
mod leader_election;
mod protobuf_lists;
mod shared_watches;
mod windows_pipe;
