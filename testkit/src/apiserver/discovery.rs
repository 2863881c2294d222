//! Discovery documents (`/api`, `/apis`, resource lists, `/version`) and the
//! `meta.k8s.io/v1 Table` rendering kubectl asks for.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::registry::{Kind, Registry};
use super::reviews;

/// The Kubernetes minor version this server claims to be.
pub const MINOR_VERSION: &str = "37";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": MINOR_VERSION,
        "gitVersion": format!("v1.{MINOR_VERSION}.0"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "",
        "platform": "linux/amd64"
    })
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_entry(name: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// The registry's groups, then those of the review resources (served, never stored).
fn all_groups(registry: &Registry) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut groups = registry.groups();
    for (group, _, _) in reviews::RESOURCES {
        if !groups.iter().any(|(g, _)| g == group) {
            groups.push((group, vec!["v1"]));
        }
    }
    groups
}

pub fn api_group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = all_groups(registry)
        .iter()
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    let (name, versions) = all_groups(registry)
        .into_iter()
        .find(|(g, _)| *g == group)?;
    let mut g = group_entry(name, &versions);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

pub fn api_resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for (_, plural, kind) in reviews::RESOURCES
        .iter()
        .filter(|(g, _, _)| *g == group && version == "v1")
    {
        resources.push(json!({
            "name": plural,
            "singularName": kind.to_lowercase(),
            "namespaced": false,
            "kind": kind,
            "verbs": ["create"],
        }));
    }
    for k in registry.in_group_version(group, version) {
        resources.push(json!({
            "name": k.plural,
            "singularName": k.singular,
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": k.short_names,
        }));
        if k.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", k.plural),
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// The OpenAPI v3 index: one document per group/version.
pub fn openapi_v3_root(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1"}),
    );
    for (g, versions) in registry.groups() {
        for v in versions {
            paths.insert(
                format!("apis/{g}/{v}"),
                json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// An OpenAPI v3 document for one group/version without schemas: only the
/// PATCH operations, each declaring its kind and the `fieldValidation`
/// parameter. That is what kubectl looks for to decide that the server
/// validates fields itself; lacking schemas, kubectl builds patches from its
/// own compiled-in types.
pub fn openapi_v3_group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for k in registry.in_group_version(group, version) {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if k.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", k.plural)
        } else {
            format!("{prefix}/{}/{{name}}", k.plural)
        };
        paths.insert(
            path,
            json!({"patch": {
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": k.kind},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
                "responses": {"200": {"description": "OK"}}
            }}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{MINOR_VERSION}.0")},
        "paths": paths
    }))
}

/// What a Table row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// Ages as kubectl prints them (`45s`, `3m20s`, `5h`, `2d3h`, ...).
pub fn human_age(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    let (m, h) = (s / 60, s / 3600);
    let (d, y) = (h / 24, h / (24 * 365));
    let pair = |a: i64, ua: &str, b: i64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua}{b}{ub}")
        }
    };
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        pair(m, "m", s % 60, "s")
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        pair(h, "h", m % 60, "m")
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        pair(d, "d", h % 24, "h")
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        pair(y, "y", d % 365, "d")
    } else {
        format!("{y}y")
    }
}

fn age_of(obj: &Value, now: i64) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| human_age(now - t.as_second()))
        .unwrap_or_else(|| "<unknown>".into())
}

fn now_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A `meta.k8s.io/v1 Table` with NAME and AGE columns; `headers` false leaves
/// out the column definitions (later events of a watch).
pub fn table<'a>(
    items: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
    headers: bool,
) -> Value {
    let now = now_seconds();
    let rows: Vec<Value> = items
        .into_iter()
        .map(|o| {
            let name = o.pointer("/metadata/name").cloned().unwrap_or(json!(""));
            let mut row = json!({"cells": [name, age_of(o, now)]});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o.get("metadata").cloned().unwrap_or(json!({}))
                    });
                }
                IncludeObject::Object => row["object"] = o.clone(),
            }
            row
        })
        .collect();
    let columns = if headers {
        json!([
            {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}
        ])
    } else {
        json!([])
    };
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": columns, "rows": rows})
}

/// The list kind name of a kind (`PersistentVolumeClaimList`).
pub fn list_kind(k: &Kind) -> String {
    format!("{}List", k.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(150), "2m30s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(3 * 3600 + 60), "3h1m");
        assert_eq!(human_age(30 * 3600), "30h");
        assert_eq!(human_age(50 * 3600), "2d2h");
        assert_eq!(human_age(-5), "<invalid>");
    }

    #[test]
    fn discovery_lists_status_subresources() {
        let r = Registry::builtin();
        let l = api_resource_list(&r, "storage.k8s.io", "v1").unwrap();
        let names: Vec<&str> = l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"volumeattachments") && names.contains(&"volumeattachments/status")
        );
        assert!(!names.contains(&"storageclasses/status"));
        assert!(api_resource_list(&r, "nope", "v1").is_none());
        assert_eq!(
            api_group(&r, "snapshot.storage.k8s.io").unwrap()["preferredVersion"]["version"],
            "v1"
        );
    }

    #[test]
    fn tables_carry_name_and_age() {
        let o = json!({"metadata": {"name": "a", "creationTimestamp": "2020-01-01T00:00:00Z"}});
        let t = table(
            [&o],
            json!({"resourceVersion": "5"}),
            IncludeObject::Metadata,
            true,
        );
        assert_eq!(t["rows"][0]["cells"][0], "a");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 2);
    }
}
