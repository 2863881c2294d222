//! Feature gates of the API fields the sidecars read or write, with the
//! defaults of Kubernetes 1.34. A real API server drops the fields of a
//! disabled gate on write (keeping them only when the stored object already
//! had them), so a sidecar must cope with their absence.

use std::fmt::Write as _;

/// A gate the in-process server models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gate {
    /// GA in 1.34 (on): `volumeAttributesClassName` of PVCs and PVs, the PVC
    /// status fields `currentVolumeAttributesClassName` and
    /// `modifyVolumeStatus`, the `kubernetes.io/vac-protection` finalizer.
    VolumeAttributesClass,
    /// Beta in 1.34, off by default: VolumeAttachment
    /// `status.attachError.errorCode` / `status.detachError.errorCode` and
    /// CSIDriver `spec.nodeAllocatableUpdatePeriodSeconds`.
    MutableCSINodeAllocatableCount,
    /// Alpha, off: a PVC `spec.dataSourceRef` with a `namespace`.
    CrossNamespaceVolumeDataSource,
    /// Beta, on: CSIDriver `spec.seLinuxMount`.
    SELinuxMountReadWriteOncePod,
    /// Beta, on: watches that stream the list first (`sendInitialEvents`, KEP-3157); off,
    /// such a watch is refused with 422, as servers before 1.32 (or with the gate off) do.
    WatchList,
}

impl Gate {
    pub const ALL: [Gate; 5] = [
        Gate::VolumeAttributesClass,
        Gate::MutableCSINodeAllocatableCount,
        Gate::CrossNamespaceVolumeDataSource,
        Gate::SELinuxMountReadWriteOncePod,
        Gate::WatchList,
    ];

    /// The gate's name, as in `--feature-gates`.
    pub fn name(self) -> &'static str {
        match self {
            Gate::VolumeAttributesClass => "VolumeAttributesClass",
            Gate::MutableCSINodeAllocatableCount => "MutableCSINodeAllocatableCount",
            Gate::CrossNamespaceVolumeDataSource => "CrossNamespaceVolumeDataSource",
            Gate::SELinuxMountReadWriteOncePod => "SELinuxMountReadWriteOncePod",
            Gate::WatchList => "WatchList",
        }
    }

    /// The stage in 1.34 as the `kubernetes_feature_enabled` metric labels it (GA is empty).
    pub fn stage(self) -> &'static str {
        match self {
            Gate::VolumeAttributesClass => "",
            Gate::MutableCSINodeAllocatableCount
            | Gate::SELinuxMountReadWriteOncePod
            | Gate::WatchList => "BETA",
            Gate::CrossNamespaceVolumeDataSource => "ALPHA",
        }
    }

    /// The default in 1.34 (pkg/features/kube_features.go).
    pub fn default_enabled(self) -> bool {
        match self {
            Gate::VolumeAttributesClass | Gate::SELinuxMountReadWriteOncePod | Gate::WatchList => {
                true
            }
            Gate::MutableCSINodeAllocatableCount | Gate::CrossNamespaceVolumeDataSource => false,
        }
    }

    pub fn from_name(name: &str) -> Option<Gate> {
        Gate::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// The state of every modelled gate; `Default` is Kubernetes 1.34's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: [bool; Gate::ALL.len()],
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            enabled: Gate::ALL.map(Gate::default_enabled),
        }
    }
}

impl FeatureGates {
    fn index(gate: Gate) -> usize {
        Gate::ALL.iter().position(|g| *g == gate).unwrap_or(0)
    }

    pub fn enabled(&self, gate: Gate) -> bool {
        self.enabled[Self::index(gate)]
    }

    /// Turns a gate on or off, as `--feature-gates=<name>=<bool>` would.
    pub fn set(&mut self, gate: Gate, enabled: bool) -> &mut Self {
        self.enabled[Self::index(gate)] = enabled;
        self
    }

    /// Builder form of [`FeatureGates::set`].
    pub fn with(mut self, gate: Gate, enabled: bool) -> Self {
        self.set(gate, enabled);
        self
    }

    /// The `kubernetes_feature_enabled` gauge lines kube-apiserver serves on `/metrics`.
    pub fn metrics_text(&self) -> String {
        let mut out = String::from(
            "# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.\n# TYPE kubernetes_feature_enabled gauge\n",
        );
        let mut gates = Gate::ALL;
        gates.sort_by_key(|g| g.name());
        for g in gates {
            let _ = writeln!(
                out,
                "kubernetes_feature_enabled{{name=\"{}\",stage=\"{}\"}} {}",
                g.name(),
                g.stage(),
                u8::from(self.enabled(g))
            );
        }
        out
    }
}

/// Reads one gate from a `/metrics` text (a real server's or ours).
pub fn gate_from_metrics(text: &str, gate: Gate) -> Option<bool> {
    let needle = format!("kubernetes_feature_enabled{{name=\"{}\",", gate.name());
    text.lines()
        .find(|l| l.starts_with(&needle))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_those_of_1_34_and_metrics_round_trip() {
        let g = FeatureGates::default();
        assert!(g.enabled(Gate::VolumeAttributesClass));
        assert!(!g.enabled(Gate::MutableCSINodeAllocatableCount));
        let on = g.with(Gate::MutableCSINodeAllocatableCount, true);
        let text = on.metrics_text();
        assert!(text.contains(
            "kubernetes_feature_enabled{name=\"MutableCSINodeAllocatableCount\",stage=\"BETA\"} 1"
        ));
        assert_eq!(
            gate_from_metrics(&text, Gate::MutableCSINodeAllocatableCount),
            Some(true)
        );
        assert_eq!(
            gate_from_metrics(&g.metrics_text(), Gate::CrossNamespaceVolumeDataSource),
            Some(false)
        );
    }
}
