//! PersistentVolumes: `ValidatePersistentVolume*`, their CSI source, node affinity and
//! status.

use super::*;

pub(super) fn csi_driver_name(field: &str, driver: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if driver.is_empty() {
        errs.push(FieldError::required(field, ""));
    }
    if driver.len() > 63 {
        errs.push(FieldError::too_long(field, 63));
    }
    errs.extend(invalid_each(
        field,
        driver,
        dns1123_subdomain_errors(&driver.to_lowercase()),
    ));
    errs
}

pub(super) fn pv_secret_ref(field: &str, r: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = str_or_empty(r, "/name");
    if name.is_empty() {
        errs.push(FieldError::required(format!("{field}.name"), ""));
    } else {
        errs.extend(invalid_each(
            &format!("{field}.name"),
            name,
            dns1123_subdomain_errors(name),
        ));
    }
    let ns = str_or_empty(r, "/namespace");
    if ns.is_empty() {
        errs.push(FieldError::required(format!("{field}.namespace"), ""));
    } else {
        errs.extend(invalid_each(
            &format!("{field}.namespace"),
            ns,
            dns1123_label_errors(ns),
        ));
    }
    errs
}

pub(super) fn csi_source(src: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = csi_driver_name(&format!("{field}.driver"), str_or_empty(src, "/driver"));
    if str_or_empty(src, "/volumeHandle").is_empty() {
        errs.push(FieldError::required(format!("{field}.volumeHandle"), ""));
    }
    for r in [
        "controllerPublishSecretRef",
        "controllerExpandSecretRef",
        "nodePublishSecretRef",
        "nodeExpandSecretRef",
    ] {
        if let Some(v) = src.get(r).filter(|v| v.is_object()) {
            errs.extend(pv_secret_ref(&format!("{field}.{r}"), v));
        }
    }
    errs
}

pub(super) const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];

pub(super) fn node_selector_requirement(req: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let values = array(req, "/values");
    match str_or_empty(req, "/operator") {
        "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
            format!("{path}.values"),
            "must be specified when `operator` is 'In' or 'NotIn'",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::forbidden(
            format!("{path}.values"),
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt" if values.len() != 1 => errs.push(FieldError::required(
            format!("{path}.values"),
            "must be specified single value when `operator` is 'Lt' or 'Gt'",
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
        other => errs.push(FieldError::invalid(
            format!("{path}.operator"),
            BadValue::Str(other.into()),
            "not a valid selector operator",
        )),
    }
    let key = str_or_empty(req, "/key");
    errs.extend(invalid_each(
        &format!("{path}.key"),
        key,
        qualified_name_errors(key),
    ));
    for (i, v) in values.iter().enumerate() {
        let v = v.as_str().unwrap_or("");
        errs.extend(invalid_each(
            &format!("{path}.values[{i}]"),
            v,
            label_value_errors(v),
        ));
    }
    errs
}

pub(super) fn node_field_requirement(req: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let values = array(req, "/values");
    match str_or_empty(req, "/operator") {
        "In" | "NotIn" if values.len() != 1 => errs.push(FieldError::required(
            format!("{path}.values"),
            "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
        )),
        "In" | "NotIn" => {}
        other => errs.push(FieldError::invalid(
            format!("{path}.operator"),
            BadValue::Str(other.into()),
            "not a valid selector operator",
        )),
    }
    let key = str_or_empty(req, "/key");
    if key != "metadata.name" {
        errs.push(FieldError::invalid(
            format!("{path}.key"),
            BadValue::Str(key.into()),
            "not a valid field selector key",
        ));
    } else {
        for (i, v) in values.iter().enumerate() {
            let v = v.as_str().unwrap_or("");
            errs.extend(invalid_each(
                &format!("{path}.values[{i}]"),
                v,
                dns1123_subdomain_errors(v),
            ));
        }
    }
    errs
}

/// `validateVolumeNodeAffinity`; also says whether one is set.
pub(super) fn volume_node_affinity(na: &Value, field: &str) -> Vec<FieldError> {
    let Some(required) = na.get("required").filter(|r| r.is_object()) else {
        return vec![FieldError::required(
            format!("{field}.required"),
            "must specify required node constraints",
        )];
    };
    let terms_field = format!("{field}.required.nodeSelectorTerms");
    let terms = array(required, "/nodeSelectorTerms");
    if terms.is_empty() {
        return vec![FieldError::required(
            terms_field,
            "must have at least one node selector term",
        )];
    }
    let mut errs = Vec::new();
    for (i, term) in terms.iter().enumerate() {
        for (j, req) in array(term, "/matchExpressions").iter().enumerate() {
            errs.extend(node_selector_requirement(
                req,
                &format!("{terms_field}[{i}].matchExpressions[{j}]"),
            ));
        }
        for (j, req) in array(term, "/matchFields").iter().enumerate() {
            errs.extend(node_field_requirement(
                req,
                &format!("{terms_field}[{i}].matchFields[{j}]"),
            ));
        }
    }
    errs
}

/// `ValidatePersistentVolumeSpec` (not inline).
pub(super) fn volume_spec(spec: &Value, vac_enabled: bool) -> Vec<FieldError> {
    let mut errs = access_modes(spec, "spec.accessModes", "");
    let capacity = object(spec, "/capacity");
    let cap_len = capacity.map_or(0, Map::len);
    if cap_len == 0 {
        errs.push(FieldError::required("spec.capacity", ""));
    }
    if capacity.is_none_or(|c| !c.contains_key("storage")) || cap_len > 1 {
        errs.push(FieldError::not_supported(
            "spec.capacity",
            BadValue::json(spec.get("capacity").unwrap_or(&Value::Null)),
            &["storage"],
        ));
    }
    if let Some(cap) = capacity {
        for (r, v) in cap {
            if let Some(Ok(q)) = quantity::from_json(v) {
                let f = format!("spec.capacity[{r}]");
                errs.extend(basic_resource(&f, &q));
                errs.extend(positive_quantity(&f, &q));
            }
        }
    }
    let policy = str_or_empty(spec, "/persistentVolumeReclaimPolicy");
    if !policy.is_empty() && !RECLAIM_POLICIES.contains(&policy) {
        errs.push(FieldError::not_supported(
            "spec.persistentVolumeReclaimPolicy",
            BadValue::Str(policy.into()),
            RECLAIM_POLICIES,
        ));
    }
    let affinity = spec.get("nodeAffinity").filter(|v| v.is_object());
    if let Some(na) = affinity {
        errs.extend(volume_node_affinity(na, "spec.nodeAffinity"));
    }
    let mut sources = 0;
    for (key, name) in PV_SOURCES {
        let Some(src) = spec.get(*key).filter(|v| !v.is_null()) else {
            continue;
        };
        if sources > 0 && *key != "flexVolume" {
            errs.push(FieldError::forbidden(
                format!("spec.{name}"),
                "may not specify more than 1 volume type",
            ));
            continue;
        }
        sources += 1;
        match *key {
            "hostPath" => {
                let p = str_or_empty(src, "/path");
                if p.is_empty() {
                    errs.push(FieldError::required("spec.hostPath.path", ""));
                } else {
                    errs.extend(no_backsteps("spec.hostPath.path", p));
                    if let Some(t) = str_at(src, "/type")
                        && !HOST_PATH_TYPES.contains(&t)
                    {
                        errs.push(FieldError::not_supported(
                            "spec.hostPath.type",
                            BadValue::Str(t.into()),
                            HOST_PATH_TYPES,
                        ));
                    }
                }
            }
            "nfs" => {
                if str_or_empty(src, "/server").is_empty() {
                    errs.push(FieldError::required("spec.nfs.server", ""));
                }
                let p = str_or_empty(src, "/path");
                if p.is_empty() {
                    errs.push(FieldError::required("spec.nfs.path", ""));
                }
                if !p.starts_with('/') {
                    errs.push(FieldError::invalid(
                        "spec.nfs.path",
                        BadValue::Str(p.into()),
                        "must be an absolute path",
                    ));
                }
            }
            "local" => {
                let p = str_or_empty(src, "/path");
                if p.is_empty() {
                    errs.push(FieldError::required("spec.local.path", ""));
                } else {
                    errs.extend(no_backsteps("spec.local.path", p));
                }
                if affinity.is_none() {
                    errs.push(FieldError::required(
                        "spec.nodeAffinity",
                        "Local volume requires node affinity",
                    ));
                }
            }
            "csi" => errs.extend(csi_source(src, "spec.csi")),
            _ => {}
        }
    }
    if sources == 0 {
        errs.push(FieldError::required("spec", "must specify a volume type"));
    }
    if policy == "Recycle"
        && str_at(spec, "/hostPath/path").is_some_and(|p| p.trim_end_matches('/').is_empty())
    {
        errs.push(FieldError::forbidden(
            "spec.persistentVolumeReclaimPolicy",
            "may not be 'recycle' for a hostPath mount of '/'",
        ));
    }
    if let Some(class) = str_at(spec, "/storageClassName").filter(|c| !c.is_empty()) {
        errs.extend(class_name("spec.storageClassName", class));
    }
    if let Some(mode) = str_at(spec, "/volumeMode")
        && !VOLUME_MODES.contains(&mode)
    {
        errs.push(FieldError::not_supported(
            "spec.volumeMode",
            BadValue::Str(mode.into()),
            VOLUME_MODES,
        ));
    }
    if vac_enabled && let Some(vac) = str_at(spec, "/volumeAttributesClassName") {
        if vac.is_empty() {
            errs.push(FieldError::required(
                "spec.volumeAttributesClassName",
                "an empty string is disallowed",
            ));
        } else {
            errs.extend(class_name("spec.volumeAttributesClassName", vac));
        }
        if !present(spec, "/csi") {
            errs.push(FieldError::required(
                "spec.csi",
                "has to be specified when using volumeAttributesClassName",
            ));
        }
    }
    errs
}

pub(super) fn volume_vac_enabled(gates: &FeatureGates, old: Option<&Value>) -> bool {
    gates.enabled(Gate::VolumeAttributesClass)
        || old.is_some_and(|o| present(o, "/spec/volumeAttributesClassName"))
}

/// `ValidatePersistentVolume`.
pub(super) fn volume(k: &Kind, obj: &Value, vac_enabled: bool) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(volume_spec(
        obj.get("spec").unwrap_or(&Value::Null),
        vac_enabled,
    ));
    errs
}

/// The PV spec fields that hold its volume source (`PersistentVolumeSource`, inlined in v1).
pub(super) fn volume_source(spec: &Value) -> Value {
    let mut out = Map::new();
    for (key, _) in PV_SOURCES {
        if let Some(v) = spec.get(*key) {
            out.insert((*key).to_string(), v.clone());
        }
    }
    semantic(&Value::Object(out))
}

pub(super) const BETA_TO_GA_LABELS: &[(&str, &str)] = &[
    (
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    ),
    (
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
    (
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
    ),
];

/// Node affinity with beta topology keys of the old object mapped to the GA
/// keys where the new one uses them (the one change upstream allows).
pub(super) fn affinity_equal(new: &Value, old: &Value) -> bool {
    let mut old = semantic(old);
    let new = semantic(new);
    if let (Some(old_terms), Some(new_terms)) = (
        old.pointer_mut("/required/nodeSelectorTerms")
            .and_then(Value::as_array_mut),
        new.pointer("/required/nodeSelectorTerms")
            .and_then(Value::as_array),
    ) {
        for (ot, nt) in old_terms.iter_mut().zip(new_terms) {
            let new_exprs = array(nt, "/matchExpressions");
            if let Some(old_exprs) = ot.get_mut("matchExpressions").and_then(Value::as_array_mut) {
                for (oe, ne) in old_exprs.iter_mut().zip(new_exprs) {
                    let (ok, nk) = (str_or_empty(oe, "/key"), str_or_empty(ne, "/key"));
                    if ok != nk && BETA_TO_GA_LABELS.contains(&(ok, nk)) {
                        oe["key"] = json!(nk);
                    }
                }
            }
        }
    }
    old == new
}

/// `ValidatePersistentVolumeUpdate` (after `ValidatePersistentVolume` of the new object).
pub(super) fn volume_update(
    k: &Kind,
    new: &Value,
    old: &Value,
    vac_enabled: bool,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    let mut errs = volume(k, new, vac_enabled);
    let null = Value::Null;
    let new_spec = new.get("spec").unwrap_or(&null);
    let old_spec = old.get("spec").unwrap_or(&null);
    let mut new_source = volume_source(new_spec);
    let old_source = volume_source(old_spec);
    // A controllerExpandSecretRef may be added to a CSI volume later.
    if present(old_spec, "/csi")
        && !present(old_spec, "/csi/controllerExpandSecretRef")
        && let Some(csi) = new_source.get_mut("csi").and_then(Value::as_object_mut)
    {
        csi.remove("controllerExpandSecretRef");
    }
    if new_source != old_source {
        errs.push(FieldError::forbidden(
            "spec.persistentvolumesource",
            format!(
                "spec.persistentvolumesource is immutable after creation\n{}",
                diff_text("spec", &old_source, &new_source)
            ),
        ));
    }
    let new_mode = new_spec.get("volumeMode").filter(|v| !v.is_null());
    if new_mode != old_spec.get("volumeMode").filter(|v| !v.is_null()) {
        errs.push(FieldError::invalid(
            "volumeMode",
            BadValue::json(new_mode.unwrap_or(&Value::Null)),
            "field is immutable",
        ));
    }
    if let Some(old_na) = old_spec.get("nodeAffinity").filter(|v| !v.is_null()) {
        let new_na = new_spec.get("nodeAffinity").unwrap_or(&null);
        if !affinity_equal(new_na, old_na) {
            errs.push(FieldError::invalid(
                "nodeAffinity",
                BadValue::json(new_na),
                "field is immutable, except for updating from beta label to GA",
            ));
        }
    }
    let new_vac = new_spec
        .get("volumeAttributesClassName")
        .filter(|v| !v.is_null());
    let old_vac = old_spec
        .get("volumeAttributesClassName")
        .filter(|v| !v.is_null());
    if new_vac != old_vac {
        if !gates.enabled(Gate::VolumeAttributesClass) {
            errs.push(FieldError::forbidden(
                "spec.volumeAttributesClassName",
                "update is forbidden when the VolumeAttributesClass feature gate is disabled",
            ));
        }
        if vac_enabled && old_vac.is_some() && new_vac.is_none() {
            errs.push(FieldError::forbidden(
                "spec.volumeAttributesClassName",
                "update from non-nil value to nil is forbidden",
            ));
        }
    }
    errs
}

// ---------------------------------------------------------------------------
// VolumeAttachment

pub(super) const MAX_ATTACHMENT_METADATA: usize = 256 * 1024;
pub(super) const MAX_VOLUME_ERROR_MESSAGE: usize = 1024;

pub(super) fn volume_error(e: Option<&Value>, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(e) = e.filter(|e| e.is_object()) else {
        return errs;
    };
    if str_or_empty(e, "/message").len() > MAX_VOLUME_ERROR_MESSAGE {
        // Upstream reports the metadata limit here, not the message limit.
        errs.push(FieldError::too_long(
            format!("{field}.message"),
            MAX_ATTACHMENT_METADATA,
        ));
    }
    if let Some(code) = e.get("errorCode").and_then(Value::as_i64)
        && code < 0
    {
        errs.push(FieldError::invalid(
            format!("{field}.errorCode"),
            BadValue::Int(i128::from(code)),
            format!("must be between 0 and {}, inclusive", i32::MAX),
        ));
    }
    errs
}
