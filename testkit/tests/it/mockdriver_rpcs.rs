//! Every RPC of the mock over a real unix socket: a full lifecycle, the
//! spec's idempotency rules and error codes, and capability switches.

// Unix sockets and signals; Windows serves named pipes instead.
#![cfg(unix)]

use std::collections::HashMap;

use crate::mockdriver_common::*;
use csi_proto::methods::{controller as cm, identity as im, node as nm};
use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1::plugin_capability::service::Type as PluginService;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use testkit::mockdriver::{Capabilities, MockDriver};
use tonic::Code;

const GI: i64 = 1 << 30;

fn zone(z: &str) -> v1::Topology {
    v1::Topology {
        segments: HashMap::from([("topology.example.com/zone".into(), z.into())]),
    }
}

fn controller_caps(resp: &v1::ControllerGetCapabilitiesResponse) -> Vec<Rpc> {
    resp.capabilities
        .iter()
        .filter_map(|c| match c.r#type {
            Some(v1::controller_service_capability::Type::Rpc(rpc)) => rpc.r#type.try_into().ok(),
            None => None,
        })
        .collect()
}

#[tokio::test]
async fn scripted_lifecycle_of_every_rpc() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(
        MockDriver::builder()
            .driver_name("lifecycle.csi.example.com")
            .vendor_version("9.9.9")
            .node_id("node-a")
            .max_volumes_per_node(7)
            .topology_segment([("topology.example.com/zone", "z1")])
            .topology_segment([("topology.example.com/zone", "z2")])
            .total_capacity(100 * GI)
            .max_volume_size(50 * GI),
    )
    .await;
    let c = &mut clients.controller;
    let n = &mut clients.node;
    let id = &mut clients.identity;

    // Identity.
    let info = id
        .get_plugin_info(v1::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (info.name.as_str(), info.vendor_version.as_str()),
        ("lifecycle.csi.example.com", "9.9.9")
    );
    let plugin_caps = id
        .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<_> = plugin_caps
        .capabilities
        .iter()
        .filter_map(|c| match c.r#type {
            Some(v1::plugin_capability::Type::Service(s)) => PluginService::try_from(s.r#type).ok(),
            _ => None,
        })
        .collect();
    assert_eq!(
        services,
        [
            PluginService::ControllerService,
            PluginService::VolumeAccessibilityConstraints,
            PluginService::GroupControllerService
        ]
    );
    let probe = id.probe(v1::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));

    // Controller capabilities: the default switches.
    let caps = c
        .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let caps = controller_caps(&caps);
    for expected in [
        Rpc::CreateDeleteVolume,
        Rpc::PublishUnpublishVolume,
        Rpc::ListVolumes,
        Rpc::ListVolumesPublishedNodes,
        Rpc::GetCapacity,
        Rpc::CreateDeleteSnapshot,
        Rpc::ListSnapshots,
        Rpc::CloneVolume,
        Rpc::PublishReadonly,
        Rpc::ExpandVolume,
        Rpc::GetVolume,
        Rpc::ModifyVolume,
    ] {
        assert!(
            caps.contains(&expected),
            "{expected:?} missing from {caps:?}"
        );
    }
    assert!(!caps.contains(&Rpc::SingleNodeMultiWriter));

    // Capacity before anything exists.
    let capacity = c
        .get_capacity(v1::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capacity.available_capacity, 100 * GI);
    assert_eq!(capacity.maximum_volume_size, Some(50 * GI));

    // CreateVolume in a preferred zone.
    let mut create = create_request("pvc-1", 10 * GI);
    create.parameters.insert("type".into(), "fast".into());
    create.accessibility_requirements = Some(v1::TopologyRequirement {
        requisite: vec![zone("z1"), zone("z2")],
        preferred: vec![zone("z2")],
    });
    let volume = c
        .create_volume(create.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(volume.capacity_bytes, 10 * GI);
    assert_eq!(volume.accessible_topology, [zone("z2")]);
    let vol = volume.volume_id.clone();

    let capacity = c
        .get_capacity(v1::GetCapacityRequest {
            accessible_topology: Some(zone("z1")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capacity.available_capacity, 90 * GI);
    let foreign = c
        .get_capacity(v1::GetCapacityRequest {
            accessible_topology: Some(zone("z9")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(foreign.available_capacity, 0);

    // ValidateVolumeCapabilities.
    let validated = c
        .validate_volume_capabilities(v1::ValidateVolumeCapabilitiesRequest {
            volume_id: vol.clone(),
            volume_capabilities: vec![rwo()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(validated.confirmed.unwrap().volume_capabilities, [rwo()]);
    let refused = c
        .validate_volume_capabilities(v1::ValidateVolumeCapabilitiesRequest {
            volume_id: vol.clone(),
            volume_capabilities: vec![mount(Mode::SingleNodeMultiWriter)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(refused.confirmed.is_none());
    assert!(!refused.message.is_empty());

    // Publish to a node.
    let published = c
        .controller_publish_volume(publish_request(&vol, "node-a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        published.publish_context["devicePath"],
        format!("/dev/mock/{vol}")
    );

    // ListVolumes and ControllerGetVolume report the publication.
    let listed = c
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(
        listed.entries[0]
            .status
            .as_ref()
            .unwrap()
            .published_node_ids,
        ["node-a"]
    );
    let got = c
        .controller_get_volume(v1::ControllerGetVolumeRequest {
            volume_id: vol.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().volume_id, vol);
    assert_eq!(got.status.unwrap().published_node_ids, ["node-a"]);

    // Node side.
    let node_info = n
        .node_get_info(v1::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_info.node_id, "node-a");
    assert_eq!(node_info.max_volumes_per_node, 7);
    assert_eq!(node_info.accessible_topology, Some(zone("z1")));
    let node_caps = n
        .node_get_capabilities(v1::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_caps.capabilities.len(), 3, "{node_caps:?}");
    n.node_stage_volume(v1::NodeStageVolumeRequest {
        volume_id: vol.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: "/staging".into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    })
    .await
    .unwrap();
    n.node_publish_volume(v1::NodePublishVolumeRequest {
        volume_id: vol.clone(),
        staging_target_path: "/staging".into(),
        target_path: "/pods/1/mount".into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    })
    .await
    .unwrap();
    let stats = n
        .node_get_volume_stats(v1::NodeGetVolumeStatsRequest {
            volume_id: vol.clone(),
            volume_path: "/pods/1/mount".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage[0].total, 10 * GI);

    // Expansion: controller then node.
    let expanded = c
        .controller_expand_volume(v1::ControllerExpandVolumeRequest {
            volume_id: vol.clone(),
            capacity_range: Some(v1::CapacityRange {
                required_bytes: 20 * GI,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(expanded.capacity_bytes, 20 * GI);
    assert!(expanded.node_expansion_required);
    let node_expanded = n
        .node_expand_volume(v1::NodeExpandVolumeRequest {
            volume_id: vol.clone(),
            volume_path: "/pods/1/mount".into(),
            capacity_range: Some(v1::CapacityRange {
                required_bytes: 20 * GI,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_expanded.capacity_bytes, 20 * GI);

    // Modify.
    c.controller_modify_volume(v1::ControllerModifyVolumeRequest {
        volume_id: vol.clone(),
        mutable_parameters: HashMap::from([("iops".into(), "3000".into())]),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        mock.state().volumes[&vol].mutable_parameters["iops"],
        "3000"
    );

    // Snapshots, and a volume restored from one, and a clone.
    let snapshot = c
        .create_snapshot(v1::CreateSnapshotRequest {
            source_volume_id: vol.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snapshot.ready_to_use);
    assert_eq!(snapshot.size_bytes, 20 * GI);
    assert!(snapshot.creation_time.is_some());
    let listed = c
        .list_snapshots(v1::ListSnapshotsRequest {
            source_volume_id: vol.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    let got = c
        .get_snapshot(v1::GetSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.snapshot.unwrap(), snapshot);
    let mut restore = create_request("pvc-restored", GI);
    restore.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: snapshot.snapshot_id.clone(),
        })),
    });
    let restored = c
        .create_volume(restore)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        restored.capacity_bytes,
        20 * GI,
        "at least the snapshot's size"
    );
    assert!(restored.content_source.is_some());
    let mut clone = create_request("pvc-clone", 20 * GI);
    clone.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Volume(VolumeSource {
            volume_id: vol.clone(),
        })),
    });
    c.create_volume(clone).await.unwrap();

    // Tear down in order.
    n.node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
        volume_id: vol.clone(),
        target_path: "/pods/1/mount".into(),
    })
    .await
    .unwrap();
    n.node_unstage_volume(v1::NodeUnstageVolumeRequest {
        volume_id: vol.clone(),
        staging_target_path: "/staging".into(),
    })
    .await
    .unwrap();
    c.controller_unpublish_volume(v1::ControllerUnpublishVolumeRequest {
        volume_id: vol.clone(),
        node_id: "node-a".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_snapshot(v1::DeleteSnapshotRequest {
        snapshot_id: snapshot.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    for volume_id in mock.state().volumes.keys() {
        c.delete_volume(v1::DeleteVolumeRequest {
            volume_id: volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let state = mock.state();
    assert!(state.volumes.is_empty() && state.snapshots.is_empty());

    // Every RPC was counted once or more.
    for method in im::ALL.iter().chain(cm::ALL).chain(nm::ALL) {
        assert!(mock.calls().count(method) > 0, "{method} was not recorded");
    }
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn create_and_delete_are_idempotent() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let c = &mut clients.controller;
    let first = c
        .create_volume(create_request("pvc", GI))
        .await
        .unwrap()
        .into_inner();
    let again = c
        .create_volume(create_request("pvc", GI))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first, again);
    assert_eq!(mock.state().volumes.len(), 1);

    let volume_id = first.volume.unwrap().volume_id;
    for _ in 0..2 {
        c.delete_volume(v1::DeleteVolumeRequest {
            volume_id: volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(mock.state().volumes.is_empty());
}

#[tokio::test]
async fn create_volume_error_codes() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(
        MockDriver::builder()
            .topology_segment([("topology.example.com/zone", "z1")])
            .total_capacity(10 * GI)
            .max_volume_size(8 * GI),
    )
    .await;
    let c = &mut clients.controller;
    c.create_volume(create_request("pvc", GI)).await.unwrap();

    assert_eq!(
        code(c.create_volume(create_request("pvc", 2 * GI)).await),
        Code::AlreadyExists
    );
    let mut other_params = create_request("pvc", GI);
    other_params.parameters.insert("k".into(), "v".into());
    assert_eq!(
        code(c.create_volume(other_params).await),
        Code::AlreadyExists
    );

    assert_eq!(
        code(c.create_volume(create_request("", GI)).await),
        Code::InvalidArgument
    );
    let mut no_caps = create_request("no-caps", GI);
    no_caps.volume_capabilities.clear();
    assert_eq!(code(c.create_volume(no_caps).await), Code::InvalidArgument);

    let mut inverted = create_request("inverted", 2 * GI);
    inverted.capacity_range.as_mut().unwrap().limit_bytes = GI;
    assert_eq!(code(c.create_volume(inverted).await), Code::OutOfRange);
    assert_eq!(
        code(c.create_volume(create_request("huge", 9 * GI)).await),
        Code::OutOfRange
    );

    let mut missing_snapshot = create_request("from-snap", GI);
    missing_snapshot.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: "snap-x".into(),
        })),
    });
    assert_eq!(
        code(c.create_volume(missing_snapshot).await),
        Code::NotFound
    );

    let mut elsewhere = create_request("elsewhere", GI);
    elsewhere.accessibility_requirements = Some(v1::TopologyRequirement {
        requisite: vec![zone("z9")],
        preferred: vec![],
    });
    assert_eq!(
        code(c.create_volume(elsewhere).await),
        Code::ResourceExhausted
    );

    c.create_volume(create_request("big", 8 * GI))
        .await
        .unwrap();
    assert_eq!(
        code(c.create_volume(create_request("full", 2 * GI)).await),
        Code::ResourceExhausted
    );
}

#[tokio::test]
async fn sources_are_invalid_when_switched_off() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder().snapshots(false).clone_volume(false)).await;
    let c = &mut clients.controller;
    let source = c
        .create_volume(create_request("src", GI))
        .await
        .unwrap()
        .into_inner();
    let mut clone = create_request("clone", GI);
    clone.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Volume(VolumeSource {
            volume_id: source.volume.unwrap().volume_id,
        })),
    });
    assert_eq!(code(c.create_volume(clone).await), Code::InvalidArgument);
    let mut restore = create_request("restore", GI);
    restore.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: "snap-1".into(),
        })),
    });
    assert_eq!(code(c.create_volume(restore).await), Code::InvalidArgument);
    assert_eq!(
        code(
            c.create_snapshot(v1::CreateSnapshotRequest::default())
                .await
        ),
        Code::Unimplemented
    );
}

#[tokio::test]
async fn publish_error_codes() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(
        MockDriver::builder()
            .known_nodes(["n1", "n2"])
            .max_volumes_per_node(1)
            .publish_readonly(false),
    )
    .await;
    let c = &mut clients.controller;
    let a = c
        .create_volume(create_request("a", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let b = c
        .create_volume(create_request("b", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;

    let context = c
        .controller_publish_volume(publish_request(&a, "n1"))
        .await
        .unwrap()
        .into_inner();
    let again = c
        .controller_publish_volume(publish_request(&a, "n1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(context, again, "idempotent");

    let mut other_cap = publish_request(&a, "n1");
    other_cap.volume_capability = Some(mount(Mode::MultiNodeMultiWriter));
    assert_eq!(
        code(c.controller_publish_volume(other_cap).await),
        Code::AlreadyExists
    );

    let elsewhere = c
        .controller_publish_volume(publish_request(&a, "n2"))
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code(), Code::FailedPrecondition);
    assert!(
        elsewhere.message().contains("n1"),
        "{}",
        elsewhere.message()
    );

    assert_eq!(
        code(
            c.controller_publish_volume(publish_request("vol-x", "n1"))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_publish_volume(publish_request(&a, "n3")).await),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_publish_volume(publish_request(&b, "n1")).await),
        Code::ResourceExhausted
    );
    let mut readonly = publish_request(&b, "n2");
    readonly.readonly = true;
    assert_eq!(
        code(c.controller_publish_volume(readonly).await),
        Code::InvalidArgument
    );
    let mut no_cap = publish_request(&b, "n2");
    no_cap.volume_capability = None;
    assert_eq!(
        code(c.controller_publish_volume(no_cap).await),
        Code::InvalidArgument
    );

    // Deleting a published volume is refused until it is unpublished.
    let delete = v1::DeleteVolumeRequest {
        volume_id: a.clone(),
        ..Default::default()
    };
    assert_eq!(
        code(c.delete_volume(delete.clone()).await),
        Code::FailedPrecondition
    );

    // Unpublish is idempotent, also for unknown volumes and nodes.
    for (volume_id, node_id) in [
        (&a, "n1"),
        (&a, "n1"),
        (&"vol-x".to_owned(), "n1"),
        (&a, "n9"),
    ] {
        c.controller_unpublish_volume(v1::ControllerUnpublishVolumeRequest {
            volume_id: volume_id.clone(),
            node_id: node_id.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(mock.state().volumes[&a].published.is_empty());
    c.delete_volume(delete).await.unwrap();
}

#[tokio::test]
async fn list_volumes_pages_and_rejects_bad_tokens() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let c = &mut clients.controller;
    for i in 0..5 {
        c.create_volume(create_request(&format!("pvc-{i}"), GI))
            .await
            .unwrap();
    }
    let mut token = String::new();
    let mut seen = Vec::new();
    loop {
        let page = c
            .list_volumes(v1::ListVolumesRequest {
                max_entries: 2,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen.len(), 5);
    seen.dedup();
    assert_eq!(seen.len(), 5);

    let bad = v1::ListVolumesRequest {
        max_entries: 2,
        starting_token: "bogus".into(),
    };
    assert_eq!(code(c.list_volumes(bad).await), Code::Aborted);
}

#[tokio::test]
async fn published_nodes_only_with_the_capability() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder().list_volumes_published_nodes(false)).await;
    let c = &mut clients.controller;
    c.create_volume(create_request("pvc", GI)).await.unwrap();
    let page = c
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(page.entries[0].status.is_none());
    let caps = c
        .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!controller_caps(&caps).contains(&Rpc::ListVolumesPublishedNodes));
}

#[tokio::test]
async fn switched_off_rpcs_are_unimplemented() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder().capabilities(Capabilities::none())).await;
    let c = &mut clients.controller;
    let n = &mut clients.node;

    let plugin = clients
        .identity
        .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(plugin.capabilities.is_empty());
    assert_eq!(
        code(
            c.controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(c.create_volume(create_request("pvc", GI)).await),
        Code::Unimplemented
    );
    assert_eq!(
        code(c.list_volumes(v1::ListVolumesRequest::default()).await),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            n.node_stage_volume(v1::NodeStageVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            n.node_expand_volume(v1::NodeExpandVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    let node_caps = n
        .node_get_capabilities(v1::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        node_caps.capabilities.len(),
        1,
        "only GET_VOLUME_STATS: {node_caps:?}"
    );
}

#[tokio::test]
async fn controller_only_switches() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(
        MockDriver::builder()
            .publish_unpublish(false)
            .get_capacity(false)
            .expand(false)
            .modify(false)
            .get_volume(false),
    )
    .await;
    let c = &mut clients.controller;
    let caps = c
        .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let caps = controller_caps(&caps);
    for absent in [
        Rpc::PublishUnpublishVolume,
        Rpc::GetCapacity,
        Rpc::ExpandVolume,
        Rpc::ModifyVolume,
        Rpc::GetVolume,
    ] {
        assert!(!caps.contains(&absent), "{absent:?} advertised");
    }
    assert_eq!(
        code(c.controller_publish_volume(publish_request("v", "n")).await),
        Code::Unimplemented
    );
    assert_eq!(
        code(c.get_capacity(v1::GetCapacityRequest::default()).await),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            c.controller_expand_volume(v1::ControllerExpandVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            c.controller_modify_volume(v1::ControllerModifyVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            c.controller_get_volume(v1::ControllerGetVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    let mut with_mutable = create_request("pvc", GI);
    with_mutable
        .mutable_parameters
        .insert("iops".into(), "1".into());
    assert_eq!(
        code(c.create_volume(with_mutable).await),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn single_node_multi_writer_switch() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder().single_node_multi_writer(true)).await;
    let mut request = create_request("pvc", GI);
    request.volume_capabilities = vec![mount(Mode::SingleNodeMultiWriter)];
    clients.controller.create_volume(request).await.unwrap();
    let caps = clients
        .controller
        .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(controller_caps(&caps).contains(&Rpc::SingleNodeMultiWriter));
}

#[tokio::test]
async fn node_error_codes() {
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let vol = clients
        .controller
        .create_volume(create_request("pvc", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let n = &mut clients.node;
    let stage = |volume_id: &str, path: &str| v1::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: path.into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    };
    assert_eq!(
        code(n.node_stage_volume(stage("vol-x", "/s")).await),
        Code::NotFound
    );
    assert_eq!(
        code(n.node_stage_volume(stage(&vol, "")).await),
        Code::InvalidArgument
    );
    n.node_stage_volume(stage(&vol, "/s")).await.unwrap();
    n.node_stage_volume(stage(&vol, "/s")).await.unwrap();
    assert_eq!(
        code(n.node_stage_volume(stage(&vol, "/elsewhere")).await),
        Code::AlreadyExists
    );

    // A made-up path: its parent does not exist, so nothing is created.
    let target = _dir.path().join("absent").join("t");
    let target = target.to_str().unwrap();
    let publish = |staging: &str| v1::NodePublishVolumeRequest {
        volume_id: vol.clone(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    };
    assert_eq!(
        code(n.node_publish_volume(publish("")).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(n.node_publish_volume(publish("/other")).await),
        Code::FailedPrecondition
    );
    n.node_publish_volume(publish("/s")).await.unwrap();
    let stats = |path: &str| v1::NodeGetVolumeStatsRequest {
        volume_id: vol.clone(),
        volume_path: path.into(),
        ..Default::default()
    };
    assert_eq!(
        code(n.node_get_volume_stats(stats("/nowhere")).await),
        Code::NotFound
    );
    n.node_get_volume_stats(stats(target)).await.unwrap();
    assert_eq!(
        code(
            n.node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
                volume_id: "vol-x".into(),
                target_path: target.into(),
            })
            .await
        ),
        Code::NotFound
    );
}

fn block(mode: Mode) -> v1::VolumeCapability {
    v1::VolumeCapability {
        access_mode: Some(v1::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(v1::volume_capability::AccessType::Block(
            v1::volume_capability::BlockVolume {},
        )),
    }
}

fn path_str(path: &std::path::Path) -> String {
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn node_publish_creates_and_unpublish_removes_the_target_path() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    // What the CO creates: the staging directories and the targets' parent.
    let pods = tempfile::tempdir().unwrap();
    let parent = pods.path().join("mount");
    let staging = pods.path().join("staging");
    let staging_raw = pods.path().join("staging-raw");
    for dir in [&parent, &staging, &staging_raw] {
        std::fs::create_dir(dir).unwrap();
    }
    let c = &mut clients.controller;
    let vol = c
        .create_volume(create_request("fs", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let mut raw_request = create_request("raw", GI);
    raw_request.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let raw = c
        .create_volume(raw_request)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let n = &mut clients.node;
    for (volume_id, path, capability) in [
        (&vol, &staging, rwo()),
        (&raw, &staging_raw, block(Mode::SingleNodeWriter)),
    ] {
        n.node_stage_volume(v1::NodeStageVolumeRequest {
            volume_id: volume_id.clone(),
            staging_target_path: path_str(path),
            volume_capability: Some(capability),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let publish = |volume_id: &str, staging: &std::path::Path, target: &std::path::Path| {
        v1::NodePublishVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: path_str(staging),
            target_path: path_str(target),
            volume_capability: Some(rwo()),
            ..Default::default()
        }
    };
    let unpublish = |volume_id: &str, target: &std::path::Path| v1::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: path_str(target),
    };

    // A mounted volume: a directory, created once, removed on unpublish.
    let target = parent.join("target");
    n.node_publish_volume(publish(&vol, &staging, &target))
        .await
        .unwrap();
    assert!(target.is_dir());
    n.node_publish_volume(publish(&vol, &staging, &target))
        .await
        .unwrap();
    n.node_unpublish_volume(unpublish(&vol, &target))
        .await
        .unwrap();
    assert!(
        !target.exists(),
        "NodeUnpublishVolume removes the target path"
    );
    n.node_unpublish_volume(unpublish(&vol, &target))
        .await
        .unwrap();

    // A block volume: a file.
    let raw_target = parent.join("raw");
    let mut publish_raw = publish(&raw, &staging_raw, &raw_target);
    publish_raw.volume_capability = Some(block(Mode::SingleNodeWriter));
    n.node_publish_volume(publish_raw).await.unwrap();
    assert!(raw_target.is_file());
    n.node_unpublish_volume(unpublish(&raw, &raw_target))
        .await
        .unwrap();
    assert!(!raw_target.exists());

    // Without the parent the CO should have made, nothing is created.
    let nowhere = pods.path().join("absent").join("target");
    n.node_publish_volume(publish(&vol, &staging, &nowhere))
        .await
        .unwrap();
    assert!(!nowhere.parent().unwrap().exists());
    n.node_unpublish_volume(unpublish(&vol, &nowhere))
        .await
        .unwrap();

    // Content the mock did not write is never deleted.
    n.node_publish_volume(publish(&vol, &staging, &target))
        .await
        .unwrap();
    std::fs::write(target.join("data"), b"kept").unwrap();
    n.node_unpublish_volume(unpublish(&vol, &target))
        .await
        .unwrap();
    assert!(target.join("data").is_file());
    assert!(mock.state().volumes[&vol].node_published.is_empty());

    // A path that cannot be a directory fails the call and publishes nothing.
    let occupied = parent.join("occupied");
    std::fs::write(&occupied, b"a file").unwrap();
    assert_eq!(
        code(
            n.node_publish_volume(publish(&vol, &staging, &occupied))
                .await
        ),
        Code::Internal
    );
    assert!(mock.state().volumes[&vol].node_published.is_empty());
}

#[tokio::test]
async fn mutable_parameters_on_create_and_modify() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let c = &mut clients.controller;
    let params = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let fake = params(&[("XXX_FakeKey", "XXX_FakeValue")]);

    // CreateVolume: the supported keys, and nothing else.
    let mut with_class = create_request("with-class", GI);
    with_class.mutable_parameters = params(&[("iops", "3000"), ("throughput", "125")]);
    let with_class = c
        .create_volume(with_class)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let mut invalid_class = create_request("invalid-class", GI);
    invalid_class.mutable_parameters = fake.clone();
    assert_eq!(
        code(c.create_volume(invalid_class).await),
        Code::InvalidArgument
    );
    assert_eq!(mock.state().volumes.len(), 1);
    let plain = c
        .create_volume(create_request("plain", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;

    let modify = |volume_id: &str, mutable_parameters: HashMap<String, String>| {
        v1::ControllerModifyVolumeRequest {
            volume_id: volume_id.into(),
            mutable_parameters,
            ..Default::default()
        }
    };
    assert_eq!(
        code(
            c.controller_modify_volume(modify("non-existing-volume-id", params(&[("iops", "1")])))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_modify_volume(modify("", params(&[("iops", "1")])))
                .await
        ),
        Code::InvalidArgument
    );
    for volume_id in [&plain, &with_class] {
        assert_eq!(
            code(
                c.controller_modify_volume(modify(volume_id, fake.clone()))
                    .await
            ),
            Code::InvalidArgument
        );
        assert_eq!(
            code(
                c.controller_modify_volume(modify(volume_id, HashMap::new()))
                    .await
            ),
            Code::InvalidArgument
        );
        c.controller_modify_volume(modify(volume_id, params(&[("iops", "5000")])))
            .await
            .unwrap();
    }
    let state = mock.state();
    assert_eq!(
        state.volumes[&plain].mutable_parameters,
        [("iops".to_owned(), "5000".to_owned())].into()
    );
    // Keys the request leaves out keep their values.
    assert_eq!(
        state.volumes[&with_class].mutable_parameters,
        [
            ("iops".to_owned(), "5000".to_owned()),
            ("throughput".to_owned(), "125".to_owned())
        ]
        .into()
    );
}

#[tokio::test]
async fn call_log_records_sanitized_requests() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let mut request = create_request("pvc-secret", GI);
    request.secrets.insert("password".into(), "hunter2".into());
    clients.controller.create_volume(request).await.unwrap();

    let calls = mock.calls().of(cm::CREATE_VOLUME);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].seq, 1);
    assert!(
        calls[0].request.contains("pvc-secret"),
        "{}",
        calls[0].request
    );
    assert!(
        !calls[0].request.contains("hunter2"),
        "{}",
        calls[0].request
    );
    assert_eq!(mock.calls().count(cm::CREATE_VOLUME), 1);
    assert_eq!(mock.calls().count(cm::DELETE_VOLUME), 0);
}
