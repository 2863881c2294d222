//! The journal's writer: one task that owns the open entries, groups records into writes paced
//! by the journal's budget, and writes the entries whole into the journal's Secret. A fault
//! ends a write at once with its reason; while the journal is faulty, records are answered at
//! once (unjournaled) and the writer tries again after a growing pause.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::keys::KeyError;
use super::seal::Keyring;
use super::{Entries, FORGET_DELAY, Shared, Unjournaled, apply, locked, sealed, size};
use crate::cluster::client::{TokenBucket, api_message};

/// Longest wait for one request of the journal's, shorter than the client's own bound on every
/// request: records wait for the journal's answer, and a journal that gives none is reported
/// unusable and let go past.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A write that keeps failing for no clear reason (no answer, 5xx) is given up after this
/// long: its records go ahead unjournaled, and the journal is tried again later.
const UNREACHABLE_AFTER: Duration = Duration::from_secs(5);
const RETRY_START: Duration = Duration::from_millis(100);
/// Pauses between tries of a faulty journal.
const FAULTY_RETRY_START: Duration = Duration::from_secs(1);
const FAULTY_RETRY_MAX: Duration = Duration::from_secs(15);

pub(super) enum Op {
    /// Record an intent; answered once it is written or known not to be.
    Put(String, String, oneshot::Sender<()>),
    Forget(String),
    /// Write what is pending at once; answered once it is written (or cannot be).
    Flush(oneshot::Sender<()>),
    /// Write the open entries now (a missing Secret is made if the sidecar may).
    Sync,
}

/// What [`super::Journal::load`] read: the entries that opened, and the Secret's
/// resourceVersion (`None`: there is no Secret).
#[derive(Default)]
pub(super) struct Loaded {
    pub entries: Entries,
    pub resource_version: Option<String>,
}

/// How one step towards a write ended, when it did not succeed.
pub(super) enum Step {
    /// The journal cannot be written for this reason until something changes.
    Fault(Unjournaled, String),
    /// Try again (no answer, a server error).
    Transient(String),
    /// Read the Secret again, then write again at once (someone else wrote it).
    Again(String),
    /// The Secret (or on a create, its namespace) does not exist.
    NotFound(String),
}

/// An error of the journal's calls, as a [`Step`].
pub(super) trait Classify {
    fn step(self) -> Step;
}

impl Classify for kube::Error {
    fn step(self) -> Step {
        match &self {
            kube::Error::Api(status) => match status.code {
                403 => Step::Fault(Unjournaled::Forbidden, status.message.clone()),
                404 => Step::NotFound(status.message.clone()),
                409 => Step::Again(status.message.clone()),
                // An immutable Secret, one past the size limit, a bad request.
                400 | 413 | 422 => Step::Fault(Unjournaled::Unwritable, status.message.clone()),
                _ => Step::Transient(api_message(&self)),
            },
            _ => Step::Transient(api_message(&self)),
        }
    }
}

impl Classify for KeyError {
    fn step(self) -> Step {
        match self {
            KeyError::Forbidden(message) => Step::Fault(Unjournaled::Forbidden, message),
            KeyError::Random => Step::Fault(Unjournaled::Unwritable, self.to_string()),
            KeyError::Api { .. } => Step::Transient(self.to_string()),
        }
    }
}

/// `call`, answered within [`CALL_TIMEOUT`].
pub(super) async fn bounded<T, E: Classify>(
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, Step> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result.map_err(Classify::step),
        Err(_) => Err(Step::Transient(format!(
            "no answer from the API server in {CALL_TIMEOUT:?}"
        ))),
    }
}

pub(super) struct Writer {
    api: Api<Secret>,
    shared: Arc<Shared>,
    budget: Option<TokenBucket>,
    /// The open entries as text: what each write puts in the Secret, whole.
    entries: Entries,
    /// Whether the Secret's entries were read into `entries`.
    synced: bool,
    /// The Secret's resourceVersion at the last read or write; `None`: there was no Secret.
    resource_version: Option<String>,
    /// Keys the Secret held at the last read or write.
    stored: BTreeSet<String>,
    /// Those of them forgotten since: a re-read must not bring them back. A subset of
    /// `stored`, so bounded by what a Secret holds however long the journal is unusable.
    forgotten: BTreeSet<String>,
    /// While the journal is faulty: when to try again, and the pause after that.
    retry: Option<(Instant, Duration)>,
}

impl Writer {
    pub(super) fn new(api: Api<Secret>, shared: Arc<Shared>, budget: Option<TokenBucket>) -> Self {
        Self {
            api,
            shared,
            budget,
            entries: Entries::new(),
            synced: false,
            resource_version: None,
            stored: BTreeSet::new(),
            forgotten: BTreeSet::new(),
            retry: None,
        }
    }

    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        loop {
            let first = match self.retry {
                Some((at, _)) => tokio::select! {
                    op = rx.recv() => op,
                    _ = tokio::time::sleep_until(at) => Some(Op::Sync),
                },
                None => rx.recv().await,
            };
            let Some(first) = first else { return };
            let mut batch = vec![first];
            if batch.iter().all(|op| matches!(op, Op::Forget(_))) {
                // Forgetting can wait for company: under load it rides along with a record.
                gather(&mut rx, &mut batch, FORGET_DELAY).await;
            }
            if self.retry.is_none() {
                // What arrives while the write waits for its turn in the budget goes out
                // with it.
                paced(self.budget.as_ref()).await;
            }
            while let Ok(op) = rx.try_recv() {
                batch.push(op);
            }
            self.handle(batch).await;
        }
    }

    async fn handle(&mut self, batch: Vec<Op>) {
        let mut ops = Vec::with_capacity(batch.len());
        let mut waiters = Vec::new();
        let mut flushed = Vec::new();
        let mut sync = false;
        for op in batch {
            match op {
                Op::Put(key, text, done) => {
                    waiters.push((ops.len(), done));
                    ops.push((key, Some(text)));
                }
                Op::Forget(key) => ops.push((key, None)),
                Op::Flush(done) => flushed.push(done),
                Op::Sync => sync = true,
            }
        }
        if let Some(loaded) = locked(&self.shared.loaded).take() {
            for (key, text) in loaded.entries {
                self.stored.insert(key.clone());
                self.entries.entry(key).or_insert(text);
            }
            self.resource_version = loaded.resource_version;
            self.synced = true;
        }
        let refused = apply(&mut self.entries, &ops);
        for (key, value) in &ops {
            if value.is_some() {
                self.forgotten.remove(key);
            } else if self.stored.contains(key) {
                self.forgotten.insert(key.clone());
            }
        }
        let full = refused.len();
        if full > 0 {
            self.shared.report_full(full, size(&self.entries));
        }
        let written = if ops.is_empty() && !sync {
            Ok(())
        } else if let Some((at, _)) = self.retry
            && Instant::now() < at
        {
            // Faulty, and not yet time to try again: records go ahead at once.
            Err(locked(&self.shared.fault).unwrap_or(Unjournaled::Unreachable))
        } else {
            match self.write().await {
                Ok(()) => {
                    self.retry = None;
                    self.shared.usable();
                    Ok(())
                }
                Err((reason, message)) => {
                    self.shared.faulty(reason, &message);
                    let pause = self.retry.map_or(FAULTY_RETRY_START, |(_, pause)| pause);
                    self.retry = Some((Instant::now() + pause, (pause * 2).min(FAULTY_RETRY_MAX)));
                    Err(reason)
                }
            }
        };
        self.shared.unjournaled(Unjournaled::Full, full);
        if let Err(reason) = written {
            self.shared.unjournaled(reason, waiters.len() - full);
        }
        for (_, done) in waiters {
            let _ = done.send(());
        }
        for done in flushed {
            let _ = done.send(());
        }
    }

    /// Writes the open entries, trying again what may pass, until [`UNREACHABLE_AFTER`].
    async fn write(&mut self) -> Result<(), (Unjournaled, String)> {
        let started = Instant::now();
        let mut pause = RETRY_START;
        let mut attempt = 0u32;
        loop {
            // The first attempt has the token taken before the group was gathered (or is a
            // faulty journal's try, paced by its pause).
            if attempt > 0 {
                paced(self.budget.as_ref()).await;
            }
            attempt += 1;
            let message = match self.attempt().await {
                Ok(()) => return Ok(()),
                Err(Step::Fault(reason, message)) => return Err((reason, message)),
                // Read again, and write again at once the first time.
                Err(Step::Again(_)) if attempt == 1 => continue,
                Err(Step::Again(message) | Step::Transient(message) | Step::NotFound(message)) => {
                    message
                }
            };
            if started.elapsed() + pause >= UNREACHABLE_AFTER {
                return Err((Unjournaled::Unreachable, message));
            }
            tracing::debug!(error = %message, retry_in = ?pause, "cannot write the intent journal yet");
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    async fn attempt(&mut self) -> Result<(), Step> {
        let keys = bounded(self.shared.keys.keyring()).await?;
        if !self.synced {
            self.read(&keys).await?;
        }
        let location = &self.shared.location;
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(location.name.clone()),
                resource_version: self.resource_version.clone(),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(
                sealed(&self.entries, &keys, location)
                    .into_iter()
                    .map(|(key, value)| (key, ByteString(value.into_bytes())))
                    .collect(),
            ),
            ..Default::default()
        };
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
        let params = PostParams::default();
        let creating = self.resource_version.is_none();
        let result = if creating {
            bounded(self.api.create(&params, &secret)).await
        } else {
            bounded(self.api.replace(&location.name, &params, &secret)).await
        };
        match result {
            Ok(written) => {
                self.resource_version = written.metadata.resource_version;
                self.stored = self.entries.keys().cloned().collect();
                self.forgotten.clear();
                Ok(())
            }
            Err(Step::Again(message)) => {
                // Written by someone else since (or made by someone else first): read it
                // again; what it holds that this writer did not forget is kept.
                self.synced = false;
                Err(Step::Again(message))
            }
            Err(Step::Fault(Unjournaled::Forbidden, message)) if creating => {
                // Read first next time: the Secret may be shipped again meanwhile.
                self.synced = false;
                Err(Step::Fault(
                    Unjournaled::Missing,
                    format!(
                        "Secret {} does not exist and the sidecar may not create it: {message}",
                        location.name
                    ),
                ))
            }
            Err(Step::NotFound(message)) => {
                if creating {
                    // The namespace itself is missing.
                    self.synced = false;
                    return Err(Step::Fault(Unjournaled::Missing, message));
                }
                // Deleted under the writer: made again (if the sidecar may) with every open
                // entry.
                self.resource_version = None;
                Err(Step::Again(message))
            }
            Err(step) => Err(step),
        }
    }

    /// Reads the Secret into the open entries: what it holds that opens and was not forgotten
    /// is kept; what does not open is reported and left out.
    async fn read(&mut self, keys: &Keyring) -> Result<(), Step> {
        let name = &self.shared.location.name;
        let found = bounded(self.api.get_opt(name)).await?;
        self.resource_version = None;
        if let Some(secret) = found {
            self.resource_version = secret.metadata.resource_version.clone();
            let open = self.shared.open_all(keys, &secret);
            self.stored = open.keys().cloned().collect();
            self.forgotten.retain(|key| self.stored.contains(key));
            for (key, text) in open {
                if !self.forgotten.contains(&key) {
                    self.entries.entry(key).or_insert(text);
                }
            }
        }
        self.synced = true;
        Ok(())
    }
}

/// Waits for more operations to join `batch` until `wait` passes, or sooner: when a record
/// or a flush arrives.
async fn gather(rx: &mut mpsc::Receiver<Op>, batch: &mut Vec<Op>, wait: Duration) {
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            op = rx.recv() => match op {
                Some(op) => {
                    let done = !matches!(op, Op::Forget(_));
                    batch.push(op);
                    if done {
                        return;
                    }
                }
                None => return,
            },
        }
    }
}

/// Waits for the budget to allow one request.
async fn paced(budget: Option<&TokenBucket>) {
    let wait = budget.map_or(Duration::ZERO, TokenBucket::reserve);
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}
