//! A backup application's request traced end to end: the client's trace continued by the
//! sidecar's server span, with the reviews, the lookups and the driver's stream under it, and
//! the driver told of the stream's span.

use testkit::otlp::{Collector, ReceivedSpan, parse_traceparent};
use tokio_stream::StreamExt;

use crate::common::*;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn a_request_is_one_trace_from_the_client_through_the_sidecar_to_the_driver() {
    let collector = Collector::start().await.unwrap();
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http_endpoint()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".to_string()),
        ],
        ..Start::default()
    })
    .await;
    // More one-block messages than HTTP/2's windows hold (64 KiB), so that the relay waits on
    // the client while it pauses.
    const BLOCKS: u64 = 16_384;
    let volume = env.volume("vol-traced", BLOCKS as i64 * BLOCK).await;
    env.mock.write_blocks(&volume, 0..BLOCKS).unwrap();
    let handle = env.cut("snap-traced", &volume).await;
    env.snapshot("traced", &handle, DRIVER, None).await;

    let mut client = env.connect().await;
    // One block a message, the first read after a pause: the driver's stream lasts as long.
    let mut asked = env.allocated("traced");
    asked.max_results = 1;
    let mut request = tonic::Request::new(asked);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
            .parse()
            .unwrap(),
    );
    let mut stream = client
        .get_metadata_allocated(request)
        .await
        .unwrap()
        .into_inner();
    let mut blocks = 0;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    while let Some(message) = stream.next().await {
        blocks += message.unwrap().block_metadata.len() as u64;
    }
    assert_eq!(blocks, BLOCKS);

    let trace = collector
        .wait_for(WAIT, |spans| {
            let trace: Vec<ReceivedSpan> = spans
                .iter()
                .filter(|s| s.trace_id == CLIENT_TRACE)
                .cloned()
                .collect();
            trace.iter().any(|s| s.kind == 2).then_some(trace)
        })
        .await
        .unwrap_or_else(|| panic!("no server span: {:#?}", collector.spans()));
    let server = trace.iter().find(|s| s.kind == 2).unwrap();
    assert_eq!(
        server.name,
        "snapshotmetadata.SnapshotMetadata/GetMetadataAllocated"
    );
    assert_eq!(server.parent_span_id, CLIENT_SPAN);
    assert_eq!(server.service, "csi-snapshot-metadata");
    assert_eq!(server.attribute("rpc.grpc.status_code"), Some("0"));
    let child = |name: &str| {
        trace
            .iter()
            .find(|s| s.name == name && s.parent_span_id == server.span_id)
            .unwrap_or_else(|| panic!("no {name} under the server span: {trace:#?}"))
    };
    child("create tokenreviews");
    child("create subjectaccessreviews");
    let call = child("csi.v1.SnapshotMetadata/GetMetadataAllocated");
    assert_eq!(call.kind, 3);
    assert_eq!(call.attribute("rpc.grpc.status_code"), Some("0"));
    let count = BLOCKS.to_string();
    assert_eq!(
        call.attribute("csi.snapshot_metadata.blocks"),
        Some(count.as_str())
    );
    assert_eq!(
        call.attribute("csi.snapshot_metadata.messages"),
        Some(count.as_str())
    );
    assert_eq!(
        call.attribute("csi.snapshot_metadata.volume_bytes"),
        Some((BLOCKS as i64 * BLOCK).to_string().as_str())
    );
    assert_eq!(call.attribute("network.transport"), Some("unix"));
    // The call lasts as long as its stream, which waited for the client's pause.
    assert!(
        call.duration() >= std::time::Duration::from_millis(400),
        "{call:#?}"
    );
    let told = env
        .mock
        .calls()
        .of(csi_proto::methods::snapshot_metadata::GET_METADATA_ALLOCATED)
        .last()
        .and_then(|c| c.traceparent.as_deref().and_then(parse_traceparent))
        .expect("the driver was told of the trace");
    assert_eq!(told, (CLIENT_TRACE.to_string(), call.span_id.clone()));
    // The token never appears in any attribute.
    for span in collector.spans() {
        for value in span.attributes.values() {
            assert!(!value.contains(TOKEN), "{span:?}");
        }
    }
}
