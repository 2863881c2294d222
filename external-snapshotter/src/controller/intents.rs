//! The intent journal: CreateSnapshot calls recorded before they are made, taken up after a
//! restart (validated, never trusted), and the snapshots of contents that went away deleted.

use super::kinds::{ContentKind, JournaledIntent, kind_of};
use super::*;
use crate::model::ContentObject;
use sidecar_kit::cluster::journal::DropReason;

/// What a recorded intent that passed its checks is for.
enum Intended {
    /// Its call may still be unanswered: the worker carries it on.
    Open,
    /// Its content is settled (ready, naming what was cut): the call was answered.
    Answered,
}

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
                    self.take_up::<Groups>(&key, name, intent);
                }
                (Recorded::Snapshot(intent), None) => {
                    self.take_up::<Snapshots>(&key, &key, intent);
                }
                _ => self.journal.drop_entry(
                    &key,
                    DropReason::WrongKind,
                    "its intent is not of the kind its key names",
                ),
            }
        }
    }

    /// The intent recorded under `key` for content `name` of kind `K`: carried on, done, or
    /// dropped.
    fn take_up<K: ContentKind>(&self, key: &str, name: &str, intent: K::Intent) {
        match self.check_intent::<K>(name, &intent) {
            Ok(Intended::Open) => self.adopt::<K>(name, intent),
            Ok(Intended::Answered) => {
                tracing::info!(
                    kind = kind_of::<K>(),
                    name,
                    "the content of a recorded {} is ready: the call was answered",
                    K::CREATE
                );
                self.journal.forget(key);
            }
            Err(rejected) => self.reject_intent(key, &rejected),
        }
    }

    /// Whether the recorded intent for content `name` of kind `K` is one this snapshotter
    /// would have recorded (see [`crate::journal`]), and whether its call may still be open.
    fn check_intent<K: ContentKind>(
        &self,
        name: &str,
        intent: &K::Intent,
    ) -> Result<Intended, Rejected> {
        journal::check_uids([
            ("content UID", intent.content_uid()),
            (K::Intent::PARTS[1], intent.source_uid()),
        ])?;
        journal::check_name(K::derived_name(self, intent)?, intent.name())?;
        let answered = {
            let index = self.index();
            index.is_settled::<K::Content>(name)
                && index.holds::<K::Content>(name, intent.content_uid())
        };
        if answered {
            return Ok(Intended::Answered);
        }
        let live = self
            .index()
            .view::<K::Content>(name)
            .filter(|(content, _)| content.uid() == intent.content_uid());
        let Some((content, class)) = live else {
            if let Some(owner) = self
                .index()
                .bound_to::<K::Content>(intent.source_uid(), intent.content_uid())
            {
                return Err(Rejected::Owned(owner));
            }
            // The content is gone: what its class still gives must agree; without the class
            // (or a record of it) the seal alone vouches for the entry.
            let class = intent
                .class()
                .and_then(|class| self.index().class_for::<K::Content>(class));
            let checked = match class {
                Some(class) => journal::check_against_class(
                    &journal::Recorded {
                        content: name,
                        parameters: intent.parameters(),
                        delete: intent.delete(),
                        metadata_keys: K::Intent::METADATA_KEYS,
                    },
                    &class,
                    self.config.naming.extra_create_metadata,
                ),
                None => Ok(()),
            };
            return checked.map(|()| Intended::Open);
        };
        journal::check_bound(content.source_uid(), intent.source_uid())?;
        let now = K::intent(self, &content, class.as_ref()).map_err(Rejected::Unverifiable)?;
        journal::check_parts(intent.agreement(&now)).map(|()| Intended::Open)
    }

    /// Drops an entry of the journal that is not what this snapshotter records.
    fn reject_intent(&self, key: &str, rejected: &Rejected) {
        self.journal
            .drop_entry(key, rejected.reason(), &rejected.to_string());
    }

    /// Records `intent` for content `name` of kind `K` before its create call is made.
    pub(super) async fn record<K: ContentKind>(
        &self,
        name: &str,
        intent: &K::Intent,
    ) -> Result<(), String> {
        if lock(&K::lane(self).intents).get(name) == Some(intent) {
            return Ok(());
        }
        self.write_intent(&K::journal_key(name), intent).await?;
        lock(&K::lane(self).intents).insert(name.to_string(), intent.clone());
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

    /// The create call of content `name` is answered: its intent is done.
    pub(super) fn forget<K: ContentKind>(&self, name: &str) {
        if lock(&K::lane(self).intents).remove(name).is_some() {
            self.journal.forget(&K::journal_key(name));
        }
    }

    /// A content that is gone (or was replaced by another of the same name): if a create call
    /// for it may have cut something, that is found (the call is idempotent by name) and
    /// deleted unless the content's policy kept it.
    pub(super) async fn settle_gone<K: ContentKind>(&self, name: &str) -> Result<(), Failure> {
        let retained = self.kept_when_gone::<K>(name);
        let Some(intent) = lock(&K::lane(self).intents).get(name).cloned() else {
            K::done(self, name);
            return Ok(());
        };
        if self.index().holds::<K::Content>(name, intent.content_uid()) {
            return Ok(());
        }
        // The policy the content had when it went outranks the one recorded with the intent
        // (backup tools patch contents to Retain before they delete them).
        if !intent.delete() || retained {
            tracing::warn!(
                kind = kind_of::<K>(),
                name,
                cut = intent.name(),
                "the content of an unanswered {} is gone and its policy retains the {}: the driver may keep a {} no content names",
                K::CREATE,
                K::CUT,
                K::CUT
            );
            self.forget::<K>(name);
            return Ok(());
        }
        let secrets = self.secret(intent.secret()).await.map_err(Failure::quiet)?;
        match K::find_cut(self, &intent, secrets).await {
            Ok(Some(cut)) => self.discard::<K>(name, &intent, &cut).await,
            Ok(None) => {
                self.forget::<K>(name);
                Ok(())
            }
            Err(status) if decide::is_final(Some(status.code())) => {
                // The driver refuses the request for sure: it has nothing of that name.
                tracing::info!(kind = kind_of::<K>(), name, error = %go_error(&status), "the {} of a gone content does not exist", K::CUT);
                self.forget::<K>(name);
                Ok(())
            }
            Err(status) => Err(Failure::quiet(format!(
                "cannot find the {} of gone content {name}: {}",
                K::CUT,
                go_error(&status)
            ))),
        }
    }

    /// Whether content `name` kept what it names when it went: its last version seen had
    /// deletion policy Retain (its deletion seen, or not yet).
    fn kept_when_gone<K: ContentKind>(&self, name: &str) -> bool {
        let mut index = self.index();
        let gone_retained = index.take_retained_gone::<K::Content>(name);
        gone_retained || index.retains::<K::Content>(name)
    }

    /// Deletes what the create call cut for a content that is gone, then forgets the intent.
    pub(super) async fn discard<K: ContentKind>(
        &self,
        name: &str,
        intent: &K::Intent,
        cut: &K::Cut,
    ) -> Result<(), Failure> {
        let named = self.index().naming_handle::<K::Content>(K::handle(cut));
        if self.kept_when_gone::<K>(name) {
            tracing::info!(
                kind = kind_of::<K>(),
                name,
                handle = K::handle(cut),
                "the content went with deletion policy Retain: its {} is kept",
                K::CUT
            );
        } else if let Some(owner) = named {
            // Some content names it (an administrator took it in, or an intent was
            // replayed): never deleted here.
            tracing::warn!(
                kind = kind_of::<K>(),
                name,
                handle = K::handle(cut),
                content = %owner,
                "not deleting the {} of a gone content: another content names it",
                K::CUT
            );
        } else if intent.delete() {
            let secrets = self.secret(intent.secret()).await.map_err(Failure::quiet)?;
            K::delete_cut(self, cut, secrets).await.map_err(|status| {
                Failure::quiet(format!(
                    "cannot delete {} {} of gone content {name}: {}",
                    K::CUT,
                    K::handle(cut),
                    go_error(&status)
                ))
            })?;
            tracing::info!(
                kind = kind_of::<K>(),
                name,
                handle = K::handle(cut),
                "deleted the {} of a content that went away during its {}",
                K::CUT,
                K::CREATE
            );
        }
        self.forget::<K>(name);
        K::done(self, name);
        Ok(())
    }
}
