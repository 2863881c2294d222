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

/// The SnapshotMetadataService CRD through real HTTP, as csi-snapshot-metadata and its
/// clients read it: cluster-scoped, get, list, watch, in discovery.
#[tokio::test]
async fn snapshot_metadata_services_are_served() {
    use futures::TryStreamExt;
    use kube::api::{Api, DynamicObject, PostParams, WatchEvent, WatchParams};
    use kube::core::{ApiResource, GroupVersionKind};
    use kube::discovery::Discovery;

    let server = crate::apiserver::ApiServer::start().await.unwrap();
    let client = server.client();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cbt.storage.k8s.io", "v1beta1", "SnapshotMetadataService"),
        "snapshotmetadataservices",
    );
    let sms: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut watch = sms
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let object = |spec: Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cbt.storage.k8s.io/v1beta1", "kind": "SnapshotMetadataService",
            "metadata": {"name": "hostpath.csi.k8s.io"}, "spec": spec
        }))
        .unwrap()
    };
    let spec = json!({"address": "sms.csi-driver:6443", "audience": "test-backup-client",
                      "caCert": "Y2E="});
    sms.create(&PostParams::default(), &object(spec))
        .await
        .unwrap();
    let got = sms.get("hostpath.csi.k8s.io").await.unwrap();
    assert_eq!(got.data["spec"]["audience"], "test-backup-client");
    assert_eq!(sms.list(&Default::default()).await.unwrap().items.len(), 1);
    let event = watch.try_next().await.unwrap().unwrap();
    assert!(
        matches!(event, WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("hostpath.csi.k8s.io"))
    );
    let refused = sms
        .create(&PostParams::default(), &object(json!({"address": "x"})))
        .await;
    assert!(matches!(refused, Err(kube::Error::Api(e)) if e.code == 422));

    let discovery = Discovery::new(client).run().await.unwrap();
    let group = discovery
        .groups()
        .find(|g| g.name() == "cbt.storage.k8s.io")
        .unwrap();
    let (found, caps) = group.recommended_kind("SnapshotMetadataService").unwrap();
    assert_eq!(found.plural, "snapshotmetadataservices");
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
    server.shutdown().await;
}
