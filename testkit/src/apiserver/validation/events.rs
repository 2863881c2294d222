//! Events, `core/v1` and `events.k8s.io/v1`: `ValidateEventCreate` and `ValidateEventUpdate`.

use super::*;

/// An Event in the shape of the internal type, whichever API wrote it.
pub(super) struct EventView<'a> {
    namespace: &'a str,
    involved_namespace: &'a str,
    event_time: bool,
    reporting_controller: &'a str,
    reporting_instance: &'a str,
    action: &'a str,
    reason: &'a str,
    message: &'a str,
}

pub(super) fn core_event(obj: &Value) -> EventView<'_> {
    EventView {
        namespace: meta_str(obj, "namespace"),
        involved_namespace: str_or_empty(obj, "/involvedObject/namespace"),
        event_time: present(obj, "/eventTime"),
        reporting_controller: str_or_empty(obj, "/reportingComponent"),
        reporting_instance: str_or_empty(obj, "/reportingInstance"),
        action: str_or_empty(obj, "/action"),
        reason: str_or_empty(obj, "/reason"),
        message: str_or_empty(obj, "/message"),
    }
}

pub(super) fn events_v1_event(obj: &Value) -> EventView<'_> {
    EventView {
        namespace: meta_str(obj, "namespace"),
        involved_namespace: str_or_empty(obj, "/regarding/namespace"),
        event_time: present(obj, "/eventTime"),
        reporting_controller: str_or_empty(obj, "/reportingController"),
        reporting_instance: str_or_empty(obj, "/reportingInstance"),
        action: str_or_empty(obj, "/action"),
        reason: str_or_empty(obj, "/reason"),
        message: str_or_empty(obj, "/note"),
    }
}

/// `legacyValidateEvent`: the rules every Event passes, whichever API wrote it.
pub(super) fn legacy_event(e: &EventView<'_>, reporting_field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            BadValue::Str(e.involved_namespace.into()),
            "does not match event.namespace",
        )
    };
    if !e.event_time {
        let ok = if e.involved_namespace.is_empty() {
            e.namespace.is_empty() || e.namespace == "default"
        } else {
            e.namespace == e.involved_namespace
        };
        if !ok {
            errs.push(mismatch());
        }
    } else {
        if e.involved_namespace.is_empty()
            && e.namespace != "default"
            && e.namespace != "kube-system"
        {
            errs.push(mismatch());
        }
        if e.reporting_controller.is_empty() {
            errs.push(FieldError::required(reporting_field, ""));
        }
        errs.extend(invalid_each(
            reporting_field,
            e.reporting_controller,
            qualified_name_errors(e.reporting_controller),
        ));
        if e.reporting_instance.is_empty() {
            errs.push(FieldError::required("reportingInstance", ""));
        }
        if e.reporting_instance.len() > 128 {
            errs.push(FieldError::invalid(
                "reportingInstance",
                BadValue::Str(String::new()),
                "can have at most 128 characters",
            ));
        }
        if e.action.is_empty() {
            errs.push(FieldError::required("action", ""));
        }
        if e.action.len() > 128 {
            errs.push(FieldError::invalid(
                "action",
                BadValue::Str(String::new()),
                "can have at most 128 characters",
            ));
        }
        if e.reason.is_empty() {
            errs.push(FieldError::required("reason", ""));
        }
        if e.reason.len() > 128 {
            errs.push(FieldError::invalid(
                "reason",
                BadValue::Str(String::new()),
                "can have at most 128 characters",
            ));
        }
        if e.message.len() > 1024 {
            errs.push(FieldError::invalid(
                "message",
                BadValue::Str(String::new()),
                "can have at most 1024 characters",
            ));
        }
    }
    errs.extend(invalid_each(
        "namespace",
        e.namespace,
        dns1123_subdomain_errors(e.namespace),
    ));
    errs
}

/// The strict rules of events.k8s.io/v1 creations (`ValidateEventCreate`).
pub(super) fn events_v1_strict(k: &Kind, obj: &Value) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    if !present(obj, "/eventTime") {
        errs.push(FieldError::required("eventTime", ""));
    }
    let t = str_or_empty(obj, "/type");
    if t != "Normal" && t != "Warning" {
        errs.push(FieldError::invalid(
            "type",
            BadValue::Str(String::new()),
            format!("has invalid value: {t}"),
        ));
    }
    for (field, internal) in [
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
    ] {
        if present(obj, &format!("/{field}")) {
            errs.push(FieldError::invalid(
                internal,
                BadValue::Str(String::new()),
                "needs to be unset",
            ));
        }
    }
    if obj
        .get("deprecatedCount")
        .and_then(Value::as_i64)
        .is_some_and(|c| c != 0)
    {
        errs.push(FieldError::invalid(
            "count",
            BadValue::Str(String::new()),
            "needs to be unset",
        ));
    }
    if !str_or_empty(obj, "/deprecatedSource/component").is_empty()
        || !str_or_empty(obj, "/deprecatedSource/host").is_empty()
    {
        errs.push(FieldError::invalid(
            "source",
            BadValue::Str(String::new()),
            "needs to be unset",
        ));
    }
    errs
}

// ---------------------------------------------------------------------------
// Entry points
