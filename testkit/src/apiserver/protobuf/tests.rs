use super::*;

fn round_trip(v: Value) {
    let bytes = encode_object(&v).unwrap();
    assert_eq!(&bytes[..4], b"k8s\0");
    assert_eq!(decode_object(&bytes).unwrap(), v);
}

#[test]
fn the_definitions_load_and_carry_the_go_json_options() {
    let s = schema().unwrap();
    assert!(
        s.inline
            .contains("k8s.io.api.core.v1.PersistentVolumeSpec.persistentVolumeSource")
    );
    assert!(s.inline.contains("k8s.io.api.core.v1.Volume.volumeSource"));
    assert!(
        s.omitempty
            .contains("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta.name")
    );
    // A pointer: an empty storageClassName means "no class" and is kept.
    assert!(
        !s.omitempty
            .contains("k8s.io.api.core.v1.PersistentVolumeClaimSpec.storageClassName")
    );
    for (api_version, kind) in SUPPORTED {
        message_for(api_version, kind).unwrap();
        let list = message_for(api_version, &format!("{kind}List")).unwrap();
        let numbers: Vec<(String, u32)> = list
            .fields()
            .map(|f| (f.name().to_string(), f.number()))
            .collect();
        assert_eq!(
            numbers,
            [("metadata".to_string(), 1), ("items".to_string(), 2)],
            "{kind}List"
        );
    }
    // Fields are declared in number order, so encoding follows it.
    for m in s.pool.all_messages() {
        let numbers: Vec<u32> = m.fields().map(|f| f.number()).collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{}", m.full_name());
    }
}

#[test]
fn objects_round_trip_between_json_and_protobuf() {
    let meta = json!({
        "name": "n", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
        "generation": 3, "creationTimestamp": "2024-01-02T03:04:05Z",
        "deletionTimestamp": "2024-01-02T03:04:06Z", "deletionGracePeriodSeconds": 0,
        "labels": {"a": "1"}, "annotations": {"b/c": "2"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-2",
                             "controller": true, "blockOwnerDeletion": false}],
        "finalizers": ["x/y"],
        "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                           "time": "2024-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:data": {}}}]
    });
    round_trip(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                      "data": {"k": "v"}, "binaryData": {"b": "AAEC"}, "immutable": true}),
    );
    round_trip(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                      "data": {"k": "aMOp"}, "type": "Opaque"}),
    );
    round_trip(json!({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": "n", "generateName": "g-"},
                      "spec": {"finalizers": ["kubernetes"]},
                      "status": {"phase": "Terminating", "conditions": [
                          {"type": "NamespaceDeletionContentFailure", "status": "False",
                           "lastTransitionTime": "2024-01-02T03:04:05Z", "reason": "R", "message": "m"}]}}));
    round_trip(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}));
}

#[test]
fn the_envelope_is_the_magic_and_a_runtime_unknown() {
    let bytes = wrap_envelope("v1", "ConfigMap", vec![1, 2, 3]);
    // Field 1 (typeMeta, length-delimited) right after the magic.
    assert_eq!(&bytes[..5], &[0x6b, 0x38, 0x73, 0x00, 0x0a]);
    let (api_version, kind, raw) = unwrap_envelope(&bytes).unwrap();
    assert_eq!(
        (api_version.as_str(), kind.as_str(), raw),
        ("v1", "ConfigMap", vec![1, 2, 3])
    );
    assert_eq!(unwrap_envelope(b"{}").unwrap_err(), ProtoError::Magic);
    let crd = wrap_envelope("snapshot.storage.k8s.io/v1", "VolumeSnapshot", vec![]);
    assert!(matches!(
        decode_object(&crd).unwrap_err(),
        ProtoError::Unsupported { .. }
    ));
    assert!(matches!(
        decode_object(&[0x6b, 0x38, 0x73, 0x00, 0xff]).unwrap_err(),
        ProtoError::Decode(_)
    ));
    // A message that is not valid for the kind is a decode error, not a panic.
    let bad = wrap_envelope("v1", "ConfigMap", vec![0x0a, 0x05, 0x01]);
    assert!(matches!(
        decode_object(&bad).unwrap_err(),
        ProtoError::Decode(_)
    ));
}

#[test]
fn go_zero_values_are_dropped_where_go_json_omits_them() {
    // What a Go client writes for an ObjectMeta with only a name: every
    // value field, empty ones too, and an empty creationTimestamp.
    let mut meta = Vec::new();
    put_len_delimited(&mut meta, 1, b"n");
    put_len_delimited(&mut meta, 2, b"");
    put_len_delimited(&mut meta, 3, b"");
    put_len_delimited(&mut meta, 4, b"");
    put_len_delimited(&mut meta, 5, b"");
    put_len_delimited(&mut meta, 6, b"");
    put_tag(&mut meta, 7, VARINT);
    put_varint(&mut meta, 0);
    put_len_delimited(&mut meta, 8, b"");
    let mut spec = Vec::new();
    put_len_delimited(&mut spec, 5, b""); // storageClassName: a pointer, kept
    put_len_delimited(&mut spec, 3, b""); // volumeName: omitempty, dropped
    let mut pvc = Vec::new();
    put_len_delimited(&mut pvc, 1, &meta);
    put_len_delimited(&mut pvc, 2, &spec);
    put_len_delimited(&mut pvc, 3, b"");
    let v = decode_object(&wrap_envelope("v1", "PersistentVolumeClaim", pvc)).unwrap();
    assert_eq!(
        v,
        json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
               "metadata": {"name": "n", "creationTimestamp": null},
               "spec": {"storageClassName": ""}, "status": {}})
    );
}

#[test]
fn special_messages_have_their_json_forms() {
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"a": "b"}},
                 "claimRef": {"namespace": "ns", "name": "c"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "k", "operator": "In", "values": ["v"]}]}]}},
                 "persistentVolumeReclaimPolicy": "Delete", "volumeMode": "Filesystem"},
        "status": {"phase": "Bound", "lastPhaseTransitionTime": "2024-01-02T03:04:05Z"}});
    round_trip(pv);
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l", "namespace": "ns"},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15,
                 "acquireTime": "2024-01-02T03:04:05.123456Z", "renewTime": "2024-01-02T03:04:06.000000Z",
                 "leaseTransitions": 0}});
    round_trip(lease);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 80}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 5},
            "livenessProbe": {"tcpSocket": {"port": 8080}},
            "resources": {"limits": {"cpu": "500m"}}}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}},
                        {"name": "s", "secret": {"secretName": "x"}}]}});
    round_trip(pod);
    // A number for a quantity is kept as its text.
    let cap = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
        "metadata": {"name": "c"}, "storageClassName": "sc", "capacity": 1024});
    let back = decode_object(&encode_object(&cap).unwrap()).unwrap();
    assert_eq!(back["capacity"], "1024");
    // A key with no field is dropped, not an error.
    let odd = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "bogus": 1,
                     "data": {"k": 5}});
    let back = decode_object(&encode_object(&odd).unwrap()).unwrap();
    assert_eq!(
        back,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": ""}})
    );
}

#[test]
fn lists_carry_list_metadata_and_items() {
    let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
    let bytes = encode_list(
        "v1",
        "ConfigMap",
        &[&a],
        &json!({"resourceVersion": "7", "continue": "t", "remainingItemCount": 2}),
    )
    .unwrap();
    let v = decode_object(&bytes).unwrap();
    assert_eq!(
        v,
        json!({"kind": "ConfigMapList", "apiVersion": "v1",
               "metadata": {"resourceVersion": "7", "continue": "t", "remainingItemCount": 2},
               "items": [{"metadata": {"name": "a"}}]})
    );
}

#[test]
fn delete_options_and_status_convert() {
    let mut raw = Vec::new();
    let mut pre = Vec::new();
    put_len_delimited(&mut pre, 1, b"u");
    put_len_delimited(&mut raw, 2, &pre);
    put_len_delimited(&mut raw, 5, b"All");
    let v = decode_delete_options(&wrap_envelope("meta.k8s.io/v1", "DeleteOptions", raw)).unwrap();
    assert_eq!(v["preconditions"], json!({"uid": "u"}));
    assert_eq!(v["dryRun"], json!(["All"]));

    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "m", "reason": "NotFound", "details": {"name": "x", "kind": "pods"}, "code": 404});
    let bytes = encode_status(&status).unwrap();
    assert_eq!(decode_object(&bytes).unwrap(), status);
}

#[test]
fn watch_frames_are_length_prefixed_watch_events() {
    let obj =
        encode_object(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}))
            .unwrap();
    let mut stream = watch_frame("ADDED", &obj).to_vec();
    stream.extend_from_slice(&watch_frame("DELETED", &obj));
    let ((t, o), rest) = read_watch_frame(&stream).unwrap().unwrap();
    assert_eq!((t.as_str(), &o), ("ADDED", &obj));
    let ((t, _), rest) = read_watch_frame(rest).unwrap().unwrap();
    assert_eq!(t, "DELETED");
    assert!(rest.is_empty());
    assert!(read_watch_frame(&stream[..10]).unwrap().is_none());
}

#[test]
fn reviews_carry_the_published_field_numbers_and_round_trip() {
    let numbers = |name: &str| -> Vec<(String, u32)> {
        let m = schema().unwrap().pool.get_message_by_name(name).unwrap();
        m.fields()
            .map(|f| (f.name().to_string(), f.number()))
            .collect()
    };
    let named = |fields: &[(&str, u32)]| -> Vec<(String, u32)> {
        fields.iter().map(|(n, i)| (n.to_string(), *i)).collect()
    };
    let authn = "k8s.io.api.authentication.v1";
    let authz = "k8s.io.api.authorization.v1";
    let object = named(&[("metadata", 1), ("spec", 2), ("status", 3)]);
    assert_eq!(numbers(&format!("{authn}.TokenReview")), object);
    assert_eq!(numbers(&format!("{authz}.SubjectAccessReview")), object);
    assert_eq!(
        numbers(&format!("{authn}.TokenReviewSpec")),
        named(&[("token", 1), ("audiences", 2)])
    );
    assert_eq!(
        numbers(&format!("{authn}.TokenReviewStatus")),
        named(&[
            ("authenticated", 1),
            ("user", 2),
            ("error", 3),
            ("audiences", 4)
        ])
    );
    assert_eq!(
        numbers(&format!("{authn}.UserInfo")),
        named(&[("username", 1), ("uid", 2), ("groups", 3), ("extra", 4)])
    );
    assert_eq!(
        numbers(&format!("{authz}.SubjectAccessReviewSpec")),
        named(&[
            ("resourceAttributes", 1),
            ("nonResourceAttributes", 2),
            ("user", 3),
            ("groups", 4),
            ("extra", 5),
            ("uid", 6)
        ])
    );
    assert_eq!(
        numbers(&format!("{authz}.ResourceAttributes"))[..7],
        named(&[
            ("namespace", 1),
            ("verb", 2),
            ("group", 3),
            ("version", 4),
            ("resource", 5),
            ("subresource", 6),
            ("name", 7)
        ])[..]
    );
    assert_eq!(
        numbers(&format!("{authz}.SubjectAccessReviewStatus")),
        named(&[
            ("allowed", 1),
            ("reason", 2),
            ("evaluationError", 3),
            ("denied", 4)
        ])
    );
    assert!(message_for("authentication.k8s.io/v1", "TokenReviewList").is_err());

    round_trip(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
        "spec": {"token": "t", "audiences": ["a", "b"]},
        "status": {"authenticated": true, "audiences": ["a"],
                   "user": {"username": "u", "uid": "1", "groups": ["g"],
                            "extra": {"k": ["v1", "v2"], "none": []}}}
    }));
    round_trip(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "metadata": {"name": "n"},
        "spec": {"user": "u", "groups": ["g"], "uid": "1", "extra": {"scopes": ["s"]},
                 "resourceAttributes": {"namespace": "ns", "verb": "get", "group": "g",
                                        "version": "v1", "resource": "r", "name": "x",
                                        "fieldSelector": {"rawSelector": "a=b",
                                            "requirements": [{"key": "a", "operator": "In",
                                                              "values": ["b"]}]}}},
        "status": {"allowed": false, "denied": true, "reason": "no"}
    }));
    round_trip(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}, "user": "u"},
        "status": {"allowed": true}
    }));
    // An extra value is Go's `[]string`: the items, each as field 1.
    let (_, _, raw) = encode_raw(&json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"extra": {"k": ["x"]}}
    }))
    .unwrap();
    let entry = [0x0a, 0x01, b'k', 0x12, 0x03, 0x0a, 0x01, b'x'];
    let mut spec = vec![0x2a, entry.len() as u8];
    spec.extend(entry);
    let mut want = vec![0x12, spec.len() as u8];
    want.extend(spec);
    assert_eq!(raw, want);
}
