//! CSI external-snapshotter sidecar: turns the VolumeSnapshotContents of its driver into
//! CreateSnapshot, ListSnapshots and DeleteSnapshot calls, as a drop-in replacement for the
//! upstream sidecar (the cluster-wide snapshot-controller stays upstream's).
//!
//! - [`model`]: the objects as read and the projections the index keeps;
//! - [`decide`]: pure decisions (what a content needs, names, parameters, secrets, status);
//! - [`index`]: the cache fed by watch events, without I/O;
//! - [`controller`]: the watches, workers, intent journal and the I/O ([`controller::run`]);
//! - [`app`]: its start-up, a plug-in of the sidecar runtime ([`app::Snapshotter`]);
//! - [`flags`]: the command line.

pub mod app;
pub mod controller;
pub mod decide;
pub mod flags;
pub mod index;
pub mod journal;
pub mod model;
