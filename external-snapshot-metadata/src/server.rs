//! The Kubernetes-facing service: each request goes through upstream's pipeline (validation,
//! audience, TokenReview, SubjectAccessReview, readiness, VolumeSnapshot → content → handle,
//! driver, class and secret) and then the driver's stream is relayed to the client, checked
//! and split as the API promises. Every stream is bounded by `--max-streaming-duration-min`
//! and ends when the client goes away.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use csi_proto::v1 as csi;
use csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use sidecar_kit::driver::csi::CsiClient;
use sidecar_kit::pipeline::lock;
use sidecar_kit::process::metrics::{CsiMetrics, code_label};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use crate::api;
use crate::auth::{self, AccessCache, TokenCache, User};
use crate::decide::{self, Ask, Batch, Method, ReadError, Refusal, StreamCheck};
use crate::index::Index;
use crate::model::{VolumeSnapshot, VolumeSnapshotContent};

/// Messages buffered towards a client: a slow client slows the driver's stream (HTTP/2 flow
/// control) instead of filling memory.
const RELAY_BUFFER: usize = 4;

/// What every request shares.
pub struct Shared {
    pub driver: String,
    pub csi: CsiClient,
    pub client: kube::Client,
    pub index: Arc<Mutex<Index>>,
    /// `--audience`; empty: the SnapshotMetadataService's.
    pub audience: String,
    pub tokens: Mutex<TokenCache>,
    pub access: Mutex<AccessCache>,
    pub metrics: CsiMetrics,
    pub max_duration: Duration,
    /// Whether requests are served: the driver checked and the watches synced.
    pub ready: Arc<AtomicBool>,
    /// Cancelled when the streams in flight must end (shutdown).
    pub streams: CancellationToken,
    next_op: AtomicU64,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        driver: String,
        csi: CsiClient,
        client: kube::Client,
        index: Arc<Mutex<Index>>,
        audience: String,
        max_duration: Duration,
        ready: Arc<AtomicBool>,
        streams: CancellationToken,
    ) -> Self {
        let metrics = csi.metrics().clone();
        Self {
            driver,
            csi,
            client,
            index,
            audience,
            tokens: Mutex::new(TokenCache::default()),
            access: Mutex::new(AccessCache::default()),
            metrics,
            max_duration,
            ready,
            streams,
            next_op: AtomicU64::new(0),
        }
    }
}

/// The `snapshotmetadata.SnapshotMetadata` service.
#[derive(Clone)]
pub struct Service(pub Arc<Shared>);

/// What a request resolved to: the driver's snapshot handle and the secret of its call.
struct Resolved {
    handle: String,
    secrets: BTreeMap<String, String>,
}

/// One request's record: its log name and what its metric is labelled with.
struct Operation {
    ask: Ask,
    started: Instant,
    name: String,
    /// Whether the caller was authorized: only then do the names it sent become metric labels
    /// (anyone may send any name, and each label value would be a series kept for good).
    authorized: AtomicBool,
}

impl Operation {
    fn done(&self, shared: &Shared, code: Code) {
        let (target, base) = if self.authorized.load(Ordering::Relaxed) {
            (
                self.ask.target_label(),
                self.ask.base.as_deref().unwrap_or(""),
            )
        } else {
            (String::new(), "")
        };
        shared.metrics.observe_with(
            self.ask.method.label(),
            code_label(code),
            self.started.elapsed(),
            &[&target, base],
        );
        tracing::debug!(op = %self.name, code = code_label(code), elapsed = ?self.started.elapsed(), "request done");
    }
}

fn read_error(err: kube::Error) -> ReadError {
    match err {
        kube::Error::Api(status) if status.code == 404 => ReadError::NotFound,
        other => ReadError::Other(other.to_string()),
    }
}

impl Service {
    /// The audience tokens must be issued for.
    fn audience(&self) -> Result<String, Refusal> {
        let shared = &self.0;
        if !shared.audience.is_empty() {
            return Ok(shared.audience.clone());
        }
        lock(&shared.index)
            .audience()
            .map(str::to_string)
            .ok_or_else(|| {
                Refusal::new(
                    Code::Internal,
                    format!(
                        "failed to authenticate user: failed to find the SnapshotMetadataService CR for driver '{}': not found",
                        shared.driver
                    ),
                )
            })
    }

    async fn authenticate(&self, token: &str, audience: &str) -> Result<User, Refusal> {
        let shared = &self.0;
        let key = auth::key(&[token, audience]);
        if let Some(user) = lock(&shared.tokens).get(&key, Instant::now()) {
            return Ok(user);
        }
        let user = auth::review_token(&shared.client, token, audience).await?;
        let now = Instant::now();
        if let Some(until) = auth::token_until(now, SystemTime::now(), auth::token_expiry(token)) {
            lock(&shared.tokens).put(key, user.clone(), until, now);
        }
        Ok(user)
    }

    /// Whether `user` may get VolumeSnapshots in `namespace`, remembered briefly.
    async fn authorize(&self, user: &User, namespace: &str) -> Result<(), Refusal> {
        let shared = &self.0;
        let key = auth::access_key(user, namespace);
        if let Some(answer) = lock(&shared.access).get(&key, Instant::now()) {
            return answer;
        }
        let answer = auth::authorize(&shared.client, user, namespace).await;
        let ttl = match &answer {
            Ok(()) => Some(auth::ALLOWED_TTL),
            Err(refusal) if refusal.code == Code::PermissionDenied => Some(auth::DENIED_TTL),
            // A failed review is not an answer.
            Err(_) => None,
        };
        if let Some(ttl) = ttl {
            let now = Instant::now();
            lock(&shared.access).put(key, answer.clone(), now + ttl, now);
        }
        answer
    }

    /// The VolumeSnapshot asked about: as its watch last saw it when that is bound and ready,
    /// else as the API server has it now (a watch a moment behind never refuses a request).
    async fn snapshot(&self, ask: &Ask) -> Result<(VolumeSnapshot, String), Refusal> {
        let shared = &self.0;
        let seen = lock(&shared.index)
            .snapshot(&ask.namespace, &ask.snapshot)
            .cloned();
        if let Some(snapshot) = seen
            && let Ok(content) = decide::bound_content(&snapshot, &ask.snapshot)
        {
            return Ok((snapshot, content));
        }
        let what = ask.target_label();
        let snapshot: VolumeSnapshot = Api::namespaced(shared.client.clone(), &ask.namespace)
            .get(&ask.snapshot)
            .await
            .map_err(|e| decide::read_refusal("VolumeSnapshot", &what, &read_error(e)))?;
        let content = decide::bound_content(&snapshot, &ask.snapshot)?;
        Ok((snapshot, content))
    }

    /// The handle of the content `name`, from its watch or, failing that, the API server.
    async fn handle(&self, name: &str, ask: &Ask) -> Result<String, Refusal> {
        let shared = &self.0;
        let seen = lock(&shared.index).content(name).cloned();
        if let Some(content) = seen
            && let Ok(handle) =
                decide::snapshot_handle(&content, name, &shared.driver, &ask.snapshot)
        {
            return Ok(handle);
        }
        let content: VolumeSnapshotContent = Api::all(shared.client.clone())
            .get(name)
            .await
            .map_err(|e| decide::read_refusal("VolumeSnapshotContent", name, &read_error(e)))?;
        decide::snapshot_handle(&content, name, &shared.driver, &ask.snapshot)
    }

    /// Upstream's pipeline up to the driver's call.
    async fn resolve(&self, op: &Operation) -> Result<Resolved, Refusal> {
        let shared = &self.0;
        let ask = &op.ask;
        decide::validate(ask)?;
        let audience = self.audience()?;
        let user = self.authenticate(&ask.token, &audience).await?;
        self.authorize(&user, &ask.namespace).await?;
        op.authorized.store(true, Ordering::Relaxed);
        if !shared.ready.load(Ordering::Acquire) {
            return Err(Refusal::new(
                Code::Unavailable,
                "the CSI driver is not yet ready",
            ));
        }
        let (snapshot, content_name) = self.snapshot(ask).await?;
        let handle = self.handle(&content_name, ask).await?;
        let secret = {
            let index = lock(&shared.index);
            let class = decide::choose_class(
                snapshot.spec.volume_snapshot_class_name.as_deref(),
                index.classes(),
                &shared.driver,
            )?;
            match class {
                Some(class) => {
                    decide::snapshotter_secret(class, &content_name, &ask.namespace, &ask.snapshot)?
                }
                None => None,
            }
        };
        let secrets = match secret {
            None => BTreeMap::new(),
            Some(secret) => {
                let found: Secret = Api::namespaced(shared.client.clone(), &secret.namespace)
                    .get(&secret.name)
                    .await
                    .map_err(|e| {
                        Refusal::new(Code::Unavailable, format!("failed to get credentials: {e}"))
                    })?;
                found
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect()
            }
        };
        Ok(Resolved { handle, secrets })
    }

    /// Serves one request: resolves it, opens the driver's stream and relays it.
    async fn serve<R>(
        &self,
        ask: Ask,
        respond: fn(Batch) -> R,
    ) -> Result<Response<ReceiverStream<Result<R, Status>>>, Status>
    where
        R: Send + 'static,
    {
        let shared = self.0.clone();
        let n = shared.next_op.fetch_add(1, Ordering::Relaxed) + 1;
        let op = Operation {
            name: format!("{}-{n}", ask.method.rpc()),
            started: Instant::now(),
            ask,
            authorized: AtomicBool::new(false),
        };
        tracing::debug!(op = %op.name, namespace = %op.ask.namespace, snapshot = %op.ask.snapshot, base = ?op.ask.base, starting_offset = op.ask.starting_offset, max_results = op.ask.max_results, "request");
        let resolved = match self.resolve(&op).await {
            Ok(resolved) => resolved,
            Err(refusal) => {
                tracing::info!(op = %op.name, code = code_label(refusal.code), message = %refusal.message, "request refused");
                op.done(&shared, refusal.code);
                return Err(refusal.into());
            }
        };
        let deadline = tokio::time::Instant::now() + shared.max_duration;
        let driver_stream = match open(&shared, &op.ask, resolved, shared.max_duration).await {
            Ok(stream) => stream,
            Err(status) => {
                op.done(&shared, status.code());
                return Err(status);
            }
        };
        let (tx, rx) = mpsc::channel(RELAY_BUFFER);
        tokio::spawn(async move {
            let code = relay(&shared, &op, driver_stream, respond, tx, deadline).await;
            op.done(&shared, code);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The driver's stream of either RPC, as plain batches.
type DriverStream = futures::stream::BoxStream<'static, Result<Batch, Status>>;

/// A driver error as the client gets it: its own code and message when it has one (upstream
/// passes them through), Internal otherwise.
fn driver_status(status: Status) -> Status {
    if status.code() == Code::Unknown {
        Status::internal(format!(
            "failed to get response from CSI driver: {}",
            status.message()
        ))
    } else {
        status
    }
}

fn batch(block_type: i32, capacity: i64, blocks: Vec<csi::BlockMetadata>) -> Batch {
    Batch {
        block_type,
        capacity,
        blocks: blocks
            .into_iter()
            .map(|b| (b.byte_offset, b.size_bytes))
            .collect(),
    }
}

/// `request` bounded to `limit`.
fn timed<T>(request: T, limit: Duration) -> Request<T> {
    let mut request = Request::new(request);
    request.set_timeout(limit);
    request
}

/// The driver's answer as plain batches; `parts` takes a message apart.
fn batches<M: Send + 'static>(
    answer: Result<tonic::Response<tonic::Streaming<M>>, Status>,
    parts: fn(M) -> Batch,
) -> Result<DriverStream, Status> {
    use futures::StreamExt;
    Ok(answer
        .map_err(driver_status)?
        .into_inner()
        .map(move |message| message.map(parts))
        .boxed())
}

/// Opens the driver's stream for `ask`.
async fn open(
    shared: &Shared,
    ask: &Ask,
    resolved: Resolved,
    limit: Duration,
) -> Result<DriverStream, Status> {
    let mut client = SnapshotMetadataClient::new(shared.csi.connection().channel())
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
    let secrets = resolved.secrets.into_iter().collect();
    match ask.method {
        Method::Allocated => {
            let request = csi::GetMetadataAllocatedRequest {
                snapshot_id: resolved.handle,
                starting_offset: ask.starting_offset,
                max_results: ask.max_results,
                secrets,
            };
            batches(
                client.get_metadata_allocated(timed(request, limit)).await,
                |m| {
                    batch(
                        m.block_metadata_type,
                        m.volume_capacity_bytes,
                        m.block_metadata,
                    )
                },
            )
        }
        Method::Delta => {
            let request = csi::GetMetadataDeltaRequest {
                base_snapshot_id: ask.base.clone().unwrap_or_default(),
                target_snapshot_id: resolved.handle,
                starting_offset: ask.starting_offset,
                max_results: ask.max_results,
                secrets,
            };
            batches(
                client.get_metadata_delta(timed(request, limit)).await,
                |m| {
                    batch(
                        m.block_metadata_type,
                        m.volume_capacity_bytes,
                        m.block_metadata,
                    )
                },
            )
        }
    }
}

/// Relays the driver's stream to the client until it ends, the client goes, the deadline
/// passes or the server stops; the status code the request ended with.
async fn relay<R>(
    shared: &Shared,
    op: &Operation,
    mut driver: DriverStream,
    respond: fn(Batch) -> R,
    tx: mpsc::Sender<Result<R, Status>>,
    deadline: tokio::time::Instant,
) -> Code {
    use futures::StreamExt;
    let mut check = StreamCheck::new(op.ask.starting_offset, op.ask.max_results);
    let end = |status: Status| async {
        let code = status.code();
        let _ = tx.send(Err(status)).await;
        code
    };
    loop {
        let next = tokio::select! {
            next = driver.next() => next,
            _ = tx.closed() => {
                tracing::info!(op = %op.name, "the client went away; ending the driver's stream");
                return Code::Cancelled;
            }
            _ = tokio::time::sleep_until(deadline) => {
                return end(Status::deadline_exceeded(format!(
                    "the stream ran longer than --max-streaming-duration-min ({} s)",
                    shared.max_duration.as_secs()
                ))).await;
            }
            _ = shared.streams.cancelled() => {
                return end(Status::unavailable("the sidecar is shutting down")).await;
            }
        };
        let batch = match next {
            None => return Code::Ok,
            Some(Err(status)) => return end(driver_status(status)).await,
            Some(Ok(batch)) => batch,
        };
        let messages = match check.take(batch) {
            Ok(messages) => messages,
            Err(broken) => {
                tracing::warn!(op = %op.name, driver = %shared.driver, problem = %broken, "the CSI driver broke the SnapshotMetadata stream; ending it");
                return end(Status::internal(format!(
                    "the CSI driver broke the SnapshotMetadata stream: {broken}"
                )))
                .await;
            }
        };
        if let Some((offset, size)) = check.past_capacity() {
            tracing::debug!(op = %op.name, offset, size, "the CSI driver reports a range past the volume's capacity (a partial last block reported whole); relayed as it is");
        }
        for message in messages {
            tracing::trace!(op = %op.name, blocks = ?message.blocks, "relaying");
            if tx.send(Ok(respond(message))).await.is_err() {
                tracing::info!(op = %op.name, "the client went away; ending the driver's stream");
                return Code::Cancelled;
            }
        }
    }
}

fn blocks(batch: &Batch) -> Vec<api::BlockMetadata> {
    batch
        .blocks
        .iter()
        .map(|&(byte_offset, size_bytes)| api::BlockMetadata {
            byte_offset,
            size_bytes,
        })
        .collect()
}

#[tonic::async_trait]
impl api::snapshot_metadata_server::SnapshotMetadata for Service {
    type GetMetadataAllocatedStream =
        ReceiverStream<Result<api::GetMetadataAllocatedResponse, Status>>;
    type GetMetadataDeltaStream = ReceiverStream<Result<api::GetMetadataDeltaResponse, Status>>;

    async fn get_metadata_allocated(
        &self,
        request: Request<api::GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let r = request.into_inner();
        let ask = Ask {
            method: Method::Allocated,
            token: r.security_token,
            namespace: r.namespace,
            snapshot: r.snapshot_name,
            base: None,
            starting_offset: r.starting_offset,
            max_results: r.max_results,
        };
        self.serve(ask, |b| api::GetMetadataAllocatedResponse {
            block_metadata_type: b.block_type,
            volume_capacity_bytes: b.capacity,
            block_metadata: blocks(&b),
        })
        .await
    }

    async fn get_metadata_delta(
        &self,
        request: Request<api::GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let r = request.into_inner();
        let ask = Ask {
            method: Method::Delta,
            token: r.security_token,
            namespace: r.namespace,
            snapshot: r.target_snapshot_name,
            base: Some(r.base_snapshot_id),
            starting_offset: r.starting_offset,
            max_results: r.max_results,
        };
        self.serve(ask, |b| api::GetMetadataDeltaResponse {
            block_metadata_type: b.block_type,
            volume_capacity_bytes: b.capacity,
            block_metadata: blocks(&b),
        })
        .await
    }
}
