//! The three patch formats the server accepts, as pure functions over JSON.

use serde_json::{Map, Value};

/// Why a patch could not be applied; the HTTP edge maps each to its status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// Malformed patch document (400).
    #[error("{0}")]
    BadRequest(String),
    /// A JSON patch operation did not apply, e.g. a failed `test` (422).
    #[error("{0}")]
    NotApplicable(String),
    /// A strategic-merge construct this server does not implement (415).
    #[error("{0}")]
    Unsupported(String),
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// RFC 6902 JSON patch. Decoding problems are `BadRequest`; operations that do
/// not apply are `NotApplicable`, which the real server reports as 422.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::BadRequest("json patch must be an array of operations".into())
    })?;
    for op in ops {
        let field = |name: &str| op.get(name).and_then(Value::as_str);
        let name = field("op").ok_or_else(|| {
            PatchError::BadRequest("json patch operation is missing \"op\"".into())
        })?;
        let path = field("path").ok_or_else(|| {
            PatchError::BadRequest(format!("json patch {name} operation is missing \"path\""))
        })?;
        let path = parse_pointer(path)?;
        let value = || {
            op.get("value").cloned().ok_or_else(|| {
                PatchError::BadRequest(format!("json patch {name} operation is missing \"value\""))
            })
        };
        let from = || {
            field("from")
                .ok_or_else(|| {
                    PatchError::BadRequest(format!(
                        "json patch {name} operation is missing \"from\""
                    ))
                })
                .and_then(parse_pointer)
        };
        match name {
            "add" => add(doc, &path, value()?)?,
            "remove" => {
                remove(doc, &path)?;
            }
            "replace" => {
                let v = value()?;
                *lookup_mut(doc, &path).ok_or_else(|| missing("replace", &path))? = v;
            }
            "move" => {
                let from = from()?;
                if path.len() > from.len() && path[..from.len()] == from[..] {
                    return Err(PatchError::NotApplicable(
                        "move operation cannot move a value into one of its children".into(),
                    ));
                }
                let v = remove(doc, &from)?;
                add(doc, &path, v)?;
            }
            "copy" => {
                let from = from()?;
                let v = lookup(doc, &from)
                    .cloned()
                    .ok_or_else(|| missing("copy", &from))?;
                add(doc, &path, v)?;
            }
            "test" => {
                let expected = value()?;
                if lookup(doc, &path) != Some(&expected) {
                    return Err(PatchError::NotApplicable(format!(
                        "testing value {} failed: test failed",
                        pointer_string(&path)
                    )));
                }
            }
            other => {
                return Err(PatchError::BadRequest(format!(
                    "unexpected json patch operation: {other:?}"
                )));
            }
        }
    }
    Ok(())
}

fn missing(op: &str, path: &[String]) -> PatchError {
    PatchError::NotApplicable(format!(
        "{op} operation does not apply: doc is missing path: {}",
        pointer_string(path)
    ))
}

fn pointer_string(path: &[String]) -> String {
    path.iter()
        .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn parse_pointer(p: &str) -> Result<Vec<String>, PatchError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or_else(|| PatchError::BadRequest(format!("invalid JSON pointer {p:?}")))?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if token.is_empty()
        || (token.len() > 1 && token.starts_with('0'))
        || !token.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let i: usize = token.parse().ok()?;
    (i < len || (allow_end && i == len)).then_some(i)
}

fn lookup<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |cur, tok| match cur {
        Value::Object(m) => m.get(tok),
        Value::Array(a) => array_index(tok, a.len(), false).map(|i| &a[i]),
        _ => None,
    })
}

fn lookup_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |cur, tok| match cur {
        Value::Object(m) => m.get_mut(tok),
        Value::Array(a) => {
            let len = a.len();
            array_index(tok, len, false).map(move |i| &mut a[i])
        }
        _ => None,
    })
}

fn add(doc: &mut Value, path: &[String], v: Value) -> Result<(), PatchError> {
    let Some((last, parent)) = path.split_last() else {
        *doc = v;
        return Ok(());
    };
    match lookup_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), v);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = if last == "-" {
                a.len()
            } else {
                array_index(last, a.len(), true).ok_or_else(|| {
                    PatchError::NotApplicable(format!(
                        "add operation does not apply: index out of bounds at {}",
                        pointer_string(path)
                    ))
                })?
            };
            a.insert(i, v);
            Ok(())
        }
        _ => Err(missing("add", path)),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, PatchError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(PatchError::NotApplicable(
            "remove operation cannot remove the whole document".into(),
        ));
    };
    match lookup_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last).ok_or_else(|| missing("remove", path)),
        Some(Value::Array(a)) => array_index(last, a.len(), false)
            .map(|i| a.remove(i))
            .ok_or_else(|| missing("remove", path)),
        _ => Err(missing("remove", path)),
    }
}

/// How a list field is combined by a strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// The patch list replaces the stored one.
    Atomic,
    /// Set-union of scalars (e.g. `metadata.finalizers`).
    MergePrimitives,
    /// Elements are maps merged by the value of this key.
    MergeByKey(&'static str),
}

/// Strategic merge patch as the real server applies it to typed objects. The
/// `strategy` callback names how the list at a dotted field path (list
/// indices left out) merges; lists it calls atomic are replaced.
pub fn strategic_merge_patch(
    target: &mut Value,
    patch: &Value,
    strategy: &dyn Fn(&str) -> ListStrategy,
) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        return Err(PatchError::BadRequest(
            "strategic merge patch must be a JSON object".into(),
        ));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    if merge_map(t, p, "", strategy)? == MapOutcome::Delete {
        return Err(PatchError::BadRequest(
            "a strategic merge patch cannot delete the whole object".into(),
        ));
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum MapOutcome {
    Keep,
    Delete,
}

const SET_ORDER: &str = "$setElementOrder/";
const DELETE_FROM: &str = "$deleteFromPrimitiveList/";

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn merge_map(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &str,
    strategy: &dyn Fn(&str) -> ListStrategy,
) -> Result<MapOutcome, PatchError> {
    match patch.get("$patch").map(|v| v.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("delete")) => return Ok(MapOutcome::Delete),
        Some(Some("replace")) => {
            *orig = Map::new();
            let mut rest = patch.clone();
            rest.remove("$patch");
            return merge_map(orig, &rest, path, strategy);
        }
        Some(other) => {
            return Err(PatchError::BadRequest(format!(
                "unknown patch type: {other:?} in map at {path:?}"
            )));
        }
    }
    if let Some(retain) = patch.get("$retainKeys") {
        let keys: Vec<&str> = retain
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .ok_or_else(|| {
                PatchError::BadRequest("$retainKeys must be a list of strings".into())
            })?;
        orig.retain(|k, _| keys.contains(&k.as_str()));
    }
    // Deletions from primitive lists happen before merges into the same list.
    for (k, v) in patch.iter().filter(|(k, _)| k.starts_with(DELETE_FROM)) {
        let field = &k[DELETE_FROM.len()..];
        let fpath = join(path, field);
        if strategy(&fpath) != ListStrategy::MergePrimitives {
            return Err(unsupported_list(&fpath, k));
        }
        let gone = v
            .as_array()
            .ok_or_else(|| PatchError::BadRequest(format!("{k} must be a list")))?;
        if let Some(Value::Array(list)) = orig.get_mut(field) {
            list.retain(|x| !gone.contains(x));
        }
    }
    for (k, v) in patch {
        if k.starts_with(SET_ORDER)
            || k.starts_with(DELETE_FROM)
            || k == "$patch"
            || k == "$retainKeys"
        {
            continue;
        }
        if k.starts_with('$') {
            return Err(PatchError::BadRequest(format!(
                "unknown strategic merge patch directive {k:?} at {path:?}"
            )));
        }
        let fpath = join(path, k);
        match v {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => {
                let mut sub = match orig.remove(k) {
                    Some(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                if merge_map(&mut sub, pm, &fpath, strategy)? == MapOutcome::Keep {
                    orig.insert(k.clone(), Value::Object(sub));
                }
            }
            Value::Array(pl) => {
                let existing = match orig.remove(k) {
                    Some(Value::Array(a)) => a,
                    _ => Vec::new(),
                };
                let order = patch.get(&format!("{SET_ORDER}{k}"));
                let merged = merge_list(existing, pl, order, &fpath, strategy)?;
                orig.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                orig.insert(k.clone(), scalar.clone());
            }
        }
    }
    // An element order given without the list itself only reorders the stored list.
    for (k, order) in patch.iter().filter(|(k, _)| k.starts_with(SET_ORDER)) {
        let field = &k[SET_ORDER.len()..];
        if patch.contains_key(field) {
            continue;
        }
        let fpath = join(path, field);
        if let Some(Value::Array(existing)) = orig.remove(field) {
            let merged = merge_list(existing, &[], Some(order), &fpath, strategy)?;
            orig.insert(field.to_string(), Value::Array(merged));
        } else if strategy(&fpath) == ListStrategy::Atomic {
            return Err(unsupported_list(&fpath, k));
        }
    }
    Ok(MapOutcome::Keep)
}

fn unsupported_list(path: &str, what: &str) -> PatchError {
    PatchError::Unsupported(format!(
        "strategic merge patch directive {what:?} targets {path:?}, a list this server does not merge; use a JSON merge patch or JSON patch"
    ))
}

fn has_directive(v: &Value) -> bool {
    v.as_object()
        .is_some_and(|m| m.keys().any(|k| k.starts_with('$')))
}

fn merge_list(
    orig: Vec<Value>,
    patch: &[Value],
    order_directive: Option<&Value>,
    path: &str,
    strategy: &dyn Fn(&str) -> ListStrategy,
) -> Result<Vec<Value>, PatchError> {
    let order = match order_directive {
        Some(Value::Array(o)) => Some(o.as_slice()),
        Some(_) => {
            return Err(PatchError::BadRequest(format!(
                "$setElementOrder for {path:?} must be a list"
            )));
        }
        None => None,
    };
    match strategy(path) {
        ListStrategy::Atomic => {
            if order.is_some() || patch.iter().any(has_directive) {
                return Err(unsupported_list(path, "$patch"));
            }
            Ok(patch.to_vec())
        }
        ListStrategy::MergePrimitives => {
            let mut merged = orig.clone();
            for v in patch {
                if v.is_object() || v.is_array() {
                    return Err(PatchError::BadRequest(format!(
                        "list {path:?} holds scalars only"
                    )));
                }
                if !merged.contains(v) {
                    merged.push(v.clone());
                }
            }
            let patch_order = order.unwrap_or(patch);
            Ok(normalize_order(merged, patch_order, &orig, |v| v.clone()))
        }
        ListStrategy::MergeByKey(key) => {
            let key_of = |v: &Value| v.get(key).cloned().unwrap_or(Value::Null);
            let mut merged = orig.clone();
            let mut plain: Vec<&Value> = Vec::new();
            for item in patch {
                let Value::Object(m) = item else {
                    return Err(PatchError::BadRequest(format!(
                        "list {path:?} holds maps merged by {key:?}"
                    )));
                };
                match m.get("$patch").and_then(Value::as_str) {
                    Some("replace") => {
                        // The rest of the patch list becomes the whole list.
                        let rest: Vec<Value> =
                            patch.iter().filter(|v| *v != item).cloned().collect();
                        return merge_list(Vec::new(), &rest, order_directive, path, strategy);
                    }
                    Some("delete") => {
                        let k = m.get(key).ok_or_else(|| missing_key(path, key))?;
                        merged.retain(|o| o.get(key) != Some(k));
                    }
                    _ => {
                        if !m.contains_key(key) {
                            return Err(missing_key(path, key));
                        }
                        plain.push(item);
                    }
                }
            }
            for item in &plain {
                let k = key_of(item);
                let Value::Object(pm) = item else { continue };
                match merged.iter_mut().find(|o| key_of(o) == k) {
                    Some(Value::Object(existing)) => {
                        merge_map(existing, pm, path, strategy)?;
                    }
                    _ => {
                        let mut fresh = Map::new();
                        merge_map(&mut fresh, pm, path, strategy)?;
                        merged.push(Value::Object(fresh));
                    }
                }
            }
            let plain_owned: Vec<Value> = plain.into_iter().cloned().collect();
            let patch_order = order.map(<[Value]>::to_vec).unwrap_or(plain_owned);
            let patch_keys: Vec<Value> = patch_order
                .iter()
                .map(|v| if v.is_object() { key_of(v) } else { v.clone() })
                .collect();
            Ok(normalize_order(
                merged,
                &patch_keys,
                &orig.iter().map(key_of).collect::<Vec<_>>(),
                key_of,
            ))
        }
    }
}

fn missing_key(path: &str, key: &str) -> PatchError {
    PatchError::BadRequest(format!(
        "map in list {path:?} does not contain declared merge key: {key}"
    ))
}

/// Orders a merged list the way the real server does: items named by the patch
/// follow the patch's order, items only on the server keep theirs, and the two
/// runs interleave by position in the stored list.
fn normalize_order(
    merged: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    id: impl Fn(&Value) -> Value,
) -> Vec<Value> {
    let pos = |list: &[Value], v: &Value| list.iter().position(|x| *x == id(v));
    let (mut from_patch, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| pos(patch_order, v).is_some());
    from_patch.sort_by_key(|v| pos(patch_order, v));
    server_only.sort_by_key(|v| pos(server_order, v).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let (mut l, mut r) = (
        server_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        match (l.peek(), r.peek()) {
            (Some(a), Some(b)) => {
                let take_left = matches!((pos(server_order, a), pos(server_order, b)), (Some(x), Some(y)) if x < y);
                out.extend(if take_left { l.next() } else { r.next() });
            }
            (Some(_), None) => out.extend(l.next()),
            (None, Some(_)) => out.extend(r.next()),
            (None, None) => return out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_sets_replaces_and_removes() {
        let mut doc = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
        merge_patch(
            &mut doc,
            &json!({"a": {"b": null, "c": [3], "e": {"f": true}}, "d": null, "g": 1}),
        );
        assert_eq!(doc, json!({"a": {"c": [3], "e": {"f": true}}, "g": 1}));
    }

    #[test]
    fn json_patch_operations_and_pointer_escaping() {
        let mut doc =
            json!({"metadata": {"annotations": {"a/b": "1", "t~x": "2"}, "finalizers": ["f1"]}});
        json_patch(
            &mut doc,
            &json!([
                {"op": "test", "path": "/metadata/annotations/a~1b", "value": "1"},
                {"op": "replace", "path": "/metadata/annotations/t~0x", "value": "3"},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "f2"},
                {"op": "add", "path": "/metadata/finalizers/0", "value": "f0"},
                {"op": "copy", "from": "/metadata/finalizers/1", "path": "/metadata/labels"},
                {"op": "move", "from": "/metadata/labels", "path": "/metadata/moved"},
                {"op": "remove", "path": "/metadata/annotations/a~1b"}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"annotations": {"t~x": "3"}, "finalizers": ["f0", "f1", "f2"], "moved": "f1"}})
        );
    }

    #[test]
    fn json_patch_failures_are_classified() {
        let mut doc = json!({"a": [1]});
        let e = json_patch(
            &mut doc,
            &json!([{"op": "test", "path": "/a/0", "value": 2}]),
        )
        .unwrap_err();
        assert_eq!(
            e,
            PatchError::NotApplicable("testing value /a/0 failed: test failed".into())
        );
        assert!(matches!(
            json_patch(&mut doc, &json!([{"op": "remove", "path": "/b"}])),
            Err(PatchError::NotApplicable(_))
        ));
        assert!(matches!(
            json_patch(
                &mut doc,
                &json!([{"op": "replace", "path": "/a/5", "value": 1}])
            ),
            Err(PatchError::NotApplicable(_))
        ));
        assert!(matches!(
            json_patch(
                &mut doc,
                &json!([{"op": "add", "path": "/a/01", "value": 1}])
            ),
            Err(PatchError::NotApplicable(_))
        ));
        assert!(matches!(
            json_patch(&mut doc, &json!({"op": "add"})),
            Err(PatchError::BadRequest(_))
        ));
        assert!(matches!(
            json_patch(&mut doc, &json!([{"op": "frob", "path": "/a"}])),
            Err(PatchError::BadRequest(_))
        ));
        assert!(matches!(
            json_patch(&mut doc, &json!([{"op": "add", "path": "a", "value": 1}])),
            Err(PatchError::BadRequest(_))
        ));
        // A failed operation leaves earlier ones applied to this copy only; callers patch a clone.
        assert_eq!(doc, json!({"a": [1]}));
    }

    fn strat(path: &str) -> ListStrategy {
        match path {
            "metadata.finalizers" => ListStrategy::MergePrimitives,
            "spec.drivers" => ListStrategy::MergeByKey("name"),
            "spec.drivers.topologyKeys" => ListStrategy::Atomic,
            _ => ListStrategy::Atomic,
        }
    }

    #[test]
    fn strategic_primitive_lists_union_and_delete() {
        let mut doc = json!({"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1"}}});
        strategic_merge_patch(
            &mut doc,
            &json!({"metadata": {"finalizers": ["c", "a"], "labels": {"x": null, "y": "2"}}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["c", "a", "b"]));
        assert_eq!(doc["metadata"]["labels"], json!({"y": "2"}));
        strategic_merge_patch(
            &mut doc,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["c", "b"]));
        strategic_merge_patch(
            &mut doc,
            &json!({"metadata": {"$setElementOrder/finalizers": ["b", "c"]}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["b", "c"]));
    }

    #[test]
    fn strategic_keyed_lists_merge_delete_and_replace() {
        let mut doc = json!({"spec": {"drivers": [
            {"name": "a", "nodeID": "n1", "topologyKeys": ["z"]},
            {"name": "b", "nodeID": "n2"}
        ]}});
        strategic_merge_patch(&mut doc, &json!({"spec": {"drivers": [{"name": "a", "nodeID": "n9"}, {"name": "c", "nodeID": "n3"}]}}), &strat).unwrap();
        // Items named by the patch come first in patch order, as upstream orders them.
        assert_eq!(
            doc["spec"]["drivers"],
            json!([
                {"name": "a", "nodeID": "n9", "topologyKeys": ["z"]},
                {"name": "c", "nodeID": "n3"},
                {"name": "b", "nodeID": "n2"}
            ])
        );
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"drivers": [{"name": "b", "$patch": "delete"}]}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc["spec"]["drivers"].as_array().unwrap().len(), 2);
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"drivers": [{"$patch": "replace"}, {"name": "d"}]}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc["spec"]["drivers"], json!([{"name": "d"}]));
        let e = strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"drivers": [{"nodeID": "x"}]}}),
            &strat,
        )
        .unwrap_err();
        assert!(matches!(e, PatchError::BadRequest(_)));
    }

    #[test]
    fn strategic_atomic_lists_replace_and_reject_directives() {
        let mut doc = json!({"spec": {"accessModes": ["ReadWriteOnce"]}});
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"accessModes": ["ReadOnlyMany"]}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc["spec"]["accessModes"], json!(["ReadOnlyMany"]));
        let e = strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"$setElementOrder/accessModes": ["ReadOnlyMany"]}}),
            &strat,
        );
        assert!(matches!(e, Err(PatchError::Unsupported(_))));
        let e = strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"things": [{"name": "a", "$patch": "delete"}]}}),
            &strat,
        );
        assert!(matches!(e, Err(PatchError::Unsupported(_))));
    }

    #[test]
    fn strategic_map_directives() {
        let mut doc = json!({"spec": {"a": {"x": 1, "y": 2}, "b": {"z": 1}}});
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"a": {"$patch": "replace", "w": 0}, "b": {"$patch": "delete"}}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc, json!({"spec": {"a": {"w": 0}}}));
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"$retainKeys": ["c"], "c": 1}}),
            &strat,
        )
        .unwrap();
        assert_eq!(doc, json!({"spec": {"c": 1}}));
        assert!(matches!(
            strategic_merge_patch(&mut doc, &json!({"$bogus": 1}), &strat),
            Err(PatchError::BadRequest(_))
        ));
    }
}
