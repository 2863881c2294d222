//! csi-snapshot-metadata: serves the Kubernetes SnapshotMetadata API (KEP-3314, changed block
//! tracking) to backup applications over TLS, from the CSI driver's SnapshotMetadata service,
//! as a drop-in replacement for the upstream sidecar. A server, not a controller: no Lease, and
//! watches only for what it would otherwise read on every request.
//!
//! - [`model`]: the objects it reads;
//! - [`decide`]: pure decisions (validation, resolution, class and secret, the stream's checks);
//! - [`index`]: the classes and audience, fed by watches;
//! - [`auth`]: TokenReview with its cache, SubjectAccessReview;
//! - [`server`]: the request pipeline and the relay;
//! - [`tls`]: the certificate, its reloading, the accepting of connections;
//! - [`app`]: its start-up, a plug-in of the sidecar runtime ([`app::SnapshotMetadata`]);
//! - [`flags`]: the command line.

pub mod app;
pub mod auth;
pub mod decide;
pub mod flags;
pub mod index;
pub mod model;
pub mod server;
pub mod tls;

/// The Kubernetes SnapshotMetadata API, generated from `proto/schema.proto`.
pub mod api {
    tonic::include_proto!("snapshotmetadata");
}

/// Largest message taken from the driver or a client (gRPC's usual 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
