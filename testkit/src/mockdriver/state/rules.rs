//! The driver's rules that need no state of their own: capacity, capabilities, topology,
//! paging and mutable parameters.

use super::*;

/// Bytes not taken by any volume.
pub fn available_capacity(state: &State, config: &MockConfig) -> i64 {
    let used: i64 = state.volumes.values().map(|v| v.capacity_bytes).sum();
    (config.total_capacity - used).max(0)
}

/// What GetCapacity reports for `segment`: the free bytes of the pool, or 0
/// for a segment the driver does not serve.
pub fn capacity_for(state: &State, config: &MockConfig, segment: Option<&Segment>) -> i64 {
    let foreign = config.capabilities.topology
        && !config.topology.is_empty()
        && segment.is_some_and(|s| !s.is_empty() && !config.topology.contains(s));
    if foreign {
        0
    } else {
        available_capacity(state, config)
    }
}

/// Largest volume the driver would create now.
pub fn maximum_volume_size(config: &MockConfig) -> i64 {
    config
        .max_volume_size
        .unwrap_or(config.total_capacity)
        .min(config.total_capacity)
}

/// Refuses access modes the driver does not offer.
pub fn check_capabilities(config: &MockConfig, caps: &[Capability]) -> Result<(), Rejection> {
    if let Some(cap) = caps.iter().find(|c| {
        c.access_mode.needs_single_node_multi_writer()
            && !config.capabilities.single_node_multi_writer
    }) {
        return reject(
            Code::InvalidArgument,
            format!(
                "access mode {:?} needs the SINGLE_NODE_MULTI_WRITER capability",
                cap.access_mode
            ),
        );
    }
    Ok(())
}

/// Chooses where a new volume is accessible from: the first preferred, then
/// the first requisite segment the driver serves; without requirements the
/// driver's first segment.
pub fn pick_topology(
    available: &[Segment],
    requisite: &[Segment],
    preferred: &[Segment],
) -> Result<Vec<Segment>, Rejection> {
    let served = |s: &&Segment| available.is_empty() || available.contains(s);
    if let Some(segment) = preferred.iter().chain(requisite).find(served) {
        return Ok(vec![segment.clone()]);
    }
    if !requisite.is_empty() {
        return reject(
            Code::ResourceExhausted,
            "none of the requisite topology segments is served by this driver",
        );
    }
    Ok(available.first().cloned().into_iter().collect())
}

/// The page `[start, end)` of `total` items that `starting_token` and
/// `max_entries` select, and the token of the next page ("" at the end).
/// Tokens are offsets; one that is not an offset within the list is
/// ABORTED, as the spec asks for an invalid `starting_token`.
pub fn page(
    total: usize,
    max_entries: i32,
    starting_token: &str,
) -> Result<(Range<usize>, String), Rejection> {
    let Ok(max_entries) = usize::try_from(max_entries) else {
        return reject(Code::InvalidArgument, "max_entries must not be negative");
    };
    let start = if starting_token.is_empty() {
        0
    } else {
        match starting_token.parse::<usize>() {
            Ok(start) if start <= total => start,
            _ => {
                return reject(
                    Code::Aborted,
                    format!("invalid starting_token {starting_token:?}"),
                );
            }
        }
    };
    let end = if max_entries == 0 {
        total
    } else {
        total.min(start.saturating_add(max_entries))
    };
    let next = if end < total {
        end.to_string()
    } else {
        String::new()
    };
    Ok((start..end, next))
}

/// The mutable parameters (VolumeAttributesClass keys) the mock supports, in
/// CreateVolume and ControllerModifyVolume; any value is accepted. The spec
/// asks for INVALID_ARGUMENT on any other key.
pub const MUTABLE_PARAMETERS: [&str; 2] = ["iops", "throughput"];

/// Refuses mutable parameters the mock does not support.
pub fn check_mutable_parameters(parameters: &BTreeMap<String, String>) -> Result<(), Rejection> {
    let unsupported: Vec<&str> = parameters
        .keys()
        .map(String::as_str)
        .filter(|key| !MUTABLE_PARAMETERS.contains(key))
        .collect();
    if !unsupported.is_empty() {
        return reject(
            Code::InvalidArgument,
            format!(
                "unsupported mutable parameters {unsupported:?}; supported: {MUTABLE_PARAMETERS:?}"
            ),
        );
    }
    Ok(())
}

/// `ControllerPublishVolume.publish_context` of a volume.
pub fn publish_context(volume_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("devicePath".to_owned(), format!("/dev/mock/{volume_id}"))])
}
