//! Volume conditions, as the driver reports them through ListVolumes or ControllerGetVolume,
//! become Events on the claims.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;

const ABNORMAL: &str = "VolumeConditionAbnormal";
const NORMAL: &str = "VolumeConditionNormal";

/// Abnormal: a Warning with the driver's message at every check (folded into the Event's
/// count); healthy again: one Normal Event; never abnormal: nothing.
async fn abnormal_then_recovered(list: bool) {
    let mut env = Env::start(mock(list), |_| {}).await;
    let sick = env.bound_claim("sick").await;
    env.bound_claim("well").await;
    env.set_condition(&sick, Some("the disk is failing"));
    let events = env
        .events_until("sick", "the abnormal Event, repeated", |events| {
            events
                .iter()
                .any(|(_, reason, _, count)| reason == ABNORMAL && *count >= 2)
        })
        .await;
    assert_eq!(
        (events[0].0.as_str(), events[0].2.as_str()),
        ("Warning", "the disk is failing")
    );
    assert_eq!(events.len(), 1, "repeats fold into one Event: {events:?}");
    assert!(
        env.events("well").await.is_empty(),
        "a healthy volume gets no Event"
    );

    env.set_condition(&sick, None);
    env.events_until("sick", "the recovery", |events| {
        events.iter().any(|(_, reason, _, _)| reason == NORMAL)
    })
    .await;
    // Two more checks of every volume: the recovery is not reported again.
    let method = if list {
        "/csi.v1.Controller/ListVolumes"
    } else {
        "/csi.v1.Controller/ControllerGetVolume"
    };
    let calls = env.mock.calls().count(method);
    eventually("two more checks", || async {
        (env.mock.calls().count(method) >= calls + 4).then_some(())
    })
    .await;
    let normal: Vec<_> = env
        .events("sick")
        .await
        .into_iter()
        .filter(|(_, reason, _, _)| reason == NORMAL)
        .collect();
    assert_eq!(
        normal,
        [(
            "Normal".to_string(),
            NORMAL.to_string(),
            "The Volume returns to the healthy state".to_string(),
            1
        )]
    );
    env.stop().await;
}

#[tokio::test]
async fn list_volumes_reports_an_abnormal_volume_on_its_claim_and_its_recovery_once() {
    abnormal_then_recovered(true).await;
}

#[tokio::test]
async fn get_volume_reports_an_abnormal_volume_on_its_claim_and_its_recovery_once() {
    abnormal_then_recovered(false).await;
}

/// With a slow driver: no volume is checked twice at once or more than once per interval,
/// and no more than `--worker-threads` calls are in flight. Both bounds are upper bounds over
/// the time the calls took, so a slow machine cannot break them.
#[tokio::test]
async fn each_volume_is_checked_once_per_interval_within_the_worker_limit() {
    const LATENCY: Duration = Duration::from_millis(300);
    const INTERVAL: Duration = Duration::from_millis(100);
    let mut env = Env::start(mock(false), |config| {
        config.workers = 2;
        config.monitor_interval = INTERVAL;
    })
    .await;
    env.mock
        .faults()
        .set_latency("/csi.v1.Controller/ControllerGetVolume", LATENCY);
    let mut handles = Vec::new();
    for i in 0..5 {
        handles.push(env.bound_claim(&format!("c{i}")).await);
    }
    env.mock.calls().clear();
    let start = Instant::now();
    let calls = eventually("every volume checked twice", || async {
        let calls = env
            .mock
            .calls()
            .of("/csi.v1.Controller/ControllerGetVolume");
        let mut per_volume: HashMap<String, u32> = HashMap::new();
        for call in &calls {
            let request: serde_json::Value = serde_json::from_str(&call.request).unwrap();
            let id = request["volume_id"]
                .as_str()
                .or(request["volumeId"].as_str())
                .unwrap_or_default()
                .to_string();
            *per_volume.entry(id).or_default() += 1;
        }
        handles
            .iter()
            .all(|h| per_volume.get(h).is_some_and(|n| *n >= 2))
            .then_some(per_volume)
    })
    .await;
    let elapsed = start.elapsed();
    let total: u32 = calls.values().sum();
    // Two at a time, each taking LATENCY: at most two per LATENCY, plus the two in flight.
    let in_flight_bound = 2 * (elapsed.as_millis() / LATENCY.as_millis()) as u32 + 2;
    assert!(
        total <= in_flight_bound,
        "{total} calls in {elapsed:?}: more than 2 in flight"
    );
    // One volume: one call at a time, then an interval.
    let per_volume_bound = (elapsed.as_millis() / (LATENCY + INTERVAL).as_millis()) as u32 + 1;
    for (volume, count) in &calls {
        assert!(
            *count <= per_volume_bound,
            "{volume} checked {count} times in {elapsed:?}"
        );
    }
    env.stop().await;
}
