//! What the health monitor keeps of the objects it watches, and the names and texts it shares
//! with upstream: the Lease, the Event source, the Events' reasons and messages.

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use sidecar_kit::pipeline::views::{ClaimView, Needs};
use sidecar_kit::values::atom::{Atom, List};

/// What this controller reads of the process's shared views: the claim a PV is bound to.
pub const NEEDS: Needs = Needs::CLAIM_REF;

/// The Event source, followed by the driver name (upstream's `csi-pv-monitor-controller-<driver>`).
pub const COMPONENT: &str = "csi-pv-monitor-controller";

/// A volume the driver reports abnormal (Warning; the message is the driver's).
pub const ABNORMAL: &str = "VolumeConditionAbnormal";
/// A volume healthy again after an abnormal Event (Normal).
pub const NORMAL: &str = "VolumeConditionNormal";
pub const NORMAL_MESSAGE: &str = "The Volume returns to the healthy state";
/// Pods using a claim are on a node that failed (Warning).
pub const NODE_FAILED: &str = "NodeFailed";
/// That node is Ready again (Warning, as upstream records it).
pub const NODE_RECOVERED: &str = "NodeRecovered";

/// The leader election lock name, as upstream's: `external-health-monitor-leader-<driver>`;
/// sanitized, the Lease's name; as it is, what its Events name.
pub fn lock_name(driver: &str) -> String {
    format!("external-health-monitor-leader-{driver}")
}

/// The Event source of `driver`'s monitor.
pub fn component(driver: &str) -> String {
    format!("{COMPONENT}-{driver}")
}

/// The reference an Event about `claim` names.
pub fn claim_ref(claim: &ClaimView) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(claim.namespace.to_string()),
        name: Some(claim.name().to_string()),
        uid: Some(claim.uid.to_string()),
        resource_version: claim.resource_version.to_option(),
        ..Default::default()
    }
}

/// A volume's health as the driver reports it: `None` when healthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Abnormal {
    pub message: String,
}

impl Abnormal {
    /// The health a CSI `VolumeCondition` says (none: healthy, as upstream reads it).
    pub fn of(condition: Option<&csi_proto::v1::VolumeCondition>) -> Option<Self> {
        condition.filter(|c| c.abnormal).map(|c| Self {
            message: c.message.clone(),
        })
    }
}

/// A pod, as far as the node watcher reads it: its node and the claims it mounts. Pods without
/// claims are not kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub name: Box<str>,
    pub namespace: Atom,
    /// `spec.nodeName`; empty while unscheduled.
    pub node: Atom,
    /// The claims of its `persistentVolumeClaim` volumes.
    pub claims: List<Atom>,
}

impl PodInfo {
    pub fn from_api(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        Self {
            name: pod.metadata.name.as_deref().unwrap_or_default().into(),
            namespace: Atom::new(pod.metadata.namespace.as_deref().unwrap_or_default()),
            node: Atom::new(
                spec.and_then(|s| s.node_name.as_deref())
                    .unwrap_or_default(),
            ),
            claims: spec
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(|c| Atom::new(&c.claim_name))
                .collect(),
        }
    }
}

/// What the node watcher reads of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    Ready,
    /// Its `Ready` condition is False or Unknown, since this time (seconds since the epoch,
    /// the condition's last transition; `None` when it has none).
    NotReady {
        since: Option<i64>,
    },
    /// `status.phase` is `Terminated`.
    Terminated,
    /// No `Ready` condition: never taken for failed.
    Unknown,
}

impl NodeHealth {
    pub fn from_api(node: &Node) -> Self {
        let status = node.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()) == Some("Terminated") {
            return Self::Terminated;
        }
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready");
        match ready {
            None => Self::Unknown,
            Some(c) if c.status == "True" => Self::Ready,
            Some(c) => Self::NotReady {
                since: c.last_transition_time.as_ref().map(|t| t.0.as_second()),
            },
        }
    }
}
