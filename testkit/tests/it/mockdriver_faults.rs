//! Fault injection, hangs, latency and readiness, changed at run time
//! while a client talks to the mock over a unix socket.

// Unix sockets and signals; Windows serves named pipes instead.
#![cfg(unix)]

use std::time::Duration;

use crate::mockdriver_common::*;
use csi_proto::methods::{controller as cm, identity as im};
use csi_proto::v1;
use testkit::mockdriver::MockDriver;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn fail_nth_next_and_always() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let faults = mock.faults();
    let c = &mut clients.controller;

    faults.fail_nth(cm::CREATE_VOLUME, 2, Code::Internal, "second call breaks");
    c.create_volume(create_request("a", 1)).await.unwrap();
    let second = c.create_volume(create_request("a", 1)).await.unwrap_err();
    assert_eq!(
        (second.code(), second.message()),
        (Code::Internal, "second call breaks")
    );
    c.create_volume(create_request("a", 1)).await.unwrap();

    faults.fail_next(cm::CREATE_VOLUME, 2, Code::Unavailable, "busy");
    assert_eq!(
        code(c.create_volume(create_request("b", 1)).await),
        Code::Unavailable
    );
    assert_eq!(
        code(c.create_volume(create_request("b", 1)).await),
        Code::Unavailable
    );
    c.create_volume(create_request("b", 1)).await.unwrap();
    // An injected failure happens before the handler: "b" exists once.
    assert_eq!(mock.state().volumes.len(), 2);

    faults.fail_always(cm::DELETE_VOLUME, Code::FailedPrecondition, "in use");
    for _ in 0..3 {
        assert_eq!(
            code(c.delete_volume(v1::DeleteVolumeRequest::default()).await),
            Code::FailedPrecondition
        );
    }
    faults.clear_failures(cm::DELETE_VOLUME);
    assert_eq!(
        code(c.delete_volume(v1::DeleteVolumeRequest::default()).await),
        Code::InvalidArgument,
        "the real handler answers again"
    );
    assert_eq!(mock.calls().count(cm::CREATE_VOLUME), 6);
    assert_eq!(mock.calls().count(cm::DELETE_VOLUME), 4);
}

#[tokio::test]
async fn probe_readiness_and_failure() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let id = &mut clients.identity;
    mock.faults().set_ready(false);
    assert_eq!(
        id.probe(v1::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(false)
    );
    mock.faults().set_ready(true);
    assert_eq!(
        id.probe(v1::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    mock.faults()
        .fail_always(im::PROBE, Code::FailedPrecondition, "disk missing");
    assert_eq!(
        code(id.probe(v1::ProbeRequest {}).await),
        Code::FailedPrecondition
    );
    mock.faults().reset();
    id.probe(v1::ProbeRequest {}).await.unwrap();
}

#[tokio::test]
async fn hung_calls_wait_for_release() {
    let Served {
        mock,
        clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    mock.faults().hang(cm::CREATE_VOLUME);

    let mut controller = clients.controller.clone();
    let pending =
        tokio::spawn(async move { controller.create_volume(create_request("slow", 1)).await });
    assert!(
        mock.calls()
            .wait_for_count(cm::CREATE_VOLUME, 1, WAIT)
            .await
    );
    // The hung call has arrived but nothing was created, and other methods
    // still answer.
    assert!(mock.state().volumes.is_empty());
    clients
        .identity
        .clone()
        .probe(v1::ProbeRequest {})
        .await
        .unwrap();

    mock.faults().release(cm::CREATE_VOLUME);
    let created = tokio::time::timeout(WAIT, pending)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(created.into_inner().volume.unwrap().capacity_bytes, 1);
}

#[tokio::test]
async fn abandoned_hung_call() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    mock.faults().hang(cm::CREATE_VOLUME);
    let call = clients.controller.create_volume(create_request("pvc", 1));
    assert!(still_pending_after(Duration::from_millis(100), call).await);
    // The client gave up; the next call after release is answered.
    mock.faults().release(cm::CREATE_VOLUME);
    clients
        .controller
        .create_volume(create_request("pvc", 1))
        .await
        .unwrap();
    assert_eq!(mock.calls().count(cm::CREATE_VOLUME), 2);
}

#[tokio::test]
async fn latency_per_method_and_default() {
    let Served {
        mock,
        clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let short = Duration::from_millis(100);
    let mut identity = clients.identity.clone();
    mock.faults()
        .set_latency(im::GET_PLUGIN_INFO, Duration::from_secs(3600));
    assert!(
        still_pending_after(short, identity.get_plugin_info(v1::GetPluginInfoRequest {})).await
    );
    // Other methods are not delayed.
    identity.probe(v1::ProbeRequest {}).await.unwrap();

    mock.faults().clear_latency(im::GET_PLUGIN_INFO);
    mock.faults().set_default_latency(Duration::from_secs(3600));
    assert!(still_pending_after(short, identity.probe(v1::ProbeRequest {})).await);

    mock.faults().set_default_latency(Duration::ZERO);
    let answered =
        tokio::time::timeout(WAIT, identity.get_plugin_info(v1::GetPluginInfoRequest {}));
    answered.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_answers_hung_calls() {
    let Served {
        mock,
        clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    mock.faults().hang(im::PROBE);
    let mut identity = clients.identity.clone();
    let pending = tokio::spawn(async move { identity.probe(v1::ProbeRequest {}).await });
    assert!(mock.calls().wait_for_count(im::PROBE, 1, WAIT).await);
    let socket = mock.socket_path().to_owned();
    tokio::time::timeout(WAIT, mock.shutdown())
        .await
        .unwrap()
        .unwrap();
    let answer = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    assert_eq!(code(answer), Code::Unavailable);
    assert!(!socket.exists());
}

#[tokio::test]
async fn faults_prepared_before_serving() {
    let driver = MockDriver::builder();
    driver
        .faults()
        .fail_next(im::GET_PLUGIN_INFO, 1, Code::Unavailable, "starting");
    driver.faults().set_ready(false);
    let Served {
        mock: _mock,
        mut clients,
        _dir,
    } = serve(driver).await;
    assert_eq!(
        code(
            clients
                .identity
                .get_plugin_info(v1::GetPluginInfoRequest {})
                .await
        ),
        Code::Unavailable
    );
    clients
        .identity
        .get_plugin_info(v1::GetPluginInfoRequest {})
        .await
        .unwrap();
    let probe = clients.identity.probe(v1::ProbeRequest {}).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(false));
}

#[tokio::test]
async fn rewritten_answers_break_the_spec_on_purpose() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let c = &mut clients.controller;
    mock.faults().rewrite_answers(
        cm::CREATE_VOLUME,
        1,
        |answer: &mut v1::CreateVolumeResponse| {
            if let Some(volume) = answer.volume.as_mut() {
                volume.volume_id.clear();
                volume.capacity_bytes = -1;
            }
        },
    );
    let broken = c
        .create_volume(create_request("a", 1))
        .await
        .unwrap()
        .into_inner();
    let volume = broken.volume.unwrap();
    assert_eq!((volume.volume_id.as_str(), volume.capacity_bytes), ("", -1));
    // The call was handled: the volume exists, and the next answer is the real one.
    assert_eq!(mock.state().volumes.len(), 1);
    let fixed = c
        .create_volume(create_request("a", 1))
        .await
        .unwrap()
        .into_inner();
    assert!(!fixed.volume.unwrap().volume_id.is_empty());

    // A rewrite of another answer type never matches; it is used up all the same.
    mock.faults().rewrite_answers(
        cm::CREATE_VOLUME,
        1,
        |answer: &mut v1::DeleteVolumeResponse| {
            *answer = v1::DeleteVolumeResponse {};
        },
    );
    let answer = c
        .create_volume(create_request("a", 1))
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.volume.unwrap().volume_id.is_empty());
    // A failing call leaves the rewrite for the next successful one.
    mock.faults().rewrite_answers(
        im::GET_PLUGIN_INFO,
        1,
        |answer: &mut v1::GetPluginInfoResponse| answer.name.clear(),
    );
    mock.faults()
        .fail_next(im::GET_PLUGIN_INFO, 1, Code::Internal, "not yet");
    let id = &mut clients.identity;
    assert_eq!(
        code(id.get_plugin_info(v1::GetPluginInfoRequest {}).await),
        Code::Internal
    );
    let info = id
        .get_plugin_info(v1::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "");
}

#[tokio::test]
async fn the_call_log_keeps_digests_of_secrets_never_their_values() {
    let Served {
        mock,
        mut clients,
        _dir,
    } = serve(MockDriver::builder()).await;
    let c = &mut clients.controller;
    let mut request = create_request("a", 1);
    request.secrets = [("password".to_string(), "s3cr3t-value".to_string())].into();
    c.create_volume(request).await.unwrap();
    let call = mock.calls().of(cm::CREATE_VOLUME).pop().unwrap();
    assert!(call.carries_secret("password", "s3cr3t-value"));
    assert!(!call.carries_secret("password", "other"));
    assert!(!call.carries_secret("user", "s3cr3t-value"));
    assert!(call.request.contains("***stripped***"), "{}", call.request);
    assert!(!format!("{call:?}").contains("s3cr3t-value"), "{call:?}");
    let probe = {
        clients.identity.probe(v1::ProbeRequest {}).await.unwrap();
        mock.calls().of(im::PROBE).pop().unwrap()
    };
    assert!(probe.secrets.is_empty());
}
