//! Kubernetes access modes as CSI access modes, as csi-lib-utils maps them.

use csi_proto::v1::volume_capability::access_mode::Mode;

/// Maps PV access modes to a CSI access mode, as csi-lib-utils' `ToCSIAccessMode` does.
pub fn to_csi<S: AsRef<str>>(modes: &[S], single_node_multi_writer: bool) -> Result<Mode, String> {
    let has = |mode: &str| modes.iter().any(|m| m.as_ref() == mode);
    let named: Vec<&str> = modes.iter().map(AsRef::as_ref).collect();
    let distinct = {
        let mut sorted = named.clone();
        sorted.sort();
        sorted.dedup();
        sorted.len()
    };
    if has("ReadWriteOncePod") {
        if distinct > 1 {
            return Err(
                "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume".into(),
            );
        }
        return Ok(if single_node_multi_writer {
            Mode::SingleNodeSingleWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    if has("ReadWriteMany") {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    match (has("ReadOnlyMany"), has("ReadWriteOnce")) {
        (true, true) => Err(
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume"
                .into(),
        ),
        (true, false) => Ok(Mode::MultiNodeReaderOnly),
        (false, true) => Ok(if single_node_multi_writer {
            Mode::SingleNodeMultiWriter
        } else {
            Mode::SingleNodeWriter
        }),
        (false, false) => Err(format!(
            "unsupported AccessMode combination: [{}]",
            named.join(" ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_mode_table() {
        let cases: &[(&[&str], bool, Result<Mode, &str>)] = &[
            (&["ReadWriteOnce"], false, Ok(Mode::SingleNodeWriter)),
            (&["ReadWriteOnce"], true, Ok(Mode::SingleNodeMultiWriter)),
            (&["ReadWriteOncePod"], false, Ok(Mode::SingleNodeWriter)),
            (
                &["ReadWriteOncePod"],
                true,
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOncePod"],
                true,
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (&["ReadOnlyMany"], false, Ok(Mode::MultiNodeReaderOnly)),
            (&["ReadOnlyMany"], true, Ok(Mode::MultiNodeReaderOnly)),
            (&["ReadWriteMany"], false, Ok(Mode::MultiNodeMultiWriter)),
            (
                &["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"],
                true,
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOnce"],
                false,
                Err(
                    "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume",
                ),
            ),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                false,
                Err(
                    "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume",
                ),
            ),
            (&[], false, Err("unsupported AccessMode combination: []")),
            (
                &["Bogus", "Other"],
                true,
                Err("unsupported AccessMode combination: [Bogus Other]"),
            ),
        ];
        for (modes, snmw, expected) in cases {
            let modes: Vec<String> = modes.iter().map(|s| s.to_string()).collect();
            let got = to_csi(&modes, *snmw);
            assert_eq!(got, expected.map_err(str::to_string), "{modes:?} {snmw}");
        }
    }
}
