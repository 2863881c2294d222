//! Leader election against a Kubernetes API (the test kit's API server, or a real cluster
//! through `TestCluster`), including Leases written by client-go's rules as an upstream
//! replica would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use sidecar_kit::cluster::leader::{ElectionConfig, LeaderElector, LeaderError};
use testkit::apiserver::TestCluster;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "external-attacher-leader-mock-csi-example-com";

fn config(cluster: &TestCluster, identity: &str) -> ElectionConfig {
    ElectionConfig {
        lease_name: LEASE.into(),
        namespace: cluster.namespace().into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(300),
        labels: BTreeMap::from([("app".to_string(), "csi-attacher".to_string())]),
        release_on_exit: true,
        event_source: format!("external-attacher-leader-mock.csi.example.com/{identity}"),
        warm_standby: false,
    }
}

/// A running candidate: `leading` turns true while its controllers would run.
struct Candidate {
    shutdown: CancellationToken,
    leading: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<Result<(), LeaderError>>,
}

impl Candidate {
    fn start(server: &TestCluster, config: ElectionConfig, terms: Arc<AtomicUsize>) -> Self {
        let elector = LeaderElector::new(server.client(), config);
        let shutdown = CancellationToken::new();
        let (tx, leading) = watch::channel(false);
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            elector
                .run(stop, |leading_token| async move {
                    terms.fetch_add(1, Ordering::SeqCst);
                    let _ = tx.send(true);
                    leading_token.cancelled().await;
                    let _ = tx.send(false);
                })
                .await
        });
        Self {
            shutdown,
            leading,
            task,
        }
    }

    async fn wait_leading(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.leading.wait_for(|l| *l))
            .await
            .is_ok()
    }

    fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }
}

async fn lease(server: &TestCluster) -> Lease {
    Api::<Lease>::default_namespaced(server.client())
        .get(LEASE)
        .await
        .unwrap()
}

fn spec(lease: &Lease) -> LeaseSpec {
    lease.spec.clone().unwrap()
}

#[tokio::test]
async fn one_leader_failover_and_fast_release() {
    let server = TestCluster::start().await.unwrap();
    let terms = Arc::new(AtomicUsize::new(0));
    let mut a = Candidate::start(&server, config(&server, "replica-a"), terms.clone());
    assert!(
        a.wait_leading(Duration::from_secs(10)).await,
        "the first candidate leads"
    );
    let mut b = Candidate::start(&server, config(&server, "replica-b"), terms.clone());

    // The second candidate stays out while the first renews.
    assert!(
        !b.wait_leading(Duration::from_secs(3)).await,
        "two leaders at once"
    );
    let held = spec(&lease(&server).await);
    assert_eq!(held.holder_identity.as_deref(), Some("replica-a"));
    assert_eq!(held.lease_duration_seconds, Some(2));
    assert_eq!(held.lease_transitions, Some(0));
    assert!(held.renew_time.unwrap().0 >= held.acquire_time.unwrap().0);
    assert_eq!(
        lease(&server).await.metadata.labels.unwrap()["app"],
        "csi-attacher"
    );

    // Graceful shutdown releases the Lease: the other candidate takes over at once.
    a.shutdown.cancel();
    let released_at = Instant::now();
    assert!(a.task.await.unwrap().is_ok());
    assert!(b.wait_leading(Duration::from_secs(5)).await);
    let handover = released_at.elapsed();
    assert!(
        handover < Duration::from_secs(1),
        "handover took {handover:?}"
    );
    let taken = spec(&lease(&server).await);
    assert_eq!(taken.holder_identity.as_deref(), Some("replica-b"));
    assert_eq!(taken.lease_transitions, Some(1));

    // A leader that dies without releasing is replaced once its Lease expires.
    let mut c = Candidate::start(&server, config(&server, "replica-c"), terms.clone());
    assert!(!c.wait_leading(Duration::from_secs(1)).await);
    b.task.abort();
    let died_at = Instant::now();
    assert!(c.wait_leading(Duration::from_secs(10)).await, "no failover");
    assert!(
        died_at.elapsed() >= Duration::from_millis(1500),
        "took over a live Lease"
    );
    assert_eq!(spec(&lease(&server).await).lease_transitions, Some(2));
    assert_eq!(terms.load(Ordering::SeqCst), 3);
    c.shutdown.cancel();
    c.task.await.unwrap().unwrap();
}

/// The Events on the Lease, oldest first.
async fn lease_events(server: &TestCluster) -> Vec<Event> {
    let mut events: Vec<Event> = Api::<Event>::default_namespaced(server.client())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Lease")
                && e.involved_object.name.as_deref() == Some(LEASE)
        })
        .collect();
    events.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
    events
}

/// Each won election is an Event on the Lease, as client-go's LeaseLock records it.
#[tokio::test]
async fn a_won_election_is_an_event_on_the_lease() {
    let server = TestCluster::start().await.unwrap();
    let terms = Arc::new(AtomicUsize::new(0));
    let mut a = Candidate::start(&server, config(&server, "replica-a"), terms.clone());
    assert!(a.wait_leading(Duration::from_secs(10)).await);
    let mut b = Candidate::start(&server, config(&server, "replica-b"), terms);
    a.shutdown.cancel();
    a.task.await.unwrap().unwrap();
    assert!(b.wait_leading(Duration::from_secs(5)).await);
    let held = lease(&server).await;

    let deadline = Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events = lease_events(&server).await;
        if events.len() >= 2 || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seen: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.message.as_deref(),
                e.source.as_ref().and_then(|s| s.component.as_deref()),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                Some("replica-a became leader"),
                Some("external-attacher-leader-mock.csi.example.com/replica-a")
            ),
            (
                Some("replica-b became leader"),
                Some("external-attacher-leader-mock.csi.example.com/replica-b")
            ),
        ]
    );
    for event in &events {
        assert_eq!(event.reason.as_deref(), Some("LeaderElection"));
        assert_eq!(event.type_.as_deref(), Some("Normal"));
        assert_eq!(event.count, Some(1));
        let object = &event.involved_object;
        assert_eq!(
            object.api_version.as_deref(),
            Some("coordination.k8s.io/v1")
        );
        assert_eq!(object.namespace.as_deref(), Some(server.namespace()));
        assert_eq!(object.uid, held.metadata.uid);
    }
    // The Lease as the new leader wrote it.
    let taken = events[1].involved_object.resource_version.as_deref();
    assert!(taken.is_some_and(|version| !version.is_empty()));
    b.shutdown.cancel();
    b.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_lease_held_by_client_go_is_honoured() {
    let server = TestCluster::start().await.unwrap();
    let leases = Api::<Lease>::default_namespaced(server.client());
    let upstream_record = |renew: Timestamp| LeaseSpec {
        holder_identity: Some("csi-attacher-upstream-7d9f".into()),
        lease_duration_seconds: Some(2),
        acquire_time: Some(MicroTime(Timestamp::from_second(1_700_000_000).unwrap())),
        renew_time: Some(MicroTime(renew)),
        lease_transitions: Some(4),
        ..Default::default()
    };
    let created = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE.into()),
                    ..Default::default()
                },
                spec: Some(upstream_record(Timestamp::now())),
            },
        )
        .await
        .unwrap();

    let terms = Arc::new(AtomicUsize::new(0));
    let mut ours = Candidate::start(&server, config(&server, "replica-rust"), terms);
    // The upstream replica renews every 500 ms: ours must not take over, however long it waits.
    let mut current = created;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !ours.is_leading(),
            "took over a Lease that client-go keeps renewing"
        );
        current.spec = Some(upstream_record(Timestamp::now()));
        current = leases
            .replace(LEASE, &PostParams::default(), &current)
            .await
            .unwrap();
    }
    // The upstream replica stops renewing: ours takes over after the lease duration.
    let stopped = Instant::now();
    assert!(ours.wait_leading(Duration::from_secs(10)).await);
    assert!(
        stopped.elapsed() >= Duration::from_millis(1800),
        "did not wait for expiry"
    );
    let taken = spec(&lease(&server).await);
    assert_eq!(taken.holder_identity.as_deref(), Some("replica-rust"));
    assert_eq!(taken.lease_transitions, Some(5));
    assert!(taken.acquire_time.unwrap().0 > Timestamp::from_second(1_700_000_000).unwrap());
}

#[tokio::test]
async fn losing_the_lease_ends_leadership_with_an_error() {
    let server = TestCluster::start().await.unwrap();
    let terms = Arc::new(AtomicUsize::new(0));
    let elector = LeaderElector::new(server.client(), config(&server, "replica-a"));
    let health = elector.health();
    let mut a = {
        let shutdown = CancellationToken::new();
        let (tx, leading) = watch::channel(false);
        let stop = shutdown.clone();
        let terms = terms.clone();
        let task = tokio::spawn(async move {
            elector
                .run(stop, |token| async move {
                    terms.fetch_add(1, Ordering::SeqCst);
                    let _ = tx.send(true);
                    token.cancelled().await;
                    let _ = tx.send(false);
                })
                .await
        });
        Candidate {
            shutdown,
            leading,
            task,
        }
    };
    assert!(a.wait_leading(Duration::from_secs(10)).await);
    assert!(health.is_leader());
    assert_eq!(health.check().status, http::StatusCode::OK);

    // Someone else writes the Lease as its holder (as a split-brain replica would) and keeps it.
    let leases = Api::<Lease>::default_namespaced(server.client());
    let stop_thief = CancellationToken::new();
    let thief = tokio::spawn({
        let stop = stop_thief.clone();
        async move {
            while !stop.is_cancelled() {
                if let Ok(mut current) = leases.get(LEASE).await {
                    let mut spec = current.spec.clone().unwrap();
                    spec.holder_identity = Some("intruder".into());
                    spec.renew_time = Some(MicroTime(Timestamp::now()));
                    current.spec = Some(spec);
                    let _ = leases
                        .replace(LEASE, &PostParams::default(), &current)
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let outcome = tokio::time::timeout(Duration::from_secs(10), &mut a.task)
        .await
        .expect("leadership loss noticed");
    stop_thief.cancel();
    thief.await.unwrap();
    assert!(matches!(outcome.unwrap(), Err(LeaderError::Lost { .. })));
    // The controllers' future is dropped at once, not drained: another replica may be leading.
    assert!(
        a.leading.has_changed().is_err(),
        "the controllers are still running"
    );
    assert!(!health.is_leader());
}

fn metric(registry: &prometheus::Registry, family: &str) -> Option<f64> {
    registry
        .gather()
        .into_iter()
        .find(|f| f.name() == family)?
        .get_metric()
        .iter()
        .find(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "name" && l.value() == LEASE)
        })
        .map(|m| m.get_gauge().get_value() + m.get_counter().get_value())
}

#[tokio::test]
async fn renewals_take_the_fast_path_until_someone_else_writes() {
    let server = TestCluster::start().await.unwrap();
    let registry = prometheus::Registry::new();
    let metrics = sidecar_kit::cluster::leader::LeaderMetrics::register(&registry).unwrap();
    let elector =
        LeaderElector::new(server.client(), config(&server, "fast")).with_metrics(metrics);
    let shutdown = CancellationToken::new();
    let (tx, mut leading) = watch::channel(false);
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        elector
            .run(stop, |token| async move {
                let _ = tx.send(true);
                token.cancelled().await;
            })
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        metric(&registry, "leader_election_master_status"),
        Some(1.0)
    );

    // Renewals with nobody else writing: each is one write over the Lease last written.
    let first = spec(&lease(&server).await).renew_time;
    let deadline = Instant::now() + Duration::from_secs(10);
    while spec(&lease(&server).await).renew_time == first {
        assert!(Instant::now() < deadline, "no renewal");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(&registry, "leader_election_slowpath_total").unwrap_or(0.0),
        0.0,
        "renewed on the fast path"
    );

    // Another writer changes the Lease: the optimistic write conflicts, the slow path renews.
    let mut changed = lease(&server).await;
    changed
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("example.com/touched".into(), "yes".into());
    Api::<Lease>::default_namespaced(server.client())
        .replace(LEASE, &PostParams::default(), &changed)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&registry, "leader_election_slowpath_total").unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "no slow-path renewal");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(*leading.borrow(), "still leading");
    assert_eq!(
        spec(&lease(&server).await).holder_identity.as_deref(),
        Some("fast")
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        metric(&registry, "leader_election_master_status"),
        Some(0.0)
    );
    server.cleanup().await.unwrap();
}
