//! Watches shared by every controller of a process: one watch per kind and selector, whose
//! changes go to each subscriber's handler (each keeps its own projection in its own index).
//!
//! A subscriber sees a change only once it has seen a list start: one that joins a watch
//! already running makes the watch list again (its other subscribers take the re-list as they
//! take any re-list after a lost watch). The last subscriber to leave ends the watch.
//!
//! A subscriber either waits for its watch's first list before it works ([`Start::Awaited`])
//! or works while the list runs ([`Start::Behind`]). A watch that no subscriber awaits lists
//! only once the hub's awaited watches have listed (waiting at most [`BEHIND_WAIT`]), or as
//! soon as a subscriber that awaits it joins: on an API server short of CPU, the lists that
//! hold work back then share it with fewer others.
//!
//! Lists are served from the API server's watch cache (`resourceVersion=0`), never from etcd,
//! as client-go's reflector does, and each listed object reaches the subscribers as soon as it
//! is read (see [`listwatch`](super::listwatch)): a restart or a leader change costs the
//! cluster no etcd range read per kind, and the process no copy of the whole list.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use kube::api::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;

use crate::pipeline::listwatch::{Failure, Source};
use crate::pipeline::protobuf::Decoder;
use crate::pipeline::views::Needs;
use crate::pipeline::{Change, lock};

/// How long a shared watch waits before it lists, so that the controllers of one start-up
/// subscribe before the list instead of each restarting it.
const SHARED_GRACE: Duration = Duration::from_millis(100);

/// How long a watch no subscriber awaits waits for the awaited ones' lists before it lists.
pub const BEHIND_WAIT: Duration = Duration::from_secs(30);

/// Whether a subscriber's work waits for its watch's first list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Work starts once the watch has listed: its list goes first.
    Awaited,
    /// Work goes on while the watch lists: its list waits for the awaited ones.
    Behind,
}

/// A watch's report that its subscriber has seen a complete list. An awaited subscriber's
/// report (or its leaving before it) also counts it off the hub's awaited lists.
pub struct Synced {
    report: Option<mpsc::UnboundedSender<()>>,
    start: Start,
    awaited: Option<AwaitedList>,
}

impl Synced {
    /// A report to `report` once listed, which the work waits for.
    pub(crate) fn awaited(report: mpsc::UnboundedSender<()>) -> Self {
        Self {
            report: Some(report),
            start: Start::Awaited,
            awaited: None,
        }
    }

    /// No report: the work goes on while the watch lists.
    pub(crate) fn behind() -> Self {
        Self {
            report: None,
            start: Start::Behind,
            awaited: None,
        }
    }

    fn report(self) {
        if let Some(report) = &self.report {
            // The receiver is gone only when the pipeline stopped waiting, which is fine.
            let _ = report.send(());
        }
    }
}

/// One awaited subscriber's list not yet seen, counted in its hub until dropped.
struct AwaitedList(tokio::sync::watch::Sender<usize>);

impl AwaitedList {
    fn new(pending: &tokio::sync::watch::Sender<usize>) -> Self {
        pending.send_modify(|n| *n += 1);
        Self(pending.clone())
    }
}

impl Drop for AwaitedList {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    object: TypeId,
    /// What subscribers receive: the objects, or a projection made once for all of them.
    delivered: TypeId,
    url: String,
    labels: Option<String>,
    fields: Option<String>,
}

type Handler<T> = Box<dyn FnMut(Change<&T>) + Send>;

struct Subscriber<T> {
    id: u64,
    apply: Handler<T>,
    synced: Option<Synced>,
    /// Set at the first list start the subscriber sees; changes before it are not its.
    listening: bool,
}

struct Shared<T> {
    subscribers: Mutex<Vec<Subscriber<T>>>,
    /// What the subscribers need of each object, together; a newcomer that needs more gets
    /// it from the list its joining starts.
    needs: AtomicU8,
    /// Whether a subscriber waits for the list before it works.
    awaited: AtomicBool,
    restart: Notify,
    task: Mutex<Option<AbortHandle>>,
}

impl<T> Shared<T> {
    /// Hands `change` to every listening subscriber; reports the ones whose first list is done.
    fn deliver(&self, change: Change<&T>) {
        let mut subscribers = lock(&self.subscribers);
        for subscriber in subscribers.iter_mut() {
            if matches!(change, Change::Relist) {
                subscriber.listening = true;
            }
            if !subscriber.listening {
                continue;
            }
            (subscriber.apply)(match &change {
                Change::Apply(o) => Change::Apply(*o),
                Change::Delete(o) => Change::Delete(*o),
                Change::Relist => Change::Relist,
                Change::Listed(o) => Change::Listed(*o),
                Change::Relisted => Change::Relisted,
            });
            if matches!(change, Change::Relisted)
                && let Some(synced) = subscriber.synced.take()
            {
                synced.report();
            }
        }
    }
}

/// How a watch's objects are read and handed to its subscribers.
pub struct Reading<K, T> {
    /// What subscribers receive of each object, made with what they need of it.
    pub convert: fn(K, Needs) -> T,
    pub needs: Needs,
    /// Lists the kind in protobuf, read with this.
    pub protobuf: Option<Decoder<K>>,
}

// Not derived: `K` and `T` need not be `Copy`.
impl<K, T> Clone for Reading<K, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, T> Copy for Reading<K, T> {}

/// The watches of one process. Cheap to clone. A hub of its own per controller gives each its
/// own watches (a single sidecar); one hub for all controllers shares them.
#[derive(Clone, Default)]
pub struct WatchHub {
    watches: Arc<Mutex<HashMap<Key, Arc<dyn Any + Send + Sync>>>>,
    next_id: Arc<AtomicU64>,
    /// Waits [`SHARED_GRACE`] before each list (see there).
    shared: bool,
    /// Watches started so far (restarts for late subscribers included).
    lists: Arc<AtomicU64>,
    /// Awaited subscribers that have not seen their first list.
    awaited: Arc<tokio::sync::watch::Sender<usize>>,
}

impl WatchHub {
    /// A hub for the controllers of one process.
    pub fn shared() -> Self {
        Self {
            shared: true,
            ..Self::default()
        }
    }

    /// Waits until no awaited subscriber waits for its first list, or [`BEHIND_WAIT`];
    /// `false` after the latter.
    async fn awaited_listed(&self) -> bool {
        let mut pending = self.awaited.subscribe();
        tokio::time::timeout(BEHIND_WAIT, pending.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }

    /// How many watches this hub opened so far (each starts with a list).
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }

    /// Subscribes `apply` to the watch of `api`'s objects selected by `config`, starting it if
    /// it is not running; `synced` is told once the subscriber has seen a complete list, and
    /// says whether its work waits for it.
    /// The subscription ends when the returned guard is dropped. `kind` names the objects in
    /// the logs. Subscribers receive each object as `reading` converts it, once for all of
    /// them, with the union of what they need (subscribers of one kind with different
    /// conversions get watches of their own).
    pub fn subscribe<K, T, F>(
        &self,
        kind: String,
        api: Api<K>,
        config: watcher::Config,
        reading: Reading<K, T>,
        apply: F,
        mut synced: Synced,
    ) -> Subscription
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        T: Send + Sync + 'static,
        F: FnMut(Change<&T>) + Send + 'static,
    {
        let key = Key {
            object: TypeId::of::<K>(),
            delivered: TypeId::of::<T>(),
            url: api.resource_url().to_string(),
            labels: config.label_selector.clone(),
            fields: config.field_selector.clone(),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let awaited = synced.start == Start::Awaited;
        if awaited {
            synced.awaited = Some(AwaitedList::new(&self.awaited));
        }
        let subscriber = Subscriber {
            id,
            apply: Box::new(apply),
            synced: Some(synced),
            listening: false,
        };
        let mut watches = lock(&self.watches);
        let existing = watches
            .get(&key)
            .cloned()
            .and_then(|w| w.downcast::<Shared<T>>().ok());
        let shared = match existing {
            Some(shared) => {
                lock(&shared.subscribers).push(subscriber);
                shared
                    .needs
                    .fetch_or(reading.needs.bits(), Ordering::Relaxed);
                shared.awaited.fetch_or(awaited, Ordering::Relaxed);
                // A list for the newcomer.
                shared.restart.notify_one();
                tracing::debug!(%kind, "another controller joins a shared watch");
                shared
            }
            None => {
                let shared = Arc::new(Shared {
                    subscribers: Mutex::new(vec![subscriber]),
                    needs: AtomicU8::new(reading.needs.bits()),
                    awaited: AtomicBool::new(awaited),
                    restart: Notify::new(),
                    task: Mutex::new(None),
                });
                let task = tokio::spawn(run(
                    kind,
                    api,
                    config,
                    reading,
                    shared.clone(),
                    self.clone(),
                ));
                *lock(&shared.task) = Some(task.abort_handle());
                watches.insert(key.clone(), shared.clone());
                shared
            }
        };
        let hub = self.clone();
        Subscription {
            leave: Some(Box::new(move || hub.leave(&key, &shared, id))),
        }
    }

    fn leave<T: Send + 'static>(&self, key: &Key, shared: &Arc<Shared<T>>, id: u64) {
        let mut watches = lock(&self.watches);
        let mut subscribers = lock(&shared.subscribers);
        subscribers.retain(|s| s.id != id);
        if subscribers.is_empty() {
            if let Some(task) = lock(&shared.task).take() {
                task.abort();
            }
            watches.remove(key);
        }
    }
}

impl std::fmt::Debug for WatchHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHub")
            .field("watches", &lock(&self.watches).len())
            .field("shared", &self.shared)
            .field("lists", &self.lists())
            .finish()
    }
}

/// A subscription to a watch; dropping it unsubscribes.
pub struct Subscription {
    leave: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(leave) = self.leave.take() {
            leave();
        }
    }
}

/// Lists and watches, handing the changes to the subscribers; lists again when one joins, when
/// the watched version is gone, or after a failure the watch cannot resume from. Failures are
/// logged and retried with the watcher's backoff.
async fn run<K, T>(
    kind: String,
    api: Api<K>,
    config: watcher::Config,
    reading: Reading<K, T>,
    shared: Arc<Shared<T>>,
    hub: WatchHub,
) where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let source = Source::new(kind.clone(), api, &config);
    let mut backoff = watcher::DefaultBackoff::default();
    let mut consistent = false;
    let mut first = true;
    loop {
        // A watch behind waits the grace too, alone in its hub: the awaited watches its
        // controller subscribes next are then counted before it looks.
        let behind = first && !shared.awaited.load(Ordering::Relaxed);
        if hub.shared || behind {
            tokio::time::sleep(SHARED_GRACE).await;
            // Whoever joined during the grace is served by the list that follows.
            let _ = shared.restart.notified().now_or_never();
        }
        if behind && !shared.awaited.load(Ordering::Relaxed) {
            tracing::debug!(%kind, "listing once the lists that work waits for are done");
            tokio::select! {
                listed = hub.awaited_listed() => if !listed {
                    tracing::info!(%kind, waited = ?BEHIND_WAIT, "the lists that work waits for are not done; listing now");
                },
                // One who joins meanwhile may await this very list (in an all-in-one process,
                // a controller that started later): it lists now.
                _ = shared.restart.notified() => {}
            }
        }
        first = false;
        hub.lists.fetch_add(1, Ordering::Relaxed);
        let failure = tokio::select! {
            biased;
            _ = shared.restart.notified() => continue,
            failure = list_and_watch(&source, reading, &shared, consistent, &mut backoff) => failure,
        };
        consistent = matches!(failure, Failure::Gone);
        if consistent {
            tracing::info!(%kind, "the watched version is gone from the API server: listing again");
            continue;
        }
        let wait = backoff.next().unwrap_or(MAX_BACKOFF);
        tracing::warn!(%kind, error = %failure, retry_in = ?wait, "list or watch failed; listing again");
        tokio::time::sleep(wait).await;
    }
}

/// A watch that ends sooner than this counts as a failure for the backoff.
const BRIEF_WATCH: Duration = Duration::from_secs(1);

/// The longest wait between failed lists, should the backoff end.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Lists, then watches for as long as the watch can resume from the last version seen.
async fn list_and_watch<K, T>(
    source: &Source,
    reading: Reading<K, T>,
    shared: &Shared<T>,
    consistent: bool,
    backoff: &mut watcher::DefaultBackoff,
) -> Failure
where
    K: kube::Resource + Clone + DeserializeOwned,
{
    let hand = |change: Change<K>| {
        let needs = Needs::from_bits(shared.needs.load(Ordering::Relaxed));
        shared.deliver(change.map(|o| (reading.convert)(o, needs)).as_ref());
    };
    let mut version = match source.list(consistent, reading.protobuf, hand).await {
        Ok(version) => version,
        Err(failure) => return failure,
    };
    shared.deliver(Change::Relisted);
    loop {
        let started = tokio::time::Instant::now();
        match source.watch(&mut version, hand).await {
            // A server that ends every watch at once (broken, or hostile) is not asked again
            // in a busy loop.
            Ok(()) if started.elapsed() < BRIEF_WATCH => {
                let wait = backoff.next().unwrap_or(MAX_BACKOFF);
                tracing::warn!(kind = %source.kind(), retry_in = ?wait, "the API server ended a watch at once; watching again from the last version seen");
                tokio::time::sleep(wait).await;
            }
            Ok(()) => {}
            Err(failure @ (Failure::Gone | Failure::Event(_))) => return failure,
            Err(failure) => {
                let wait = backoff.next().unwrap_or(MAX_BACKOFF);
                tracing::warn!(kind = %source.kind(), error = %failure, retry_in = ?wait, "watch failed; watching again from the last version seen");
                tokio::time::sleep(wait).await;
            }
        }
    }
}
