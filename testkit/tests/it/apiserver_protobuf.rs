//! Protobuf request and response bodies, watch streams and Status errors,
//! sent and read as client-go's typed clients and kubectl's imperative
//! commands do. The client side here is independent of the server's
//! converter: prost structs written from the published field numbers, and
//! byte sequences worked out by hand.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease as KLease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume as KPv, Secret as KSecret, ServiceAccount,
};
use kube::Api;
use prost::Message;
use serde_json::{Value, json};
use testkit::apiserver::ApiServer;
use testkit::apiserver::Options;
use testkit::apiserver::protobuf::{self, MEDIA_TYPE, WATCH_MEDIA_TYPE};
use testkit::process::CleanEnv;

use crate::apiserver_support::TIMEOUT;

/// What client-go's typed clients send: protobuf first, JSON as the fallback.
const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

// ---- the client's own messages (field numbers as published upstream) ----

#[derive(Clone, PartialEq, Message)]
struct CTypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CUnknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<CTypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    content_encoding: Option<String>,
    #[prost(string, optional, tag = "4")]
    content_type: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CTime {
    #[prost(int64, optional, tag = "1")]
    seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    nanos: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct CObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(message, optional, tag = "8")]
    creation_timestamp: Option<CTime>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
struct CListMeta {
    #[prost(string, optional, tag = "2")]
    resource_version: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CLeaseSpec {
    #[prost(string, optional, tag = "1")]
    holder_identity: Option<String>,
    #[prost(int32, optional, tag = "2")]
    lease_duration_seconds: Option<i32>,
    #[prost(message, optional, tag = "3")]
    acquire_time: Option<CTime>,
    #[prost(message, optional, tag = "4")]
    renew_time: Option<CTime>,
    #[prost(int32, optional, tag = "5")]
    lease_transitions: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct CLease {
    #[prost(message, optional, tag = "1")]
    metadata: Option<CObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<CLeaseSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct CQuantity {
    #[prost(string, optional, tag = "1")]
    string: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CCsiSource {
    #[prost(string, optional, tag = "1")]
    driver: Option<String>,
    #[prost(string, optional, tag = "2")]
    volume_handle: Option<String>,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
    #[prost(string, optional, tag = "4")]
    fs_type: Option<String>,
    #[prost(btree_map = "string, string", tag = "5")]
    volume_attributes: BTreeMap<String, String>,
}

/// `PersistentVolumeSource`: embedded in the spec in Go, a message of its own on the wire.
#[derive(Clone, PartialEq, Message)]
struct CPvSource {
    #[prost(message, optional, tag = "22")]
    csi: Option<CCsiSource>,
}

#[derive(Clone, PartialEq, Message)]
struct CObjectReference {
    #[prost(string, optional, tag = "2")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CPvSpec {
    #[prost(btree_map = "string, message", tag = "1")]
    capacity: BTreeMap<String, CQuantity>,
    #[prost(message, optional, tag = "2")]
    source: Option<CPvSource>,
    #[prost(string, repeated, tag = "3")]
    access_modes: Vec<String>,
    #[prost(message, optional, tag = "4")]
    claim_ref: Option<CObjectReference>,
    #[prost(string, optional, tag = "5")]
    reclaim_policy: Option<String>,
    #[prost(string, optional, tag = "6")]
    storage_class_name: Option<String>,
    #[prost(string, optional, tag = "8")]
    volume_mode: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CPvStatus {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CPv {
    #[prost(message, optional, tag = "1")]
    metadata: Option<CObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<CPvSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<CPvStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct CPvList {
    #[prost(message, optional, tag = "1")]
    metadata: Option<CListMeta>,
    #[prost(message, repeated, tag = "2")]
    items: Vec<CPv>,
}

#[derive(Clone, PartialEq, Message)]
struct CSecret {
    #[prost(message, optional, tag = "1")]
    metadata: Option<CObjectMeta>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    data: BTreeMap<String, Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    r#type: Option<String>,
    #[prost(btree_map = "string, string", tag = "4")]
    string_data: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
struct CPreconditions {
    #[prost(string, optional, tag = "1")]
    uid: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CDeleteOptions {
    #[prost(message, optional, tag = "2")]
    preconditions: Option<CPreconditions>,
}

#[derive(Clone, PartialEq, Message)]
struct CStatusDetails {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CStatus {
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(string, optional, tag = "3")]
    message: Option<String>,
    #[prost(string, optional, tag = "4")]
    reason: Option<String>,
    #[prost(message, optional, tag = "5")]
    details: Option<CStatusDetails>,
    #[prost(int32, optional, tag = "6")]
    code: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct CRawExtension {
    #[prost(bytes = "vec", optional, tag = "1")]
    raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct CWatchEvent {
    #[prost(string, optional, tag = "1")]
    r#type: Option<String>,
    #[prost(message, optional, tag = "2")]
    object: Option<CRawExtension>,
}

/// The client's envelope: magic, then `runtime.Unknown`.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut out = b"k8s\0".to_vec();
    CUnknown {
        type_meta: Some(CTypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    }
    .encode(&mut out)
    .unwrap();
    out
}

/// The client's reading of an envelope: (apiVersion, kind, raw).
fn open_envelope(body: &[u8]) -> (String, String, Vec<u8>) {
    assert_eq!(&body[..4], b"k8s\0", "no protobuf magic: {body:?}");
    let u = CUnknown::decode(&body[4..]).unwrap();
    let tm = u.type_meta.unwrap();
    (
        tm.api_version.unwrap(),
        tm.kind.unwrap(),
        u.raw.unwrap_or_default(),
    )
}

fn meta(name: &str, namespace: Option<&str>) -> CObjectMeta {
    CObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        ..Default::default()
    }
}

async fn send_with(
    server: &ApiServer,
    method: &str,
    uri: &str,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .header("accept", accept)
        .body(body.into())
        .unwrap();
    let resp = server.client().send(req).await.unwrap();
    let code = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (code, ct, bytes)
}

async fn send(
    server: &ApiServer,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    send_with(server, method, uri, content_type, ACCEPT, body).await
}

/// A protobuf watch stream, read frame by frame with the client's messages.
struct ProtoWatch {
    body: kube::client::Body,
    buf: Vec<u8>,
    content_type: String,
}

impl ProtoWatch {
    async fn open(server: &ApiServer, uri: &str, accept: &str) -> Self {
        let req = http::Request::builder()
            .method("GET")
            .uri(uri)
            .header("accept", accept)
            .body(Vec::new().into())
            .unwrap();
        let resp = server.client().send(req).await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        Self {
            body: resp.into_body(),
            buf: Vec::new(),
            content_type,
        }
    }

    /// The next event: its type and the enveloped object, or None at the end.
    async fn next(&mut self) -> Option<(String, Vec<u8>)> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if self.buf.len() >= 4 + len {
                    let frame: Vec<u8> = self.buf.drain(..4 + len).skip(4).collect();
                    let ev = CWatchEvent::decode(&frame[..]).unwrap();
                    return Some((ev.r#type.unwrap(), ev.object.unwrap().raw.unwrap()));
                }
            }
            let frame = tokio::time::timeout(TIMEOUT, self.body.frame())
                .await
                .expect("watch stalled");
            match frame {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                _ => {
                    assert!(self.buf.is_empty(), "a partial frame at the end");
                    return None;
                }
            }
        }
    }

    async fn next_event(&mut self) -> Option<(String, Vec<u8>)> {
        loop {
            let ev = self.next().await?;
            if ev.0 != "BOOKMARK" {
                return Some(ev);
            }
        }
    }
}

// ---- tests ----

/// The server's encoding of a small Lease, worked out byte by byte from the
/// published field numbers, and its decoding of the client's own encoding.
#[test]
fn lease_and_pv_bytes_match_the_published_field_numbers() {
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l", "namespace": "ns"},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}});
    #[rustfmt::skip]
    let mut golden: Vec<u8> = vec![
        0x6b, 0x38, 0x73, 0x00,             // "k8s\0"
        0x0a, 0x1f,                         // Unknown.typeMeta, 31 bytes
        0x0a, 0x16,                         //   apiVersion, 22 bytes
    ];
    golden.extend_from_slice(b"coordination.k8s.io/v1");
    golden.extend_from_slice(&[0x12, 0x05]); //   kind, 5 bytes
    golden.extend_from_slice(b"Lease");
    #[rustfmt::skip]
    golden.extend_from_slice(&[
        0x12, 0x11,                         // Unknown.raw, 17 bytes: the Lease
        0x0a, 0x07,                         //   metadata (1), 7 bytes
        0x0a, 0x01, b'l',                   //     name (1)
        0x1a, 0x02, b'n', b's',             //     namespace (3)
        0x12, 0x06,                         //   spec (2), 6 bytes
        0x0a, 0x02, b'm', b'e',             //     holderIdentity (1)
        0x10, 0x0f,                         //     leaseDurationSeconds (2) = 15
        0x1a, 0x00,                         // Unknown.contentEncoding ""
        0x22, 0x00,                         // Unknown.contentType ""
    ]);
    assert_eq!(protobuf::encode_object(&lease).unwrap(), golden);
    assert_eq!(protobuf::decode_object(&golden).unwrap(), lease);

    // A PV as a Go client writes it (the CSI source in its own message, field
    // 2 of the spec, field 22 of the source), decoded into the server's JSON.
    let pv = CPv {
        metadata: Some(meta("pv-1", None)),
        spec: Some(CPvSpec {
            capacity: [(
                "storage".to_string(),
                CQuantity {
                    string: Some("5Gi".into()),
                },
            )]
            .into(),
            source: Some(CPvSource {
                csi: Some(CCsiSource {
                    driver: Some("csi.example.com".into()),
                    volume_handle: Some("vol-1".into()),
                    read_only: Some(false),
                    fs_type: Some("ext4".into()),
                    volume_attributes: [("k".to_string(), "v".to_string())].into(),
                }),
            }),
            access_modes: vec!["ReadWriteOnce".into()],
            claim_ref: Some(CObjectReference {
                namespace: Some("ns".into()),
                name: Some("claim".into()),
            }),
            reclaim_policy: Some("Delete".into()),
            storage_class_name: Some(String::new()),
            volume_mode: Some("Filesystem".into()),
        }),
        status: Some(CPvStatus::default()),
    };
    let v =
        protobuf::decode_object(&envelope("v1", "PersistentVolume", pv.encode_to_vec())).unwrap();
    assert_eq!(
        v,
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "5Gi"},
                     // readOnly false and storageClassName "" are Go zero values of
                     // `omitempty` fields: absent in the JSON, as the real server renders them.
                     "csi": {"driver": "csi.example.com", "volumeHandle": "vol-1", "fsType": "ext4",
                             "volumeAttributes": {"k": "v"}},
                     "accessModes": ["ReadWriteOnce"],
                     "claimRef": {"namespace": "ns", "name": "claim"},
                     "persistentVolumeReclaimPolicy": "Delete", "volumeMode": "Filesystem"},
            "status": {}})
    );
    // And back: the client reads the server's encoding with its own messages.
    let (api_version, kind, raw) = open_envelope(&protobuf::encode_object(&v).unwrap());
    assert_eq!(
        (api_version.as_str(), kind.as_str()),
        ("v1", "PersistentVolume")
    );
    let back = CPv::decode(&raw[..]).unwrap();
    let spec = back.spec.unwrap();
    assert_eq!(spec.capacity["storage"].string.as_deref(), Some("5Gi"));
    let csi = spec.source.unwrap().csi.unwrap();
    assert_eq!(csi.volume_handle.as_deref(), Some("vol-1"));
    assert_eq!(csi.volume_attributes["k"], "v");
    assert_eq!(spec.claim_ref.unwrap().name.as_deref(), Some("claim"));
}

/// Every stored built-in kind converts from JSON to protobuf and back unchanged.
#[test]
fn every_built_in_kind_round_trips() {
    let t = "2024-01-02T03:04:05Z";
    let mt = "2024-01-02T03:04:05.123456Z";
    let m = |name: &str| {
        json!({"name": name, "namespace": "ns", "uid": "u", "resourceVersion": "5",
                                "creationTimestamp": t, "labels": {"a": "b"}})
    };
    let objects = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"},
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node"},
               "spec": {"providerID": "p", "taints": [{"key": "k", "effect": "NoSchedule"}]},
               "status": {"capacity": {"cpu": "4", "memory": "8Gi"}, "allocatable": {"cpu": "3800m"},
                          "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": t}],
                          "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                          "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                                       "kernelVersion": "k", "osImage": "o", "containerRuntimeVersion": "c",
                                       "kubeletVersion": "v1.30.0", "kubeProxyVersion": "",
                                       "operatingSystem": "linux", "architecture": "amd64"},
                          "volumesAttached": [{"name": "kubernetes.io/csi/d^h", "devicePath": ""}],
                          "volumesInUse": ["kubernetes.io/csi/d^h"]}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv",
                   "finalizers": ["kubernetes.io/pv-protection"],
                   "annotations": {"pv.kubernetes.io/provisioned-by": "d"}},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                        "csi": {"driver": "d", "volumeHandle": "h", "readOnly": true,
                                "nodeStageSecretRef": {"name": "s", "namespace": "ns"}},
                        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "c",
                                     "uid": "u", "apiVersion": "v1", "resourceVersion": "3"},
                        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "sc",
                        "mountOptions": ["ro"], "volumeMode": "Block",
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}},
                        "volumeAttributesClassName": "gold"},
               "status": {"phase": "Released", "message": "m", "lastPhaseTransitionTime": t}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "nfs"},
               "spec": {"nfs": {"server": "srv", "path": "/x"}, "hostPath": {"path": "/h", "type": ""}},
               "status": {}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": m("c"),
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                        "volumeName": "pv", "storageClassName": "", "volumeMode": "Filesystem",
                        "selector": {"matchLabels": {"x": "y"},
                                     "matchExpressions": [{"key": "k", "operator": "Exists"}]},
                        "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s"},
                        "dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                                          "name": "s", "namespace": "other"}},
               "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                          "conditions": [{"type": "Resizing", "status": "True", "lastProbeTime": t}],
                          "allocatedResources": {"storage": "2Gi"},
                          "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": m("s"),
               "data": {"k": "AAEC/w=="}, "type": "kubernetes.io/tls", "immutable": false}),
        json!({"apiVersion": "v1", "kind": "Event", "metadata": m("e.1"),
               "involvedObject": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "c", "uid": "u"},
               "reason": "Provisioning", "message": "External provisioner is provisioning",
               "source": {"component": "csi-provisioner"}, "firstTimestamp": t, "lastTimestamp": t,
               "count": 2, "type": "Normal", "eventTime": mt,
               "reportingComponent": "csi-provisioner", "reportingInstance": "host"}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": m("p"),
               "spec": {"nodeName": "node", "serviceAccountName": "sa", "restartPolicy": "Always",
                        "containers": [{"name": "c", "image": "img", "args": ["--v=5"],
                            "env": [{"name": "A", "value": "1"},
                                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                                    {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                            "volumeMounts": [{"name": "v", "mountPath": "/data", "mountPropagation": "Bidirectional"}],
                            "securityContext": {"privileged": true},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9808}, "failureThreshold": 5}}],
                        "volumes": [{"name": "v", "hostPath": {"path": "/var/lib/kubelet", "type": "Directory"}},
                                    {"name": "cm", "configMap": {"name": "cm", "items": [{"key": "a", "path": "b"}]}},
                                    {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"metadata": {"labels": {"a": "b"}},
                                        "spec": {"accessModes": ["ReadWriteOnce"],
                                                 "resources": {"requests": {"storage": "1Gi"}}}}}},
                                    {"name": "inl", "csi": {"driver": "d", "volumeAttributes": {"x": "y"}}}],
                        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]},
               "status": {"phase": "Running", "podIP": "10.1.1.1", "startTime": t}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": m("sa"),
               "secrets": [{"name": "tok"}], "imagePullSecrets": [{"name": "pull"}],
               "automountServiceAccountToken": false}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": m("cm"),
               "data": {"a": "b"}, "binaryData": {"c": "AA=="}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": "sc", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
               "provisioner": "d", "parameters": {"csi.storage.k8s.io/fstype": "xfs"},
               "reclaimPolicy": "Delete", "mountOptions": ["debug"], "allowVolumeExpansion": true,
               "volumeBindingMode": "WaitForFirstConsumer",
               "allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}]}]}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "va"},
               "spec": {"attacher": "d", "nodeName": "node", "source": {"persistentVolumeName": "pv"}},
               "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"},
                          "attachError": {"time": t, "message": "boom", "errorCode": 13},
                          "detachError": {"time": t, "message": "later"}}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "inline"},
               "spec": {"attacher": "d", "nodeName": "node",
                        "source": {"inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "h"},
                                                        "accessModes": ["ReadWriteOnce"]}}},
               "status": {"attached": false}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "node"},
               "spec": {"drivers": [{"name": "d", "nodeID": "n1", "topologyKeys": ["zone"],
                                     "allocatable": {"count": 10}}]}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "d"},
               "spec": {"attachRequired": true, "podInfoOnMount": false, "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                        "storageCapacity": true, "fsGroupPolicy": "File",
                        "tokenRequests": [{"audience": "a", "expirationSeconds": 3600}],
                        "requiresRepublish": false, "seLinuxMount": true,
                        "nodeAllocatableUpdatePeriodSeconds": 60}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": m("cap"),
               "nodeTopology": {"matchLabels": {"zone": "a"}}, "storageClassName": "sc",
               "capacity": "10Gi", "maximumVolumeSize": "1Ti"}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass", "metadata": {"name": "gold"},
               "driverName": "d", "parameters": {"iops": "1000"}}),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": m("lease"),
               "spec": {"holderIdentity": "h", "leaseDurationSeconds": 15, "acquireTime": mt,
                        "renewTime": mt, "leaseTransitions": 3, "strategy": "OldestEmulationVersion",
                        "preferredHolder": "p"}}),
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": m("ev.1"),
               "eventTime": mt, "series": {"count": 2, "lastObservedTime": mt},
               "reportingController": "c", "reportingInstance": "i", "action": "Provision",
               "reason": "R", "regarding": {"kind": "PersistentVolumeClaim", "name": "c", "namespace": "ns"},
               "related": {"kind": "Pod", "name": "p"}, "note": "n", "type": "Warning",
               "deprecatedSource": {"component": "x", "host": "y"},
               "deprecatedFirstTimestamp": t, "deprecatedLastTimestamp": t, "deprecatedCount": 4}),
    ];
    let mut kinds = std::collections::BTreeSet::new();
    for obj in objects {
        let bytes = protobuf::encode_object(&obj).unwrap();
        assert_eq!(protobuf::decode_object(&bytes).unwrap(), obj, "{obj}");
        kinds.insert((
            obj["apiVersion"].as_str().unwrap().to_string(),
            obj["kind"].as_str().unwrap().to_string(),
        ));
    }
    let supported: std::collections::BTreeSet<_> = protobuf::SUPPORTED
        .iter()
        .map(|(a, k)| (a.to_string(), k.to_string()))
        .collect();
    assert_eq!(kinds, supported, "every supported kind has a round trip");
}

#[tokio::test]
async fn protobuf_create_get_list_and_delete() {
    let server = ApiServer::start().await.unwrap();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "p", "labels": {"a": "1"}}, "data": {"k": "v"}});
    let (code, ct, body) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        MEDIA_TYPE,
        protobuf::encode_object(&cm).unwrap(),
    )
    .await;
    assert_eq!((code, ct.as_str()), (201, MEDIA_TYPE));
    let created = protobuf::decode_object(&body).unwrap();
    assert_eq!(created["data"], json!({"k": "v"}));
    assert!(created["metadata"]["uid"].is_string());
    assert!(created["metadata"]["creationTimestamp"].is_string());

    // The same object through JSON.
    let stored = Api::<ConfigMap>::namespaced(server.client(), "default")
        .get("p")
        .await
        .unwrap();
    assert_eq!(
        stored.metadata.resource_version.as_deref(),
        created["metadata"]["resourceVersion"].as_str()
    );
    assert_eq!(stored.metadata.labels.unwrap()["a"], "1");
    assert_eq!(
        serde_json::to_value(&stored.metadata.creation_timestamp).unwrap(),
        created["metadata"]["creationTimestamp"]
    );

    let (code, ct, body) = send(
        &server,
        "GET",
        "/api/v1/namespaces/default/configmaps/p",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    assert_eq!(protobuf::decode_object(&body).unwrap(), created);

    let (code, ct, body) = send(
        &server,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    let (_, kind, _) = open_envelope(&body);
    assert_eq!(kind, "ConfigMapList");

    // Secrets: stringData sent as protobuf is merged into data like any other.
    let secret = CSecret {
        metadata: Some(meta("s", None)),
        string_data: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let (code, _, _) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/secrets",
        MEDIA_TYPE,
        envelope("v1", "Secret", secret.encode_to_vec()),
    )
    .await;
    assert_eq!(code, 201);
    let s = Api::<KSecret>::namespaced(server.client(), "default")
        .get("s")
        .await
        .unwrap();
    assert_eq!(s.data.unwrap()["k"].0, b"v");
    assert!(s.string_data.is_none());

    // DELETE with protobuf DeleteOptions and a failing precondition.
    let opts = CDeleteOptions {
        preconditions: Some(CPreconditions {
            uid: Some("not-the-uid".into()),
        }),
    };
    let (code, ct, body) = send(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/p",
        MEDIA_TYPE,
        envelope("meta.k8s.io/v1", "DeleteOptions", opts.encode_to_vec()),
    )
    .await;
    assert_eq!((code, ct.as_str()), (409, MEDIA_TYPE));
    let (_, kind, raw) = open_envelope(&body);
    assert_eq!(kind, "Status");
    assert_eq!(
        CStatus::decode(&raw[..]).unwrap().reason.as_deref(),
        Some("Conflict")
    );

    // A deletion that removes the object answers a Success Status, in protobuf.
    let (code, ct, body) = send(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/p",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    let (api_version, kind, raw) = open_envelope(&body);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "Status"));
    let status = CStatus::decode(&raw[..]).unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    assert_eq!(status.details.unwrap().name.as_deref(), Some("p"));

    // Garbage is a 400 with a clear message.
    let (code, ct, body) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        MEDIA_TYPE,
        b"k8s\0\xff\xff".to_vec(),
    )
    .await;
    assert_eq!((code, ct.as_str()), (400, MEDIA_TYPE));
    let (_, _, raw) = open_envelope(&body);
    let status = CStatus::decode(&raw[..]).unwrap();
    assert_eq!(status.reason.as_deref(), Some("BadRequest"));
    assert!(
        status
            .message
            .unwrap()
            .contains("error decoding request body"),
        "{body:?}"
    );
    let (code, _, _) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        MEDIA_TYPE,
        b"{\"kind\":\"ConfigMap\"}".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
}

/// What an upstream sidecar does with a protobuf client: write PVs, read
/// claims, record Events, hold a Lease, and watch them all.
#[tokio::test]
async fn pv_pvc_lease_and_event_over_http_in_protobuf() {
    let server = ApiServer::start().await.unwrap();
    // A PV written by the client's own encoder.
    let pv = CPv {
        metadata: Some(CObjectMeta {
            labels: [("app".to_string(), "x".to_string())].into(),
            ..meta("pv-1", None)
        }),
        spec: Some(CPvSpec {
            capacity: [(
                "storage".to_string(),
                CQuantity {
                    string: Some("1Gi".into()),
                },
            )]
            .into(),
            source: Some(CPvSource {
                csi: Some(CCsiSource {
                    driver: Some("csi.example.com".into()),
                    volume_handle: Some("h-1".into()),
                    ..Default::default()
                }),
            }),
            access_modes: vec!["ReadWriteOnce".into()],
            reclaim_policy: Some("Delete".into()),
            storage_class_name: Some("sc".into()),
            ..Default::default()
        }),
        status: Some(CPvStatus::default()),
    };
    let (code, ct, body) = send(
        &server,
        "POST",
        "/api/v1/persistentvolumes",
        MEDIA_TYPE,
        envelope("v1", "PersistentVolume", pv.encode_to_vec()),
    )
    .await;
    assert_eq!((code, ct.as_str()), (201, MEDIA_TYPE), "{body:?}");
    let (_, kind, raw) = open_envelope(&body);
    assert_eq!(kind, "PersistentVolume");
    let created = CPv::decode(&raw[..]).unwrap();
    let created_meta = created.metadata.unwrap();
    assert!(created_meta.uid.is_some_and(|u| !u.is_empty()));
    assert!(created_meta.creation_timestamp.unwrap().seconds.unwrap() > 0);
    // JSON readers see the same volume, with the server's defaults.
    let k = Api::<KPv>::all(server.client()).get("pv-1").await.unwrap();
    let spec = k.spec.unwrap();
    assert_eq!(spec.csi.unwrap().volume_handle, "h-1");
    assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("sc"));

    // GET and LIST in protobuf, decoded by the client.
    let (code, ct, body) = send(
        &server,
        "GET",
        "/api/v1/persistentvolumes/pv-1",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    let got = CPv::decode(&open_envelope(&body).2[..]).unwrap();
    assert_eq!(got.spec.unwrap().volume_mode.as_deref(), Some("Filesystem"));
    let (code, ct, body) = send(
        &server,
        "GET",
        "/api/v1/persistentvolumes?labelSelector=app%3Dx",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    let (_, kind, raw) = open_envelope(&body);
    assert_eq!(kind, "PersistentVolumeList");
    let list = CPvList::decode(&raw[..]).unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(list.metadata.unwrap().resource_version.is_some());

    // A claim, written and read in protobuf through the server's own converter
    // (the client side of PVCs is covered by the round trips).
    let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": ""}});
    let (code, ct, body) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        MEDIA_TYPE,
        protobuf::encode_object(&pvc).unwrap(),
    )
    .await;
    assert_eq!((code, ct.as_str()), (201, MEDIA_TYPE));
    let created = protobuf::decode_object(&body).unwrap();
    // An explicit empty class (a pointer in Go) survives: no default class is assigned.
    assert_eq!(created["spec"]["storageClassName"], "");
    assert_eq!(created["spec"]["resources"]["requests"]["storage"], "1Gi");

    // Open a protobuf watch on leases before writing one.
    let mut watch = ProtoWatch::open(
        &server,
        "/apis/coordination.k8s.io/v1/namespaces/default/leases?watch=1&allowWatchBookmarks=true",
        "application/vnd.kubernetes.protobuf;stream=watch, application/json;stream=watch",
    )
    .await;
    assert_eq!(watch.content_type, WATCH_MEDIA_TYPE);

    let lease = CLease {
        metadata: Some(meta("leader", Some("default"))),
        spec: Some(CLeaseSpec {
            holder_identity: Some("me".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(CTime {
                seconds: Some(1_700_000_000),
                nanos: Some(123_456_000),
            }),
            renew_time: Some(CTime {
                seconds: Some(1_700_000_001),
                nanos: Some(0),
            }),
            lease_transitions: Some(0),
        }),
    };
    let (code, _, body) = send(
        &server,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        MEDIA_TYPE,
        envelope("coordination.k8s.io/v1", "Lease", lease.encode_to_vec()),
    )
    .await;
    assert_eq!(code, 201);
    let created = CLease::decode(&open_envelope(&body).2[..]).unwrap();
    let rv = created
        .metadata
        .as_ref()
        .unwrap()
        .resource_version
        .clone()
        .unwrap();
    let kl = Api::<KLease>::namespaced(server.client(), "default")
        .get("leader")
        .await
        .unwrap();
    let spec = kl.spec.unwrap();
    assert_eq!(
        serde_json::to_value(spec.acquire_time.unwrap()).unwrap(),
        "2023-11-14T22:13:20.123456Z"
    );
    assert_eq!(spec.lease_transitions, Some(0));

    // Renew: an update in protobuf.
    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().renew_time = Some(CTime {
        seconds: Some(1_700_000_010),
        nanos: Some(0),
    });
    let (code, _, body) = send(
        &server,
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader",
        MEDIA_TYPE,
        envelope("coordination.k8s.io/v1", "Lease", renewed.encode_to_vec()),
    )
    .await;
    assert_eq!(code, 200, "{body:?}");
    // A stale write is a protobuf Conflict.
    let (code, ct, body) = send(
        &server,
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader",
        MEDIA_TYPE,
        envelope("coordination.k8s.io/v1", "Lease", renewed.encode_to_vec()),
    )
    .await;
    assert_eq!((code, ct.as_str()), (409, MEDIA_TYPE));
    let st = CStatus::decode(&open_envelope(&body).2[..]).unwrap();
    assert_eq!(
        (st.reason.as_deref(), st.code),
        (Some("Conflict"), Some(409))
    );
    let (code, _, _) = send(
        &server,
        "DELETE",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!(code, 200);

    // The watch saw ADDED, MODIFIED, DELETED, each a Lease in the envelope.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (etype, obj) = watch.next_event().await.unwrap();
        let (api_version, kind, raw) = open_envelope(&obj);
        assert_eq!(
            (api_version.as_str(), kind.as_str()),
            ("coordination.k8s.io/v1", "Lease")
        );
        let l = CLease::decode(&raw[..]).unwrap();
        seen.push((etype, l.spec.unwrap().renew_time.unwrap().seconds.unwrap()));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".to_string(), 1_700_000_001),
            ("MODIFIED".to_string(), 1_700_000_010),
            ("DELETED".to_string(), 1_700_000_010),
        ]
    );
    // Bookmarks are Leases with only a resourceVersion.
    loop {
        let (etype, obj) = watch.next().await.unwrap();
        if etype == "BOOKMARK" {
            let (_, kind, raw) = open_envelope(&obj);
            assert_eq!(kind, "Lease");
            let l = CLease::decode(&raw[..]).unwrap();
            let brv: u64 = l
                .metadata
                .unwrap()
                .resource_version
                .unwrap()
                .parse()
                .unwrap();
            assert!(brv > rv.parse::<u64>().unwrap());
            break;
        }
    }

    // events.k8s.io Events, created and listed in protobuf, watched from a resourceVersion.
    let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "c.1", "namespace": "default"},
        "eventTime": "2024-01-02T03:04:05.000001Z", "reportingController": "csi-provisioner",
        "reportingInstance": "host", "action": "Provisioning", "reason": "Provisioning",
        "regarding": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "c"},
        "note": "External provisioner is provisioning volume", "type": "Normal"});
    let (code, _, body) = send(
        &server,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        MEDIA_TYPE,
        protobuf::encode_object(&ev).unwrap(),
    )
    .await;
    assert_eq!(code, 201);
    let created = protobuf::decode_object(&body).unwrap();
    assert_eq!(created["eventTime"], "2024-01-02T03:04:05.000001Z");
    assert_eq!(created["regarding"]["name"], "c");
    let (code, ct, body) = send(
        &server,
        "GET",
        "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3Dc",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    let list = protobuf::decode_object(&body).unwrap();
    assert_eq!(list["kind"], "EventList");
    assert_eq!(list["items"][0]["note"], ev["note"]);
    // A core Event from the same client.
    let core = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "c.2", "namespace": "default"},
        "involvedObject": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "c"},
        "reason": "ProvisioningSucceeded", "message": "ok", "type": "Normal",
        "source": {"component": "csi-provisioner"}, "count": 1,
        "firstTimestamp": "2024-01-02T03:04:05Z", "lastTimestamp": "2024-01-02T03:04:05Z"});
    let (code, _, body) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/events",
        MEDIA_TYPE,
        protobuf::encode_object(&core).unwrap(),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(
        protobuf::decode_object(&body).unwrap()["firstTimestamp"],
        core["firstTimestamp"]
    );
}

#[tokio::test]
async fn protobuf_watch_errors_and_deletions() {
    let server = ApiServer::start_with(Options {
        history_limit: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let vols = Api::<KPv>::all(server.client());
    let mk = |name: &str| -> KPv {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"tier": "gold"}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "csi": {"driver": "d", "volumeHandle": name}}}),
        )
        .unwrap()
    };
    let first = vols.create(&Default::default(), &mk("a")).await.unwrap();
    let old_rv = first.metadata.resource_version.unwrap();
    for n in ["b", "c", "d"] {
        vols.create(&Default::default(), &mk(n)).await.unwrap();
    }
    // Too old a resourceVersion: an ERROR event carrying a 410 Status, in protobuf.
    let mut w = ProtoWatch::open(
        &server,
        &format!("/api/v1/persistentvolumes?watch=true&resourceVersion={old_rv}"),
        ACCEPT,
    )
    .await;
    assert_eq!(w.content_type, WATCH_MEDIA_TYPE);
    let (etype, obj) = w.next().await.unwrap();
    assert_eq!(etype, "ERROR");
    let (api_version, kind, raw) = open_envelope(&obj);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "Status"));
    let st = CStatus::decode(&raw[..]).unwrap();
    assert_eq!(
        (st.code, st.reason.as_deref()),
        (Some(410), Some("Expired"))
    );

    // A watch with a label selector: an object that stops matching is DELETED.
    let mut w = ProtoWatch::open(
        &server,
        "/api/v1/persistentvolumes?watch=true&labelSelector=tier%3Dgold",
        ACCEPT,
    )
    .await;
    for _ in 0..4 {
        assert_eq!(w.next_event().await.unwrap().0, "ADDED");
    }
    let mut b = vols.get("b").await.unwrap();
    b.metadata.labels = Some([("tier".to_string(), "bronze".to_string())].into());
    vols.replace("b", &Default::default(), &b).await.unwrap();
    let (etype, obj) = w.next_event().await.unwrap();
    assert_eq!(etype, "DELETED");
    let gone = CPv::decode(&open_envelope(&obj).2[..]).unwrap();
    assert_eq!(gone.metadata.unwrap().labels["tier"], "gold");

    // A missing object: a protobuf 404 Status for a protobuf client, JSON for a JSON one.
    let (code, ct, body) = send(
        &server,
        "GET",
        "/api/v1/persistentvolumes/nope",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (404, MEDIA_TYPE));
    let st = CStatus::decode(&open_envelope(&body).2[..]).unwrap();
    assert_eq!(st.reason.as_deref(), Some("NotFound"));
    let details = st.details.unwrap();
    assert_eq!(
        (details.name.as_deref(), details.kind.as_deref()),
        (Some("nope"), Some("persistentvolumes"))
    );
    let (code, ct, body) = send_with(
        &server,
        "GET",
        "/api/v1/persistentvolumes/nope",
        "",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (404, "application/json"));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["reason"], "NotFound");
}

/// Custom resources have no protobuf, as on a real server: JSON for a client
/// that also accepts JSON, 406 for one that does not, 415 for a protobuf body.
#[tokio::test]
async fn custom_resources_stay_json() {
    let server = ApiServer::start().await.unwrap();
    let class = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "vsc"}, "driver": "d", "deletionPolicy": "Delete"});
    let uri = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses";
    let (code, ct, _) = send(
        &server,
        "POST",
        uri,
        "application/json",
        class.to_string().into_bytes(),
    )
    .await;
    assert_eq!((code, ct.as_str()), (201, "application/json"));
    let (code, ct, body) = send(&server, "GET", &format!("{uri}/vsc"), "", vec![]).await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["driver"],
        "d"
    );
    let (code, ct, _) = send(&server, "GET", uri, "", vec![]).await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    let (code, _, _) = send_with(&server, "GET", uri, "", MEDIA_TYPE, vec![]).await;
    assert_eq!(code, 406);
    let (code, _, _) = send(
        &server,
        "POST",
        uri,
        MEDIA_TYPE,
        envelope("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass", vec![]),
    )
    .await;
    assert_eq!(code, 415);
    // A watch preferring protobuf gets JSON lines.
    let req = http::Request::builder()
        .uri(format!("{uri}?watch=1"))
        .header("accept", ACCEPT)
        .body(Vec::new().into())
        .unwrap();
    let resp = server.client().send(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/json");
    let mut body = resp.into_body();
    let frame = tokio::time::timeout(TIMEOUT, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let line: Value = serde_json::from_slice(frame.data_ref().unwrap().trim_ascii_end()).unwrap();
    assert_eq!(line["type"], "ADDED");
    assert_eq!(line["object"]["metadata"]["name"], "vsc");
}

/// `kubectl` with only the server's kubeconfig; its stdout, or `None` when
/// kubectl is not installed. Panics if it fails.
fn kubectl(server: &ApiServer, args: &[&str]) -> Option<String> {
    let out = kubectl_command(server, args).output().ok()?;
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn kubectl_command(server: &ApiServer, args: &[&str]) -> Command {
    let mut command = Command::new("kubectl");
    command
        .clean_env()
        .env("KUBECONFIG", server.kubeconfig_path())
        .env("HOME", server.kubeconfig_path().parent().unwrap())
        .args(args)
        .stdin(Stdio::null());
    command
}

/// kubectl's imperative commands send protobuf (`Content-Type:
/// application/vnd.kubernetes.protobuf`, checked with `-v=8`) and decode the
/// protobuf answer: each create prints the uid it decoded, which must be the
/// stored object's. What kubectl says about a write differs between its
/// versions, so the outcome is read back through the API, not from its words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_imperative_creates() {
    const UID: &str = "-o=jsonpath={.metadata.uid}";
    const NS: &str = "made-by-kubectl";
    let server = ApiServer::start().await.unwrap();
    let Some(uid) = kubectl(&server, &["create", "namespace", NS, UID]) else {
        println!("skipped: kubectl is not installed");
        return;
    };
    let ns = Api::<Namespace>::all(server.client())
        .get(NS)
        .await
        .unwrap();
    assert_eq!(ns.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));

    let uid = kubectl(
        &server,
        &[
            "create",
            "secret",
            "generic",
            "creds",
            "-n",
            NS,
            "--from-literal=user=admin",
            UID,
        ],
    )
    .unwrap();
    let s = Api::<KSecret>::namespaced(server.client(), NS)
        .get("creds")
        .await
        .unwrap();
    assert_eq!(s.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(s.data.unwrap()["user"].0, b"admin");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));

    let uid = kubectl(
        &server,
        &[
            "create",
            "configmap",
            "settings",
            "-n",
            NS,
            "--from-literal=a=b",
            UID,
        ],
    )
    .unwrap();
    let configmaps = Api::<ConfigMap>::namespaced(server.client(), NS);
    let cm = configmaps.get("settings").await.unwrap();
    assert_eq!(cm.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(cm.data.unwrap()["a"], "b");

    let uid = kubectl(
        &server,
        &["create", "serviceaccount", "robot", "-n", NS, UID],
    )
    .unwrap();
    let accounts = Api::<ServiceAccount>::namespaced(server.client(), NS);
    let sa = accounts.get("robot").await.unwrap();
    assert_eq!(sa.metadata.uid.as_deref(), Some(uid.as_str()));

    // An error answered in protobuf is printed from the decoded Status: its
    // message is the server's, whatever kubectl wraps it in.
    let err = kubectl_command(&server, &["create", "serviceaccount", "robot", "-n", NS])
        .output()
        .unwrap();
    assert!(!err.status.success());
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(
        stderr.contains("serviceaccounts \"robot\" already exists"),
        "{stderr}"
    );
    assert_eq!(
        accounts.get("robot").await.unwrap().metadata,
        sa.metadata,
        "the refused create changed the stored account"
    );

    kubectl(&server, &["delete", "configmap", "settings", "-n", NS]).unwrap();
    assert!(configmaps.get_opt("settings").await.unwrap().is_none());
}
