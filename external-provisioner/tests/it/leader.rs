//! Two replicas under leader election: only the leader provisions, and the other takes over
//! when the leader dies without releasing its Lease.

use std::time::Duration;

use crate::common::{Env, eventually, mock, requests};
use csi_proto::methods::controller::CREATE_VOLUME;
use external_provisioner::controller;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::json;
use sidecar_kit::cluster::leader::{ElectionConfig, LeaderElector};
use tokio_util::sync::CancellationToken;

fn election(env: &Env, identity: &str) -> ElectionConfig {
    ElectionConfig {
        lease_name: "hostpath-csi-k8s-io".into(),
        namespace: env.namespace(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(1),
        retry_period: Duration::from_millis(200),
        labels: Default::default(),
        release_on_exit: true,
        event_source: format!("hostpath.csi.k8s.io/{identity}"),
        warm_standby: false,
    }
}

#[tokio::test]
async fn only_the_leader_provisions_and_the_other_takes_over() {
    let env = Env::without_controller(mock()).await;
    let mut replicas = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let mut config = env.config(&[]).await;
        config.journal = Some(env.journal_location());
        let elector = LeaderElector::new(env.client(), election(&env, identity));
        let (client, csi) = (env.client(), env.csi.clone());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(elector.run(shutdown.clone(), move |leading| {
            controller::run(config, client, csi, leading)
        }));
        replicas.push((identity, task, shutdown));
        if identity == "replica-a" {
            // The first one leads before the second starts.
            let leases: Api<Lease> = Api::namespaced(env.client(), &env.namespace());
            eventually("replica-a leading", || async {
                let holder = leases
                    .get_opt("hostpath-csi-k8s-io")
                    .await
                    .unwrap()?
                    .spec?
                    .holder_identity?;
                (holder == "replica-a").then_some(())
            })
            .await;
        }
    }
    let mut env = env;
    let class = env.create_class(json!({})).await;
    env.create_claim("one", &class, json!({})).await;
    env.wait_bound("one").await;
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME).len(),
        1,
        "only the leader provisions"
    );

    // The leader crashes without releasing its Lease.
    let (_, leader, _) = replicas.remove(0);
    leader.abort();
    let _ = leader.await;
    env.create_claim("two", &class, json!({})).await;
    env.wait_bound("two").await;
    let leases: Api<Lease> = Api::namespaced(env.client(), &env.namespace());
    let holder = leases
        .get("hostpath-csi-k8s-io")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("replica-b"));
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME).len(),
        2,
        "each claim provisioned once"
    );
    let (_, follower, shutdown) = replicas.remove(0);
    shutdown.cancel();
    follower.await.unwrap().unwrap();
    env.stop().await;
}

/// A warm standby (`--leader-election-warm-standby`) watches and indexes while the other
/// replica leads, makes no CSI call until it leads, and once the leader dies without releasing
/// its Lease takes over with the caches it has: no list of claims or volumes after the death.
#[tokio::test]
async fn a_warm_standby_takes_over_with_the_caches_it_synced_while_waiting() {
    use sidecar_kit::runtime::host::{Controller, supervise};

    let env = Env::without_controller(mock()).await;
    let leases: Api<Lease> = Api::namespaced(env.client(), &env.namespace());
    let holder = || async {
        leases
            .get_opt("hostpath-csi-k8s-io")
            .await
            .unwrap()?
            .spec?
            .holder_identity
    };
    let mut replicas = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let mut config = env.config(&[]).await;
        config.journal = Some(env.journal_location());
        let election = ElectionConfig {
            warm_standby: true,
            ..election(&env, identity)
        };
        let (client, csi) = (env.client(), env.csi.clone());
        let controller = Controller::new("provisioner", Some((env.client(), election)), {
            move |token| controller::run(config, client, csi, token)
        });
        let shutdown = CancellationToken::new();
        replicas.push((
            tokio::spawn(supervise(vec![controller], shutdown.clone())),
            shutdown,
        ));
        if identity == "replica-a" {
            eventually("replica-a leading", || async {
                (holder().await? == "replica-a").then_some(())
            })
            .await;
        }
    }
    let mut env = env;
    let class = env.create_class(json!({})).await;
    env.create_claim("one", &class, json!({})).await;
    env.wait_bound("one").await;
    let counters = env.cluster.counters();
    // Both replicas watch claims: the standby's watch is open before the leader dies.
    if let Some(counters) = &counters {
        eventually("both replicas watching claims and PVs", || async {
            (counters.lists("persistentvolumeclaims") >= 2
                && counters.lists("persistentvolumes") >= 2)
                .then_some(())
        })
        .await;
    }
    let listed = counters.as_ref().map(|c| {
        (
            c.lists("persistentvolumeclaims"),
            c.lists("persistentvolumes"),
        )
    });
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME).len(),
        1,
        "the standby does not act"
    );

    let (leader, _) = replicas.remove(0);
    leader.abort();
    let _ = leader.await;
    env.create_claim("two", &class, json!({})).await;
    env.wait_bound("two").await;
    assert_eq!(holder().await.as_deref(), Some("replica-b"));
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME).len(),
        2,
        "each claim provisioned once"
    );
    if let Some(counters) = &counters {
        assert_eq!(
            Some((
                counters.lists("persistentvolumeclaims"),
                counters.lists("persistentvolumes")
            )),
            listed,
            "the new leader works from the caches it synced as a standby"
        );
    }
    let (follower, shutdown) = replicas.remove(0);
    shutdown.cancel();
    follower.await.unwrap().unwrap();
    assert_eq!(holder().await.as_deref(), Some(""), "released on shutdown");
    env.stop().await;
}
