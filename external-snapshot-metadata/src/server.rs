//! The Kubernetes-facing service: each request goes through upstream's pipeline (validation,
//! audience, TokenReview, SubjectAccessReview, readiness, VolumeSnapshot → content → handle,
//! driver, class and secret) and then the driver's stream is relayed to the client, checked
//! and split as the API promises. Every stream is bounded by `--max-streaming-duration-min`
//! and ends when the client goes away.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use csi_proto::v1 as csi;
use csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use sidecar_kit::cluster::client::api_message;
use sidecar_kit::driver::csi::{CsiClient, record_code, traced_call};
use sidecar_kit::driver::endpoint::Endpoint;
use sidecar_kit::pipeline::lock;
use sidecar_kit::process::metrics::{CsiMetrics, code_label};
use sidecar_kit::telemetry::propagate::server_span;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};
use tracing::Instrument;

use crate::api;
use crate::auth::{self, AccessCache, FailedCache, ReviewBudget, TokenCache, User};
use crate::decide::{self, Ask, Batch, Method, ReadError, Refusal};
use crate::index::Index;
use crate::model::{
    Class, SnapshotMetadataService, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent,
};
use crate::relay::{self, DriverStream, Outgoing, Relay, driver_status};
use crate::tls::Peer;

/// Which kinds the index holds whole: until their watch has synced (never, while the sidecar
/// may not watch them), requests read them from the API server.
#[derive(Debug, Default)]
pub struct Watched {
    pub classes: AtomicBool,
}

/// How long and how many streams are served at once.
#[derive(Clone, Copy, Debug)]
pub struct StreamLimits {
    /// `--max-streaming-duration-min`.
    pub max_duration: Duration,
    /// `--max-streams`.
    pub max_streams: usize,
}

/// What every request shares.
pub struct Shared {
    pub driver: String,
    pub csi: CsiClient,
    pub client: kube::Client,
    /// TokenReviews and SubjectAccessReviews go through this client, paced by `reviews`
    /// instead of by the rate limit of `client`, which the lookups and watches keep.
    review_client: kube::Client,
    reviews: ReviewBudget,
    pub index: Arc<Mutex<Index>>,
    /// `--audience`; empty: the SnapshotMetadataService's.
    pub audience: String,
    pub tokens: Mutex<TokenCache>,
    failed: Mutex<FailedCache>,
    pub access: Mutex<AccessCache>,
    pub metrics: CsiMetrics,
    pub max_duration: Duration,
    /// Streams in flight, all connections together: `--max-streams`.
    stream_slots: Arc<Semaphore>,
    max_streams: usize,
    /// What the relays hold for their clients ([`relay::RELAY_BYTES`]).
    pub relay_bytes: Arc<Semaphore>,
    /// Which kinds the index holds whole (their watch synced).
    pub watched: Watched,
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
        (client, review_client): (kube::Client, kube::Client),
        index: Arc<Mutex<Index>>,
        audience: String,
        limits: StreamLimits,
        ready: Arc<AtomicBool>,
        streams: CancellationToken,
    ) -> Self {
        let metrics = csi.metrics().clone();
        Self {
            driver,
            csi,
            client,
            review_client,
            reviews: ReviewBudget::default(),
            index,
            audience,
            tokens: Mutex::new(TokenCache::default()),
            failed: Mutex::new(FailedCache::default()),
            access: Mutex::new(AccessCache::default()),
            metrics,
            max_duration: limits.max_duration,
            stream_slots: Arc::new(Semaphore::new(limits.max_streams)),
            max_streams: limits.max_streams,
            relay_bytes: relay::budget(),
            watched: Watched::default(),
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
pub struct Operation {
    pub ask: Ask,
    started: Instant,
    pub name: String,
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

/// Upstream's answer before the sidecar serves.
fn not_ready() -> Refusal {
    Refusal::new(Code::Unavailable, "the CSI driver is not yet ready")
}

fn unauthenticated() -> Refusal {
    Refusal::new(Code::Unauthenticated, "unauthenticated user")
}

fn read_error(err: kube::Error) -> ReadError {
    match err {
        kube::Error::Api(status) if status.code == 404 => ReadError::NotFound,
        other => ReadError::Other(other.to_string()),
    }
}

impl Service {
    /// The audience tokens must be issued for: `--audience`, else that of the driver's
    /// SnapshotMetadataService as its watch has it or, when the watch has not seen it, as the
    /// API server has it (as upstream reads it on every request).
    async fn audience(&self) -> Result<String, Refusal> {
        let shared = &self.0;
        if !shared.audience.is_empty() {
            return Ok(shared.audience.clone());
        }
        if let Some(audience) = lock(&shared.index).audience() {
            return Ok(audience.to_string());
        }
        if !shared.ready.load(Ordering::Acquire) {
            return Err(not_ready());
        }
        let not_found = |reason: String| {
            Refusal::new(
                Code::Internal,
                format!(
                    "failed to authenticate user: failed to find the SnapshotMetadataService CR for driver '{}': {reason}",
                    shared.driver
                ),
            )
        };
        let service: SnapshotMetadataService = Api::all(shared.client.clone())
            .get(&shared.driver)
            .await
            .map_err(|e| not_found(api_message(&e)))?;
        Ok(service.spec.audience)
    }

    async fn authenticate(&self, token: &str, audience: &str) -> Result<User, Refusal> {
        let shared = &self.0;
        let key = auth::key(&[token, audience]);
        let now = Instant::now();
        if let Some(user) = lock(&shared.tokens).get(&key, now) {
            return Ok(user);
        }
        if lock(&shared.failed).get(&key, now).is_some() {
            return Err(unauthenticated());
        }
        let wall = SystemTime::now();
        shared
            .reviews
            .turn(auth::plausible(token, audience, wall))
            .await?;
        let answer = auth::review_token(&shared.review_client, token, audience).await;
        let now = Instant::now();
        match &answer {
            Ok(user) => {
                if let Some(until) = auth::token_until(now, wall, auth::token_expiry(token)) {
                    lock(&shared.tokens).put(key, user.clone(), until, now);
                }
            }
            Err(refusal) if refusal.code == Code::Unauthenticated => {
                lock(&shared.failed).put(key, (), now + auth::FAILED_TTL, now);
            }
            // A failed review is not an answer.
            Err(_) => {}
        }
        answer
    }

    /// Whether `user` may get VolumeSnapshots in `namespace`, remembered briefly.
    async fn authorize(&self, user: &User, namespace: &str) -> Result<(), Refusal> {
        let shared = &self.0;
        let key = auth::access_key(user, namespace);
        if let Some(answer) = lock(&shared.access).get(&key, Instant::now()) {
            return answer;
        }
        // Only authenticated callers get here: their reviews come out of the plausible share.
        shared.reviews.turn(true).await?;
        let answer = auth::authorize(&shared.review_client, user, namespace).await;
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

    /// The driver's classes: as their watch has them or, while the sidecar may not watch them,
    /// as the API server has them (the one the snapshot names, else all of them for the
    /// default), as upstream reads them on every request.
    async fn classes(&self, named: Option<&str>) -> Result<BTreeMap<String, Class>, Refusal> {
        let shared = &self.0;
        if shared.watched.classes.load(Ordering::Acquire) {
            return Ok(lock(&shared.index).classes().clone());
        }
        let api = Api::<VolumeSnapshotClass>::all(shared.client.clone());
        let found = match named.filter(|n| !n.is_empty()) {
            Some(name) => vec![api.get(name).await.map_err(|e| {
                Refusal::new(
                    Code::Unavailable,
                    format!(
                        "failed to get VolumeSnapshotClass '{name}': {}",
                        api_message(&e)
                    ),
                )
            })?],
            None => {
                api.list(&ListParams::default())
                    .await
                    .map_err(|e| {
                        Refusal::new(
                            Code::Unavailable,
                            format!("failed to list VolumeSnapshotClasses: {}", api_message(&e)),
                        )
                    })?
                    .items
            }
        };
        Ok(found
            .iter()
            .filter_map(|class| {
                let kept = Class::of_driver(class, &shared.driver)?;
                Some((class.metadata.name.clone().unwrap_or_default(), kept))
            })
            .collect())
    }

    /// Upstream's pipeline up to the driver's call.
    async fn resolve(&self, op: &Operation) -> Result<Resolved, Refusal> {
        let shared = &self.0;
        let ask = &op.ask;
        decide::validate(ask)?;
        // Only now: the names are bounded.
        tracing::debug!(op = %op.name, namespace = %ask.namespace, snapshot = %ask.snapshot, base = ?ask.base, starting_offset = ask.starting_offset, max_results = ask.max_results, "request");
        let audience = self.audience().await?;
        let user = self.authenticate(&ask.token, &audience).await?;
        self.authorize(&user, &ask.namespace).await?;
        op.authorized.store(true, Ordering::Relaxed);
        if !shared.ready.load(Ordering::Acquire) {
            return Err(not_ready());
        }
        let (snapshot, content_name) = self.snapshot(ask).await?;
        let handle = self.handle(&content_name, ask).await?;
        let named = snapshot.spec.volume_snapshot_class_name.as_deref();
        let classes = self.classes(named).await?;
        let secret = match decide::choose_class(named, &classes, &shared.driver)? {
            Some(class) => {
                decide::snapshotter_secret(class, &content_name, &ask.namespace, &ask.snapshot)?
            }
            None => None,
        };
        let secrets = match secret {
            None => BTreeMap::new(),
            Some(secret) => {
                let found: Secret = Api::namespaced(shared.client.clone(), &secret.namespace)
                    .get(&secret.name)
                    .await
                    .map_err(|e| {
                        Refusal::new(
                            Code::Unavailable,
                            format!("failed to get credentials: {}", api_message(&e)),
                        )
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
    /// `span`: the request's server span, which lasts until its stream ends.
    async fn serve<R>(
        &self,
        peer: Option<Peer>,
        ask: Ask,
        span: tracing::Span,
        respond: fn(Batch) -> R,
    ) -> Result<Response<Outgoing<R>>, Status>
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
        let admitted = self
            .resolve(&op)
            .instrument(span.clone())
            .await
            .and_then(|resolved| {
            let slot = shared.stream_slots.clone().try_acquire_owned().map_err(|_| {
                Refusal::new(
                    Code::ResourceExhausted,
                    format!(
                        "too many SnapshotMetadata streams in flight ({}, --max-streams); retry later",
                        shared.max_streams
                    ),
                )
            })?;
            Ok((resolved, slot))
        });
        let (resolved, slot) = match admitted {
            Ok(admitted) => admitted,
            Err(refusal) => {
                span.in_scope(|| tracing::info!(op = %op.name, code = code_label(refusal.code), message = %refusal.message, "request refused"));
                record_code(&span, refusal.code);
                op.done(&shared, refusal.code);
                return Err(refusal.into());
            }
        };
        let open_on_connection = peer.as_ref().map(Peer::stream);
        let deadline = tokio::time::Instant::now() + shared.max_duration;
        let (driver_stream, call) = match open(&shared, &op.ask, resolved, shared.max_duration)
            .instrument(span.clone())
            .await
        {
            Ok(opened) => opened,
            Err((status, call)) => {
                record_code(&call, status.code());
                record_code(&span, status.code());
                op.done(&shared, status.code());
                return Err(status);
            }
        };
        let (to_client, outgoing) = relay::outbox();
        tokio::spawn(
            async move {
                let _held = (slot, open_on_connection);
                let relayed = relay::Counts::default();
                let relay = Relay {
                    shared: &shared,
                    op: &op,
                    respond,
                    to_client,
                    deadline,
                    relayed: &relayed,
                };
                // Inside the call's span: a span ends at its last exit, and the call lasts as
                // long as its stream.
                let code = relay.run(driver_stream).instrument(call.clone()).await;
                relayed.record(&call);
                record_code(&call, code);
                record_code(&tracing::Span::current(), code);
                op.done(&shared, code);
            }
            .instrument(span),
        );
        Ok(Response::new(outgoing))
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

/// The driver's answer as plain batches; `parts` takes a message apart. `call`: the span of
/// the call, handed back with either.
fn batches<M: Send + 'static>(
    answer: Result<tonic::Response<tonic::Streaming<M>>, Status>,
    call: tracing::Span,
    parts: fn(M) -> Batch,
) -> Opened {
    use futures::StreamExt;
    match answer {
        Ok(answer) => Ok((
            answer
                .into_inner()
                .map(move |message| message.map(parts))
                .boxed(),
            call,
        )),
        Err(status) => Err((driver_status(status), call)),
    }
}

/// What opening a driver's stream gives: the stream, or why not, each with the client span of
/// the call, which lasts as long as the stream (a disabled span when tracing is off).
type Opened = Result<(DriverStream, tracing::Span), (Status, tracing::Span)>;

/// Opens the driver's stream for `ask`.
async fn open(shared: &Shared, ask: &Ask, resolved: Resolved, limit: Duration) -> Opened {
    let connection = shared.csi.connection();
    let mut client = SnapshotMetadataClient::new(connection.channel())
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
    let secrets = resolved.secrets.into_iter().collect();
    let endpoint = connection.endpoint();
    match ask.method {
        Method::Allocated => {
            let request = csi::GetMetadataAllocatedRequest {
                snapshot_id: resolved.handle,
                starting_offset: ask.starting_offset,
                max_results: ask.max_results,
                secrets,
            };
            traced_stream(
                (ask.method, endpoint, limit),
                request,
                |request| client.get_metadata_allocated(request),
                |m| {
                    batch(
                        m.block_metadata_type,
                        m.volume_capacity_bytes,
                        m.block_metadata,
                    )
                },
            )
            .await
        }
        Method::Delta => {
            let request = csi::GetMetadataDeltaRequest {
                base_snapshot_id: ask.base.clone().unwrap_or_default(),
                target_snapshot_id: resolved.handle,
                starting_offset: ask.starting_offset,
                max_results: ask.max_results,
                secrets,
            };
            traced_stream(
                (ask.method, endpoint, limit),
                request,
                |request| client.get_metadata_delta(request),
                |m| {
                    batch(
                        m.block_metadata_type,
                        m.volume_capacity_bytes,
                        m.block_metadata,
                    )
                },
            )
            .await
        }
    }
}

/// Sends `request` (bounded by `limit`) with `send` inside the call's span, its trace in the
/// request's metadata; `parts` takes the answer's messages apart.
async fn traced_stream<Req, M, Fut>(
    (method, endpoint, limit): (Method, &Endpoint, Duration),
    request: Req,
    send: impl FnOnce(Request<Req>) -> Fut,
    parts: fn(M) -> Batch,
) -> Opened
where
    Req: prost::Message + prost::Name,
    M: Send + 'static,
    Fut: Future<Output = Result<tonic::Response<tonic::Streaming<M>>, Status>>,
{
    let mut request = timed(request, limit);
    let call = traced_call(method.driver_method(), endpoint, &mut request);
    let answer = send(request).instrument(call.clone()).await;
    batches(answer, call, parts)
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
    type GetMetadataAllocatedStream = Outgoing<api::GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Outgoing<api::GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<api::GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let peer = request.extensions().get::<Peer>().cloned();
        let span = server_span(Method::Allocated.traced(), request.metadata());
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
        self.serve(peer, ask, span, |b| api::GetMetadataAllocatedResponse {
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
        let peer = request.extensions().get::<Peer>().cloned();
        let span = server_span(Method::Delta.traced(), request.metadata());
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
        self.serve(peer, ask, span, |b| api::GetMetadataDeltaResponse {
            block_metadata_type: b.block_type,
            volume_capacity_bytes: b.capacity,
            block_metadata: blocks(&b),
        })
        .await
    }
}
