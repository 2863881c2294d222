//! What the provisioner records in the intent journal (`sidecar_kit::cluster::journal`) before its first
//! CreateVolume for a claim: the claim, the whole request without secret values, where the
//! secrets come from, and the PV to write. After a restart or a change of leader, every
//! recorded intent is driven to a final state (the PV written, or the volume deleted when the
//! claim is gone) and only then forgotten, so a kill in the middle of a CreateVolume never
//! leaks a volume.
//!
//! The journal is a ConfigMap, so whoever may write ConfigMaps in its namespace may write it
//! too: an entry is acted on only if its seal opens with this provisioner's key (the kit checks
//! it, and that its key is a claim UID) and it is what this provisioner would record
//! ([`check_recorded`], then [`check_against`] with the request prepared again from the live
//! claim, or from the recorded one once the claim is gone, and the live class). Anything else
//! is dropped, never called.

use serde::{Deserialize, Serialize};
use sidecar_kit::cluster::journal::{DropReason, Owner, seal};

use crate::decide::{self, Policy, Prepared};
use crate::model::Claim;

pub use sidecar_kit::cluster::journal::{
    Entries, Journal, JournalClient, JournalError, Location, MAX_QPS, REJECTED_REASON, Reporting,
    journal_name,
};

/// One unfinished provisioning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    pub claim: Claim,
    pub class: String,
    pub prepared: Prepared,
}

/// How the provisioner's journal speaks of itself.
pub const OWNER: Owner = Owner {
    sidecar: "the provisioner",
    risk: "a restart during a CreateVolume may then leak a volume",
    key_form: seal::is_uid,
    key_form_name: "a claim UID",
};

/// Why a recorded intent is not acted on: it is not what this provisioner records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("it is recorded under {key:?} but is the intent of claim UID {uid:?}")]
    Key { key: String, uid: String },
    #[error("its volume name {found:?} is not the one derived from the claim's UID ({expected:?})")]
    VolumeName { found: String, expected: String },
    #[error("its PV {pv:?} is not named after its volume {volume:?}")]
    PvName { pv: String, volume: String },
    #[error("its PV is not bound to the claim it was recorded for")]
    ClaimRef,
    #[error("it holds secret values, which are never recorded")]
    SecretValues,
    #[error("the claim with its UID is now {live}, not {recorded}")]
    ClaimMoved { live: String, recorded: String },
    #[error("it was recorded for class {recorded:?} but the claim is of class {live:?}")]
    Class { recorded: String, live: String },
    #[error("its {0} is not what the claim and its class ask for now")]
    Differs(&'static str),
    #[error("it cannot be checked against its claim: {0}")]
    Unverifiable(String),
}

impl Rejected {
    /// How the dropped-entries metric counts it: what this provisioner never records is a
    /// forgery even under a good seal; a genuine intent the objects moved away from is a
    /// mismatch.
    pub fn reason(&self) -> DropReason {
        match self {
            Self::Key { .. }
            | Self::VolumeName { .. }
            | Self::PvName { .. }
            | Self::ClaimRef
            | Self::SecretValues => DropReason::Forged,
            Self::ClaimMoved { .. } | Self::Class { .. } | Self::Differs(_) => DropReason::Mismatch,
            Self::Unverifiable(_) => DropReason::Unverifiable,
        }
    }
}

/// The checks that need nothing but the entry: it names the claim it is recorded under, the
/// volume name is the one derived from that claim's UID, its PV is named after that volume and
/// bound to that claim, and it holds no secret values.
pub fn check_recorded(policy: &Policy, key: &str, intent: &Intent) -> Result<(), Rejected> {
    let claim = &intent.claim;
    if claim.uid != key {
        return Err(Rejected::Key {
            key: key.to_string(),
            uid: claim.uid.clone(),
        });
    }
    let expected = decide::volume_name(
        &policy.volume_name_prefix,
        key,
        policy.volume_name_uuid_length,
    )
    .map_err(Rejected::Unverifiable)?;
    let request = &intent.prepared.request;
    if request.name != expected {
        return Err(Rejected::VolumeName {
            found: request.name.clone(),
            expected,
        });
    }
    let pv = &intent.prepared.pv;
    if pv.name != request.name {
        return Err(Rejected::PvName {
            pv: pv.name.clone(),
            volume: request.name.clone(),
        });
    }
    let reference = &pv.claim_ref;
    let bound = reference.kind.as_deref() == Some("PersistentVolumeClaim")
        && reference.uid.as_deref() == Some(key)
        && reference.namespace.as_deref() == Some(&*claim.namespace)
        && reference.name.as_deref() == Some(claim.name.as_str());
    if !bound {
        return Err(Rejected::ClaimRef);
    }
    if !request.secrets.is_empty() {
        return Err(Rejected::SecretValues);
    }
    Ok(())
}

/// The recorded intent against `now`, what this provisioner prepares for the live claim (of
/// class `class`) without topology: every part of the request and the PV must agree but the
/// accessibility requirements, which follow the cluster's nodes.
pub fn check_against(
    intent: &Intent,
    live: &Claim,
    class: &str,
    now: &Prepared,
) -> Result<(), Rejected> {
    let recorded = &intent.claim;
    if live.namespace != recorded.namespace || live.name != recorded.name {
        return Err(Rejected::ClaimMoved {
            live: format!("{}/{}", live.namespace, live.name),
            recorded: format!("{}/{}", recorded.namespace, recorded.name),
        });
    }
    if intent.class != class {
        return Err(Rejected::Class {
            recorded: intent.class.clone(),
            live: class.to_string(),
        });
    }
    let (was, is) = (&intent.prepared, now);
    let (request, fresh) = (&was.request, &is.request);
    let differences = [
        ("volume name", request.name == fresh.name),
        ("capacity", request.capacity_range == fresh.capacity_range),
        (
            "volume capabilities",
            request.volume_capabilities == fresh.volume_capabilities,
        ),
        ("parameters", request.parameters == fresh.parameters),
        (
            "volume content source",
            request.volume_content_source == fresh.volume_content_source,
        ),
        (
            "mutable parameters",
            request.mutable_parameters == fresh.mutable_parameters,
        ),
        (
            "provisioner secret reference",
            was.provisioner_secret == is.provisioner_secret,
        ),
        ("PV", same_pv(&was.pv, &is.pv)),
        ("CSI migration", was.migrated == is.migrated),
        ("data source kind", was.source == is.source),
    ];
    match differences.into_iter().find(|(_, same)| !same) {
        Some((part, _)) => Err(Rejected::Differs(part)),
        None => Ok(()),
    }
}

/// For a claim with a selected node, prepared `now` with topology: the recorded request must
/// ask first for the topology that node has (its preferred segment, else its first requisite
/// one). The rest of the requirements follows the cluster's nodes and is not compared.
pub fn check_topology(intent: &Intent, now: &Prepared) -> Result<(), Rejected> {
    let first = |prepared: &Prepared| {
        let requirements = prepared.request.accessibility_requirements.as_ref()?;
        requirements
            .preferred
            .first()
            .or_else(|| requirements.requisite.first())
            .cloned()
    };
    if first(&intent.prepared) == first(now) {
        Ok(())
    } else {
        Err(Rejected::Differs("topology of the selected node"))
    }
}

/// The claim as [`decide::prepare`] sees it without its lookups: no data source and no
/// VolumeAttributesClass, which a claim that is gone may name although they are gone too.
pub fn without_lookups(claim: &Claim) -> Claim {
    let mut bare = claim.clone();
    if let Some(spec) = bare.pending.as_mut() {
        spec.data_source = None;
        spec.volume_attributes_class = None;
    }
    bare
}

/// [`check_against`] for a gone claim whose data source or attributes class can no longer be
/// looked up, `now` prepared from [`without_lookups`]: every other part must agree, and the
/// recorded request may fill from a source only if the claim named one, and set mutable
/// parameters only if it named an attributes class.
pub fn check_against_bare(
    intent: &Intent,
    claim: &Claim,
    class: &str,
    now: &Prepared,
) -> Result<(), Rejected> {
    let spec = claim.pending.as_deref();
    let was = &intent.prepared;
    if was.request.volume_content_source.is_some() && spec.is_none_or(|s| s.data_source.is_none()) {
        return Err(Rejected::Differs("volume content source"));
    }
    if !was.request.mutable_parameters.is_empty()
        && spec.is_none_or(|s| s.volume_attributes_class.is_none())
    {
        return Err(Rejected::Differs("mutable parameters"));
    }
    let mut looked_up = intent.clone();
    let (request, pv) = (&mut looked_up.prepared.request, &mut looked_up.prepared.pv);
    request.volume_content_source = now.request.volume_content_source.clone();
    request.mutable_parameters = now.request.mutable_parameters.clone();
    pv.volume_attributes_class = now.pv.volume_attributes_class.clone();
    looked_up.prepared.source = now.source.clone();
    check_against(&looked_up, claim, class, now)
}

/// Two PV templates alike but for the claim's resourceVersion, which moves on by itself.
fn same_pv(a: &decide::PvTemplate, b: &decide::PvTemplate) -> bool {
    let mut a = a.clone();
    let mut b = b.clone();
    a.claim_ref.resource_version = None;
    b.claim_ref.resource_version = None;
    a == b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::{basic_claim, class, policy, prepare_alone};

    /// The intent this provisioner records for the test claim, and its key.
    fn genuine() -> (String, Intent) {
        let claim = basic_claim();
        let prepared = prepare_alone(&policy(), &claim, &class(&[])).unwrap();
        let intent = Intent {
            claim: claim.clone(),
            class: "fast".into(),
            prepared,
        };
        (claim.uid, intent)
    }

    #[test]
    fn what_this_provisioner_records_passes() {
        let (key, intent) = genuine();
        assert_eq!(check_recorded(&policy(), &key, &intent), Ok(()));
        let now = intent.prepared.clone();
        assert_eq!(check_against(&intent, &intent.claim, "fast", &now), Ok(()));
    }

    #[test]
    fn an_entry_that_does_not_fit_its_key_is_rejected() {
        let policy = policy();
        let (key, intent) = genuine();
        assert!(matches!(
            check_recorded(&policy, "another-uid", &intent),
            Err(Rejected::Key { .. })
        ));

        let mut renamed = intent.clone();
        renamed.prepared.request.name = "pvc-of-someone-else".into();
        assert!(matches!(
            check_recorded(&policy, &key, &renamed),
            Err(Rejected::VolumeName { .. })
        ));

        let mut elsewhere = intent.clone();
        elsewhere.prepared.pv.name = "pv-elsewhere".into();
        assert!(matches!(
            check_recorded(&policy, &key, &elsewhere),
            Err(Rejected::PvName { .. })
        ));

        for tamper in [
            |i: &mut Intent| i.prepared.pv.claim_ref.uid = Some("other".into()),
            |i: &mut Intent| i.prepared.pv.claim_ref.namespace = Some("other".into()),
            |i: &mut Intent| i.prepared.pv.claim_ref.name = Some("other".into()),
            |i: &mut Intent| i.prepared.pv.claim_ref.kind = Some("Pod".into()),
        ] {
            let mut rebound = intent.clone();
            tamper(&mut rebound);
            assert_eq!(
                check_recorded(&policy, &key, &rebound),
                Err(Rejected::ClaimRef)
            );
        }

        let mut with_secrets = intent;
        with_secrets
            .prepared
            .request
            .secrets
            .insert("password".into(), "x".into());
        assert_eq!(
            check_recorded(&policy, &key, &with_secrets),
            Err(Rejected::SecretValues)
        );
    }

    #[test]
    fn an_entry_that_asks_what_its_claim_does_not_is_rejected() {
        let (_, intent) = genuine();
        let now = intent.prepared.clone();
        let mut moved = intent.claim.clone();
        moved.name = "other".into();
        assert!(matches!(
            check_against(&intent, &moved, "fast", &now),
            Err(Rejected::ClaimMoved { .. })
        ));
        assert!(matches!(
            check_against(&intent, &intent.claim, "slow", &now),
            Err(Rejected::Class { .. })
        ));
        type Tamper = fn(&mut Prepared);
        let tampered: [(&str, Tamper); 6] = [
            ("capacity", |p| {
                p.request.capacity_range = None;
            }),
            ("parameters", |p| {
                p.request.parameters.insert("k".into(), "v".into());
            }),
            ("mutable parameters", |p| {
                p.request.mutable_parameters.insert("k".into(), "v".into());
            }),
            ("provisioner secret reference", |p| {
                p.provisioner_secret = Some(crate::model::SecretRef {
                    namespace: "kube-system".into(),
                    name: "admin".into(),
                });
            }),
            ("PV", |p| {
                p.pv.node_stage_secret = Some(crate::model::SecretRef {
                    namespace: "kube-system".into(),
                    name: "admin".into(),
                });
            }),
            ("PV", |p| p.pv.reclaim_policy = "Retain".into()),
        ];
        for (part, tamper) in tampered {
            let mut forged = intent.clone();
            tamper(&mut forged.prepared);
            assert_eq!(
                check_against(&forged, &intent.claim, "fast", &now),
                Err(Rejected::Differs(part)),
            );
        }
        // A claim with a selected node: the first segment asked for must be that node's.
        let segment = |zone: &str| csi_proto::v1::Topology {
            segments: [("zone".to_string(), zone.to_string())].into(),
        };
        let requirements = |zone: &str| {
            Some(csi_proto::v1::TopologyRequirement {
                requisite: vec![segment("a"), segment("b")],
                preferred: vec![segment(zone)],
            })
        };
        let mut placed = intent.clone();
        placed.prepared.request.accessibility_requirements = requirements("a");
        let mut now_placed = now.clone();
        now_placed.request.accessibility_requirements = requirements("a");
        assert_eq!(check_topology(&placed, &now_placed), Ok(()));
        now_placed.request.accessibility_requirements = requirements("b");
        assert_eq!(
            check_topology(&placed, &now_placed),
            Err(Rejected::Differs("topology of the selected node"))
        );
        assert_eq!(
            check_topology(&intent, &now_placed),
            Err(Rejected::Differs("topology of the selected node")),
            "recorded without topology"
        );
        // Otherwise topology follows the nodes, and the claim's resourceVersion moves on.
        let mut drifted = intent.clone();
        drifted.prepared.request.accessibility_requirements = Some(Default::default());
        drifted.prepared.pv.claim_ref.resource_version = Some("99".into());
        assert_eq!(check_against(&drifted, &intent.claim, "fast", &now), Ok(()));
    }
}
