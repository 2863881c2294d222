//! Claims: selecting a claim to provision, its lookups, the CreateVolume call and what follows
//! it (the PV saved, or the failure reported and the volume cleaned up).

use super::*;

impl Controller {
    pub(super) async fn sync_claim(&self, uid: &str) {
        let key = uid.to_string();
        let in_flight = lock(&self.in_flight).get(uid).cloned();
        let flight = match in_flight {
            Some(flight) => flight,
            None => match self.start_claim(uid).await {
                Start::Go(flight) => *flight,
                Start::Stop => return,
                Start::Fail(claim, class, failure) => {
                    return self.claim_failed(&claim, &class, "", failure).await;
                }
            },
        };
        operation::describe(
            "provision",
            &[
                ("k8s.namespace.name", &flight.claim.namespace),
                ("k8s.pvc.name", &flight.claim.name),
                ("k8s.pvc.uid", &flight.claim.uid),
                ("k8s.storageclass.name", &flight.class),
            ],
        );
        if !flight.journaled
            && let Err(message) = self.protect_source(&flight.claim).await
        {
            return self
                .flight_failed(&flight, Failure::new(State::NoChange, message))
                .await;
        }
        if let Some(pv) = flight.pv.clone() {
            return self.save_pv(flight, *pv).await;
        }
        let secrets = match self
            .secrets(flight.prepared.provisioner_secret.as_ref())
            .await
        {
            Ok(secrets) => secrets,
            Err(message) => {
                return self
                    .flight_failed(&flight, Failure::new(State::NoChange, message))
                    .await;
            }
        };
        let mut flight = flight;
        if !flight.journaled {
            let intent = Intent {
                claim: flight.claim.clone(),
                class: flight.class.clone(),
                prepared: flight.prepared.clone(),
            };
            let started = Instant::now();
            match tokio::time::timeout(JOURNAL_WAIT, self.journal.record(uid, &intent)).await {
                Ok(Ok(())) => {
                    flight.journaled = true;
                    let took = started.elapsed();
                    if took > self.config.timeout {
                        tracing::info!(claim = %flight.claim.key(), waited = ?took, "the journal write waited for its turn (API rate limit)");
                    }
                }
                Ok(Err(err)) => {
                    return self
                        .flight_failed(
                            &flight,
                            Failure::new(
                                State::NoChange,
                                format!("cannot record the provisioning intent: {err}"),
                            ),
                        )
                        .await;
                }
                Err(_) => {
                    return self
                        .flight_failed(&flight, Failure::new(State::NoChange, format!("cannot record the provisioning intent: the journal write took longer than {JOURNAL_WAIT:?}")))
                        .await;
                }
            }
        }
        lock(&self.in_flight).insert(key.clone(), flight.clone());
        let mut request = flight.prepared.request.clone();
        request.secrets = secrets.clone();
        tracing::debug!(claim = %flight.claim.key(), volume = %request.name, "calling CreateVolume");
        let options = CallOptions {
            migrated: flight.prepared.migrated,
            ..CallOptions::timeout(self.config.timeout)
        };
        let answer = self.csi.create_volume(request, options).await;
        let volume = match answer {
            Ok(response) => response.volume,
            Err(status) => {
                let may_reschedule =
                    self.config.policy.topology && flight.claim.selected_node().is_some();
                let state = decide::classify(Some(status.code()), may_reschedule);
                if state != State::InBackground {
                    self.finish(uid);
                }
                let failure = Failure {
                    state,
                    message: sidecar_kit::driver::csi::go_error(&status),
                    infeasible: status.code() == tonic::Code::InvalidArgument,
                };
                return self.flight_failed(&flight, failure).await;
            }
        };
        let Some(volume) = volume else {
            let failure = Failure::new(
                State::InBackground,
                "CreateVolume answered without a volume",
            );
            return self.flight_failed(&flight, failure).await;
        };
        if volume.volume_id.is_empty() {
            // A volume without an id can be neither written into a PV nor deleted: the driver
            // created something under the request's name, and repeating the identical request
            // (CreateVolume is idempotent by name) is how to learn its id.
            let failure = Failure::new(
                State::InBackground,
                "CreateVolume answered with an empty volume_id",
            );
            return self.flight_failed(&flight, failure).await;
        }
        // A claim being deleted only waits for its pvc-protection finalizer to go.
        let claim_gone = self.index().claim(uid).is_none_or(|c| c.deleting);
        if claim_gone && flight.prepared.pv.reclaim_policy != crate::model::RECLAIM_DELETE {
            // The class keeps its volumes: the PV is written as upstream writes it, and the
            // PV controller marks it Released for an administrator to reclaim.
            tracing::info!(claim = %flight.claim.key(), volume_id = %volume.volume_id, reclaim_policy = %flight.prepared.pv.reclaim_policy, "claim deleted while its volume was being created; its class retains volumes, so its PV is written");
        } else if claim_gone {
            // Nobody will use the volume: delete it instead of writing a PV for the PV
            // controller to release and delete later.
            tracing::info!(claim = %flight.claim.key(), volume_id = %volume.volume_id, "claim deleted while its volume was being created; deleting the volume");
            match self.cleanup(&volume.volume_id, &secrets).await {
                Ok(()) => {
                    self.finish(uid);
                    self.claims.forget(&*key);
                }
                Err(status) => {
                    let failure = Failure::new(
                        State::InBackground,
                        format!(
                            "deleting the volume of a deleted claim failed: {}",
                            sidecar_kit::driver::csi::go_error(&status)
                        ),
                    );
                    self.flight_failed(&flight, failure).await;
                }
            }
            return;
        }
        match decide::build_pv(&self.config.policy, &flight.prepared, &volume) {
            Created::Pv(pv) => {
                let mut flight = flight;
                flight.pv = Some(pv.clone());
                lock(&self.in_flight).insert(key, flight.clone());
                self.save_pv(flight, *pv).await;
            }
            Created::Undo {
                volume_id,
                message,
                reason,
            } => {
                let failure = match self.cleanup(&volume_id, &secrets).await {
                    Ok(()) => {
                        let state = reason.state_after_cleanup();
                        if state != State::InBackground {
                            self.finish(&key);
                        }
                        Failure::new(state, message)
                    }
                    Err(status) => Failure::new(
                        State::InBackground,
                        reason.orphaned(
                            &message,
                            &flight.prepared.request.name,
                            &sidecar_kit::driver::csi::go_error(&status),
                        ),
                    ),
                };
                self.flight_failed(&flight, failure).await;
            }
        }
    }

    /// Decides about a claim not in flight.
    async fn start_claim(&self, uid: &str) -> Start {
        let (claim, class) = match self.select_claim(uid) {
            Selected::Provision(claim, class) => (*claim, class),
            Selected::Unowned(claim, class) => {
                self.try_to_own(&claim, &class).await;
                return Start::Stop;
            }
            Selected::Stop => return Start::Stop,
        };
        if !self.index().volumes_listed()
            && let Some(wait) = self.before_volumes_listed(&claim).await
        {
            return wait;
        }
        let lookups = self.lookups(&claim, &class).await;
        let prepared = {
            let index = self.index();
            decide::prepare(&self.config.policy, &claim, &class, &*index, &lookups)
        };
        self.events.record(
            claim.object_ref(),
            EventType::Normal,
            "Provisioning",
            &format!(
                "External provisioner is provisioning volume for claim \"{}\"",
                claim.key()
            ),
        );
        match prepared {
            Ok(prepared) => Start::Go(Box::new(InFlight {
                claim,
                class: class.name.clone(),
                prepared,
                pv: None,
                started: Instant::now(),
                journaled: false,
            })),
            Err(failure) => Start::Fail(Box::new(claim), class.name.clone(), failure),
        }
    }

    /// A claim selected before the PVs were listed: whether its PV exists, which the index
    /// cannot tell yet, is asked of the API server; a clone, whose source's PV the index must
    /// hold, waits for the list. `None`: go on.
    async fn before_volumes_listed(&self, claim: &Claim) -> Option<Start> {
        let key = claim.uid.to_string();
        if matches!(claim.source_key(), Some((SourceKind::Claim, _, _))) {
            tracing::debug!(claim = %claim.key(), retry_in = ?VOLUMES_LISTED_POLL, "a clone waits for the PVs to be listed");
            self.claims.add_after(key, 0, VOLUMES_LISTED_POLL);
            return Some(Start::Stop);
        }
        // A name that cannot be made is reported by the preparation that follows.
        let Ok(name) = decide::volume_name(
            &self.config.policy.volume_name_prefix,
            &claim.uid,
            self.config.policy.volume_name_uuid_length,
        ) else {
            return None;
        };
        match self.pvs.get_opt(&name).await {
            Ok(None) => None,
            Ok(Some(_)) => {
                tracing::debug!(claim = %claim.key(), pv = %name, "not provisioning: its PV exists (the PVs are not listed yet)");
                self.claims.forget(&*key);
                Some(Start::Stop)
            }
            Err(err) => {
                let delay = self.claims.add_rate_limited(key, 0);
                tracing::info!(claim = %claim.key(), pv = %name, error = %api_message(&err), retry_in = ?delay, "cannot tell whether the claim's PV exists");
                Some(Start::Stop)
            }
        }
    }

    /// The claim and its class, if the claim is one to provision now.
    fn select_claim(&self, uid: &str) -> Selected {
        let key = uid.to_string();
        let policy = &self.config.policy;
        let index = self.index();
        let Some(claim) = index.claim(uid) else {
            self.claims.forget(&*key);
            lock(&self.waiting).remove(uid);
            lock(&self.owners).remove(uid);
            self.events.forget_object(uid);
            return Selected::Stop;
        };
        let class_name = claim.storage_class.clone().unwrap_or_default();
        let class = index.class(&class_name).cloned();
        let name = decide::volume_name(
            &policy.volume_name_prefix,
            uid,
            policy.volume_name_uuid_length,
        )
        .unwrap_or_default();
        if let Err(skip) =
            decide::should_provision(policy, &claim, class.as_ref(), index.has_volume(&name))
        {
            drop(index);
            match (skip, class) {
                (decide::Skip::Unowned, Some(class)) => {
                    return Selected::Unowned(Box::new(claim), class);
                }
                (decide::Skip::NoClass, _) => {
                    tracing::info!(claim = %claim.key(), storage_class = %class_name, "StorageClass not found; waiting for it")
                }
                (skip, _) => {
                    tracing::trace!(claim = %claim.key(), reason = ?skip, "not provisioning")
                }
            }
            lock(&self.owners).remove(uid);
            self.claims.forget(&*key);
            return Selected::Stop;
        }
        let Some(class) = class else {
            return Selected::Stop;
        };
        if let Some((class_uid, at)) = lock(&self.infeasible).get(uid).cloned() {
            let wait = self.config.backoff.max.saturating_sub(at.elapsed());
            if class_uid == class.uid && !wait.is_zero() {
                drop(index);
                tracing::debug!(claim = %claim.key(), retry_in = ?wait, "infeasible claim waits before its next attempt");
                self.claims.add_after(key, 0, wait);
                return Selected::Stop;
            }
        }
        Selected::Provision(Box::new(claim), class)
    }

    /// Looks up what preparing the claim needs besides the index: its data source (snapshots
    /// from the watch when there is one, their contents from the API server; claims and their
    /// PVs from the index), the ReferenceGrants of a source in another namespace, and its
    /// VolumeAttributesClass.
    pub(super) async fn lookups(&self, claim: &Claim, class: &Class) -> Lookups {
        let policy = &self.config.policy;
        let mut lookups = Lookups::default();
        let Some(spec) = claim.pending.as_deref() else {
            return lookups;
        };
        if let Some(source) = &spec.data_source {
            if source.namespace.is_some() {
                let allowed = self
                    .index()
                    .grants_in(source.namespace_in(&claim.namespace))
                    .any(|g| g.allows(&claim.namespace, source));
                lookups.grant = Some(if allowed {
                    Ok(())
                } else {
                    Err(sources::not_granted(claim, source))
                });
            }
            match source.key(&claim.namespace) {
                Some((SourceKind::Snapshot, namespace, name))
                    if policy.caps.create_delete_snapshot =>
                {
                    lookups.source_watched = self.config.watch_snapshots;
                    lookups.content =
                        Some(self.restore_source(claim, class, &namespace, &name).await);
                }
                Some((SourceKind::Claim, namespace, name)) if policy.caps.clone_volume => {
                    lookups.source_watched = true;
                    let index = self.index();
                    let source = index.claim_named(&namespace, &name);
                    let pv = source
                        .as_ref()
                        .filter(|s| !s.volume_name.is_empty())
                        .and_then(|s| index.volume(&s.volume_name));
                    lookups.content = Some(sources::check_clone(
                        claim,
                        class,
                        &name,
                        source.as_ref(),
                        pv.as_ref(),
                    ));
                }
                _ => {}
            }
        }
        if let Some(name) = &spec.volume_attributes_class
            && policy.attributes_classes
            && policy.caps.modify_volume
        {
            let api: Api<VolumeAttributesClass> = Api::all(self.client.clone());
            lookups.attributes_class = Some(
                api.get(name)
                    .await
                    .map(|vac| AttributesClass::from_api(&vac))
                    .map_err(|e| api_message(&e)),
            );
        }
        lookups
    }

    /// The content source of a restore from snapshot `namespace/name`, or why not yet.
    async fn restore_source(
        &self,
        claim: &Claim,
        class: &Class,
        namespace: &str,
        name: &str,
    ) -> Result<csi_proto::v1::VolumeContentSource, SourceError> {
        let snapshot = if self.config.watch_snapshots {
            self.index().snapshot(namespace, name).cloned()
        } else {
            let api: Api<VolumeSnapshot> = Api::namespaced(self.snapshot_client(), namespace);
            match api.get_opt(name).await {
                Ok(found) => found.as_ref().map(sources::Snapshot::from_api),
                Err(err) => {
                    return Err(SourceError {
                        message: format!(
                            "error getting snapshot {name} from api server: {}",
                            api_message(&err)
                        ),
                        may_change: false,
                    });
                }
            }
        };
        let (snapshot, content_name) = sources::check_snapshot(name, snapshot.as_ref())?;
        let check = |content: &Content| {
            sources::check_content(
                claim,
                class,
                snapshot,
                content,
                self.config.policy.prevent_volume_mode_conversion,
            )
        };
        let cached = || {
            lock(&self.contents)
                .get(content_name)
                .filter(|(version, _)| *version == snapshot.resource_version)
                .map(|(_, content)| content.clone())
        };
        // A refusal is checked against a fresh read: the content may have changed (for example
        // an annotation allowing a volume mode change).
        if let Some(content) = cached()
            && let Ok(source) = check(&content)
        {
            return Ok(source);
        }
        let _one_read = self.content_reads.lock().await;
        if let Some(content) = cached()
            && let Ok(source) = check(&content)
        {
            return Ok(source);
        }
        let api: Api<VolumeSnapshotContent> = Api::all(self.snapshot_client());
        let content = match api.get(content_name).await {
            Ok(content) => Content::from_api(&content),
            Err(err) => {
                tracing::info!(snapshot = %format!("{namespace}/{name}"), content = content_name, error = %api_message(&err), "cannot get the snapshot's content");
                return Err(SourceError {
                    message: format!(
                        "error getting snapshotcontent {content_name} for snapshot {name}"
                    ),
                    may_change: false,
                });
            }
        };
        if self.config.watch_snapshots {
            let mut contents = lock(&self.contents);
            if contents.len() >= CONTENT_CACHE {
                contents.clear();
            }
            contents.insert(
                content_name.to_string(),
                (snapshot.resource_version.clone(), content.clone()),
            );
        }
        check(&content)
    }

    async fn flight_failed(&self, flight: &InFlight, failure: Failure) {
        self.claim_failed(
            &flight.claim,
            &flight.class,
            &flight.prepared.source,
            failure,
        )
        .await;
    }

    async fn claim_failed(&self, claim: &Claim, class: &str, source: &str, failure: Failure) {
        let key = claim.uid.clone();
        // Upstream labels the failures of claims not prepared yet with `spec.dataSource`'s kind.
        let source = match source {
            "" => claim
                .pending
                .as_ref()
                .and_then(|p| p.data_source.as_ref())
                .filter(|s| !s.from_ref)
                .map_or("", |s| s.kind.as_str()),
            known => known,
        };
        if let Some(metrics) = &self.config.metrics {
            metrics.provision(class, source, Err(()));
        }
        // A failure may have been for want of room: the class's capacities are read again.
        if failure.state != State::NoChange {
            self.refresh_capacity(class, None);
        }
        match failure.state {
            State::Ignored => {
                tracing::debug!(claim = %claim.key(), reason = %failure.message, "not provisioning");
                if failure.message == decide::POPULATOR_MESSAGE {
                    self.events.record(
                        claim.object_ref(),
                        EventType::Normal,
                        "Provisioning",
                        &failure.message,
                    );
                }
                self.claims.forget(&*key);
                return;
            }
            State::Wait => {
                // The watch of the source requeues the claim when the source changes.
                let told = lock(&self.waiting).insert(key.clone(), failure.message.clone());
                if told.as_deref() != Some(failure.message.as_str()) {
                    tracing::info!(claim = %claim.key(), reason = %failure.message, "waiting for the data source");
                    self.events.record(
                        claim.object_ref(),
                        EventType::Warning,
                        "ProvisioningFailed",
                        &format!(
                            "{}; provisioning goes on when the data source changes",
                            failure.message
                        ),
                    );
                }
                self.claims.forget(&*key);
                return;
            }
            _ => {
                lock(&self.waiting).remove(&key);
            }
        }
        if failure.infeasible {
            lock(&self.infeasible).insert(key.clone(), (self.class_uid(class), Instant::now()));
            let message = format!(
                "Volume provisioning failed with infeasible error. Retries will be delayed. {}",
                failure.message
            );
            self.events.record(
                claim.object_ref(),
                EventType::Warning,
                "ProvisioningFailed",
                &message,
            );
            tracing::warn!(claim = %claim.key(), error = %failure.message, retry_in = ?self.config.backoff.max, "provisioning infeasible");
            self.claims.add_after(key, 0, self.config.backoff.max);
            return;
        }
        self.events.record(
            claim.object_ref(),
            EventType::Warning,
            "ProvisioningFailed",
            &failure.message,
        );
        if failure.state == State::Reschedule && claim.selected_node().is_some() {
            match self.reschedule(claim).await {
                Ok(()) => {
                    tracing::info!(claim = %claim.key(), error = %failure.message, "asked the scheduler for another node");
                    self.claims.forget(&*key);
                    return;
                }
                Err(err) => {
                    tracing::info!(claim = %claim.key(), error = %err, "Volume rescheduling failed")
                }
            }
        }
        let delay = self.claims.add_rate_limited(key, 0);
        tracing::info!(claim = %claim.key(), error = %failure.message, state = ?failure.state, retry_in = ?delay, "provisioning failed");
        if delay >= LONG_BACKOFF {
            let next = Timestamp::now()
                .checked_add(jiff_duration(delay))
                .unwrap_or_else(|_| Timestamp::now());
            self.events.record(
                claim.object_ref(),
                EventType::Warning,
                "ProvisioningBackoff",
                &format!(
                    "Provisioning keeps failing; next attempt at {next} (in {}s)",
                    delay.as_secs()
                ),
            );
        }
    }

    fn class_uid(&self, class: &str) -> String {
        self.index()
            .class(class)
            .map(|c| c.uid.clone())
            .unwrap_or_default()
    }

    /// Removes `volume.kubernetes.io/selected-node` so that the scheduler picks a node again
    /// (an update, as upstream's RBAC grants no patch on claims).
    async fn reschedule(&self, claim: &Claim) -> Result<(), String> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let mut current = api.get(&claim.name).await.map_err(|e| api_message(&e))?;
        if current.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Ok(());
        }
        let annotations = current.metadata.annotations.get_or_insert_default();
        annotations.remove(model::ANN_SELECTED_NODE);
        annotations.remove(model::ANN_ALPHA_SELECTED_NODE);
        let updated = api
            .replace(&claim.name, &PostParams::default(), &current)
            .await
            .map_err(|e| api_message(&e))?;
        self.index().store_claim(&updated);
        Ok(())
    }

    /// Writes the PV of a created volume. A PV of that name with another volume handle means
    /// this volume is a second one (a create replayed after a delete): it is deleted again.
    async fn save_pv(&self, flight: InFlight, pv: PersistentVolume) {
        let key = flight.claim.uid.clone();
        let name = flight.prepared.pv.name.clone();
        let volume_id = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default();
        match self.pvs.create(&PostParams::default(), &pv).await {
            Ok(created) => {
                self.index().store_volume(&created, true);
            }
            Err(err) if api_code(&err) == Some(409) => match self.pvs.get_opt(&name).await {
                Ok(Some(existing)) if decide::same_volume(&existing, &volume_id) => {
                    self.index().store_volume(&existing, true);
                }
                Ok(Some(_)) => {
                    tracing::warn!(persistent_volume = %name, volume_id = %volume_id, "a PV of this name names another volume; deleting the volume just created");
                    let secrets = self
                        .secrets(flight.prepared.provisioner_secret.as_ref())
                        .await
                        .unwrap_or_default();
                    if let Err(status) = self.cleanup(&volume_id, &secrets).await {
                        let failure = Failure::new(
                            State::InBackground,
                            format!(
                                "deleting duplicate volume {volume_id} failed: {}",
                                sidecar_kit::driver::csi::go_error(&status)
                            ),
                        );
                        return self.flight_failed(&flight, failure).await;
                    }
                    self.finish(&key);
                    self.claims.forget(&*key);
                    return;
                }
                Ok(None) | Err(_) => {
                    let failure = Failure::new(
                        State::InBackground,
                        format!(
                            "error saving persistentvolume {name}: {}",
                            api_message(&err)
                        ),
                    );
                    return self.flight_failed(&flight, failure).await;
                }
            },
            Err(err) => {
                let failure = Failure::new(
                    State::InBackground,
                    format!(
                        "error saving persistentvolume {name}: {}",
                        api_message(&err)
                    ),
                );
                return self.flight_failed(&flight, failure).await;
            }
        }
        self.finish(&key);
        lock(&self.infeasible).remove(&key);
        lock(&self.waiting).remove(&key);
        self.claims.forget(&*key);
        if let Some(metrics) = &self.config.metrics {
            metrics.provision(
                &flight.class,
                &flight.prepared.source,
                Ok(flight.started.elapsed()),
            );
        }
        self.refresh_capacity(
            &flight.class,
            pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()),
        );
        tracing::info!(claim = %flight.claim.key(), persistent_volume = %name, "provisioned");
        self.events.record(
            flight.claim.object_ref(),
            EventType::Normal,
            "ProvisioningSucceeded",
            &format!("Successfully provisioned volume {name}"),
        );
        // A provisioned claim gets no more of these Events: remembering them for folding would
        // only hold memory for every claim of a burst.
        self.events.forget_object(&flight.claim.uid);
    }

    /// DeleteVolume for a volume that must not stay: several attempts within one timeout.
    async fn cleanup(
        &self,
        volume_id: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<(), tonic::Status> {
        let named = {
            let index = self.index();
            if !index.volumes_listed() {
                // Until then the index cannot tell whether a PV names the volume.
                return Err(tonic::Status::unavailable(format!(
                    "not deleting volume {volume_id} before the PVs are listed"
                )));
            }
            index.volume_with_handle(volume_id)
        };
        if let Some(pv) = named {
            // A volume some PV names is in use or kept (an administrator re-homed a retained
            // volume, or an intent was replayed): never deleted here.
            tracing::warn!(volume_id, persistent_volume = %pv.name, "not deleting a volume that a PV names");
            self.events.record(
                pv.object_ref(),
                EventType::Warning,
                "VolumeKept",
                &format!("Volume {volume_id} was not deleted by the provisioner's cleanup: this PV names it"),
            );
            return Ok(());
        }
        let deadline = Instant::now() + self.config.timeout;
        let mut last = tonic::Status::deadline_exceeded(sidecar_kit::driver::csi::DEADLINE_MESSAGE);
        for _ in 0..CLEANUP_ATTEMPTS {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let request = DeleteVolumeRequest {
                volume_id: volume_id.to_string(),
                secrets: secrets.clone(),
            };
            match self
                .csi
                .delete_volume(request, CallOptions::timeout(left))
                .await
            {
                Ok(_) => return Ok(()),
                Err(status) => last = status,
            }
        }
        Err(last)
    }

    pub(super) async fn secrets(
        &self,
        reference: Option<&SecretRef>,
    ) -> Result<HashMap<String, String>, String> {
        let Some(reference) = reference else {
            return Ok(HashMap::new());
        };
        sidecar_kit::cluster::client::fetch_secret(
            &self.client,
            &reference.namespace,
            &reference.name,
        )
        .await
    }

    /// Asks capacity tracking to read again the capacities a volume created or deleted in
    /// `affinity` may have changed: those of its segments, else (no topology) the class's, as
    /// upstream's provisioner does.
    pub(super) fn refresh_capacity(
        &self,
        class: &str,
        affinity: Option<&k8s_openapi::api::core::v1::VolumeNodeAffinity>,
    ) {
        let Some(capacity) = &self.config.capacity else {
            return;
        };
        let segments = affinity
            .map(crate::capacity::affinity_segments)
            .unwrap_or_default();
        if segments.is_empty() {
            if !class.is_empty() {
                capacity.refresh(Some(class), None);
            }
            return;
        }
        for segment in &segments {
            capacity.refresh(None, Some(segment));
        }
    }
}

/// What the claim selection found.
enum Selected {
    Provision(Box<Claim>, Class),
    /// Distributed provisioning: an Immediate claim this node may claim.
    Unowned(Box<Claim>, Class),
    Stop,
}

/// What to do with a claim that is not in flight.
enum Start {
    Go(Box<InFlight>),
    Stop,
    Fail(Box<Claim>, String, Failure),
}
