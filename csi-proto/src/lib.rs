//! Protocol crate of the CSI sidecars.
//!
//! * [`v1`]: the CSI spec v1.12.0 (`csi.v1`) messages, with tonic clients
//!   and servers for `Identity`, `Controller`, `GroupController`,
//!   `SnapshotMetadata` and `Node`.
//! * [`pluginregistration`]: kubelet's plugin-registration API.
//! * [`methods`]: gRPC method paths, generated from the descriptors.
//! * [`redact`]: secret-free rendering of any message for logs.
//!
//! Every message implements [`prost::Name`], so its descriptor can be
//! found in [`descriptor_pool`].

mod descriptor;
pub mod redact;

pub use descriptor::{DescriptorPoolError, FILE_DESCRIPTOR_SET, descriptor_pool};
pub use prost;
pub use prost_reflect;
pub use prost_types;
pub use tonic;

/// CSI spec v1.12.0, package `csi.v1`.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
}

/// Kubelet plugin registration, package `pluginregistration`.
pub mod pluginregistration {
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));

    /// `PluginInfo.type` of a CSI driver.
    pub const CSI_PLUGIN: &str = "CSIPlugin";
    /// `PluginInfo.type` of a device plugin.
    pub const DEVICE_PLUGIN: &str = "DevicePlugin";
    /// `PluginInfo.type` of a dynamic resource allocation driver.
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}

/// Full gRPC method paths (`/package.Service/Method`), one module per
/// service, e.g. [`methods::identity::PROBE`].
pub mod methods {
    include!(concat!(env!("OUT_DIR"), "/methods.rs"));
}
