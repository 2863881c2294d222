//! CSI external-attacher: turns VolumeAttachments into ControllerPublishVolume and
//! ControllerUnpublishVolume calls, as a drop-in replacement for the upstream sidecar.
//!
//! - [`model`]: the projected fields of the watched objects;
//! - [`decide`]: pure decisions (plans, CSI requests, patches);
//! - [`index`]: the cache fed by watch events, without I/O;
//! - [`controller`]: the watches, workers and reconciler doing the I/O ([`controller::run`]);
//! - [`app`]: its start-up, a plug-in of the sidecar runtime ([`app::Attacher`]);
//! - [`flags`]: the command line.

pub mod app;
pub mod controller;
pub mod decide;
pub mod flags;
pub mod index;
pub mod model;
