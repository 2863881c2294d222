//! The cache, fed by watch events: this driver's VolumeSnapshotContents and
//! VolumeGroupSnapshotContents, and the classes of both. Each event returns the contents to
//! work on. No I/O.

use std::collections::HashSet;
use std::sync::Arc;

use sidecar_kit::pipeline::viewtable::ViewTable;
use sidecar_kit::pipeline::{Change, Relist};
use sidecar_kit::values::version::ResourceVersion;

use crate::decide;
use crate::model::{
    Class, Content, ContentObject, GroupContent, VolumeGroupSnapshotClass,
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
    /// `None` for a class: each event of one replaces the cached one.
    fn resource_version(&self) -> Option<&ResourceVersion>;
    /// Whether it keeps what it names once deleted (a content of deletion policy Retain).
    fn retains(&self) -> bool {
        false
    }
}

impl<T: ContentObject> Cached for T {
    fn name(&self) -> &str {
        ContentObject::name(self)
    }
    fn driver(&self) -> Option<&str> {
        Some(ContentObject::driver(self))
    }
    fn resource_version(&self) -> Option<&ResourceVersion> {
        Some(ContentObject::resource_version(self))
    }
    fn retains(&self) -> bool {
        !self.deletes()
    }
}

impl Cached for Class {
    fn name(&self) -> &str {
        &self.name
    }
    fn driver(&self) -> Option<&str> {
        None
    }
    fn resource_version(&self) -> Option<&ResourceVersion> {
        None
    }
}

/// The cached objects of one kind, by name, and the re-list that finds those deleted while
/// the watch was down.
#[derive(Debug)]
struct Table<T> {
    items: ViewTable<T, str>,
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
            relist: Relist::default(),
            retained_gone: HashSet::new(),
        }
    }
}

impl<T: Cached> Table<T> {
    /// Applies a watch event and returns the names to work on: an object of `driver` that is
    /// new, or newer than the cached one where `act` says the change is work; one deleted or
    /// found gone by a re-list; a content that moved to another driver. Contents of other
    /// drivers are kept out: only their names matter.
    fn apply<O: kube::Resource>(
        &mut self,
        driver: &str,
        change: Change<&O>,
        project: impl Fn(&O) -> T,
        act: impl Fn(&T, &T) -> bool,
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
                let work = match self.items.get(&name) {
                    None => true,
                    // The echo of the snapshotter's own write, or an older version than that
                    // write: nothing new.
                    Some(old) if !newer(&**old, &new) => return Vec::new(),
                    Some(old) => act(old, &new),
                };
                self.items.insert(Arc::new(new));
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
                let gone = self.relist.finish(self.items.keys());
                for name in &gone {
                    self.forget(name);
                }
                gone
            }
        }
    }

    /// Removes `name`; its name when it was cached.
    fn forget(&mut self, name: &str) -> Option<String> {
        let removed = self.items.remove(name).map(|_| name.to_string());
        if removed.is_some() {
            self.items.shrink_when_sparse();
        }
        removed
    }

    /// Stores an object the snapshotter wrote, unless the cache already has a newer version.
    fn store(&mut self, new: T) {
        let keep = self
            .items
            .get(new.name())
            .is_none_or(|old| !newer(&new, old));
        if keep {
            self.items.insert(Arc::new(new));
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
        self.snapshots.contents.items.len()
    }

    /// The content and its class, if the content is this driver's.
    pub fn view<T: Shelved>(&self, name: &str) -> Option<(T, Option<Class>)> {
        let shelf = T::shelf(self);
        let content = shelf.contents.items.get(name)?;
        let class = shelf.classes.class_of(content.class());
        decide::driver_match(&**content, class.as_ref(), &self.driver)
            .then(|| (T::clone(content), class))
    }

    /// The content, if it is this driver's.
    pub fn current<T: Shelved>(&self, name: &str) -> Option<T> {
        self.view(name).map(|(content, _)| content)
    }

    /// Whether a content of this name is cached (of any driver).
    pub fn has_content(&self, name: &str) -> bool {
        self.snapshots.contents.items.contains_key(name)
    }

    pub fn class(&self, name: &str) -> Option<Class> {
        self.class_for::<Content>(name)
    }

    /// The class of contents of kind `T` named `name`.
    pub fn class_for<T: Shelved>(&self, name: &str) -> Option<Class> {
        T::shelf(self).classes.class_of(Some(name))
    }

    /// The names of the contents of this driver, for the periodic resync.
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
        T::shelf(self)
            .contents
            .items
            .values()
            .find(|c| c.uid() == content_uid || c.source_uid() == source_uid)
            .map(|c| c.name().to_string())
    }

    /// Whether content `name` of kind `T` kept what it names when it went (its deletion policy
    /// was Retain), asked once: the answer is forgotten.
    pub fn take_retained_gone<T: Shelved>(&mut self, name: &str) -> bool {
        T::shelf_mut(self).contents.retained_gone.remove(name)
    }

    /// A content of kind `T` (of any driver) that names the driver's snapshot (group)
    /// `handle`, if one exists.
    pub fn naming_handle<T: Shelved>(&self, handle: &str) -> Option<String> {
        T::shelf(self)
            .contents
            .items
            .values()
            .find(|c| c.names_handle(handle))
            .map(|c| c.name().to_string())
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
        )
    }

    pub fn class_event(&mut self, change: Change<&VolumeSnapshotClass>) -> Vec<String> {
        self.snapshots
            .classes
            .apply(&self.driver, change, Class::from_api, |_, _| false);
        Vec::new()
    }

    /// A group content event; every newer version is work, as upstream enqueues every update
    /// of a group content (the snapshotter's own writes are stored first and so are not).
    pub fn group_content_event(
        &mut self,
        change: Change<&VolumeGroupSnapshotContent>,
    ) -> Vec<String> {
        self.groups
            .contents
            .apply(&self.driver, change, GroupContent::from_api, |_, _| true)
    }

    pub fn group_class_event(&mut self, change: Change<&VolumeGroupSnapshotClass>) {
        self.groups
            .classes
            .apply(&self.driver, change, Class::from_group_api, |_, _| false);
    }
}

/// Whether `new` is a newer version than `old` (always, for objects without versions).
fn newer<T: Cached>(old: &T, new: &T) -> bool {
    match (old.resource_version(), new.resource_version()) {
        (Some(old), Some(new)) => version(new) > version(old),
        _ => true,
    }
}

/// A resourceVersion as a number, as upstream compares them (0 when not a number).
fn version(written: &ResourceVersion) -> u64 {
    match written {
        ResourceVersion::Revision(number) => *number,
        other => other.to_string().parse().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
