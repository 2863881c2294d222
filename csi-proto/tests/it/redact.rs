//! Secret-free rendering of messages for logs.

use csi_proto::prost::{Message, Name};
use csi_proto::prost_reflect::{DynamicMessage, MapKey, Value};
use csi_proto::redact::{
    Redactor, STRIPPED, Sanitized, is_secret_field, sanitize, sanitize_encoded,
};
use csi_proto::v1::*;
use std::collections::HashMap;

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mount_capability(mode: volume_capability::access_mode::Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode.into() }),
    }
}

fn assert_no_secret(out: &str) {
    for leaked in ["hunter2", "admin", "password"] {
        assert!(!out.contains(leaked), "{leaked:?} leaked into {out}");
    }
    assert!(out.contains(STRIPPED), "no redaction marker in {out}");
    serde_json::from_str::<serde_json::Value>(out).expect("valid JSON");
}

const SECRETS: [(&str, &str); 2] = [("password", "hunter2"), ("user", "admin")];

#[test]
fn create_volume_request() {
    use volume_capability::access_mode::Mode;
    let request = CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![
            mount_capability(Mode::SingleNodeWriter),
            VolumeCapability {
                access_type: Some(volume_capability::AccessType::Block(
                    volume_capability::BlockVolume {},
                )),
                access_mode: Some(volume_capability::AccessMode {
                    mode: Mode::MultiNodeMultiWriter.into(),
                }),
            },
        ],
        parameters: map(&[("type", "ssd"), ("iops", "300")]),
        secrets: map(&SECRETS),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: "snap-1".into(),
                },
            )),
        }),
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology {
                segments: map(&[("zone", "a")]),
            }],
            preferred: vec![],
        }),
        mutable_parameters: map(&[("tier", "gold")]),
    };
    let out = sanitize(&request);
    assert_no_secret(&out);
    assert_eq!(
        out,
        concat!(
            r#"{"name":"pvc-1","capacity_range":{"required_bytes":1073741824},"#,
            r#""volume_capabilities":[{"mount":{"fs_type":"ext4","mount_flags":["noatime"]},"#,
            r#""access_mode":{"mode":"SINGLE_NODE_WRITER"}},"#,
            r#"{"block":{},"access_mode":{"mode":"MULTI_NODE_MULTI_WRITER"}}],"#,
            r#""parameters":{"iops":"300","type":"ssd"},"secrets":"***stripped***","#,
            r#""volume_content_source":{"snapshot":{"snapshot_id":"snap-1"}},"#,
            r#""accessibility_requirements":{"requisite":[{"segments":{"zone":"a"}}]},"#,
            r#""mutable_parameters":{"tier":"gold"}}"#
        )
    );
}

#[test]
fn delete_volume_request() {
    let request = DeleteVolumeRequest {
        volume_id: "vol-1".into(),
        secrets: map(&SECRETS),
    };
    let out = sanitize(&request);
    assert_no_secret(&out);
    assert_eq!(out, r#"{"volume_id":"vol-1","secrets":"***stripped***"}"#);
}

#[test]
fn empty_secrets_are_omitted_like_any_default() {
    let request = DeleteVolumeRequest {
        volume_id: "vol-1".into(),
        secrets: HashMap::new(),
    };
    assert_eq!(sanitize(&request), r#"{"volume_id":"vol-1"}"#);
    assert_eq!(sanitize(&DeleteVolumeRequest::default()), "{}");
}

#[test]
fn controller_publish_volume_request() {
    let request = ControllerPublishVolumeRequest {
        volume_id: "vol-1".into(),
        node_id: "node-a".into(),
        volume_capability: Some(mount_capability(
            volume_capability::access_mode::Mode::SingleNodeWriter,
        )),
        readonly: true,
        secrets: map(&SECRETS),
        volume_context: map(&[("pool", "p1")]),
    };
    let out = sanitize(&request);
    assert_no_secret(&out);
    assert_eq!(
        out,
        concat!(
            r#"{"volume_id":"vol-1","node_id":"node-a","#,
            r#""volume_capability":{"mount":{"fs_type":"ext4","mount_flags":["noatime"]},"#,
            r#""access_mode":{"mode":"SINGLE_NODE_WRITER"}},"readonly":true,"#,
            r#""secrets":"***stripped***","volume_context":{"pool":"p1"}}"#
        )
    );
}

#[test]
fn node_stage_volume_request() {
    let request = NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        publish_context: map(&[("lun", "3")]),
        staging_target_path: "/var/lib/kubelet/staging/vol-1".into(),
        volume_capability: Some(mount_capability(
            volume_capability::access_mode::Mode::SingleNodeSingleWriter,
        )),
        secrets: map(&SECRETS),
        volume_context: map(&[("pool", "p1")]),
    };
    let out = sanitize(&request);
    assert_no_secret(&out);
    assert_eq!(
        out,
        concat!(
            r#"{"volume_id":"vol-1","publish_context":{"lun":"3"},"#,
            r#""staging_target_path":"/var/lib/kubelet/staging/vol-1","#,
            r#""volume_capability":{"mount":{"fs_type":"ext4","mount_flags":["noatime"]},"#,
            r#""access_mode":{"mode":"SINGLE_NODE_SINGLE_WRITER"}},"#,
            r#""secrets":"***stripped***","volume_context":{"pool":"p1"}}"#
        )
    );
}

#[test]
fn responses_without_secrets_render_fully() {
    let response = CreateVolumeResponse {
        volume: Some(Volume {
            capacity_bytes: 5 << 30,
            volume_id: "vol-1".into(),
            volume_context: map(&[("pool", "p1")]),
            content_source: Some(VolumeContentSource {
                r#type: Some(volume_content_source::Type::Volume(
                    volume_content_source::VolumeSource {
                        volume_id: "vol-0".into(),
                    },
                )),
            }),
            accessible_topology: vec![Topology {
                segments: map(&[("zone", "a"), ("region", "r")]),
            }],
        }),
    };
    assert_eq!(
        sanitize(&response),
        concat!(
            r#"{"volume":{"capacity_bytes":5368709120,"volume_id":"vol-1","#,
            r#""volume_context":{"pool":"p1"},"content_source":{"volume":{"volume_id":"vol-0"}},"#,
            r#""accessible_topology":[{"segments":{"region":"r","zone":"a"}}]}}"#
        )
    );

    let capabilities = GetPluginCapabilitiesResponse {
        capabilities: vec![
            PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service {
                        r#type: plugin_capability::service::Type::ControllerService.into(),
                    },
                )),
            },
            PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(
                    plugin_capability::VolumeExpansion {
                        r#type: plugin_capability::volume_expansion::Type::Online.into(),
                    },
                )),
            },
        ],
    };
    assert_eq!(
        sanitize(&capabilities),
        concat!(
            r#"{"capabilities":[{"service":{"type":"CONTROLLER_SERVICE"}},"#,
            r#"{"volume_expansion":{"type":"ONLINE"}}]}"#
        )
    );

    let snapshots = ListSnapshotsResponse {
        entries: vec![list_snapshots_response::Entry {
            snapshot: Some(Snapshot {
                size_bytes: 10,
                snapshot_id: "snap-1".into(),
                source_volume_id: "vol-1".into(),
                creation_time: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5,
                }),
                ready_to_use: true,
                group_snapshot_id: String::new(),
            }),
        }],
        next_token: "next".into(),
    };
    assert_eq!(
        sanitize(&snapshots),
        concat!(
            r#"{"entries":[{"snapshot":{"size_bytes":10,"snapshot_id":"snap-1","#,
            r#""source_volume_id":"vol-1","creation_time":{"seconds":1700000000,"nanos":5},"#,
            r#""ready_to_use":true}}],"next_token":"next"}"#
        )
    );
}

#[test]
fn wrappers_print_their_bare_value() {
    assert_eq!(
        sanitize(&ProbeResponse { ready: Some(false) }),
        r#"{"ready":false}"#
    );
    assert_eq!(
        sanitize(&ProbeResponse { ready: Some(true) }),
        r#"{"ready":true}"#
    );
    assert_eq!(sanitize(&ProbeResponse { ready: None }), "{}");
    let capacity = GetCapacityResponse {
        available_capacity: 7,
        maximum_volume_size: Some(0),
        minimum_volume_size: Some(1),
    };
    assert_eq!(
        sanitize(&capacity),
        r#"{"available_capacity":7,"maximum_volume_size":0,"minimum_volume_size":1}"#
    );
}

#[test]
fn unknown_enum_numbers_print_as_numbers() {
    let capability = volume_capability::AccessMode { mode: 99 };
    assert_eq!(sanitize(&capability), r#"{"mode":99}"#);
}

#[test]
fn strings_are_escaped_into_valid_json() {
    let request = DeleteVolumeRequest {
        volume_id: "a\"b\\c\nd\u{1}é".into(),
        secrets: HashMap::new(),
    };
    let out = sanitize(&request);
    let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed["volume_id"], "a\"b\\c\nd\u{1}é");
}

#[test]
fn unknown_fields_are_never_printed() {
    let mut bytes = DeleteVolumeRequest {
        volume_id: "vol-1".into(),
        secrets: HashMap::new(),
    }
    .encode_to_vec();
    // Field 99, length-delimited: what a newer peer might send.
    bytes.extend_from_slice(b"\x9a\x06\x07leak-me");
    let out = sanitize_encoded(&DeleteVolumeRequest::full_name(), &bytes);
    assert_eq!(out, r#"{"volume_id":"vol-1"}"#);
}

#[derive(Clone, PartialEq, Message)]
struct NotInPool {
    #[prost(string, tag = "1")]
    secret: String,
}

impl Name for NotInPool {
    const NAME: &'static str = "NotInPool";
    const PACKAGE: &'static str = "elsewhere";
}

#[test]
fn unknown_types_and_garbage_are_unprintable() {
    let foreign = NotInPool {
        secret: "hunter2".into(),
    };
    assert_eq!(sanitize(&foreign), "<unprintable elsewhere.NotInPool>");
    assert_eq!(
        sanitize_encoded("csi.v1.CreateVolumeRequest", &[0xff, 0xff, 0xff]),
        "<unprintable csi.v1.CreateVolumeRequest>"
    );
}

/// Random bytes through every message type: each result is either valid
/// JSON or the unprintable marker, and nothing panics.
#[test]
fn arbitrary_bytes_never_panic() {
    let pool = csi_proto::descriptor_pool().unwrap();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut rendered = 0;
    for message in pool.all_messages() {
        let name = message.full_name();
        if name.starts_with("google.") {
            continue;
        }
        for _ in 0..64 {
            let len = (next() % 48) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let out = sanitize_encoded(name, &bytes);
            if out.starts_with('{') {
                serde_json::from_str::<serde_json::Value>(&out)
                    .unwrap_or_else(|err| panic!("{name}: invalid JSON {out}: {err}"));
                rendered += 1;
            } else {
                assert_eq!(out, format!("<unprintable {name}>"));
            }
        }
    }
    assert!(rendered > 0, "no random input decoded at all");
}

#[test]
fn display_wrapper_renders_lazily_the_same_text() {
    let request = DeleteVolumeRequest {
        volume_id: "vol-1".into(),
        secrets: map(&SECRETS),
    };
    assert_eq!(Sanitized(&request).to_string(), sanitize(&request));
}

#[test]
fn secret_fields_are_read_from_descriptors() {
    assert!(is_secret_field("csi.v1.CreateVolumeRequest", "secrets"));
    assert!(is_secret_field("csi.v1.NodeExpandVolumeRequest", "secrets"));
    assert!(is_secret_field("csi.v1.GetMetadataDeltaRequest", "secrets"));
    assert!(!is_secret_field("csi.v1.CreateVolumeRequest", "parameters"));
    assert!(!is_secret_field(
        "csi.v1.CreateVolumeRequest",
        "no_such_field"
    ));
    assert!(!is_secret_field("csi.v1.NoSuchMessage", "secrets"));
}

/// A proto that nests secret fields everywhere the CSI spec does not, to
/// prove redaction recurses through messages, lists, maps and oneofs.
const NESTED_PROTO: &str = r#"
syntax = "proto3";
package redact.test;
import "csi.proto";

message Inner {
  string token = 1 [(csi.v1.csi_secret) = true];
  string label = 2;
}

message Outer {
  Inner single = 1;
  repeated Inner many = 2;
  map<string, Inner> by_key = 3;
  oneof choice {
    Inner chosen = 4;
    string other = 5;
  }
  string password = 6 [(csi.v1.csi_secret) = true];
  repeated string flags = 7 [(csi.v1.csi_secret) = true];
}
"#;

#[test]
fn redaction_recurses_through_nested_repeated_map_and_oneof() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nested.proto"), NESTED_PROTO).unwrap();
    let csi_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let mut compiler = protox::Compiler::new([dir.path(), csi_dir.as_path()]).unwrap();
    compiler.open_file("nested.proto").unwrap();
    let pool = compiler.descriptor_pool();
    let outer_desc = pool.get_message_by_name("redact.test.Outer").unwrap();
    let inner_desc = pool.get_message_by_name("redact.test.Inner").unwrap();

    let inner = |token: &str, label: &str| {
        let mut message = DynamicMessage::new(inner_desc.clone());
        message.set_field_by_name("token", Value::String(token.into()));
        message.set_field_by_name("label", Value::String(label.into()));
        Value::Message(message)
    };
    let mut outer = DynamicMessage::new(outer_desc);
    outer.set_field_by_name("single", inner("hunter2-a", "a"));
    outer.set_field_by_name(
        "many",
        Value::List(vec![inner("hunter2-b", "b"), inner("", "c")]),
    );
    outer.set_field_by_name(
        "by_key",
        Value::Map(HashMap::from([(
            MapKey::String("k".into()),
            inner("hunter2-d", "d"),
        )])),
    );
    outer.set_field_by_name("chosen", inner("hunter2-e", ""));
    outer.set_field_by_name("password", Value::String("hunter2-f".into()));
    outer.set_field_by_name(
        "flags",
        Value::List(vec![Value::String("hunter2-g".into())]),
    );

    let redactor = Redactor::new(pool);
    assert!(redactor.is_secret_field("redact.test.Inner", "token"));
    assert!(!redactor.is_secret_field("redact.test.Inner", "label"));
    let out = redactor.sanitize_encoded("redact.test.Outer", &outer.encode_to_vec());
    assert!(!out.contains("hunter2"), "secret leaked: {out}");
    assert_eq!(
        out,
        concat!(
            r#"{"single":{"token":"***stripped***","label":"a"},"#,
            r#""many":[{"token":"***stripped***","label":"b"},{"label":"c"}],"#,
            r#""by_key":{"k":{"token":"***stripped***","label":"d"}},"#,
            r#""chosen":{"token":"***stripped***"},"#,
            r#""password":"***stripped***","flags":"***stripped***"}"#
        )
    );
}
