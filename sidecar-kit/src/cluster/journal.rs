//! The intent journal: before a sidecar asks the driver to create something (a volume, a
//! snapshot), it records what it is about to ask durably in a ConfigMap in its own namespace.
//! After a restart or a change of leader, every recorded intent is driven to a final state (the
//! object that names the result written, or the result deleted when nothing will name it) and
//! only then forgotten — so a kill in the middle of a create call never leaks what the driver
//! made. What an intent holds is the sidecar's own (any serde type); this module keeps them.
//!
//! Records are written in groups: while one write is in flight the next intents queue up and go
//! out together in the following write, so a burst costs a few writes, not one per volume.
//! Forgetting alone does not trigger a write at once; it rides along with the next record, or
//! goes out after [`FORGET_DELAY`].
//!
//! Without RBAC for ConfigMaps the journal turns itself off with one warning, and the sidecar
//! works as upstream's does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};

/// The journal's own request budget. Its writes gate create calls, so they must not wait
/// behind the sidecar's writes under `--kube-api-qps`, nor take tokens from them: that would
/// slow the sidecar below upstream's, which has no journal. A single intent is recorded at once
/// (burst); in a burst the records that arrive while a write waits share the next one, so a
/// burst costs about one ConfigMap write a second.
pub const QPS: f64 = 1.0;
pub const BURST: u32 = 2;
/// How long a lone "forget" waits for company before it is written.
pub const FORGET_DELAY: Duration = Duration::from_secs(2);
/// A record that comes within this time of the previous write is part of a burst...
pub const BURST_WINDOW: Duration = Duration::from_secs(1);
/// ...and waits this long for more records to share its write. Outside bursts a record is
/// written at once.
pub const LINGER: Duration = Duration::from_millis(50);
/// Above this size of recorded intents, new ones wait for space (a ConfigMap holds 1 MiB).
pub const MAX_BYTES: usize = 900 * 1024;
const RETRY_START: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    #[error("the intent journal is full ({0} bytes recorded)")]
    Full(usize),
    #[error("the intent journal writer stopped")]
    Stopped,
    #[error("cannot read the intent journal: {0}")]
    Read(String),
}

/// The journal's data: key (a claim or content UID) → intent as JSON.
pub type Entries = BTreeMap<String, String>;

/// Decodes the entries of the journal; entries that do not decode are returned apart, so that
/// they are logged and dropped rather than stopping the sidecar.
pub fn decode<T: DeserializeOwned>(entries: &Entries) -> (Vec<(String, T)>, Vec<String>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (uid, text) in entries {
        match serde_json::from_str::<T>(text) {
            Ok(intent) => good.push((uid.clone(), intent)),
            Err(_) => bad.push(uid.clone()),
        }
    }
    (good, bad)
}

/// Where the journal lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub namespace: String,
    pub name: String,
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
}

/// Reason of the Warning Event about a journal entry that is dropped unread: it is not what the
/// sidecar records (a forgery, or written by another version or configuration).
pub const REJECTED_REASON: &str = "JournalEntryRejected";

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
}

/// What a sidecar's journal says when it must turn itself off.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    /// Who keeps the journal, as logs name it: "the provisioner".
    pub sidecar: &'static str,
    /// What can happen without it: "a restart during a CreateVolume may then leak a volume".
    pub risk: &'static str,
}

impl Owner {
    fn warn_off(&self, message: &str) {
        tracing::warn!(error = %message, "{} cannot use its intent journal (it needs its namespace to exist, and RBAC: configmaps get, create, update there); {}, as upstream's can", self.sidecar, self.risk);
    }
}

/// A handle on the journal writer. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: Option<mpsc::UnboundedSender<Op>>,
    api: Option<(Api<ConfigMap>, String)>,
    disabled: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    owner: Owner,
}

impl Journal {
    /// A journal that records nothing (upstream's behaviour).
    pub fn off(owner: Owner) -> Self {
        Self {
            tx: None,
            api: None,
            disabled: Arc::new(AtomicBool::new(true)),
            writes: Arc::new(AtomicU64::new(0)),
            owner,
        }
    }

    /// Starts the writer for the journal at `location`.
    pub fn start(client: kube::Client, location: Location, owner: Owner) -> Self {
        let api: Api<ConfigMap> = Api::namespaced(client, &location.namespace);
        let (tx, rx) = mpsc::unbounded_channel();
        let disabled = Arc::new(AtomicBool::new(false));
        let writes = Arc::new(AtomicU64::new(0));
        tokio::spawn(write_loop(
            api.clone(),
            location.name.clone(),
            rx,
            disabled.clone(),
            writes.clone(),
            owner,
        ));
        Self {
            tx: Some(tx),
            api: Some((api, location.name)),
            disabled,
            writes,
            owner,
        }
    }

    pub fn enabled(&self) -> bool {
        !self.disabled.load(Ordering::Relaxed)
    }

    /// Writes to the API server so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// The recorded intents, read at the start of leadership.
    pub async fn load<T: DeserializeOwned>(&self) -> Result<Vec<(String, T)>, JournalError> {
        let Some((api, name)) = &self.api else {
            return Ok(Vec::new());
        };
        let entries = match api.get_opt(name).await {
            Ok(found) => found.and_then(|cm| cm.data).unwrap_or_default(),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                self.turn_off(&status.message);
                return Ok(Vec::new());
            }
            Err(err) => return Err(JournalError::Read(err.to_string())),
        };
        let (good, bad) = decode(&entries);
        for uid in bad {
            tracing::warn!(key = %uid, "dropping an intent journal entry that cannot be read");
            self.forget(&uid);
        }
        Ok(good)
    }

    fn turn_off(&self, message: &str) {
        if !self.disabled.swap(true, Ordering::Relaxed) {
            self.owner.warn_off(message);
        }
    }

    /// Records an intent; returns once it is durable (or the journal is off).
    pub async fn record<T: Serialize>(&self, uid: &str, intent: &T) -> Result<(), JournalError> {
        let Some(tx) = &self.tx else { return Ok(()) };
        if !self.enabled() {
            return Ok(());
        }
        let text = serde_json::to_string(intent).map_err(|_| JournalError::Stopped)?;
        let (done_tx, done_rx) = oneshot::channel();
        tx.send(Op::Put(uid.to_string(), text, done_tx))
            .map_err(|_| JournalError::Stopped)?;
        done_rx.await.map_err(|_| JournalError::Stopped)?
    }

    /// Forgets an intent (written with the next group).
    pub fn forget(&self, uid: &str) {
        if let Some(tx) = &self.tx
            && self.enabled()
        {
            let _ = tx.send(Op::Forget(uid.to_string()));
        }
    }
}

/// Applies a group of operations to the entries; `Err` lists the puts refused for lack of
/// space (their senders are answered by the caller).
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

async fn write_loop(
    api: Api<ConfigMap>,
    name: String,
    mut rx: mpsc::UnboundedReceiver<Op>,
    disabled: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    owner: Owner,
) {
    let mut cached: Option<ConfigMap> = None;
    let mut last_write: Option<tokio::time::Instant> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let in_burst = last_write.is_some_and(|at| at.elapsed() < BURST_WINDOW);
        if in_burst && matches!(batch[0], Op::Put(..)) {
            let linger = tokio::time::sleep(LINGER);
            tokio::pin!(linger);
            loop {
                tokio::select! {
                    _ = &mut linger => break,
                    op = rx.recv() => match op {
                        Some(op) => batch.push(op),
                        None => break,
                    },
                }
            }
        }
        if batch.iter().all(|op| matches!(op, Op::Forget(_))) {
            // Forgetting can wait for company: under load it rides along with a record.
            let deadline = tokio::time::sleep(FORGET_DELAY);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    op = rx.recv() => match op {
                        Some(op) => {
                            let put = matches!(op, Op::Put(..));
                            batch.push(op);
                            if put { break; }
                        }
                        None => break,
                    },
                }
            }
        }
        while let Ok(op) = rx.try_recv() {
            batch.push(op);
        }
        let mut ops = Vec::with_capacity(batch.len());
        let mut waiters = Vec::new();
        for op in batch {
            match op {
                Op::Put(uid, text, done) => {
                    waiters.push((ops.len(), done));
                    ops.push((uid, Some(text)));
                }
                Op::Forget(uid) => ops.push((uid, None)),
            }
        }
        if disabled.load(Ordering::Relaxed) {
            for (_, done) in waiters {
                let _ = done.send(Ok(()));
            }
            continue;
        }
        let mut delay = RETRY_START;
        let outcome = loop {
            let mut object = match cached.take() {
                Some(object) => object,
                None => match api.get_opt(&name).await {
                    Ok(Some(object)) => object,
                    Ok(None) => ConfigMap {
                        metadata: kube::api::ObjectMeta {
                            name: Some(name.clone()),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
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
            let refused = apply(entries, &ops);
            let size = entries
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
            let creating = object.metadata.resource_version.is_none();
            let result = if creating {
                api.create(&PostParams::default(), &object).await
            } else {
                api.replace(&name, &PostParams::default(), &object).await
            };
            writes.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(written) => {
                    cached = Some(written);
                    break Ok((refused, size));
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
            Ok((refused, size)) => {
                last_write = Some(tokio::time::Instant::now());
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
                if !disabled.swap(true, Ordering::Relaxed) {
                    owner.warn_off(&message);
                }
                for (_, done) in waiters {
                    let _ = done.send(Ok(()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn unreadable_entries_are_set_apart() {
        let entries = Entries::from([("u1".to_string(), "{not json".to_string())]);
        let (good, bad) = decode::<serde_json::Value>(&entries);
        assert!(good.is_empty());
        assert_eq!(bad, vec!["u1".to_string()]);
    }
}
