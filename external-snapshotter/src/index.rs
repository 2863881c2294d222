//! The cache, fed by watch events: this driver's VolumeSnapshotContents and
//! VolumeGroupSnapshotContents, and the classes of both. Each event returns the contents to
//! work on. No I/O.

use std::collections::HashSet;
use std::sync::Arc;

use sidecar_kit::pipeline::viewtable::ViewTable;
use sidecar_kit::pipeline::{Change, Relist};

use crate::decide;
use crate::model::{
    self, Class, Content, ContentObject, GroupContent, Settled, VolumeGroupSnapshotClass,
    VolumeGroupSnapshotContent, VolumeSnapshotClass, VolumeSnapshotContent,
};

#[derive(Debug)]
pub struct Index {
    driver: String,
    snapshots: Shelf<Content>,
    /// Watched only with the `CSIVolumeGroupSnapshot` gate on.
    groups: Shelf<GroupContent>,
}

/// The cached contents of one kind and the classes of that kind.
#[derive(Debug)]
pub struct Shelf<T> {
    contents: Table<T>,
    classes: Table<Class>,
}

impl<T: Cached> Default for Shelf<T> {
    fn default() -> Self {
        Self {
            contents: Table::default(),
            classes: Table::default(),
        }
    }
}

/// A kind of content the index keeps, and where.
pub trait Shelved: ContentObject + Clone {
    fn shelf(index: &Index) -> &Shelf<Self>;
    fn shelf_mut(index: &mut Index) -> &mut Shelf<Self>;
}

impl Shelved for Content {
    fn shelf(index: &Index) -> &Shelf<Self> {
        &index.snapshots
    }
    fn shelf_mut(index: &mut Index) -> &mut Shelf<Self> {
        &mut index.snapshots
    }
}

impl Shelved for GroupContent {
    fn shelf(index: &Index) -> &Shelf<Self> {
        &index.groups
    }
    fn shelf_mut(index: &mut Index) -> &mut Shelf<Self> {
        &mut index.groups
    }
}

/// What the cache reads of a cached object.
trait Cached {
    fn name(&self) -> &str;
    /// The driver of a content; `None` for a class, which is kept whatever its driver.
    fn driver(&self) -> Option<&str>;
    /// Its resourceVersion as a number; `None` for a class: each event of one replaces the
    /// cached one.
    fn revision(&self) -> Option<u64>;
    /// Whether it keeps what it names once deleted (a content of deletion policy Retain).
    fn retains(&self) -> bool {
        false
    }
    /// Its settled form, when it needs nothing more until it changes.
    fn settle(&self) -> Option<Settled> {
        None
    }
}

impl<T: ContentObject> Cached for T {
    fn name(&self) -> &str {
        ContentObject::name(self)
    }
    fn driver(&self) -> Option<&str> {
        Some(ContentObject::driver(self))
    }
    fn revision(&self) -> Option<u64> {
        Some(model::revision_number(ContentObject::resource_version(
            self,
        )))
    }
    fn retains(&self) -> bool {
        !self.deletes()
    }
    fn settle(&self) -> Option<Settled> {
        ContentObject::settle(self)
    }
}

impl Cached for Class {
    fn name(&self) -> &str {
        &self.name
    }
    fn driver(&self) -> Option<&str> {
        None
    }
    fn revision(&self) -> Option<u64> {
        None
    }
}

/// The cached objects of one kind, by name, each in one of two forms, and the re-list that
/// finds those deleted while the watch was down.
#[derive(Debug)]
struct Table<T> {
    /// Those with work to do, or that may have soon: as projected.
    items: ViewTable<T, str>,
    /// Those that need nothing until they change, in their small form.
    settled: ViewTable<Settled, str>,
    relist: Relist,
    /// Contents whose last version kept what they name (deletion policy Retain) when they
    /// went, until the worker that settles them has looked: a policy patched to Retain after
    /// a create was recorded outranks the recorded one.
    retained_gone: HashSet<String>,
}

impl<T: Cached> Default for Table<T> {
    fn default() -> Self {
        Self {
            items: ViewTable::new(|item: &T| item.name()),
            settled: ViewTable::new(|settled: &Settled| &settled.name),
            relist: Relist::default(),
            retained_gone: HashSet::new(),
        }
    }
}

impl<T: Cached> Table<T> {
    /// Applies a watch event and returns the names to work on: an object of `driver` that is
    /// new, or newer than the cached one where `act` (`act_settled`, from a settled one) says
    /// the change is work, and not settled; one deleted or found gone by a re-list; a content
    /// that moved to another driver. Contents of other drivers are kept out: only their names
    /// matter.
    fn apply<O: kube::Resource>(
        &mut self,
        driver: &str,
        change: Change<&O>,
        project: impl Fn(&O) -> T,
        act: impl Fn(&T, &T) -> bool,
        act_settled: impl Fn(&Settled, &T) -> bool,
    ) -> Vec<String> {
        match change {
            Change::Apply(object) | Change::Listed(object) => {
                let new = project(object);
                if matches!(change, Change::Listed(_)) {
                    self.relist.saw(new.name());
                }
                if new.driver().is_some_and(|d| d != driver) {
                    return self.forget(new.name()).into_iter().collect();
                }
                let name = new.name().to_string();
                // The echo of the snapshotter's own write, or an older version than that
                // write: nothing new.
                let cached = self.cached_revision(&name);
                if cached.is_some_and(|old| !newer(old, new.revision())) {
                    return Vec::new();
                }
                let work = match (self.items.get(&name), self.settled.get(&name)) {
                    (Some(old), _) => act(old, &new),
                    (_, Some(old)) => act_settled(old, &new),
                    (None, None) => true,
                };
                // A settled content needs nothing, whatever changed.
                let work = self.keep(new) && work;
                if work { vec![name] } else { Vec::new() }
            }
            Change::Delete(object) => {
                let name = object.meta().name.clone().unwrap_or_default();
                let last = project(object);
                if last.retains() && last.driver().is_none_or(|d| d == driver) {
                    self.retained_gone.insert(name.clone());
                }
                self.forget(&name);
                // The worker looks at a content that is gone too: an unanswered create call
                // may have left a snapshot no content will name.
                vec![name]
            }
            Change::Relist => {
                self.relist.start();
                Vec::new()
            }
            Change::Relisted => {
                let known = self.items.keys().chain(self.settled.keys());
                let gone = self.relist.finish(known);
                for name in &gone {
                    self.forget(name);
                }
                gone
            }
        }
    }

    /// Caches `new` in the form it needs: whether it has work (is not settled).
    fn keep(&mut self, new: T) -> bool {
        match new.settle() {
            Some(settled) => {
                if self.items.remove(new.name()).is_some() {
                    self.items.shrink_when_sparse();
                }
                self.settled.insert(Arc::new(settled));
                false
            }
            None => {
                if self.settled.remove(new.name()).is_some() {
                    self.settled.shrink_when_sparse();
                }
                self.items.insert(Arc::new(new));
                true
            }
        }
    }

    /// Removes `name`; its name when it was cached.
    fn forget(&mut self, name: &str) -> Option<String> {
        let full = self.items.remove(name).is_some();
        let settled = self.settled.remove(name).is_some();
        self.items.shrink_when_sparse();
        self.settled.shrink_when_sparse();
        (full || settled).then(|| name.to_string())
    }

    /// The cached version of `name`, in either form.
    fn cached_revision(&self, name: &str) -> Option<Option<u64>> {
        match self.items.get(name) {
            Some(item) => Some(item.revision()),
            None => self.settled.get(name).map(|settled| Some(settled.revision)),
        }
    }

    /// Stores an object the snapshotter wrote, unless the cache already has a newer version.
    fn store(&mut self, new: T) {
        let keep = self
            .cached_revision(new.name())
            .is_none_or(|old| !newer(new.revision(), old));
        if keep {
            self.keep(new);
        }
    }

    /// The object named `name`, if cached.
    fn class_of(&self, name: Option<&str>) -> Option<T>
    where
        T: Clone,
    {
        name.and_then(|c| self.items.get(c)).map(|c| T::clone(c))
    }
}

impl Index {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            snapshots: Shelf::default(),
            groups: Shelf::default(),
        }
    }

    pub fn content_count(&self) -> usize {
        let contents = &self.snapshots.contents;
        contents.items.len() + contents.settled.len()
    }

    /// The content and its class, if the content is this driver's and not settled (a settled
    /// one needs nothing).
    pub fn view<T: Shelved>(&self, name: &str) -> Option<(T, Option<Class>)> {
        let shelf = T::shelf(self);
        let content = shelf.contents.items.get(name)?;
        let class = shelf.classes.class_of(content.class());
        decide::driver_match(&**content, class.as_ref(), &self.driver)
            .then(|| (T::clone(content), class))
    }

    /// The content, if it is this driver's and not settled.
    pub fn current<T: Shelved>(&self, name: &str) -> Option<T> {
        self.view(name).map(|(content, _)| content)
    }

    /// Whether content `name` is cached in its settled form: it needs nothing.
    pub fn is_settled<T: Shelved>(&self, name: &str) -> bool {
        T::shelf(self).contents.settled.contains_key(name)
    }

    /// Whether content `name` is cached with UID `uid` (when not settled, only if it is this
    /// driver's).
    pub fn holds<T: Shelved>(&self, name: &str, uid: &str) -> bool {
        match T::shelf(self).contents.settled.get(name) {
            Some(settled) => settled.has_uid(uid),
            None => self.current::<T>(name).is_some_and(|c| c.uid() == uid),
        }
    }

    /// Whether content `name`, as cached, keeps what it names once deleted (when not settled,
    /// only if it is this driver's).
    pub fn retains<T: Shelved>(&self, name: &str) -> bool {
        match T::shelf(self).contents.settled.get(name) {
            Some(settled) => settled.retains,
            None => self.current::<T>(name).is_some_and(|c| !c.deletes()),
        }
    }

    /// Whether a content of this name is cached (of any driver).
    pub fn has_content(&self, name: &str) -> bool {
        let contents = &self.snapshots.contents;
        contents.items.contains_key(name) || contents.settled.contains_key(name)
    }

    pub fn class(&self, name: &str) -> Option<Class> {
        self.class_for::<Content>(name)
    }

    /// The class of contents of kind `T` named `name`.
    pub fn class_for<T: Shelved>(&self, name: &str) -> Option<Class> {
        T::shelf(self).classes.class_of(Some(name))
    }

    /// The names of the contents of this driver, for the periodic resync: not the settled
    /// ones, as nothing but a change gives those work.
    pub fn names<T: Shelved>(&self) -> Vec<String> {
        T::shelf(self)
            .contents
            .items
            .keys()
            .map(str::to_string)
            .collect()
    }

    /// The content (of any driver) with UID `content_uid` or bound to the VolumeSnapshot
    /// (VolumeGroupSnapshot) with UID `source_uid`, if one exists: what the name derived from
    /// that UID cut is its.
    pub fn bound_to<T: Shelved>(&self, source_uid: &str, content_uid: &str) -> Option<String> {
        let contents = &T::shelf(self).contents;
        let full = contents
            .items
            .values()
            .find(|c| c.uid() == content_uid || c.source_uid() == source_uid)
            .map(|c| c.name());
        let settled = || {
            contents
                .settled
                .values()
                .find(|c| c.has_uid(content_uid) || c.has_source_uid(source_uid))
                .map(|c| &*c.name)
        };
        full.or_else(settled).map(str::to_string)
    }

    /// Whether content `name` of kind `T` kept what it names when it went (its deletion policy
    /// was Retain), asked once: the answer is forgotten.
    pub fn take_retained_gone<T: Shelved>(&mut self, name: &str) -> bool {
        T::shelf_mut(self).contents.retained_gone.remove(name)
    }

    /// A content of kind `T` (of any driver) that names the driver's snapshot (group)
    /// `handle`, if one exists.
    pub fn naming_handle<T: Shelved>(&self, handle: &str) -> Option<String> {
        let contents = &T::shelf(self).contents;
        let full = contents
            .items
            .values()
            .find(|c| c.names_handle(handle))
            .map(|c| c.name());
        let settled = || {
            contents
                .settled
                .values()
                .find(|c| c.names_handle(handle))
                .map(|c| &*c.name)
        };
        full.or_else(settled).map(str::to_string)
    }

    /// Stores a content the snapshotter wrote, unless the cache already has a newer version.
    pub fn store<T: Shelved>(&mut self, content: T) {
        T::shelf_mut(self).contents.store(content);
    }

    /// A content event; a newer version is work when [`decide::should_enqueue`] says so.
    pub fn content_event(&mut self, change: Change<&VolumeSnapshotContent>) -> Vec<String> {
        self.snapshots.contents.apply(
            &self.driver,
            change,
            Content::from_api,
            decide::should_enqueue,
            decide::should_enqueue_settled,
        )
    }

    pub fn class_event(&mut self, change: Change<&VolumeSnapshotClass>) -> Vec<String> {
        self.snapshots.classes.apply(
            &self.driver,
            change,
            Class::from_api,
            |_, _| false,
            |_, _| false,
        );
        Vec::new()
    }

    /// A group content event; every newer version is work, as upstream enqueues every update
    /// of a group content (the snapshotter's own writes are stored first and so are not).
    pub fn group_content_event(
        &mut self,
        change: Change<&VolumeGroupSnapshotContent>,
    ) -> Vec<String> {
        self.groups.contents.apply(
            &self.driver,
            change,
            GroupContent::from_api,
            |_, _| true,
            |_, _| true,
        )
    }

    pub fn group_class_event(&mut self, change: Change<&VolumeGroupSnapshotClass>) {
        self.groups.classes.apply(
            &self.driver,
            change,
            Class::from_group_api,
            |_, _| false,
            |_, _| false,
        );
    }
}

/// Whether `new` is a newer version than `old` (always, for objects without versions).
fn newer(old: Option<u64>, new: Option<u64>) -> bool {
    match (old, new) {
        (Some(old), Some(new)) => new > old,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn content(
        name: &str,
        driver: &str,
        rv: &str,
        status: serde_json::Value,
    ) -> VolumeSnapshotContent {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("{name}-uid"), "resourceVersion": rv},
            "spec": {"driver": driver, "deletionPolicy": "Delete", "source": {"volumeHandle": "v"},
                "volumeSnapshotRef": {"name": "s", "namespace": "ns", "uid": "vs"}},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn events_queue_what_needs_work() {
        let mut index = Index::new("d");
        let first = content("a", "d", "1", serde_json::Value::Null);
        assert_eq!(index.content_event(Change::Apply(&first)), vec!["a"]);
        let status_only = content(
            "a",
            "d",
            "2",
            json!({"snapshotHandle": "h", "readyToUse": false}),
        );
        assert!(index.content_event(Change::Apply(&status_only)).is_empty());
        let older = content("a", "d", "1", serde_json::Value::Null);
        assert!(index.content_event(Change::Apply(&older)).is_empty());
        assert!(index.view::<Content>("a").is_some());
        let other = content("b", "other", "3", serde_json::Value::Null);
        assert!(index.content_event(Change::Apply(&other)).is_empty());
        assert!(index.view::<Content>("b").is_none() && !index.has_content("b"));
        assert_eq!(index.content_event(Change::Delete(&status_only)), vec!["a"]);
        assert!(index.view::<Content>("a").is_none());
    }

    #[test]
    fn a_ready_content_is_kept_settled_and_still_answers() {
        let mut index = Index::new("d");
        let ready = json!({"snapshotHandle": "h", "readyToUse": true});
        let first = content("a", "d", "1", ready.clone());
        assert!(
            index.content_event(Change::Listed(&first)).is_empty(),
            "a ready content needs nothing"
        );
        assert!(index.is_settled::<Content>("a") && index.view::<Content>("a").is_none());
        assert!(index.has_content("a") && index.content_count() == 1);
        assert!(index.names::<Content>().is_empty(), "nor a resync");
        assert!(index.holds::<Content>("a", "a-uid") && !index.holds::<Content>("a", "b-uid"));
        assert!(!index.retains::<Content>("a"));
        assert_eq!(index.bound_to::<Content>("vs", "x").as_deref(), Some("a"));
        assert_eq!(
            index.bound_to::<Content>("x", "a-uid").as_deref(),
            Some("a")
        );
        assert_eq!(index.bound_to::<Content>("x", "y"), None);
        assert_eq!(index.naming_handle::<Content>("h").as_deref(), Some("a"));
        assert_eq!(index.naming_handle::<Content>("g"), None);
        // Its echo, and a change of its finalizers only: still nothing to do.
        assert!(index.content_event(Change::Apply(&first)).is_empty());
        let mut unprotected = content("a", "d", "2", ready.clone());
        unprotected.metadata.finalizers = Some(vec![]);
        assert!(index.content_event(Change::Apply(&unprotected)).is_empty());
        // Readiness lost: work, on the full content.
        let lost = content(
            "a",
            "d",
            "3",
            json!({"snapshotHandle": "h", "readyToUse": false}),
        );
        assert_eq!(index.content_event(Change::Apply(&lost)), vec!["a"]);
        assert!(index.view::<Content>("a").is_some() && !index.is_settled::<Content>("a"));
        // Ready again, by the snapshotter's own write: settled once more.
        index.store(Content::from_api(&content("a", "d", "4", ready.clone())));
        assert!(index.is_settled::<Content>("a") && index.view::<Content>("a").is_none());
        // An older version than the one kept changes nothing.
        assert!(index.content_event(Change::Apply(&lost)).is_empty());
        assert!(index.is_settled::<Content>("a"));
        // A deletion asked for: work, on the full content.
        let mut deleting = content("a", "d", "5", ready.clone());
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(index.content_event(Change::Apply(&deleting)), vec!["a"]);
        assert!(index.view::<Content>("a").is_some());
    }

    #[test]
    fn a_settled_content_that_goes_is_work() {
        let mut index = Index::new("d");
        let ready = json!({"snapshotHandle": "h", "readyToUse": true});
        let mut retained = content("a", "d", "1", ready.clone());
        retained.spec.deletion_policy = "Retain".into();
        index.content_event(Change::Apply(&retained));
        assert!(index.retains::<Content>("a"));
        assert_eq!(index.content_event(Change::Delete(&retained)), vec!["a"]);
        assert!(!index.has_content("a") && index.take_retained_gone::<Content>("a"));
        index.content_event(Change::Apply(&content("b", "d", "1", ready.clone())));
        index.content_event(Change::Relist);
        assert_eq!(index.content_event(Change::Relisted), vec!["b"]);
        assert!(!index.has_content("b") && index.naming_handle::<Content>("h").is_none());
        // Moved to another driver: named once more, then no longer kept.
        index.content_event(Change::Apply(&content("c", "d", "1", ready.clone())));
        let moved = content("c", "other", "2", ready);
        assert_eq!(index.content_event(Change::Apply(&moved)), vec!["c"]);
        assert!(!index.has_content("c"));
    }

    #[test]
    fn a_relist_finds_what_went_away() {
        let mut index = Index::new("d");
        index.content_event(Change::Apply(&content(
            "a",
            "d",
            "1",
            serde_json::Value::Null,
        )));
        index.content_event(Change::Apply(&content(
            "b",
            "d",
            "1",
            serde_json::Value::Null,
        )));
        index.content_event(Change::Relist);
        index.content_event(Change::Listed(&content(
            "a",
            "d",
            "1",
            serde_json::Value::Null,
        )));
        assert_eq!(index.content_event(Change::Relisted), vec!["b"]);
        assert_eq!(index.names::<Content>(), vec!["a"]);
    }

    #[test]
    fn a_class_of_another_driver_hides_the_content() {
        let mut index = Index::new("d");
        let mut object = content("a", "d", "1", serde_json::Value::Null);
        object.spec.volume_snapshot_class_name = Some("c".into());
        index.content_event(Change::Apply(&object));
        assert!(
            index.view::<Content>("a").is_some(),
            "an unknown class does not"
        );
        let class: VolumeSnapshotClass =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "driver": "other"})).unwrap();
        index.class_event(Change::Apply(&class));
        assert!(index.view::<Content>("a").is_none());
        // A class has no version the cache compares: each event replaces it.
        let mine: VolumeSnapshotClass =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "driver": "d"})).unwrap();
        index.class_event(Change::Apply(&mine));
        assert!(index.view::<Content>("a").is_some());
    }

    #[test]
    fn every_newer_group_content_is_work() {
        let mut index = Index::new("d");
        let group = |rv: &str, driver: &str| -> VolumeGroupSnapshotContent {
            serde_json::from_value(json!({
                "metadata": {"name": "g", "uid": "g-uid", "resourceVersion": rv},
                "spec": {"driver": driver, "deletionPolicy": "Delete",
                    "source": {"volumeHandles": ["v"]},
                    "volumeGroupSnapshotRef": {"name": "s", "namespace": "ns", "uid": "vgs"}},
            }))
            .unwrap()
        };
        assert_eq!(
            index.group_content_event(Change::Apply(&group("1", "d"))),
            vec!["g"]
        );
        assert!(
            index
                .group_content_event(Change::Apply(&group("1", "d")))
                .is_empty()
        );
        assert_eq!(
            index.group_content_event(Change::Apply(&group("2", "d"))),
            vec!["g"]
        );
        assert!(index.view::<GroupContent>("g").is_some());
        // Moved to another driver: named once more, then no longer kept.
        assert_eq!(
            index.group_content_event(Change::Apply(&group("3", "x"))),
            vec!["g"]
        );
        assert!(
            index.view::<GroupContent>("g").is_none() && index.names::<GroupContent>().is_empty()
        );
    }
}
