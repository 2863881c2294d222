//! The real `csi-snapshot-metadata` binary between a TLS gRPC client, the test kit's API server
//! (whose TokenReview and SubjectAccessReview answers the tests set; upstream's lister and
//! verifier are the real-cluster check) and the mock driver's SnapshotMetadata service.

mod bounds;
mod common;
mod requests;
mod streams;
mod tls;
mod tracing;
