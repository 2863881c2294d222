//! The gRPC edge: every RPC is counted and logged, passes the fault
//! script, and then runs a synchronous handler over the store.

mod controller;
mod convert;
mod group;
mod identity;
mod metadata;
mod node;

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_proto::prost_reflect::{DynamicMessage, Value};
use csi_proto::redact::{Sanitized, is_secret_field, sanitize};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::config::MockConfig;
use super::inject::{CallLog, Faults, secret_digest};
use super::state::Rejection;
use super::store::{PersistError, Store};

impl From<Rejection> for Status {
    fn from(rejection: Rejection) -> Self {
        Status::new(rejection.code, rejection.message)
    }
}

impl From<PersistError> for Status {
    fn from(err: PersistError) -> Self {
        Status::internal(err.to_string())
    }
}

/// Everything the handlers work with.
pub(crate) struct Driver {
    pub(crate) config: MockConfig,
    pub(crate) store: Store,
    pub(crate) faults: Faults,
    pub(crate) calls: CallLog,
    /// Cancelled when the server stops, to end hung and delayed calls.
    pub(crate) shutdown: CancellationToken,
}

/// Answers UNIMPLEMENTED for an RPC whose capability is switched off.
fn offered(on: bool, what: &str) -> Result<(), Status> {
    if on {
        Ok(())
    } else {
        Err(Status::unimplemented(format!(
            "{what} is not offered by this driver"
        )))
    }
}

/// The digests of the secrets `request` carries: the string maps of its `csi_secret` fields
/// (every CSI request keeps its secrets in a top-level `secrets` map), key → digest.
fn secret_digests<Req: prost::Message + prost::Name>(request: &Req) -> BTreeMap<String, u64> {
    let mut digests = BTreeMap::new();
    let full_name = Req::full_name();
    let Some(descriptor) = csi_proto::descriptor_pool()
        .ok()
        .and_then(|pool| pool.get_message_by_name(&full_name))
    else {
        return digests;
    };
    let Ok(message) = DynamicMessage::decode(descriptor, request.encode_to_vec().as_slice()) else {
        return digests;
    };
    for (field, value) in message.fields() {
        if !is_secret_field(&full_name, field.name()) {
            continue;
        }
        if let Value::Map(entries) = value {
            for (key, value) in entries {
                if let (Some(key), Value::String(value)) = (key.as_str(), value) {
                    digests.insert(key.to_owned(), secret_digest(value));
                }
            }
        }
    }
    digests
}

/// The Identity, Controller, GroupController, SnapshotMetadata and Node services of one mock
/// driver.
#[derive(Clone)]
pub(crate) struct MockService(Arc<Driver>);

/// The W3C trace context a call carried.
pub(crate) fn traceparent(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

impl MockService {
    pub(crate) fn new(driver: Arc<Driver>) -> Self {
        Self(driver)
    }

    async fn call<Req, Resp>(
        &self,
        method: &'static str,
        request: Request<Req>,
        handler: fn(&Driver, Req) -> Result<Resp, Status>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: prost::Message + prost::Name,
        Resp: 'static,
    {
        let driver = &self.0;
        let traceparent = traceparent(request.metadata());
        let request = request.into_inner();
        let seq = driver.calls.record_with_secrets(method, traceparent, || {
            (sanitize(&request), secret_digests(&request))
        });
        tracing::debug!(method, seq, request = %Sanitized(&request), "received");
        let result = match driver.faults.gate(method, seq, &driver.shutdown).await {
            Ok(()) => handler(driver, request),
            Err(status) => Err(status),
        };
        let result = match result {
            Ok(mut answer) => match driver.faults.take_lost_answer(method) {
                Some(lost) => Err(lost),
                None => {
                    driver.faults.rewrite_answer(method, &mut answer);
                    Ok(answer)
                }
            },
            Err(status) => Err(status),
        };
        match &result {
            Ok(_) => tracing::debug!(method, seq, "answered OK"),
            Err(status) => tracing::debug!(
                method,
                seq,
                code = ?status.code(),
                message = status.message(),
                "answered with an error"
            ),
        }
        result.map(Response::new)
    }
}
