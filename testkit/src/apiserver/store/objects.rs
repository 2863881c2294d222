//! What the store does to an object on its own: its metadata read and written, the
//! defaults and normalizations kube-apiserver applies before storing, and the checks of an
//! update against the stored object.

use super::*;

/// The current time as the RFC 3339 string Kubernetes uses (second precision).
pub fn now_timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

pub(super) fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

pub(super) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(super) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The object's `metadata.resourceVersion` as a number (0 when absent).
pub fn resource_version_of(obj: &Value) -> u64 {
    meta_str(obj, "resourceVersion").parse().unwrap_or(0)
}

/// The store key of an object.
pub fn key_of(obj: &Value) -> ObjKey {
    (
        meta_str(obj, "namespace").to_string(),
        meta_str(obj, "name").to_string(),
    )
}

pub(super) fn finalizers(obj: &Value) -> Vec<&str> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub(super) fn being_deleted(obj: &Value) -> bool {
    meta(obj).is_some_and(|m| m.get("deletionTimestamp").is_some_and(|v| !v.is_null()))
}

/// The object without metadata and status: what `generation` tracks.
pub(super) fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

pub(super) fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

pub(super) fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

pub(super) fn encode_continue(rv: u64, key: &ObjKey) -> String {
    hex_encode(
        json!({"rv": rv, "start": [key.0, key.1]})
            .to_string()
            .as_bytes(),
    )
}

pub(super) fn decode_continue(token: &str) -> Option<(u64, ObjKey)> {
    let v: Value = serde_json::from_slice(&hex_decode(token)?).ok()?;
    let rv = v.get("rv")?.as_u64()?;
    let start = v.get("start")?.as_array()?;
    Some((
        rv,
        (
            start.first()?.as_str()?.to_string(),
            start.get(1)?.as_str()?.to_string(),
        ),
    ))
}

/// Checks and fills `apiVersion`/`kind` of a request body.
pub(super) fn check_type(k: &Kind, obj: &mut Value) -> Result<(), ApiError> {
    let Value::Object(m) = obj else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let api_version = k.api_version();
    for (field, want) in [("apiVersion", api_version.as_str()), ("kind", k.kind)] {
        match m.get(field).and_then(Value::as_str) {
            None | Some("") => {
                m.insert(field.into(), json!(want));
            }
            Some(got) if got == want => {}
            Some(got) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({}) does not match the expected API version ({api_version}) or kind ({got}) does not match {}",
                    m.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                    k.kind
                )));
            }
        }
    }
    Ok(())
}

/// What the real server's v1-to-internal conversion and defaulting do to a
/// Secret on every write: `stringData` is merged into `data` (as the UTF-8
/// bytes, winning over `data` for the same key) and never stored, `data` must
/// be base64, and `type` defaults to `Opaque`.
pub fn normalize_secret(k: &Kind, obj: &mut Value) -> Result<(), ApiError> {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let Value::Object(m) = obj else {
        return Ok(());
    };
    let string_data = m.remove("stringData");
    if let Some(data) = m.get("data").and_then(Value::as_object) {
        for (key, v) in data {
            let ok = v.as_str().is_some_and(|s| STANDARD.decode(s).is_ok()) || v.is_null();
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data.{key}"
                )));
            }
        }
    }
    match string_data {
        None | Some(Value::Null) => {}
        Some(Value::Object(sd)) if sd.is_empty() => {}
        Some(Value::Object(sd)) => {
            if !m.get("data").is_some_and(Value::is_object) {
                m.insert("data".into(), json!({}));
            }
            if let Some(Value::Object(data)) = m.get_mut("data") {
                for (key, v) in sd {
                    let Some(s) = v.as_str() else {
                        return Err(ApiError::bad_request(format!(
                            "Secret in version \"v1\" cannot be handled as a Secret: stringData.{key} must be a string"
                        )));
                    };
                    data.insert(key, json!(STANDARD.encode(s.as_bytes())));
                }
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "Secret in version \"v1\" cannot be handled as a Secret: stringData must be an object",
            ));
        }
    }
    if m.get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        m.insert("type".into(), json!("Opaque"));
    }
    if let Some(data) = m.get("data").and_then(Value::as_object) {
        let name = m
            .get("metadata")
            .and_then(|md| md.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        for key in data.keys() {
            if !is_config_key(key) {
                return Err(ApiError::invalid(
                    k,
                    name,
                    &format!("data[{key}]"),
                    "FieldValueInvalid",
                    &format!(
                        "Invalid value: {key:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The defaulting the real server applies to every decoded object of the
/// storage kinds (SetDefaults_* of core/v1 and storage/v1).
pub fn apply_defaults(k: &Kind, obj: &mut Value) {
    // `section` is "" for top-level fields, else a top-level object such as "spec".
    fn default(obj: &mut Value, section: &str, field: &str, value: &str) {
        let Value::Object(root) = obj else {
            return;
        };
        let target = if section.is_empty() {
            root
        } else {
            match root.entry(section).or_insert_with(|| json!({})) {
                Value::Object(m) => m,
                _ => return,
            }
        };
        let missing = target
            .get(field)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""));
        if missing {
            target.insert(field.into(), json!(value));
        }
    }
    match (k.group, k.kind) {
        ("", "PersistentVolume") => {
            default(obj, "spec", "persistentVolumeReclaimPolicy", "Retain");
            default(obj, "spec", "volumeMode", "Filesystem");
        }
        ("", "PersistentVolumeClaim") => default(obj, "spec", "volumeMode", "Filesystem"),
        ("storage.k8s.io", "StorageClass") => {
            default(obj, "", "reclaimPolicy", "Delete");
            default(obj, "", "volumeBindingMode", "Immediate");
        }
        _ => {}
    }
}

/// Keys of Secret and ConfigMap data: `[-._a-zA-Z0-9]+`, at most 253 characters, not `.`/`..`.
pub(super) fn is_config_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `PrepareForCreate`/`PrepareForUpdate` of the strategies that change what
/// is stored: fields of disabled feature gates are dropped unless the stored
/// object already has them, and a PVC's `dataSource`/`dataSourceRef` are
/// made consistent (pkg/api/persistentvolumeclaim/util.go,
/// pkg/api/persistentvolume/util.go, the CSIDriver strategy).
pub(super) fn drop_disabled_spec_fields(
    k: &Kind,
    obj: &mut Value,
    old: Option<&Value>,
    gates: &FeatureGates,
) {
    let old_has =
        |pointer: &str| old.is_some_and(|o| o.pointer(pointer).is_some_and(|v| !v.is_null()));
    let remove = |obj: &mut Value, parent: &str, field: &str| {
        if let Some(Value::Object(m)) = obj.pointer_mut(parent) {
            m.remove(field);
        }
    };
    match (k.group, k.kind) {
        ("", "PersistentVolumeClaim") => {
            if !gates.enabled(Gate::VolumeAttributesClass)
                && !old_has("/spec/volumeAttributesClassName")
            {
                remove(obj, "/spec", "volumeAttributesClassName");
            }
            let cross_namespace = obj
                .pointer("/spec/dataSourceRef/namespace")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if cross_namespace
                && !gates.enabled(Gate::CrossNamespaceVolumeDataSource)
                && !old_has("/spec/dataSourceRef")
            {
                remove(obj, "/spec", "dataSourceRef");
            }
            normalize_claim_data_sources(obj, old);
        }
        ("", "PersistentVolume")
            if !gates.enabled(Gate::VolumeAttributesClass)
                && !old_has("/spec/volumeAttributesClassName") =>
        {
            remove(obj, "/spec", "volumeAttributesClassName");
        }
        ("storage.k8s.io", "CSIDriver") => {
            if !gates.enabled(Gate::SELinuxMountReadWriteOncePod) && !old_has("/spec/seLinuxMount")
            {
                remove(obj, "/spec", "seLinuxMount");
            }
            if !gates.enabled(Gate::MutableCSINodeAllocatableCount)
                && !old_has("/spec/nodeAllocatableUpdatePeriodSeconds")
            {
                remove(obj, "/spec", "nodeAllocatableUpdatePeriodSeconds");
            }
        }
        _ => {}
    }
}

/// `EnforceDataSourceBackwardsCompatibility` then `NormalizeDataSources`:
/// without a `dataSourceRef`, a `dataSource` other than a PVC or a
/// VolumeSnapshot is dropped (unless the stored claim has a data source);
/// then each of the two is filled from the other when only one is set
/// (a cross-namespace `dataSourceRef` has no `dataSource` counterpart).
pub(super) fn normalize_claim_data_sources(obj: &mut Value, old: Option<&Value>) {
    let set = |v: &Value, p: &str| v.pointer(p).is_some_and(Value::is_object);
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let old_in_use =
        old.is_some_and(|o| set(o, "/spec/dataSource") || set(o, "/spec/dataSourceRef"));
    let has = |spec: &Map<String, Value>, f: &str| spec.get(f).is_some_and(Value::is_object);
    if !old_in_use && !has(spec, "dataSourceRef") && has(spec, "dataSource") {
        let ds = &spec["dataSource"];
        let group = ds.get("apiGroup").and_then(Value::as_str).unwrap_or("");
        let kind = ds.get("kind").and_then(Value::as_str).unwrap_or("");
        let allowed = (kind == "PersistentVolumeClaim" && group.is_empty())
            || (kind == "VolumeSnapshot" && group == "snapshot.storage.k8s.io");
        if !allowed {
            spec.remove("dataSource");
        }
    }
    // Go writes the nil apiGroup pointer of these references as null.
    let copy = |from: &Value| {
        json!({
            "apiGroup": from.get("apiGroup").cloned().unwrap_or(Value::Null),
            "kind": from.get("kind").cloned().unwrap_or(json!("")),
            "name": from.get("name").cloned().unwrap_or(json!("")),
        })
    };
    match (has(spec, "dataSource"), has(spec, "dataSourceRef")) {
        (true, false) => {
            let r = copy(&spec["dataSource"]);
            spec.insert("dataSourceRef".into(), r);
        }
        (false, true) => {
            let namespaced = spec["dataSourceRef"]
                .get("namespace")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if !namespaced {
                let d = copy(&spec["dataSourceRef"]);
                spec.insert("dataSource".into(), d);
            }
        }
        _ => {}
    }
    for f in ["dataSource", "dataSourceRef"] {
        if let Some(Value::Object(r)) = spec.get_mut(f) {
            r.entry("apiGroup").or_insert(Value::Null);
        }
    }
}

/// Status fields of disabled feature gates, dropped on status writes unless
/// the stored object has them (the PVC and VolumeAttachment status strategies).
pub(super) fn drop_disabled_status_fields(
    k: &Kind,
    new: &mut Value,
    old: &Value,
    gates: &FeatureGates,
) {
    let old_has = |pointer: &str| old.pointer(pointer).is_some_and(|v| !v.is_null());
    let remove = |obj: &mut Value, parent: &str, field: &str| {
        if let Some(Value::Object(m)) = obj.pointer_mut(parent) {
            m.remove(field);
        }
    };
    match (k.group, k.kind) {
        ("", "PersistentVolumeClaim") if !gates.enabled(Gate::VolumeAttributesClass) => {
            for f in ["currentVolumeAttributesClassName", "modifyVolumeStatus"] {
                if !old_has(&format!("/status/{f}")) {
                    remove(new, "/status", f);
                }
            }
        }
        ("storage.k8s.io", "VolumeAttachment")
            if !gates.enabled(Gate::MutableCSINodeAllocatableCount) =>
        {
            for e in ["attachError", "detachError"] {
                if !old_has(&format!("/status/{e}/errorCode")) {
                    remove(new, &format!("/status/{e}"), "errorCode");
                }
            }
        }
        _ => {}
    }
}

/// The PV status strategy keeps `lastPhaseTransitionTime` while the phase
/// stays, and stamps it when the phase changes and the writer did not.
pub(super) fn volume_phase_transition(new: &mut Value, old: &Value) {
    let phase = |v: &Value| {
        v.pointer("/status/phase")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let time = |v: &Value| {
        v.pointer("/status/lastPhaseTransitionTime")
            .filter(|t| !t.is_null())
            .cloned()
    };
    let (new_time, old_time) = (time(new), time(old));
    let stamp = if phase(new) == phase(old) {
        if new_time.is_some() {
            return;
        }
        old_time
    } else if new_time.is_none() || new_time == old_time {
        Some(json!(now_timestamp()))
    } else {
        return;
    };
    if let (Some(t), Some(Value::Object(st))) = (stamp, new.get_mut("status")) {
        st.insert("lastPhaseTransitionTime".into(), t);
    }
}

/// The metadata a `/status` write stores, per the kind's status strategy.
pub(super) fn status_write(k: &Kind, old: &Value, new: &Value) -> Value {
    let mut out = old.clone();
    match new.get("status") {
        Some(st) if !st.is_null() => out["status"] = st.clone(),
        _ => {
            if let Value::Object(m) = &mut out {
                m.remove("status");
            }
        }
    }
    let request_fields: &[&str] = match k.status_metadata {
        StatusMetadata::StatusOnly | StatusMetadata::Reset => &[],
        StatusMetadata::FromRequest => &["labels", "annotations", "finalizers", "ownerReferences"],
        StatusMetadata::KeepOwnerReferences => &["labels", "annotations", "finalizers"],
        StatusMetadata::KeepLabels => &["annotations", "finalizers", "ownerReferences"],
    };
    let new_meta = meta(new).cloned().unwrap_or_default();
    let m = meta_mut(&mut out);
    for f in request_fields {
        match new_meta.get(*f) {
            Some(v) if !v.is_null() => m.insert((*f).to_string(), v.clone()),
            _ => m.remove(*f),
        };
    }
    out
}

/// Builds the object an update stores, applying the real server's rules:
/// preconditions, immutable system metadata, status subresource separation,
/// fields of disabled gates, generation, and the kind's validation.
pub(super) fn prepare_update(
    k: &Kind,
    old: &Value,
    mut new: Value,
    target: Target,
    key: &ObjKey,
    gates: &FeatureGates,
) -> Result<Value, ApiError> {
    check_type(k, &mut new)?;
    if k.is_core("Secret") && target == Target::Main {
        normalize_secret(k, &mut new)?;
    }
    validation::canonicalize_quantities(k, &mut new)?;
    validation::check_times(k, &new)?;
    validation::drop_empty_collections(k, &mut new);
    if target == Target::Main {
        apply_defaults(k, &mut new);
    }
    let (ns, name) = key;
    let body_name = meta_str(&new, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let body_ns = meta_str(&new, "namespace");
    if k.namespaced && !body_ns.is_empty() && body_ns != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let rv = meta_str(&new, "resourceVersion");
    if rv.is_empty() && !k.unconditional_update {
        return Err(ApiError::resource_version_required(k, name));
    }
    if !rv.is_empty() && parse_rv(rv)? != resource_version_of(old) {
        return Err(ApiError::modified(k, name));
    }
    let uid = meta_str(&new, "uid");
    let old_uid = meta_str(old, "uid");
    if !uid.is_empty() && uid != old_uid {
        return Err(ApiError::conflict(
            k,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
            ),
        ));
    }
    if target == Target::Status {
        let mut out = status_write(k, old, &new);
        drop_disabled_status_fields(k, &mut out, old, gates);
        if k.is_core("PersistentVolume") {
            volume_phase_transition(&mut out, old);
        }
        let errs = validation::validate_update(k, &out, old, true, gates);
        if !errs.is_empty() {
            return Err(validation::invalid(k, name, &errs));
        }
        return Ok(out);
    }
    let old_meta = meta(old).cloned().unwrap_or_default();
    {
        let m = meta_mut(&mut new);
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            match old_meta.get(f) {
                Some(v) => m.insert(f.into(), v.clone()),
                None => m.remove(f),
            };
        }
        m.insert("name".into(), json!(name));
        if k.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        m.remove("managedFields");
        m.remove("selfLink");
    }
    if k.status_subresource {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Value::Object(m) = &mut new {
                    m.remove("status");
                }
            }
        }
    }
    drop_disabled_spec_fields(k, &mut new, Some(old), gates);
    if k.tracks_generation && spec_part(&new) != spec_part(old) {
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
    }
    let errs = validation::validate_update(k, &new, old, false, gates);
    if !errs.is_empty() {
        return Err(validation::invalid(k, name, &errs));
    }
    Ok(new)
}
