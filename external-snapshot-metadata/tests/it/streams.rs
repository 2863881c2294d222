//! The driver's stream on its way to the client: deltas, the checks of what the API promises,
//! splitting to `max_results`, a client that goes away.

use csi_proto::methods::snapshot_metadata as methods;
use testkit::mockdriver::StreamFault;
use tonic::Code;

use crate::common::*;

#[tokio::test]
async fn the_changed_blocks_between_two_snapshots_are_streamed() {
    let env = ready().await;
    let volume = env.volume("vol", 1 << 20).await;
    env.mock.write_blocks(&volume, [1, 3, 4]).unwrap();
    let base = env.cut("snap-1", &volume).await;
    env.mock.write_blocks(&volume, [3, 10]).unwrap();
    let target = env.cut("snap-2", &volume).await;
    env.snapshot("second", &target, DRIVER, None).await;
    let mut client = env.connect().await;
    let mut stream = client
        .get_metadata_delta(env.delta(&base, "second"))
        .await
        .unwrap()
        .into_inner();
    let mut blocks = Vec::new();
    while let Some(message) = stream.message().await.unwrap() {
        blocks.push(message.block_metadata);
    }
    assert_eq!(ranges(&blocks), [(3 * BLOCK, BLOCK), (10 * BLOCK, BLOCK)]);
    let call = env.mock.calls().metadata_calls().pop().unwrap();
    assert_eq!(
        (call.base_snapshot_id, call.target_snapshot_id),
        (base, target)
    );
}

#[tokio::test]
async fn a_driver_that_breaks_the_stream_s_promises_is_stopped_with_a_clear_error() {
    let env = ready().await;
    filled(&env, "full", 64).await;
    let mut client = env.connect().await;
    for fault in [
        StreamFault::Descending,
        StreamFault::Overlapping,
        StreamFault::ChangeBlockType,
        StreamFault::ChangeCapacity,
        StreamFault::BeforeStartingOffset,
    ] {
        env.mock
            .faults()
            .break_streams(methods::GET_METADATA_ALLOCATED, 1, fault);
        let mut request = env.allocated("full");
        request.max_results = 8;
        request.starting_offset = 8 * BLOCK;
        let status = all_allocated(&mut client, request).await.unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{fault:?}: {status:?}");
        assert!(
            status
                .message()
                .starts_with("the CSI driver broke the SnapshotMetadata stream"),
            "{fault:?}: {}",
            status.message()
        );
    }
    // Too many ranges a message are split, not refused.
    env.mock.faults().break_streams(
        methods::GET_METADATA_ALLOCATED,
        1,
        StreamFault::ExceedMaxResults,
    );
    let mut request = env.allocated("full");
    request.max_results = 5;
    let messages = all_allocated(&mut client, request).await.unwrap();
    assert!(messages.iter().all(|m| m.block_metadata.len() <= 5));
    let blocks: Vec<_> = messages.into_iter().map(|m| m.block_metadata).collect();
    let expected: Vec<(i64, i64)> = (0..64).map(|i| (i * BLOCK, BLOCK)).collect();
    assert_eq!(ranges(&blocks), expected);
}

#[tokio::test]
async fn a_client_that_goes_away_ends_the_driver_s_stream() {
    let env = ready().await;
    filled(&env, "full", 64).await;
    env.mock
        .faults()
        .break_streams(methods::GET_METADATA_ALLOCATED, 1, StreamFault::Stall);
    let mut client = env.connect().await;
    let mut request = env.allocated("full");
    request.max_results = 4;
    let mut stream = client
        .get_metadata_allocated(request)
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    drop(stream);
    eventually("the request to be recorded as cancelled", || async {
        env.metrics()
            .await
            .contains(r#"grpc_status_code="Canceled""#)
            .then_some(())
    })
    .await;
}

/// A backup client that stops reading a stream of one tiny message a block (`max_results` 1,
/// as upstream's lister asks): the driver's messages wait, bounded by the stream's window, and
/// nothing else is affected: another client's streams on the same driver connection complete
/// throughout, and the stalled stream completes, whole, once its client reads again.
#[tokio::test]
async fn a_client_that_stops_reading_takes_nothing_else_down() {
    const BIG: i64 = 1 << 16;
    let env = ready().await;
    filled(&env, "big", BIG).await;
    filled(&env, "small", 64).await;
    let mut stalled_client = env.connect().await;
    let mut request = env.allocated("big");
    request.max_results = 1;
    let mut stalled = stalled_client
        .get_metadata_allocated(request)
        .await
        .unwrap()
        .into_inner();
    assert!(stalled.message().await.unwrap().is_some());
    // Ten more requests over five seconds while the stalled stream's client reads nothing.
    let mut client = env.connect().await;
    for round in 0..10 {
        let mut request = env.allocated("small");
        request.max_results = 1;
        let messages = all_allocated(&mut client, request)
            .await
            .unwrap_or_else(|status| panic!("round {round}: {status:?}"));
        assert_eq!(messages.len(), 64, "round {round}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let mut read = 1;
    while stalled.message().await.unwrap().is_some() {
        read += 1;
    }
    assert_eq!(read, BIG, "every block relayed once its client read again");
}

/// A volume whose size is not a multiple of its block size (a "1G" claim of 10^9 bytes), with
/// its partial last block written: the driver reports that block whole, past the capacity, and
/// it is relayed as upstream relays it.
#[tokio::test]
async fn a_partial_last_block_is_relayed() {
    let env = ready().await;
    let capacity = 10 * BLOCK + 2560;
    let volume = env.volume("vol-odd", capacity).await;
    env.mock.write_blocks(&volume, [0, 10]).unwrap();
    let handle = env.cut("snap-odd", &volume).await;
    env.snapshot("odd", &handle, DRIVER, None).await;
    let mut client = env.connect().await;
    let messages = all_allocated(&mut client, env.allocated("odd"))
        .await
        .unwrap();
    assert!(messages.iter().all(|m| m.volume_capacity_bytes == capacity));
    let blocks: Vec<_> = messages.into_iter().map(|m| m.block_metadata).collect();
    assert_eq!(ranges(&blocks), [(0, BLOCK), (10 * BLOCK, BLOCK)]);
}
