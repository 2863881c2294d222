//! API errors and their `Status` bodies, worded as the real server words them.

use serde_json::{Map, Value, json};

use super::registry::Kind;

/// An error answered to a client as a `meta/v1 Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// The `details` object, when the real server sends one.
    pub details: Option<Value>,
}

fn details(kind: &Kind, name: &str, kind_field: &str) -> Map<String, Value> {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !kind.group.is_empty() {
        d.insert("group".into(), json!(kind.group));
    }
    d.insert("kind".into(), json!(kind_field));
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, d: Map<String, Value>) -> Self {
        self.details = Some(Value::Object(d));
        self
    }

    pub fn not_found(kind: &Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.qualified_resource()),
        )
        .with_details(details(kind, name, kind.plural))
    }

    pub fn already_exists(kind: &Kind, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.qualified_resource()),
        )
        .with_details(details(kind, name, kind.plural))
    }

    pub fn conflict(kind: &Kind, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                kind.qualified_resource()
            ),
        )
        .with_details(details(kind, name, kind.plural))
    }

    /// The stale-resourceVersion conflict.
    pub fn modified(kind: &Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one field cause; `detail` is the text after `field: `.
    pub fn invalid(kind: &Kind, name: &str, field: &str, cause_reason: &str, detail: &str) -> Self {
        Self::invalid_causes(
            kind,
            name,
            &[(cause_reason, detail.to_string(), field.to_string())],
        )
    }

    /// 422 with one cause per `(reason, message, field)`; the message lists the
    /// distinct `field: message` texts, in brackets when there are several, as
    /// apimachinery's error aggregate prints them.
    pub fn invalid_causes(kind: &Kind, name: &str, causes: &[(&str, String, String)]) -> Self {
        let mut d = details(kind, name, kind.kind);
        d.insert(
            "causes".into(),
            Value::Array(
                causes
                    .iter()
                    .map(|(reason, message, field)| {
                        json!({"reason": reason, "message": message, "field": field})
                    })
                    .collect(),
            ),
        );
        let mut seen: Vec<String> = Vec::new();
        for (_, message, field) in causes {
            let text = format!("{field}: {message}");
            if !seen.contains(&text) {
                seen.push(text);
            }
        }
        let qualified = if kind.group.is_empty() {
            kind.kind.to_string()
        } else {
            format!("{}.{}", kind.kind, kind.group)
        };
        let message = match seen.as_slice() {
            [] => format!("{qualified} \"{name}\" is invalid"),
            [one] => format!("{qualified} \"{name}\" is invalid: {one}"),
            many => format!("{qualified} \"{name}\" is invalid: [{}]", many.join(", ")),
        };
        Self::new(422, "Invalid", message).with_details(d)
    }

    /// An update without a resourceVersion of a kind that requires one
    /// (`AllowUnconditionalUpdate() == false`): upstream names the resource
    /// where the kind belongs.
    pub fn resource_version_required(kind: &Kind, name: &str) -> Self {
        let mut d = Map::new();
        d.insert("name".into(), json!(name));
        if !kind.group.is_empty() {
            d.insert("group".into(), json!(kind.group));
        }
        d.insert("kind".into(), json!(kind.plural));
        d.insert(
            "causes".into(),
            json!([{"reason": "FieldValueInvalid", "message": "Invalid value: 0: must be specified for an update", "field": "metadata.resourceVersion"}]),
        );
        Self::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update",
                kind.qualified_resource()
            ),
        )
        .with_details(d)
    }

    pub fn forbidden(kind: &Kind, name: &str, why: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {why}",
                kind.qualified_resource()
            ),
        )
        .with_details(details(kind, name, kind.plural))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        e.details = Some(
            json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
        );
        e
    }

    /// Throttling, as the API server's priority and fairness answers it: the client is told to
    /// come back after `retry_after_seconds` (also sent as the `Retry-After` header).
    pub fn too_many_requests(retry_after_seconds: u32) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        );
        e.details = Some(json!({"retryAfterSeconds": retry_after_seconds}));
        e
    }

    /// `details.retryAfterSeconds`, which the server also sends as the `Retry-After` header.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.details
            .as_ref()
            .and_then(|d| d.get("retryAfterSeconds"))
            .and_then(Value::as_u64)
            .filter(|s| *s > 0)
    }

    /// A JSON patch operation that does not apply: the real server answers 422
    /// with a generic message and the patch library's error as the cause.
    pub fn patch_not_applicable(cause: &str) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        );
        e.details =
            Some(json!({"causes": [{"reason": "UnexpectedServerResponse", "message": cause}]}));
        e
    }

    /// An error with an arbitrary code, reason picked as the real server would.
    pub fn from_code(code: u16, message: impl Into<String>) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            406 => "NotAcceptable",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "",
        };
        Self::new(code, reason, message)
    }

    /// The `Status` object sent as the response body (or in a watch ERROR event).
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    #[test]
    fn status_bodies_name_the_resource_like_the_real_server() {
        let r = Registry::builtin();
        let va = r.get(
            r.lookup("storage.k8s.io", "v1", "volumeattachments")
                .unwrap(),
        );
        let s = ApiError::not_found(va, "va-1").to_status();
        assert_eq!(
            s["message"],
            "volumeattachments.storage.k8s.io \"va-1\" not found"
        );
        assert_eq!(
            s["details"],
            json!({"name": "va-1", "group": "storage.k8s.io", "kind": "volumeattachments"})
        );
        assert_eq!(s["code"], 404);
        let pvc = r.get(r.core("persistentvolumeclaims").unwrap());
        let s = ApiError::invalid(
            pvc,
            "x",
            "metadata.name",
            "FieldValueInvalid",
            "Invalid value: \"x\"",
        )
        .to_status();
        assert_eq!(s["reason"], "Invalid");
        assert_eq!(s["details"]["kind"], "PersistentVolumeClaim");
        assert!(s["details"].get("group").is_none());
    }
}
