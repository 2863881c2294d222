//! The sidecar's decisions as plain functions over plain data: what a request may ask, which
//! snapshot handle and secret it resolves to, and whether the driver's stream keeps the API's
//! promises. Refusals carry upstream's status codes and messages except where
//! docs/compatibility.md says ours differ.

use std::collections::BTreeMap;

use sidecar_kit::values::names::{self, SecretKeys, SecretName};
use tonic::Code;

use crate::model::{Class, SECRET_NAME, SECRET_NAMESPACE, VolumeSnapshot, VolumeSnapshotContent};

/// Why a request is answered with an error: the status code and message the client gets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Refusal {
    pub code: Code,
    pub message: String,
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }
}

impl From<Refusal> for tonic::Status {
    fn from(refusal: Refusal) -> Self {
        tonic::Status::new(refusal.code, refusal.message)
    }
}

/// The two RPCs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Allocated,
    Delta,
}

impl Method {
    /// The `method_name` label of the operations histogram (upstream labels both RPCs
    /// `MetadataAllocated`; ours names each its own).
    pub fn label(self) -> &'static str {
        match self {
            Method::Allocated => "MetadataAllocated",
            Method::Delta => "MetadataDelta",
        }
    }

    /// Its name in logs: the RPC's.
    pub fn rpc(self) -> &'static str {
        match self {
            Method::Allocated => "GetMetadataAllocated",
            Method::Delta => "GetMetadataDelta",
        }
    }

    /// The RPC a backup application calls, as its server span names it.
    pub fn traced(self) -> &'static str {
        match self {
            Method::Allocated => "snapshotmetadata.SnapshotMetadata/GetMetadataAllocated",
            Method::Delta => "snapshotmetadata.SnapshotMetadata/GetMetadataDelta",
        }
    }

    /// The driver's RPC that answers it.
    pub fn driver_method(self) -> &'static str {
        use csi_proto::methods::snapshot_metadata::{GET_METADATA_ALLOCATED, GET_METADATA_DELTA};
        match self {
            Method::Allocated => GET_METADATA_ALLOCATED,
            Method::Delta => GET_METADATA_DELTA,
        }
    }
}

/// A request of either RPC, as the client sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub method: Method,
    pub token: String,
    pub namespace: String,
    /// The VolumeSnapshot asked about (Delta: the target).
    pub snapshot: String,
    /// Delta: the base snapshot's CSI handle, passed to the driver as given.
    pub base: Option<String>,
    pub starting_offset: i64,
    pub max_results: i32,
}

impl Ask {
    /// `<namespace>/<snapshot>`: the `target_snapshot` label.
    pub fn target_label(&self) -> String {
        format!("{}/{}", self.namespace, self.snapshot)
    }
}

/// The longest base snapshot handle taken: far beyond any driver's (CSI asks for at most 128
/// bytes), short enough to log and to label a metric with.
pub const MAX_HANDLE_BYTES: usize = 4096;

/// Upstream's checks in its order, then ours: a negative offset or result count is refused here
/// instead of being passed to the driver.
pub fn validate(ask: &Ask) -> Result<(), Refusal> {
    if ask.token.is_empty() {
        return Err(Refusal::invalid("securityToken is missing"));
    }
    if ask.namespace.is_empty() {
        return Err(Refusal::invalid("namespace parameter cannot be empty"));
    }
    match (ask.method, &ask.base) {
        (Method::Allocated, _) if ask.snapshot.is_empty() => {
            return Err(Refusal::invalid("snapshotName cannot be empty"));
        }
        (Method::Delta, base) if base.as_deref().unwrap_or("").is_empty() => {
            return Err(Refusal::invalid("baseSnapshotId cannot be empty"));
        }
        (Method::Delta, _) if ask.snapshot.is_empty() => {
            return Err(Refusal::invalid("targetSnapshotName cannot be empty"));
        }
        _ => {}
    }
    // A name no object can have is refused before it costs a review or a lookup, and is never
    // echoed (it may be megabytes long).
    if !names::is_dns1123_label(&ask.namespace) {
        return Err(Refusal::invalid(
            "namespace is not a valid namespace name (a DNS-1123 label)",
        ));
    }
    if !names::is_dns1123_subdomain(&ask.snapshot) {
        return Err(Refusal::invalid(
            "the snapshot name is not a valid VolumeSnapshot name (a DNS-1123 subdomain)",
        ));
    }
    if ask
        .base
        .as_ref()
        .is_some_and(|base| base.len() > MAX_HANDLE_BYTES)
    {
        return Err(Refusal::invalid(format!(
            "baseSnapshotId is longer than {MAX_HANDLE_BYTES} bytes"
        )));
    }
    if ask.starting_offset < 0 {
        return Err(Refusal::invalid(format!(
            "startingOffset cannot be negative: {}",
            ask.starting_offset
        )));
    }
    if ask.max_results < 0 {
        return Err(Refusal::invalid(format!(
            "maxResults cannot be negative: {}",
            ask.max_results
        )));
    }
    Ok(())
}

/// How reading an object failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    NotFound,
    Other(String),
}

/// The refusal of a failed read of the `kind` `what`: NotFound when it does not exist (upstream
/// answers Unavailable, which tells the client to retry what never succeeds), else
/// upstream's Unavailable.
pub fn read_refusal(kind: &str, what: &str, error: &ReadError) -> Refusal {
    match error {
        ReadError::NotFound => Refusal::new(Code::NotFound, format!("{kind} '{what}' not found")),
        ReadError::Other(err) => {
            Refusal::unavailable(format!("failed to get {kind} '{what}': {err}"))
        }
    }
}

/// The content a VolumeSnapshot is bound to, once it is ready. A snapshot without status (just
/// created) is not ready yet: upstream's sidecar crashes on it.
pub fn bound_content(snapshot: &VolumeSnapshot, name: &str) -> Result<String, Refusal> {
    let status = snapshot.status.as_ref();
    if status.and_then(|s| s.ready_to_use) != Some(true) {
        return Err(Refusal::unavailable(format!(
            "the VolumeSnapshot is not yet ready, name: {name}"
        )));
    }
    match status.and_then(|s| s.bound_volume_snapshot_content_name.as_deref()) {
        Some(content) if !content.is_empty() => Ok(content.to_string()),
        _ => Err(Refusal::unavailable(format!(
            "boundVolumeSnapshotContentName is not set in VolumeSnapshot status, name: {name}"
        ))),
    }
}

/// The CSI handle of a ready content of `driver`; `snapshot` names the VolumeSnapshot in the
/// refusal of another driver's content.
pub fn snapshot_handle(
    content: &VolumeSnapshotContent,
    content_name: &str,
    driver: &str,
    snapshot: &str,
) -> Result<String, Refusal> {
    let status = content.status.as_ref();
    if status.and_then(|s| s.ready_to_use) != Some(true) {
        return Err(Refusal::unavailable(format!(
            "the VolumeSnapshotContent is not yet ready, name: {content_name}"
        )));
    }
    let handle = match status.and_then(|s| s.snapshot_handle.as_deref()) {
        Some(handle) if !handle.is_empty() => handle.to_string(),
        _ => {
            return Err(Refusal::unavailable(format!(
                "snapshotHandle is not set in VolumeSnapshotContent status, name: {content_name}"
            )));
        }
    };
    if content.spec.driver != driver {
        return Err(Refusal::invalid(format!(
            "VolumeSnapshot '{snapshot}' does not belong to the CSI driver '{driver}'"
        )));
    }
    Ok(handle)
}

/// The class whose secret the driver's call takes: the snapshot's own, else the driver's
/// default. `None` when the snapshot names none and the driver has no default class: then no
/// class can name a secret, and the call goes without one (upstream refuses the request).
pub fn choose_class<'a>(
    named: Option<&str>,
    classes: &'a BTreeMap<String, Class>,
    driver: &str,
) -> Result<Option<&'a Class>, Refusal> {
    if let Some(name) = named.filter(|n| !n.is_empty()) {
        return classes.get(name).map(Some).ok_or_else(|| {
            Refusal::unavailable(format!(
                "failed to get VolumeSnapshotClass '{name}': no such class of the CSI driver '{driver}'"
            ))
        });
    }
    let mut defaults = classes.values().filter(|c| c.is_default);
    match (defaults.next(), defaults.next()) {
        (None, _) => Ok(None),
        (Some(class), None) => Ok(Some(class)),
        (Some(_), Some(_)) => Err(Refusal::unavailable(format!(
            "multiple default VolumeSnapshotClasses are set for the CSI driver '{driver}'"
        ))),
    }
}

/// The snapshotter secret a class names for the content `content` of the VolumeSnapshot
/// `namespace/snapshot`, with external-snapshotter's templates.
pub fn snapshotter_secret(
    class: &Class,
    content: &str,
    namespace: &str,
    snapshot: &str,
) -> Result<Option<SecretName>, Refusal> {
    let namespace_vars = BTreeMap::from([
        (
            "volumesnapshotcontent.name".to_string(),
            content.to_string(),
        ),
        (
            "volumesnapshot.namespace".to_string(),
            namespace.to_string(),
        ),
    ]);
    let mut name_vars = namespace_vars.clone();
    name_vars.insert("volumesnapshot.name".to_string(), snapshot.to_string());
    let keys = SecretKeys {
        what: "Snapshotter",
        name: SECRET_NAME,
        namespace: SECRET_NAMESPACE,
    };
    names::class_secret(&class.parameters, keys, &namespace_vars, &name_vars).map_err(|err| {
        Refusal::unavailable(format!(
            "invalid snapshotter secret parameters in VolumeSnapshotClass: {err}"
        ))
    })
}

/// One message of the driver's stream, in plain numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub block_type: i32,
    pub capacity: i64,
    /// `(byte_offset, size_bytes)`.
    pub blocks: Vec<(i64, i64)>,
}

/// `BlockMetadataType` values (the same in CSI and the Kubernetes API).
pub const FIXED_LENGTH: i32 = 1;
pub const VARIABLE_LENGTH: i32 = 2;

/// What the driver's stream must keep, as the API promises its clients: one block type and one
/// capacity, ranges ascending and apart, fixed-length ranges of one size, none ending at or
/// before `starting_offset`; at most `max_results` ranges a message (the sidecar splits larger
/// messages rather than fail the stream). A range that ends past the volume's capacity is
/// relayed, as upstream relays it: drivers report a partial last block as a whole one (a volume
/// whose size is not a multiple of the block size); it is noted for the log.
#[derive(Clone, Debug)]
pub struct StreamCheck {
    starting_offset: i64,
    max_results: usize,
    shape: Option<(i32, i64)>,
    fixed_size: Option<i64>,
    /// Where the last range ended.
    end: Option<i64>,
    /// The first range that ends past the capacity, until [`StreamCheck::past_capacity`] says
    /// so.
    past_capacity: Option<(i64, i64)>,
    noted: bool,
}

impl StreamCheck {
    pub fn new(starting_offset: i64, max_results: i32) -> Self {
        Self {
            starting_offset,
            max_results: usize::try_from(max_results).unwrap_or(0),
            shape: None,
            fixed_size: None,
            end: None,
            past_capacity: None,
            noted: false,
        }
    }

    /// The first range that ended past the volume's capacity, once: `(offset, size)`.
    pub fn past_capacity(&mut self) -> Option<(i64, i64)> {
        if self.noted {
            return None;
        }
        let first = self.past_capacity?;
        self.noted = true;
        Some(first)
    }

    /// The messages to relay for the driver's `batch`, or what it broke.
    pub fn take(&mut self, batch: Batch) -> Result<Vec<Batch>, String> {
        if batch.block_type != FIXED_LENGTH && batch.block_type != VARIABLE_LENGTH {
            return Err(format!("unknown block metadata type {}", batch.block_type));
        }
        if batch.capacity < 0 {
            return Err(format!("negative volume capacity {}", batch.capacity));
        }
        match self.shape {
            None => self.shape = Some((batch.block_type, batch.capacity)),
            Some((block_type, _)) if block_type != batch.block_type => {
                return Err(format!(
                    "the block metadata type changed from {block_type} to {} within the stream",
                    batch.block_type
                ));
            }
            Some((_, capacity)) if capacity != batch.capacity => {
                return Err(format!(
                    "the volume capacity changed from {capacity} to {} within the stream",
                    batch.capacity
                ));
            }
            Some(_) => {}
        }
        for &(offset, size) in &batch.blocks {
            self.check_range(batch.block_type, batch.capacity, offset, size)?;
        }
        if self.max_results == 0 || batch.blocks.len() <= self.max_results {
            return Ok(vec![batch]);
        }
        Ok(batch
            .blocks
            .chunks(self.max_results)
            .map(|blocks| Batch {
                block_type: batch.block_type,
                capacity: batch.capacity,
                blocks: blocks.to_vec(),
            })
            .collect())
    }

    fn check_range(
        &mut self,
        block_type: i32,
        capacity: i64,
        offset: i64,
        size: i64,
    ) -> Result<(), String> {
        if offset < 0 || size <= 0 {
            return Err(format!("invalid range at offset {offset} of {size} bytes"));
        }
        let end = offset
            .checked_add(size)
            .ok_or_else(|| format!("the range at offset {offset} of {size} bytes overflows"))?;
        if end > capacity && self.past_capacity.is_none() {
            self.past_capacity = Some((offset, size));
        }
        if end <= self.starting_offset {
            return Err(format!(
                "the range at offset {offset} of {size} bytes ends before the starting offset {}",
                self.starting_offset
            ));
        }
        if let Some(previous) = self.end
            && offset < previous
        {
            return Err(format!(
                "the range at offset {offset} starts before the previous one ends ({previous}): ranges must ascend without overlap"
            ));
        }
        if block_type == FIXED_LENGTH {
            match self.fixed_size {
                None => self.fixed_size = Some(size),
                Some(fixed) if fixed != size => {
                    return Err(format!(
                        "fixed-length ranges of {fixed} and {size} bytes in one stream"
                    ));
                }
                Some(_) => {}
            }
        }
        self.end = Some(end);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
