use super::*;

#[test]
fn query_strings_are_decoded() {
    let q = parse_query(Some("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&x"));
    assert_eq!(q["labelSelector"], "app=web,tier in (a)");
    assert!(flag(&q, "watch"));
    assert_eq!(q["x"], "");
    assert_eq!(percent_decode("a%2"), "a%2");
}

#[test]
fn urls_resolve_to_kinds_and_scopes() {
    let r = Registry::builtin();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let p = resolve(
        &r,
        "",
        "v1",
        &s(&["namespaces", "ns", "persistentvolumeclaims", "a", "status"]),
    )
    .unwrap();
    assert_eq!(
        (
            p.namespace.as_deref(),
            p.name.as_deref(),
            p.subresource.as_deref()
        ),
        (Some("ns"), Some("a"), Some("status"))
    );
    let p = resolve(&r, "", "v1", &s(&["namespaces", "ns", "status"])).unwrap();
    assert_eq!(
        (p.namespace, p.name.as_deref(), p.subresource.as_deref()),
        (None, Some("ns"), Some("status"))
    );
    let p = resolve(&r, "", "v1", &s(&["persistentvolumeclaims"])).unwrap();
    assert!(p.namespace.is_none() && p.name.is_none());
    assert!(resolve(&r, "", "v1", &s(&["persistentvolumeclaims", "a"])).is_err());
    assert!(resolve(&r, "", "v1", &s(&["namespaces", "ns", "persistentvolumes"])).is_err());
    assert!(
        resolve(
            &r,
            "storage.k8s.io",
            "v1",
            &s(&["storageclasses", "a", "status"])
        )
        .is_err()
    );
    assert!(resolve(&r, "", "v1", &s(&["widgets"])).is_err());
}
