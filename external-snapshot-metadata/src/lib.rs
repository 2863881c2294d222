//! csi-snapshot-metadata: serves the Kubernetes SnapshotMetadata API (KEP-3314, changed block
//! tracking) to backup applications over TLS, from the CSI driver's SnapshotMetadata service,
//! as a drop-in replacement for the upstream sidecar. A server, not a controller: no Lease, and
//! watches only for what it would otherwise read on every request.
//!
//! - [`model`]: the objects it reads;
//! - [`decide`]: pure decisions (validation, resolution, class and secret, the stream's checks);
//! - [`index`]: the classes and audience, fed by watches;
//! - [`auth`]: TokenReview with its cache, SubjectAccessReview;
//! - [`server`]: the request pipeline;
//! - [`relay`]: the driver's stream to the client, bounded in bytes and time;
//! - [`tls`]: the certificate, its reloading, the accepting of connections;
//! - [`app`]: its start-up, a plug-in of the sidecar runtime ([`app::SnapshotMetadata`]);
//! - [`flags`]: the command line.

pub mod app;
pub mod auth;
pub mod decide;
pub mod flags;
pub mod index;
pub mod model;
pub mod relay;
pub mod server;
pub mod tls;

/// The Kubernetes SnapshotMetadata API, generated from `proto/schema.proto`.
pub mod api {
    tonic::include_proto!("snapshotmetadata");
}

/// Largest message taken from the driver (gRPC's usual 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Largest request taken from a client: a token and a few names need a few KiB, and a request
/// is held whole before anyone is authenticated, so this bounds what an unknown client can
/// make the server hold (upstream takes gRPC's 4 MiB). A larger one is refused with
/// OutOfRange.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Streams one client connection may have open at once (HTTP/2 SETTINGS); a client queues
/// more. With `--max-connections` it bounds the requests held before authentication.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;
