//! The intent journal's entries are checked before they are acted on (`sidecar_kit::cluster::journal`
//! keeps them): the journal is a ConfigMap, so whoever may write ConfigMaps in its namespace may
//! write it too. An entry is taken up only if its seal opens with this snapshotter's key and
//! its key is a content name (the kit checks both), the UIDs it records are UIDs, and it is
//! what this snapshotter would have recorded:
//! its snapshot (group snapshot) name is the one derived from the VolumeSnapshot (group) UID it
//! records; while its content exists, the request asked for it now agrees with it; once its
//! content is gone, no other content is bound to that snapshot. Anything else is dropped,
//! never called.

use sidecar_kit::cluster::journal::{DropReason, seal};
use sidecar_kit::values::names::is_dns1123_subdomain;

/// Whether `key` is a journal key of this snapshotter: a content's name, or `G_` and a group
/// content's name.
pub fn is_key(key: &str) -> bool {
    is_dns1123_subdomain(
        key.strip_prefix(crate::controller::GROUP_KEY_PREFIX)
            .unwrap_or(key),
    )
}

/// Why a recorded intent is not acted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("its {0} is not a UID")]
    NotAUid(&'static str),
    #[error(
        "its snapshot name {found:?} is not the one derived from the UID it records ({expected})"
    )]
    Name { found: String, expected: String },
    #[error("the snapshot it names belongs to content {0:?}, which exists")]
    Owned(String),
    #[error("its content is now bound to {live:?}, not to {recorded:?}")]
    Rebound { live: String, recorded: String },
    #[error("its {0} is not what its content asks for now")]
    Differs(&'static str),
    #[error("it cannot be checked against its content: {0}")]
    Unverifiable(String),
}

impl Rejected {
    /// How the dropped-entries metric counts it: what this snapshotter never records is a
    /// forgery even under a good seal; a genuine intent its content moved away from is a
    /// mismatch.
    pub fn reason(&self) -> DropReason {
        match self {
            Self::NotAUid(_) | Self::Name { .. } => DropReason::Forged,
            Self::Owned(_) | Self::Rebound { .. } | Self::Differs(_) => DropReason::Mismatch,
            Self::Unverifiable(_) => DropReason::Unverifiable,
        }
    }
}

/// The recorded UIDs (`what` names each) are UIDs.
pub fn check_uids<const N: usize>(uids: [(&'static str, &str); N]) -> Result<(), Rejected> {
    match uids.into_iter().find(|(_, uid)| !seal::is_uid(uid)) {
        Some((what, _)) => Err(Rejected::NotAUid(what)),
        None => Ok(()),
    }
}

/// The recorded name against the one derived from the recorded UID (`derived`, or why none
/// can be).
pub fn check_name(derived: Result<String, String>, recorded: &str) -> Result<(), Rejected> {
    match derived {
        Ok(expected) if expected == recorded => Ok(()),
        Ok(expected) => Err(Rejected::Name {
            found: recorded.to_string(),
            expected: format!("{expected:?}"),
        }),
        Err(why) => Err(Rejected::Name {
            found: recorded.to_string(),
            expected: why,
        }),
    }
}

/// The content a live intent is for is still bound to the snapshot it recorded.
pub fn check_bound(live: &str, recorded: &str) -> Result<(), Rejected> {
    if live == recorded {
        Ok(())
    } else {
        Err(Rejected::Rebound {
            live: live.to_string(),
            recorded: recorded.to_string(),
        })
    }
}

/// The first part, by name, in which the recorded request and the one asked for now differ.
pub fn check_parts<const N: usize>(parts: [(&'static str, bool); N]) -> Result<(), Rejected> {
    match parts.into_iter().find(|(_, same)| !same) {
        Some((part, _)) => Err(Rejected::Differs(part)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_must_be_derived_from_the_recorded_uid() {
        let derived = crate::decide::snapshot_name("snapshot", "1234-abcd", -1);
        assert_eq!(check_name(derived.clone(), "snapshot-1234-abcd"), Ok(()));
        assert!(matches!(
            check_name(derived, "snapshot-of-someone-else"),
            Err(Rejected::Name { .. })
        ));
        let missing = crate::decide::snapshot_name("snapshot", "", -1);
        let rejected = check_name(missing, "snapshot-").unwrap_err();
        assert!(rejected.to_string().contains("missing UID"), "{rejected}");
    }

    #[test]
    fn the_first_differing_part_is_named() {
        assert_eq!(check_parts([("a", true), ("b", true)]), Ok(()));
        assert_eq!(
            check_parts([("a", true), ("b", false), ("c", false)]),
            Err(Rejected::Differs("b"))
        );
        assert_eq!(check_bound("u1", "u1"), Ok(()));
        assert!(matches!(
            check_bound("u2", "u1"),
            Err(Rejected::Rebound { .. })
        ));
    }
}
