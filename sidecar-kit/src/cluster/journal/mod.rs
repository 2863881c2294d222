//! The intent journal: before a sidecar asks the driver to create something (a volume, a
//! snapshot), it records what it is about to ask durably in a Secret in its own namespace.
//! After a restart or a change of leader, every recorded intent is driven to a final state (the
//! object that names the result written, or the result deleted when nothing will name it) and
//! only then forgotten — so a kill in the middle of a create call never leaks what the driver
//! made. What an intent holds is the sidecar's own (any serde type); this module keeps them.
//!
//! The journal is a Secret (`<lease>-journal`) that the manifests ship empty and that only the
//! sidecar's ServiceAccount may `get` and `update`: whoever may read, watch and write ConfigMaps
//! (most workloads granted anything in a driver's namespace) can neither replay a genuine entry,
//! nor switch the journal off, nor stall the sidecar with it. Entries are still sealed
//! ([`seal`]) with a key kept in a second Secret ([`keys`]), so that an entry moved to another
//! key or journal does not open. An entry that does not open, does not decode or has a key of
//! the wrong form is dropped with a Warning Event and counted in
//! `csi_sidecar_journal_entries_dropped_total`, never acted on. Entries found in the ConfigMap
//! journal of earlier versions are reported (reason `legacy`), never acted on: any ConfigMap
//! writer could have put them there.
//!
//! The writer keeps the open entries in memory and writes them whole, so a write that finds the
//! object gone, replaced or changed under it loses none of them. Records are written in groups
//! paced by the journal's budget: a record goes out at once when the budget allows a write;
//! otherwise it waits for the next write the budget allows, together with every record that
//! arrives meanwhile. Forgetting alone does not trigger a write at once; it rides along with the
//! next record, or goes out after [`FORGET_DELAY`].
//!
//! A journal that cannot be written (its Secret missing, forbidden, immutable, full or the API
//! server unreachable) never stalls the sidecar and never turns itself off for good: a Warning
//! Event on the sidecar's Lease and `csi_sidecar_journal_usable` say so, each record goes ahead
//! unjournaled at once (counted in `csi_sidecar_journal_unjournaled_total`), as upstream's
//! sidecar works, and the writer tries again with a growing pause until the journal is usable.

pub mod keys;
pub mod seal;
mod writer;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::api::Api;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::cluster::client::TokenBucket;
use crate::cluster::events::{EventType, Recorder};
use keys::KeyStore;
use seal::{Keyring, Place, Unsealed};

/// The journal's own request budget. Its writes gate create calls, so they must not wait
/// behind the sidecar's writes under `--kube-api-qps`, nor take tokens from them: that would
/// slow the sidecar below upstream's, which has no journal. The writer paces itself by it
/// (its client has no limit of its own): a record waits for the next write the budget allows,
/// half the interval between writes on average, so the budget follows the sidecar's own
/// ([`qps_for`]): at the default 5 QPS a burst costs about one journal write a second; at
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
/// Above this size of recorded intents (keys and sealed values), new ones go ahead unjournaled
/// (a Secret holds 1 MiB).
pub const MAX_BYTES: usize = 900 * 1024;
/// Operations waiting for the writer at most: past that a record goes ahead unjournaled and a
/// forget is left for the next leader, which finds its intent done.
pub const QUEUE: usize = 1024;
/// Longest wait for the last write of a sidecar that stops.
pub const FLUSH_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    #[error("the intent journal writer stopped")]
    Stopped,
    #[error("cannot read the intent journal: {0}")]
    Read(String),
    #[error("not recording an intent: {0}")]
    BadKey(String),
}

/// The journal's data: key (a claim or content UID) → intent as JSON.
pub type Entries = BTreeMap<String, String>;

/// Where the journal lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub namespace: String,
    /// The journal's Secret (and the name of the ConfigMap journal of earlier versions).
    pub name: String,
    /// The Secret that holds the keys the entries are sealed with.
    pub key_secret: String,
    /// The sidecar's Lease, which the Events about an unusable journal name.
    pub lease: String,
}

impl Location {
    /// The journal's Secret, as the Events about its entries name it.
    pub fn object_ref(&self) -> ObjectReference {
        self.reference("v1", "Secret", &self.name)
    }

    /// The ConfigMap journal of earlier versions, whose entries are reported, never acted on.
    pub fn legacy_ref(&self) -> ObjectReference {
        self.reference("v1", "ConfigMap", &self.name)
    }

    /// The sidecar's Lease, as the Events about an unusable journal name it.
    pub fn lease_ref(&self) -> ObjectReference {
        self.reference("coordination.k8s.io/v1", "Lease", &self.lease)
    }

    fn reference(&self, api_version: &str, kind: &str, name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            namespace: Some(self.namespace.clone()),
            name: Some(name.to_string()),
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
/// Reason of the Warning Event on the Lease when the journal cannot be written.
pub const UNUSABLE_REASON: &str = "JournalUnusable";
/// Reason of the Normal Event on the Lease when it can again.
pub const USABLE_REASON: &str = "JournalUsable";

/// Why an entry is dropped, as the dropped-entries metric counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Its text is not an intent of the sidecar's.
    Undecodable,
    /// An intent of another kind than its key says.
    WrongKind,
    /// Sealed with a key the sidecar no longer has (rotated out twice, or the key Secret was
    /// replaced).
    Unverifiable,
    /// Not sealed, its seal does not match, or its key is not of the form the sidecar records.
    Forged,
    /// Genuine, but not what the objects it is for ask for now.
    Mismatch,
    /// Found in the ConfigMap journal of an earlier version, which any ConfigMap writer could
    /// have written or replayed.
    Legacy,
}

impl DropReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::Undecodable => "undecodable",
            Self::WrongKind => "wrong_kind",
            Self::Unverifiable => "unverifiable",
            Self::Forged => "forged",
            Self::Mismatch => "mismatch",
            Self::Legacy => "legacy",
        }
    }
}

impl From<&Unsealed> for DropReason {
    fn from(why: &Unsealed) -> Self {
        match why {
            // Only the sidecar's account may write the journal's Secret, and it seals
            // everything it writes.
            Unsealed::Unsigned | Unsealed::Forged => Self::Forged,
            Unsealed::UnknownKey(_) => Self::Unverifiable,
        }
    }
}

/// Why a record went ahead without being journaled, as
/// `csi_sidecar_journal_unjournaled_total` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unjournaled {
    /// The journal's Secret does not exist and the sidecar may not create it.
    Missing,
    /// The sidecar may not read or write the journal or its key.
    Forbidden,
    /// The API server refuses the write (an immutable Secret, one past its size limit).
    Unwritable,
    /// The API server did not answer in time.
    Unreachable,
    /// The open intents fill the journal.
    Full,
    /// More records wait for the writer than it queues.
    Queue,
}

impl Unjournaled {
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Forbidden => "forbidden",
            Self::Unwritable => "unwritable",
            Self::Unreachable => "unreachable",
            Self::Full => "full",
            Self::Queue => "queue_full",
        }
    }
}

/// The journal's metrics: one process-wide set, registered once and shared by every journal of
/// the process.
#[derive(Clone, Debug)]
pub struct JournalMetrics {
    dropped: prometheus::IntCounterVec,
    unjournaled: prometheus::IntCounterVec,
    usable: prometheus::IntGaugeVec,
}

impl JournalMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let dropped = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "csi_sidecar_journal_entries_dropped_total",
                "Intent journal entries dropped without being acted on, by journal and reason (undecodable, wrong_kind, unverifiable, forged, mismatch, legacy)",
            ),
            &["journal", "reason"],
        )?;
        let unjournaled = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "csi_sidecar_journal_unjournaled_total",
                "Create calls that went ahead without their intent in the journal, by journal and reason (missing, forbidden, unwritable, unreachable, full, queue_full)",
            ),
            &["journal", "reason"],
        )?;
        let usable = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "csi_sidecar_journal_usable",
                "1 while the intent journal can be written, 0 while its records go ahead unjournaled",
            ),
            &["journal"],
        )?;
        registry.register(Box::new(dropped.clone()))?;
        registry.register(Box::new(unjournaled.clone()))?;
        registry.register(Box::new(usable.clone()))?;
        Ok(Self {
            dropped,
            unjournaled,
            usable,
        })
    }

    /// The count of `journal`'s entries dropped for `reason`.
    pub fn dropped(&self, journal: &str, reason: DropReason) -> u64 {
        self.dropped
            .with_label_values(&[journal, reason.label()])
            .get()
    }

    /// The count of `journal`'s records that went ahead unjournaled for `reason`.
    pub fn unjournaled(&self, journal: &str, reason: Unjournaled) -> u64 {
        self.unjournaled
            .with_label_values(&[journal, reason.label()])
            .get()
    }

    /// Whether `journal` was usable at its last write (`None`: not written yet).
    pub fn usable(&self, journal: &str) -> Option<bool> {
        self.usable
            .get_metric_with_label_values(&[journal])
            .ok()
            .map(|gauge| gauge.get() == 1)
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

/// What a sidecar's journal says of itself in its warnings, and the form of its keys.
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

/// At most this many entries of a legacy ConfigMap journal are named one by one in Events and
/// log lines; the rest are counted (whoever writes ConfigMaps may fill one with keys).
const LEGACY_NAMED: usize = 20;

/// What the journal's handles and its writer share.
struct Shared {
    location: Location,
    owner: Owner,
    keys: KeyStore,
    reporting: Reporting,
    writes: AtomicU64,
    /// Why the journal cannot be written now, if it cannot.
    fault: std::sync::Mutex<Option<Unjournaled>>,
    /// The entries and the object as [`Journal::load`] read them, for the writer's first
    /// write: the first intent then costs its write alone, not two reads before it.
    loaded: std::sync::Mutex<Option<writer::Loaded>>,
}

fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// The journal cannot be written for `reason`: said once per change of reason, in a log
    /// line, a Warning Event on the Lease and the usable gauge.
    fn faulty(&self, reason: Unjournaled, message: &str) {
        if let Some(metrics) = &self.reporting.metrics {
            metrics
                .usable
                .with_label_values(&[&self.location.name])
                .set(0);
        }
        if locked(&self.fault).replace(reason) == Some(reason) {
            return;
        }
        let Location {
            namespace,
            name,
            key_secret,
            ..
        } = &self.location;
        tracing::warn!(journal = %name, reason = reason.label(), error = %message, "{} cannot write its intent journal: create calls go ahead unjournaled, and {}, as upstream's can, until it can (it needs the Secret {namespace}/{name}, which the manifests ship empty, and RBAC secrets get and update on it and on {key_secret}); trying again with a growing pause", self.owner.sidecar, self.owner.risk);
        self.reporting.events.record(
            self.location.lease_ref(),
            EventType::Warning,
            UNUSABLE_REASON,
            &format!(
                "Intent journal Secret {name} cannot be written ({}): {message}; create calls go ahead unjournaled until it can",
                reason.label()
            ),
        );
    }

    /// The journal was written: said once after a fault.
    fn usable(&self) {
        if let Some(metrics) = &self.reporting.metrics {
            metrics
                .usable
                .with_label_values(&[&self.location.name])
                .set(1);
        }
        if let Some(was) = locked(&self.fault).take() {
            let name = &self.location.name;
            tracing::info!(journal = %name, was = was.label(), "the intent journal can be written again");
            self.reporting.events.record(
                self.location.lease_ref(),
                EventType::Normal,
                USABLE_REASON,
                &format!(
                    "Intent journal Secret {name} can be written again (it could not: {})",
                    was.label()
                ),
            );
        }
    }

    /// `count` records went ahead without being journaled, for `reason`.
    fn unjournaled(&self, reason: Unjournaled, count: usize) {
        if count == 0 {
            return;
        }
        tracing::debug!(
            journal = %self.location.name,
            reason = reason.label(),
            count,
            "create calls go ahead unjournaled"
        );
        if let Some(metrics) = &self.reporting.metrics {
            metrics
                .unjournaled
                .with_label_values(&[&self.location.name, reason.label()])
                .inc_by(count as u64);
        }
    }

    /// `count` records found the journal full (`bytes` of open intents): a Warning Event on
    /// the Lease, as for an unusable journal, while the others are written.
    fn report_full(&self, count: usize, bytes: usize) {
        let name = &self.location.name;
        tracing::warn!(journal = %name, count, bytes, "the intent journal is full: create calls go ahead unjournaled until intents finish");
        self.reporting.events.record(
            self.location.lease_ref(),
            EventType::Warning,
            UNUSABLE_REASON,
            &format!(
                "Intent journal Secret {name} is full ({bytes} bytes of open intents): create calls go ahead unjournaled until intents finish"
            ),
        );
    }

    /// Says that entry `key` is dropped unread: a log line, a Warning Event on the journal (or
    /// on the legacy ConfigMap it was found in) and the metric. `why` never quotes what a
    /// dropped entry says, only why it is dropped.
    fn report_dropped(&self, key: &str, reason: DropReason, why: &str) {
        // A forged key is any string an object's data allows: quoted, and cut short.
        let key: String = key.chars().take(64).collect();
        tracing::warn!(%key, reason = reason.label(), why, "dropping an intent journal entry; nothing is asked of the driver for it");
        let object = if reason == DropReason::Legacy {
            self.location.legacy_ref()
        } else {
            self.location.object_ref()
        };
        self.reporting.events.record(
            object,
            EventType::Warning,
            REJECTED_REASON,
            &format!(
                "Dropped intent journal entry {key:?} ({}): {why}; nothing was asked of the driver for it",
                reason.label()
            ),
        );
        self.count_dropped(reason, 1);
    }

    fn count_dropped(&self, reason: DropReason, count: usize) {
        if let Some(metrics) = &self.reporting.metrics {
            metrics
                .dropped
                .with_label_values(&[&self.location.name, reason.label()])
                .inc_by(count as u64);
        }
    }

    /// What [`Journal::load`] makes of a read that failed: a fault is reported and leaves
    /// nothing to take up; anything else is tried again by the caller.
    fn load_failed<T>(&self, step: writer::Step) -> Result<Vec<T>, JournalError> {
        match step {
            writer::Step::Fault(reason, message) => {
                self.faulty(reason, &message);
                Ok(Vec::new())
            }
            writer::Step::Transient(message)
            | writer::Step::Again(message)
            | writer::Step::NotFound(message) => Err(JournalError::Read(message)),
        }
    }

    /// The entries of the journal's Secret that open with `keys`, as text; each that does not
    /// is reported and left out.
    fn open_all(&self, keys: &Keyring, secret: &Secret) -> Entries {
        let mut open = Entries::new();
        for (key, value) in sealed_entries(secret) {
            match seal::open(keys, self.location.place(&key), &value) {
                Ok(text) => {
                    open.insert(key, text.to_string());
                }
                Err(why) => self.report_dropped(&key, (&why).into(), &why.to_string()),
            }
        }
        open
    }

    /// Why `key` is not one of this journal's keys, if it is not.
    fn bad_key(&self, key: &str) -> Option<String> {
        (!(self.owner.key_form)(key))
            .then(|| format!("its key is not {}", self.owner.key_form_name))
    }

    /// Reports the entries of the ConfigMap journal of earlier versions, if there is one and
    /// the sidecar may read it: never acted on, as whoever may write ConfigMaps could have
    /// written or replayed them.
    async fn report_legacy(&self, api: &Api<ConfigMap>) {
        let found = writer::bounded(api.get_opt(&self.location.name)).await;
        let Ok(Some(legacy)) = found else {
            return;
        };
        let keys: Vec<&String> = legacy
            .data
            .iter()
            .flat_map(|data| data.keys())
            .chain(legacy.binary_data.iter().flat_map(|data| data.keys()))
            .collect();
        if keys.is_empty() {
            return;
        }
        let why = format!(
            "it is in the ConfigMap journal of an earlier version, which whoever may write ConfigMaps could have written or replayed; what its create call made, if anything, is left for an administrator to check (a volume or snapshot named after it), then ConfigMap {} can be deleted",
            self.location.name
        );
        for key in keys.iter().take(LEGACY_NAMED) {
            self.report_dropped(key, DropReason::Legacy, &why);
        }
        let rest = keys.len().saturating_sub(LEGACY_NAMED);
        if rest > 0 {
            tracing::warn!(count = rest, "dropping more legacy intent journal entries");
            self.count_dropped(DropReason::Legacy, rest);
        }
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
    decode_entry(owner, key, text)
}

/// The intent of an opened entry `key`, or why it is dropped: its key must have `owner`'s
/// form and its text must decode.
fn decode_entry<T: DeserializeOwned>(
    owner: &Owner,
    key: &str,
    text: &str,
) -> Result<T, (DropReason, String)> {
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

/// The sealed entries of a journal Secret as stored: key → sealed text. A value that is not
/// text is kept as lossy text, which opens nowhere.
pub fn sealed_entries(secret: &Secret) -> Entries {
    secret
        .data
        .iter()
        .flatten()
        .map(|(key, value)| (key.clone(), String::from_utf8_lossy(&value.0).into_owned()))
        .collect()
}

/// A handle on the journal writer. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: Option<mpsc::Sender<writer::Op>>,
    api: Option<Api<Secret>>,
    legacy: Option<Api<ConfigMap>>,
    shared: Option<Arc<Shared>>,
}

impl Journal {
    /// A journal that records nothing (upstream's behaviour).
    pub fn off() -> Self {
        Self {
            tx: None,
            api: None,
            legacy: None,
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
        let api: Api<Secret> = Api::namespaced(client.clone(), &location.namespace);
        let legacy: Api<ConfigMap> = Api::namespaced(client, &location.namespace);
        let shared = Arc::new(Shared {
            keys: KeyStore::new(api.clone(), location.key_secret.clone()),
            location,
            owner,
            reporting,
            writes: AtomicU64::new(0),
            fault: std::sync::Mutex::new(None),
            loaded: std::sync::Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        let budget = TokenBucket::new(qps.max(MIN_QPS), BURST);
        tokio::spawn(writer::Writer::new(api.clone(), shared.clone(), budget).run(rx));
        Self {
            tx: Some(tx),
            api: Some(api),
            legacy: Some(legacy),
            shared: Some(shared),
        }
    }

    /// Writes to the API server so far.
    pub fn writes(&self) -> u64 {
        self.shared
            .as_ref()
            .map_or(0, |shared| shared.writes.load(Ordering::Relaxed))
    }

    /// The recorded intents, read at the start of leadership: those that open with the
    /// sidecar's keys, have a key of its form and decode. Every other entry is dropped and
    /// reported, and so is every entry of a legacy ConfigMap journal. What was read here is
    /// the writer's for its first write. A journal that cannot be read is reported as
    /// unusable and holds nothing to take up.
    pub async fn load<T: DeserializeOwned>(&self) -> Result<Vec<(String, T)>, JournalError> {
        let (Some(api), Some(legacy), Some(shared), Some(tx)) =
            (&self.api, &self.legacy, &self.shared, &self.tx)
        else {
            return Ok(Vec::new());
        };
        shared.report_legacy(legacy).await;
        let found = match writer::bounded(api.get_opt(&shared.location.name)).await {
            Ok(found) => found,
            Err(step) => return shared.load_failed(step),
        };
        let Some(secret) = found else {
            // Made at once if the sidecar may, reported as missing if not.
            *locked(&shared.loaded) = Some(writer::Loaded::default());
            let _ = tx.try_send(writer::Op::Sync);
            return Ok(Vec::new());
        };
        let keys = match writer::bounded(shared.keys.keyring()).await {
            Ok(keys) => keys,
            Err(step) => return shared.load_failed(step),
        };
        let mut open = shared.open_all(&keys, &secret);
        let mut good = Vec::new();
        open.retain(|key, text| match decode_entry(&shared.owner, key, text) {
            Ok(intent) => {
                good.push((key.clone(), intent));
                true
            }
            // Not carried over: the next write takes it out.
            Err((reason, why)) => {
                shared.report_dropped(key, reason, &why);
                false
            }
        });
        *locked(&shared.loaded) = Some(writer::Loaded {
            entries: open,
            resource_version: secret.metadata.resource_version,
        });
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

    /// Records an intent; returns once it is durable, or once it is known that it cannot be
    /// (the journal unusable or full, said by the metrics and Events): the create call then
    /// goes ahead as upstream's would.
    pub async fn record<T: Serialize>(&self, key: &str, intent: &T) -> Result<(), JournalError> {
        let (Some(tx), Some(shared)) = (&self.tx, &self.shared) else {
            return Ok(());
        };
        if let Some(why) = shared.bad_key(key) {
            return Err(JournalError::BadKey(why));
        }
        let text = serde_json::to_string(intent).map_err(|_| JournalError::Stopped)?;
        let (done_tx, done_rx) = oneshot::channel();
        match tx.try_send(writer::Op::Put(key.to_string(), text, done_tx)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                shared.unjournaled(Unjournaled::Queue, 1);
                return Ok(());
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(JournalError::Stopped),
        }
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
            .map_err(|_| JournalError::Stopped)
    }

    /// Forgets an intent (written with the next group). With the writer's queue full it is
    /// left for the next leader, which finds the intent done.
    pub fn forget(&self, key: &str) {
        if let Some(tx) = &self.tx
            && tx.try_send(writer::Op::Forget(key.to_string())).is_err()
        {
            tracing::debug!(%key, "the intent journal's queue is full; a finished intent stays for the next leader");
        }
    }

    /// Writes what is pending (the forgets that wait for company) at once, waiting at most
    /// [`FLUSH_WAIT`]: a sidecar that stops leaves no finished intent for the next leader.
    pub async fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        let (done_tx, done_rx) = oneshot::channel();
        let flushed = async {
            tx.send(writer::Op::Flush(done_tx)).await.ok()?;
            done_rx.await.ok()
        };
        if tokio::time::timeout(FLUSH_WAIT, flushed).await.is_err() {
            tracing::warn!(waited = ?FLUSH_WAIT, "the intent journal's last write did not finish; the next leader reads the finished intents and drops them");
        }
    }
}

/// Seals each entry of `entries` with the current key of `keys`, for `location`.
fn sealed(entries: &Entries, keys: &Keyring, location: &Location) -> Entries {
    entries
        .iter()
        .map(|(key, text)| {
            (
                key.clone(),
                seal::seal(&keys.current, location.place(key), text),
            )
        })
        .collect()
}

/// The space entry `key` with `text` takes in the journal, sealed.
fn entry_size(key: &str, text: &str) -> usize {
    key.len() + seal::sealed_len(text.len())
}

/// The space `entries` take in the journal, sealed.
fn size(entries: &Entries) -> usize {
    entries
        .iter()
        .map(|(key, text)| entry_size(key, text))
        .sum()
}

/// Applies a group of operations to the open entries; returns the indexes of the puts refused
/// for lack of space, and the keys forgotten.
fn apply(entries: &mut Entries, ops: &[(String, Option<String>)]) -> Vec<usize> {
    let mut refused = Vec::new();
    let mut used = size(entries);
    for (i, (key, value)) in ops.iter().enumerate() {
        let old = entries.get(key).map_or(0, |text| entry_size(key, text));
        match value {
            Some(text) => {
                let new = entry_size(key, text);
                if used - old + new > MAX_BYTES {
                    refused.push(i);
                    continue;
                }
                used = used - old + new;
                entries.insert(key.clone(), text.clone());
            }
            None => {
                if entries.remove(key).is_some() {
                    used -= old;
                }
            }
        }
    }
    refused
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
        // What a put replaces is not counted twice.
        let most = "x".repeat(MAX_BYTES - seal::sealed_len(0) - 2);
        assert!(apply(&mut entries, &[("b".to_string(), Some(most.clone()))]).is_empty());
        assert!(apply(&mut entries, &[("b".to_string(), Some(most))]).is_empty());
        assert_eq!(size(&entries), MAX_BYTES - 1);
    }

    #[test]
    fn the_size_counted_is_the_size_written() {
        let key = seal::Key::from_bytes(&[1; seal::KEY_LEN]).unwrap();
        let location = Location {
            namespace: "csi".into(),
            name: "j".into(),
            key_secret: "j-key".into(),
            lease: "l".into(),
        };
        for text in ["", "{}", &"é".repeat(100)] {
            let sealed = seal::seal(&key, location.place("k"), text);
            assert_eq!(sealed.len(), seal::sealed_len(text.len()), "{text}");
        }
    }

    #[test]
    fn only_a_key_the_sidecar_no_longer_has_is_unverifiable() {
        assert_eq!(DropReason::from(&Unsealed::Unsigned), DropReason::Forged);
        assert_eq!(DropReason::from(&Unsealed::Forged), DropReason::Forged);
        assert_eq!(
            DropReason::from(&Unsealed::UnknownKey("ab".into())),
            DropReason::Unverifiable
        );
    }
}
