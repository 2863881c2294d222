use super::*;

fn listing(ranges: Vec<std::ops::Range<u64>>, max_results: usize) -> BlockListing {
    BlockListing {
        volume_capacity_bytes: 1 << 20,
        ranges,
        max_results,
        starting_offset: 0,
    }
}

fn offsets(messages: &[Message]) -> Vec<Vec<i64>> {
    messages
        .iter()
        .map(|m| {
            m.tuples
                .iter()
                .map(|t| t.byte_offset / BLOCK_SIZE)
                .collect()
        })
        .collect()
}

fn run(listing: &BlockListing, fault: Option<StreamFault>) -> (Vec<Message>, Ending) {
    let (messages, ending) = shape(listing, fault);
    (messages.collect(), ending)
}

#[test]
fn well_behaved_streams_batch_ascending_fixed_tuples() {
    let (messages, ending) = run(&listing(vec![1..2, 3..5], 2), None);
    assert_eq!(offsets(&messages), [vec![1, 3], vec![4]]);
    assert_eq!(ending, Ending::Done);
    assert!(messages.iter().all(|m| {
        m.block_type == v1::BlockMetadataType::FixedLength
            && m.capacity == 1 << 20
            && m.tuples.iter().all(|t| t.size_bytes == BLOCK_SIZE)
    }));
    let (messages, _) = run(&listing(vec![], 2), None);
    assert!(messages.is_empty(), "empty messages are never sent");
}

#[test]
fn order_faults() {
    let l = listing(vec![1..2, 3..5], 2);
    let (messages, _) = run(&l, Some(StreamFault::Descending));
    assert_eq!(offsets(&messages), [vec![4, 3], vec![1]]);
    let (messages, _) = run(&l, Some(StreamFault::Overlapping));
    assert_eq!(offsets(&messages), [vec![1, 1], vec![3, 3], vec![4, 4]]);
    let (messages, _) = run(&l, Some(StreamFault::ExceedMaxResults));
    assert_eq!(offsets(&messages), [vec![1, 3, 4]]);
}

#[test]
fn faults_from_the_second_message() {
    let l = listing(vec![0..3], 1);
    let (messages, _) = run(&l, Some(StreamFault::ChangeBlockType));
    let types: Vec<_> = messages.iter().map(|m| m.block_type).collect();
    assert_eq!(
        types,
        [
            v1::BlockMetadataType::FixedLength,
            v1::BlockMetadataType::VariableLength,
            v1::BlockMetadataType::VariableLength
        ]
    );
    let (messages, _) = run(&l, Some(StreamFault::ChangeCapacity));
    let capacities: Vec<_> = messages.iter().map(|m| m.capacity).collect();
    assert_eq!(capacities, [1 << 20, (1 << 20) + 4096, (1 << 20) + 4096]);
}

#[test]
fn a_range_before_the_starting_offset() {
    let mut l = listing(vec![5..7], 4);
    l.starting_offset = 5 * BLOCK_SIZE + 100;
    let (messages, _) = run(&l, Some(StreamFault::BeforeStartingOffset));
    assert_eq!(offsets(&messages), [vec![4, 6]]);
    assert!(messages[0].tuples[0].end() <= l.starting_offset);
    // Nothing to list: the bad tuple goes alone.
    let (messages, _) = run(&listing(vec![], 4), Some(StreamFault::BeforeStartingOffset));
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].tuples[0].byte_offset, -BLOCK_SIZE);
}

#[test]
fn stalls_and_aborts_after_the_first_message() {
    let l = listing(vec![0..10], 2);
    let (messages, ending) = run(&l, Some(StreamFault::Stall));
    assert_eq!((messages.len(), ending), (1, Ending::Stall));
    let (messages, ending) = run(&l, Some(StreamFault::Abort(Code::Internal)));
    assert_eq!((messages.len(), ending), (1, Ending::Fail(Code::Internal)));
}

/// Over a real unix socket, as a sidecar talks to the mock.
#[cfg(unix)]
mod served {
    use std::collections::HashMap;
    use std::path::Path;
    use std::time::Duration;

    use csi_proto::methods::snapshot_metadata::{GET_METADATA_ALLOCATED, GET_METADATA_DELTA};
    use csi_proto::v1::controller_client::ControllerClient;
    use csi_proto::v1::identity_client::IdentityClient;
    use csi_proto::v1::plugin_capability::{self, service};
    use csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
    use csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode};
    use hyper_util::rt::TokioIo;
    use tokio::net::UnixStream;
    use tonic::transport::{Channel, Endpoint, Uri};

    use super::*;
    use crate::mockdriver::{MetadataCall, MockDriver, MockHandle};

    const MIB: i64 = 1 << 20;

    async fn connect(path: &Path) -> Channel {
        let path = path.to_owned();
        Endpoint::try_from("http://[::1]:50051")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                }
            }))
            .await
            .unwrap()
    }

    struct Served {
        mock: MockHandle,
        channel: Channel,
        _dir: tempfile::TempDir,
    }

    async fn serve(driver: MockDriver) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let mock = driver
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .unwrap();
        let channel = connect(mock.socket_path()).await;
        Served {
            mock,
            channel,
            _dir: dir,
        }
    }

    impl Served {
        async fn volume(&self, name: &str, bytes: i64) -> String {
            let block = v1::VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Block(BlockVolume {})),
            };
            let request = v1::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(v1::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![block],
                ..Default::default()
            };
            let mut controller = ControllerClient::new(self.channel.clone());
            let created = controller.create_volume(request).await.unwrap();
            created.into_inner().volume.unwrap().volume_id
        }

        async fn snapshot(&self, name: &str, volume: &str) -> String {
            let request = v1::CreateSnapshotRequest {
                name: name.into(),
                source_volume_id: volume.into(),
                ..Default::default()
            };
            let mut controller = ControllerClient::new(self.channel.clone());
            let created = controller.create_snapshot(request).await.unwrap();
            created.into_inner().snapshot.unwrap().snapshot_id
        }

        fn client(&self) -> SnapshotMetadataClient<Channel> {
            SnapshotMetadataClient::new(self.channel.clone())
        }

        async fn allocated(
            &self,
            request: v1::GetMetadataAllocatedRequest,
        ) -> Result<Vec<v1::GetMetadataAllocatedResponse>, Status> {
            let mut stream = self
                .client()
                .get_metadata_allocated(request)
                .await?
                .into_inner();
            let mut messages = Vec::new();
            while let Some(message) = stream.message().await? {
                messages.push(message);
            }
            Ok(messages)
        }
    }

    fn offsets(tuples: &[v1::BlockMetadata]) -> Vec<i64> {
        tuples.iter().map(|t| t.byte_offset).collect()
    }

    fn allocated_request(snapshot_id: &str, max_results: i32) -> v1::GetMetadataAllocatedRequest {
        v1::GetMetadataAllocatedRequest {
            snapshot_id: snapshot_id.into(),
            max_results,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn lists_allocated_and_changed_blocks_as_hostpath() {
        let served = serve(MockDriver::builder().snapshot_metadata(true)).await;
        let mut identity = IdentityClient::new(served.channel.clone());
        let caps = identity
            .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(caps.capabilities.iter().any(|c| c.r#type
            == Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: service::Type::SnapshotMetadataService as i32
                }
            ))));

        // hostpath's lab case.
        let vol = served.volume("pvc", MIB).await;
        served.mock.write_blocks(&vol, [1, 3, 4]).unwrap();
        let snap1 = served.snapshot("snap1", &vol).await;
        served.mock.write_blocks(&vol, [3, 10]).unwrap();
        let snap2 = served.snapshot("snap2", &vol).await;

        let messages = served
            .allocated(allocated_request(&snap1, 2))
            .await
            .unwrap();
        let tuples: Vec<_> = messages
            .iter()
            .map(|m| offsets(&m.block_metadata))
            .collect();
        assert_eq!(tuples, [vec![4096, 12288], vec![16384]]);
        for m in &messages {
            assert_eq!(m.volume_capacity_bytes, MIB);
            assert_eq!(
                m.block_metadata_type,
                v1::BlockMetadataType::FixedLength as i32
            );
            assert!(m.block_metadata.iter().all(|t| t.size_bytes == 4096));
        }

        let delta = v1::GetMetadataDeltaRequest {
            base_snapshot_id: snap1.clone(),
            target_snapshot_id: snap2.clone(),
            starting_offset: 4096,
            secrets: HashMap::from([("key".to_owned(), "value".to_owned())]),
            ..Default::default()
        };
        let mut stream = served
            .client()
            .get_metadata_delta(delta)
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().unwrap();
        assert_eq!(offsets(&first.block_metadata), [12288, 40960]);
        assert!(stream.message().await.unwrap().is_none());

        // What the driver saw.
        let calls = served.mock.calls().metadata_calls();
        assert_eq!(
            calls[0],
            MetadataCall {
                seq: 1,
                method: GET_METADATA_ALLOCATED.into(),
                snapshot_id: snap1.clone(),
                max_results: 2,
                ..MetadataCall::default()
            }
        );
        assert_eq!(
            (
                calls[1].method.as_str(),
                calls[1].base_snapshot_id.as_str(),
                calls[1].target_snapshot_id.as_str(),
                calls[1].starting_offset
            ),
            (GET_METADATA_DELTA, snap1.as_str(), snap2.as_str(), 4096)
        );
        assert!(calls[1].carries_secret("key", "value"));
        let logged = &served.mock.calls().of(GET_METADATA_DELTA)[0].request;
        assert!(!logged.contains("value"), "{logged}");
    }

    #[tokio::test]
    async fn errors_as_hostpath() {
        let served = serve(MockDriver::builder().snapshot_metadata(true)).await;
        let a = served.volume("a", MIB).await;
        let b = served.volume("b", MIB).await;
        let snap_a = served.snapshot("snap-a", &a).await;
        let snap_b = served.snapshot("snap-b", &b).await;
        let code = |r: Result<Vec<v1::GetMetadataAllocatedResponse>, Status>| r.unwrap_err().code();
        assert_eq!(
            code(served.allocated(allocated_request("nope", 0)).await),
            Code::NotFound
        );
        let negative = v1::GetMetadataAllocatedRequest {
            starting_offset: -1,
            ..allocated_request(&snap_a, 0)
        };
        assert_eq!(code(served.allocated(negative).await), Code::OutOfRange);
        let across = served
            .client()
            .get_metadata_delta(v1::GetMetadataDeltaRequest {
                base_snapshot_id: snap_a.clone(),
                target_snapshot_id: snap_b,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            (across.code(), across.message()),
            (
                Code::InvalidArgument,
                "snapshots don't belong to the same Volume"
            )
        );
        // Nothing written: an OK stream without messages.
        assert!(
            served
                .allocated(allocated_request(&snap_a, 0))
                .await
                .unwrap()
                .is_empty()
        );

        // The service off (the default): UNIMPLEMENTED, and not advertised.
        let off = serve(MockDriver::builder()).await;
        assert_eq!(
            code(off.allocated(allocated_request("any", 0)).await),
            Code::Unimplemented
        );
    }

    #[tokio::test]
    async fn stalled_streams_end_when_the_client_gives_up() {
        let served = serve(MockDriver::builder().snapshot_metadata(true)).await;
        let vol = served.volume("pvc", MIB).await;
        served.mock.fill(&vol).unwrap();
        let snap = served.snapshot("snap", &vol).await;
        let faults = served.mock.faults();
        faults.break_streams(GET_METADATA_ALLOCATED, 1, StreamFault::Stall);
        let mut stream = served
            .client()
            .get_metadata_allocated(allocated_request(&snap, 10))
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().unwrap();
        assert_eq!(first.block_metadata.len(), 10);
        let next = tokio::time::timeout(Duration::from_millis(200), stream.message()).await;
        assert!(next.is_err(), "a stalled stream sent more");
        drop(stream);

        // One stream only; the next is whole. Rewrites apply to every message.
        faults.rewrite_answers::<v1::GetMetadataAllocatedResponse>(
            GET_METADATA_ALLOCATED,
            2,
            |m| m.volume_capacity_bytes = 1,
        );
        let messages = served
            .allocated(allocated_request(&snap, 100))
            .await
            .unwrap();
        assert_eq!(messages.len(), 3);
        let capacities: Vec<_> = messages.iter().map(|m| m.volume_capacity_bytes).collect();
        assert_eq!(capacities, [1, 1, MIB]);

        faults.break_streams(
            GET_METADATA_ALLOCATED,
            1,
            StreamFault::Abort(Code::Internal),
        );
        let broken = served.allocated(allocated_request(&snap, 100)).await;
        assert_eq!(broken.unwrap_err().code(), Code::Internal);
        // The mock stopping ends a stalled stream.
        faults.break_streams(GET_METADATA_ALLOCATED, 1, StreamFault::Stall);
        let mut stream = served
            .client()
            .get_metadata_allocated(allocated_request(&snap, 10))
            .await
            .unwrap()
            .into_inner();
        stream.message().await.unwrap().unwrap();
        let Served {
            mock,
            channel,
            _dir,
        } = served;
        let stopping = tokio::spawn(mock.shutdown());
        let ended = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
        assert_eq!(ended.unwrap().unwrap_err().code(), Code::Unavailable);
        drop((stream, channel));
        stopping.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn streams_a_filled_4_gib_volume() {
        let served = serve(MockDriver::builder().snapshot_metadata(true)).await;
        let vol = served.volume("big", 4 << 30).await;
        served.mock.fill(&vol).unwrap();
        let snap = served.snapshot("snap", &vol).await;
        let mut stream = served
            .client()
            .get_metadata_allocated(allocated_request(&snap, 0))
            .await
            .unwrap()
            .into_inner();
        let (mut messages, mut tuples, mut next) = (0, 0, 0);
        while let Some(message) = stream.message().await.unwrap() {
            messages += 1;
            tuples += message.block_metadata.len();
            assert_eq!(message.block_metadata[0].byte_offset, next);
            next = message.block_metadata.last().unwrap().byte_offset + 4096;
        }
        assert_eq!((messages, tuples, next), (4096, 1 << 20, 4 << 30));
    }
}
