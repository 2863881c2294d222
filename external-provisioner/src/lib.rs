//! CSI external-provisioner: turns PersistentVolumeClaims into CreateVolume and DeleteVolume
//! calls and writes the PersistentVolumes, as a drop-in replacement for the upstream sidecar.
//!
//! - [`model`]: the projected fields of the watched objects;
//! - [`params`]: StorageClass parameters, secret references and their templates;
//! - [`topology`]: the accessibility requirements of a CreateVolume call;
//! - [`decide`]: pure decisions (which claims, the CreateVolume request, the PV, error classes);
//! - [`index`]: the cache fed by watch events, without I/O;
//! - [`capacity`]: CSIStorageCapacity objects (`--enable-capacity`);
//! - [`journal`]: the durable record of unanswered CreateVolume calls;
//! - [`controller`]: the watches and workers doing the I/O ([`controller::run`]);
//! - [`app`]: its start-up, a plug-in of the sidecar runtime ([`app::Provisioner`]);
//! - [`flags`]: the command line.

pub mod app;
pub mod capacity;
pub mod controller;
pub mod decide;
pub mod flags;
pub mod index;
pub mod journal;
pub mod metrics;
pub mod model;
pub mod params;
pub mod sources;
pub mod topology;
