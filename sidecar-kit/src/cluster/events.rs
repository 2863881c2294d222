//! Kubernetes Events (`core/v1`) about the objects a sidecar works on, written in the
//! background so that a slow API server never delays the work itself.
//!
//! Repeats of the same event (same object, type, reason and message) are folded into one Event
//! whose `count` and `lastTimestamp` are patched, as client-go's correlator does, so that an
//! operation retried forever leaves one growing Event instead of thousands. Events about
//! cluster-scoped objects go to the `default` namespace, as client-go puts them.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;

use crate::values::shrink::ShrinkWhenSparse;

/// Events waiting to be written; beyond this, new events are dropped (as client-go's broadcaster
/// drops them when its channel is full).
pub const QUEUE_CAPACITY: usize = 1000;
/// Distinct events remembered for folding repeats.
pub const CORRELATOR_CAPACITY: usize = 4096;
/// Longest message written; the API server limits event messages to 1 KiB in events.k8s.io.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `type` of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// Who reports: `source.component`/`reportingComponent` and `source.host`/`reportingInstance`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reporter {
    pub component: String,
    pub instance: String,
}

/// One event to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Occurrence {
    pub object: ObjectReference,
    pub kind: EventType,
    pub reason: String,
    pub message: String,
}

/// What to write for one occurrence.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Create(Box<Event>),
    /// Merge patch of an existing Event.
    Patch {
        namespace: String,
        name: String,
        patch: serde_json::Value,
    },
}

/// What makes an occurrence a repeat of another: its object, type, reason and message, as a
/// 128-bit fingerprint (two independently keyed hashes) rather than their text, which would
/// cost every remembered Event half a kilobyte or more. A new event is taken for a repeat of
/// one of the [`CORRELATOR_CAPACITY`] remembered with a chance of 2^-116.
type Key = u128;

#[derive(Clone, Debug)]
struct Seen {
    /// When the Event was created: its name's suffix (the rest comes from the object, the
    /// same for every repeat).
    created: i128,
    count: i32,
    /// The object's UID, hashed, for [`Correlator::forget_object`].
    uid: u64,
}

/// Folds repeated events into one; pure, the writer task does the I/O.
#[derive(Debug)]
pub struct Correlator {
    reporter: Reporter,
    seen: HashMap<Key, Seen>,
    order: VecDeque<Key>,
    capacity: usize,
    hashers: [RandomState; 2],
}

fn truncate(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut cut = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    message[..cut].to_string()
}

/// The namespace of the Events about `object`: its own, or `default` for a cluster-scoped one.
fn event_namespace(object: &ObjectReference) -> String {
    object
        .namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// The name of the Event about `object` created at `created` (nanoseconds), as client-go
/// names them.
fn event_name(object: &ObjectReference, created: i128) -> String {
    format!(
        "{}.{:x}",
        object.name.as_deref().unwrap_or("unknown"),
        created
    )
}

impl Correlator {
    pub fn new(reporter: Reporter, capacity: usize) -> Self {
        Self {
            reporter,
            seen: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
            hashers: [RandomState::new(), RandomState::new()],
        }
    }

    fn key(&self, occurrence: &Occurrence, message: &str) -> Key {
        let o = &occurrence.object;
        let fields = (
            &o.kind,
            &o.namespace,
            &o.name,
            &o.uid,
            occurrence.kind,
            &occurrence.reason,
            message,
        );
        let [high, low] = &self.hashers;
        (u128::from(high.hash_one(fields)) << 64) | u128::from(low.hash_one(fields))
    }

    fn uid_hash(&self, uid: &str) -> u64 {
        self.hashers[0].hash_one(uid)
    }

    /// The write for `occurrence` at `now`: a new Event, or a patch of the one it repeats.
    pub fn next(&mut self, occurrence: &Occurrence, now: Timestamp) -> Write {
        let message = truncate(&occurrence.message);
        let key = self.key(occurrence, &message);
        let object = &occurrence.object;
        if let Some(seen) = self.seen.get_mut(&key) {
            seen.count = seen.count.saturating_add(1);
            return Write::Patch {
                namespace: event_namespace(object),
                name: event_name(object, seen.created),
                patch: serde_json::json!({
                    "count": seen.count,
                    "lastTimestamp": Time(now),
                    "message": message,
                }),
            };
        }
        let created = now.as_nanosecond();
        if self.order.len() >= self.capacity
            && let Some(oldest) = self.order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        let uid = self.uid_hash(object.uid.as_deref().unwrap_or_default());
        self.order.push_back(key);
        self.seen.insert(
            key,
            Seen {
                created,
                count: 1,
                uid,
            },
        );
        Write::Create(Box::new(Event {
            metadata: ObjectMeta {
                name: Some(event_name(object, created)),
                namespace: Some(event_namespace(object)),
                ..Default::default()
            },
            involved_object: object.clone(),
            reason: Some(occurrence.reason.clone()),
            message: Some(message),
            type_: Some(occurrence.kind.as_str().to_string()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            source: Some(EventSource {
                component: Some(self.reporter.component.clone()),
                host: Some(self.reporter.instance.clone()),
            }),
            reporting_component: Some(self.reporter.component.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            ..Default::default()
        }))
    }

    /// Forgets the Event that `occurrence` would repeat (it was deleted or expired), so that the
    /// next occurrence creates a new one.
    pub fn forget(&mut self, occurrence: &Occurrence) {
        let key = self.key(occurrence, &truncate(&occurrence.message));
        if self.seen.remove(&key).is_some() {
            self.order.retain(|k| k != &key);
        }
    }

    /// Forgets every Event about the object with `uid`, which will have no more (it is gone, or
    /// done with what its Events report). Without this, the Events of a burst of objects would
    /// be remembered until [`CORRELATOR_CAPACITY`] newer ones pushed them out.
    pub fn forget_object(&mut self, uid: &str) {
        let uid = self.uid_hash(uid);
        let before = self.seen.len();
        self.seen.retain(|_, seen| seen.uid != uid);
        if self.seen.len() != before {
            let seen = &self.seen;
            self.order.retain(|key| seen.contains_key(key));
            self.seen.shrink_when_sparse();
            self.order.shrink_when_sparse();
        }
    }
}

/// What the writer task is asked to do.
enum Message {
    Record(Occurrence),
    ForgetObject(String),
}

/// Records events in the background. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Message>,
}

impl Recorder {
    /// Starts the writer task, which ends once every clone of the recorder is dropped and the
    /// queued events are written.
    pub fn spawn(client: kube::Client, reporter: Reporter) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(write_events(client, reporter, rx));
        Self { tx }
    }

    /// Queues an event; never waits. Dropped (with a debug log) when the queue is full.
    pub fn record(&self, object: ObjectReference, kind: EventType, reason: &str, message: &str) {
        let occurrence = Occurrence {
            object,
            kind,
            reason: reason.to_string(),
            message: message.to_string(),
        };
        if self.tx.try_send(Message::Record(occurrence)).is_err() {
            tracing::debug!(reason, "event queue is full or closed; dropping the event");
        }
    }

    /// The object with `uid` will have no more Events: its repeats need not be remembered
    /// (see [`Correlator::forget_object`]). Queued behind the events already recorded; never
    /// waits (when the queue is full the entries are left to age out).
    pub fn forget_object(&self, uid: &str) {
        let _ = self.tx.try_send(Message::ForgetObject(uid.to_string()));
    }
}

async fn write_events(client: kube::Client, reporter: Reporter, mut rx: mpsc::Receiver<Message>) {
    let mut correlator = Correlator::new(reporter, CORRELATOR_CAPACITY);
    while let Some(message) = rx.recv().await {
        let occurrence = match message {
            Message::Record(occurrence) => occurrence,
            Message::ForgetObject(uid) => {
                correlator.forget_object(&uid);
                continue;
            }
        };
        let write = correlator.next(&occurrence, Timestamp::now());
        let mut written = apply(&client, write.clone()).await;
        if matches!(&written, Err(err) if !matches!(err, kube::Error::Api(_))) {
            // No answer at all (a connection lost, or silent past its deadline): once more, on
            // a new connection.
            written = apply(&client, write).await;
        }
        if let Err(err) = written {
            // An Event that vanished (expired after its TTL) is created anew next time.
            correlator.forget(&occurrence);
            if is_not_found(&err) {
                let retry = correlator.next(&occurrence, Timestamp::now());
                if let Err(err) = apply(&client, retry).await {
                    tracing::debug!(error = %err, "cannot write event");
                }
            } else {
                tracing::debug!(error = %err, "cannot write event");
            }
        }
    }
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

async fn apply(client: &kube::Client, write: Write) -> Result<(), kube::Error> {
    match write {
        Write::Create(event) => {
            let namespace = event.metadata.namespace.clone().unwrap_or_default();
            Api::<Event>::namespaced(client.clone(), &namespace)
                .create(&PostParams::default(), &event)
                .await?;
        }
        Write::Patch {
            namespace,
            name,
            patch,
        } => {
            Api::<Event>::namespaced(client.clone(), &namespace)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn va_ref(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("storage.k8s.io/v1".into()),
            kind: Some("VolumeAttachment".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn occurrence(name: &str, message: &str) -> Occurrence {
        Occurrence {
            object: va_ref(name),
            kind: EventType::Warning,
            reason: "AttachFailed".into(),
            message: message.into(),
        }
    }

    fn reporter() -> Reporter {
        Reporter {
            component: "csi-attacher".into(),
            instance: "pod-1".into(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn first_occurrence_creates_a_client_go_shaped_event() {
        let mut c = Correlator::new(reporter(), 10);
        let Write::Create(event) = c.next(&occurrence("va-1", "boom"), at(1_700_000_000)) else {
            panic!("expected a create");
        };
        assert_eq!(event.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            event.metadata.name.as_deref(),
            Some(format!("va-1.{:x}", 1_700_000_000_000_000_000i128).as_str())
        );
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.reason.as_deref(), Some("AttachFailed"));
        assert_eq!(event.count, Some(1));
        assert_eq!(
            event.source.as_ref().and_then(|s| s.component.as_deref()),
            Some("csi-attacher")
        );
        assert_eq!(event.reporting_component.as_deref(), Some("csi-attacher"));
        assert_eq!(event.reporting_instance.as_deref(), Some("pod-1"));
        assert_eq!(event.involved_object, va_ref("va-1"));
        let json = serde_json::to_value(&*event).unwrap();
        assert_eq!(json["firstTimestamp"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn repeats_patch_the_count_and_new_messages_create() {
        let mut c = Correlator::new(reporter(), 10);
        let Write::Create(first) = c.next(&occurrence("va-1", "boom"), at(100)) else {
            panic!()
        };
        let second = c.next(&occurrence("va-1", "boom"), at(160));
        assert_eq!(
            second,
            Write::Patch {
                namespace: "default".into(),
                name: first.metadata.name.clone().unwrap(),
                patch: serde_json::json!({"count": 2, "lastTimestamp": "1970-01-01T00:02:40Z", "message": "boom"}),
            }
        );
        assert!(matches!(
            c.next(&occurrence("va-1", "other"), at(170)),
            Write::Create(_)
        ));
        assert!(matches!(
            c.next(&occurrence("va-2", "boom"), at(170)),
            Write::Create(_)
        ));
        c.forget(&occurrence("va-1", "boom"));
        assert!(matches!(
            c.next(&occurrence("va-1", "boom"), at(180)),
            Write::Create(_)
        ));
    }

    #[test]
    fn namespaced_objects_keep_their_namespace_and_capacity_is_bounded() {
        let mut c = Correlator::new(reporter(), 2);
        let mut o = occurrence("pvc", "m");
        o.object.namespace = Some("ns1".into());
        let Write::Create(event) = c.next(&o, at(1)) else {
            panic!()
        };
        assert_eq!(event.metadata.namespace.as_deref(), Some("ns1"));
        c.next(&occurrence("a", "m"), at(2));
        c.next(&occurrence("b", "m"), at(3));
        // The oldest entry was evicted: its repeat creates a new Event.
        assert!(matches!(c.next(&o, at(4)), Write::Create(_)));
        assert!(matches!(
            c.next(&occurrence("b", "m"), at(5)),
            Write::Patch { .. }
        ));
    }

    #[test]
    fn forgetting_an_object_forgets_all_its_events_and_their_room() {
        let mut c = Correlator::new(reporter(), 4096);
        for i in 0..500 {
            c.next(&occurrence(&format!("va-{i}"), "boom"), at(1));
            c.next(&occurrence(&format!("va-{i}"), "bang"), at(2));
        }
        c.next(&occurrence("va-0", "boom"), at(3));
        c.forget_object("uid-va-0");
        assert_eq!(c.seen.len(), 998);
        assert!(matches!(
            c.next(&occurrence("va-0", "boom"), at(4)),
            Write::Create(_)
        ));
        assert!(matches!(
            c.next(&occurrence("va-1", "bang"), at(4)),
            Write::Patch { .. }
        ));
        let full = c.seen.capacity();
        for i in 0..500 {
            c.forget_object(&format!("uid-va-{i}"));
        }
        assert!(c.seen.is_empty());
        assert!(c.order.is_empty());
        assert!(
            c.seen.capacity() < full / 4,
            "{} of {full}",
            c.seen.capacity()
        );
        let order_bytes = c.order.capacity() * size_of::<Key>();
        assert!(order_bytes <= 4096, "{order_bytes} bytes kept");
        c.forget_object("unknown");
    }

    #[test]
    fn long_messages_are_cut_at_a_char_boundary() {
        let mut c = Correlator::new(reporter(), 2);
        let long = "ä".repeat(MAX_MESSAGE_BYTES);
        let Write::Create(event) = c.next(&occurrence("x", &long), at(1)) else {
            panic!()
        };
        let message = event.message.unwrap();
        assert_eq!(message.len(), MAX_MESSAGE_BYTES);
        assert!(message.chars().all(|ch| ch == 'ä'));
    }
}
