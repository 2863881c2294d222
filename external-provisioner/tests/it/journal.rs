//! The intent journal: unanswered CreateVolume calls survive a crash of the provisioner and are
//! driven to a final state by the next one.

use std::time::Duration;

use crate::common::{Env, eventually, mock, requests};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use external_provisioner::journal::{self, Location};
use external_provisioner::model::PV_FINALIZER;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use sidecar_kit::cluster::journal::keys::keyring_of;
use sidecar_kit::cluster::journal::seal::{Key, Keyring, seal};
use sidecar_kit::cluster::journal::{
    self as kit_journal, DropReason, JournalMetrics, Unjournaled, read_entry,
};

/// How soon a claim is provisioned after the journal became unusable: records go ahead at
/// once, and a write that finds no answer gives up after 5 s.
const UNUSABLE_LIMIT: Duration = Duration::from_secs(10);
use sidecar_kit::pipeline::workqueue::Backoff;
use testkit::apiserver::counters::Verb;
use testkit::apiserver::{Faults, RequestCounters, RequestMatch};
use tonic::Code;

/// The journal's entries (claim UID → sealed intent).
async fn entries(env: &Env) -> journal::Entries {
    Api::<Secret>::namespaced(env.client(), &env.namespace())
        .get_opt("provisioner-journal")
        .await
        .unwrap()
        .map(|secret| kit_journal::sealed_entries(&secret))
        .unwrap_or_default()
}

/// The keys the provisioner seals its journal with.
async fn keys(env: &Env) -> Keyring {
    let secret = Api::<Secret>::namespaced(env.client(), &env.namespace())
        .get("provisioner-journal-key")
        .await
        .unwrap();
    keyring_of(&secret).expect("the key Secret holds a key")
}

/// The journal's entries as the provisioner's keys open them: (key, intent), and the keys of
/// those that do not open.
async fn recorded(env: &Env) -> (Vec<(String, journal::Intent)>, Vec<String>) {
    let keys = keys(env).await;
    let location = env.journal_location();
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (key, value) in entries(env).await {
        match read_entry(&keys, &location, &journal::OWNER, &key, &value) {
            Ok(intent) => good.push((key, intent)),
            Err(_) => bad.push(key),
        }
    }
    (good, bad)
}

/// `intent` as the journal would hold it under `key`, sealed with `key`.
fn sealed(env: &Env, seal_key: &Key, key: &str, intent: &journal::Intent) -> String {
    let location = env.journal_location();
    let text = serde_json::to_string(intent).unwrap();
    seal(seal_key, location.place(key), &text)
}

/// The messages of the `JournalEntryRejected` Events on the journal.
async fn rejected(env: &Env) -> Vec<String> {
    env.events_for(&env.namespace(), "provisioner-journal")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(journal::REJECTED_REASON))
        .filter_map(|e| e.message)
        .collect()
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
    let (intents, bad) = recorded(&env).await;
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

/// A burst: the claims `c0`, `c1`… of a StatefulSet scaled up at once, created concurrently in
/// `class`, each waited for until Bound.
async fn provision_burst(env: &Env, class: &str, claims: u64) {
    let creates = (0..claims)
        .map(|i| async move { env.create_claim(&format!("c{i}"), class, json!({})).await });
    futures::future::join_all(creates).await;
    for i in 0..claims {
        env.wait_bound(&format!("c{i}")).await;
    }
}

/// Writes of the journal's Secret: the provisioner writes no other Secret but its key's, which
/// it creates once.
fn journal_writes(counters: &RequestCounters) -> u64 {
    counters.total(Verb::Create, "secrets") + counters.total(Verb::Update, "secrets") - 1
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
    provision_burst(&env, &class, claims).await;
    eventually("every intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    if let Some(counters) = env.cluster.counters() {
        let writes = journal_writes(&counters);
        eprintln!("{writes} journal writes for {claims} claims");
        assert!(
            writes * 4 < claims,
            "{writes} journal writes for a burst of {claims} claims"
        );
    }
    env.stop().await;
}

/// The journal's client waits for no limit of its own: the writer keeps to the budget, and
/// what arrives while it waits shares the next write.
#[tokio::test]
async fn journal_writes_keep_to_the_journals_budget() {
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    config.journal_client = Some(journal::JournalClient {
        client: env.client(),
        qps: kit_journal::MIN_QPS,
    });
    config.workers = 20;
    env.launch(config);
    let class = env.create_class(json!({})).await;
    let started = std::time::Instant::now();
    provision_burst(&env, &class, 40).await;
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(counters) = env.cluster.counters() {
        let writes = journal_writes(&counters);
        let allowed = f64::from(kit_journal::BURST) + elapsed * kit_journal::MIN_QPS;
        eprintln!("{writes} journal writes in {elapsed:.1} s");
        assert!(
            writes as f64 <= allowed.ceil(),
            "{writes} journal writes in {elapsed:.1} s at {} a second, burst {}",
            kit_journal::MIN_QPS,
            kit_journal::BURST
        );
        assert!(writes >= 2, "the records went out in more than one write");
    }
    env.stop().await;
}

/// At the default QPS the journal may write once a second: reads before the first intent's
/// write would hold the first claims for seconds after every start (and after an API outage).
#[tokio::test]
async fn the_journal_and_its_key_are_read_at_the_start_and_the_first_intent_costs_its_write_alone()
{
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    env.launch(config);
    let secrets = Api::<Secret>::namespaced(env.client(), &env.namespace());
    eventually("the journal's key made before any claim", || async {
        secrets
            .get_opt("provisioner-journal-key")
            .await
            .unwrap()
            .map(|_| ())
    })
    .await;
    let reads = |counters: &RequestCounters| counters.get(Verb::Get, "secrets");
    let before = env.cluster.counters().map(|counters| reads(&counters));
    let class = env.create_class(json!({})).await;
    env.create_claim("data", &class, json!({})).await;
    env.wait_bound("data").await;
    if let (Some(before), Some(counters)) = (before, env.cluster.counters()) {
        assert_eq!(
            reads(&counters),
            before,
            "the first intent read the journal or its key again"
        );
        assert_eq!(
            counters.total(Verb::Create, "secrets"),
            2,
            "the key and the journal, made at the start"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn a_journal_in_a_missing_namespace_never_holds_provisioning_up() {
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(Location {
        namespace: format!("{}-missing", env.namespace()),
        ..env.journal_location()
    });
    env.launch(config);
    let class = env.create_class(json!({})).await;
    let started = std::time::Instant::now();
    env.create_claim("data", &class, json!({})).await;
    env.wait_bound("data").await;
    let took = started.elapsed();
    assert!(
        took < UNUSABLE_LIMIT,
        "provisioned {took:?} after the claim"
    );
    if let Some(counters) = env.cluster.counters() {
        // Tried again with a growing pause from a second on, not in a loop.
        let creates = counters.total(Verb::Create, "secrets");
        assert!(
            (1..=5).contains(&creates),
            "{creates} refused creates of the key Secret"
        );
        assert_eq!(counters.total(Verb::Create, "configmaps"), 0);
    }
    env.stop().await;
}

/// Writes `entries` as the journal's data, replacing what is there (again on a conflict: the
/// crashed provisioner's journal writer may still be forgetting): what only someone who may
/// write the sidecar's Secrets can do.
async fn write_entries(env: &Env, entries: &journal::Entries) {
    let api = Api::<Secret>::namespaced(env.client(), &env.namespace());
    eventually("the journal rewritten", || async {
        let mut journal = api.get("provisioner-journal").await.unwrap();
        journal.data = Some(
            entries
                .iter()
                .map(|(k, v)| (k.clone(), k8s_openapi::ByteString(v.clone().into_bytes())))
                .collect(),
        );
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

/// Whoever holds the journal's key (stolen, say) forges entries out of genuine ones: one under
/// another claim's UID, one naming another tenant's volume for a claim that does not exist,
/// one cloning that volume into a live claim, one reading a secret the claim's class does not
/// name. Behind the seal, each is still checked against what the provisioner would record:
/// each is dropped with a Warning Event on the journal; the driver sees none of them: the
/// claims are provisioned as their classes say, and the other volume is untouched.
#[tokio::test]
async fn forged_entries_under_a_stolen_key_are_dropped_and_never_reach_the_driver() {
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
    let (genuine, bad) = recorded(&env).await;
    assert!(bad.is_empty());
    let stolen_key = keys(&env).await.current;
    let intent = |name: &str| {
        genuine
            .iter()
            .find(|(key, _)| key == &uid[name])
            .map(|(_, intent)| intent.clone())
            .unwrap()
    };

    let mut forged = journal::Entries::new();
    let mut forge = |key: &str, intent: &journal::Intent| {
        forged.insert(key.to_string(), sealed(&env, &stolen_key, key, intent));
    };
    // Alice's intent under Bob's UID.
    forge(&uid["bob"], &intent("alice"));
    // A claim that does not exist, whose "volume" is the other tenant's: a replay would find
    // it by name and delete it.
    let gone = "0b5ae7e0-0000-4000-8000-00000000dead".to_string();
    let mut foreign = intent("alice");
    foreign.claim.uid = gone.clone();
    foreign.prepared.pv.claim_ref.uid = Some(gone.clone());
    foreign.prepared.request.name = "tenant-b-data".into();
    foreign.prepared.pv.name = "tenant-b-data".into();
    forge(&gone, &foreign);
    // Alice's volume cloned from the other tenant's.
    let mut clone = intent("alice");
    clone.prepared.request.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: victim.clone(),
            },
        )),
    });
    forge(&uid["alice"], &clone);
    // Carol's CreateVolume with the other tenant's credentials.
    let mut borrowed = intent("carol");
    borrowed.prepared.provisioner_secret = Some(SecretRef {
        namespace: ns.clone(),
        name: "tenant-b-admin".into(),
    });
    forge(&uid["carol"], &borrowed);
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
        let rejected = rejected(&env).await;
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

/// The keys of the journal's Secret replaced as two rotations leave them: `current` new,
/// `previous` the one before, and the key before that gone.
async fn rotate_twice(env: &Env, previous: &[u8; 32]) {
    let api = Api::<Secret>::namespaced(env.client(), &env.namespace());
    let mut secret = api.get("provisioner-journal-key").await.unwrap();
    let data = secret.data.get_or_insert_default();
    data.insert("key".into(), k8s_openapi::ByteString(vec![0x5a; 32]));
    data.insert(
        "previous-key".into(),
        k8s_openapi::ByteString(previous.to_vec()),
    );
    data.insert(
        "rotated-at".into(),
        k8s_openapi::ByteString(k8s_openapi::jiff::Timestamp::now().to_string().into_bytes()),
    );
    api.replace(
        "provisioner-journal-key",
        &kube::api::PostParams::default(),
        &secret,
    )
    .await
    .unwrap();
}

/// The attack the seal is for: a claim provisioned under a Retain class is deleted and its PV
/// deleted by an administrator to keep the data, so nothing in the cluster names its volume
/// `pvc-<uid>` any more. Whoever may write the journal's Secret (but not read its key)
/// records intents under that UID so that a replay would find the volume by name and delete
/// it, or hand another tenant's secret or a clone source to the driver. None is acted on:
/// unsealed, under a made-up seal, under a key rotated out, under a key that is not a UID,
/// or (sealed with the previous key, which still opens) asking what the gone claim's live
/// class would not. The volume stays, nothing is deleted, no forged field reaches the driver,
/// and each entry is one Warning Event and one count of the metric by its reason.
#[tokio::test]
async fn without_the_key_no_entry_is_acted_on_for_a_gone_claim() {
    use csi_proto::v1::{VolumeContentSource, volume_content_source};
    use external_provisioner::model::SecretRef;
    use testkit::leaks::distinctive_secret;

    let mut env = Env::without_controller(mock()).await;
    let ns = env.namespace();
    let stolen = distinctive_secret();
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    for (name, password) in [
        ("victim-prov", distinctive_secret()),
        ("donor-prov", distinctive_secret()),
        ("tenant-b-admin", stolen.clone()),
    ] {
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
        .create_class(json!({"reclaimPolicy": "Retain", "parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "${pvc.name}-prov",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
        }}))
        .await;
    // The metric of the provisioner that takes the entries up (the crashed one's journal
    // writer may still be writing, with a metric of its own).
    let metrics = JournalMetrics::register(&prometheus::Registry::new()).unwrap();
    let launch = |env: &mut Env,
                  config: external_provisioner::controller::Config,
                  metrics: &JournalMetrics| {
        let mut config = config;
        config.journal = Some(env.journal_location());
        config.wiring.journal_metrics = Some(metrics.clone());
        config.backoff = Backoff {
            start: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
        env.launch(config);
    };
    let config = env.config(&[]).await;
    let crashed = JournalMetrics::register(&prometheus::Registry::new()).unwrap();
    launch(&mut env, config, &crashed);
    let victim = env.create_claim("victim", &class, json!({})).await;
    let victim_uid = victim.metadata.uid.unwrap();
    let pv = env.wait_bound("victim").await;
    let victim_volume = pv.spec.unwrap().csi.unwrap().volume_handle;
    // The PV of a retained volume keeps no finalizer of ours once the provisioner saw it.
    eventually("the victim's PV seen", || async {
        let pv = env.pvs().get(&format!("pvc-{victim_uid}")).await.unwrap();
        (!pv.finalizers().iter().any(|f| f == PV_FINALIZER)).then_some(())
    })
    .await;
    // A genuine intent to forge from: the donor's CreateVolume answer is lost, then a crash.
    env.mock
        .faults()
        .lose_answers(CREATE_VOLUME, 1000, Code::DeadlineExceeded);
    let donor = env.create_claim("donor", &class, json!({})).await;
    let donor_uid = donor.metadata.uid.unwrap();
    let donor_intent = eventually("the donor's intent recorded", || async {
        recorded(&env)
            .await
            .0
            .into_iter()
            .find(|(key, _)| key == &donor_uid)
            .map(|(_, intent)| intent)
    })
    .await;
    env.crash().await;
    env.mock.faults().lose_answers(CREATE_VOLUME, 0, Code::Ok);
    // The administrator keeps the data: claim deleted, then its Retain PV.
    env.delete_claim("victim").await;
    wait_claim_gone(&env, "victim").await;
    env.pvs()
        .delete(&format!("pvc-{victim_uid}"), &Default::default())
        .await
        .unwrap();
    env.wait_pv_gone(&format!("pvc-{victim_uid}")).await;

    // The donor's intent turned into the victim's, as the source code says entries look.
    let as_victim = |uid: &str| {
        let mut intent = donor_intent.clone();
        intent.claim.uid = uid.to_string();
        intent.claim.name = "victim".into();
        intent.prepared.request.name = format!("pvc-{uid}");
        intent.prepared.pv.name = format!("pvc-{uid}");
        intent.prepared.pv.claim_ref.uid = Some(uid.to_string());
        intent.prepared.pv.claim_ref.name = Some("victim".into());
        intent.prepared.provisioner_secret = Some(SecretRef {
            namespace: ns.clone(),
            name: "victim-prov".into(),
        });
        intent
    };
    let real = keys(&env).await.current;
    let made_up = Key::from_bytes(&[7; 32]).unwrap();
    let previous = [0x3c; 32];
    let previous_key = Key::from_bytes(&previous).unwrap();
    let mut forged = journal::Entries::new();
    // Unsealed.
    let text = serde_json::to_string(&as_victim(&victim_uid)).unwrap();
    forged.insert(victim_uid.clone(), text);
    // A made-up seal that names a key the provisioner has.
    let other = "0b5ae7e0-0000-4000-8000-00000000beef";
    let fake = sealed(&env, &made_up, other, &as_victim(other)).replacen(
        made_up.id(),
        previous_key.id(),
        1,
    );
    forged.insert(other.to_string(), fake);
    // The key rotated out (the real one, after two rotations), and the donor's genuine entry
    // with it: the donor is provisioned anew all the same.
    let old = "0b5ae7e0-0000-4000-8000-00000000c01d";
    forged.insert(old.to_string(), sealed(&env, &real, old, &as_victim(old)));
    forged.insert(
        donor_uid.clone(),
        sealed(&env, &real, &donor_uid, &donor_intent),
    );
    // Under the previous key, which still opens: a key that is not a UID, another tenant's
    // secret, and a clone of the victim's volume, each for a gone claim of the live class.
    let named = "tenant-b-data";
    forged.insert(
        named.to_string(),
        sealed(&env, &previous_key, named, &as_victim(named)),
    );
    let borrowing = "0b5ae7e0-0000-4000-8000-00000000b0b0";
    let mut borrowed = as_victim(borrowing);
    borrowed.prepared.provisioner_secret = Some(SecretRef {
        namespace: ns.clone(),
        name: "tenant-b-admin".into(),
    });
    forged.insert(
        borrowing.to_string(),
        sealed(&env, &previous_key, borrowing, &borrowed),
    );
    let cloning = "0b5ae7e0-0000-4000-8000-00000000c10e";
    let mut clone = as_victim(cloning);
    clone.prepared.request.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: victim_volume.clone(),
            },
        )),
    });
    forged.insert(
        cloning.to_string(),
        sealed(&env, &previous_key, cloning, &clone),
    );
    write_entries(&env, &forged).await;
    rotate_twice(&env, &previous).await;

    let before = env.mock.calls().count(CREATE_VOLUME);
    let config = env.config(&[]).await;
    launch(&mut env, config, &metrics);
    env.wait_bound("donor").await;
    eventually("every forged entry dropped", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    let rejected = eventually("a Warning Event per dropped entry", || async {
        let rejected = rejected(&env).await;
        (rejected.len() == 7).then_some(rejected)
    })
    .await;
    for part in [
        format!("{victim_uid:?} (forged)"),
        format!("{other:?} (forged)"),
        format!("{old:?} (unverifiable)"),
        format!("{donor_uid:?} (unverifiable)"),
        format!("{named:?} (forged): its key is not a claim UID"),
        format!("{borrowing:?} (mismatch): its provisioner secret reference"),
        format!("{cloning:?} (mismatch): its volume content source"),
    ] {
        assert!(
            rejected.iter().any(|m| m.contains(&part)),
            "no Event says {part:?}: {rejected:?}"
        );
    }
    for (reason, count) in [
        (DropReason::Unverifiable, 2),
        (DropReason::Forged, 3),
        (DropReason::Mismatch, 2),
    ] {
        assert_eq!(
            metrics.dropped("provisioner-journal", reason),
            count,
            "{reason:?}"
        );
    }
    assert_eq!(env.mock.calls().count(DELETE_VOLUME), 0, "nothing deleted");
    assert!(
        env.driver_volumes_by_id().contains(&victim_volume),
        "the retained volume is untouched"
    );
    let calls = env.mock.calls().of(CREATE_VOLUME);
    let replayed: Vec<_> = calls.iter().skip(before as usize).collect();
    for call in &replayed {
        let request: serde_json::Value = serde_json::from_str(&call.request).unwrap();
        assert_eq!(request["name"], format!("pvc-{donor_uid}"), "{request}");
        assert!(!call.carries_secret("password", &stolen));
    }
    env.stop().await;
}

/// A genuine intent whose claim and class are both gone when the next provisioner starts:
/// nothing is left to prepare its request again from, and its seal vouches for it, so the
/// volume is found by name and deleted.
#[tokio::test]
async fn a_genuine_entry_whose_class_was_deleted_still_cleans_up_its_volume() {
    use k8s_openapi::api::storage::v1::StorageClass;
    let mut env = Env::without_controller(mock()).await;
    let uid = crash_after_a_lost_answer(&mut env, true).await;
    let (intents, _) = recorded(&env).await;
    assert_eq!(intents[0].0, uid);
    let class = intents[0].1.class.clone();
    env.delete_claim("data").await;
    wait_claim_gone(&env, "data").await;
    Api::<StorageClass>::all(env.client())
        .delete(&class, &Default::default())
        .await
        .unwrap();
    restart_with_journal(&mut env).await;
    eventually("the volume deleted", || async {
        env.driver_volumes().is_empty().then_some(())
    })
    .await;
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME).len(),
        2,
        "found by name once more"
    );
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(rejected(&env).await, Vec::<String>::new(), "no false alarm");
    env.stop().await;
}

/// A rolling update in the middle of a burst of 50 provisionings: the old provisioner stops
/// gracefully (its last forgets written), the new one takes up what is left. No entry is
/// reported as rejected, every claim is bound to exactly one volume, and the journal ends
/// empty.
#[tokio::test]
async fn a_rolling_update_during_a_burst_raises_no_false_alarm_and_leaks_nothing() {
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    config.workers = 10;
    env.launch(config);
    let class = env.create_class(json!({})).await;
    let claims = 50;
    let creates = (0..claims).map(|i| {
        let env = &env;
        let class = class.clone();
        async move { env.create_claim(&format!("c{i}"), &class, json!({})).await }
    });
    futures::future::join_all(creates).await;
    let pvs = env.pvs();
    eventually("a part of the burst provisioned", || async {
        let bound = pvs.list(&Default::default()).await.unwrap().items.len();
        (bound >= 10).then_some(())
    })
    .await;
    env.stop_gracefully().await;
    // What the stopped provisioner leaves in the journal is unfinished: no entry's PV exists.
    let (left, bad) = recorded(&env).await;
    assert!(bad.is_empty());
    for (key, intent) in &left {
        assert!(
            pvs.get_opt(&intent.prepared.pv.name)
                .await
                .unwrap()
                .is_none(),
            "the finished intent of {key} was not forgotten before the stop"
        );
    }
    restart_with_journal(&mut env).await;
    for i in 0..claims {
        env.wait_bound(&format!("c{i}")).await;
    }
    eventually("every intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(env.driver_volumes().len(), claims, "one volume per claim");
    assert_eq!(rejected(&env).await, Vec::<String>::new(), "no false alarm");
    env.stop().await;
}

/// A provisioner records the intent of claim `claim` of `class`, whose CreateVolume answer is
/// lost, and crashes. Returns the claim's UID and its entry as the journal holds it.
async fn capture_an_entry(env: &mut Env, class: &str, claim: &str) -> (String, String) {
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    config.backoff = Backoff {
        start: Duration::from_secs(60),
        max: Duration::from_secs(60),
    };
    env.launch(config);
    env.mock
        .faults()
        .lose_answers(CREATE_VOLUME, 1, Code::DeadlineExceeded);
    let uid = env
        .create_claim(claim, class, json!({}))
        .await
        .metadata
        .uid
        .unwrap();
    let calls = env.mock.calls().clone();
    eventually("the CreateVolume whose answer is lost", || {
        let n = calls.count(CREATE_VOLUME);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    let entry = eventually("the intent recorded", || async {
        entries(env).await.remove(&uid)
    })
    .await;
    env.crash().await;
    (uid, entry)
}

/// Launches a provisioner with the journal, reporting to `metrics`.
fn launch_reporting(
    env: &mut Env,
    mut config: external_provisioner::controller::Config,
    metrics: &JournalMetrics,
) {
    config.journal = Some(env.journal_location());
    config.wiring.journal_metrics = Some(metrics.clone());
    env.launch(config);
}

/// Waits until a claim of `class` named `name` is bound: the provisioner started, took up its
/// journal and runs.
async fn running(env: &Env, class: &str, name: &str) {
    env.create_claim(name, class, json!({})).await;
    env.wait_bound(name).await;
}

/// The replay: a genuine entry captured while its claim's CreateVolume went unanswered, written
/// back after the claim and its Retain PV are gone. Whoever may write ConfigMaps can put it only
/// in the ConfigMap journal of earlier versions, where it is reported (legacy) and never acted
/// on. Whoever may write the sidecar's Secrets can put it in the journal itself: the class
/// retains its volumes, so the volume is kept and its PV written again as upstream writes one,
/// for the PV controller to mark Released. Neither deletes the volume.
#[tokio::test]
async fn a_replayed_entry_never_deletes_a_retained_volume() {
    let mut env = Env::without_controller(mock()).await;
    let class = env.create_class(json!({"reclaimPolicy": "Retain"})).await;
    let (uid, captured) = capture_an_entry(&mut env, &class, "victim").await;
    restart_with_journal(&mut env).await;
    let pv = env.wait_bound("victim").await;
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    // The administrator keeps the data: the claim deleted, then its PV.
    env.delete_claim("victim").await;
    wait_claim_gone(&env, "victim").await;
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    env.crash().await;
    let pv_name = format!("pvc-{uid}");
    env.pvs()
        .delete(&pv_name, &Default::default())
        .await
        .unwrap();
    env.wait_pv_gone(&pv_name).await;

    // Into the ConfigMap journal of earlier versions, with junk keys that sort after it.
    let mut data: std::collections::BTreeMap<String, String> = (0..30)
        .map(|i| (format!("zz-junk-{i:02}"), "x".repeat(100)))
        .collect();
    data.insert(uid.clone(), captured.clone());
    let legacy = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("provisioner-journal".into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(env.client(), &env.namespace())
        .create(&kube::api::PostParams::default(), &legacy)
        .await
        .unwrap();
    let metrics = JournalMetrics::register(&prometheus::Registry::new()).unwrap();
    let config = env.config(&[]).await;
    launch_reporting(&mut env, config, &metrics);
    let marker = env.create_class(json!({})).await;
    running(&env, &marker, "marker").await;
    eventually("the legacy entry reported", || async {
        rejected(&env)
            .await
            .iter()
            .any(|m| m.contains(&format!("{uid:?} (legacy)")))
            .then_some(())
    })
    .await;
    // Named one by one up to 20; the rest counted.
    eventually("20 legacy entries named", || async {
        let named = rejected(&env)
            .await
            .iter()
            .filter(|m| m.contains("(legacy)"))
            .count();
        assert!(named <= 20, "{named} named");
        (named == 20).then_some(())
    })
    .await;
    assert_eq!(
        metrics.dropped("provisioner-journal", DropReason::Legacy),
        31
    );
    assert_eq!(env.mock.calls().count(DELETE_VOLUME), 0, "nothing deleted");
    assert!(env.driver_volumes_by_id().contains(&handle));

    // Into the journal itself.
    env.crash().await;
    let mut replayed = journal::Entries::new();
    replayed.insert(uid.clone(), captured);
    write_entries(&env, &replayed).await;
    restart_with_journal(&mut env).await;
    let rewritten = eventually("the retained volume's PV written again", || async {
        env.pvs().get_opt(&pv_name).await.unwrap()
    })
    .await;
    let spec = rewritten.spec.unwrap();
    assert_eq!(spec.csi.unwrap().volume_handle, handle);
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(env.mock.calls().count(DELETE_VOLUME), 0, "nothing deleted");
    assert!(env.driver_volumes_by_id().contains(&handle));
    env.pvs()
        .delete(&pv_name, &Default::default())
        .await
        .unwrap();
    env.stop().await;
}

/// The usual Retain procedure on a Delete class: the PV patched to Retain, the claim deleted,
/// and the volume re-homed under a PV of another name for another claim. A genuine entry of the
/// first claim replayed into the journal finds the volume by name, but a PV names its handle:
/// the volume is kept, with a Warning Event on that PV.
#[tokio::test]
async fn a_replayed_entry_never_deletes_a_re_homed_volume() {
    let mut env = Env::without_controller(mock()).await;
    let class = env.create_class(json!({})).await;
    let (uid, captured) = capture_an_entry(&mut env, &class, "victim").await;
    restart_with_journal(&mut env).await;
    let pv = env.wait_bound("victim").await;
    let pv_name = format!("pvc-{uid}");
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    env.pvs()
        .patch(
            &pv_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
        )
        .await
        .unwrap();
    env.delete_claim("victim").await;
    wait_claim_gone(&env, "victim").await;
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    env.crash().await;
    env.pvs()
        .delete(&pv_name, &Default::default())
        .await
        .unwrap();
    env.wait_pv_gone(&pv_name).await;
    let home = env.unique("rehomed");
    let rehomed: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": home},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": env.namespace(), "name": "new-home"},
            "csi": {"driver": env.driver, "volumeHandle": handle},
        },
    }))
    .unwrap();
    env.pvs()
        .create(&kube::api::PostParams::default(), &rehomed)
        .await
        .unwrap();
    env.create_claim("new-home", "", json!({"spec": {"volumeName": home}}))
        .await;
    env.wait_bound("new-home").await;

    let mut replayed = journal::Entries::new();
    replayed.insert(uid.clone(), captured);
    write_entries(&env, &replayed).await;
    restart_with_journal(&mut env).await;
    let kept = eventually(
        "a Warning Event on the PV that names the volume",
        || async {
            env.events_for("default", &home)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("VolumeKept"))
        },
    )
    .await;
    assert!(kept.message.unwrap().contains(&handle));
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(env.mock.calls().count(DELETE_VOLUME), 0, "nothing deleted");
    assert!(env.driver_volumes_by_id().contains(&handle));
    env.wait_bound("new-home").await;
    env.delete_claim("new-home").await;
    env.pvs().delete(&home, &Default::default()).await.unwrap();
    env.stop().await;
}

/// Every create of a Secret refused from now on, as the manifests' RBAC refuses the sidecar's
/// (a create names no object in its path: the journal's is the only Secret made then). Only
/// the test kit can: on a real cluster the test's provisioner is the cluster's admin.
fn refuse_creates(faults: Option<&Faults>) {
    if let Some(faults) = faults {
        faults.fail_next(RequestMatch::new(Verb::Create, "secrets"), 1000, 403);
    }
}

/// Ships the journal's Secret again as an administrator would, with `data`: created, or filled
/// in place where the provisioner made it again first; the provisioner's creates stay refused.
async fn ship_journal_again(
    env: &Env,
    refused: Option<&Faults>,
    data: std::collections::BTreeMap<String, String>,
) {
    let secrets = Api::<Secret>::namespaced(env.client(), &env.namespace());
    let shipped = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("provisioner-journal".into()),
            ..Default::default()
        },
        string_data: Some(data),
        ..Default::default()
    };
    if let Some(faults) = refused {
        faults.clear();
    }
    eventually("the Secret shipped again", || async {
        let written = match secrets.get_opt("provisioner-journal").await.unwrap() {
            None => {
                secrets
                    .create(&kube::api::PostParams::default(), &shipped)
                    .await
            }
            Some(mut found) => {
                found.string_data = shipped.string_data.clone();
                secrets
                    .replace("provisioner-journal", &Default::default(), &found)
                    .await
            }
        };
        match written {
            Ok(_) => Some(()),
            Err(kube::Error::Api(status)) if status.code == 409 => None,
            Err(err) => panic!("{err}"),
        }
    })
    .await;
    refuse_creates(refused);
}

/// The journal's Secret made immutable, then deleted where the sidecar may not create it, then
/// shipped again: each time claims are provisioned within seconds (unjournaled while the
/// journal cannot be written), a Warning Event on the Lease and the metrics say so, and once the
/// Secret is back the journal is written again.
#[tokio::test]
async fn an_unusable_journal_never_holds_provisioning_up() {
    let mut env = Env::without_controller(mock()).await;
    let metrics = JournalMetrics::register(&prometheus::Registry::new()).unwrap();
    let config = env.config(&[]).await;
    launch_reporting(&mut env, config, &metrics);
    let class = env.create_class(json!({})).await;
    running(&env, &class, "before").await;
    assert_eq!(metrics.usable("provisioner-journal"), Some(true));
    let secrets = Api::<Secret>::namespaced(env.client(), &env.namespace());
    let provisioned_soon = |name: &'static str| {
        let env = &env;
        let class = class.clone();
        async move {
            let started = std::time::Instant::now();
            env.create_claim(name, &class, json!({})).await;
            env.wait_bound_within(name, UNUSABLE_LIMIT).await;
            eprintln!("{name}: bound in {:?}", started.elapsed());
        }
    };
    // Immutable: every update is refused with 422.
    secrets
        .patch(
            "provisioner-journal",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"immutable": true})),
        )
        .await
        .unwrap();
    provisioned_soon("immutable").await;
    env.wait_event("provisioner", kit_journal::UNUSABLE_REASON, "unwritable")
        .await;
    assert!(metrics.unjournaled("provisioner-journal", Unjournaled::Unwritable) >= 1);
    assert_eq!(metrics.usable("provisioner-journal"), Some(false));

    // Deleted, and the sidecar may not create it (RBAC's resourceNames cannot limit a create,
    // so the manifests give it none).
    secrets
        .delete("provisioner-journal", &Default::default())
        .await
        .unwrap();
    let refused = env.cluster.faults();
    refuse_creates(refused.as_ref());
    provisioned_soon("deleted").await;
    if refused.is_some() {
        env.wait_event("provisioner", kit_journal::UNUSABLE_REASON, "missing")
            .await;
        assert_eq!(metrics.usable("provisioner-journal"), Some(false));
    }

    // Shipped again, empty, while the sidecar still may not create it: the journal is written
    // again.
    ship_journal_again(&env, refused.as_ref(), Default::default()).await;
    // Tried again without waiting for a record.
    eventually("the journal usable again", || async {
        (metrics.usable("provisioner-journal") == Some(true)).then_some(())
    })
    .await;
    env.wait_event("provisioner", kit_journal::USABLE_REASON, "again")
        .await;
    running(&env, &class, "after").await;
    assert!(
        secrets
            .get_opt("provisioner-journal")
            .await
            .unwrap()
            .is_some()
    );
    if let Some(faults) = &refused {
        faults.clear();
    }
    env.stop().await;
}

/// On a real cluster, as a ServiceAccount with the rights the journal must hold against: all
/// verbs on ConfigMaps, Events and Leases in the journal's namespace, nothing on Secrets. It can
/// neither read, watch nor delete the journal, and what it writes into the ConfigMap journal of
/// earlier versions is reported, never acted on.
#[tokio::test]
async fn a_configmap_writer_can_neither_read_nor_write_the_journal() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{ListParams, PostParams, WatchParams};
    use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
    let mut env = Env::without_controller(mock()).await;
    if !env.cluster.is_real() {
        eprintln!("skipped on the test kit: its API server authorizes every request");
        return env.stop().await;
    }
    let ns = env.namespace();
    let post = PostParams::default();
    fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }
    let role: Role = object(json!({
        "metadata": {"name": "configmap-writer"},
        "rules": [{"apiGroups": ["", "events.k8s.io", "coordination.k8s.io"],
            "resources": ["configmaps", "events", "leases"], "verbs": ["*"]}],
    }));
    Api::<Role>::namespaced(env.client(), &ns)
        .create(&post, &role)
        .await
        .unwrap();
    let binding: RoleBinding = object(json!({
        "metadata": {"name": "configmap-writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "configmap-writer", "namespace": ns}],
    }));
    Api::<RoleBinding>::namespaced(env.client(), &ns)
        .create(&post, &binding)
        .await
        .unwrap();
    let accounts = Api::<ServiceAccount>::namespaced(env.client(), &ns);
    accounts
        .create(
            &post,
            &object(json!({"metadata": {"name": "configmap-writer"}})),
        )
        .await
        .unwrap();
    let request: TokenRequest =
        object(json!({"spec": {"audiences": [], "expirationSeconds": 600}}));
    let token = accounts
        .create_token_request("configmap-writer", &post, &request)
        .await
        .unwrap()
        .status
        .and_then(|status| status.token)
        .expect("a token");
    let kubeconfig = Kubeconfig::read_from(env.cluster.kubeconfig_path()).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let attacker = kube::Client::try_from(config).unwrap();

    // The journal as the manifests ship it, and a first provisioning that writes it.
    let class = env.create_class(json!({"reclaimPolicy": "Retain"})).await;
    let (uid, captured) = capture_an_entry(&mut env, &class, "victim").await;
    let secrets = Api::<Secret>::namespaced(attacker.clone(), &ns);
    let forbidden = |result: Result<(), kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{what}: {status:?}"),
        other => panic!("{what}: {other:?}"),
    };
    forbidden(secrets.get("provisioner-journal").await.map(drop), "get");
    forbidden(secrets.list(&ListParams::default()).await.map(drop), "list");
    forbidden(
        secrets.watch(&WatchParams::default(), "0").await.map(drop),
        "watch",
    );
    forbidden(
        secrets
            .delete("provisioner-journal", &Default::default())
            .await
            .map(drop),
        "delete",
    );
    // What it can do: put the (stolen by other means) entry into a ConfigMap of the journal's
    // name.
    let legacy = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("provisioner-journal".into()),
            ..Default::default()
        },
        data: Some([(uid.clone(), captured)].into()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(attacker, &ns)
        .create(&post, &legacy)
        .await
        .unwrap();
    let metrics = JournalMetrics::register(&prometheus::Registry::new()).unwrap();
    let config = env.config(&[]).await;
    launch_reporting(&mut env, config, &metrics);
    env.wait_bound("victim").await;
    eventually("the ConfigMap's entry reported", || async {
        rejected(&env)
            .await
            .iter()
            .any(|m| m.contains(&format!("{uid:?} (legacy)")))
            .then_some(())
    })
    .await;
    assert_eq!(env.mock.calls().count(DELETE_VOLUME), 0, "nothing deleted");
    env.stop().await;
}

/// Open intents outlive their journal's Secret: deleted while a CreateVolume hangs (the sidecar
/// may not create it), then filled past its use by someone who may write Secrets, then shipped
/// again. The writer keeps the open entries: once the Secret is back, they are in it, and the
/// junk is taken out.
#[tokio::test]
async fn open_intents_survive_their_journal_being_deleted_and_shipped_again() {
    let mut env = Env::without_controller(mock()).await;
    let metrics = JournalMetrics::register(&prometheus::Registry::new()).unwrap();
    let config = env.config(&[]).await;
    launch_reporting(&mut env, config, &metrics);
    let class = env.create_class(json!({})).await;
    running(&env, &class, "before").await;
    env.mock.faults().hang(CREATE_VOLUME);
    let open = env
        .create_claim("open", &class, json!({}))
        .await
        .metadata
        .uid
        .unwrap();
    eventually("the open intent recorded", || async {
        entries(&env).await.contains_key(&open).then_some(())
    })
    .await;
    let secrets = Api::<Secret>::namespaced(env.client(), &env.namespace());
    secrets
        .delete("provisioner-journal", &Default::default())
        .await
        .unwrap();
    let refused = env.cluster.faults();
    refuse_creates(refused.as_ref());
    // A second record finds the journal gone.
    let second = env
        .create_claim("second", &class, json!({}))
        .await
        .metadata
        .uid
        .unwrap();
    if refused.is_some() {
        env.wait_event("provisioner", kit_journal::UNUSABLE_REASON, "missing")
            .await;
    }
    // Shipped again, filled by hand with junk the size of the API's limit.
    let junk = kit_journal::MAX_BYTES + 100 * 1024;
    ship_journal_again(
        &env,
        refused.as_ref(),
        [("junk".into(), "x".repeat(junk))].into(),
    )
    .await;
    // A third record writes the journal again in any case.
    let third = env
        .create_claim("third", &class, json!({}))
        .await
        .metadata
        .uid
        .unwrap();
    eventually(
        "the open intents written into the shipped Secret",
        || async {
            let now = entries(&env).await;
            let all = [&open, &second, &third]
                .iter()
                .all(|uid| now.contains_key(*uid));
            (all && !now.contains_key("junk")).then_some(())
        },
    )
    .await;
    assert!(metrics.dropped("provisioner-journal", DropReason::Forged) >= 1);
    if let Some(faults) = &refused {
        faults.clear();
    }
    env.mock.faults().release(CREATE_VOLUME);
    for claim in ["open", "second", "third"] {
        env.wait_bound(claim).await;
    }
    eventually("the intents forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    env.stop().await;
}
