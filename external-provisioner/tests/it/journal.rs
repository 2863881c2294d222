//! The intent journal: unanswered CreateVolume calls survive a crash of the provisioner and are
//! driven to a final state by the next one.

use std::time::Duration;

use crate::common::{Env, eventually, mock, requests};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use external_provisioner::journal::{self, Location};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::json;
use sidecar_kit::pipeline::workqueue::Backoff;
use testkit::apiserver::counters::Verb;
use tonic::Code;

/// The journal's entries (claim UID → intent).
async fn entries(env: &Env) -> journal::Entries {
    Api::<ConfigMap>::namespaced(env.client(), &env.namespace())
        .get_opt("provisioner-journal")
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .unwrap_or_default()
}

/// Waits until the claim is gone for good, not merely being deleted (a real cluster holds it
/// until its pvc-protection finalizer goes): a provisioner that met it would finish its volume.
async fn wait_claim_gone(env: &Env, name: &str) {
    let pvcs = env.pvcs();
    eventually(&format!("claim {name} gone"), || {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt(name).await.unwrap().is_none().then_some(()) }
    })
    .await;
}

/// Provisioner A gets a lost answer for a CreateVolume that did create the volume, and crashes
/// before it repeats the call. Returns the claim's UID.
async fn crash_after_a_lost_answer(env: &mut Env, journal_on: bool) -> String {
    let mut config = env.config(&[]).await;
    if journal_on {
        config.journal = Some(env.journal_location());
    }
    // Retries far off, so that the crash comes first.
    config.backoff = Backoff {
        start: Duration::from_secs(60),
        max: Duration::from_secs(60),
    };
    env.launch(config);
    env.mock
        .faults()
        .lose_answers(CREATE_VOLUME, 1, Code::DeadlineExceeded);
    let class = env.create_class(json!({})).await;
    let pvc = env.create_claim("data", &class, json!({})).await;
    let calls = env.mock.calls().clone();
    eventually("the CreateVolume whose answer is lost", || {
        let n = calls.count(CREATE_VOLUME);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    assert_eq!(
        env.driver_volumes().len(),
        1,
        "the driver created the volume"
    );
    env.crash().await;
    pvc.metadata.uid.unwrap()
}

async fn restart_with_journal(env: &mut Env) {
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    env.launch(config);
}

#[tokio::test]
async fn a_crash_with_an_unanswered_create_and_a_deleted_claim_leaks_nothing() {
    let mut env = Env::without_controller(mock()).await;
    let uid = crash_after_a_lost_answer(&mut env, true).await;
    let recorded = entries(&env).await;
    let (intents, bad) = journal::decode::<journal::Intent>(&recorded);
    assert!(bad.is_empty());
    assert_eq!(intents.len(), 1, "the intent was recorded before the call");
    assert_eq!(intents[0].0, uid);
    assert_eq!(intents[0].1.prepared.request.name, format!("pvc-{uid}"));

    env.delete_claim("data").await;
    wait_claim_gone(&env, "data").await;
    restart_with_journal(&mut env).await;
    let calls = env.mock.calls().clone();
    eventually("the volume deleted by the next provisioner", || {
        let n = calls.count(DELETE_VOLUME);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    assert!(env.driver_volumes().is_empty(), "no leaked volume");
    let creates = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(creates.len(), 2);
    assert_eq!(
        creates[0], creates[1],
        "the replay repeats the identical request"
    );
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn without_the_journal_the_same_crash_leaks_the_volume() {
    // Upstream's behaviour, and the proof that the test above can fail.
    let mut env = Env::without_controller(mock()).await;
    crash_after_a_lost_answer(&mut env, false).await;
    env.delete_claim("data").await;
    wait_claim_gone(&env, "data").await;
    let mut config = env.config(&[]).await;
    config.journal = None;
    env.launch(config);
    // The new provisioner has nothing to go on: the claim is gone and no PV names the volume.
    // Give it a claim to provision as a marker that it is running and has synced.
    let class = env.create_class(json!({})).await;
    env.create_claim("marker", &class, json!({})).await;
    env.wait_bound("marker").await;
    assert_eq!(env.driver_volumes().len(), 2, "the first volume leaked");
    env.stop().await;
}

#[tokio::test]
async fn a_crash_with_an_unanswered_create_and_a_live_claim_binds_it() {
    let mut env = Env::without_controller(mock()).await;
    crash_after_a_lost_answer(&mut env, true).await;
    restart_with_journal(&mut env).await;
    let pv = env.wait_bound("data").await;
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    assert_eq!(env.driver_volumes(), vec![handle], "exactly one volume");
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn a_burst_costs_few_journal_writes() {
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    config.workers = 50;
    env.launch(config);
    let class = env.create_class(json!({})).await;
    let claims = 100;
    // A burst: the claims of a StatefulSet scaled up at once, created concurrently.
    let creates = (0..claims).map(|i| {
        let env = &env;
        let class = class.clone();
        async move { env.create_claim(&format!("c{i}"), &class, json!({})).await }
    });
    futures::future::join_all(creates).await;
    for i in 0..claims {
        env.wait_bound(&format!("c{i}")).await;
    }
    eventually("every intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    if let Some(counters) = env.cluster.counters() {
        let writes =
            counters.total(Verb::Create, "configmaps") + counters.total(Verb::Update, "configmaps");
        eprintln!("{writes} journal writes for {claims} claims");
        assert!(
            writes * 4 < claims,
            "{writes} journal writes for a burst of {claims} claims"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn a_journal_in_a_missing_namespace_turns_itself_off_and_provisioning_goes_on() {
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(Location {
        namespace: format!("{}-missing", env.namespace()),
        name: "provisioner-journal".into(),
    });
    env.launch(config);
    let class = env.create_class(json!({})).await;
    env.create_claim("data", &class, json!({})).await;
    env.wait_bound("data").await;
    if let Some(counters) = env.cluster.counters() {
        assert_eq!(
            counters.total(Verb::Create, "configmaps"),
            1,
            "one refused create, then the journal is off"
        );
    }
    env.stop().await;
}

/// Writes `entries` as the journal's data, replacing what is there (again on a conflict: the
/// crashed provisioner's journal writer may still be forgetting).
async fn write_entries(env: &Env, entries: &journal::Entries) {
    let api = Api::<ConfigMap>::namespaced(env.client(), &env.namespace());
    eventually("the journal rewritten", || async {
        let mut journal = api.get("provisioner-journal").await.unwrap();
        journal.data = Some(entries.clone());
        match api
            .replace(
                "provisioner-journal",
                &kube::api::PostParams::default(),
                &journal,
            )
            .await
        {
            Ok(_) => Some(()),
            Err(kube::Error::Api(status)) if status.code == 409 => None,
            Err(err) => panic!("{err}"),
        }
    })
    .await;
}

/// Whoever can write ConfigMaps in the journal's namespace forges entries out of genuine ones:
/// one under another claim's UID, one naming another tenant's volume for a claim that does not
/// exist, one cloning that volume into a live claim, one reading a secret the claim's class
/// does not name. Each is dropped with a Warning Event on the journal; the driver sees none of
/// them: the claims are provisioned as their classes say, and the other volume is untouched.
#[tokio::test]
async fn forged_journal_entries_are_dropped_and_never_reach_the_driver() {
    use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
    use csi_proto::v1::{
        CreateVolumeRequest, VolumeCapability, VolumeContentSource, volume_content_source,
    };
    use external_provisioner::model::SecretRef;
    use k8s_openapi::api::core::v1::Secret;
    use sidecar_kit::driver::csi::CallOptions;
    use testkit::leaks::distinctive_secret;

    let mut env = Env::without_controller(mock()).await;
    let ns = env.namespace();
    // Another tenant's volume at the driver, which no PV of the cluster names.
    let victim = env
        .csi
        .create_volume(
            CreateVolumeRequest {
                name: "tenant-b-data".into(),
                volume_capabilities: vec![VolumeCapability {
                    access_mode: Some(AccessMode {
                        mode: access_mode::Mode::SingleNodeWriter as i32,
                    }),
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                }],
                ..Default::default()
            },
            CallOptions::timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id;
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    let mut stolen = String::new();
    for name in ["alice-prov", "bob-prov", "carol-prov", "tenant-b-admin"] {
        let password = distinctive_secret();
        if name == "tenant-b-admin" {
            stolen = password.clone();
        }
        let secret: Secret = serde_json::from_value(
            json!({"metadata": {"name": name}, "stringData": {"password": password}}),
        )
        .unwrap();
        secrets
            .create(&kube::api::PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let class = env
        .create_class(json!({"parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}-prov",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
        }}))
        .await;

    // Genuine intents: the answers of three CreateVolume calls are lost, then the provisioner
    // crashes.
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    config.backoff = Backoff {
        start: Duration::from_secs(60),
        max: Duration::from_secs(60),
    };
    env.launch(config);
    // Every answer is lost until the crash: on a real cluster a claim's update (the
    // controller-manager's annotations) makes the provisioner try a claim again at once, so
    // counting calls would not tell that each claim has had its call.
    env.mock
        .faults()
        .lose_answers(CREATE_VOLUME, 1000, Code::DeadlineExceeded);
    let mut uid = std::collections::HashMap::new();
    for name in ["alice", "bob", "carol"] {
        let claim = env.create_claim(name, &class, json!({})).await;
        uid.insert(name, claim.metadata.uid.unwrap());
    }
    let calls = env.mock.calls().clone();
    let wanted: std::collections::BTreeSet<String> =
        uid.values().map(|uid| format!("pvc-{uid}")).collect();
    eventually("an unanswered CreateVolume call for each claim", || {
        let named: std::collections::BTreeSet<String> = calls
            .of(CREATE_VOLUME)
            .iter()
            .filter_map(|call| {
                let request: serde_json::Value = serde_json::from_str(&call.request).ok()?;
                request["name"].as_str().map(str::to_string)
            })
            .collect();
        let all = wanted.is_subset(&named);
        async move { all.then_some(()) }
    })
    .await;
    env.crash().await;
    env.mock.faults().lose_answers(CREATE_VOLUME, 0, Code::Ok);
    let (genuine, bad) = journal::decode::<journal::Intent>(&entries(&env).await);
    assert!(bad.is_empty());
    let intent = |name: &str| {
        genuine
            .iter()
            .find(|(key, _)| key == &uid[name])
            .map(|(_, intent)| intent.clone())
            .unwrap()
    };

    let mut forged = journal::Entries::new();
    let text = |intent: &journal::Intent| serde_json::to_string(intent).unwrap();
    // Alice's intent under Bob's UID.
    forged.insert(uid["bob"].clone(), text(&intent("alice")));
    // A claim that does not exist, whose "volume" is the other tenant's: a replay would find
    // it by name and delete it.
    let gone = "0b5ae7e0-0000-4000-8000-00000000dead".to_string();
    let mut foreign = intent("alice");
    foreign.claim.uid = gone.clone();
    foreign.prepared.pv.claim_ref.uid = Some(gone.clone());
    foreign.prepared.request.name = "tenant-b-data".into();
    foreign.prepared.pv.name = "tenant-b-data".into();
    forged.insert(gone, text(&foreign));
    // Alice's volume cloned from the other tenant's.
    let mut clone = intent("alice");
    clone.prepared.request.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: victim.clone(),
            },
        )),
    });
    forged.insert(uid["alice"].clone(), text(&clone));
    // Carol's CreateVolume with the other tenant's credentials.
    let mut borrowed = intent("carol");
    borrowed.prepared.provisioner_secret = Some(SecretRef {
        namespace: ns.clone(),
        name: "tenant-b-admin".into(),
    });
    forged.insert(uid["carol"].clone(), text(&borrowed));
    write_entries(&env, &forged).await;

    let before = env.mock.calls().count(CREATE_VOLUME);
    restart_with_journal(&mut env).await;
    for name in ["alice", "bob", "carol"] {
        env.wait_bound(name).await;
    }
    eventually("every forged entry dropped", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    let rejected = eventually("a Warning Event per forged entry", || async {
        let events = env.events_for(&ns, "provisioner-journal").await;
        let rejected: Vec<String> = events
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(journal::REJECTED_REASON))
            .filter_map(|e| e.message)
            .collect();
        (rejected.len() == 4).then_some(rejected)
    })
    .await;
    for part in [
        "is the intent of claim UID",
        "volume name \"tenant-b-data\"",
        "volume content source",
        "provisioner secret reference",
    ] {
        assert!(
            rejected.iter().any(|m| m.contains(part)),
            "no Event says {part:?}: {rejected:?}"
        );
    }

    // The driver saw each claim's own request once more, and nothing else.
    let calls = env.mock.calls().of(CREATE_VOLUME);
    let replayed: Vec<_> = calls.iter().skip(before as usize).collect();
    let mut names: Vec<String> = replayed
        .iter()
        .map(|call| {
            let request: serde_json::Value = serde_json::from_str(&call.request).unwrap();
            assert!(
                request.get("volumeContentSource").is_none()
                    && request.get("volume_content_source").is_none(),
                "a content source reached the driver: {request}"
            );
            assert!(
                !call.carries_secret("password", &stolen),
                "the other tenant's secret reached the driver"
            );
            request["name"].as_str().unwrap().to_string()
        })
        .collect();
    names.sort();
    let mut expected: Vec<String> = ["alice", "bob", "carol"]
        .iter()
        .map(|name| format!("pvc-{}", uid[name]))
        .collect();
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(env.mock.calls().count(DELETE_VOLUME), 0);
    assert!(
        env.driver_volumes_by_id().contains(&victim),
        "the other tenant's volume is untouched"
    );
    env.stop().await;
}
