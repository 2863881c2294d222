//! KEP-4958's consolidated Lease (its PR #5672): the controllers of one process elect their
//! leader on one Lease instead of one each. Whoever first wins that Lease takes over the legacy
//! Leases of the single sidecars, all or none, marks the migration done on the consolidated
//! Lease and releases the legacy ones. A legacy Lease that its holder still renews stops the
//! takeover: a single sidecar still leads, and running the same controller beside it would
//! make two leaders.
//!
//! Unlike the PR, the legacy Leases are checked at every election won, not only before the
//! migration is marked done: single sidecars brought back by a rollback are noticed too.
//! A Lease held under this process's own identity is watched too: identities are host names,
//! and a single sidecar in the same pod or on the same host has the same one.
//! Liveness is judged as client-go judges it, by watching whether a record changes within its
//! lease duration on the local clock, so clock skew between nodes does not matter.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::time::Instant;

use crate::cluster::leader::{ElectionConfig, LeaderError};

/// The consolidated Lease's annotation once the legacy Leases were taken over.
pub const MIGRATION_ANNOTATION: &str = "migration.csi.k8s.io/status";
pub const MIGRATION_COMPLETED: &str = "completed";

/// The consolidated Lease's lock name for `driver`: its Lease's name before sanitizing, and
/// what its Events name.
pub fn lock_name(driver: &str) -> String {
    format!("csi-sidecars-leader-{driver}")
}

/// The consolidated Lease's name for `driver`.
pub fn lease_name(driver: &str) -> String {
    crate::cluster::leader::sanitize_name(&lock_name(driver))
}

/// Who holds a legacy Lease, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// Nobody: missing or released.
    Free,
    /// A holder, alive or not. It may carry this process's identity and still be another
    /// process: identities are host names, and a single sidecar in the same pod (or on the same
    /// host) has the same one. This process holds legacy Leases only during a takeover.
    Held(String),
}

pub fn holder(spec: Option<&LeaseSpec>) -> Holder {
    match spec.and_then(|s| s.holder_identity.as_deref()) {
        None | Some("") => Holder::Free,
        Some(h) => Holder::Held(h.to_string()),
    }
}

/// The verdict on a held legacy Lease, watched since `first` was read.
#[derive(Debug, PartialEq, Eq)]
pub enum Watched {
    /// Its holder renewed it (or another took it): a single sidecar leads.
    Alive(String),
    /// Released meanwhile.
    Free,
    /// Unchanged so far.
    Unchanged,
}

pub fn watched(first: &LeaseSpec, now: Option<&LeaseSpec>) -> Watched {
    match holder(now) {
        Holder::Free => Watched::Free,
        Holder::Held(h) if now != Some(first) => Watched::Alive(h),
        Holder::Held(_) => Watched::Unchanged,
    }
}

/// Checks the legacy Leases of `legacy` and, unless the consolidated Lease says the migration
/// is done, takes them over: all are written with this identity, the consolidated Lease is
/// marked, and they are released. `consolidated` is the election this process has just won.
pub async fn take_over(
    client: &kube::Client,
    consolidated: &ElectionConfig,
    legacy: &[ElectionConfig],
) -> Result<(), LeaderError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &consolidated.namespace);
    let identity = consolidated.identity.as_str();
    let failed = |lease: &str, err: kube::Error| LeaderError::Takeover {
        lease: lease.to_string(),
        reason: err.to_string(),
    };

    // Read them all; watch those held for one lease duration.
    let mut read: Vec<(&ElectionConfig, Option<Lease>)> = Vec::with_capacity(legacy.len());
    for config in legacy {
        let lease = api
            .get_opt(&config.lease_name)
            .await
            .map_err(|e| failed(&config.lease_name, e))?;
        read.push((config, lease));
    }
    let mut held: Vec<(usize, LeaseSpec)> = read
        .iter()
        .enumerate()
        .filter_map(|(i, (_, lease))| {
            let spec = lease.as_ref()?.spec.clone()?;
            matches!(holder(Some(&spec)), Holder::Held(_)).then_some((i, spec))
        })
        .collect();
    let longest = held
        .iter()
        .map(|(_, s)| Duration::from_secs(s.lease_duration_seconds.unwrap_or(0).max(0) as u64))
        .max()
        .unwrap_or_default();
    let deadline = Instant::now() + longest;
    if !held.is_empty() {
        tracing::info!(leases = ?held.iter().map(|(i, _)| &read[*i].0.lease_name).collect::<Vec<_>>(), wait = ?longest, "legacy Leases are held; waiting to see whether their holders renew them");
    }
    while !held.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(consolidated.retry_period.min(deadline - Instant::now())).await;
        let mut still = Vec::with_capacity(held.len());
        for (i, first) in held {
            let name = &read[i].0.lease_name;
            let now = api.get_opt(name).await.map_err(|e| failed(name, e))?;
            match watched(&first, now.as_ref().and_then(|l| l.spec.as_ref())) {
                Watched::Alive(holder) => {
                    return Err(LeaderError::LegacyLeader {
                        namespace: consolidated.namespace.clone(),
                        lease: name.clone(),
                        holder,
                    });
                }
                Watched::Free => read[i].1 = now,
                Watched::Unchanged => {
                    read[i].1 = now;
                    still.push((i, first));
                }
            }
        }
        held = still;
    }

    let marked = api
        .get_opt(&consolidated.lease_name)
        .await
        .map_err(|e| failed(&consolidated.lease_name, e))?
        .and_then(|l| l.metadata.annotations)
        .and_then(|a| a.get(MIGRATION_ANNOTATION).cloned());
    if marked.as_deref() == Some(MIGRATION_COMPLETED) {
        return Ok(());
    }

    // All or none: a write that fails gives back what was taken.
    let mut taken: Vec<Lease> = Vec::with_capacity(read.len());
    for (config, lease) in read {
        match take(&api, config, identity, lease).await {
            Ok(written) => taken.push(written),
            Err(err) => {
                release(&api, taken).await;
                return Err(failed(&config.lease_name, err));
            }
        }
    }
    let mark = serde_json::json!({"metadata": {"annotations": {MIGRATION_ANNOTATION: MIGRATION_COMPLETED}}});
    if let Err(err) = api
        .patch(
            &consolidated.lease_name,
            &PatchParams::default(),
            &Patch::Merge(&mark),
        )
        .await
    {
        release(&api, taken).await;
        return Err(failed(&consolidated.lease_name, err));
    }
    tracing::info!(leases = ?taken.iter().filter_map(|l| l.metadata.name.as_deref()).collect::<Vec<_>>(), lease = %consolidated.lease_name, "took over the legacy Leases; the consolidated Lease is marked and they are released");
    release(&api, taken).await;
    Ok(())
}

/// Writes this identity's record into a legacy Lease, created if missing; the read
/// resourceVersion makes the write fail if anybody wrote meanwhile.
async fn take(
    api: &Api<Lease>,
    config: &ElectionConfig,
    identity: &str,
    read: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let now = MicroTime(Timestamp::now());
    let transitions = read
        .as_ref()
        .and_then(|l| l.spec.as_ref()?.lease_transitions)
        .unwrap_or(0);
    let spec = LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(config.lease_duration.as_secs().max(1) as i32),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        lease_transitions: Some(transitions + 1),
        ..Default::default()
    };
    match read {
        Some(mut lease) => {
            lease.spec = Some(spec);
            api.replace(&config.lease_name, &PostParams::default(), &lease)
                .await
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(config.lease_name.clone()),
                    namespace: Some(config.namespace.clone()),
                    labels: (!config.labels.is_empty()).then(|| config.labels.clone()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await
        }
    }
}

/// Releases Leases as client-go does: an empty holder and a one-second duration.
async fn release(api: &Api<Lease>, leases: Vec<Lease>) {
    let now = MicroTime(Timestamp::now());
    for mut lease in leases {
        let Some(name) = lease.metadata.name.clone() else {
            continue;
        };
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now.clone()),
            lease_transitions: transitions,
            ..Default::default()
        });
        if let Err(err) = api.replace(&name, &PostParams::default(), &lease).await {
            tracing::warn!(lease = %name, error = %err, "cannot release a legacy Lease; it will expire");
        }
    }
}

/// Labels for the consolidated Lease: those of the elections it replaces.
pub fn labels(legacy: &[ElectionConfig]) -> BTreeMap<String, String> {
    legacy.iter().flat_map(|c| c.labels.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_free_only_when_missing_or_released() {
        assert_eq!(holder(None), Holder::Free);
        assert_eq!(holder(Some(&spec("", 1))), Holder::Free);
        assert_eq!(
            holder(Some(&spec("pod-a", 1))),
            Holder::Held("pod-a".into())
        );
    }

    #[test]
    fn a_holder_is_alive_when_its_record_changes() {
        let first = spec("pod-a", 1);
        assert_eq!(watched(&first, Some(&first)), Watched::Unchanged);
        assert_eq!(
            watched(&first, Some(&spec("pod-a", 3))),
            Watched::Alive("pod-a".into())
        );
        assert_eq!(
            watched(&first, Some(&spec("pod-b", 1))),
            Watched::Alive("pod-b".into()),
            "another single sidecar took it"
        );
        assert_eq!(watched(&first, Some(&spec("", 3))), Watched::Free);
        assert_eq!(watched(&first, None), Watched::Free);
    }

    #[test]
    fn the_lease_is_named_after_the_driver() {
        assert_eq!(
            lease_name("csi.example.com"),
            "csi-sidecars-leader-csi-example-com"
        );
    }
}
