//! The intent journal: before a sidecar asks the driver to create something (a volume, a
//! snapshot), it records what it is about to ask durably in a ConfigMap in its own namespace.
//! After a restart or a change of leader, every recorded intent is driven to a final state (the
//! object that names the result written, or the result deleted when nothing will name it) and
//! only then forgotten — so a kill in the middle of a create call never leaks what the driver
//! made. What an intent holds is the sidecar's own (any serde type); this module keeps them.
//!
//! Records are written in groups paced by the journal's budget: a record goes out at once when
//! the budget allows a write; otherwise it waits for the next write the budget allows, together
//! with every record that arrives meanwhile, so a burst costs a few writes, not one per volume,
//! and no record waits longer than the budget makes it. Forgetting alone does not trigger a
//! write at once; it rides along with the next record, or goes out after [`FORGET_DELAY`].
//!
//! Whoever may write ConfigMaps in the namespace may write the journal too, so every entry is
//! sealed ([`seal`]) with a key kept in a Secret only the sidecar's ServiceAccount reads
//! ([`keys`]): an entry that does not open, does not decode or has a key of the wrong form is
//! dropped with a Warning Event on the ConfigMap and counted in
//! `csi_sidecar_journal_entries_dropped_total`, never acted on.
//!
//! Without RBAC for the ConfigMap or the key Secret the journal turns itself off with one
//! warning, and the sidecar works as upstream's does.

pub mod keys;
pub mod seal;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::cluster::client::TokenBucket;
use crate::cluster::events::{EventType, Recorder};
use keys::{KeyError, KeyStore};
use seal::{Keyring, Place, Unsealed};

/// The journal's own request budget. Its writes gate create calls, so they must not wait
/// behind the sidecar's writes under `--kube-api-qps`, nor take tokens from them: that would
/// slow the sidecar below upstream's, which has no journal. The writer paces itself by it
/// (its client has no limit of its own): a record waits for the next write the budget allows,
/// half the interval between writes on average, so the budget follows the sidecar's own
/// ([`qps_for`]): at the default 5 QPS a burst costs about one ConfigMap write a second; at
/// 100 QPS with 100 workers, ten (one write a second held every worker about a second per
/// claim: provisioning measured at 46 claims/s where the PV writes allow 100).
pub const MIN_QPS: f64 = 1.0;
pub const MAX_QPS: f64 = 20.0;
/// Writes at once after a quiet time: the first intents of a burst are not held back.
pub const BURST: u32 = 4;

/// How the journal reaches the API server: a client that waits for no rate limit, and the
/// writes a second the journal allows itself ([`qps_for`]).
#[derive(Clone)]
pub struct JournalClient {
    pub client: kube::Client,
    pub qps: f64,
}

/// The journal's writes a second for a sidecar whose work may make `kube_api_qps` requests a
/// second (negative: unlimited; zero: client-go's default 5): a tenth of that, from
/// [`MIN_QPS`] to [`MAX_QPS`].
pub fn qps_for(kube_api_qps: f64) -> f64 {
    if kube_api_qps < 0.0 || !kube_api_qps.is_finite() {
        return MAX_QPS;
    }
    let work = if kube_api_qps == 0.0 {
        5.0
    } else {
        kube_api_qps
    };
    (work / 10.0).clamp(MIN_QPS, MAX_QPS)
}
/// How long a lone "forget" waits for company before it is written.
pub const FORGET_DELAY: Duration = Duration::from_secs(2);
/// Above this size of recorded intents, new ones wait for space (a ConfigMap holds 1 MiB).
pub const MAX_BYTES: usize = 900 * 1024;
const RETRY_START: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Longest wait for the last write of a sidecar that stops.
pub const FLUSH_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    #[error("the intent journal is full ({0} bytes recorded)")]
    Full(usize),
    #[error("the intent journal writer stopped")]
    Stopped,
    #[error("cannot read the intent journal: {0}")]
    Read(String),
    #[error("cannot read the intent journal's key: {0}")]
    Key(String),
}

/// The journal's data: key (a claim or content UID) → intent as JSON.
pub type Entries = BTreeMap<String, String>;

/// Where the journal lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub namespace: String,
    pub name: String,
    /// The Secret that holds the keys the entries are sealed with.
    pub key_secret: String,
}

impl Location {
    /// The journal's ConfigMap, as the Events about its entries name it.
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            ..Default::default()
        }
    }

    /// Where entry `key` of this journal lives, as its seal names it.
    pub fn place<'a>(&'a self, key: &'a str) -> Place<'a> {
        Place {
            namespace: &self.namespace,
            journal: &self.name,
            key,
        }
    }
}

/// Reason of the Warning Event about a journal entry that is dropped unread: it is not what the
/// sidecar records (a forgery, or written by another version or configuration).
pub const REJECTED_REASON: &str = "JournalEntryRejected";

/// Why an entry is dropped, as the dropped-entries metric counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Its text is not an intent of the sidecar's.
    Undecodable,
    /// An intent of another kind than its key says.
    WrongKind,
    /// Not sealed, or sealed with a key the sidecar does not have.
    Unverifiable,
    /// Its seal does not match, or its key is not of the form the sidecar records.
    Forged,
    /// Genuine, but not what the objects it is for ask for now.
    Mismatch,
}

impl DropReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::Undecodable => "undecodable",
            Self::WrongKind => "wrong_kind",
            Self::Unverifiable => "unverifiable",
            Self::Forged => "forged",
            Self::Mismatch => "mismatch",
        }
    }
}

impl From<&Unsealed> for DropReason {
    fn from(why: &Unsealed) -> Self {
        match why {
            Unsealed::Unsigned | Unsealed::UnknownKey(_) => Self::Unverifiable,
            Unsealed::Forged => Self::Forged,
        }
    }
}

/// `csi_sidecar_journal_entries_dropped_total{journal, reason}`: one process-wide counter,
/// registered once and shared by every journal of the process.
#[derive(Clone, Debug)]
pub struct JournalMetrics {
    dropped: prometheus::IntCounterVec,
}

impl JournalMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let dropped = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "csi_sidecar_journal_entries_dropped_total",
                "Intent journal entries dropped without being acted on, by journal (ConfigMap name) and reason (undecodable, wrong_kind, unverifiable, forged, mismatch)",
            ),
            &["journal", "reason"],
        )?;
        registry.register(Box::new(dropped.clone()))?;
        Ok(Self { dropped })
    }

    /// The count of `journal`'s entries dropped for `reason`.
    pub fn dropped(&self, journal: &str, reason: DropReason) -> u64 {
        self.dropped
            .with_label_values(&[journal, reason.label()])
            .get()
    }
}

/// Where a journal reports the entries it drops.
#[derive(Clone)]
pub struct Reporting {
    pub events: Recorder,
    pub metrics: Option<JournalMetrics>,
}

/// The longest object name the API server accepts (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The journal's name for a Lease name: `<lease>-journal`, or with distributed provisioning
/// `<lease>-journal-<node>`. Each node's sidecar talks to the driver of its own node, so it
/// must take up only the intents it recorded itself: one journal per node. A name past the
/// API's limit keeps its start and ends with a hash of the node name, so it stays the same
/// across restarts and differs between nodes.
pub fn journal_name(lease: &str, node: Option<&str>) -> String {
    let Some(node) = node else {
        return format!("{lease}-journal");
    };
    let name = format!("{lease}-journal-{node}");
    if name.len() <= MAX_NAME {
        return name;
    }
    let hash = crate::values::names::fnv32a(node);
    let keep = MAX_NAME - hash.len() - 1;
    // Node and Lease names are ASCII, so any byte offset is a character boundary.
    let start = name
        .get(..keep)
        .unwrap_or(&name)
        .trim_end_matches(['-', '.']);
    format!("{start}-{hash}")
}

enum Op {
    Put(String, String, oneshot::Sender<Result<(), JournalError>>),
    Forget(String),
    /// Write what is pending at once; answered once it is written (or cannot be).
    Flush(oneshot::Sender<()>),
}

/// What a sidecar's journal says when it must turn itself off, and the form of its keys.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    /// Who keeps the journal, as logs name it: "the provisioner".
    pub sidecar: &'static str,
    /// What can happen without it: "a restart during a CreateVolume may then leak a volume".
    pub risk: &'static str,
    /// Whether a key has the form this sidecar records (a claim's UID, a content's name).
    pub key_form: fn(&str) -> bool,
    /// The form, as a dropped entry's Event names it: "a claim UID".
    pub key_form_name: &'static str,
}

impl Owner {
    fn warn_off(&self, message: &str) {
        tracing::warn!(error = %message, "{} cannot use its intent journal (it needs its namespace to exist, and RBAC: configmaps get, create, update and its key Secret get, create, update there); {}, as upstream's can", self.sidecar, self.risk);
    }
}

/// What the journal's handles and its writer share.
struct Shared {
    location: Location,
    owner: Owner,
    keys: KeyStore,
    reporting: Reporting,
    disabled: AtomicBool,
    writes: AtomicU64,
    /// The ConfigMap as [`Journal::load`] read it, for the writer's first write: the first
    /// intent then costs its write alone, not two reads before it.
    loaded: std::sync::Mutex<Option<ConfigMap>>,
}

impl Shared {
    fn turn_off(&self, message: &str) {
        if !self.disabled.swap(true, Ordering::Relaxed) {
            self.owner.warn_off(message);
        }
    }

    /// Says that entry `key` is dropped unread: a log line, a Warning Event on the journal and
    /// the metric. `why` never quotes what a dropped entry says, only why it is dropped.
    fn report_dropped(&self, key: &str, reason: DropReason, why: &str) {
        // A forged key is any string the ConfigMap's data allows: quoted, and cut short.
        let key: String = key.chars().take(64).collect();
        tracing::warn!(%key, reason = reason.label(), why, "dropping an intent journal entry; nothing is asked of the driver for it");
        self.reporting.events.record(
            self.location.object_ref(),
            EventType::Warning,
            REJECTED_REASON,
            &format!(
                "Dropped intent journal entry {key:?} ({}): {why}; nothing was asked of the driver for it",
                reason.label()
            ),
        );
        if let Some(metrics) = &self.reporting.metrics {
            metrics
                .dropped
                .with_label_values(&[&self.location.name, reason.label()])
                .inc();
        }
    }

    /// Why `key` is not one of this journal's keys, if it is not.
    fn bad_key(&self, key: &str) -> Option<String> {
        (!(self.owner.key_form)(key))
            .then(|| format!("its key is not {}", self.owner.key_form_name))
    }
}

/// Entry `key` of the journal at `location` as `keys` open it: its intent, or why it is
/// dropped. Its key must have `owner`'s form.
pub fn read_entry<T: DeserializeOwned>(
    keys: &Keyring,
    location: &Location,
    owner: &Owner,
    key: &str,
    value: &str,
) -> Result<T, (DropReason, String)> {
    let text = seal::open(keys, location.place(key), value)
        .map_err(|why| (DropReason::from(&why), why.to_string()))?;
    if !(owner.key_form)(key) {
        return Err((
            DropReason::Forged,
            format!("its key is not {}", owner.key_form_name),
        ));
    }
    serde_json::from_str(text).map_err(|err| {
        (
            DropReason::Undecodable,
            format!("it is not an intent this version records: {err}"),
        )
    })
}

/// A handle on the journal writer. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: Option<mpsc::UnboundedSender<Op>>,
    api: Option<Api<ConfigMap>>,
    shared: Option<Arc<Shared>>,
}

impl Journal {
    /// A journal that records nothing (upstream's behaviour).
    pub fn off() -> Self {
        Self {
            tx: None,
            api: None,
            shared: None,
        }
    }

    /// Starts the writer for the journal at `location`, sealing with the keys of
    /// `location.key_secret` and reporting the entries it drops to `reporting`.
    pub fn start(
        access: JournalClient,
        location: Location,
        owner: Owner,
        reporting: Reporting,
    ) -> Self {
        let JournalClient { client, qps } = access;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &location.namespace);
        let secrets: Api<Secret> = Api::namespaced(client, &location.namespace);
        let shared = Arc::new(Shared {
            keys: KeyStore::new(secrets, location.key_secret.clone()),
            location,
            owner,
            reporting,
            disabled: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            loaded: std::sync::Mutex::new(None),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = TokenBucket::new(qps.max(MIN_QPS), BURST);
        tokio::spawn(write_loop(api.clone(), shared.clone(), budget, rx));
        Self {
            tx: Some(tx),
            api: Some(api),
            shared: Some(shared),
        }
    }

    pub fn enabled(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|shared| !shared.disabled.load(Ordering::Relaxed))
    }

    /// Writes to the API server so far.
    pub fn writes(&self) -> u64 {
        self.shared
            .as_ref()
            .map_or(0, |shared| shared.writes.load(Ordering::Relaxed))
    }

    /// The recorded intents, read at the start of leadership: those that open with the
    /// sidecar's keys, have a key of its form and decode. Every other entry is dropped and
    /// reported. The ConfigMap and the keys read here are the writer's for its first write.
    pub async fn load<T: DeserializeOwned>(&self) -> Result<Vec<(String, T)>, JournalError> {
        let (Some(api), Some(shared)) = (&self.api, &self.shared) else {
            return Ok(Vec::new());
        };
        let object = match api.get_opt(&shared.location.name).await {
            Ok(found) => found.unwrap_or_else(|| empty(&shared.location.name)),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                shared.turn_off(&status.message);
                return Ok(Vec::new());
            }
            Err(err) => return Err(JournalError::Read(err.to_string())),
        };
        let entries = object.data.clone().unwrap_or_default();
        *shared.loaded.lock().unwrap_or_else(|e| e.into_inner()) = Some(object);
        let keys = match shared.keys.keyring().await {
            Ok(keys) => keys,
            Err(KeyError::Forbidden(message)) => {
                shared.turn_off(&message);
                return Ok(Vec::new());
            }
            // Nothing to open: the first record reads the keys again.
            Err(err) if entries.is_empty() => {
                tracing::debug!(error = %err, "cannot read the intent journal's key yet");
                return Ok(Vec::new());
            }
            Err(err) => return Err(JournalError::Key(err.to_string())),
        };
        let mut good = Vec::new();
        for (key, value) in &entries {
            match read_entry(&keys, &shared.location, &shared.owner, key, value) {
                Ok(intent) => good.push((key.clone(), intent)),
                Err((reason, why)) => self.drop_entry(key, reason, &why),
            }
        }
        Ok(good)
    }

    /// Drops entry `key` without acting on it, saying why in a log line, a Warning Event on
    /// the journal and the dropped-entries metric.
    pub fn drop_entry(&self, key: &str, reason: DropReason, why: &str) {
        if let Some(shared) = &self.shared {
            shared.report_dropped(key, reason, why);
        }
        self.forget(key);
    }

    /// Records an intent; returns once it is durable (or the journal is off).
    pub async fn record<T: Serialize>(&self, key: &str, intent: &T) -> Result<(), JournalError> {
        let (Some(tx), Some(shared)) = (&self.tx, &self.shared) else {
            return Ok(());
        };
        if !self.enabled() {
            return Ok(());
        }
        if let Some(why) = shared.bad_key(key) {
            tracing::error!(%key, "not recording an intent: {why}");
            return Err(JournalError::Stopped);
        }
        let text = serde_json::to_string(intent).map_err(|_| JournalError::Stopped)?;
        let (done_tx, done_rx) = oneshot::channel();
        tx.send(Op::Put(key.to_string(), text, done_tx))
            .map_err(|_| JournalError::Stopped)?;
        // The write itself is made for a group of intents by the journal's own task: in a
        // trace, the wait for it.
        let waiting = if crate::telemetry::enabled() {
            tracing::info_span!("journal write")
        } else {
            tracing::Span::none()
        };
        done_rx
            .instrument(waiting)
            .await
            .map_err(|_| JournalError::Stopped)?
    }

    /// Forgets an intent (written with the next group).
    pub fn forget(&self, key: &str) {
        if let Some(tx) = &self.tx
            && self.enabled()
        {
            let _ = tx.send(Op::Forget(key.to_string()));
        }
    }

    /// Writes what is pending (the forgets that wait for company) at once, waiting at most
    /// [`FLUSH_WAIT`]: a sidecar that stops leaves no finished intent for the next leader.
    pub async fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        if !self.enabled() {
            return;
        }
        let (done_tx, done_rx) = oneshot::channel();
        if tx.send(Op::Flush(done_tx)).is_err() {
            return;
        }
        if tokio::time::timeout(FLUSH_WAIT, done_rx).await.is_err() {
            tracing::warn!(waited = ?FLUSH_WAIT, "the intent journal's last write did not finish; the next leader reads the finished intents and drops them");
        }
    }
}

/// The journal's ConfigMap before its first write.
fn empty(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Applies a group of operations to the entries; returns the indexes of the puts refused for
/// lack of space (their senders are answered by the caller).
fn apply(entries: &mut Entries, ops: &[(String, Option<String>)]) -> Vec<usize> {
    let mut refused = Vec::new();
    let mut size: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
    for (i, (uid, value)) in ops.iter().enumerate() {
        match value {
            Some(text) => {
                let old = entries.get(uid).map_or(0, |v| uid.len() + v.len());
                let new = uid.len() + text.len();
                if size - old + new > MAX_BYTES {
                    refused.push(i);
                    continue;
                }
                size = size - old + new;
                entries.insert(uid.clone(), text.clone());
            }
            None => {
                if let Some(v) = entries.remove(uid) {
                    size -= uid.len() + v.len();
                }
            }
        }
    }
    refused
}

/// Seals again with the current key what an earlier key sealed, and takes out what does not
/// open: nothing the sidecar did not write is carried over by its own writes. Returns what
/// was taken out, and why.
fn reseal(entries: &mut Entries, keys: &Keyring, location: &Location) -> Vec<(String, Unsealed)> {
    let mut dropped = Vec::new();
    entries.retain(|key, value| {
        let place = location.place(key);
        match seal::open(keys, place, value) {
            Ok(text) => {
                if seal::key_id(value) != Some(keys.current.id()) {
                    *value = seal::seal(&keys.current, place, text);
                }
                true
            }
            Err(why) => {
                dropped.push((key.clone(), why));
                false
            }
        }
    });
    dropped
}

/// Waits for more operations to join `batch` until `wait` passes, or sooner: when one
/// arrives for which `enough` holds, or a flush.
async fn gather(
    rx: &mut mpsc::UnboundedReceiver<Op>,
    batch: &mut Vec<Op>,
    wait: Duration,
    enough: fn(&Op) -> bool,
) {
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            op = rx.recv() => match op {
                Some(op) => {
                    let done = enough(&op) || matches!(op, Op::Flush(_));
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

async fn read_paced(
    api: &Api<ConfigMap>,
    name: &str,
    budget: Option<&TokenBucket>,
) -> Result<Option<ConfigMap>, kube::Error> {
    paced(budget).await;
    api.get_opt(name).await
}

async fn write_loop(
    api: Api<ConfigMap>,
    shared: Arc<Shared>,
    budget: Option<TokenBucket>,
    mut rx: mpsc::UnboundedReceiver<Op>,
) {
    let name = shared.location.name.clone();
    let mut cached: Option<ConfigMap> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        if batch.iter().all(|op| matches!(op, Op::Forget(_))) {
            // Forgetting can wait for company: under load it rides along with a record.
            gather(&mut rx, &mut batch, FORGET_DELAY, |op| {
                matches!(op, Op::Put(..))
            })
            .await;
        }
        // What arrives while the write waits for its turn in the budget goes out with it.
        paced(budget.as_ref()).await;
        while let Ok(op) = rx.try_recv() {
            batch.push(op);
        }
        let mut ops = Vec::with_capacity(batch.len());
        let mut waiters = Vec::new();
        let mut flushed = Vec::new();
        for op in batch {
            match op {
                Op::Put(uid, text, done) => {
                    waiters.push((ops.len(), done));
                    ops.push((uid, Some(text)));
                }
                Op::Forget(uid) => ops.push((uid, None)),
                Op::Flush(done) => flushed.push(done),
            }
        }
        if ops.is_empty() || shared.disabled.load(Ordering::Relaxed) {
            for (_, done) in waiters {
                let _ = done.send(Ok(()));
            }
            continue;
        }
        if let Some(loaded) = shared
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            cached = Some(loaded);
        }
        let mut delay = RETRY_START;
        let mut attempt = 0u32;
        let outcome = loop {
            let keys = match shared.keys.keyring().await {
                Ok(keys) => keys,
                Err(KeyError::Forbidden(message)) => break Err(message),
                Err(err) => {
                    tracing::warn!(error = %err, retry_in = ?delay, "cannot read the intent journal's key");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                    continue;
                }
            };
            let mut object = match cached.take() {
                Some(object) => object,
                None => match read_paced(&api, &name, budget.as_ref()).await {
                    Ok(Some(object)) => object,
                    Ok(None) => empty(&name),
                    Err(kube::Error::Api(status)) if status.code == 403 => {
                        break Err(status.message);
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, retry_in = ?delay, "cannot read the intent journal");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(RETRY_MAX);
                        continue;
                    }
                },
            };
            let entries = object.data.get_or_insert_default();
            let sealed: Vec<(String, Option<String>)> = ops
                .iter()
                .map(|(key, text)| {
                    let value = text
                        .as_ref()
                        .map(|text| seal::seal(&keys.current, shared.location.place(key), text));
                    (key.clone(), value)
                })
                .collect();
            let refused = apply(entries, &sealed);
            // After the group: what it forgets (entries dropped at load among them) is gone,
            // not reported again.
            let dropped = reseal(entries, &keys, &shared.location);
            let size = entries
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
            let creating = object.metadata.resource_version.is_none();
            // The first attempt has the token taken before the group was gathered.
            if attempt > 0 {
                paced(budget.as_ref()).await;
            }
            attempt += 1;
            let result = if creating {
                api.create(&PostParams::default(), &object).await
            } else {
                api.replace(&name, &PostParams::default(), &object).await
            };
            shared.writes.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(written) => {
                    cached = Some(written);
                    break Ok((refused, size, dropped));
                }
                Err(kube::Error::Api(status)) if status.code == 403 => break Err(status.message),
                // A create answered 404: the namespace itself is missing.
                Err(kube::Error::Api(status)) if creating && status.code == 404 => {
                    break Err(status.message);
                }
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {
                    // Someone else wrote it (or it was deleted): read it again and redo, at
                    // once the first time, after a growing pause if it keeps happening.
                    if delay > RETRY_START {
                        tokio::time::sleep(delay).await;
                    }
                    delay = (delay * 2).min(RETRY_MAX);
                    continue;
                }
                Err(err) => {
                    tracing::warn!(error = %err, retry_in = ?delay, "cannot write the intent journal");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        };
        match outcome {
            Ok((refused, size, dropped)) => {
                for (key, why) in dropped {
                    shared.report_dropped(&key, (&why).into(), &why.to_string());
                }
                for (index, done) in waiters {
                    let answer = if refused.contains(&index) {
                        Err(JournalError::Full(size))
                    } else {
                        Ok(())
                    };
                    let _ = done.send(answer);
                }
            }
            Err(message) => {
                shared.turn_off(&message);
                for (_, done) in waiters {
                    let _ = done.send(Ok(()));
                }
            }
        }
        // Dropping the senders answers the flushes.
        drop(flushed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journals_budget_is_a_tenth_of_the_works_within_bounds() {
        assert_eq!(qps_for(5.0), 1.0);
        assert_eq!(qps_for(0.0), 1.0, "client-go's default 5");
        assert_eq!(qps_for(100.0), 10.0);
        assert_eq!(qps_for(1000.0), 20.0);
        assert_eq!(qps_for(-1.0), 20.0, "unlimited work");
        assert_eq!(qps_for(f64::NAN), 20.0);
    }

    #[test]
    fn each_node_has_a_journal_of_its_own() {
        assert_eq!(
            journal_name("hostpath-csi-k8s-io", None),
            "hostpath-csi-k8s-io-journal"
        );
        assert_eq!(
            journal_name("hostpath-csi-k8s-io", Some("worker-1.example.com")),
            "hostpath-csi-k8s-io-journal-worker-1.example.com"
        );
        // Node names may be 253 characters long: the journal's name stays a valid object name,
        // stable, and distinct for nodes that differ only at the end.
        let long = |last: char| format!("{}{last}", "n".repeat(252));
        let first = journal_name("hostpath-csi-k8s-io", Some(&long('a')));
        let second = journal_name("hostpath-csi-k8s-io", Some(&long('b')));
        assert_eq!(first.len(), MAX_NAME);
        assert!(first.starts_with("hostpath-csi-k8s-io-journal-nnn"));
        assert_ne!(first, second);
        assert_eq!(first, journal_name("hostpath-csi-k8s-io", Some(&long('a'))));
        // A cut that ends in a separator does not leave two of them next to each other.
        let dotted = format!("{}.{}", "n".repeat(215), "m".repeat(37));
        let name = journal_name("hostpath-csi-k8s-io", Some(&dotted));
        assert!(!name.contains(".-") && !name.contains("--"), "{name}");
    }

    #[test]
    fn groups_apply_in_order_and_respect_the_size_limit() {
        let mut entries = Entries::new();
        let ops = vec![
            ("a".to_string(), Some("1".to_string())),
            ("b".to_string(), Some("2".to_string())),
            ("a".to_string(), None),
        ];
        assert!(apply(&mut entries, &ops).is_empty());
        assert_eq!(entries, Entries::from([("b".to_string(), "2".to_string())]));
        let big = "x".repeat(MAX_BYTES);
        let refused = apply(&mut entries, &[("c".to_string(), Some(big))]);
        assert_eq!(refused, vec![0]);
        assert!(!entries.contains_key("c"));
    }

    #[test]
    fn a_write_reseals_what_an_earlier_key_sealed_and_takes_out_what_does_not_open() {
        let key = |b: u8| seal::Key::from_bytes(&[b; seal::KEY_LEN]).unwrap();
        let location = Location {
            namespace: "csi".into(),
            name: "j".into(),
            key_secret: "j-key".into(),
        };
        let keys = Keyring {
            current: key(1),
            previous: Some(key(2)),
        };
        let mut entries = Entries::from([
            (
                "old".to_string(),
                seal::seal(&key(2), location.place("old"), "{}"),
            ),
            (
                "new".to_string(),
                seal::seal(&key(1), location.place("new"), "{}"),
            ),
            (
                "moved".to_string(),
                seal::seal(&key(1), location.place("new"), "{}"),
            ),
            (
                "gone".to_string(),
                seal::seal(&key(3), location.place("gone"), "{}"),
            ),
            ("plain".to_string(), "{}".to_string()),
        ]);
        let mut dropped = reseal(&mut entries, &keys, &location);
        dropped.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            dropped,
            vec![
                (
                    "gone".to_string(),
                    Unsealed::UnknownKey(key(3).id().to_string())
                ),
                ("moved".to_string(), Unsealed::Forged),
                ("plain".to_string(), Unsealed::Unsigned),
            ]
        );
        assert_eq!(entries.len(), 2);
        for (name, value) in &entries {
            assert_eq!(seal::key_id(value), Some(key(1).id()), "{name}");
            assert_eq!(seal::open(&keys, location.place(name), value), Ok("{}"));
        }
    }
}
