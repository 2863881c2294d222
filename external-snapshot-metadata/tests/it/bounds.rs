//! The server under slow, stalled, numerous and hostile clients: every wait on a client ends,
//! every count and byte held has a bound, and one client's behaviour never reaches another's
//! stream or the driver connection.

use std::time::{Duration, Instant};

use base64::Engine as _;
use external_snapshot_metadata::api::GetMetadataAllocatedRequest;
use testkit::apiserver::TokenIdentity;
use testkit::apiserver::counters::Verb;
use testkit::measure::{http_get, usage};
use tonic::Code;

use crate::common::*;

fn allocated_one_a_message(env: &Env, snapshot: &str) -> GetMetadataAllocatedRequest {
    let mut request = env.allocated(snapshot);
    request.max_results = 1;
    request
}

fn peak_rss_mib(env: &Env) -> u64 {
    let pid = env.sidecar.id().expect("the sidecar runs");
    usage(pid, 100.0).peak_rss_kib / 1024
}

async fn healthy(env: &Env) -> bool {
    matches!(http_get(env.http_port, "/health").await, Some((200, _)))
}

/// Over 2^20 blocks, one message a block (what upstream's lister asks for): a client that takes
/// one message a second is served at its pace, while a second client's stream over the same
/// volume, on the same driver connection, completes at full speed.
#[tokio::test]
async fn a_slow_client_does_not_slow_another_stream() {
    const BLOCKS: i64 = 1 << 20;
    let env = ready().await;
    filled(&env, "big", BLOCKS).await;
    let mut slow_client = env.connect().await;
    let mut slow = slow_client
        .get_metadata_allocated(allocated_one_a_message(&env, "big"))
        .await
        .unwrap()
        .into_inner();
    let slow_reader = async {
        let mut offsets = Vec::new();
        for _ in 0..5 {
            let message = slow.message().await.unwrap().expect("a message");
            offsets.push(message.block_metadata[0].byte_offset);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        offsets
    };
    let mut fast_client = env.connect().await;
    let fast = async {
        let started = Instant::now();
        let mut request = env.allocated("big");
        request.max_results = 256;
        let messages = all_allocated(&mut fast_client, request).await.unwrap();
        (messages, started.elapsed())
    };
    let (offsets, (messages, took)) = tokio::join!(slow_reader, fast);
    assert_eq!(offsets, (0..5).map(|i| i * BLOCK).collect::<Vec<_>>());
    let blocks: usize = messages.iter().map(|m| m.block_metadata.len()).sum();
    assert_eq!(blocks, BLOCKS as usize, "the fast stream is whole");
    eprintln!("the fast stream of {BLOCKS} blocks took {took:?} beside the slow one");
    // The slow stream goes on where it was.
    let next = slow.message().await.unwrap().expect("a message");
    assert_eq!(next.block_metadata[0].byte_offset, 5 * BLOCK);
}

/// A client that stops reading is not waited for past `--max-streaming-duration-min`: its
/// stream ends with DeadlineExceeded (the driver's stream with it) even though the relay is
/// blocked on that client, and the client sees that status when it reads again.
#[tokio::test]
async fn a_client_that_stops_reading_is_ended_at_the_streaming_bound() {
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        extra: vec!["--max-streaming-duration-min=1".into()],
        ..Start::default()
    })
    .await;
    filled(&env, "big", 1 << 16).await;
    let mut client = env.connect().await;
    let started = Instant::now();
    let mut stalled = client
        .get_metadata_allocated(allocated_one_a_message(&env, "big"))
        .await
        .unwrap()
        .into_inner();
    assert!(stalled.message().await.unwrap().is_some());
    let ended = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            if env
                .metrics()
                .await
                .contains(r#"grpc_status_code="DeadlineExceeded""#)
            {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await
    .expect("the stalled stream ended by its bound");
    assert!(ended >= Duration::from_secs(59), "{ended:?}");
    let status = loop {
        match stalled.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a stream ended by its bound ended whole"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
}

/// 500 streams from 50 connections, none of whose clients reads past the first message:
/// `--max-streams` (100) are served and the rest refused with ResourceExhausted, memory stays
/// bounded, health is answered throughout, and the slots come back when the clients go.
#[tokio::test]
async fn streams_past_the_limit_are_refused_and_memory_stays_bounded() {
    const CONNECTIONS: usize = 50;
    const STREAMS_EACH: usize = 10;
    let env = ready().await;
    filled(&env, "big", 1 << 16).await;
    let idle = peak_rss_mib(&env);
    // The token authenticated once, so that only the stream limit refuses what follows.
    all_allocated(&mut env.connect().await, env.allocated("big"))
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(env.connect().await);
    }
    let opened = futures::future::join_all(clients.iter().flat_map(|client| {
        (0..STREAMS_EACH).map(|_| {
            let mut client = client.clone();
            let request = allocated_one_a_message(&env, "big");
            async move {
                let mut stream = client.get_metadata_allocated(request).await?.into_inner();
                stream.message().await?;
                Ok::<_, tonic::Status>(stream)
            }
        })
    }))
    .await;
    assert!(healthy(&env).await, "health answered with every slot taken");
    let mut served = Vec::new();
    let mut exhausted = 0;
    for result in opened {
        match result {
            Ok(stream) => served.push(stream),
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(status.message().contains("--max-streams"), "{status:?}");
                exhausted += 1;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    assert_eq!(served.len(), 100, "--max-streams' default");
    assert_eq!(exhausted, CONNECTIONS * STREAMS_EACH - 100);
    // Let the served streams fill what they may hold.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let peak = peak_rss_mib(&env);
    eprintln!(
        "peak RSS with 100 stalled streams on 50 connections: {peak} MiB ({idle} MiB before)"
    );
    // The manifest's limit. Each stalled stream holds its driver stream's window of tiny
    // frames (64 KiB of them, about half a MiB in h2's buffers) and its queue.
    assert!(peak < 128, "{peak} MiB");
    assert!(healthy(&env).await);
    drop(served);
    let mut client = env.connect().await;
    eventually("a slot to come back", || {
        let mut client = client.clone();
        let request = env.allocated("big");
        async move { all_allocated(&mut client, request).await.ok() }
    })
    .await;
    let messages = all_allocated(&mut client, env.allocated("big"))
        .await
        .unwrap();
    assert!(!messages.is_empty());
}

fn random_text(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes * 3 / 4];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).unwrap();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// A ServiceAccount token's shape: a JWT for `audience` that expires in an hour (the test
/// kit's TokenReview knows it by its text; the sidecar only reads its claims).
fn jwt_for(audience: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let encode = |text: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
    format!(
        "{}.{}.{}",
        encode(r#"{"alg":"RS256"}"#.to_string()),
        encode(format!(r#"{{"aud":["{audience}"],"exp":{exp}}}"#)),
        random_text(32)
    )
}

/// 10 000 requests with made-up tokens (100 of them with 1 MiB names) cost the sidecar
/// neither memory nor metric series, and cannot starve a real token: a backup application's
/// new token is still answered within a second, and the API server sees a bounded number of
/// TokenReviews.
#[tokio::test]
async fn made_up_tokens_and_names_cannot_starve_a_real_client() {
    const REQUESTS: usize = 10_000;
    const HUGE: usize = 100;
    // Enough clients that those whose turn for a review comes (and who wait for it, up to a
    // second) leave most of them refused at once.
    const PARALLEL: usize = 64;
    let env = ready().await;
    filled(&env, "real", 8).await;
    let good = jwt_for(AUDIENCE);
    env.cluster.reviews().add_token(
        good.clone(),
        TokenIdentity::service_account(NAMESPACE, "backup").audience(AUDIENCE),
    );
    // The series that name a snapshot.
    let series = |metrics: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with("snapshot_metadata_controller_operations_seconds_count"))
            .filter(|l| !l.contains(r#"target_snapshot="""#))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let series_before = series(&env.metrics().await);
    let started = Instant::now();
    let flood = futures::future::join_all((0..PARALLEL).map(|lane| {
        let env = &env;
        async move {
            let mut client = env.connect().await;
            let mut codes = std::collections::BTreeMap::<String, usize>::new();
            for i in (lane..REQUESTS).step_by(PARALLEL) {
                let name = if i < HUGE {
                    random_text(1 << 20)
                } else {
                    format!("snap-{i}")
                };
                let request = GetMetadataAllocatedRequest {
                    security_token: random_text(64),
                    namespace: NAMESPACE.to_string(),
                    snapshot_name: name,
                    starting_offset: 0,
                    max_results: 0,
                };
                let code = match all_allocated(&mut client, request).await {
                    Ok(_) => Code::Ok,
                    Err(status) => status.code(),
                };
                *codes.entry(format!("{code:?}")).or_default() += 1;
            }
            codes
        }
    }));
    let real = async {
        // Into the flood's thick.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut client = env.connect().await;
        let mut request = env.allocated("real");
        request.security_token = good.clone();
        let asked = Instant::now();
        let answer = all_allocated(&mut client, request).await;
        (answer, asked.elapsed())
    };
    let (lanes, (answer, answered_in)) = tokio::join!(flood, real);
    let took = started.elapsed();
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    for lane in lanes {
        for (code, count) in lane {
            *codes.entry(code).or_default() += count;
        }
    }
    let reviews = env.cluster.counters().total(Verb::Create, "tokenreviews");
    let peak = peak_rss_mib(&env);
    eprintln!(
        "{REQUESTS} made-up requests in {took:?}: {codes:?}; {reviews} TokenReviews; the real token answered in {answered_in:?}; peak RSS {peak} MiB"
    );
    let messages = answer.expect("the real token is served");
    assert_eq!(
        messages
            .iter()
            .map(|m| m.block_metadata.len())
            .sum::<usize>(),
        8
    );
    assert!(answered_in < Duration::from_secs(1), "{answered_in:?}");
    assert_eq!(codes.get("Ok"), None);
    // Past the request size limit (64 KiB), before anything is decoded.
    assert_eq!(codes.get("OutOfRange"), Some(&HUGE), "{codes:?}");
    // The made-up tokens' share: its burst and its rate over the flood, and no more.
    let (qps, burst) = external_snapshot_metadata::auth::OTHER_REVIEWS;
    let allowed = u64::from(burst) + (qps * took.as_secs_f64()).ceil() as u64 + 1;
    assert!(reviews <= allowed + 1, "{reviews} TokenReviews > {allowed}");
    assert!(peak < 64, "{peak} MiB");
    let series_after = series(&env.metrics().await);
    assert_eq!(
        series_after,
        [series_before, vec![format!(
            r#"snapshot_metadata_controller_operations_seconds_count{{base_snapshot="",driver_name="{DRIVER}",grpc_status_code="OK",method_name="MetadataAllocated",target_snapshot="{NAMESPACE}/real"}} 1"#
        )]]
        .concat(),
        "only the real client's request names a snapshot"
    );
}

/// Under upstream's own ClusterRole (get and list on snapshots and contents, nothing on
/// classes): the sidecar becomes ready, says which kinds it reads per request, and answers as
/// upstream answers: every request refused with Unavailable while classes cannot be read, and
/// served once they can (hostpath binds its ServiceAccount to external-snapshotter-runner too).
#[tokio::test]
async fn upstream_s_cluster_role_suffices() {
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        refused: vec![
            (Verb::Watch, "volumesnapshots", 403),
            (Verb::Watch, "volumesnapshotcontents", 403),
            (Verb::Watch, "volumesnapshotclasses", 403),
            (Verb::List, "volumesnapshotclasses", 403),
        ],
        ..Start::default()
    })
    .await;
    filled(&env, "snap", 8).await;
    let metrics = env.metrics().await;
    for resource in [
        "volumesnapshots",
        "volumesnapshotcontents",
        "volumesnapshotclasses",
    ] {
        assert!(
            metrics.contains(&format!(
                r#"csi_snapshot_metadata_lookups_only{{resource="{resource}"}} 1"#
            )),
            "{resource}: {metrics}"
        );
    }
    let mut client = env.connect().await;
    let (code, message) = code_of(&mut client, env.allocated("snap")).await;
    assert_eq!(code, Code::Unavailable, "{message}");
    assert!(
        message.starts_with("failed to list VolumeSnapshotClasses"),
        "{message}"
    );
    env.cluster.faults().clear();
    let messages = all_allocated(&mut client, env.allocated("snap"))
        .await
        .unwrap();
    assert_eq!(
        messages
            .iter()
            .map(|m| m.block_metadata.len())
            .sum::<usize>(),
        8
    );
    let counters = env.cluster.counters();
    assert!(counters.total(Verb::Get, "volumesnapshots") >= 2);
    assert!(counters.total(Verb::Get, "volumesnapshotcontents") >= 1);
}

/// Before its watches have synced the sidecar answers as upstream does before it is ready:
/// Unavailable, "not yet ready" (not the Internal of a SnapshotMetadataService not found).
#[tokio::test]
async fn a_request_before_the_sidecar_is_ready_is_unavailable() {
    // The SnapshotMetadataServices are never listed, so their watch never syncs.
    let env = Env::start(Start {
        refused: vec![
            (Verb::List, "snapshotmetadataservices", 500),
            (Verb::Watch, "snapshotmetadataservices", 500),
        ],
        ..Start::default()
    })
    .await;
    eventually("the sidecar to listen", || async {
        matches!(http_get(env.http_port, "/health").await, Some((503, _))).then_some(())
    })
    .await;
    let mut client = env.connect().await;
    let (code, message) = code_of(&mut client, env.allocated("snap")).await;
    assert_eq!(code, Code::Unavailable, "{message}");
    assert_eq!(message, "the CSI driver is not yet ready");
}
