//! CSI external-resizer: turns claims whose requested size grew into ControllerExpandVolume calls
//! and claims whose VolumeAttributesClass changed into ControllerModifyVolume calls, as a drop-in
//! replacement for the upstream sidecar.
//!
//! - [`model`]: the projected fields of claims, volumes, pods and classes;
//! - [`decide`]: pure decisions (which size to expand to, status patches, error classes);
//! - [`index`]: the cache fed by watch events, without I/O;
//! - [`controller`]: the watches, workers and the I/O ([`controller::run`]);
//! - [`app`]: its start-up, a plug-in of the sidecar runtime ([`app::Resizer`]);
//! - [`flags`]: the command line.

pub mod app;
pub mod controller;
pub mod decide;
pub mod flags;
pub mod index;
pub mod model;
