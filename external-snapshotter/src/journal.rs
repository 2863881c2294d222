//! The intent journal's entries are checked before they are acted on (`sidecar_kit::cluster::journal`
//! keeps them): the journal is a ConfigMap, so whoever may write ConfigMaps in its namespace may
//! write it too. An entry is taken up only if its seal opens with this snapshotter's key and
//! its key is a content name (the kit checks both), the UIDs it records are UIDs, and it is
//! what this snapshotter would have recorded:
//! its snapshot (group snapshot) name is the one derived from the VolumeSnapshot (group) UID it
//! records; while its content exists, the request asked for it now agrees with it; once its
//! content is gone, no other content is bound to that snapshot, and the content's class, while
//! it exists, still gives the recorded parameters and deletion policy. Anything else is
//! dropped, never called.

use std::collections::BTreeMap;

use sidecar_kit::cluster::journal::{DropReason, seal};

use crate::decide;
use crate::model::Class;
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
    #[error("its content is gone and its {0} is not what its class gives")]
    NotTheClass(&'static str),
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
            Self::Owned(_) | Self::Rebound { .. } | Self::Differs(_) | Self::NotTheClass(_) => {
                DropReason::Mismatch
            }
            Self::Unverifiable(_) => DropReason::Unverifiable,
        }
    }
}

/// What a recorded intent for a gone content says that its class gives.
pub struct Recorded<'a> {
    /// The content's name (the entry's key, less a group's prefix).
    pub content: &'a str,
    pub parameters: &'a BTreeMap<String, String>,
    pub delete: bool,
    /// The parameters `--extra-create-metadata` adds (snapshot name, namespace, content name).
    pub metadata_keys: [&'static str; 3],
}

/// Whether a recorded intent of a gone content is what its live class gives: the class's
/// parameters less its prefixed keys (and, with `--extra-create-metadata`, the metadata keys,
/// the content's name among them), and its deletion policy (a dynamically made content takes
/// its class's). The snapshot's name and namespace and the secret reference came from objects
/// that are gone and cannot be checked again.
pub fn check_against_class(
    recorded: &Recorded<'_>,
    class: &Class,
    extra_metadata: bool,
) -> Result<(), Rejected> {
    let mut expected = decide::driver_parameters(&class.parameters)
        .map_err(|e| Rejected::Unverifiable(format!("its class's parameters do not parse: {e}")))?;
    let [snapshot, namespace, content] = recorded.metadata_keys;
    if extra_metadata {
        for key in [snapshot, namespace] {
            let Some(value) = recorded.parameters.get(key) else {
                return Err(Rejected::NotTheClass("parameters"));
            };
            expected.insert(key.to_string(), value.clone());
        }
        expected.insert(content.to_string(), recorded.content.to_string());
    }
    if *recorded.parameters != expected {
        return Err(Rejected::NotTheClass("parameters"));
    }
    if recorded.delete != (class.deletion_policy == "Delete") {
        return Err(Rejected::NotTheClass("deletion policy"));
    }
    Ok(())
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

    fn class(parameters: &[(&str, &str)], deletion_policy: &str) -> Class {
        Class {
            name: "gold".into(),
            driver: "hostpath.csi.k8s.io".into(),
            parameters: parameters
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            deletion_policy: deletion_policy.into(),
        }
    }

    fn recorded<'a>(parameters: &'a BTreeMap<String, String>, delete: bool) -> Recorded<'a> {
        Recorded {
            content: "snapcontent-1",
            parameters,
            delete,
            metadata_keys: [
                decide::SNAPSHOT_NAME_KEY,
                decide::SNAPSHOT_NAMESPACE_KEY,
                decide::CONTENT_NAME_KEY,
            ],
        }
    }

    #[test]
    fn a_gone_contents_intent_must_be_what_its_live_class_gives() {
        let gold = class(
            &[
                ("tier", "gold"),
                ("csi.storage.k8s.io/snapshotter-secret-name", "s"),
            ],
            "Delete",
        );
        let genuine: BTreeMap<String, String> = [("tier", "gold")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            check_against_class(&recorded(&genuine, true), &gold, false),
            Ok(())
        );
        // A class that retains what it makes: a recorded Delete is not its.
        let kept = class(&[("tier", "gold")], "Retain");
        assert_eq!(
            check_against_class(&recorded(&genuine, true), &kept, false),
            Err(Rejected::NotTheClass("deletion policy"))
        );
        let mut forged = genuine.clone();
        forged.insert("tier".into(), "platinum".into());
        assert_eq!(
            check_against_class(&recorded(&forged, true), &gold, false),
            Err(Rejected::NotTheClass("parameters"))
        );
        // With --extra-create-metadata the content's name is the key's.
        let mut with_metadata = genuine.clone();
        with_metadata.insert(decide::SNAPSHOT_NAME_KEY.into(), "snap".into());
        with_metadata.insert(decide::SNAPSHOT_NAMESPACE_KEY.into(), "ns".into());
        with_metadata.insert(decide::CONTENT_NAME_KEY.into(), "snapcontent-1".into());
        assert_eq!(
            check_against_class(&recorded(&with_metadata, true), &gold, true),
            Ok(())
        );
        with_metadata.insert(decide::CONTENT_NAME_KEY.into(), "snapcontent-2".into());
        assert_eq!(
            check_against_class(&recorded(&with_metadata, true), &gold, true),
            Err(Rejected::NotTheClass("parameters"))
        );
        assert_eq!(
            check_against_class(&recorded(&genuine, true), &gold, true),
            Err(Rejected::NotTheClass("parameters"))
        );
    }

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
