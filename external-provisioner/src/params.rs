//! StorageClass parameters as upstream reads them: the reserved `csi.storage.k8s.io/` keys, the
//! filesystem type, and the secret references with their templates.

use std::collections::BTreeMap;

use sidecar_kit::values::names::{is_dns1123_label, is_dns1123_subdomain, resolve_template};

use crate::model::SecretRef;

pub const PREFIX: &str = "csi.storage.k8s.io/";
pub const FSTYPE_KEY: &str = "csi.storage.k8s.io/fstype";
pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// One kind of secret a StorageClass can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecretKind {
    /// The name in error messages, as upstream's.
    pub name: &'static str,
    pub name_key: &'static str,
    pub namespace_key: &'static str,
    /// Keys of the pre-`csi.storage.k8s.io/` era: honoured, warned about, not stripped.
    pub deprecated: Option<(&'static str, &'static str)>,
}

pub const DEFAULT_SECRET: SecretKind = SecretKind {
    name: "Default",
    name_key: "csi.storage.k8s.io/secret-name",
    namespace_key: "csi.storage.k8s.io/secret-namespace",
    deprecated: None,
};
pub const PROVISIONER_SECRET: SecretKind = SecretKind {
    name: "Provisioner",
    name_key: "csi.storage.k8s.io/provisioner-secret-name",
    namespace_key: "csi.storage.k8s.io/provisioner-secret-namespace",
    deprecated: Some(("csiProvisionerSecretName", "csiProvisionerSecretNamespace")),
};
pub const CONTROLLER_PUBLISH_SECRET: SecretKind = SecretKind {
    name: "ControllerPublish",
    name_key: "csi.storage.k8s.io/controller-publish-secret-name",
    namespace_key: "csi.storage.k8s.io/controller-publish-secret-namespace",
    deprecated: Some((
        "csiControllerPublishSecretName",
        "csiControllerPublishSecretNamespace",
    )),
};
pub const NODE_STAGE_SECRET: SecretKind = SecretKind {
    name: "NodeStage",
    name_key: "csi.storage.k8s.io/node-stage-secret-name",
    namespace_key: "csi.storage.k8s.io/node-stage-secret-namespace",
    deprecated: Some(("csiNodeStageSecretName", "csiNodeStageSecretNamespace")),
};
pub const NODE_PUBLISH_SECRET: SecretKind = SecretKind {
    name: "NodePublish",
    name_key: "csi.storage.k8s.io/node-publish-secret-name",
    namespace_key: "csi.storage.k8s.io/node-publish-secret-namespace",
    deprecated: Some(("csiNodePublishSecretName", "csiNodePublishSecretNamespace")),
};
pub const CONTROLLER_EXPAND_SECRET: SecretKind = SecretKind {
    name: "ControllerExpand",
    name_key: "csi.storage.k8s.io/controller-expand-secret-name",
    namespace_key: "csi.storage.k8s.io/controller-expand-secret-namespace",
    deprecated: None,
};
pub const NODE_EXPAND_SECRET: SecretKind = SecretKind {
    name: "NodeExpand",
    name_key: "csi.storage.k8s.io/node-expand-secret-name",
    namespace_key: "csi.storage.k8s.io/node-expand-secret-namespace",
    deprecated: None,
};
pub const CONTROLLER_MODIFY_SECRET: SecretKind = SecretKind {
    name: "ControllerModify",
    name_key: "csi.storage.k8s.io/controller-modify-secret-name",
    namespace_key: "csi.storage.k8s.io/controller-modify-secret-namespace",
    deprecated: None,
};

const SECRET_KINDS: [SecretKind; 8] = [
    DEFAULT_SECRET,
    PROVISIONER_SECRET,
    CONTROLLER_PUBLISH_SECRET,
    NODE_STAGE_SECRET,
    NODE_PUBLISH_SECRET,
    CONTROLLER_EXPAND_SECRET,
    NODE_EXPAND_SECRET,
    CONTROLLER_MODIFY_SECRET,
];

/// What the templates of a secret reference may name.
#[derive(Clone, Debug, Default)]
pub struct TemplateInputs<'a> {
    pub pv_name: &'a str,
    /// The claim's namespace and name; `None` when the PV has no claimRef.
    pub claim: Option<(&'a str, &'a str)>,
    pub claim_annotations: Option<&'a BTreeMap<String, String>>,
}

/// The parameters handed to the driver: every key but the reserved ones (deprecated secret keys
/// stay, as upstream keeps them). An unknown reserved key is an error.
pub fn driver_parameters(
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (key, value) in params {
        if key.starts_with(PREFIX) {
            let known = key == FSTYPE_KEY
                || SECRET_KINDS
                    .iter()
                    .any(|k| key == k.name_key || key == k.namespace_key);
            if !known {
                return Err(format!(
                    "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"{key}\" with reserved namespace {PREFIX}"
                ));
            }
        } else {
            out.insert(key.clone(), value.clone());
        }
    }
    Ok(out)
}

/// The filesystem type: `csi.storage.k8s.io/fstype` or the deprecated `fstype` (any case), else
/// `default`. Both given is an error. The second value says whether the deprecated key was used.
pub fn fs_type(params: &BTreeMap<String, String>, default: &str) -> Result<(String, bool), String> {
    let mut found = Vec::new();
    let mut deprecated = false;
    for (key, value) in params {
        if key.eq_ignore_ascii_case("fstype") {
            deprecated = true;
            found.push(value.clone());
        } else if key == FSTYPE_KEY {
            found.push(value.clone());
        }
    }
    if found.len() > 1 {
        return Err(format!(
            "fstype specified in parameters with both \"fstype\" and \"{FSTYPE_KEY}\" keys"
        ));
    }
    let fs_type = found
        .pop()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| default.to_string());
    Ok((fs_type, deprecated))
}

/// The name and namespace templates of one secret kind; `None` when the class names none.
fn templates(
    kind: &SecretKind,
    params: &BTreeMap<String, String>,
) -> Result<Option<(String, String)>, String> {
    let mut names = Vec::new();
    let mut namespaces = Vec::new();
    if let Some((name_key, namespace_key)) = kind.deprecated {
        names.extend(params.get(name_key));
        namespaces.extend(params.get(namespace_key));
    }
    names.extend(params.get(kind.name_key));
    namespaces.extend(params.get(kind.namespace_key));
    let kind_name = kind.name;
    match (names.as_slice(), namespaces.as_slice()) {
        ([], []) => Ok(None),
        (n, ns) if n.len() > 1 || ns.len() > 1 => Err(format!(
            "{kind_name} secrets specified in parameters with both \"csi\" and \"{PREFIX}\" keys"
        )),
        ([name], [namespace]) => {
            if name.is_empty() || namespace.is_empty() {
                Err(format!(
                    "{kind_name} secrets specified in parameters but value of either namespace or name is empty"
                ))
            } else {
                Ok(Some(((*name).clone(), (*namespace).clone())))
            }
        }
        _ => Err(format!(
            "either name and namespace for {kind_name} secrets specified, Both must be specified"
        )),
    }
}

/// The deprecated keys a class uses, for a warning.
pub fn deprecated_keys(params: &BTreeMap<String, String>) -> Vec<&'static str> {
    SECRET_KINDS
        .iter()
        .filter_map(|k| k.deprecated)
        .flat_map(|(a, b)| [a, b])
        .filter(|k| params.contains_key(*k))
        .collect()
}

/// Resolves the secret of `kind` (falling back to the default pair) for a volume, with the
/// error texts of upstream. `Ok(None)`: the class names no such secret.
pub fn secret_ref(
    kind: &SecretKind,
    params: &BTreeMap<String, String>,
    inputs: &TemplateInputs<'_>,
) -> Result<Option<SecretRef>, String> {
    let found = templates(kind, params)
        .map_err(|e| format!("failed to get name and namespace template from params: {e}"))?;
    let found = match found {
        Some(found) => Some(found),
        None => templates(&DEFAULT_SECRET, params).map_err(|e| {
            format!("failed to get default name and namespace template from params: {e}")
        })?,
    };
    let Some((name_template, namespace_template)) = found else {
        return Ok(None);
    };

    let mut namespace_params = BTreeMap::new();
    namespace_params.insert("pv.name".to_string(), inputs.pv_name.to_string());
    if let Some((namespace, _)) = inputs.claim {
        namespace_params.insert("pvc.namespace".to_string(), namespace.to_string());
    }
    let namespace = resolve_template(&namespace_template, &namespace_params)
        .map_err(|e| format!("error resolving value {namespace_template:?}: {e}"))?;
    if !is_dns1123_label(&namespace) {
        return Err(if namespace != namespace_template {
            format!(
                "{namespace_template:?} resolved to {namespace:?} which is not a valid namespace name"
            )
        } else {
            format!("{namespace_template:?} is not a valid namespace name")
        });
    }

    let mut name_params = namespace_params;
    if let Some((_, name)) = inputs.claim {
        name_params.insert("pvc.name".to_string(), name.to_string());
    }
    for (key, value) in inputs.claim_annotations.into_iter().flatten() {
        name_params.insert(format!("pvc.annotations['{key}']"), value.clone());
    }
    let name = resolve_template(&name_template, &name_params)
        .map_err(|e| format!("error resolving value {name_template:?}: {e}"))?;
    if !is_dns1123_subdomain(&name) {
        return Err(if name != name_template {
            format!("{name_template:?} resolved to {name:?} which is not a valid secret name")
        } else {
            format!("{name_template:?} is not a valid secret name")
        });
    }
    Ok(Some(SecretRef { namespace, name }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn inputs<'a>(annotations: &'a BTreeMap<String, String>) -> TemplateInputs<'a> {
        TemplateInputs {
            pv_name: "pvc-123",
            claim: Some(("ns", "claim")),
            claim_annotations: Some(annotations),
        }
    }

    #[test]
    fn reserved_keys_are_stripped_and_unknown_ones_refused() {
        let p = params(&[
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("csi.storage.k8s.io/provisioner-secret-name", "s"),
            ("csiProvisionerSecretName", "s"),
            ("type", "fast"),
        ]);
        let out = driver_parameters(&p).unwrap();
        assert_eq!(
            out,
            params(&[("csiProvisionerSecretName", "s"), ("type", "fast")])
        );
        let err = driver_parameters(&params(&[("csi.storage.k8s.io/foo", "x")])).unwrap_err();
        assert_eq!(
            err,
            "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/foo\" with reserved namespace csi.storage.k8s.io/"
        );
    }

    #[test]
    fn fs_type_rules() {
        assert_eq!(fs_type(&params(&[]), ""), Ok((String::new(), false)));
        assert_eq!(fs_type(&params(&[]), "ext4"), Ok(("ext4".into(), false)));
        assert_eq!(
            fs_type(&params(&[(FSTYPE_KEY, "xfs")]), "ext4"),
            Ok(("xfs".into(), false))
        );
        assert_eq!(
            fs_type(&params(&[("FSType", "xfs")]), ""),
            Ok(("xfs".into(), true))
        );
        assert!(fs_type(&params(&[("fstype", "a"), (FSTYPE_KEY, "b")]), "").is_err());
    }

    #[test]
    fn secret_templates_resolve_as_upstream() {
        let annotations = params(&[("team", "blue")]);
        let p = params(&[
            (
                "csi.storage.k8s.io/provisioner-secret-name",
                "${pvc.name}-${pvc.annotations['team']}",
            ),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
        ]);
        assert_eq!(
            secret_ref(&PROVISIONER_SECRET, &p, &inputs(&annotations)),
            Ok(Some(SecretRef {
                namespace: "ns".into(),
                name: "claim-blue".into()
            }))
        );
        // The default pair serves every kind not named.
        let d = params(&[
            ("csi.storage.k8s.io/secret-name", "${pv.name}"),
            ("csi.storage.k8s.io/secret-namespace", "kube-system"),
        ]);
        assert_eq!(
            secret_ref(&NODE_STAGE_SECRET, &d, &inputs(&annotations)),
            Ok(Some(SecretRef {
                namespace: "kube-system".into(),
                name: "pvc-123".into()
            }))
        );
        assert_eq!(
            secret_ref(&NODE_STAGE_SECRET, &params(&[]), &inputs(&annotations)),
            Ok(None)
        );
    }

    #[test]
    fn secret_errors_have_upstream_texts() {
        let annotations = BTreeMap::new();
        let only_name = params(&[("csi.storage.k8s.io/provisioner-secret-name", "s")]);
        assert_eq!(
            secret_ref(&PROVISIONER_SECRET, &only_name, &inputs(&annotations)).unwrap_err(),
            "failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified"
        );
        let both = params(&[
            ("csi.storage.k8s.io/provisioner-secret-name", "s"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
            ("csiProvisionerSecretName", "s"),
            ("csiProvisionerSecretNamespace", "n"),
        ]);
        assert!(secret_ref(&PROVISIONER_SECRET, &both, &inputs(&annotations))
            .unwrap_err()
            .contains("Provisioner secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"));
        let empty = params(&[
            ("csi.storage.k8s.io/provisioner-secret-name", ""),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
        ]);
        assert!(
            secret_ref(&PROVISIONER_SECRET, &empty, &inputs(&annotations))
                .unwrap_err()
                .ends_with("value of either namespace or name is empty")
        );
        let bad_token = params(&[
            ("csi.storage.k8s.io/provisioner-secret-name", "${pvc.name}"),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.name}",
            ),
        ]);
        assert_eq!(
            secret_ref(&PROVISIONER_SECRET, &bad_token, &inputs(&annotations)).unwrap_err(),
            "error resolving value \"${pvc.name}\": invalid tokens: [\"pvc.name\"]"
        );
        let bad_namespace = params(&[
            ("csi.storage.k8s.io/provisioner-secret-name", "s"),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pv.name}X",
            ),
        ]);
        assert_eq!(
            secret_ref(&PROVISIONER_SECRET, &bad_namespace, &inputs(&annotations)).unwrap_err(),
            "\"${pv.name}X\" resolved to \"pvc-123X\" which is not a valid namespace name"
        );
        let bad_name = params(&[
            ("csi.storage.k8s.io/provisioner-secret-name", "Bad_Name"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "n"),
        ]);
        assert_eq!(
            secret_ref(&PROVISIONER_SECRET, &bad_name, &inputs(&annotations)).unwrap_err(),
            "\"Bad_Name\" is not a valid secret name"
        );
    }
}
