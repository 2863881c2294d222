//! A scriptable mock CSI driver: the Identity, Controller, GroupController,
//! SnapshotMetadata and Node services over an in-memory (optionally
//! persisted) volume store that follows the CSI spec's idempotency and error
//! codes, with run-time fault injection.
//!
//! ```no_run
//! # #[cfg(unix)]
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use csi_proto::methods::controller::CREATE_VOLUME;
//! use testkit::mockdriver::MockDriver;
//!
//! let dir = tempfile::tempdir()?;
//! let mock = MockDriver::builder()
//!     .driver_name("hostpath.csi.k8s.io")
//!     .topology_segment([("topology.example.com/zone", "z1")])
//!     .snapshots(false)
//!     .serve_unix(dir.path().join("csi.sock"))
//!     .await?;
//! // Point a sidecar at mock.endpoint(), then script and inspect:
//! mock.faults().fail_next(CREATE_VOLUME, 2, tonic::Code::Unavailable, "try again");
//! assert_eq!(mock.calls().count(CREATE_VOLUME), 0);
//! assert!(mock.state().volumes.is_empty());
//! mock.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Layout: [`state`] holds the storage model and the CSI semantics as
//! plain functions; [`inject`] the fault script and call log; `service`
//! the gRPC edge; [`server`] building and serving; [`spec`] the text forms
//! the `csi-mock-driver` binary parses.

pub mod config;
pub mod inject;
pub mod server;
mod service;
pub mod spec;
pub mod state;
mod store;

pub use config::{Capabilities, MockConfig, Segment};
pub use inject::{Call, CallLog, Faults, MetadataCall, StreamFault, secret_digest};
pub use server::{MockDriver, MockError, MockHandle};
pub use spec::Listen;
pub use state::{BLOCK_SIZE, Blocks, Condition, Rejection, State};
pub use store::PersistError;
