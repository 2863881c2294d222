//! Pure decisions: how the driver is monitored, which Event a volume's condition deserves,
//! when a node counts as failed, and the Events' texts. No I/O.

use std::time::Duration;

use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;

use crate::model::{Abnormal, NodeHealth};

/// How long a node stays NotReady before its pods' claims are reported (upstream's fixed
/// five minutes).
pub const NODE_NOT_READY_GRACE: Duration = Duration::from_secs(300);

/// How the driver is asked about its volumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One paged ListVolumes every `--list-volumes-interval` (preferred when offered).
    ListVolumes,
    /// One ControllerGetVolume per volume every `--monitor-interval`.
    GetVolume,
}

/// Why the driver cannot be monitored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unsupported {
    #[error("CSI driver does not support Plugin Controller Service, exiting")]
    NoControllerService,
    #[error(
        "CSI driver does not support Controller ListVolumes and GetVolume service or does not implement VolumeCondition, exiting"
    )]
    NoVolumeCondition,
}

/// The mode for a driver with `rpcs`: VOLUME_CONDITION and one of LIST_VOLUMES or GET_VOLUME
/// are needed, as upstream's.
pub fn mode(controller_service: bool, rpcs: &[Rpc]) -> Result<Mode, Unsupported> {
    if !controller_service {
        return Err(Unsupported::NoControllerService);
    }
    if !rpcs.contains(&Rpc::VolumeCondition) {
        return Err(Unsupported::NoVolumeCondition);
    }
    if rpcs.contains(&Rpc::ListVolumes) {
        Ok(Mode::ListVolumes)
    } else if rpcs.contains(&Rpc::GetVolume) {
        Ok(Mode::GetVolume)
    } else {
        Err(Unsupported::NoVolumeCondition)
    }
}

/// The Event a checked volume's claim gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// Warning `VolumeConditionAbnormal` with the driver's message, at every check while the
    /// volume is abnormal (repeats fold into the Event's count, which keeps it from expiring).
    Abnormal(String),
    /// Normal `VolumeConditionNormal`, once after the claim had an abnormal Event.
    Recovered,
}

/// What a check of a volume reports: `warned` says whether the claim has a Warning
/// `VolumeConditionAbnormal` Event (of any source, as upstream looks them up), `recovered`
/// whether its recovery was reported since.
pub fn report(abnormal: Option<&Abnormal>, warned: bool, recovered: bool) -> Option<Report> {
    match abnormal {
        Some(a) => Some(Report::Abnormal(a.message.clone())),
        None if warned && !recovered => Some(Report::Recovered),
        None => None,
    }
}

/// What to do about a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeStep {
    /// Report the claims of its pods as on a failed node, and remember it did.
    Mark,
    /// The node is gone: report its pods' claims, remember nothing.
    MarkGone,
    /// It was reported and is Ready again: say so, and forget it.
    Clean,
    /// NotReady, not yet for long enough: look again after this long.
    Wait(Duration),
    Nothing,
}

/// The step for a node in `health` (`None`: deleted), NotReady since `since` (seconds since
/// the epoch) when it is, at `now`; `marked` when its failure was reported.
pub fn node_step(health: Option<NodeHealth>, since: i64, now: i64, marked: bool) -> NodeStep {
    match health {
        None if marked => NodeStep::Nothing,
        None => NodeStep::MarkGone,
        Some(NodeHealth::Ready) if marked => NodeStep::Clean,
        Some(NodeHealth::Ready | NodeHealth::Unknown) => NodeStep::Nothing,
        Some(_) if marked => NodeStep::Nothing,
        Some(NodeHealth::Terminated) => NodeStep::Mark,
        Some(NodeHealth::NotReady { .. }) => {
            let elapsed = Duration::from_secs(u64::try_from(now - since).unwrap_or(0));
            match NODE_NOT_READY_GRACE.checked_sub(elapsed) {
                Some(left) => NodeStep::Wait(left + Duration::from_secs(1)),
                None => NodeStep::Mark,
            }
        }
    }
}

/// Upstream's `NodeFailed` message; the pods sorted by name.
pub fn node_failed_message(pods: &[&str], claim: &str, namespace: &str, node: &str) -> String {
    let mut pods = pods.to_vec();
    pods.sort_unstable();
    let mut listed = String::new();
    for pod in pods {
        listed.push_str(pod);
        listed.push(' ');
    }
    format!(
        "Pods: [ {listed}] consuming PVC: {claim} in namespace: {namespace} are now on a failed node: {node}"
    )
}

/// Upstream's `NodeRecovered` message.
pub fn node_recovered_message(node: &str) -> String {
    format!("Node: {node} recovered")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_follows_the_capabilities() {
        use Rpc::*;
        assert_eq!(
            mode(true, &[ListVolumes, GetVolume, VolumeCondition]),
            Ok(Mode::ListVolumes)
        );
        assert_eq!(
            mode(true, &[GetVolume, VolumeCondition]),
            Ok(Mode::GetVolume)
        );
        assert_eq!(
            mode(true, &[ListVolumes, GetVolume]),
            Err(Unsupported::NoVolumeCondition)
        );
        assert_eq!(
            mode(true, &[VolumeCondition]),
            Err(Unsupported::NoVolumeCondition)
        );
        assert_eq!(
            mode(false, &[ListVolumes, VolumeCondition]),
            Err(Unsupported::NoControllerService)
        );
    }

    #[test]
    fn an_abnormal_volume_is_reported_at_every_check_and_its_recovery_once() {
        let abnormal = Abnormal {
            message: "disk gone".into(),
        };
        assert_eq!(
            report(Some(&abnormal), false, false),
            Some(Report::Abnormal("disk gone".into()))
        );
        assert_eq!(
            report(Some(&abnormal), true, true),
            Some(Report::Abnormal("disk gone".into()))
        );
        assert_eq!(report(None, true, false), Some(Report::Recovered));
        assert_eq!(report(None, true, true), None, "reported once");
        assert_eq!(report(None, false, false), None, "never abnormal: nothing");
    }

    #[test]
    fn a_node_fails_after_five_minutes_not_ready() {
        let not_ready = Some(NodeHealth::NotReady { since: None });
        assert_eq!(
            node_step(not_ready, 1000, 1100, false),
            NodeStep::Wait(Duration::from_secs(201))
        );
        assert_eq!(node_step(not_ready, 1000, 1301, false), NodeStep::Mark);
        assert_eq!(
            node_step(not_ready, 1000, 2000, true),
            NodeStep::Nothing,
            "once"
        );
        assert_eq!(
            node_step(Some(NodeHealth::Ready), 0, 2000, true),
            NodeStep::Clean
        );
        assert_eq!(
            node_step(Some(NodeHealth::Ready), 0, 2000, false),
            NodeStep::Nothing
        );
        assert_eq!(
            node_step(Some(NodeHealth::Terminated), 0, 0, false),
            NodeStep::Mark
        );
        assert_eq!(
            node_step(Some(NodeHealth::Unknown), 0, 9999, false),
            NodeStep::Nothing
        );
        assert_eq!(node_step(None, 0, 0, false), NodeStep::MarkGone);
        assert_eq!(node_step(None, 0, 0, true), NodeStep::Nothing);
    }

    #[test]
    fn event_texts_are_upstreams() {
        assert_eq!(
            node_failed_message(&["pod-b", "pod-a"], "pvc1", "ns1", "node1"),
            "Pods: [ pod-a pod-b ] consuming PVC: pvc1 in namespace: ns1 are now on a failed node: node1"
        );
        assert_eq!(node_recovered_message("node1"), "Node: node1 recovered");
    }
}
