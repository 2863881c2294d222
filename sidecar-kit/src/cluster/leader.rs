//! Leader election on a `coordination.k8s.io/v1` Lease, following client-go's LeaseLock rules so
//! that an upstream replica and ours can share one Lease during a rolling migration:
//!
//! - a Lease held by another identity is valid until `leaseDurationSeconds` after the moment
//!   *we observed* its last change (local clock, so clock skew between nodes does not matter);
//! - acquiring sets `acquireTime` and increments `leaseTransitions`; renewing keeps both;
//! - every write is an update carrying the resourceVersion that was read (optimistic locking);
//! - releasing writes an empty `holderIdentity` with `leaseDurationSeconds: 1`.
//!
//! Unlike client-go, a waiting candidate also watches the Lease, so a released Lease is taken
//! over at once instead of after up to one retry period.
//!
//! A won election is recorded as client-go's LeaseLock records it: an Event on the Lease,
//! Normal, reason `LeaderElection`, `<identity> became leader`, from the component
//! csi-lib-utils names its recorder (`<lock name>/<host name>`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::events::{EventType, Recorder, Reporter};
use crate::process::flags::LeaderElectionFlags;
use crate::process::http::Reply;

/// How long past the lease duration a leader may fail to renew before `/healthz/leader-election`
/// reports failure (client-go's `DefaultHealthCheckTimeout`).
pub const HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost leadership of Lease {namespace}/{name}: not renewed within the renew deadline")]
    Lost { namespace: String, name: String },
    #[error("invalid leader election settings: {0}")]
    Config(String),
    #[error(
        "Lease {namespace}/{lease} of a single sidecar is renewed by {holder}: scale down the \
         legacy sidecar deployment; a process with --leader-election-consolidated runs no \
         controller while a single sidecar leads it"
    )]
    LegacyLeader {
        namespace: String,
        lease: String,
        holder: String,
    },
    #[error("cannot take over Lease {lease}: {reason}")]
    Takeover { lease: String, reason: String },
}

/// Upstream's name sanitizing for Lease names and identities: every character outside
/// `[a-zA-Z0-9-]` becomes `-`, and a trailing `-` gets an `X` appended.
pub fn sanitize_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// The Lease namespace: the flag, else `$POD_NAMESPACE`, else the service account's namespace,
/// else `default`.
pub fn lease_namespace(flag: &str) -> String {
    if !flag.is_empty() {
        return flag.to_string();
    }
    if let Ok(ns) = std::env::var("POD_NAMESPACE")
        && !ns.is_empty()
    {
        return ns;
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|ns| ns.trim().to_string())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// The host name: the pod name in Kubernetes.
fn host_name() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    from_kernel
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// This process's identity: the host name, sanitized.
pub fn default_identity() -> String {
    sanitize_name(&host_name())
}

/// The component of the Events of an election on the Lock `lock_name` (as the sidecar names it,
/// before sanitizing): csi-lib-utils' `<lock name>/<host name>`.
pub fn event_source(lock_name: &str) -> String {
    format!("{lock_name}/{}", host_name())
}

/// The reason of the Event of a won election, client-go's.
pub const LEADER_ELECTION_REASON: &str = "LeaderElection";

/// Settings of one election.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub labels: BTreeMap<String, String>,
    pub release_on_exit: bool,
    /// The component the Event of a won election is from ([`event_source`]).
    pub event_source: String,
    /// Whether the controllers run (watch, index, queue) while they wait for the Lease, and
    /// only their acting waits for it (see [`crate::pipeline::leading`]).
    pub warm_standby: bool,
}

impl ElectionConfig {
    /// Settings from the upstream flags, for a Lease named after `lock_name` (sanitized), whose
    /// Events name `lock_name` as it is.
    pub fn from_flags(lock_name: &str, flags: &LeaderElectionFlags) -> Result<Self, LeaderError> {
        let config = Self {
            lease_name: sanitize_name(lock_name),
            namespace: lease_namespace(&flags.leader_election_namespace),
            identity: default_identity(),
            lease_duration: flags.leader_election_lease_duration,
            renew_deadline: flags.leader_election_renew_deadline,
            retry_period: flags.leader_election_retry_period,
            labels: flags.leader_election_labels.0.iter().cloned().collect(),
            release_on_exit: flags.leader_election_release_on_exit,
            event_source: event_source(lock_name),
            warm_standby: flags.leader_election_warm_standby,
        };
        config.validate()?;
        Ok(config)
    }

    /// client-go's sanity rules.
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.lease_duration <= self.renew_deadline {
            return Err(LeaderError::Config(
                "lease duration must be greater than the renew deadline".into(),
            ));
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return Err(LeaderError::Config(
                "renew deadline must be greater than 1.2 times the retry period".into(),
            ));
        }
        if self.retry_period.is_zero() {
            return Err(LeaderError::Config("retry period must be positive".into()));
        }
        Ok(())
    }
}

/// What to write after reading the Lease, decided from plain data.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Another holder's Lease is still valid.
    Wait { holder: String },
    /// Write our record: `acquire_time` of `None` means "now" (a new term).
    Write {
        acquire_time: Option<Timestamp>,
        transitions: i32,
    },
}

/// How long the holder's Lease lasts without renewal, as it wrote it (none: expired).
fn lease_duration(spec: &LeaseSpec) -> Duration {
    Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64)
}

/// client-go's rule: may `identity` take or keep the Lease whose record is `spec`, last seen
/// changing `since_change` ago?
pub fn decide(spec: &LeaseSpec, identity: &str, since_change: Duration) -> Decision {
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    let duration = lease_duration(spec);
    if holder == identity {
        return Decision::Write {
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            transitions,
        };
    }
    if !holder.is_empty() && since_change < duration {
        return Decision::Wait { holder };
    }
    Decision::Write {
        acquire_time: None,
        transitions: transitions + 1,
    }
}

/// How long after a Lease's expiry a candidate tries to take it: past it for sure, however the
/// timer fires.
const EXPIRY_MARGIN: Duration = Duration::from_millis(20);

#[derive(Debug)]
struct Observed {
    spec: Option<LeaseSpec>,
    changed_at: Instant,
    leading: bool,
    last_renewal: Option<Instant>,
    /// The Lease as this candidate last wrote it: the leader renews it without reading it
    /// first (client-go's optimistic fast path).
    written: Option<Lease>,
}

/// client-go's leader election metrics, with its names, help texts and `name` label.
#[derive(Clone)]
pub struct LeaderMetrics {
    master: prometheus::IntGaugeVec,
    slowpath: prometheus::IntCounterVec,
}

impl LeaderMetrics {
    /// Registers `leader_election_master_status` and `leader_election_slowpath_total`.
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let master = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "leader_election_master_status",
                "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            ),
            &["name"],
        )?;
        let slowpath = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "leader_election_slowpath_total",
                "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(master.clone()))?;
        registry.register(Box::new(slowpath.clone()))?;
        Ok(Self { master, slowpath })
    }
}

/// Cloneable view of the election for `/healthz/leader-election`.
#[derive(Clone)]
pub struct LeaderHealth {
    observed: Arc<Mutex<Observed>>,
    lease_duration: Duration,
    lease: String,
}

impl LeaderHealth {
    /// 200 `ok`, or 500 once the leader has failed to renew for lease duration + 20 s.
    pub fn check(&self) -> Reply {
        match self.problem() {
            Some(problem) => Reply::text(http::StatusCode::INTERNAL_SERVER_ERROR, problem),
            None => Reply::ok(),
        }
    }

    /// Several elections (an all-in-one process): 200 when all are healthy, else 500; the body
    /// has a line per Lease.
    pub fn check_all(elections: &[LeaderHealth]) -> Reply {
        if let [one] = elections {
            return one.check();
        }
        let mut failed = false;
        let mut body = String::new();
        for election in elections {
            let line = match election.problem() {
                Some(problem) => {
                    failed = true;
                    problem
                }
                None => "ok".to_string(),
            };
            body.push_str(&format!("{}: {line}\n", election.lease));
        }
        let status = if failed {
            http::StatusCode::INTERNAL_SERVER_ERROR
        } else {
            http::StatusCode::OK
        };
        Reply::text(status, body)
    }

    fn problem(&self) -> Option<String> {
        let Ok(observed) = self.observed.lock() else {
            return Some("internal server error: state unavailable".into());
        };
        if observed.leading
            && let Some(renewed) = observed.last_renewal
            && renewed.elapsed() > self.lease_duration + HEALTH_TOLERANCE
        {
            return Some(format!(
                "internal server error: failed election to renew leadership on lease {}",
                self.lease
            ));
        }
        None
    }

    pub fn is_leader(&self) -> bool {
        self.observed.lock().map(|o| o.leading).unwrap_or(false)
    }
}

/// One candidate in an election.
pub struct LeaderElector {
    client: kube::Client,
    api: Api<Lease>,
    config: ElectionConfig,
    observed: Arc<Mutex<Observed>>,
    changed: Arc<Notify>,
    metrics: Option<LeaderMetrics>,
}

impl LeaderElector {
    /// `client` should be a client of its own, so that renewals are not throttled by the
    /// controllers' requests.
    pub fn new(client: kube::Client, config: ElectionConfig) -> Self {
        let api = Api::namespaced(client.clone(), &config.namespace);
        let observed = Observed {
            spec: None,
            changed_at: Instant::now(),
            leading: false,
            last_renewal: None,
            written: None,
        };
        Self {
            client,
            api,
            config,
            observed: Arc::new(Mutex::new(observed)),
            changed: Arc::new(Notify::new()),
            metrics: None,
        }
    }

    /// Reports leadership and slow-path renewals into `metrics`.
    pub fn with_metrics(mut self, metrics: LeaderMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Whether its controllers run while it waits (`--leader-election-warm-standby`).
    pub fn warm_standby(&self) -> bool {
        self.config.warm_standby
    }

    pub fn health(&self) -> LeaderHealth {
        LeaderHealth {
            observed: self.observed.clone(),
            lease_duration: self.config.lease_duration,
            lease: format!("{}/{}", self.config.namespace, self.config.lease_name),
        }
    }

    /// Waits for leadership, then runs `lead` with a token that is cancelled on shutdown.
    ///
    /// Returns `Ok` after a graceful shutdown (`lead` has finished, and the Lease is released
    /// when configured), or `Err(Lost)` as soon as renewal fails; the caller should then exit,
    /// as upstream does, because another replica may already be leading.
    pub async fn run<F, Fut>(self, shutdown: CancellationToken, lead: F) -> Result<(), LeaderError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        // A candidate that does not win at once watches the Lease, to try again as soon as it
        // changes; the leader needs no watch.
        if !(self.try_acquire_or_renew().await || self.wait_for_lease(&shutdown).await) {
            return Ok(());
        }
        tracing::info!(lease = %self.config.lease_name, namespace = %self.config.namespace, identity = %self.config.identity, "became leader");
        self.set_leading(true);
        self.record_won();

        let leading = CancellationToken::new();
        let work = lead(leading.clone());
        let renewals = async {
            loop {
                tokio::time::sleep(self.config.retry_period).await;
                if !self.renew_within_deadline().await {
                    return;
                }
            }
        };
        tokio::pin!(work, renewals);
        let mut draining = false;
        let result = loop {
            tokio::select! {
                _ = &mut work => break Ok(()),
                _ = &mut renewals => {
                    leading.cancel();
                    self.set_leading(false);
                    tracing::error!(lease = %self.config.lease_name, "stopped leading");
                    break Err(LeaderError::Lost { namespace: self.config.namespace.clone(), name: self.config.lease_name.clone() });
                }
                _ = shutdown.cancelled(), if !draining => {
                    // Renewals go on while the controllers drain, so nobody else starts meanwhile.
                    draining = true;
                    leading.cancel();
                }
            }
        };
        if result.is_ok() && self.config.release_on_exit {
            self.release().await;
        }
        self.set_leading(false);
        result
    }

    /// [`acquire`](Self::acquire) with the Lease watched meanwhile.
    async fn wait_for_lease(&self, shutdown: &CancellationToken) -> bool {
        let watch_stop = shutdown.child_token();
        let _stop_watch = watch_stop.clone().drop_guard();
        let watch = tokio::spawn(watch_lease(
            self.api.clone(),
            self.config.lease_name.clone(),
            self.changed.clone(),
            watch_stop,
        ));
        let acquired = self.acquire(shutdown).await;
        watch.abort();
        acquired
    }

    /// Records the won election on the Lease as it was written, in the background.
    fn record_won(&self) {
        let Some(lease) = self.observed.lock().ok().and_then(|o| o.written.clone()) else {
            return;
        };
        let reporter = Reporter {
            component: self.config.event_source.clone(),
            instance: String::new(),
        };
        // client-go's reference names the Lease as written, its version included.
        let mut object = lease.object_ref(&());
        object.resource_version = lease.metadata.resource_version;
        // The writer task ends once this one Event is written.
        Recorder::spawn(self.client.clone(), reporter).record(
            object,
            EventType::Normal,
            LEADER_ELECTION_REASON,
            &format!("{} became leader", self.config.identity),
        );
    }

    fn set_leading(&self, leading: bool) {
        if let Ok(mut o) = self.observed.lock() {
            o.leading = leading;
        }
        if let Some(metrics) = &self.metrics {
            metrics
                .master
                .with_label_values(&[self.config.lease_name.as_str()])
                .set(i64::from(leading));
        }
    }

    /// Tries until leadership is acquired (true) or shutdown (false).
    async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        loop {
            if shutdown.is_cancelled() {
                return false;
            }
            if self.try_acquire_or_renew().await {
                return true;
            }
            // A Lease held by a replica that stopped renewing is taken as soon as it expires,
            // not up to a retry period later: that wait would be most of a failover.
            let pause = jittered(self.config.retry_period).min(self.until_expiry());
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(pause) => {}
                _ = self.changed.notified() => {}
            }
        }
    }

    /// Renews every retry period until success or until the renew deadline passes.
    async fn renew_within_deadline(&self) -> bool {
        let deadline = Instant::now() + self.config.renew_deadline;
        loop {
            let attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await;
            match attempt {
                Ok(true) => return true,
                Err(_) => return false,
                Ok(false) => {}
            }
            if Instant::now() + self.config.retry_period > deadline {
                return false;
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// One round of client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&self) -> bool {
        let now = Timestamp::now();
        if let Some(mut lease) = self.renewable() {
            // Fast path: the leader writes its renewal over the Lease it last wrote; the
            // resourceVersion makes the write fail if anybody else wrote meanwhile.
            let spec = lease.spec.clone().unwrap_or_default();
            lease.spec = Some(self.record(
                now,
                spec.acquire_time.map(|t| t.0),
                spec.lease_transitions.unwrap_or(0),
            ));
            match self
                .api
                .replace(&self.config.lease_name, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => {
                    self.observe_write(written);
                    return true;
                }
                Err(err) => {
                    tracing::info!(error = %err, lease = %self.config.lease_name, "Failed to update lock optimistically, falling back to slow path");
                }
            }
        }
        let current = match self.api.get_opt(&self.config.lease_name).await {
            Ok(current) => current,
            Err(err) => {
                tracing::warn!(error = %err, lease = %self.config.lease_name, "cannot read the leader Lease");
                return false;
            }
        };
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease_name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    labels: self.labels(None),
                    ..Default::default()
                },
                spec: Some(self.record(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe_write(created);
                    true
                }
                Err(err) => {
                    tracing::debug!(error = %err, "cannot create the leader Lease");
                    false
                }
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let since_change = self.observe_read(&spec);
        match decide(&spec, &self.config.identity, since_change) {
            Decision::Wait { holder } => {
                tracing::debug!(%holder, lease = %self.config.lease_name, "Lease is held by another candidate");
                false
            }
            Decision::Write {
                acquire_time,
                transitions,
            } => {
                if spec.holder_identity.as_deref() == Some(self.config.identity.as_str())
                    && let Some(metrics) = &self.metrics
                {
                    metrics
                        .slowpath
                        .with_label_values(&[self.config.lease_name.as_str()])
                        .inc();
                }
                lease.spec = Some(self.record(now, acquire_time, transitions));
                lease.metadata.labels = self.labels(lease.metadata.labels.take());
                match self
                    .api
                    .replace(&self.config.lease_name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(written) => {
                        self.observe_write(written);
                        true
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "cannot write the leader Lease");
                        false
                    }
                }
            }
        }
    }

    fn record(
        &self,
        now: Timestamp,
        acquire_time: Option<Timestamp>,
        transitions: i32,
    ) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(MicroTime(acquire_time.unwrap_or(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    fn labels(
        &self,
        existing: Option<BTreeMap<String, String>>,
    ) -> Option<BTreeMap<String, String>> {
        if self.config.labels.is_empty() {
            return existing;
        }
        let mut labels = existing.unwrap_or_default();
        labels.extend(self.config.labels.clone());
        Some(labels)
    }

    /// How long until the Lease last read expires as [`decide`] judges it, and a little more
    /// so that it has; a retry period when nothing was read.
    fn until_expiry(&self) -> Duration {
        let Ok(o) = self.observed.lock() else {
            return self.config.retry_period;
        };
        let Some(spec) = o.spec.as_ref() else {
            return self.config.retry_period;
        };
        (o.changed_at + lease_duration(spec) + EXPIRY_MARGIN)
            .saturating_duration_since(Instant::now())
    }

    /// Remembers the record read; returns how long ago it last changed as we saw it.
    fn observe_read(&self, spec: &LeaseSpec) -> Duration {
        let Ok(mut o) = self.observed.lock() else {
            return Duration::ZERO;
        };
        if o.spec.as_ref() != Some(spec) {
            o.spec = Some(spec.clone());
            o.changed_at = Instant::now();
        }
        o.leading = spec.holder_identity.as_deref() == Some(self.config.identity.as_str());
        o.changed_at.elapsed()
    }

    fn observe_write(&self, lease: Lease) {
        if let Ok(mut o) = self.observed.lock() {
            o.spec = lease.spec.clone();
            o.changed_at = Instant::now();
            o.leading = true;
            o.last_renewal = Some(Instant::now());
            o.written = Some(lease);
        }
    }

    /// The Lease to renew on the fast path: while this candidate leads and its last renewal
    /// is younger than the lease duration (client-go's `IsLeader() && isLeaseValid()`).
    fn renewable(&self) -> Option<Lease> {
        let o = self.observed.lock().ok()?;
        let valid = o
            .last_renewal
            .is_some_and(|r| r.elapsed() < self.config.lease_duration);
        (o.leading && valid).then(|| o.written.clone()).flatten()
    }

    /// Gives the Lease up so that another candidate takes over without waiting for expiry.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.lease_name).await else {
            return;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let now = Timestamp::now();
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: spec.lease_transitions,
            ..Default::default()
        });
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.config.lease_name, "released the leader Lease"),
            Err(err) => {
                tracing::warn!(error = %err, "cannot release the leader Lease; it will expire")
            }
        }
    }
}

/// client-go's jitter: a pause between `period` and 2.2 × `period`.
fn jittered(period: Duration) -> Duration {
    crate::runtime::jittered(period, 1.0, 2.2)
}

/// Wakes waiting candidates whenever the Lease changes.
async fn watch_lease(api: Api<Lease>, name: String, changed: Arc<Notify>, stop: CancellationToken) {
    // Listed from the watch cache (resourceVersion=0, which kube sends only without a page
    // size): the watch only wakes candidates, who read the Lease itself.
    let mut config = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .any_semantic();
    config.page_size = None;
    let stream = watcher(api, config);
    tokio::pin!(stream);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            event = stream.next() => match event {
                Some(Ok(_)) => changed.notify_waiters(),
                Some(Err(err)) => {
                    tracing::debug!(error = %err, "watch of the leader Lease failed; polling continues");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizing_as_upstream() {
        assert_eq!(sanitize_name("hostpath.csi.k8s.io"), "hostpath-csi-k8s-io");
        assert_eq!(
            sanitize_name("external-attacher-leader-hostpath.csi.k8s.io"),
            "external-attacher-leader-hostpath-csi-k8s-io"
        );
        assert_eq!(sanitize_name("driver/"), "driver-X");
        assert_eq!(sanitize_name("a_b"), "a-b");
    }

    fn spec(holder: &str, duration: i32, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            lease_transitions: Some(transitions),
            acquire_time: Some(MicroTime(Timestamp::from_second(1000).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let held = spec("other", 15, 3);
        assert_eq!(
            decide(&held, "me", Duration::from_secs(5)),
            Decision::Wait {
                holder: "other".into()
            }
        );
        assert_eq!(
            decide(&held, "me", Duration::from_secs(16)),
            Decision::Write {
                acquire_time: None,
                transitions: 4
            }
        );
        let mine = spec("me", 15, 3);
        assert_eq!(
            decide(&mine, "me", Duration::from_secs(100)),
            Decision::Write {
                acquire_time: Some(Timestamp::from_second(1000).unwrap()),
                transitions: 3
            }
        );
        let released = spec("", 1, 3);
        assert_eq!(
            decide(&released, "me", Duration::ZERO),
            Decision::Write {
                acquire_time: None,
                transitions: 4
            }
        );
        assert_eq!(
            decide(&LeaseSpec::default(), "me", Duration::ZERO),
            Decision::Write {
                acquire_time: None,
                transitions: 1
            }
        );
    }

    #[test]
    fn config_rules() {
        let mut config = ElectionConfig {
            lease_name: "l".into(),
            namespace: "ns".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(5),
            labels: BTreeMap::new(),
            release_on_exit: true,
            event_source: "l/me".into(),
            warm_standby: false,
        };
        assert!(config.validate().is_ok());
        config.renew_deadline = Duration::from_secs(6);
        assert!(config.validate().is_err());
        config.renew_deadline = Duration::from_secs(20);
        assert!(config.validate().is_err());
    }

    #[test]
    fn namespace_fallbacks() {
        assert_eq!(lease_namespace("explicit"), "explicit");
    }
}
