//! Data source protection: our finalizer on a claim's source (a claim or a snapshot) while
//! volumes are created from it, and its removal once none is.

use super::*;

impl Controller {
    /// Puts our protection finalizer on the claim's source before its volume is created from
    /// it, so that it is not deleted meanwhile. Each source is written once, whatever the
    /// number of claims filled from it.
    pub(super) async fn protect_source(&self, claim: &Claim) -> Result<(), String> {
        let Some((kind, namespace, name)) = claim.source_key() else {
            return Ok(());
        };
        let _serial = self.protection.lock().await;
        match kind {
            SourceKind::Claim => {
                if self
                    .index()
                    .claim_named(&namespace, &name)
                    .is_some_and(|c| c.clone_protected)
                {
                    return Ok(());
                }
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.client.clone(), &namespace);
                let mut source = api.get(&name).await.map_err(|e| api_message(&e))?;
                let finalizers = source.metadata.finalizers.get_or_insert_default();
                if !finalizers.iter().any(|f| f == model::CLONE_FINALIZER) {
                    finalizers.push(model::CLONE_FINALIZER.to_string());
                    source = api
                        .replace(&name, &PostParams::default(), &source)
                        .await
                        .map_err(|e| api_message(&e))?;
                    tracing::info!(claim = %format!("{namespace}/{name}"), "added the cloning protection finalizer");
                }
                self.index().store_claim(&source);
                Ok(())
            }
            SourceKind::Snapshot => {
                if self.config.watch_snapshots
                    && self
                        .index()
                        .snapshot(&namespace, &name)
                        .is_some_and(|s| s.protected)
                {
                    return Ok(());
                }
                let api = self.snapshots_api(&namespace);
                let mut snapshot = api.get(&name).await.map_err(|e| api_message(&e))?;
                let finalizers = snapshot.metadata.finalizers.get_or_insert_default();
                if finalizers.iter().any(|f| f == model::SNAPSHOT_FINALIZER) {
                    return Ok(());
                }
                finalizers.push(model::SNAPSHOT_FINALIZER.to_string());
                match api.replace(&name, &PostParams::default(), &snapshot).await {
                    Ok(_) => {
                        tracing::info!(snapshot = %format!("{namespace}/{name}"), "added the restore protection finalizer");
                        Ok(())
                    }
                    Err(err) if api_code(&err) == Some(403) => {
                        tracing::debug!(snapshot = %format!("{namespace}/{name}"), error = %api_message(&err), "cannot add the restore protection finalizer (needs 'update' on volumesnapshots); provisioning goes on without it");
                        Ok(())
                    }
                    Err(err) => Err(api_message(&err)),
                }
            }
        }
    }

    fn snapshots_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.snapshot_client(),
            namespace,
            &ApiResource::erase::<VolumeSnapshot>(&()),
        )
    }

    /// Removes our protection finalizer from a source no claim without a volume names any
    /// more (a claim being cloned from only once it is being deleted, as upstream).
    pub(super) async fn sync_source(&self, key: &SourceKey) {
        let result = {
            let _serial = self.protection.lock().await;
            self.release_source(key).await
        };
        match result {
            Ok(()) => self.sources.forget(key),
            Err(message) => {
                let delay = self.sources.add_rate_limited(key.clone(), 0);
                tracing::info!(source = ?key, error = %message, retry_in = ?delay, "failed to remove a protection finalizer");
            }
        }
    }

    async fn release_source(&self, key: &SourceKey) -> Result<(), String> {
        let (kind, namespace, name) = key;
        let label = format!("{namespace}/{name}");
        {
            let index = self.index();
            if index.source_in_use(key) {
                return Ok(());
            }
            let cached_protection = match kind {
                SourceKind::Claim => index
                    .claim_named(namespace, name)
                    .map(|c| c.deleting && c.clone_protected),
                SourceKind::Snapshot if self.config.watch_snapshots => {
                    index.snapshot(namespace, name).map(|s| s.protected)
                }
                SourceKind::Snapshot => Some(true),
            };
            if cached_protection != Some(true) {
                return Ok(());
            }
        }
        match kind {
            SourceKind::Claim => {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.client.clone(), namespace);
                let Some(mut claim) = api.get_opt(name).await.map_err(|e| api_message(&e))? else {
                    return Ok(());
                };
                let finalizers = claim.metadata.finalizers.get_or_insert_default();
                let before = finalizers.len();
                finalizers.retain(|f| f != model::CLONE_FINALIZER);
                if finalizers.len() == before {
                    return Ok(());
                }
                match api.replace(name, &PostParams::default(), &claim).await {
                    Ok(updated) => {
                        self.index().store_claim(&updated);
                        tracing::info!(claim = %label, "removed the cloning protection finalizer");
                        Ok(())
                    }
                    Err(err) if api_code(&err) == Some(404) => Ok(()),
                    Err(err) => Err(format!(
                        "failed to remove clone finalizer from PVC {name}: {}",
                        api_message(&err)
                    )),
                }
            }
            SourceKind::Snapshot => {
                let api = self.snapshots_api(namespace);
                let mut snapshot = match api.get_opt(name).await {
                    Ok(Some(snapshot)) => snapshot,
                    Ok(None) => return Ok(()),
                    Err(err) if api_code(&err) == Some(403) => {
                        tracing::debug!(snapshot = %label, error = %api_message(&err), "cannot read the snapshot to remove our finalizer");
                        return Ok(());
                    }
                    Err(err) => return Err(api_message(&err)),
                };
                let finalizers = snapshot.metadata.finalizers.get_or_insert_default();
                let before = finalizers.len();
                finalizers.retain(|f| f != model::SNAPSHOT_FINALIZER);
                if finalizers.len() == before {
                    return Ok(());
                }
                match api.replace(name, &PostParams::default(), &snapshot).await {
                    Ok(_) => {
                        tracing::info!(snapshot = %label, "removed the restore protection finalizer");
                        Ok(())
                    }
                    Err(err) if matches!(api_code(&err), Some(403 | 404)) => Ok(()),
                    Err(err) => Err(format!(
                        "failed to remove the restore protection finalizer from snapshot {label}: {}",
                        api_message(&err)
                    )),
                }
            }
        }
    }
}
