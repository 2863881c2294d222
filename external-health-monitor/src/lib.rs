//! CSI external-health-monitor-controller: asks the driver how its volumes are (ListVolumes or
//! ControllerGetVolume with `VOLUME_CONDITION`) and reports abnormal ones, and the claims of
//! pods on failed nodes, as Events on the claims; a drop-in replacement for the upstream
//! sidecar.
//!
//! - [`model`]: the projected fields of volumes, claims, pods and nodes, names and texts;
//! - [`decide`]: pure decisions (the monitoring mode, which Event a condition deserves, when a
//!   node has failed);
//! - [`index`]: the cache fed by watch events, without I/O;
//! - [`controller`]: the watches, workers and the I/O ([`controller::run`]);
//! - [`app`]: its start-up, a plug-in of the sidecar runtime ([`app::HealthMonitor`]);
//! - [`flags`]: the command line.

pub mod app;
pub mod controller;
pub mod decide;
pub mod flags;
pub mod index;
pub mod model;
