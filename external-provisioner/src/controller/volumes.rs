//! Volumes: DeleteVolume for released volumes of the Delete policy, and our finalizer on the
//! PVs we provisioned.

use super::*;

impl Controller {
    pub(super) async fn sync_volume(&self, name: &str) {
        let key = name.to_string();
        let (volume, plan) = {
            let index = self.index();
            let Some(volume) = index.volume(name) else {
                self.volumes.forget(&*key);
                return;
            };
            let attached = if self.config.watch_attachments {
                index.attached_to(name)
            } else {
                None
            };
            let class = index.class(&volume.storage_class);
            let plan =
                decide::plan_volume(&self.config.policy, &volume, class, attached.as_deref());
            (volume, plan)
        };
        let result = match plan {
            VolumePlan::Nothing => Ok(()),
            VolumePlan::AddFinalizer | VolumePlan::RemoveFinalizer => {
                let add = matches!(plan, VolumePlan::AddFinalizer);
                operation::describe(
                    if add {
                        "add finalizer"
                    } else {
                        "remove finalizer"
                    },
                    &[("k8s.pv.name", &volume.name)],
                );
                self.patch_finalizers(&volume, add).await
            }
            VolumePlan::Refuse(message) => {
                self.events.record(
                    volume.object_ref(),
                    EventType::Warning,
                    "VolumeFailedDelete",
                    &message,
                );
                Err(message)
            }
            VolumePlan::Delete(plan) => {
                let (namespace, claim) = volume.claim.clone().unwrap_or_default();
                operation::describe(
                    "delete",
                    &[
                        ("k8s.pv.name", &volume.name),
                        ("k8s.namespace.name", &namespace),
                        ("k8s.pvc.name", &claim),
                        ("k8s.pvc.uid", &volume.claim_uid),
                        ("csi.volume_id", &volume.volume_handle),
                    ],
                );
                self.delete_volume(&volume, plan).await
            }
        };
        match result {
            Ok(()) => self.volumes.forget(&*key),
            Err(message) => {
                let delay = self.volumes.add_rate_limited(key, 0);
                tracing::info!(persistent_volume = name, error = %message, retry_in = ?delay, "volume sync failed");
            }
        }
    }

    async fn patch_finalizers(&self, volume: &model::Volume, add: bool) -> Result<(), String> {
        let patch = decide::finalizers_patch(add);
        match self
            .pvs
            .patch(
                &volume.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(updated) => {
                self.index().store_volume(&updated, false);
                Ok(())
            }
            Err(err) if api_code(&err) == Some(404) => Ok(()),
            Err(err) => Err(format!(
                "failed to modify finalizers on volume {}: {}",
                volume.name,
                api_message(&err)
            )),
        }
    }

    async fn delete_volume(
        &self,
        volume: &model::Volume,
        plan: decide::DeletePlan,
    ) -> Result<(), String> {
        let started = Instant::now();
        let secret = match plan.secret {
            DeletionSecret::None => None,
            DeletionSecret::Annotated(r) => Some(r),
            DeletionSecret::FromClass(Ok(r)) => r,
            DeletionSecret::FromClass(Err(message)) => {
                self.record_delete_failure(volume, &message);
                return Err(message);
            }
        };
        let secrets = match self.secrets(secret.as_ref()).await {
            Ok(secrets) => secrets,
            Err(message) => {
                // The secret may be gone already: delete without it, as upstream does.
                tracing::error!(persistent_volume = %volume.name, error = %message, "failed to get credentials for volume; deleting without them");
                HashMap::new()
            }
        };
        let mut request = plan.request;
        request.secrets = secrets;
        let options = CallOptions {
            migrated: plan.migrated,
            ..CallOptions::timeout(self.config.timeout)
        };
        if let Err(status) = self.csi.delete_volume(request, options).await {
            let message = sidecar_kit::driver::csi::go_error(&status);
            self.record_delete_failure(volume, &message);
            return Err(message);
        }
        tracing::info!(persistent_volume = %volume.name, "volume deleted");
        // The deletion answers with the PV as it is now: deletionTimestamp set, finalizers
        // still on.
        match self
            .pvs
            .delete(&volume.name, &DeleteParams::default())
            .await
        {
            Ok(Either::Left(remaining)) => {
                self.refresh_capacity(
                    &volume.storage_class,
                    remaining
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_affinity.as_ref()),
                );
                self.index().store_volume(&remaining, false);
                let remaining = model::Volume::from_api(&remaining);
                if remaining.has_finalizer() {
                    self.patch_finalizers(&remaining, false).await?;
                }
            }
            Ok(Either::Right(_)) => {}
            Err(err) if api_code(&err) == Some(404) => {}
            Err(err) => {
                return Err(format!(
                    "failed to delete persistentvolume {}: {}",
                    volume.name,
                    api_message(&err)
                ));
            }
        }
        if let Some(metrics) = &self.config.metrics {
            metrics.delete(&volume.storage_class, Ok(started.elapsed()));
        }
        Ok(())
    }

    fn record_delete_failure(&self, volume: &model::Volume, message: &str) {
        if let Some(metrics) = &self.config.metrics {
            metrics.delete(&volume.storage_class, Err(()));
        }
        self.events.record(
            volume.object_ref(),
            EventType::Warning,
            "VolumeFailedDelete",
            message,
        );
    }
}
