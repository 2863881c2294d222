//! The intent journal: CreateSnapshot calls recorded before they are made, taken up after a
//! restart (validated, never trusted), and the snapshots of contents that went away deleted.

use super::*;

impl Controller {
    /// Takes up the CreateSnapshot calls a previous leader (or this process before a restart)
    /// left unanswered: a content that still exists carries on as usual; for one that is gone,
    /// the snapshot is found and deleted by the worker.
    pub(super) async fn take_up_journal(&self, shutdown: &CancellationToken) {
        let mut delay = Duration::from_millis(200);
        let intents = loop {
            match self.journal.load::<Recorded>().await {
                Ok(intents) => break intents,
                Err(err) => {
                    tracing::warn!(error = %err, retry_in = ?delay, "cannot read the intent journal; unfinished snapshots wait for it");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(self.config.backoff.max);
                }
            }
        };
        if !intents.is_empty() {
            tracing::info!(
                count = intents.len(),
                "taking up unfinished snapshots from the intent journal"
            );
        }
        for (key, recorded) in intents {
            match (recorded, key.strip_prefix(groups::KEY_PREFIX)) {
                (Recorded::Group(intent), Some(name)) => {
                    match self.check_group_intent(name, &intent) {
                        Ok(()) => {
                            lock(&self.group_intents).insert(name.to_string(), intent);
                            self.group_queue.add(name.to_string(), 0);
                        }
                        Err(rejected) => self.reject_intent(&key, &rejected),
                    }
                }
                (Recorded::Snapshot(intent), None) => match self.check_intent(&key, &intent) {
                    Ok(()) => {
                        lock(&self.intents).insert(key.clone(), intent);
                        self.queue.add(key, 0);
                    }
                    Err(rejected) => self.reject_intent(&key, &rejected),
                },
                _ => {
                    tracing::warn!(%key, "dropping an intent journal entry of the wrong kind");
                    self.journal.forget(&key);
                }
            }
        }
    }

    /// Whether the recorded intent for content `name` is one this snapshotter would have
    /// recorded (see [`crate::journal`]).
    fn check_intent(&self, name: &str, intent: &Intent) -> Result<(), Rejected> {
        let naming = &self.config.naming;
        journal::check_name(
            decide::snapshot_name(&naming.prefix, &intent.snapshot_uid, naming.uuid_length),
            &intent.name,
        )?;
        let live = self
            .index()
            .view(name)
            .filter(|(content, _)| content.uid == intent.content_uid);
        let Some((content, class)) = live else {
            return match self
                .index()
                .content_bound_to(&intent.snapshot_uid, &intent.content_uid)
            {
                Some(owner) => Err(Rejected::Owned(owner)),
                None => Ok(()),
            };
        };
        journal::check_bound(&content.snapshot_ref.uid, &intent.snapshot_uid)?;
        let (now, _) = self
            .create_input(&content, class.as_ref())
            .map_err(Rejected::Unverifiable)?;
        journal::check_parts([
            ("snapshot name", intent.name == now.name),
            ("source volume", intent.source_volume == now.source_volume),
            ("parameters", intent.parameters == now.parameters),
            ("secret reference", intent.secret == now.secret),
            ("deletion policy", intent.delete == now.delete),
        ])
    }

    /// Drops an entry of the journal that is not what this snapshotter records, saying so in
    /// the log and in a Warning Event on the journal's ConfigMap.
    fn reject_intent(&self, key: &str, rejected: &Rejected) {
        tracing::warn!(%key, reason = %rejected, "dropping an intent journal entry this snapshotter did not record; nothing is asked of the driver for it");
        if let Some(location) = &self.config.journal {
            self.events.record(
                location.object_ref(),
                EventType::Warning,
                sidecar_kit::cluster::journal::REJECTED_REASON,
                &format!(
                    "Dropped intent journal entry {key:?}: {rejected}; nothing was asked of the driver for it"
                ),
            );
        }
        self.journal.forget(key);
    }

    pub(super) async fn record(&self, name: &str, intent: &Intent) -> Result<(), String> {
        if lock(&self.intents).get(name) == Some(intent) {
            return Ok(());
        }
        self.write_intent(name, intent).await?;
        lock(&self.intents).insert(name.to_string(), intent.clone());
        Ok(())
    }

    /// Writes an intent to the journal, waiting at most [`JOURNAL_WAIT`].
    pub(super) async fn write_intent<T: Serialize>(
        &self,
        key: &str,
        intent: &T,
    ) -> Result<(), String> {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(JOURNAL_WAIT, self.journal.record(key, intent)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(format!("cannot record the snapshot intent: {err}")),
            Err(_) => {
                return Err(format!(
                    "cannot record the snapshot intent: the journal write took longer than {JOURNAL_WAIT:?}"
                ));
            }
        }
        let took = started.elapsed();
        if took > Duration::from_secs(1) {
            tracing::info!(key, waited = ?took, "the journal write waited for its turn");
        }
        Ok(())
    }

    pub(super) fn forget(&self, name: &str) {
        if lock(&self.intents).remove(name).is_some() {
            self.journal.forget(name);
        }
    }

    /// A content that is gone (or was replaced by another of the same name): if a CreateSnapshot
    /// for it may have cut a snapshot, the snapshot is found (CreateSnapshot is idempotent by
    /// name) and deleted unless the content's policy kept it.
    pub(super) async fn settle_gone(&self, name: &str) -> Result<(), Failure> {
        let Some(intent) = lock(&self.intents).get(name).cloned() else {
            lock(&self.calls).remove(name);
            return Ok(());
        };
        if let Some((content, _)) = self.index().view(name)
            && content.uid == intent.content_uid
        {
            return Ok(());
        }
        if !intent.delete {
            tracing::warn!(content = name, snapshot = %intent.name, "the content of an unanswered CreateSnapshot is gone and its policy retains the snapshot: the driver may keep a snapshot no content names");
            self.forget(name);
            return Ok(());
        }
        let secrets = self
            .secret(intent.secret.as_ref())
            .await
            .map_err(Failure::quiet)?;
        let request = CreateSnapshotRequest {
            source_volume_id: intent.source_volume.clone(),
            name: intent.name.clone(),
            secrets: secrets.into_iter().collect(),
            parameters: intent.parameters.clone().into_iter().collect(),
        };
        let handle = match self.csi.create_snapshot(request, self.options()).await {
            Ok(response) => response.snapshot.map(|s| s.snapshot_id),
            Err(status) if decide::is_final(Some(status.code())) => {
                // The driver refuses the request for sure: it has no snapshot of that name.
                tracing::info!(content = name, error = %go_error(&status), "the snapshot of a gone content does not exist");
                None
            }
            Err(status) => {
                return Err(Failure::quiet(format!(
                    "cannot find the snapshot of gone content {name}: {}",
                    go_error(&status)
                )));
            }
        };
        match handle {
            Some(handle) => self.discard(name, &intent, &handle).await,
            None => {
                self.forget(name);
                Ok(())
            }
        }
    }

    /// Deletes the snapshot of a content that is gone, then forgets the intent.
    pub(super) async fn discard(
        &self,
        name: &str,
        intent: &Intent,
        handle: &str,
    ) -> Result<(), Failure> {
        if intent.delete {
            let secrets = self
                .secret(intent.secret.as_ref())
                .await
                .map_err(Failure::quiet)?;
            let request = DeleteSnapshotRequest {
                snapshot_id: handle.to_string(),
                secrets: secrets.into_iter().collect(),
            };
            self.csi
                .delete_snapshot(request, self.options())
                .await
                .map_err(|status| {
                    Failure::quiet(format!(
                        "cannot delete snapshot {handle} of gone content {name}: {}",
                        go_error(&status)
                    ))
                })?;
            tracing::info!(content = name, %handle, "deleted the snapshot of a content that went away during its CreateSnapshot");
        }
        self.forget(name);
        lock(&self.calls).remove(name);
        Ok(())
    }
}
