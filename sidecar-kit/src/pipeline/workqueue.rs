//! A work queue with client-go's guarantees, split into lanes.
//!
//! Guarantees, as client-go's rate-limiting queue gives them:
//! - a key is queued at most once however often it is added (deduplication);
//! - a key is never handed to two workers at once: adding a key that is being processed marks
//!   it dirty, and it is queued again when its worker calls [`WorkQueue::done`];
//! - [`WorkQueue::add_rate_limited`] delays a key by its own exponential backoff (start, doubling,
//!   capped), which [`WorkQueue::forget`] resets after a success.
//!
//! Unlike client-go, queued keys wait in *lanes* (e.g. attach and detach), and workers take from
//! the lanes in turn, so a burst in one lane cannot starve the others. A key lives in one lane at
//! a time; adding it to another lane moves it there.
//!
//! Metrics ([`WorkQueueMetrics`]) use client-go's workqueue names and `name` label, plus per-lane
//! depth and oldest-item age, and the number of keys waiting for their backoff.

use std::borrow::Borrow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::values::shrink::ShrinkWhenSparse;

/// Per-key exponential backoff: `start`, doubled on every failure, capped at `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub start: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before retry number `failures` (1 = first retry), as client-go's
    /// `ItemExponentialFailureRateLimiter` computes it.
    pub fn delay(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(62);
        let factor = 1u64 << exponent;
        let nanos = (self.start.as_nanos()).saturating_mul(u128::from(factor));
        if nanos >= self.max.as_nanos() {
            self.max
        } else {
            Duration::from_nanos(nanos as u64)
        }
    }
}

/// Settings of one queue.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// The `name` label of the metrics, e.g. `csi-attacher-va`.
    pub name: String,
    /// Names of the lanes, in the order workers visit them; at least one.
    pub lanes: Vec<String>,
    pub backoff: Backoff,
}

/// A key handed to a worker, who must call [`WorkQueue::done`] with it when finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item<K> {
    pub key: K,
    pub lane: usize,
    /// How long the key waited in its lane.
    pub waited: Duration,
}

/// Point-in-time view of a queue, for metrics and logs.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub name: String,
    pub lanes: Vec<LaneSnapshot>,
    /// Keys waiting for a delay or their backoff to expire.
    pub delayed: usize,
    /// Keys being processed.
    pub processing: usize,
    /// Sum of the running times of the keys being processed.
    pub unfinished: Duration,
    /// Running time of the longest-running key.
    pub longest: Duration,
}

impl Snapshot {
    /// Queued keys over all lanes.
    pub fn depth(&self) -> usize {
        self.lanes.iter().map(|l| l.depth).sum()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LaneSnapshot {
    pub name: String,
    pub depth: usize,
    /// How long the oldest queued key has waited (zero when the lane is empty).
    pub oldest: Duration,
}

/// A deduplicated, lane-fair work queue with per-key backoff. Cheap to clone.
pub struct WorkQueue<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<K> {
    name: String,
    lane_names: Vec<String>,
    backoff: Backoff,
    state: Mutex<State<K>>,
    /// Wakes workers waiting for a key.
    ready: Notify,
    /// Wakes [`WorkQueue::wait_idle`] when a key is done.
    idle: Notify,
    meters: Option<Meters>,
}

struct Meters {
    adds: IntCounter,
    retries: IntCounter,
    queue_duration: Histogram,
    work_duration: Histogram,
}

/// A key that is queued or waiting to be queued again.
struct Dirty {
    lane: usize,
    /// Matches the key's live entry in its lane; older entries are stale.
    ticket: u64,
    since: Instant,
    /// In a lane (false while its worker still processes an earlier round).
    queued: bool,
}

struct Delayed {
    at: Instant,
    seq: u64,
    lane: usize,
}

struct State<K> {
    lanes: Vec<VecDeque<(K, u64)>>,
    queued: Vec<usize>,
    dirty: HashMap<K, Dirty>,
    processing: HashMap<K, Instant>,
    delayed: HashMap<K, Delayed>,
    /// Due times; entries whose sequence number no longer matches `delayed` are stale.
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_keys: HashMap<u64, K>,
    failures: HashMap<K, u32>,
    next_ticket: u64,
    cursor: usize,
    shutting_down: bool,
}

impl<K: Clone + Eq + Hash> State<K> {
    fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    /// Returns whether the key was newly queued (not a duplicate).
    fn add(&mut self, key: K, lane: usize, now: Instant) -> AddOutcome {
        if self.shutting_down {
            return AddOutcome::Ignored;
        }
        let ticket = self.ticket();
        if let Some(dirty) = self.dirty.get_mut(&key) {
            if dirty.lane != lane {
                if dirty.queued {
                    self.queued[dirty.lane] -= 1;
                    dirty.ticket = ticket;
                    self.lanes[lane].push_back((key, ticket));
                    self.queued[lane] += 1;
                }
                dirty.lane = lane;
            }
            return AddOutcome::Duplicate;
        }
        let queued = !self.processing.contains_key(&key);
        self.dirty.insert(
            key.clone(),
            Dirty {
                lane,
                ticket,
                since: now,
                queued,
            },
        );
        if queued {
            self.lanes[lane].push_back((key, ticket));
            self.queued[lane] += 1;
            AddOutcome::Queued
        } else {
            AddOutcome::Deferred
        }
    }

    fn add_after(&mut self, key: K, lane: usize, at: Instant) {
        if self.shutting_down {
            return;
        }
        if let Some(existing) = self.delayed.get(&key)
            && existing.at <= at
        {
            return;
        }
        let seq = self.ticket();
        self.delayed.insert(key.clone(), Delayed { at, seq, lane });
        self.timers.push(Reverse((at, seq)));
        self.timer_keys.insert(seq, key);
    }

    /// Moves every key whose delay has expired into its lane.
    fn promote_due(&mut self, now: Instant) -> usize {
        let mut promoted = 0;
        while let Some(Reverse((at, seq))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(key) = self.timer_keys.remove(&seq) else {
                continue;
            };
            let live = self.delayed.get(&key).is_some_and(|d| d.seq == seq);
            if !live {
                continue;
            }
            if let Some(delayed) = self.delayed.remove(&key)
                && self.add(key, delayed.lane, now) == AddOutcome::Queued
            {
                promoted += 1;
            }
        }
        promoted
    }

    fn next_due(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// Takes the next key, visiting the lanes in turn.
    fn pop(&mut self, now: Instant) -> Option<Item<K>> {
        let lanes = self.lanes.len();
        for offset in 0..lanes {
            let lane = (self.cursor + offset) % lanes;
            while let Some((key, ticket)) = self.lanes[lane].pop_front() {
                let live = self
                    .dirty
                    .get(&key)
                    .is_some_and(|d| d.ticket == ticket && d.queued);
                if !live {
                    continue;
                }
                let Some(dirty) = self.dirty.remove(&key) else {
                    continue;
                };
                self.queued[lane] -= 1;
                self.processing.insert(key.clone(), now);
                self.cursor = (lane + 1) % lanes;
                return Some(Item {
                    key,
                    lane,
                    waited: now.saturating_duration_since(dirty.since),
                });
            }
        }
        None
    }

    fn has_queued(&self) -> bool {
        self.queued.iter().any(|&n| n > 0)
    }

    /// Gives back the room a burst of keys left (cheap when there is none to give).
    fn shrink_when_sparse(&mut self) {
        for lane in &mut self.lanes {
            lane.shrink_when_sparse();
        }
        self.dirty.shrink_when_sparse();
        self.processing.shrink_when_sparse();
        self.delayed.shrink_when_sparse();
        self.timer_keys.shrink_when_sparse();
        self.failures.shrink_when_sparse();
    }
}

#[derive(Debug, PartialEq, Eq)]
enum AddOutcome {
    Queued,
    /// Dirty while processing; queued when done.
    Deferred,
    Duplicate,
    Ignored,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// A queue; with `metrics`, it reports under `config.name`.
    pub fn new(config: QueueConfig, metrics: Option<&WorkQueueMetrics>) -> Self {
        let lane_names = if config.lanes.is_empty() {
            vec!["default".to_string()]
        } else {
            config.lanes
        };
        let lanes = lane_names.len();
        let meters = metrics.map(|m| m.meters(&config.name));
        let shared = Arc::new(Shared {
            name: config.name,
            lane_names,
            backoff: config.backoff,
            state: Mutex::new(State {
                lanes: (0..lanes).map(|_| VecDeque::new()).collect(),
                queued: vec![0; lanes],
                dirty: HashMap::new(),
                processing: HashMap::new(),
                delayed: HashMap::new(),
                timers: BinaryHeap::new(),
                timer_keys: HashMap::new(),
                failures: HashMap::new(),
                next_ticket: 0,
                cursor: 0,
                shutting_down: false,
            }),
            ready: Notify::new(),
            idle: Notify::new(),
            meters,
        });
        if let Some(metrics) = metrics {
            let weak: Weak<dyn QueueStats> = Arc::downgrade(&shared) as Weak<dyn QueueStats>;
            metrics.track(weak);
        }
        Self { shared }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The queue's name (its metrics' label).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The name of `lane`.
    pub fn lane_name(&self, lane: usize) -> &str {
        &self.shared.lane_names[self.lane_index(lane)]
    }

    fn lane_index(&self, lane: usize) -> usize {
        lane.min(self.shared.lane_names.len() - 1)
    }

    /// Queues `key` in `lane` (or moves it there), unless it is already queued.
    pub fn add(&self, key: impl Into<K>, lane: usize) {
        let key = key.into();
        let lane = self.lane_index(lane);
        let outcome = self.state().add(key, lane, Instant::now());
        if matches!(outcome, AddOutcome::Queued | AddOutcome::Deferred)
            && let Some(m) = &self.shared.meters
        {
            m.adds.inc();
        }
        if outcome == AddOutcome::Queued {
            self.shared.ready.notify_one();
        }
    }

    /// Queues `key` after `delay`; an earlier pending delay of the same key wins.
    pub fn add_after(&self, key: impl Into<K>, lane: usize, delay: Duration) {
        let key = key.into();
        if delay.is_zero() {
            return self.add(key, lane);
        }
        let lane = self.lane_index(lane);
        self.state().add_after(key, lane, Instant::now() + delay);
        // A waiting worker may need to wake earlier than it planned.
        self.shared.ready.notify_one();
    }

    /// Queues `key` after its next backoff delay; returns that delay.
    pub fn add_rate_limited(&self, key: impl Into<K>, lane: usize) -> Duration {
        let key = key.into();
        let delay = {
            let mut state = self.state();
            let failures = state.failures.entry(key.clone()).or_insert(0);
            *failures = failures.saturating_add(1);
            self.shared.backoff.delay(*failures)
        };
        if let Some(m) = &self.shared.meters {
            m.retries.inc();
        }
        self.add_after(key, lane, delay);
        delay
    }

    /// Resets the backoff of `key` (after a success).
    pub fn forget<Q: Hash + Eq + ?Sized>(&self, key: &Q)
    where
        K: Borrow<Q>,
    {
        self.state().failures.remove(key);
    }

    /// How many times `key` has failed since its last success.
    pub fn failures<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
    {
        self.state().failures.get(key).copied().unwrap_or(0)
    }

    /// Waits for the next key; `None` once the queue is shut down.
    pub async fn get(&self) -> Option<Item<K>> {
        loop {
            let notified = self.shared.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = {
                let mut state = self.state();
                if state.shutting_down {
                    return None;
                }
                let now = Instant::now();
                state.promote_due(now);
                if let Some(item) = state.pop(now) {
                    let more = state.has_queued();
                    drop(state);
                    if let Some(m) = &self.shared.meters {
                        m.queue_duration.observe(item.waited.as_secs_f64());
                    }
                    if more {
                        self.shared.ready.notify_one();
                    }
                    return Some(item);
                }
                state.next_due()
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` as processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let (requeued, started) = {
            let mut state = self.state();
            let started = state.processing.remove(key);
            state.shrink_when_sparse();
            let mut requeued = false;
            let ticket = state.ticket();
            let state = &mut *state;
            if let Some(dirty) = state.dirty.get_mut(key)
                && !dirty.queued
            {
                dirty.queued = true;
                dirty.ticket = ticket;
                state.lanes[dirty.lane].push_back((key.clone(), ticket));
                state.queued[dirty.lane] += 1;
                requeued = true;
            }
            (requeued, started)
        };
        if let (Some(m), Some(started)) = (&self.shared.meters, started) {
            m.work_duration.observe(started.elapsed().as_secs_f64());
        }
        if requeued {
            self.shared.ready.notify_one();
        }
        self.shared.idle.notify_waiters();
    }

    /// Stops handing out keys: every waiting and later [`get`](Self::get) returns `None`, and
    /// adds are ignored. Keys being processed may still be marked done.
    pub fn shut_down(&self) {
        self.state().shutting_down = true;
        self.shared.ready.notify_waiters();
    }

    /// Waits until no key is being processed.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.state().processing.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Queued keys over all lanes.
    pub fn len(&self) -> usize {
        self.state().queued.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }
}

trait QueueStats: Send + Sync {
    fn snapshot(&self) -> Snapshot;
}

impl<K: Clone + Eq + Hash + Send> QueueStats for Shared<K> {
    fn snapshot(&self) -> Snapshot {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let lanes = self
            .lane_names
            .iter()
            .enumerate()
            .map(|(index, name)| {
                let oldest = state.lanes[index]
                    .iter()
                    .filter_map(|(key, ticket)| {
                        state
                            .dirty
                            .get(key)
                            .filter(|d| d.ticket == *ticket && d.queued)
                    })
                    .map(|d| now.saturating_duration_since(d.since))
                    .max()
                    .unwrap_or_default();
                LaneSnapshot {
                    name: name.clone(),
                    depth: state.queued[index],
                    oldest,
                }
            })
            .collect();
        let running = state
            .processing
            .values()
            .map(|started| now.saturating_duration_since(*started));
        let (unfinished, longest) = running
            .fold((Duration::ZERO, Duration::ZERO), |(sum, max), d| {
                (sum + d, max.max(d))
            });
        Snapshot {
            name: self.name.clone(),
            lanes,
            delayed: state.delayed.len(),
            processing: state.processing.len(),
            unfinished,
            longest,
        }
    }
}

/// client-go's bucket layout for the queue and work durations: 10 ns to 10 s, factor 10.
fn duration_buckets() -> Vec<f64> {
    (0..10).map(|i| 1e-8 * 10f64.powi(i)).collect()
}

/// The workqueue metrics of one registry, shared by all queues reporting into it.
#[derive(Clone)]
pub struct WorkQueueMetrics {
    adds: IntCounterVec,
    retries: IntCounterVec,
    queue_duration: HistogramVec,
    work_duration: HistogramVec,
    queues: Arc<Mutex<Vec<Weak<dyn QueueStats>>>>,
}

impl WorkQueueMetrics {
    /// Registers the workqueue metric families into `registry`.
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let adds = IntCounterVec::new(
            Opts::new(
                "workqueue_adds_total",
                "[ALPHA] Total number of adds handled by workqueue",
            ),
            &["name"],
        )?;
        let retries = IntCounterVec::new(
            Opts::new(
                "workqueue_retries_total",
                "[ALPHA] Total number of retries handled by workqueue",
            ),
            &["name"],
        )?;
        let queue_duration = HistogramVec::new(
            HistogramOpts::new(
                "workqueue_queue_duration_seconds",
                "[ALPHA] How long in seconds an item stays in workqueue before being requested.",
            )
            .buckets(duration_buckets()),
            &["name"],
        )?;
        let work_duration = HistogramVec::new(
            HistogramOpts::new(
                "workqueue_work_duration_seconds",
                "[ALPHA] How long in seconds processing an item from workqueue takes.",
            )
            .buckets(duration_buckets()),
            &["name"],
        )?;
        let queues = Arc::new(Mutex::new(Vec::new()));
        registry.register(Box::new(adds.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(queue_duration.clone()))?;
        registry.register(Box::new(work_duration.clone()))?;
        registry.register(Box::new(StateCollector::new(queues.clone())?))?;
        Ok(Self {
            adds,
            retries,
            queue_duration,
            work_duration,
            queues,
        })
    }

    fn meters(&self, name: &str) -> Meters {
        Meters {
            adds: self.adds.with_label_values(&[name]),
            retries: self.retries.with_label_values(&[name]),
            queue_duration: self.queue_duration.with_label_values(&[name]),
            work_duration: self.work_duration.with_label_values(&[name]),
        }
    }

    fn track(&self, queue: Weak<dyn QueueStats>) {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues.retain(|q| q.strong_count() > 0);
        queues.push(queue);
    }
}

/// Gauges computed from the queues' state at scrape time, so that an idle queue costs nothing.
struct StateCollector {
    queues: Arc<Mutex<Vec<Weak<dyn QueueStats>>>>,
    depth: GaugeVec,
    unfinished: GaugeVec,
    longest: GaugeVec,
    delayed: GaugeVec,
    lane_depth: GaugeVec,
    lane_oldest: GaugeVec,
    descs: Vec<Desc>,
    /// Serialises scrapes, which reset and refill the gauges.
    scrape: Mutex<()>,
}

impl StateCollector {
    fn new(queues: Arc<Mutex<Vec<Weak<dyn QueueStats>>>>) -> Result<Self, prometheus::Error> {
        let gauge =
            |name: &str, help: &str, labels: &[&str]| GaugeVec::new(Opts::new(name, help), labels);
        let depth = gauge(
            "workqueue_depth",
            "[ALPHA] Current depth of workqueue",
            &["name"],
        )?;
        let unfinished = gauge(
            "workqueue_unfinished_work_seconds",
            "[ALPHA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
            &["name"],
        )?;
        let longest = gauge(
            "workqueue_longest_running_processor_seconds",
            "[ALPHA] How many seconds has the longest running processor for workqueue been running.",
            &["name"],
        )?;
        let delayed = gauge(
            "workqueue_delayed_items",
            "Items waiting for their retry backoff or delay to expire before they are queued",
            &["name"],
        )?;
        let lane_depth = gauge(
            "workqueue_lane_depth",
            "Items queued in one lane of the workqueue",
            &["name", "lane"],
        )?;
        let lane_oldest = gauge(
            "workqueue_lane_oldest_item_age_seconds",
            "How long the oldest item queued in one lane has been waiting",
            &["name", "lane"],
        )?;
        let descs = [
            &depth,
            &unfinished,
            &longest,
            &delayed,
            &lane_depth,
            &lane_oldest,
        ]
        .iter()
        .flat_map(|g| g.desc().into_iter().cloned())
        .collect();
        Ok(Self {
            queues,
            depth,
            unfinished,
            longest,
            delayed,
            lane_depth,
            lane_oldest,
            descs,
            scrape: Mutex::new(()),
        })
    }
}

impl Collector for StateCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        let snapshots: Vec<Snapshot> = self
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .map(|q| q.snapshot())
            .collect();
        let gauges = [
            &self.depth,
            &self.unfinished,
            &self.longest,
            &self.delayed,
            &self.lane_depth,
            &self.lane_oldest,
        ];
        for gauge in gauges {
            gauge.reset();
        }
        for s in &snapshots {
            let name = [s.name.as_str()];
            self.depth.with_label_values(&name).set(s.depth() as f64);
            self.unfinished
                .with_label_values(&name)
                .set(s.unfinished.as_secs_f64());
            self.longest
                .with_label_values(&name)
                .set(s.longest.as_secs_f64());
            self.delayed.with_label_values(&name).set(s.delayed as f64);
            for lane in &s.lanes {
                let labels = [s.name.as_str(), lane.name.as_str()];
                self.lane_depth
                    .with_label_values(&labels)
                    .set(lane.depth as f64);
                self.lane_oldest
                    .with_label_values(&labels)
                    .set(lane.oldest.as_secs_f64());
            }
        }
        gauges.iter().flat_map(|g| g.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(lanes: &[&str]) -> WorkQueue<String> {
        WorkQueue::new(
            QueueConfig {
                name: "test".into(),
                lanes: lanes.iter().map(|s| s.to_string()).collect(),
                backoff: Backoff {
                    start: Duration::from_secs(1),
                    max: Duration::from_secs(300),
                },
            },
            None,
        )
    }

    async fn next(q: &WorkQueue<String>) -> Item<String> {
        tokio::time::timeout(Duration::from_secs(3600), q.get())
            .await
            .expect("a key within the deadline")
            .expect("queue not shut down")
    }

    fn ready_now(q: &WorkQueue<String>) -> Option<Item<String>> {
        futures::FutureExt::now_or_never(q.get()).flatten()
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff {
            start: Duration::from_secs(1),
            max: Duration::from_secs(300),
        };
        let delays: Vec<u64> = (1..=11).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[tokio::test(start_paused = true)]
    async fn duplicates_are_queued_once() {
        let q = queue(&["a"]);
        q.add("x", 0);
        q.add("x", 0);
        q.add("y", 0);
        assert_eq!(q.len(), 2);
        assert_eq!(next(&q).await.key, "x");
        assert_eq!(next(&q).await.key, "y");
        assert!(ready_now(&q).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_never_processed_twice_at_once() {
        let q = queue(&["a"]);
        q.add("x", 0);
        let item = next(&q).await;
        q.add("x", 0);
        assert!(ready_now(&q).is_none(), "must wait for done");
        q.done(&item.key);
        assert_eq!(next(&q).await.key, "x");
    }

    #[tokio::test(start_paused = true)]
    async fn lanes_take_turns() {
        let q = queue(&["attach", "detach"]);
        for i in 0..5 {
            q.add(format!("d{i}"), 1);
        }
        q.add("a0", 0);
        q.add("a1", 0);
        let order: Vec<String> = [(); 5].iter().map(|_| ready_now(&q).unwrap().key).collect();
        assert_eq!(order, ["a0", "d0", "a1", "d1", "d2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn adding_to_another_lane_moves_the_key() {
        let q = queue(&["attach", "detach"]);
        q.add("x", 0);
        q.add("x", 1);
        let snapshot = q.snapshot();
        assert_eq!(snapshot.lanes[0].depth, 0);
        assert_eq!(snapshot.lanes[1].depth, 1);
        let item = next(&q).await;
        assert_eq!((item.key.as_str(), item.lane), ("x", 1));
        assert!(ready_now(&q).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_keys_wait_their_backoff() {
        let q = queue(&["a"]);
        assert_eq!(q.add_rate_limited("x", 0), Duration::from_secs(1));
        assert_eq!(q.add_rate_limited("x", 0), Duration::from_secs(2));
        assert!(ready_now(&q).is_none());
        assert_eq!(q.snapshot().delayed, 1);
        let started = Instant::now();
        let item = next(&q).await;
        // The earlier of the two pending delays wins.
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        assert_eq!(item.key, "x");
        q.done(&item.key);
        assert_eq!(q.failures(&"x".to_string()), 2);
        q.forget(&"x".to_string());
        assert_eq!(q.add_rate_limited("x", 0), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_wakes_for_an_earlier_delay() {
        let q = queue(&["a"]);
        q.add_after("late", 0, Duration::from_secs(100));
        let worker = {
            let q = q.clone();
            tokio::spawn(async move { next(&q).await })
        };
        tokio::task::yield_now().await;
        q.add_after("early", 0, Duration::from_secs(5));
        let started = Instant::now();
        let item = worker.await.unwrap();
        assert_eq!(item.key, "early");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_releases_waiting_workers() {
        let q = queue(&["a"]);
        let worker = {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        };
        tokio::task::yield_now().await;
        q.shut_down();
        assert!(worker.await.unwrap().is_none());
        q.add("x", 0);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn wait_idle_waits_for_processing_keys() {
        let q = queue(&["a"]);
        q.add("x", 0);
        let item = next(&q).await;
        let idle = {
            let q = q.clone();
            tokio::spawn(async move { q.wait_idle().await })
        };
        tokio::task::yield_now().await;
        assert!(!idle.is_finished());
        q.done(&item.key);
        tokio::time::timeout(Duration::from_secs(1), idle)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_use_client_go_names() {
        let registry = prometheus::Registry::new();
        let metrics = WorkQueueMetrics::register(&registry).unwrap();
        let q: WorkQueue<String> = WorkQueue::new(
            QueueConfig {
                name: "csi-attacher-va".into(),
                lanes: vec!["attach".into(), "detach".into()],
                backoff: Backoff {
                    start: Duration::from_secs(1),
                    max: Duration::from_secs(300),
                },
            },
            Some(&metrics),
        );
        q.add("x", 0);
        q.add("y", 1);
        tokio::time::advance(Duration::from_secs(3)).await;
        let item = next(&q).await;
        q.add_rate_limited(item.key.clone(), 0);
        q.done(&item.key);
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in [
            r#"workqueue_adds_total{name="csi-attacher-va"} 2"#,
            r#"workqueue_retries_total{name="csi-attacher-va"} 1"#,
            r#"workqueue_depth{name="csi-attacher-va"} 1"#,
            r#"workqueue_delayed_items{name="csi-attacher-va"} 1"#,
            r#"workqueue_lane_depth{lane="detach",name="csi-attacher-va"} 1"#,
            r#"workqueue_lane_depth{lane="attach",name="csi-attacher-va"} 0"#,
            r#"workqueue_lane_oldest_item_age_seconds{lane="detach",name="csi-attacher-va"} 3"#,
            r#"workqueue_queue_duration_seconds_count{name="csi-attacher-va"} 1"#,
            r#"workqueue_work_duration_seconds_count{name="csi-attacher-va"} 1"#,
            r#"workqueue_longest_running_processor_seconds{name="csi-attacher-va"} 0"#,
            "# HELP workqueue_depth [ALPHA] Current depth of workqueue",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        drop(q);
        let text = String::from_utf8({
            let mut t = Vec::new();
            prometheus::Encoder::encode(
                &prometheus::TextEncoder::new(),
                &registry.gather(),
                &mut t,
            )
            .unwrap();
            t
        })
        .unwrap();
        assert!(!text.contains(r#"workqueue_depth{name="csi-attacher-va"}"#));
    }
}
