//! `cbt.storage.k8s.io`: the SnapshotMetadataService CRD's structural schema (v1beta1): `spec`
//! with the strings `address`, `audience` and `caCert` (base64), all required. Worded as the
//! apiextensions validator words schema errors.

use base64::Engine as _;

use super::*;

/// The JSON type name the schema validator reports a value as.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A required string field of `spec`, optionally of format `byte`.
fn spec_string(spec: &Value, field: &str, byte: bool, errs: &mut Vec<FieldError>) {
    let path = format!("spec.{field}");
    match spec.get(field) {
        None => errs.push(FieldError::required(path, "")),
        Some(Value::String(s)) => {
            if byte && base64::engine::general_purpose::STANDARD.decode(s).is_err() {
                errs.push(FieldError::invalid(
                    &path,
                    BadValue::Str(s.clone()),
                    format!("{path} in body must be of type byte: {}", go_quote(s)),
                ));
            }
        }
        Some(other) => {
            let kind = json_type(other);
            errs.push(FieldError::invalid(
                &path,
                BadValue::Str(kind.to_owned()),
                format!("{path} in body must be of type string: {}", go_quote(kind)),
            ));
        }
    }
}

/// The schema errors of a SnapshotMetadataService.
pub(super) fn snapshot_metadata_service(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match obj.get("spec") {
        None | Some(Value::Null) => errs.push(FieldError::required("spec", "")),
        Some(spec @ Value::Object(_)) => {
            spec_string(spec, "address", false, &mut errs);
            spec_string(spec, "audience", false, &mut errs);
            spec_string(spec, "caCert", true, &mut errs);
        }
        Some(other) => {
            let kind = json_type(other);
            errs.push(FieldError::invalid(
                "spec",
                BadValue::Str(kind.to_owned()),
                format!("spec in body must be of type object: {}", go_quote(kind)),
            ));
        }
    }
    errs
}
