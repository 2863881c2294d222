//! `storage.k8s.io`: VolumeAttachments, StorageClasses and VolumeAttributesClasses.

use super::*;

/// `ValidateVolumeAttachment` and, on create, `ValidateVolumeAttachmentV1`.
pub(super) fn volume_attachment(k: &Kind, obj: &Value, v1: bool) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    let null = Value::Null;
    let spec = obj.get("spec").unwrap_or(&null);
    if str_or_empty(spec, "/attacher").is_empty() {
        errs.push(FieldError::required("spec.attacher", ""));
    }
    let pv = spec
        .pointer("/source/persistentVolumeName")
        .filter(|v| !v.is_null());
    let inline = spec
        .pointer("/source/inlineVolumeSpec")
        .filter(|v| !v.is_null());
    let msg = "must specify exactly one of inlineVolumeSpec and persistentVolumeName";
    match (pv, inline) {
        (None, None) => errs.push(FieldError::required("spec.source", msg)),
        (Some(_), Some(_)) => errs.push(FieldError::forbidden("spec.source", msg)),
        (Some(p), None) => {
            if p.as_str().unwrap_or("").is_empty() {
                errs.push(FieldError::required(
                    "spec.source.persistentVolumeName",
                    "must specify non empty persistentVolumeName",
                ));
            }
        }
        (None, Some(_)) => {}
    }
    let node = str_or_empty(spec, "/nodeName");
    errs.extend(invalid_each(
        "spec.nodeName",
        node,
        dns1123_subdomain_errors(node),
    ));
    if let Some(md) = object(obj, "/status/attachmentMetadata") {
        let size: usize = md
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum();
        if size > MAX_ATTACHMENT_METADATA {
            errs.push(FieldError::too_long(
                "status.attachmentMetadata",
                MAX_ATTACHMENT_METADATA,
            ));
        }
    }
    errs.extend(volume_error(
        obj.pointer("/status/attachError"),
        "status.attachError",
    ));
    errs.extend(volume_error(
        obj.pointer("/status/detachError"),
        "status.detachError",
    ));
    if v1 {
        errs.extend(csi_driver_name(
            "spec.attacher",
            str_or_empty(spec, "/attacher"),
        ));
        if let Some(p) = pv.and_then(Value::as_str) {
            errs.extend(invalid_each(
                "spec.source.persistentVolumeName",
                p,
                dns1123_subdomain_errors(p),
            ));
        }
    }
    errs
}

/// The VolumeAttachment spec as the internal Go struct marshals to JSON
/// (field names without JSON tags), for the immutability message.
pub(super) fn go_attachment_spec(spec: &Value) -> Value {
    let pv = spec.pointer("/source/persistentVolumeName").cloned();
    let inline = spec.pointer("/source/inlineVolumeSpec").cloned();
    json!({
        "Attacher": str_or_empty(spec, "/attacher"),
        "Source": {
            "PersistentVolumeName": pv.unwrap_or(Value::Null),
            "InlineVolumeSpec": inline.unwrap_or(Value::Null),
        },
        "NodeName": str_or_empty(spec, "/nodeName"),
    })
}

pub(super) fn go_attachment_spec_text(spec: &Value) -> String {
    // Go keeps struct field order, not sorted keys.
    let v = go_attachment_spec(spec);
    format!(
        "{{\"Attacher\":{},\"Source\":{{\"PersistentVolumeName\":{},\"InlineVolumeSpec\":{}}},\"NodeName\":{}}}",
        go_json(&v["Attacher"]),
        go_json(&v["Source"]["PersistentVolumeName"]),
        go_json(&v["Source"]["InlineVolumeSpec"]),
        go_json(&v["NodeName"]),
    )
}

pub(super) fn volume_attachment_update(k: &Kind, new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = volume_attachment(k, new, false);
    errs.extend(volume_attachment(k, new, false));
    let null = Value::Null;
    let (ns, os) = (
        new.get("spec").unwrap_or(&null),
        old.get("spec").unwrap_or(&null),
    );
    if semantic(ns) != semantic(os) {
        errs.push(FieldError::invalid(
            "spec",
            BadValue::Json(go_attachment_spec_text(ns)),
            "field is immutable",
        ));
    }
    errs
}

// ---------------------------------------------------------------------------
// StorageClass, VolumeAttributesClass

pub(super) fn provisioner(field: &str, name: &str) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(field, "")];
    }
    let lower = name.to_lowercase();
    invalid_each(field, &lower, qualified_name_errors(&lower))
}

pub(super) fn parameters(obj: &Value, allow_empty: bool) -> Vec<FieldError> {
    let params = object(obj, "/parameters");
    let mut errs = Vec::new();
    let len = params.map_or(0, Map::len);
    if len > 512 {
        return vec![FieldError::too_long("parameters", 512)];
    }
    let size: usize = params.map_or(0, |p| {
        p.iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum()
    });
    if params.is_some_and(|p| p.contains_key("")) {
        errs.push(FieldError::invalid(
            "parameters",
            BadValue::Str(String::new()),
            "field can not be empty.",
        ));
    }
    if size > 256 * 1024 {
        errs.push(FieldError::too_long("parameters", 256 * 1024));
    }
    if !allow_empty && len == 0 {
        errs.push(FieldError::required(
            "parameters",
            "must contain at least one key/value pair",
        ));
    }
    errs
}

/// `ValidateStorageClass` (allowedTopologies aside).
pub(super) fn storage_class(k: &Kind, obj: &Value) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(provisioner(
        "provisioner",
        str_or_empty(obj, "/provisioner"),
    ));
    errs.extend(parameters(obj, true));
    let policy = str_or_empty(obj, "/reclaimPolicy");
    if !policy.is_empty() && policy != "Delete" && policy != "Retain" {
        errs.push(FieldError::not_supported(
            "reclaimPolicy",
            BadValue::Str(policy.into()),
            &["Delete", "Retain"],
        ));
    }
    match str_at(obj, "/volumeBindingMode") {
        None => errs.push(FieldError::required("volumeBindingMode", "")),
        Some("Immediate" | "WaitForFirstConsumer") => {}
        Some(other) => errs.push(FieldError::not_supported(
            "volumeBindingMode",
            BadValue::Str(other.into()),
            &["Immediate", "WaitForFirstConsumer"],
        )),
    }
    errs
}

/// `ValidateVolumeAttributesClass`.
pub(super) fn volume_attributes_class(k: &Kind, obj: &Value) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(provisioner("driverName", str_or_empty(obj, "/driverName")));
    errs.extend(parameters(obj, false));
    errs
}

pub(super) fn storage_class_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    if semantic(new.get("parameters").unwrap_or(&Value::Null))
        != semantic(old.get("parameters").unwrap_or(&Value::Null))
    {
        errs.push(FieldError::forbidden(
            "parameters",
            "updates to parameters are forbidden.",
        ));
    }
    if str_or_empty(new, "/provisioner") != str_or_empty(old, "/provisioner") {
        errs.push(FieldError::forbidden(
            "provisioner",
            "updates to provisioner are forbidden.",
        ));
    }
    if str_or_empty(new, "/reclaimPolicy") != str_or_empty(old, "/reclaimPolicy") {
        errs.push(FieldError::forbidden(
            "reclaimPolicy",
            "updates to reclaimPolicy are forbidden.",
        ));
    }
    let mode = str_or_empty(new, "/volumeBindingMode");
    if mode != str_or_empty(old, "/volumeBindingMode") {
        errs.push(FieldError::invalid(
            "volumeBindingMode",
            BadValue::Str(mode.into()),
            "field is immutable",
        ));
    }
    errs
}

pub(super) fn volume_attributes_class_update(
    k: &Kind,
    new: &Value,
    old: &Value,
) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    if str_or_empty(new, "/driverName") != str_or_empty(old, "/driverName") {
        errs.push(FieldError::forbidden(
            "driverName",
            "updates to driverName are forbidden.",
        ));
    }
    if semantic(new.get("parameters").unwrap_or(&Value::Null))
        != semantic(old.get("parameters").unwrap_or(&Value::Null))
    {
        errs.push(FieldError::forbidden(
            "parameters",
            "updates to parameters are forbidden.",
        ));
    }
    errs.extend(volume_attributes_class(k, new));
    errs
}

// ---------------------------------------------------------------------------
// Events
