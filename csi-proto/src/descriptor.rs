//! The descriptors of every compiled proto file, embedded at build time.

use prost_reflect::DescriptorPool;
use std::sync::OnceLock;

/// Encoded `google.protobuf.FileDescriptorSet` of `csi.proto`, the kubelet
/// registration API and the well-known types they import.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// The embedded descriptor set could not be decoded.
#[derive(Debug, Clone, thiserror::Error)]
#[error("embedded file descriptor set does not decode: {0}")]
pub struct DescriptorPoolError(String);

/// The pool of all embedded descriptors, decoded once on first use.
pub fn descriptor_pool() -> Result<&'static DescriptorPool, DescriptorPoolError> {
    static POOL: OnceLock<Result<DescriptorPool, DescriptorPoolError>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(FILE_DESCRIPTOR_SET)
            .map_err(|err| DescriptorPoolError(err.to_string()))
    })
    .as_ref()
    .map_err(Clone::clone)
}
