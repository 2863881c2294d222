//! The mock CSI driver as the suite runs it: its volumes in a state file, so that it can be
//! stopped (socket gone) and started again with what it held, as a driver container restarts;
//! and the calls of every incarnation folded into one tally of repeated calls.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use csi_proto::methods::controller::{
    CONTROLLER_EXPAND_VOLUME, CONTROLLER_MODIFY_VOLUME, CONTROLLER_PUBLISH_VOLUME,
    CONTROLLER_UNPUBLISH_VOLUME, CREATE_SNAPSHOT, CREATE_VOLUME, DELETE_SNAPSHOT, DELETE_VOLUME,
};
use csi_proto::methods::group_controller::{
    CREATE_VOLUME_GROUP_SNAPSHOT, DELETE_VOLUME_GROUP_SNAPSHOT,
};
use serde_json::Value;
use testkit::mockdriver::{Faults, MockDriver, MockHandle, State};

pub struct Driver {
    name: String,
    socket: PathBuf,
    state_file: PathBuf,
    handle: Option<MockHandle>,
    /// Method → the request's identity (name, volume, volume and node) → how many calls.
    calls: BTreeMap<&'static str, BTreeMap<String, u64>>,
}

/// The identity of a request for counting repeats: what makes two calls the same call.
fn identity(method: &str, request: &Value) -> String {
    let field = |key: &str| request.get(key).and_then(Value::as_str).unwrap_or("");
    if method == CREATE_VOLUME
        || method == CREATE_SNAPSHOT
        || method == CREATE_VOLUME_GROUP_SNAPSHOT
    {
        field("name").to_string()
    } else if method == DELETE_VOLUME {
        field("volume_id").to_string()
    } else if method == DELETE_SNAPSHOT {
        field("snapshot_id").to_string()
    } else if method == DELETE_VOLUME_GROUP_SNAPSHOT {
        field("group_snapshot_id").to_string()
    } else if method == CONTROLLER_EXPAND_VOLUME || method == CONTROLLER_MODIFY_VOLUME {
        // One volume grown to one size, or given one set of parameters.
        let target = request
            .get("capacity_range")
            .or_else(|| request.get("mutable_parameters"))
            .map(Value::to_string)
            .unwrap_or_default();
        format!("{} to {target}", field("volume_id"))
    } else {
        format!("{} on {}", field("volume_id"), field("node_id"))
    }
}

const COUNTED: [&str; 10] = [
    CREATE_VOLUME,
    DELETE_VOLUME,
    CONTROLLER_PUBLISH_VOLUME,
    CONTROLLER_UNPUBLISH_VOLUME,
    CONTROLLER_EXPAND_VOLUME,
    CONTROLLER_MODIFY_VOLUME,
    CREATE_SNAPSHOT,
    DELETE_SNAPSHOT,
    CREATE_VOLUME_GROUP_SNAPSHOT,
    DELETE_VOLUME_GROUP_SNAPSHOT,
];

impl Driver {
    pub async fn start(name: &str, dir: &std::path::Path) -> Self {
        let mut driver = Self {
            name: name.to_string(),
            socket: dir.join("csi.sock"),
            state_file: dir.join("driver-state.json"),
            handle: None,
            calls: BTreeMap::new(),
        };
        driver.up().await;
        driver
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Starts serving again with the volumes it held (does nothing while it runs).
    pub async fn up(&mut self) {
        if self.handle.is_some() {
            return;
        }
        let handle = MockDriver::builder()
            .driver_name(self.name.clone())
            .state_file(self.state_file.clone())
            // Snapshots take a few answers to be ready, as an uploading driver's.
            .snapshot_ready_after(2)
            .call_log_limit(usize::MAX)
            .serve_unix(&self.socket)
            .await
            .expect("the mock driver serves again on its socket");
        self.handle = Some(handle);
    }

    /// Stops serving and removes the socket, as a driver container that exits.
    pub async fn down(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.fold_calls(&handle);
            // Hung calls end with UNAVAILABLE; bounded in case a client holds a stream open.
            let _ = tokio::time::timeout(Duration::from_secs(10), handle.shutdown()).await;
        }
    }

    pub fn is_up(&self) -> bool {
        self.handle.is_some()
    }

    pub fn faults(&self) -> Option<&Faults> {
        self.handle.as_ref().map(MockHandle::faults)
    }

    /// The volumes as the driver holds them (read from its state file while it is down).
    pub fn state(&self) -> State {
        match &self.handle {
            Some(handle) => handle.state(),
            None => std::fs::read(&self.state_file)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or_default(),
        }
    }

    fn fold_calls(&mut self, handle: &MockHandle) {
        for method in COUNTED {
            for call in handle.calls().of(method) {
                let request: Value = serde_json::from_str(&call.request).unwrap_or_default();
                *self
                    .calls
                    .entry(method)
                    .or_default()
                    .entry(identity(method, &request))
                    .or_default() += 1;
            }
        }
        handle.calls().clear();
    }

    /// Calls beyond the first with the same identity, per method, over every incarnation.
    pub fn repeated_calls(&mut self) -> BTreeMap<&'static str, u64> {
        if let Some(handle) = self.handle.take() {
            self.fold_calls(&handle);
            self.handle = Some(handle);
        }
        self.calls
            .iter()
            .map(|(method, by_identity)| {
                (
                    *method,
                    by_identity.values().map(|n| n.saturating_sub(1)).sum(),
                )
            })
            .collect()
    }

    /// All calls of `method`, over every incarnation.
    pub fn total_calls(&self, method: &str) -> u64 {
        let folded: u64 = self.calls.get(method).map_or(0, |m| m.values().sum());
        folded
            + self
                .handle
                .as_ref()
                .map_or(0, |h| h.calls().of(method).len() as u64)
    }

    pub async fn stop(mut self) {
        self.down().await;
    }
}
