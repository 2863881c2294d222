//! The plumbing every controller sidecar runs: watches feed a cache ("index") with the changes
//! they see, the index answers with the keys to work on, and workers take the keys from work
//! queues. A sidecar configures one [`Pipeline`] with its watches and worker pools and keeps
//! its own decisions; this module knows nothing of what the keys mean.

pub mod leading;
pub mod listing;
mod listwatch;
pub mod protobuf;
pub mod views;
pub mod viewtable;
pub mod watches;
pub mod workqueue;

use std::borrow::Borrow;
use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::api::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::events::{Recorder, Reporter};
use crate::cluster::journal::JournalMetrics;
use crate::pipeline::leading::Leadership;
use crate::pipeline::views::{Needs, View};
use crate::pipeline::watches::{Reading, Start, Subscription, Synced, WatchHub};
use crate::pipeline::workqueue::{Backoff, Item, QueueConfig, WorkQueue, WorkQueueMetrics};
use crate::telemetry::operation::Retries;

/// Locks `mutex`, poisoned or not. A controller's state stays usable after a worker panicked
/// while holding it: the panic leaves at most one key half-done, and its retry redoes it.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a controller builds its pipeline from and reports through: the watches and the
/// work-queue metrics it shares with the other controllers of the process (see
/// `runtime::Setup::share`), and who its Events say reported them. Until shared it has watches
/// of its own and no metrics (a controller run alone, in tests).
#[derive(Clone, Default)]
pub struct Wiring {
    pub watches: WatchHub,
    pub queue_metrics: Option<WorkQueueMetrics>,
    /// The intent journals' dropped-entries metric, shared like the queue metrics.
    pub journal_metrics: Option<JournalMetrics>,
    pub reporter: Reporter,
    /// The Events name this host as their instance once shared (its leader election identity).
    pub(crate) names_host: bool,
    /// The service the controller's traces are exported under, once shared.
    pub service: Option<Arc<str>>,
}

impl std::fmt::Debug for Wiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wiring")
            .field("watches", &self.watches)
            .field("queue_metrics", &self.queue_metrics.is_some())
            .field("journal_metrics", &self.journal_metrics.is_some())
            .field("reporter", &self.reporter)
            .field("names_host", &self.names_host)
            .field("service", &self.service)
            .finish()
    }
}

impl Wiring {
    /// The wiring of a controller whose Events name `component` and, once shared, this host.
    pub fn reporting(component: impl Into<String>) -> Self {
        Self {
            names_host: true,
            ..Self::nameless(component)
        }
    }

    /// The wiring of a controller whose Events name `component` and no host.
    pub fn nameless(component: impl Into<String>) -> Self {
        Self {
            reporter: Reporter {
                component: component.into(),
                instance: String::new(),
            },
            ..Self::default()
        }
    }

    /// The Event recorder of the controller, writing with `client`.
    pub fn recorder(&self, client: kube::Client) -> Recorder {
        Recorder::spawn(client, self.reporter.clone())
    }

    /// A pipeline on the shared watches.
    pub fn pipeline(&self) -> Pipeline {
        Pipeline::with_watches(self.watches.clone()).traced_as(self.service.clone())
    }

    /// A work queue named `name` (the metrics' label) with `lanes`, reporting to the shared
    /// metrics.
    pub fn queue<K>(
        &self,
        name: impl Into<String>,
        lanes: &[&str],
        backoff: Backoff,
    ) -> WorkQueue<K>
    where
        K: Clone + Eq + Hash + Send + Sync + 'static,
    {
        WorkQueue::new(
            QueueConfig {
                name: name.into(),
                lanes: lanes.iter().map(|lane| lane.to_string()).collect(),
                backoff,
            },
            self.queue_metrics.as_ref(),
        )
    }
}

/// One change a watch reports: an object changed or gone, or a step of a (re-)list.
#[derive(Debug)]
pub enum Change<T> {
    Apply(T),
    Delete(T),
    /// A (re-)list starts.
    Relist,
    /// An object of the (re-)list.
    Listed(T),
    /// The (re-)list is complete: objects not listed are gone.
    Relisted,
}

impl<T> Change<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Change<U> {
        match self {
            Self::Apply(o) => Change::Apply(f(o)),
            Self::Delete(o) => Change::Delete(f(o)),
            Self::Relist => Change::Relist,
            Self::Listed(o) => Change::Listed(f(o)),
            Self::Relisted => Change::Relisted,
        }
    }

    pub fn as_ref(&self) -> Change<&T> {
        match self {
            Self::Apply(o) => Change::Apply(o),
            Self::Delete(o) => Change::Delete(o),
            Self::Relist => Change::Relist,
            Self::Listed(o) => Change::Listed(o),
            Self::Relisted => Change::Relisted,
        }
    }
}

/// The names seen during a re-list, to find the objects that went away while the watch was
/// down (their delete events are lost). Names are held as the shared strings the caches key
/// by: a re-list of thousands of objects then allocates no name of its own, whose freeing
/// would leave holes between the cached objects that the allocator cannot give back.
#[derive(Debug, Default)]
pub struct Relist {
    seen: Option<HashSet<Arc<str>>>,
}

impl Relist {
    pub fn start(&mut self) {
        self.seen = Some(HashSet::new());
    }

    pub fn saw(&mut self, name: impl Into<Arc<str>>) {
        if let Some(seen) = self.seen.as_mut() {
            seen.insert(name.into());
        }
    }

    /// Ends the re-list: of `known`, the names it did not list.
    pub fn finish<'a, K>(&mut self, known: impl Iterator<Item = &'a K>) -> Vec<K::Owned>
    where
        K: Borrow<str> + ToOwned + ?Sized + 'a,
    {
        match self.seen.take() {
            Some(seen) => known
                .filter(|n| !seen.contains((*n).borrow()))
                .map(K::to_owned)
                .collect(),
            None => Vec::new(),
        }
    }
}

/// What a controller's watches feed: its index, with the client they watch with, the fields it
/// reads of the process's shared views and the watches' settings.
pub struct Feeder<I> {
    index: Mutex<I>,
    client: kube::Client,
    needs: Needs,
    watch_config: watcher::Config,
}

impl<I> Feeder<I> {
    /// `index`, fed by watches through `client` with the views' fields `needs`.
    pub fn new(index: I, client: kube::Client, needs: Needs) -> Self {
        Self {
            index: Mutex::new(index),
            client,
            needs,
            watch_config: watcher::Config::default(),
        }
    }

    /// The watches' settings.
    pub fn watch_config(&self) -> watcher::Config {
        self.watch_config.clone()
    }
}

/// A controller fed by its watches: each change goes through its index, which answers with the
/// work it finds, and the work into its queues. [`Pipeline::feed`] and
/// [`Pipeline::feed_view`] wire a kind's watch to it.
pub trait Fed: Send + Sync + 'static {
    type Index;
    type Work;
    fn feeder(&self) -> &Feeder<Self::Index>;
    /// Puts one piece of work on the queue that takes it.
    fn route(&self, work: Self::Work);

    /// Puts each piece of `work` on its queue.
    fn enqueue(&self, work: Vec<Self::Work>) {
        for item in work {
            self.route(item);
        }
    }

    /// The index, locked.
    fn index(&self) -> MutexGuard<'_, Self::Index> {
        lock(&self.feeder().index)
    }
}

/// How a fed controller's index takes a change of `T`: the work it finds.
pub type Apply<C, T> = fn(&mut <C as Fed>::Index, Change<&T>) -> Vec<<C as Fed>::Work>;

/// How a fed controller's index finds the work of a periodic resync.
pub type Resync<C> = fn(&<C as Fed>::Index) -> Vec<<C as Fed>::Work>;

/// Watches (through a [`WatchHub`], shared with the other controllers of the process or not),
/// and the workers started once every watch the work waits for has synced.
pub struct Pipeline {
    hub: WatchHub,
    subscriptions: Vec<Subscription>,
    workers: JoinSet<()>,
    synced_tx: mpsc::UnboundedSender<()>,
    synced_rx: mpsc::UnboundedReceiver<()>,
    expected: usize,
    stops: Vec<Box<dyn FnOnce() + Send>>,
    /// Cancelled when the pipeline stops: ends its periodic tasks.
    stopping: CancellationToken,
    /// The service its operations' traces are exported under (the binary's name).
    service: Option<Arc<str>>,
    /// What it waits for between its caches' sync and its start: the task's at its making.
    leadership: Leadership,
}

impl Default for Pipeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Pipeline {
    /// A pipeline with watches of its own.
    pub fn new() -> Self {
        Self::with_watches(WatchHub::default())
    }

    /// A pipeline whose watches are `hub`'s (shared with every pipeline of the hub).
    pub fn with_watches(hub: WatchHub) -> Self {
        let (synced_tx, synced_rx) = mpsc::unbounded_channel();
        Self {
            hub,
            subscriptions: Vec::new(),
            workers: JoinSet::new(),
            synced_tx,
            synced_rx,
            expected: 0,
            stops: Vec::new(),
            stopping: CancellationToken::new(),
            service: None,
            leadership: Leadership::current(),
        }
    }

    /// Its watches' hub, for a pipeline started later that shares them.
    pub fn hub(&self) -> WatchHub {
        self.hub.clone()
    }

    /// The service its operations' traces are exported under.
    pub fn service(&self) -> Option<&Arc<str>> {
        self.service.as_ref()
    }

    /// Exports the traces of its operations under `service`.
    pub fn traced_as(mut self, service: Option<Arc<str>>) -> Self {
        self.service = service;
        self
    }

    /// Watches `api`'s kind; the changes go to `apply`.
    pub fn watch<K, F>(&mut self, api: Api<K>, config: watcher::Config, apply: F)
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default,
        F: FnMut(Change<&K>) + Send + 'static,
    {
        let kind = K::kind(&K::DynamicType::default()).to_string();
        self.watch_kind(kind, api, config, apply);
    }

    /// [`watch`](Self::watch) for objects whose type does not know its kind (dynamic objects).
    pub fn watch_kind<K, F>(&mut self, kind: String, api: Api<K>, config: watcher::Config, apply: F)
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        F: FnMut(Change<&K>) + Send + 'static,
    {
        let synced = self.synced(Start::Awaited);
        let reading = Reading {
            convert: |object, _| object,
            needs: Needs::NONE,
            protobuf: None,
        };
        self.subscriptions.push(
            self.hub
                .subscribe(kind, api, config, reading, apply, synced),
        );
    }

    /// The report of a watch's first list: awaited by [`wait_synced`](Self::wait_synced), or
    /// by nobody.
    fn synced(&mut self, start: Start) -> Synced {
        match start {
            Start::Awaited => {
                self.expected += 1;
                Synced::awaited(self.synced_tx.clone())
            }
            Start::Behind => Synced::behind(),
        }
    }

    /// Watches the objects of `V`'s kind as `V` views them: each object is projected once, and
    /// every controller of the hub that watches the same view shares the projection, which
    /// holds what all of them `need`. `start` says whether the work waits for its list.
    pub fn watch_view<V, F>(
        &mut self,
        api: Api<V::Object>,
        config: watcher::Config,
        needs: Needs,
        start: Start,
        apply: F,
    ) where
        V: View,
        <V::Object as kube::Resource>::DynamicType: Default,
        F: FnMut(Change<&Arc<V>>) + Send + 'static,
    {
        let kind = <V::Object as kube::Resource>::kind(&Default::default()).to_string();
        let synced = self.synced(start);
        let reading = Reading {
            convert: |object, needs| Arc::new(V::of(&object, needs)),
            needs,
            protobuf: V::PROTOBUF,
        };
        self.subscriptions.push(
            self.hub
                .subscribe(kind, api, config, reading, apply, synced),
        );
    }

    /// Watches every object of `K` (cluster-wide) into `controller`'s index, and the work it
    /// finds into its queues.
    pub fn feed<K, C: Fed>(&mut self, controller: &Arc<C>, apply: Apply<C, K>)
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default,
    {
        let client = controller.feeder().client.clone();
        self.feed_through(controller, client, apply);
    }

    /// [`feed`](Self::feed) through `client` instead of the controller's own: for a kind whose
    /// requests have a rate limit of their own, as those of upstream's separate clientsets do.
    pub fn feed_through<K, C: Fed>(
        &mut self,
        controller: &Arc<C>,
        client: kube::Client,
        apply: Apply<C, K>,
    ) where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default,
    {
        let me = controller.clone();
        self.watch(
            Api::<K>::all(client),
            controller.feeder().watch_config(),
            move |change| {
                let work = apply(&mut me.index(), change);
                me.enqueue(work);
            },
        );
    }

    /// [`feed`](Self::feed) of the process's shared views of a kind.
    pub fn feed_view<C: Fed, V>(&mut self, controller: &Arc<C>, apply: Apply<C, Arc<V>>)
    where
        V: View,
        <V::Object as kube::Resource>::DynamicType: Default,
    {
        self.feed_view_as(controller, Start::Awaited, apply);
    }

    /// [`feed_view`](Self::feed_view) of a kind the work does not wait for: the work starts
    /// before its list is done (its index tells it apart until `Relisted`), and the list waits
    /// for those of the kinds the work waits for (see [`watches`]).
    pub fn feed_view_behind<C: Fed, V>(&mut self, controller: &Arc<C>, apply: Apply<C, Arc<V>>)
    where
        V: View,
        <V::Object as kube::Resource>::DynamicType: Default,
    {
        self.feed_view_as(controller, Start::Behind, apply);
    }

    fn feed_view_as<C: Fed, V>(
        &mut self,
        controller: &Arc<C>,
        start: Start,
        apply: Apply<C, Arc<V>>,
    ) where
        V: View,
        <V::Object as kube::Resource>::DynamicType: Default,
    {
        let me = controller.clone();
        let feeder = controller.feeder();
        self.watch_view(
            Api::all(feeder.client.clone()),
            feeder.watch_config(),
            feeder.needs,
            start,
            move |change| {
                let work = apply(&mut me.index(), change);
                me.enqueue(work);
            },
        );
    }

    /// Waits until every watch the work waits for has listed once; `false` if `shutdown` came
    /// first.
    pub async fn wait_synced(&mut self, shutdown: &CancellationToken) -> bool {
        for _ in 0..self.expected {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = self.synced_rx.recv() => {}
            }
        }
        true
    }

    /// Starts `count` workers taking keys from `queue` and handing them to `work`; each key is
    /// marked done when `work` returns. The queue shuts down when the pipeline stops.
    pub fn workers<K, F, Fut>(&mut self, queue: &WorkQueue<K>, count: usize, work: F)
    where
        K: Clone + Eq + Hash + Send + Sync + 'static,
        K: std::fmt::Debug,
        F: Fn(Item<K>) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let retries = Arc::new(Retries::default());
        for _ in 0..count {
            let queue = queue.clone();
            let work = work.clone();
            let retries = retries.clone();
            let service = self.service.clone();
            self.workers.spawn(async move {
                while let Some(item) = queue.get().await {
                    let key = item.key.clone();
                    let pass = retries.begin(
                        service.as_ref(),
                        queue.name(),
                        queue.lane_name(item.lane),
                        &key,
                        item.waited,
                        queue.failures(&key),
                    );
                    if let Some(pass) = pass {
                        let span = pass.span.clone();
                        Box::pin(work(item)).instrument(span).await;
                        retries.finish(pass, queue.failures(&key));
                        queue.done(&key);
                        continue;
                    }
                    // Boxed, so that the operation's state lives only while a key is worked
                    // on. Held inline, it would make every worker task as large as the largest
                    // operation (28 KiB per claim worker in the provisioner, 100 workers by
                    // default), allocated for good: idle workers leave those pages untouched,
                    // but a burst spread over all workers makes them resident, and they stay
                    // resident since the tasks never end. One allocation per key is nothing
                    // beside the API and driver calls it makes.
                    Box::pin(work(item)).await;
                    queue.done(&key);
                }
            });
        }
        let queue = queue.clone();
        self.stops.push(Box::new(move || queue.shut_down()));
    }

    /// Calls `tick` every `period` (first after one period) until the pipeline stops; never
    /// with a zero `period` (a resync turned off).
    pub fn every<F>(&mut self, period: Duration, mut tick: F)
    where
        F: FnMut() + Send + 'static,
    {
        if period.is_zero() {
            return;
        }
        let stopping = self.stopping.clone();
        self.workers.spawn(async move {
            loop {
                tokio::select! {
                    _ = stopping.cancelled() => return,
                    _ = tokio::time::sleep(period) => tick(),
                }
            }
        });
    }

    /// Every `period` (never with a zero one), the work `controller`'s index finds with
    /// `resync` goes into its queues.
    pub fn resync<C: Fed>(&mut self, controller: &Arc<C>, period: Duration, resync: Resync<C>) {
        let me = controller.clone();
        self.every(period, move || {
            let work = resync(&me.index());
            me.enqueue(work);
        });
    }

    /// Runs `task` beside the workers until the pipeline stops (periodic work).
    pub fn spawn<Fut>(&mut self, task: Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.workers.spawn(task);
    }

    /// Runs the pipeline until `shutdown`: once every watch has listed and the process leads
    /// (see [`leading`]), `start` adds the workers and periodic tasks (it is given `shutdown`,
    /// for tasks of its own); then it [`stop`](Self::stop)s. A shutdown before that stops it
    /// without starting anything.
    pub async fn run(
        mut self,
        shutdown: &CancellationToken,
        start: impl AsyncFnOnce(&mut Self, CancellationToken),
    ) {
        if self.wait_synced(shutdown).await && self.wait_leading(shutdown).await {
            start(&mut self, shutdown.clone()).await;
            shutdown.cancelled().await;
        }
        self.stop().await;
    }

    /// Waits until the process leads; `false` if `shutdown` came first.
    async fn wait_leading(&mut self, shutdown: &CancellationToken) -> bool {
        if self.leadership.leads() {
            return true;
        }
        tracing::info!("caches synced; standing by until this replica leads");
        let leads = self.leadership.wait(shutdown).await;
        if leads {
            tracing::info!("leading: starting work from the synced caches");
        }
        leads
    }

    /// Stops taking work: queues shut down, watches end, and the workers finish the operation
    /// they are in.
    pub async fn stop(mut self) {
        self.stopping.cancel();
        for stop in self.stops.drain(..) {
            stop();
        }
        self.subscriptions.clear();
        while self.workers.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relist_finds_what_was_not_listed() {
        let mut relist = Relist::default();
        let known: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
        assert!(relist.finish(known.iter()).is_empty(), "no re-list running");
        relist.start();
        relist.saw("a");
        relist.saw("c");
        assert_eq!(relist.finish(known.iter()), vec!["b".to_string()]);
        assert!(relist.finish(known.iter()).is_empty(), "finished once");
    }

    #[test]
    fn a_relist_of_shared_names_hands_back_the_cache_own_keys() {
        let known: Vec<Arc<str>> = vec!["a".into(), "b".into()];
        let mut relist = Relist::default();
        relist.start();
        relist.saw(known[0].clone());
        assert_eq!(Arc::strong_count(&known[0]), 2, "held, not copied");
        let gone = relist.finish(known.iter());
        assert!(Arc::ptr_eq(&gone[0], &known[1]));
        assert_eq!(Arc::strong_count(&known[0]), 1, "let go once finished");
    }

    #[tokio::test(start_paused = true)]
    async fn periodic_work_ticks_each_period_until_the_pipeline_stops() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let ticks = Arc::new(AtomicUsize::new(0));
        let mut pipeline = Pipeline::new();
        let counter = ticks.clone();
        pipeline.every(Duration::from_secs(10), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let never = Arc::new(AtomicUsize::new(0));
        let counter = never.clone();
        pipeline.every(Duration::ZERO, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            ticks.load(Ordering::SeqCst),
            0,
            "first tick after one period"
        );
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), 3);
        pipeline.stop().await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), 3, "no tick after the stop");
        assert_eq!(never.load(Ordering::SeqCst), 0, "a zero period never ticks");
    }
}
