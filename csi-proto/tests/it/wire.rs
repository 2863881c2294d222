//! Wire format checks: exact bytes for known encodings of the CSI v1.12.0
//! and kubelet registration messages, and descriptor facts drivers rely on.

use csi_proto::pluginregistration::{PluginInfo, RegistrationStatus};
use csi_proto::prost::{Message, Name};
use csi_proto::v1::*;
use std::collections::{BTreeSet, HashMap};

fn encode<M: Message>(msg: &M) -> Vec<u8> {
    msg.encode_to_vec()
}

#[test]
fn probe_ready_is_a_bool_wrapper_in_field_1() {
    // Absent wrapper: nothing on the wire, meaning "ready".
    assert_eq!(encode(&ProbeResponse { ready: None }), b"");
    // Present wrapper holding false: field 1, length 0 (false is the
    // wrapper's default and is not written).
    assert_eq!(encode(&ProbeResponse { ready: Some(false) }), [0x0a, 0x00]);
    // true: field 1, length 2, inner field 1 varint 1.
    assert_eq!(
        encode(&ProbeResponse { ready: Some(true) }),
        [0x0a, 0x02, 0x08, 0x01]
    );
    assert_eq!(
        ProbeResponse::decode([0x0a, 0x00].as_slice())
            .unwrap()
            .ready,
        Some(false)
    );
}

#[test]
fn create_volume_request_field_numbers() {
    let name_only = CreateVolumeRequest {
        name: "pvc-1".into(),
        ..Default::default()
    };
    assert_eq!(encode(&name_only), b"\x0a\x05pvc-1");

    // secrets = 5: map entry with key (1) and value (2).
    let secrets_only = CreateVolumeRequest {
        secrets: HashMap::from([("k".into(), "v".into())]),
        ..Default::default()
    };
    assert_eq!(encode(&secrets_only), b"\x2a\x06\x0a\x01k\x12\x01v");

    // parameters = 4, mutable_parameters = 8.
    let parameters = CreateVolumeRequest {
        parameters: HashMap::from([("a".into(), "b".into())]),
        ..Default::default()
    };
    assert_eq!(encode(&parameters), b"\x22\x06\x0a\x01a\x12\x01b");
    let mutable = CreateVolumeRequest {
        mutable_parameters: HashMap::from([("a".into(), "b".into())]),
        ..Default::default()
    };
    assert_eq!(encode(&mutable), b"\x42\x06\x0a\x01a\x12\x01b");

    // capacity_range = 2 holding required_bytes = 1.
    let capacity = CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: 1,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    assert_eq!(encode(&capacity), [0x12, 0x02, 0x08, 0x01]);
}

#[test]
fn volume_capability_oneof_and_access_mode() {
    let mount = VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            },
        )),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter.into(),
        }),
    };
    assert_eq!(encode(&mount), b"\x12\x06\x0a\x04ext4\x1a\x02\x08\x01");

    let block = VolumeCapability {
        access_type: Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        )),
        access_mode: None,
    };
    assert_eq!(encode(&block), [0x0a, 0x00]);
}

#[test]
fn publish_and_node_messages() {
    let publish = ControllerPublishVolumeRequest {
        volume_id: "v".into(),
        node_id: "n".into(),
        readonly: true,
        ..Default::default()
    };
    assert_eq!(encode(&publish), b"\x0a\x01v\x12\x01n\x20\x01");

    let stage = NodeStageVolumeRequest {
        staging_target_path: "/s".into(),
        secrets: HashMap::from([("k".into(), "v".into())]),
        ..Default::default()
    };
    assert_eq!(encode(&stage), b"\x1a\x02/s\x2a\x06\x0a\x01k\x12\x01v");

    let node_publish = NodePublishVolumeRequest {
        target_path: "/t".into(),
        secrets: HashMap::from([("k".into(), "v".into())]),
        ..Default::default()
    };
    assert_eq!(
        encode(&node_publish),
        b"\x22\x02/t\x3a\x06\x0a\x01k\x12\x01v"
    );

    let info = NodeGetInfoResponse {
        node_id: "n1".into(),
        max_volumes_per_node: 3,
        accessible_topology: None,
    };
    assert_eq!(encode(&info), b"\x0a\x02n1\x10\x03");

    let capacity = GetCapacityResponse {
        available_capacity: 0,
        maximum_volume_size: Some(0),
        minimum_volume_size: None,
    };
    assert_eq!(encode(&capacity), [0x12, 0x00]);
}

#[test]
fn list_volumes_response_decodes_published_nodes() {
    // entries(1) { volume(1) { volume_id(2) "v" } status(2) {
    // published_node_ids(1) "n" } } next_token(2) "t"
    let bytes = b"\x0a\x0a\x0a\x03\x12\x01v\x12\x03\x0a\x01n\x12\x01t";
    let decoded = ListVolumesResponse::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.next_token, "t");
    let entry = &decoded.entries[0];
    assert_eq!(entry.volume.as_ref().unwrap().volume_id, "v");
    assert_eq!(entry.status.as_ref().unwrap().published_node_ids, ["n"]);
    assert_eq!(encode(&decoded), bytes);
}

#[test]
fn registration_messages() {
    let info = PluginInfo {
        r#type: "CSIPlugin".into(),
        name: "d".into(),
        endpoint: "/e".into(),
        supported_versions: vec!["1.0.0".into()],
    };
    assert_eq!(
        encode(&info),
        b"\x0a\x09CSIPlugin\x12\x01d\x1a\x02/e\x22\x051.0.0"
    );
    let status = RegistrationStatus {
        plugin_registered: true,
        error: "x".into(),
    };
    assert_eq!(encode(&status), b"\x08\x01\x12\x01x");
    assert_eq!(PluginInfo::full_name(), "pluginregistration.PluginInfo");
}

#[test]
fn capability_enum_numbers() {
    use controller_service_capability::rpc::Type as Ctrl;
    use node_service_capability::rpc::Type as NodeCap;
    use plugin_capability::service::Type as Plugin;
    use volume_capability::access_mode::Mode;

    assert_eq!(Plugin::ControllerService as i32, 1);
    assert_eq!(Plugin::VolumeAccessibilityConstraints as i32, 2);
    assert_eq!(Plugin::GroupControllerService as i32, 3);
    assert_eq!(Plugin::SnapshotMetadataService as i32, 4);
    assert_eq!(Ctrl::PublishUnpublishVolume as i32, 2);
    assert_eq!(Ctrl::ListVolumesPublishedNodes as i32, 10);
    assert_eq!(Ctrl::VolumeCondition as i32, 11);
    assert_eq!(Ctrl::SingleNodeMultiWriter as i32, 13);
    assert_eq!(Ctrl::ModifyVolume as i32, 14);
    assert_eq!(Ctrl::GetSnapshot as i32, 15);
    assert_eq!(NodeCap::VolumeMountGroup as i32, 6);
    assert_eq!(Mode::SingleNodeSingleWriter as i32, 6);
    assert_eq!(Mode::SingleNodeMultiWriter as i32, 7);
}

#[test]
fn secret_option_sits_on_exactly_the_spec_fields() {
    let pool = csi_proto::descriptor_pool().unwrap();
    let marked: BTreeSet<String> = pool
        .all_messages()
        .flat_map(|message| message.fields().collect::<Vec<_>>())
        .filter(|field| {
            field
                .options()
                .extensions()
                .any(|(ext, value)| ext.number() == 1059 && value.as_bool() == Some(true))
        })
        .map(|field| field.full_name().to_owned())
        .collect();
    let expected: BTreeSet<String> = [
        "CreateVolumeRequest",
        "DeleteVolumeRequest",
        "ControllerPublishVolumeRequest",
        "ControllerUnpublishVolumeRequest",
        "ValidateVolumeCapabilitiesRequest",
        "ControllerModifyVolumeRequest",
        "CreateSnapshotRequest",
        "DeleteSnapshotRequest",
        "ListSnapshotsRequest",
        "GetSnapshotRequest",
        "ControllerExpandVolumeRequest",
        "NodeStageVolumeRequest",
        "NodePublishVolumeRequest",
        "NodeExpandVolumeRequest",
        "CreateVolumeGroupSnapshotRequest",
        "DeleteVolumeGroupSnapshotRequest",
        "GetVolumeGroupSnapshotRequest",
        "GetMetadataAllocatedRequest",
        "GetMetadataDeltaRequest",
    ]
    .iter()
    .map(|message| format!("csi.v1.{message}.secrets"))
    .collect();
    assert_eq!(marked, expected);
}

#[test]
fn spec_v1_12_additions_are_present() {
    let pool = csi_proto::descriptor_pool().unwrap();
    let controller = pool.get_service_by_name("csi.v1.Controller").unwrap();
    let get_snapshot = controller
        .methods()
        .find(|m| m.name() == "GetSnapshot")
        .unwrap();
    assert!(has_option(&get_snapshot.options(), 1060));
    let modify = controller
        .methods()
        .find(|m| m.name() == "ControllerModifyVolume")
        .unwrap();
    // GA since v1.12: no longer marked alpha.
    assert!(!has_option(&modify.options(), 1060));
    let request = pool
        .get_message_by_name("csi.v1.ControllerModifyVolumeRequest")
        .unwrap();
    assert!(!has_option(&request.options(), 1060));
}

fn has_option(options: &csi_proto::prost_reflect::DynamicMessage, number: u32) -> bool {
    options
        .extensions()
        .any(|(ext, value)| ext.number() == number && value.as_bool() == Some(true))
}

#[test]
fn every_generated_message_is_in_the_descriptor_pool() {
    fn check<M: Name>() {
        let pool = csi_proto::descriptor_pool().unwrap();
        assert!(
            pool.get_message_by_name(&M::full_name()).is_some(),
            "{} missing",
            M::full_name()
        );
    }
    check::<CreateVolumeRequest>();
    check::<volume_capability::MountVolume>();
    check::<list_volumes_response::VolumeStatus>();
    check::<GetSnapshotResponse>();
    check::<GetMetadataDeltaResponse>();
    check::<PluginInfo>();
    assert_eq!(
        volume_capability::access_mode::Mode::SingleNodeWriter.as_str_name(),
        "SINGLE_NODE_WRITER"
    );
}
