//! Run-time scripting of the mock: injected failures, hangs, latency and
//! Probe readiness ([`Faults`]), and the record of received calls
//! ([`CallLog`]). Both are cheap handles that tests keep and change while
//! a sidecar talks to the mock.
//!
//! Methods are full gRPC paths, e.g. [`csi_proto::methods::controller::CREATE_VOLUME`].

use std::any::Any;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data stays consistent across a panic elsewhere.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which calls of a method a failure applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    /// The call with this sequence number (1 = the first call ever).
    Nth(u64),
    /// The next this many calls.
    Next(u64),
    /// Every call until cleared.
    Always,
}

#[derive(Clone, Debug)]
struct Failure {
    which: Which,
    code: Code,
    message: String,
}

#[derive(Debug, Default)]
struct Script {
    failures: HashMap<String, Vec<Failure>>,
    hung: HashSet<String>,
    latency: HashMap<String, Duration>,
    default_latency: Duration,
    not_ready: bool,
    /// Answers to replace after the call was handled: method → (count left, code).
    lost_answers: HashMap<String, (u64, Code)>,
    /// Answers to rewrite after the call was handled: method → (count left, rewrite).
    rewrites: HashMap<String, (u64, Rewrite)>,
    /// Streams to break: method → (count left, how).
    broken_streams: HashMap<String, (u64, StreamFault)>,
}

/// How a SnapshotMetadata stream (GetMetadataAllocated, GetMetadataDelta) breaks what the CSI
/// spec promises of it, for tests of a sidecar's checks on what it relays. The call is handled
/// as usual; only the messages change. Faults that act from the second message on need a
/// listing of more than `max_results` tuples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFault {
    /// The tuples in descending order: the first message holds the last blocks.
    Descending,
    /// Every tuple sent twice in a row: each repeat overlaps the tuple before it.
    Overlapping,
    /// `max_results + 1` tuples a message.
    ExceedMaxResults,
    /// `block_metadata_type` VARIABLE_LENGTH from the second message on.
    ChangeBlockType,
    /// `volume_capacity_bytes` one block larger from the second message on.
    ChangeCapacity,
    /// The first tuple replaced by the block before the one holding `starting_offset`: a
    /// range ending at or before the offset (at `byte_offset` -4096 for offsets below 4096).
    /// An empty listing becomes one message with that tuple alone.
    BeforeStartingOffset,
    /// The first message, then nothing until the client cancels (or the mock shuts down,
    /// which ends the stream with UNAVAILABLE).
    Stall,
    /// The first message, then the stream ends with this code.
    Abort(Code),
}

/// A `Box<dyn Fn(&mut Resp) + Send + Sync>` for the answer type of its method.
type Rewrite = Arc<dyn Any + Send + Sync>;

/// The rewrite of an answer of type `Resp`.
type RewriteFn<Resp> = Box<dyn Fn(&mut Resp) + Send + Sync>;

impl Script {
    /// The failure for call number `seq` of `method`, consuming one-shot
    /// rules. The oldest matching rule wins.
    fn take_failure(&mut self, method: &str, seq: u64) -> Option<Status> {
        let rules = self.failures.get_mut(method)?;
        let index = rules.iter().position(|f| match f.which {
            Which::Nth(n) => n == seq,
            Which::Next(left) => left > 0,
            Which::Always => true,
        })?;
        let failure = rules[index].clone();
        match &mut rules[index].which {
            Which::Nth(_) | Which::Next(1) => {
                rules.remove(index);
            }
            Which::Next(left) => *left -= 1,
            Which::Always => {}
        }
        Some(Status::new(failure.code, failure.message))
    }
}

/// Failure, hang, latency and readiness script of a mock driver. Clones
/// share the script; changes apply to calls that arrive afterwards (and
/// releasing a hang wakes the calls already waiting).
#[derive(Clone, Debug)]
pub struct Faults {
    script: Arc<Mutex<Script>>,
    /// Bumped on every change so hung calls re-check the script.
    changed: Arc<watch::Sender<()>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            script: Arc::default(),
            changed: Arc::new(watch::Sender::new(())),
        }
    }
}

impl Faults {
    fn edit(&self, f: impl FnOnce(&mut Script)) {
        f(&mut lock(&self.script));
        self.changed.send_replace(());
    }

    fn add_failure(&self, method: &str, which: Which, code: Code, message: impl Into<String>) {
        let failure = Failure {
            which,
            code,
            message: message.into(),
        };
        self.edit(|s| {
            s.failures
                .entry(method.to_owned())
                .or_default()
                .push(failure)
        });
    }

    /// Fails call number `n` of `method` (counted from 1 since the mock
    /// started, as [`CallLog::count`] counts) with `code`.
    pub fn fail_nth(&self, method: &str, n: u64, code: Code, message: impl Into<String>) {
        self.add_failure(method, Which::Nth(n), code, message);
    }

    /// Fails the next `k` calls of `method` with `code`.
    pub fn fail_next(&self, method: &str, k: u64, code: Code, message: impl Into<String>) {
        if k > 0 {
            self.add_failure(method, Which::Next(k), code, message);
        }
    }

    /// Fails every call of `method` with `code` until cleared. On
    /// `Probe` this is how a driver reports itself unhealthy.
    pub fn fail_always(&self, method: &str, code: Code, message: impl Into<String>) {
        self.add_failure(method, Which::Always, code, message);
    }

    /// Removes every failure rule of `method`.
    pub fn clear_failures(&self, method: &str) {
        self.edit(|s| {
            s.failures.remove(method);
        });
    }

    /// Makes calls of `method` wait without answering until
    /// [`release`](Self::release) (or until the client gives up or the mock
    /// shuts down, which answers UNAVAILABLE).
    pub fn hang(&self, method: &str) {
        self.edit(|s| {
            s.hung.insert(method.to_owned());
        });
    }

    /// Lets the hung calls of `method` and later ones through.
    pub fn release(&self, method: &str) {
        self.edit(|s| {
            s.hung.remove(method);
        });
    }

    /// Delays every call of `method` by `delay` before it is handled.
    pub fn set_latency(&self, method: &str, delay: Duration) {
        self.edit(|s| {
            s.latency.insert(method.to_owned(), delay);
        });
    }

    /// Delays calls of methods without a latency of their own.
    pub fn set_default_latency(&self, delay: Duration) {
        self.edit(|s| s.default_latency = delay);
    }

    /// The next `k` calls of `method` are handled (a CreateVolume creates its volume) but answered
    /// with `code`, as when the answer is lost on its way or the call outlived the client's
    /// deadline: what a sidecar must survive without leaking.
    pub fn lose_answers(&self, method: &str, k: u64, code: Code) {
        self.edit(|s| {
            if k == 0 {
                s.lost_answers.remove(method);
            } else {
                s.lost_answers.insert(method.to_owned(), (k, code));
            }
        });
    }

    /// The error replacing the answer of a handled call of `method`, if one is due.
    pub(crate) fn take_lost_answer(&self, method: &str) -> Option<Status> {
        let mut script = lock(&self.script);
        let (left, code) = script.lost_answers.get_mut(method)?;
        let status = Status::new(*code, "the answer was lost after the call was handled");
        *left -= 1;
        if *left == 0 {
            script.lost_answers.remove(method);
        }
        Some(status)
    }

    /// The next `k` successful answers of `method` (of answer type `Resp`, e.g.
    /// `v1::CreateVolumeResponse` for CreateVolume) are changed by `rewrite` before they are
    /// sent: the call is handled as usual, only the answer breaks the spec (an empty volume
    /// id, a negative capacity, ...). `k == 0` removes the rewrite. A `Resp` that is not the
    /// method's answer type never matches, and the answer goes out unchanged. Of a
    /// SnapshotMetadata method every streamed message is an answer.
    pub fn rewrite_answers<Resp: 'static>(
        &self,
        method: &str,
        k: u64,
        rewrite: impl Fn(&mut Resp) + Send + Sync + 'static,
    ) {
        let rewrite: RewriteFn<Resp> = Box::new(rewrite);
        let rewrite: Rewrite = Arc::new(rewrite);
        self.edit(|s| {
            if k == 0 {
                s.rewrites.remove(method);
            } else {
                s.rewrites.insert(method.to_owned(), (k, rewrite));
            }
        });
    }

    /// Applies a due rewrite of `method` to `answer`.
    pub(crate) fn rewrite_answer<Resp: 'static>(&self, method: &str, answer: &mut Resp) {
        let rewrite = {
            let mut script = lock(&self.script);
            let Some((left, rewrite)) = script.rewrites.get_mut(method) else {
                return;
            };
            let rewrite = Arc::clone(rewrite);
            *left -= 1;
            if *left == 0 {
                script.rewrites.remove(method);
            }
            rewrite
        };
        if let Some(rewrite) = rewrite.downcast_ref::<RewriteFn<Resp>>() {
            rewrite(answer);
        }
    }

    /// The next `k` streams of `method` (a SnapshotMetadata method, e.g.
    /// [`csi_proto::methods::snapshot_metadata::GET_METADATA_ALLOCATED`]) break as `fault`
    /// says; `u64::MAX` for every stream, `k == 0` removes the fault.
    pub fn break_streams(&self, method: &str, k: u64, fault: StreamFault) {
        self.edit(|s| {
            if k == 0 {
                s.broken_streams.remove(method);
            } else {
                s.broken_streams.insert(method.to_owned(), (k, fault));
            }
        });
    }

    /// The fault for a stream of `method` about to be sent, if one is due.
    pub(crate) fn take_stream_fault(&self, method: &str) -> Option<StreamFault> {
        let mut script = lock(&self.script);
        let (left, fault) = script.broken_streams.get_mut(method)?;
        let fault = *fault;
        *left -= 1;
        if *left == 0 {
            script.broken_streams.remove(method);
        }
        Some(fault)
    }

    /// Removes the latency of `method` (the default applies again).
    pub fn clear_latency(&self, method: &str) {
        self.edit(|s| {
            s.latency.remove(method);
        });
    }

    /// What Probe answers in `ready`: `true` (the default) or `false`
    /// (still initializing, which is not an error).
    pub fn set_ready(&self, ready: bool) {
        self.edit(|s| s.not_ready = !ready);
    }

    /// Whether Probe answers ready.
    pub fn is_ready(&self) -> bool {
        !lock(&self.script).not_ready
    }

    /// Back to a well-behaved driver: no failures, hangs or latency, ready.
    pub fn reset(&self) {
        self.edit(|s| *s = Script::default());
    }

    fn is_hung(&self, method: &str) -> bool {
        lock(&self.script).hung.contains(method)
    }

    fn latency(&self, method: &str) -> Duration {
        let script = lock(&self.script);
        script
            .latency
            .get(method)
            .copied()
            .unwrap_or(script.default_latency)
    }

    /// Applies the script to call number `seq` of `method` before it is
    /// handled: waits while hung, sleeps the latency, then fails if a rule
    /// says so. `shutdown` cuts waiting short.
    pub(crate) async fn gate(
        &self,
        method: &str,
        seq: u64,
        shutdown: &CancellationToken,
    ) -> Result<(), Status> {
        let stopping = || Status::unavailable("mock CSI driver is shutting down");
        // Subscribing before checking means no release is missed.
        let mut changes = self.changed.subscribe();
        while self.is_hung(method) {
            tokio::select! {
                // The sender lives in `self`, so this cannot fail.
                _ = changes.changed() => {}
                () = shutdown.cancelled() => return Err(stopping()),
            }
        }
        let delay = self.latency(method);
        if !delay.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.cancelled() => return Err(stopping()),
            }
        }
        match lock(&self.script).take_failure(method, seq) {
            Some(status) => Err(status),
            None => Ok(()),
        }
    }
}

/// One received call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Sequence number of the call among calls of its method, from 1.
    pub seq: u64,
    /// Full gRPC method path.
    pub method: String,
    /// The request as JSON with secrets stripped
    /// ([`csi_proto::redact::sanitize`]).
    pub request: String,
    /// The secrets the request carried (the `csi_secret` fields): key → [`secret_digest`] of
    /// the value. The values themselves are never kept, so that nothing printing a call can
    /// leak them; [`Call::carries_secret`] tells whether a known value arrived.
    pub secrets: BTreeMap<String, u64>,
    /// The W3C `traceparent` the call's metadata carried, if any.
    pub traceparent: Option<String>,
}

/// A fingerprint of a secret value, as [`Call::secrets`] keeps it. Stable within one process.
pub fn secret_digest(value: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

impl Call {
    /// Whether the request carried the secret `key` with exactly `value`.
    pub fn carries_secret(&self, key: &str, value: &str) -> bool {
        self.secrets.get(key) == Some(&secret_digest(value))
    }
}

/// A SnapshotMetadata call as the driver received it, read back from the [`CallLog`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataCall {
    /// Sequence number among calls of its method, from 1.
    pub seq: u64,
    /// `GET_METADATA_ALLOCATED` or `GET_METADATA_DELTA` of
    /// [`csi_proto::methods::snapshot_metadata`].
    pub method: String,
    /// GetMetadataAllocated's snapshot; empty for a delta.
    pub snapshot_id: String,
    /// GetMetadataDelta's snapshots; empty for Allocated.
    pub base_snapshot_id: String,
    pub target_snapshot_id: String,
    pub starting_offset: i64,
    pub max_results: i32,
    /// As [`Call::secrets`]: key → [`secret_digest`] of the value.
    pub secrets: BTreeMap<String, u64>,
}

impl MetadataCall {
    /// The call's fields, if it is a SnapshotMetadata call.
    fn from_call(call: &Call) -> Option<Self> {
        use csi_proto::methods::snapshot_metadata as m;
        if call.method != m::GET_METADATA_ALLOCATED && call.method != m::GET_METADATA_DELTA {
            return None;
        }
        // The log renders fields at their default as absent.
        let request: serde_json::Value = serde_json::from_str(&call.request).unwrap_or_default();
        let text = |field: &str| {
            request
                .get(field)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let number = |field: &str| {
            request
                .get(field)
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0)
        };
        Some(Self {
            seq: call.seq,
            method: call.method.clone(),
            snapshot_id: text("snapshot_id"),
            base_snapshot_id: text("base_snapshot_id"),
            target_snapshot_id: text("target_snapshot_id"),
            starting_offset: number("starting_offset"),
            max_results: i32::try_from(number("max_results")).unwrap_or(0),
            secrets: call.secrets.clone(),
        })
    }

    /// Whether the request carried the secret `key` with exactly `value`.
    pub fn carries_secret(&self, key: &str, value: &str) -> bool {
        self.secrets.get(key) == Some(&secret_digest(value))
    }
}

#[derive(Debug, Default)]
struct Log {
    counts: HashMap<String, u64>,
    entries: VecDeque<Call>,
}

/// Received calls: per-method counters since start, and the most recent
/// calls (up to `MockConfig::call_log_limit`) for assertions.
#[derive(Clone, Debug)]
pub struct CallLog {
    log: Arc<Mutex<Log>>,
    limit: usize,
    changed: Arc<watch::Sender<()>>,
}

impl CallLog {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            log: Arc::default(),
            limit,
            changed: Arc::new(watch::Sender::new(())),
        }
    }

    /// Counts a call of `method` and returns its sequence number;
    /// `request` renders the request when the log keeps entries.
    #[cfg(test)]
    pub(crate) fn record(&self, method: &str, request: impl FnOnce() -> String) -> u64 {
        self.record_with_secrets(method, None, || (request(), BTreeMap::new()))
    }

    /// [`record`](Self::record) for a request that may carry secrets: `request` renders it
    /// (secrets stripped) and lists the digests of its secrets.
    pub(crate) fn record_with_secrets(
        &self,
        method: &str,
        traceparent: Option<String>,
        request: impl FnOnce() -> (String, BTreeMap<String, u64>),
    ) -> u64 {
        let seq = {
            let mut log = lock(&self.log);
            let count = log.counts.entry(method.to_owned()).or_default();
            *count += 1;
            let seq = *count;
            if self.limit > 0 {
                if log.entries.len() == self.limit {
                    log.entries.pop_front();
                }
                let (request, secrets) = request();
                log.entries.push_back(Call {
                    seq,
                    method: method.to_owned(),
                    request,
                    secrets,
                    traceparent,
                });
            }
            seq
        };
        self.changed.send_replace(());
        seq
    }

    /// How many calls of `method` arrived since the mock started.
    pub fn count(&self, method: &str) -> u64 {
        lock(&self.log).counts.get(method).copied().unwrap_or(0)
    }

    /// Calls per method since the mock started.
    pub fn counts(&self) -> HashMap<String, u64> {
        lock(&self.log).counts.clone()
    }

    /// The kept calls, oldest first.
    pub fn entries(&self) -> Vec<Call> {
        lock(&self.log).entries.iter().cloned().collect()
    }

    /// The kept calls of `method`, oldest first.
    pub fn of(&self, method: &str) -> Vec<Call> {
        lock(&self.log)
            .entries
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// The kept SnapshotMetadata calls (both methods), oldest first.
    pub fn metadata_calls(&self) -> Vec<MetadataCall> {
        lock(&self.log)
            .entries
            .iter()
            .filter_map(MetadataCall::from_call)
            .collect()
    }

    /// Forgets the kept calls; counters go on.
    pub fn clear(&self) {
        lock(&self.log).entries.clear();
    }

    /// Waits until `method` has been called at least `n` times; false if
    /// `timeout` passes first.
    pub async fn wait_for_count(&self, method: &str, n: u64, timeout: Duration) -> bool {
        let mut changes = self.changed.subscribe();
        let reached = async {
            while self.count(method) < n {
                // The sender lives in `self`, so this cannot fail.
                let _ = changes.changed().await;
            }
        };
        tokio::time::timeout(timeout, reached).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "/csi.v1.Controller/CreateVolume";

    async fn outcome(faults: &Faults, log: &CallLog) -> Result<(), Code> {
        let seq = log.record(M, String::new);
        faults
            .gate(M, seq, &CancellationToken::new())
            .await
            .map_err(|s| s.code())
    }

    #[tokio::test]
    async fn nth_next_and_always() {
        let faults = Faults::default();
        let log = CallLog::new(10);
        faults.fail_nth(M, 2, Code::Internal, "second");
        faults.fail_next(M, 2, Code::Unavailable, "next");
        // Call 1 takes a "next" rule, call 2 the nth rule (older), call 3
        // the remaining "next", call 4 passes.
        let results = [
            outcome(&faults, &log).await,
            outcome(&faults, &log).await,
            outcome(&faults, &log).await,
            outcome(&faults, &log).await,
        ];
        assert_eq!(
            results,
            [
                Err(Code::Unavailable),
                Err(Code::Internal),
                Err(Code::Unavailable),
                Ok(())
            ]
        );
        faults.fail_always(M, Code::Aborted, "always");
        assert_eq!(outcome(&faults, &log).await, Err(Code::Aborted));
        assert_eq!(outcome(&faults, &log).await, Err(Code::Aborted));
        faults.clear_failures(M);
        assert_eq!(outcome(&faults, &log).await, Ok(()));
        assert_eq!(log.count(M), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn hang_until_released() {
        let faults = Faults::default();
        faults.hang(M);
        let mut gate = {
            let faults = faults.clone();
            tokio::spawn(async move { faults.gate(M, 1, &CancellationToken::new()).await })
        };
        // The paused clock jumps ahead once the hung call is idle.
        let waited = tokio::time::timeout(Duration::from_secs(3600), &mut gate).await;
        assert!(waited.is_err(), "a hung call answered");
        faults.release(M);
        gate.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn shutdown_ends_hangs() {
        let faults = Faults::default();
        faults.hang(M);
        let token = CancellationToken::new();
        let gate = {
            let (faults, token) = (faults.clone(), token.clone());
            tokio::spawn(async move { faults.gate(M, 1, &token).await })
        };
        token.cancel();
        let status = gate.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
    }

    #[tokio::test(start_paused = true)]
    async fn latency_per_method_and_default() {
        let faults = Faults::default();
        faults.set_default_latency(Duration::from_secs(5));
        faults.set_latency(M, Duration::from_secs(60));
        let token = CancellationToken::new();
        let start = tokio::time::Instant::now();
        faults.gate(M, 1, &token).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        faults.clear_latency(M);
        let start = tokio::time::Instant::now();
        faults.gate(M, 2, &token).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[test]
    fn readiness_and_reset() {
        let faults = Faults::default();
        assert!(faults.is_ready());
        faults.set_ready(false);
        assert!(!faults.is_ready());
        faults.reset();
        assert!(faults.is_ready());
    }

    #[tokio::test]
    async fn log_keeps_the_most_recent_calls() {
        let log = CallLog::new(2);
        for i in 0..3 {
            log.record(M, || format!("{{\"n\":{i}}}"));
        }
        log.record("/csi.v1.Identity/Probe", || "{}".into());
        assert_eq!(log.count(M), 3);
        let entries = log.entries();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].request, "{\"n\":2}");
        assert_eq!(log.of(M).len(), 1);
        assert!(log.wait_for_count(M, 3, Duration::from_secs(5)).await);
        assert!(!log.wait_for_count(M, 4, Duration::from_millis(10)).await);
        log.clear();
        assert!(log.entries().is_empty());
        assert_eq!(log.count(M), 3);
    }

    #[test]
    fn empty_log_renders_nothing() {
        let log = CallLog::new(0);
        log.record(M, || unreachable!("requests are not rendered"));
        assert_eq!(log.count(M), 1);
        assert!(log.entries().is_empty());
    }
}
