//! The SnapshotMetadata service: the allocated and changed blocks of snapshots, streamed in
//! messages of at most `max_results` tuples, or broken as the fault script says.

use csi_proto::methods::snapshot_metadata as m;
use csi_proto::redact::{Sanitized, sanitize};
use csi_proto::v1;
use futures::{StreamExt, stream};
use tonic::codegen::BoxStream;
use tonic::{Code, Request, Response, Status};

use super::{Driver, MockService, offered, secret_digests};
use crate::mockdriver::inject::StreamFault;
use crate::mockdriver::state::{BLOCK_SIZE, Batches, BlockListing, ByteRange};

/// One message of a stream before it becomes a response.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Message {
    block_type: v1::BlockMetadataType,
    capacity: i64,
    tuples: Vec<ByteRange>,
}

/// What follows the messages of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// OK.
    Done,
    /// Nothing, until the client gives up or the mock stops.
    Stall,
    /// An error status.
    Fail(Code),
}

type Messages = Box<dyn Iterator<Item = Message> + Send>;

/// The messages a listing is sent as, and how the stream ends: a well-behaved driver's without
/// a fault. Lazy, so that a listing of a million blocks is never held whole.
fn shape(listing: &BlockListing, fault: Option<StreamFault>) -> (Messages, Ending) {
    let tuples: Box<dyn Iterator<Item = ByteRange> + Send> = match fault {
        Some(StreamFault::Descending) => Box::new(listing.tuples().rev()),
        Some(StreamFault::Overlapping) => Box::new(listing.tuples().flat_map(|t| [t, t])),
        Some(StreamFault::BeforeStartingOffset) => {
            let first = listing.starting_offset / BLOCK_SIZE;
            let before = ByteRange {
                byte_offset: first.saturating_sub(1).saturating_mul(BLOCK_SIZE),
                size_bytes: BLOCK_SIZE,
            };
            Box::new(std::iter::once(before).chain(listing.tuples().skip(1)))
        }
        _ => Box::new(listing.tuples()),
    };
    let size = match fault {
        Some(StreamFault::ExceedMaxResults) => listing.max_results.saturating_add(1),
        _ => listing.max_results,
    };
    let capacity = listing.volume_capacity_bytes;
    let messages = Batches::new(tuples, size)
        .enumerate()
        .map(move |(i, tuples)| {
            let later = i > 0;
            Message {
                block_type: match fault {
                    Some(StreamFault::ChangeBlockType) if later => {
                        v1::BlockMetadataType::VariableLength
                    }
                    _ => v1::BlockMetadataType::FixedLength,
                },
                capacity: match fault {
                    Some(StreamFault::ChangeCapacity) if later => {
                        capacity.saturating_add(BLOCK_SIZE)
                    }
                    _ => capacity,
                },
                tuples,
            }
        });
    match fault {
        Some(StreamFault::Stall) => (Box::new(messages.take(1)), Ending::Stall),
        Some(StreamFault::Abort(code)) => (Box::new(messages.take(1)), Ending::Fail(code)),
        _ => (Box::new(messages), Ending::Done),
    }
}

/// The two responses, alike but for their type.
trait MetadataResponse: Send + 'static {
    fn from_message(message: Message) -> Self;
}

fn block_metadata(tuples: Vec<ByteRange>) -> Vec<v1::BlockMetadata> {
    tuples
        .into_iter()
        .map(|t| v1::BlockMetadata {
            byte_offset: t.byte_offset,
            size_bytes: t.size_bytes,
        })
        .collect()
}

impl MetadataResponse for v1::GetMetadataAllocatedResponse {
    fn from_message(message: Message) -> Self {
        Self {
            block_metadata_type: message.block_type as i32,
            volume_capacity_bytes: message.capacity,
            block_metadata: block_metadata(message.tuples),
        }
    }
}

impl MetadataResponse for v1::GetMetadataDeltaResponse {
    fn from_message(message: Message) -> Self {
        Self {
            block_metadata_type: message.block_type as i32,
            volume_capacity_bytes: message.capacity,
            block_metadata: block_metadata(message.tuples),
        }
    }
}

impl Driver {
    fn get_metadata_allocated(
        &self,
        req: v1::GetMetadataAllocatedRequest,
    ) -> Result<BlockListing, Status> {
        offered(
            self.config.capabilities.snapshot_metadata,
            "the SnapshotMetadata service",
        )?;
        let ready_after = self.config.snapshot_ready_after;
        Ok(self.store.read(|s| {
            s.metadata_allocated(
                &req.snapshot_id,
                req.starting_offset,
                req.max_results,
                ready_after,
            )
        })?)
    }

    fn get_metadata_delta(&self, req: v1::GetMetadataDeltaRequest) -> Result<BlockListing, Status> {
        offered(
            self.config.capabilities.snapshot_metadata,
            "the SnapshotMetadata service",
        )?;
        let ready_after = self.config.snapshot_ready_after;
        Ok(self.store.read(|s| {
            s.metadata_delta(
                &req.base_snapshot_id,
                &req.target_snapshot_id,
                req.starting_offset,
                req.max_results,
                ready_after,
            )
        })?)
    }
}

impl MockService {
    /// A streaming call: counted, logged and gated like the unary ones; then the listing is
    /// streamed, shaped by a stream fault if one is due, each message through the rewrites.
    async fn stream<Req, Resp>(
        &self,
        method: &'static str,
        request: Request<Req>,
        handler: fn(&Driver, Req) -> Result<BlockListing, Status>,
    ) -> Result<Response<BoxStream<Resp>>, Status>
    where
        Req: prost::Message + prost::Name,
        Resp: MetadataResponse,
    {
        let driver = &self.0;
        let traceparent = super::traceparent(request.metadata());
        let request = request.into_inner();
        let seq = driver.calls.record_with_secrets(method, traceparent, || {
            (sanitize(&request), secret_digests(&request))
        });
        tracing::debug!(method, seq, request = %Sanitized(&request), "received");
        let listing = match driver.faults.gate(method, seq, &driver.shutdown).await {
            Ok(()) => handler(driver, request),
            Err(status) => Err(status),
        }
        .and_then(|listing| match driver.faults.take_lost_answer(method) {
            Some(lost) => Err(lost),
            None => Ok(listing),
        });
        let listing = match listing {
            Ok(listing) => listing,
            Err(status) => {
                tracing::debug!(
                    method,
                    seq,
                    code = ?status.code(),
                    message = status.message(),
                    "answered with an error"
                );
                return Err(status);
            }
        };
        let fault = driver.faults.take_stream_fault(method);
        tracing::debug!(method, seq, tuples = listing.len(), ?fault, "streaming");
        let (messages, ending) = shape(&listing, fault);
        let faults = driver.faults.clone();
        // Each message waits for the next poll: tonic then sends it in a DATA frame of its own,
        // as grpc-go sends each message a driver hands it (with one block a message, frames of
        // a few dozen bytes).
        let messages = stream::iter(messages).then(move |message| {
            let faults = faults.clone();
            async move {
                tokio::task::yield_now().await;
                let mut answer = Resp::from_message(message);
                faults.rewrite_answer(method, &mut answer);
                Ok(answer)
            }
        });
        let shutdown = driver.shutdown.clone();
        let ending = stream::once(async move {
            match ending {
                Ending::Done => None,
                Ending::Fail(code) => Some(Err(Status::new(
                    code,
                    "the mock CSI driver broke off the stream",
                ))),
                Ending::Stall => {
                    shutdown.cancelled().await;
                    Some(Err(Status::unavailable("mock CSI driver is shutting down")))
                }
            }
        })
        .filter_map(futures::future::ready);
        Ok(Response::new(Box::pin(messages.chain(ending))))
    }
}

#[tonic::async_trait]
impl v1::snapshot_metadata_server::SnapshotMetadata for MockService {
    async fn get_metadata_allocated(
        &self,
        request: Request<v1::GetMetadataAllocatedRequest>,
    ) -> Result<Response<BoxStream<v1::GetMetadataAllocatedResponse>>, Status> {
        self.stream(
            m::GET_METADATA_ALLOCATED,
            request,
            Driver::get_metadata_allocated,
        )
        .await
    }

    async fn get_metadata_delta(
        &self,
        request: Request<v1::GetMetadataDeltaRequest>,
    ) -> Result<Response<BoxStream<v1::GetMetadataDeltaResponse>>, Status> {
        self.stream(m::GET_METADATA_DELTA, request, Driver::get_metadata_delta)
            .await
    }
}

#[cfg(test)]
// Lists of block ranges are what is tested here.
#[allow(clippy::single_range_in_vec_init)]
mod tests;
