//! What every CSI sidecar shares: flags in upstream syntax, logging, lifecycle, metrics, the
//! HTTP endpoint, the Kubernetes client with its rate limit, leader election, the connection to
//! the CSI driver with its identity calls, the intent journal, and the CSI migration of in-tree
//! volumes.

pub mod accessmodes;
pub mod atom;
pub mod connection;
pub mod consolidated;
pub mod csi;
pub mod deadline;
pub mod endpoint;
pub mod events;
pub mod flags;
pub mod host;
pub mod http;
pub mod identity;
pub mod journal;
pub mod kube;
pub mod leader;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod migration;
pub mod names;
pub mod pipeline;
pub mod quantity;
pub mod runtime;
pub mod shrink;
pub mod startup;
pub mod token;
pub mod views;
pub mod viewtable;
pub mod watches;
#[cfg(windows)]
pub mod windows;
pub mod workqueue;
