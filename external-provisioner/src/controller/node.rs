//! Distributed provisioning (`--node-deployment`): each node races for Immediate claims it has
//! the capacity for, and takes the WaitForFirstConsumer claims scheduled to it.

use super::*;

impl Controller {
    /// Tries to claim an Immediate claim for this node, as upstream's nodes race for them:
    /// after a delay growing with each try (jittered, so that the nodes do not all try at
    /// once), if the node has the capacity, by setting the claim's selected node. Another
    /// node that wins meanwhile is seen on the watch and ends the attempt.
    pub(super) async fn try_to_own(&self, claim: &Claim, class: &Class) {
        let uid = claim.uid.clone();
        let (base, max) = self.config.owner_delay;
        let wait = {
            let mut owners = lock(&self.owners);
            let attempt = owners.entry(uid.clone()).or_default();
            let now = Instant::now();
            match attempt.due {
                None => {
                    let delay = decide::owner_delay(base, max, attempt.attempts, random_unit());
                    attempt.attempts = attempt.attempts.saturating_add(1);
                    attempt.due = Some(now + delay);
                    Some(delay)
                }
                Some(due) if due > now => Some(due - now),
                Some(_) => {
                    attempt.due = None;
                    None
                }
            }
        };
        if let Some(wait) = wait {
            tracing::debug!(claim = %claim.key(), delay = ?wait, "will try to claim it for this node");
            self.claims.add_after(uid, 0, wait);
            return;
        }
        match self.node_fits(claim, class).await {
            Fit::Never => {
                tracing::debug!(claim = %claim.key(), "its class's allowed topologies exclude this node");
                lock(&self.owners).remove(&uid);
                self.claims.forget(&*uid);
                return;
            }
            Fit::NotNow => {
                tracing::debug!(claim = %claim.key(), "not enough capacity on this node for now");
                self.claims.add(uid, 0);
                return;
            }
            Fit::Yes => {}
        }
        match self.select_this_node(claim).await {
            Ok(true) => {
                lock(&self.owners).remove(&uid);
                tracing::info!(claim = %claim.key(), "claimed for this node");
            }
            Ok(false) => {
                lock(&self.owners).remove(&uid);
                self.claims.forget(&*uid);
            }
            Err(err) if api_code(&err) == Some(409) => {
                tracing::debug!(claim = %claim.key(), "conflict while claiming it; trying again");
                self.claims.add(uid, 0);
            }
            Err(err) => {
                tracing::warn!(claim = %claim.key(), error = %api_message(&err), "selecting this node for the claim failed");
                self.claims.add(uid, 0);
            }
        }
    }

    /// Whether this node can take the claim: its class's allowed topologies must admit the node,
    /// and GetCapacity must report room for it in one of its segments. A check that cannot be
    /// made lets the node try, so that provisioning reports the problem (as upstream).
    async fn node_fits(&self, claim: &Claim, class: &Class) -> Fit {
        let policy = &self.config.policy;
        let Some(node) = &policy.node else {
            return Fit::Yes;
        };
        let mut here = claim.clone();
        if let Some(spec) = here.pending.as_mut() {
            spec.annotations
                .insert(model::ANN_SELECTED_NODE.into(), node.name.clone());
        }
        let prepared = {
            let index = self.index();
            if policy.topology && !class.allowed_topologies.is_empty() {
                let request = crate::topology::Request {
                    claim_name: &claim.name,
                    allowed: &class.allowed_topologies,
                    selected_node: Some(&node.name),
                    strict: policy.strict_topology,
                    immediate: policy.immediate_topology,
                };
                if crate::topology::requirements(request, &*index).is_err() {
                    return Fit::Never;
                }
            }
            decide::prepare(policy, &here, class, &*index, &Lookups::default())
        };
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(failure) => {
                tracing::debug!(claim = %claim.key(), error = %failure.message, "cannot check capacity; claiming it anyway");
                return Fit::Yes;
            }
        };
        let requested = prepared
            .request
            .capacity_range
            .as_ref()
            .map_or(0, |r| r.required_bytes);
        if requested == 0 {
            return Fit::Yes;
        }
        let segments: Vec<Option<csi_proto::v1::Topology>> = match prepared
            .request
            .accessibility_requirements
            .as_ref()
            .filter(|r| !r.requisite.is_empty())
        {
            Some(requirement) => requirement.requisite.iter().cloned().map(Some).collect(),
            None => vec![None],
        };
        for segment in segments {
            let request = csi_proto::v1::GetCapacityRequest {
                volume_capabilities: prepared.request.volume_capabilities.clone(),
                parameters: prepared.request.parameters.clone(),
                accessible_topology: segment,
            };
            match self
                .csi
                .get_capacity(request, CallOptions::timeout(self.config.timeout))
                .await
            {
                Ok(answer) if answer.available_capacity >= requested => return Fit::Yes,
                Ok(_) => {}
                Err(status) => {
                    tracing::debug!(claim = %claim.key(), error = %sidecar_kit::driver::csi::go_error(&status), "GetCapacity failed; claiming it anyway");
                    return Fit::Yes;
                }
            }
        }
        Fit::NotNow
    }

    /// Sets the claim's selected node to this node (an update, as upstream: a conflict means
    /// another node or writer was faster). `Ok(false)`: the claim is gone or another node's.
    async fn select_this_node(&self, claim: &Claim) -> Result<bool, kube::Error> {
        let Some(node) = &self.config.policy.node else {
            return Ok(false);
        };
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let Some(mut current) = api.get_opt(&claim.name).await? else {
            return Ok(false);
        };
        if current.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Ok(false);
        }
        let annotations = current.metadata.annotations.get_or_insert_default();
        match annotations
            .get(model::ANN_SELECTED_NODE)
            .map(String::as_str)
        {
            Some(selected) if selected == node.name => return Ok(true),
            Some(selected) if !selected.is_empty() => return Ok(false),
            _ => {}
        }
        annotations.insert(model::ANN_SELECTED_NODE.into(), node.name.clone());
        let updated = api
            .replace(&claim.name, &PostParams::default(), &current)
            .await?;
        self.index().store_claim(&updated);
        Ok(true)
    }
}

/// Distributed provisioning: the tries of this node to claim an Immediate claim.
#[derive(Debug, Default)]
pub(super) struct OwnerAttempt {
    attempts: u32,
    /// When the next try is due (`None`: not scheduled).
    due: Option<Instant>,
}

/// Whether this node can take a claim.
enum Fit {
    Yes,
    NotNow,
    Never,
}
