//! PersistentVolumeClaims: `ValidatePersistentVolumeClaim*` and the claim's status update.

use super::*;

#[derive(Debug, Clone, Copy)]
pub(super) struct ClaimOptions {
    allow_invalid_group: bool,
    volume_attributes_class: bool,
}

pub(super) fn claim_options(gates: &FeatureGates, old: Option<&Value>) -> ClaimOptions {
    let mut o = ClaimOptions {
        allow_invalid_group: false,
        volume_attributes_class: gates.enabled(Gate::VolumeAttributesClass),
    };
    if let Some(old) = old {
        o.allow_invalid_group = present(old, "/spec/dataSource/apiGroup")
            || present(old, "/spec/dataSourceRef/apiGroup");
        if present(old, "/spec/volumeAttributesClassName") {
            o.volume_attributes_class = true;
        }
    }
    o
}

/// `ValidatePersistentVolumeClaimSpec`.
pub(super) fn claim_spec(spec: &Value, opts: ClaimOptions) -> Vec<FieldError> {
    let mut errs = access_modes(
        spec,
        "spec.accessModes",
        "at least 1 access mode is required",
    );
    if let Some(sel) = spec.get("selector").filter(|s| !s.is_null()) {
        errs.extend(label_selector(sel, "spec.selector"));
    }
    let storage_field = "spec.resources[storage]";
    match spec.pointer("/resources/requests/storage") {
        None | Some(Value::Null) => errs.push(FieldError::required(storage_field, "")),
        Some(v) => {
            if let Some(Ok(q)) = quantity::from_json(v) {
                errs.extend(positive_quantity(storage_field, &q));
            }
        }
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
    let ds = spec.get("dataSource").filter(|v| v.is_object());
    let dsr = spec.get("dataSourceRef").filter(|v| v.is_object());
    if let Some(ds) = ds {
        errs.extend(data_source(ds, "spec.dataSource", opts.allow_invalid_group));
    }
    if let Some(dsr) = dsr {
        errs.extend(data_source(
            dsr,
            "spec.dataSourceRef",
            opts.allow_invalid_group,
        ));
        if let Some(ns) = str_at(dsr, "/namespace").filter(|n| !n.is_empty()) {
            errs.extend(invalid_each(
                "spec.dataSourceRef.namespace",
                ns,
                dns1123_label_errors(ns),
            ));
        }
    }
    // Upstream passes a field path as the value here, which renders as `{}`.
    let path_value = || BadValue::Json("{}".into());
    match (ds, dsr) {
        (Some(_), Some(r)) if !str_or_empty(r, "/namespace").is_empty() => {
            errs.push(FieldError::invalid(
                "spec",
                path_value(),
                "may not be specified when dataSourceRef.namespace is specified",
            ));
        }
        (Some(d), Some(r)) => {
            let same = d.get("apiGroup").filter(|g| !g.is_null())
                == r.get("apiGroup").filter(|g| !g.is_null())
                && d.get("kind") == r.get("kind")
                && d.get("name") == r.get("name");
            if !same {
                errs.push(FieldError::invalid(
                    "spec",
                    path_value(),
                    "must match dataSourceRef",
                ));
            }
        }
        _ => {}
    }
    if opts.volume_attributes_class
        && let Some(vac) = str_at(spec, "/volumeAttributesClassName").filter(|v| !v.is_empty())
    {
        errs.extend(class_name("spec.volumeAttributesClassName", vac));
    }
    errs
}

pub(super) fn label_selector(sel: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, req) in array(sel, "/matchExpressions").iter().enumerate() {
        let path = format!("{field}.matchExpressions[{i}]");
        let op = str_or_empty(req, "/operator");
        let values = array(req, "/values");
        match op {
            "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
                format!("{path}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::forbidden(
                format!("{path}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
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
    }
    if let Some(m) = object(sel, "/matchLabels") {
        for (k, v) in m {
            errs.extend(invalid_each(
                &format!("{field}.matchLabels"),
                k,
                qualified_name_errors(k),
            ));
            let v = v.as_str().unwrap_or("");
            errs.extend(invalid_each(
                &format!("{field}.matchLabels"),
                v,
                label_value_errors(v),
            ));
        }
    }
    errs
}

/// `ValidatePersistentVolumeClaim`: metadata and spec.
pub(super) fn claim(k: &Kind, obj: &Value, opts: ClaimOptions) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(claim_spec(obj.get("spec").unwrap_or(&Value::Null), opts));
    errs
}

/// The claim spec compared for immutability, quantities by value.
pub(super) fn comparable_claim_spec(spec: &Value) -> Value {
    let mut s = semantic(spec);
    for map in ["requests", "limits"] {
        if let Some(Value::Object(m)) = s.pointer_mut(&format!("/resources/{map}")) {
            for v in m.values_mut() {
                if let Some(Ok(q)) = quantity::from_json(v) {
                    *v = json!(q.canonical());
                }
            }
        }
    }
    if let Value::Object(m) = &mut s
        && m.get("volumeName").and_then(Value::as_str) == Some("")
    {
        // A Go string, not a pointer: empty is the same as absent.
        m.remove("volumeName");
    }
    s
}

pub(super) fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    object(obj, "/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

/// `ValidatePersistentVolumeClaimUpdate`.
pub(super) fn claim_update(
    k: &Kind,
    new: &Value,
    old: &Value,
    opts: ClaimOptions,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    errs.extend(claim(k, new, opts));
    let null = Value::Null;
    let new_spec = new.get("spec").unwrap_or(&null);
    let old_spec = old.get("spec").unwrap_or(&null);
    let mut new_clone = new_spec.clone();
    let mut old_clone = old_spec.clone();
    if !new_clone.is_object() {
        new_clone = json!({});
    }
    if !old_clone.is_object() {
        old_clone = json!({});
    }
    // The PV controller sets volumeName once.
    if str_or_empty(old_spec, "/volumeName").is_empty() {
        old_clone["volumeName"] = new_spec.get("volumeName").cloned().unwrap_or(Value::Null);
    }
    let old_ann = annotation(old, BETA_STORAGE_CLASS);
    let new_ann = annotation(new, BETA_STORAGE_CLASS);
    let old_sc = old_spec
        .get("storageClassName")
        .and_then(Value::as_str)
        .filter(|_| present(old_spec, "/storageClassName"));
    let new_sc = new_spec
        .get("storageClassName")
        .and_then(Value::as_str)
        .filter(|_| present(new_spec, "/storageClassName"));
    let upgrade_from_annotation = old_ann.is_some()
        && old_sc.is_none()
        && new_sc.is_some()
        && new_sc == old_ann
        && (new_ann.is_none() || new_ann == old_ann);
    if upgrade_from_annotation {
        new_clone["storageClassName"] = Value::Null;
    } else {
        if new_ann != old_ann {
            errs.push(FieldError::invalid(
                format!("metadata.annotations.{BETA_STORAGE_CLASS}"),
                BadValue::Str(new_ann.unwrap_or("").into()),
                "field is immutable",
            ));
        }
        if new_sc.is_some() && old_sc.is_none() && (old_ann.is_none() || new_sc == old_ann) {
            new_clone["storageClassName"] = old_clone
                .get("storageClassName")
                .cloned()
                .unwrap_or(Value::Null);
        }
    }
    let bound = str_or_empty(new, "/status/phase") == "Bound";
    if bound
        && new_clone
            .pointer("/resources/requests")
            .is_some_and(Value::is_object)
    {
        new_clone["resources"]["requests"]["storage"] = old_spec
            .pointer("/resources/requests/storage")
            .cloned()
            .unwrap_or(json!("0"));
    }
    if bound {
        new_clone["volumeAttributesClassName"] = old_clone
            .get("volumeAttributesClassName")
            .cloned()
            .unwrap_or(Value::Null);
    }
    let (a, b) = (
        comparable_claim_spec(&old_clone),
        comparable_claim_spec(&new_clone),
    );
    if a != b {
        errs.push(FieldError::forbidden(
            "spec",
            format!(
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n{}",
                diff_text("spec", &a, &b)
            ),
        ));
    }
    let zero = Quantity::parse("0").ok();
    let old_size = quantity_at(old_spec, "/resources/requests/storage").or(zero);
    let new_size = quantity_at(new_spec, "/resources/requests/storage").or(zero);
    let status_size = quantity_at(old, "/status/capacity/storage").or(zero);
    if new_size < old_size && new_size <= status_size {
        // RecoverVolumeExpansionFailure is locked on: shrinking is allowed down to status.capacity.
        errs.push(FieldError::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
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
        if opts.volume_attributes_class && present(old, "/status/currentVolumeAttributesClassName")
        {
            match new_vac.and_then(Value::as_str) {
                None => errs.push(FieldError::forbidden(
                    "spec.volumeAttributesClassName",
                    "update to nil is forbidden when status.currentVolumeAttributesClassName is not nil",
                )),
                Some("") => errs.push(FieldError::forbidden(
                    "spec.volumeAttributesClassName",
                    "update to empty string is forbidden when status.currentVolumeAttributesClassName is not nil",
                )),
                Some(_) => {}
            }
        }
    }
    errs
}

pub(super) const RESIZE_STATUSES: &[&str] = &[
    "ControllerResizeInProgress",
    "ControllerResizeInfeasible",
    "NodeResizeInProgress",
    "NodeResizeInfeasible",
    "NodeResizePending",
];

/// `ValidatePersistentVolumeClaimStatusUpdate` (the RecoverVolumeExpansionFailure
/// checks are always on: the gate is locked on in 1.34).
pub(super) fn claim_status_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    if array(new, "/spec/accessModes").is_empty() {
        errs.push(FieldError::required("Spec.accessModes", ""));
    }
    if let Some(cap) = object(new, "/status/capacity") {
        for (r, v) in cap {
            if let Some(Ok(q)) = quantity::from_json(v) {
                errs.extend(basic_resource(&format!("status.capacity[{r}]"), &q));
            }
        }
    }
    if let Some(statuses) = object(new, "/status/allocatedResourceStatuses") {
        for (r, v) in statuses {
            errs.extend(resource_key("status.allocatedResourceStatuses", r));
            if !RESIZE_STATUSES.contains(&v.as_str().unwrap_or("")) {
                errs.push(FieldError::not_supported(
                    "status.allocatedResourceStatuses",
                    BadValue::Str(r.clone()),
                    RESIZE_STATUSES,
                ));
            }
        }
    }
    if let Some(alloc) = object(new, "/status/allocatedResources") {
        for (r, v) in alloc {
            let key_errs = resource_key("status.allocatedResources", r);
            if !key_errs.is_empty() {
                errs.extend(key_errs);
                continue;
            }
            if let Some(Ok(q)) = quantity::from_json(v) {
                let field = format!("status.allocatedResources[{r}]");
                let basic = basic_resource(&field, &q);
                if basic.is_empty() && q.signum() < 0 {
                    errs.push(FieldError::invalid(
                        field,
                        BadValue::Str(q.canonical()),
                        "must be greater than or equal to 0",
                    ));
                }
                errs.extend(basic);
            }
        }
    }
    errs
}

pub(super) fn resource_key(field: &str, key: &str) -> Vec<FieldError> {
    let errs = invalid_each(field, key, qualified_name_errors(key));
    if !errs.is_empty() {
        return errs;
    }
    let native = !key.contains('/') || key.starts_with("kubernetes.io/");
    if native && key != "storage" {
        return vec![FieldError::not_supported(
            field,
            BadValue::Str(key.into()),
            &["storage"],
        )];
    }
    Vec::new()
}

// ---------------------------------------------------------------------------
// PersistentVolume

/// The volume sources of a PV spec, in the order upstream checks them, with
/// the field name its "more than 1 volume type" error uses.
pub(super) const PV_SOURCES: &[(&str, &str)] = &[
    ("hostPath", "hostPath"),
    ("gcePersistentDisk", "gcePersistentDisk"),
    ("awsElasticBlockStore", "awsElasticBlockStore"),
    ("glusterfs", "glusterfs"),
    ("flocker", "flocker"),
    ("nfs", "nfs"),
    ("rbd", "rbd"),
    ("quobyte", "quobyte"),
    ("cephfs", "cephFS"),
    ("iscsi", "iscsi"),
    ("cinder", "cinder"),
    ("fc", "fc"),
    ("flexVolume", "flexVolume"),
    ("azureFile", "azureFile"),
    ("vsphereVolume", "vsphereVolume"),
    ("photonPersistentDisk", "photonPersistentDisk"),
    ("portworxVolume", "portworxVolume"),
    ("azureDisk", "azureDisk"),
    ("scaleIO", "scaleIO"),
    ("local", "local"),
    ("storageos", "storageos"),
    ("csi", "csi"),
];

pub(super) const RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];

pub(super) fn no_backsteps(field: &str, path: &str) -> Vec<FieldError> {
    if path.split(['/', '\\']).any(|p| p == "..") {
        vec![FieldError::invalid(
            field,
            BadValue::Str(path.into()),
            "must not contain '..'",
        )]
    } else {
        Vec::new()
    }
}
