//! The driver's stream on its way to one client, bounded in every way a client can stall it:
//! in messages and bytes held for it (all streams together share [`RELAY_BYTES`]), and in
//! time (the stream's deadline and the server's shutdown end it even while its client reads
//! nothing, and what was queued for that client is let go at once).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::decide::{Batch, StreamCheck};
use crate::server::{Operation, Shared};

/// Bytes all streams together may hold for their clients (ranges taken from the driver and
/// not yet taken by the client's connection). A stream that would pass it waits, and so does
/// its driver's stream (HTTP/2 flow control), as with a slow client.
pub const RELAY_BYTES: usize = 32 << 20;
/// Messages queued for one client.
pub const QUEUE_DEPTH: usize = 4;

/// What holding `batch` costs, as the relay counts it: its ranges and a message's overhead.
fn cost(batch: &Batch) -> usize {
    64 + batch.blocks.len() * std::mem::size_of::<(i64, i64)>()
}

/// A message for the client with its share of the byte budget, given back when the client's
/// connection takes it (or when the stream ends without it).
struct Relayed<R> {
    message: R,
    _bytes: Arc<OwnedSemaphorePermit>,
}

struct Queue<R> {
    messages: VecDeque<Relayed<R>>,
    /// How the stream ends once `messages` are taken: `Some(None)` whole, `Some(Some(_))` with
    /// that status.
    end: Option<Option<Status>>,
    /// Set once the end has been handed out.
    ended: bool,
    reader: Option<Waker>,
}

/// One stream's messages between the relay and tonic.
struct Outbox<R> {
    queue: Mutex<Queue<R>>,
    /// Signalled when a message is taken.
    room: Notify,
    /// Cancelled when the reader (tonic, for the client) is gone.
    gone: CancellationToken,
}

/// Why a message was not queued.
enum Refused<R> {
    Full(Relayed<R>),
    Gone,
}

impl<R> Outbox<R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<R>> {
        sidecar_kit::pipeline::lock(&self.queue)
    }

    /// Queues `message` if there is room.
    fn try_send(&self, message: Relayed<R>) -> Result<(), Refused<R>> {
        if self.gone.is_cancelled() {
            return Err(Refused::Gone);
        }
        let mut queue = self.lock();
        if queue.messages.len() >= QUEUE_DEPTH {
            return Err(Refused::Full(message));
        }
        queue.messages.push_back(message);
        if let Some(reader) = queue.reader.take() {
            reader.wake();
        }
        Ok(())
    }

    /// Queues `message`, waiting for room; `Err` once the reader is gone.
    async fn send(&self, mut message: Relayed<R>) -> Result<(), ()> {
        loop {
            match self.try_send(message) {
                Ok(()) => return Ok(()),
                Err(Refused::Gone) => return Err(()),
                // A message taken since the check left a permit: no wake-up is lost.
                Err(Refused::Full(back)) => message = back,
            }
            self.room.notified().await;
        }
    }

    /// Ends the stream: whole after what is queued, or with `status` at once, letting go of
    /// what is queued (a client that reads nothing keeps none of it).
    fn finish(&self, status: Option<Status>) {
        let mut queue = self.lock();
        if status.is_some() {
            queue.messages.clear();
        }
        queue.end = Some(status);
        if let Some(reader) = queue.reader.take() {
            reader.wake();
        }
    }
}

/// The client's side of a stream, as tonic sends it.
pub struct Outgoing<R>(Arc<Outbox<R>>);

impl<R> Stream for Outgoing<R> {
    type Item = Result<R, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let outbox = &self.0;
        let mut queue = outbox.lock();
        if let Some(relayed) = queue.messages.pop_front() {
            drop(queue);
            outbox.room.notify_one();
            return Poll::Ready(Some(Ok(relayed.message)));
        }
        if queue.ended {
            return Poll::Ready(None);
        }
        match queue.end.take() {
            Some(end) => {
                queue.ended = true;
                Poll::Ready(end.map(Err))
            }
            None => {
                queue.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<R> Drop for Outgoing<R> {
    fn drop(&mut self) {
        self.0.gone.cancel();
        self.0.lock().messages.clear();
    }
}

/// A new stream's two ends.
pub fn outbox<R>() -> (Sender<R>, Outgoing<R>) {
    let outbox = Arc::new(Outbox {
        queue: Mutex::new(Queue {
            messages: VecDeque::new(),
            end: None,
            ended: false,
            reader: None,
        }),
        room: Notify::new(),
        gone: CancellationToken::new(),
    });
    (Sender(outbox.clone()), Outgoing(outbox))
}

/// The relay's side of a stream.
pub struct Sender<R>(Arc<Outbox<R>>);

/// Why the relay stopped waiting.
enum Stop {
    ClientGone,
    Deadline,
    Shutdown,
}

/// The driver's stream of either RPC, as plain batches.
pub type DriverStream = futures::stream::BoxStream<'static, Result<Batch, Status>>;

/// A driver error as the client gets it: the driver's own code and message when it sent one
/// (upstream passes them through); Unavailable when the connection to the driver broke, as
/// grpc-go reports it; Internal otherwise.
pub fn driver_status(status: Status) -> Status {
    if status.code() != Code::Unknown {
        return status;
    }
    // tonic keeps the transport's error as the source of a status it made itself; a status the
    // driver sent has none.
    if std::error::Error::source(&status).is_some() {
        Status::unavailable(format!(
            "lost the connection to the CSI driver: {}",
            status.message()
        ))
    } else {
        Status::internal(format!(
            "failed to get response from CSI driver: {}",
            status.message()
        ))
    }
}

/// One stream's relay: the driver's stream, checked and split, to its client.
pub struct Relay<'a, R> {
    pub shared: &'a Shared,
    pub op: &'a Operation,
    pub respond: fn(Batch) -> R,
    pub to_client: Sender<R>,
    pub deadline: tokio::time::Instant,
    pub relayed: &'a Counts,
}

/// What a relay handed its client.
#[derive(Debug, Default)]
pub struct Counts {
    messages: AtomicU64,
    blocks: AtomicU64,
    /// The bytes of the volume the relayed blocks cover.
    volume_bytes: AtomicU64,
}

impl Counts {
    fn add(&self, batch: &Batch) {
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.blocks
            .fetch_add(batch.blocks.len() as u64, Ordering::Relaxed);
        let covered = batch
            .blocks
            .iter()
            .map(|&(_, size)| u64::try_from(size).unwrap_or(0))
            .fold(0u64, u64::saturating_add);
        self.volume_bytes.fetch_add(covered, Ordering::Relaxed);
    }

    /// Sets them on `span` (the driver call's), as attributes.
    pub fn record(&self, span: &tracing::Span) {
        sidecar_kit::telemetry::count_on(
            span,
            &[
                (
                    "csi.snapshot_metadata.messages",
                    self.messages.load(Ordering::Relaxed),
                ),
                (
                    "csi.snapshot_metadata.blocks",
                    self.blocks.load(Ordering::Relaxed),
                ),
                (
                    "csi.snapshot_metadata.volume_bytes",
                    self.volume_bytes.load(Ordering::Relaxed),
                ),
            ],
        );
    }
}

/// What ends a wait of the relay other than what it waits for.
struct Stops<'a> {
    shutdown: &'a CancellationToken,
    deadline: Pin<&'a mut tokio::time::Sleep>,
    gone: &'a CancellationToken,
}

impl Stops<'_> {
    /// `wait`, unless the server stops, the deadline passes or the client goes first.
    async fn bounded<T>(&mut self, wait: impl Future<Output = T>) -> Result<T, Stop> {
        tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => Err(Stop::Shutdown),
            _ = self.deadline.as_mut() => Err(Stop::Deadline),
            _ = self.gone.cancelled() => Err(Stop::ClientGone),
            value = wait => Ok(value),
        }
    }
}

impl<R> Relay<'_, R> {
    fn end(&self, status: Status) -> Code {
        let code = status.code();
        self.to_client.0.finish(Some(status));
        code
    }

    fn stopped(&self, stop: Stop) -> Code {
        match stop {
            Stop::ClientGone => {
                tracing::info!(op = %self.op.name, "the client went away; ending the driver's stream");
                Code::Cancelled
            }
            Stop::Deadline => {
                tracing::info!(op = %self.op.name, limit = ?self.shared.max_duration, "the stream reached --max-streaming-duration-min; ending it");
                self.end(Status::deadline_exceeded(format!(
                    "the stream ran longer than --max-streaming-duration-min ({} s)",
                    self.shared.max_duration.as_secs()
                )))
            }
            Stop::Shutdown => self.end(Status::unavailable("the sidecar is shutting down")),
        }
    }

    /// Relays until the driver's stream ends, the client goes, the deadline passes or the
    /// server stops; the status code the request ended with. Each wait is tried at once first:
    /// the bounds are set up only when something has to be waited for.
    pub async fn run(self, mut driver: DriverStream) -> Code {
        let mut check = StreamCheck::new(self.op.ask.starting_offset, self.op.ask.max_results);
        let deadline = tokio::time::sleep_until(self.deadline);
        tokio::pin!(deadline);
        let mut stops = Stops {
            shutdown: &self.shared.streams,
            deadline,
            gone: &self.to_client.0.gone,
        };
        loop {
            let next = match driver.next().now_or_never() {
                Some(next) => next,
                None => match stops.bounded(driver.next()).await {
                    Ok(next) => next,
                    Err(stop) => return self.stopped(stop),
                },
            };
            let batch = match next {
                None => {
                    self.to_client.0.finish(None);
                    return Code::Ok;
                }
                Some(Err(status)) => return self.end(driver_status(status)),
                Some(Ok(batch)) => batch,
            };
            let messages = match check.take(batch) {
                Ok(messages) => messages,
                Err(broken) => {
                    tracing::warn!(op = %self.op.name, driver = %self.shared.driver, problem = %broken, "the CSI driver broke the SnapshotMetadata stream; ending it");
                    return self.end(Status::internal(format!(
                        "the CSI driver broke the SnapshotMetadata stream: {broken}"
                    )));
                }
            };
            if let Some((offset, size)) = check.past_capacity() {
                tracing::debug!(op = %self.op.name, offset, size, "the CSI driver reports a range past the volume's capacity (a partial last block reported whole); relayed as it is");
            }
            let bytes = messages.iter().map(cost).sum::<usize>().min(RELAY_BYTES);
            // RELAY_BYTES fits a u32.
            let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
            let budget = &self.shared.relay_bytes;
            let held = match budget.clone().try_acquire_many_owned(permits) {
                Ok(held) => held,
                Err(_) => match stops
                    .bounded(budget.clone().acquire_many_owned(permits))
                    .await
                {
                    Err(stop) => return self.stopped(stop),
                    Ok(Ok(held)) => held,
                    // The budget is never closed.
                    Ok(Err(_)) => {
                        return self.end(Status::unavailable("the sidecar is shutting down"));
                    }
                },
            };
            let held = Arc::new(held);
            for message in messages {
                tracing::trace!(op = %self.op.name, blocks = ?message.blocks, "relaying");
                self.relayed.add(&message);
                let relayed = Relayed {
                    message: (self.respond)(message),
                    _bytes: held.clone(),
                };
                let sent = match self.to_client.0.try_send(relayed) {
                    Ok(()) => Ok(()),
                    Err(Refused::Gone) => Err(()),
                    Err(Refused::Full(relayed)) => {
                        match stops.bounded(self.to_client.0.send(relayed)).await {
                            Ok(sent) => sent,
                            Err(stop) => return self.stopped(stop),
                        }
                    }
                };
                if sent.is_err() {
                    return self.stopped(Stop::ClientGone);
                }
            }
        }
    }
}

/// The relay's budget of bytes: [`RELAY_BYTES`].
pub fn budget() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(RELAY_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_driver_connection_is_unavailable_and_a_driver_s_status_kept() {
        let broken = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "connection reset",
        )));
        assert_eq!(broken.code(), Code::Unknown);
        assert_eq!(driver_status(broken).code(), Code::Unavailable);
        assert_eq!(
            driver_status(Status::unknown("the driver's own")).code(),
            Code::Internal
        );
        assert_eq!(
            driver_status(Status::not_found("no snapshot")).code(),
            Code::NotFound
        );
    }

    #[tokio::test]
    async fn an_ended_stream_lets_go_of_what_waits_for_its_client() {
        let budget = Arc::new(Semaphore::new(10));
        let (sender, mut outgoing) = outbox::<u32>();
        for message in 0..QUEUE_DEPTH as u32 {
            let held = Arc::new(budget.clone().try_acquire_owned().unwrap());
            sender
                .0
                .send(Relayed {
                    message,
                    _bytes: held,
                })
                .await
                .unwrap();
        }
        assert_eq!(budget.available_permits(), 10 - QUEUE_DEPTH);
        sender.0.finish(Some(Status::deadline_exceeded("bound")));
        assert_eq!(budget.available_permits(), 10, "queued messages let go");
        let status = outgoing.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(outgoing.next().await.is_none());
    }

    #[tokio::test]
    async fn a_whole_stream_ends_after_what_is_queued() {
        let budget = Arc::new(Semaphore::new(1));
        let (sender, mut outgoing) = outbox::<u32>();
        let held = Arc::new(budget.clone().try_acquire_owned().unwrap());
        sender
            .0
            .send(Relayed {
                message: 7,
                _bytes: held,
            })
            .await
            .unwrap();
        sender.0.finish(None);
        assert_eq!(outgoing.next().await.unwrap().unwrap(), 7);
        assert!(outgoing.next().await.is_none());
        drop(outgoing);
        assert!(
            sender
                .0
                .send(Relayed {
                    message: 8,
                    _bytes: Arc::new(budget.clone().try_acquire_owned().unwrap())
                })
                .await
                .is_err()
        );
    }
}
