use super::*;
use crate::apiserver::registry::Registry;

fn kind(r: &Registry, plural: &str) -> Kind {
    r.get(r.core(plural).unwrap()).clone()
}

#[test]
fn claim_storage_request_must_be_positive() {
    let r = Registry::builtin();
    let k = kind(&r, "persistentvolumeclaims");
    let pvc = json!({"metadata": {"name": "c", "namespace": "n"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "-1"}}}});
    let errs = validate_create(&k, &pvc, &FeatureGates::default());
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "spec.resources[storage]: Invalid value: \"-1\": must be greater than zero"
    );
    let e = invalid(&k, "c", &errs);
    assert_eq!(
        e.message,
        "PersistentVolumeClaim \"c\" is invalid: spec.resources[storage]: Invalid value: \"-1\": must be greater than zero"
    );
    let none = json!({"metadata": {"name": "c"}, "spec": {}});
    let errs = validate_create(&k, &none, &FeatureGates::default());
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "spec.accessModes: Required value: at least 1 access mode is required",
            "spec.resources[storage]: Required value"
        ]
    );
    let e = invalid(&k, "c", &errs);
    assert!(e.message.contains(": [spec.accessModes"), "{}", e.message);
}

#[test]
fn claim_spec_is_immutable_but_volume_name_is_set_once() {
    let r = Registry::builtin();
    let k = kind(&r, "persistentvolumeclaims");
    let old = json!({"metadata": {"name": "c", "resourceVersion": "1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "a"}});
    let mut bind = old.clone();
    bind["spec"]["volumeName"] = json!("pv");
    assert!(validate_update(&k, &bind, &old, false, &FeatureGates::default()).is_empty());
    let mut grow = old.clone();
    grow["spec"]["resources"]["requests"]["storage"] = json!("1024Mi");
    assert!(validate_update(&k, &grow, &old, false, &FeatureGates::default()).is_empty());
    let mut class = old.clone();
    class["spec"]["storageClassName"] = json!("b");
    let errs = validate_update(&k, &class, &old, false, &FeatureGates::default());
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "spec");
    assert_eq!(errs[0].kind, ErrorType::Forbidden);
    assert!(errs[0].detail.starts_with("spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n"));
}

#[test]
fn volume_source_is_immutable() {
    let r = Registry::builtin();
    let k = kind(&r, "persistentvolumes");
    let old = json!({"metadata": {"name": "v"}, "spec": {"accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": "1Gi"}, "csi": {"driver": "d.example.com", "volumeHandle": "h"}}});
    assert!(validate_create(&k, &old, &FeatureGates::default()).is_empty());
    let mut new = old.clone();
    new["spec"]["csi"]["volumeHandle"] = json!("other");
    let errs = validate_update(&k, &new, &old, false, &FeatureGates::default());
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "spec.persistentvolumesource");
    let mut expand = old.clone();
    expand["spec"]["csi"]["controllerExpandSecretRef"] = json!({"name": "s", "namespace": "n"});
    assert!(validate_update(&k, &expand, &old, false, &FeatureGates::default()).is_empty());
    let none = json!({"metadata": {"name": "v"}, "spec": {}});
    let text: Vec<String> = validate_create(&k, &none, &FeatureGates::default())
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        text,
        [
            "spec.accessModes: Required value",
            "spec.capacity: Required value",
            "spec.capacity: Unsupported value: null: supported values: \"storage\"",
            "spec: Required value: must specify a volume type"
        ]
    );
}

#[test]
fn events_must_be_in_their_objects_namespace() {
    let r = Registry::builtin();
    let k = kind(&r, "events");
    let ev = json!({"metadata": {"name": "e", "namespace": "ns"},
        "involvedObject": {"kind": "ConfigMap", "name": "c"}});
    let errs = validate_create(&k, &ev, &FeatureGates::default());
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["involvedObject.namespace: Invalid value: \"\": does not match event.namespace"]
    );
    let mut ok = ev.clone();
    ok["involvedObject"]["namespace"] = json!("ns");
    assert!(validate_create(&k, &ok, &FeatureGates::default()).is_empty());
    let mut default_ns = ev.clone();
    default_ns["metadata"]["namespace"] = json!("default");
    assert!(validate_create(&k, &default_ns, &FeatureGates::default()).is_empty());
}

#[test]
fn attachment_spec_is_immutable() {
    let r = Registry::builtin();
    let id = r
        .lookup("storage.k8s.io", "v1", "volumeattachments")
        .unwrap();
    let k = r.get(id).clone();
    let old = json!({"metadata": {"name": "va"}, "spec": {"attacher": "d.example.com",
        "nodeName": "n", "source": {"persistentVolumeName": "pv"}}});
    assert!(validate_create(&k, &old, &FeatureGates::default()).is_empty());
    let mut new = old.clone();
    new["spec"]["nodeName"] = json!("m");
    let errs = validate_update(&k, &new, &old, false, &FeatureGates::default());
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec: Invalid value: {\"Attacher\":\"d.example.com\",\"Source\":{\"PersistentVolumeName\":\"pv\",\"InlineVolumeSpec\":null},\"NodeName\":\"m\"}: field is immutable"
        ]
    );
    assert_eq!(
        invalid(&k, "va", &errs).message.split(':').next(),
        Some("VolumeAttachment.storage.k8s.io \"va\" is invalid")
    );
}

#[test]
fn snapshot_metadata_services_follow_their_schema() {
    let r = Registry::builtin();
    let k = r
        .get(
            r.lookup("cbt.storage.k8s.io", "v1beta1", "snapshotmetadataservices")
                .unwrap(),
        )
        .clone();
    let gates = FeatureGates::default();
    let text = |obj: &Value| -> Vec<String> {
        validate_create(&k, obj, &gates)
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let good = json!({"metadata": {"name": "hostpath.csi.k8s.io"}, "spec": {
        "address": "snapshot-metadata.csi-driver:6443", "audience": "test-backup-client",
        "caCert": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="}});
    assert!(text(&good).is_empty());
    assert_eq!(
        text(&json!({"metadata": {"name": "d"}})),
        ["spec: Required value"]
    );
    let bad =
        json!({"metadata": {"name": "d"}, "spec": {"address": 6443, "caCert": "not base64!"}});
    assert_eq!(
        text(&bad),
        [
            "spec.address: Invalid value: \"integer\": spec.address in body must be of type string: \"integer\"",
            "spec.audience: Required value",
            "spec.caCert: Invalid value: \"not base64!\": spec.caCert in body must be of type byte: \"not base64!\""
        ]
    );
    let e = invalid(&k, "d", &validate_create(&k, &bad, &gates));
    assert!(
        e.message
            .starts_with("SnapshotMetadataService.cbt.storage.k8s.io \"d\" is invalid: ["),
        "{}",
        e.message
    );
    // Updates are held to the schema too.
    let mut dropped = good.clone();
    dropped["spec"].as_object_mut().unwrap().remove("audience");
    let errs = validate_update(&k, &dropped, &good, false, &gates);
    assert_eq!(errs[0].to_string(), "spec.audience: Required value");
}

#[test]
fn immutable_secrets_and_config_maps_keep_their_data_and_the_size_is_limited() {
    use base64::Engine;
    let r = Registry::builtin();
    let gates = FeatureGates::default();
    for plural in ["secrets", "configmaps"] {
        let k = kind(&r, plural);
        let old = json!({"metadata": {"name": "s", "resourceVersion": "1"},
            "data": {"k": "dg=="}, "immutable": true});
        let mut changed = old.clone();
        changed["data"]["k"] = json!("dw==");
        let errs = validate_update(&k, &changed, &old, false, &gates);
        assert_eq!(errs.len(), 1, "{plural}: {errs:?}");
        assert_eq!(errs[0].field, "data");
        assert_eq!(errs[0].kind, ErrorType::Forbidden);
        let mut unmarked = old.clone();
        unmarked["immutable"] = Value::Null;
        let errs = validate_update(&k, &unmarked, &old, false, &gates);
        assert_eq!(errs[0].field, "immutable", "{plural}");
        // A mutable object changes freely, and its labels may change on an immutable one.
        let mut relabeled = old.clone();
        relabeled["metadata"]["labels"] = json!({"a": "b"});
        assert!(validate_update(&k, &relabeled, &old, false, &gates).is_empty());
        let mut mutable = old.clone();
        mutable["immutable"] = json!(false);
        let mut next = changed.clone();
        next["immutable"] = json!(false);
        assert!(validate_update(&k, &next, &mutable, false, &gates).is_empty());
    }
    // A Secret's decoded values count; a ConfigMap's keys and values.
    let secrets = kind(&r, "secrets");
    let value = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![0u8; n]);
    let at_limit = json!({"metadata": {"name": "s"}, "data": {"a": value(MAX_DATA_BYTES)}});
    assert!(validate_create(&secrets, &at_limit, &FeatureGates::default()).is_empty());
    let past = json!({"metadata": {"name": "s"},
        "data": {"a": value(MAX_DATA_BYTES), "b": value(1)}});
    let errs = validate_create(&secrets, &past, &FeatureGates::default());
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].kind, ErrorType::TooLong);
    let maps = kind(&r, "configmaps");
    let full = json!({"metadata": {"name": "m"}, "data": {"k": "x".repeat(MAX_DATA_BYTES)}});
    assert_eq!(
        validate_create(&maps, &full, &FeatureGates::default()).len(),
        1
    );
}
