//! The cache, fed by watch events: this driver's VolumeSnapshotContents and the
//! VolumeSnapshotClasses. Each event returns the contents to work on. No I/O.

use std::collections::HashMap;

use sidecar_kit::pipeline::{Change, Relist};
use sidecar_kit::values::shrink::ShrinkWhenSparse;

use crate::decide;
use crate::model::{
    Class, Content, GroupClass, GroupContent, VolumeGroupSnapshotClass, VolumeGroupSnapshotContent,
    VolumeSnapshotClass, VolumeSnapshotContent,
};

#[derive(Debug)]
pub struct Index {
    driver: String,
    contents: HashMap<String, Content>,
    classes: HashMap<String, Class>,
    content_relist: Relist,
    class_relist: Relist,
    groups: GroupIndex,
}

/// The group contents of this driver and the group classes (watched only with the
/// `CSIVolumeGroupSnapshot` gate on).
#[derive(Debug, Default)]
struct GroupIndex {
    contents: HashMap<String, GroupContent>,
    classes: HashMap<String, GroupClass>,
    content_relist: Relist,
    class_relist: Relist,
}

impl Index {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            contents: HashMap::new(),
            classes: HashMap::new(),
            content_relist: Relist::default(),
            class_relist: Relist::default(),
            groups: GroupIndex::default(),
        }
    }

    pub fn content_count(&self) -> usize {
        self.contents.len()
    }

    /// The content and its class, if the content is this driver's.
    pub fn view(&self, name: &str) -> Option<(Content, Option<Class>)> {
        let content = self.contents.get(name)?;
        let class = content
            .class
            .as_ref()
            .and_then(|c| self.classes.get(c))
            .cloned();
        decide::driver_match(content, class.as_ref(), &self.driver)
            .then(|| (content.clone(), class))
    }

    /// Whether a content of this name is cached (of any driver).
    pub fn has_content(&self, name: &str) -> bool {
        self.contents.contains_key(name)
    }

    pub fn class(&self, name: &str) -> Option<Class> {
        self.classes.get(name).cloned()
    }

    /// The names of the contents of this driver, for the periodic resync.
    pub fn content_names(&self) -> Vec<String> {
        self.contents
            .values()
            .filter(|c| c.driver == self.driver)
            .map(|c| c.name.clone())
            .collect()
    }

    /// The content (of any driver) with UID `content_uid` or bound to the VolumeSnapshot with
    /// UID `snapshot_uid`, if one exists: the snapshot derived from that UID is its.
    pub fn content_bound_to(&self, snapshot_uid: &str, content_uid: &str) -> Option<String> {
        self.contents
            .values()
            .find(|c| c.uid == content_uid || c.snapshot_ref.uid == snapshot_uid)
            .map(|c| c.name.clone())
    }

    /// Stores a content the snapshotter wrote, unless the cache already has a newer version.
    pub fn store(&mut self, object: &VolumeSnapshotContent) {
        let content = Content::from_api(object);
        let newer = self
            .contents
            .get(&content.name)
            .is_none_or(|old| version(&old.resource_version) <= version(&content.resource_version));
        if newer {
            self.contents.insert(content.name.clone(), content);
        }
    }

    pub fn content_event(&mut self, change: Change<&VolumeSnapshotContent>) -> Vec<String> {
        match change {
            Change::Apply(object) | Change::Listed(object) => {
                let content = Content::from_api(object);
                if matches!(change, Change::Listed(_)) {
                    self.content_relist.saw(content.name.as_str());
                }
                // Contents of other drivers are kept out of the cache: only their names matter.
                if content.driver != self.driver {
                    return self
                        .contents
                        .remove(&content.name)
                        .map(|c| c.name)
                        .into_iter()
                        .collect();
                }
                let name = content.name.clone();
                let act = match self.contents.get(&name) {
                    None => true,
                    Some(old) => {
                        if version(&old.resource_version) >= version(&content.resource_version) {
                            // The echo of the snapshotter's own write, or an older version
                            // than that write: nothing new.
                            return Vec::new();
                        }
                        decide::should_enqueue(old, &content)
                    }
                };
                self.contents.insert(name.clone(), content);
                if act { vec![name] } else { Vec::new() }
            }
            Change::Delete(object) => {
                let name = object.metadata.name.clone().unwrap_or_default();
                self.forget(&name)
            }
            Change::Relist => {
                self.content_relist.start();
                Vec::new()
            }
            Change::Relisted => {
                let gone = self.content_relist.finish(self.contents.keys());
                gone.iter().flat_map(|name| self.forget(name)).collect()
            }
        }
    }

    fn forget(&mut self, name: &str) -> Vec<String> {
        let removed = self.contents.remove(name).is_some();
        if removed {
            self.contents.shrink_when_sparse();
        }
        // The worker looks at a content that is gone too: an unanswered CreateSnapshot of it
        // may have left a snapshot no content will name.
        vec![name.to_string()]
    }

    pub fn class_event(&mut self, change: Change<&VolumeSnapshotClass>) -> Vec<String> {
        match change {
            Change::Apply(object) | Change::Listed(object) => {
                let class = Class::from_api(object);
                if matches!(change, Change::Listed(_)) {
                    self.class_relist.saw(class.name.as_str());
                }
                self.classes.insert(class.name.clone(), class);
            }
            Change::Delete(object) => {
                self.classes
                    .remove(object.metadata.name.as_deref().unwrap_or_default());
            }
            Change::Relist => self.class_relist.start(),
            Change::Relisted => {
                for name in self.class_relist.finish(self.classes.keys()) {
                    self.classes.remove(&name);
                }
            }
        }
        Vec::new()
    }
}

impl Index {
    /// The group content and its class, if the content is this driver's.
    pub fn group_view(&self, name: &str) -> Option<(GroupContent, Option<GroupClass>)> {
        let content = self.groups.contents.get(name)?;
        let class = content
            .class
            .as_ref()
            .and_then(|c| self.groups.classes.get(c))
            .cloned();
        decide::group_driver_match(content, class.as_ref(), &self.driver)
            .then(|| (content.clone(), class))
    }

    /// The names of the group contents of this driver, for the periodic resync.
    pub fn group_content_names(&self) -> Vec<String> {
        self.groups.contents.keys().cloned().collect()
    }

    /// The group content with UID `content_uid` or bound to the VolumeGroupSnapshot with UID
    /// `group_uid`, if one exists.
    pub fn group_content_bound_to(&self, group_uid: &str, content_uid: &str) -> Option<String> {
        self.groups
            .contents
            .values()
            .find(|c| c.uid == content_uid || c.group_ref.uid == group_uid)
            .map(|c| c.name.clone())
    }

    /// Stores a group content the snapshotter wrote, unless the cache has a newer version.
    pub fn group_store(&mut self, object: &VolumeGroupSnapshotContent) {
        let content = GroupContent::from_api(object);
        let newer =
            self.groups.contents.get(&content.name).is_none_or(|old| {
                version(&old.resource_version) <= version(&content.resource_version)
            });
        if newer {
            self.groups.contents.insert(content.name.clone(), content);
        }
    }

    /// A group content event; every newer version is work, as upstream enqueues every update
    /// of a group content (the snapshotter's own writes are stored first and so are not).
    pub fn group_content_event(
        &mut self,
        change: Change<&VolumeGroupSnapshotContent>,
    ) -> Vec<String> {
        let groups = &mut self.groups;
        match change {
            Change::Apply(object) | Change::Listed(object) => {
                let content = GroupContent::from_api(object);
                if matches!(change, Change::Listed(_)) {
                    groups.content_relist.saw(content.name.as_str());
                }
                if content.driver != self.driver {
                    return groups
                        .contents
                        .remove(&content.name)
                        .map(|c| c.name)
                        .into_iter()
                        .collect();
                }
                let name = content.name.clone();
                if groups.contents.get(&name).is_some_and(|old| {
                    version(&old.resource_version) >= version(&content.resource_version)
                }) {
                    return Vec::new();
                }
                groups.contents.insert(name.clone(), content);
                vec![name]
            }
            Change::Delete(object) => {
                let name = object.metadata.name.clone().unwrap_or_default();
                groups.contents.remove(&name);
                vec![name]
            }
            Change::Relist => {
                groups.content_relist.start();
                Vec::new()
            }
            Change::Relisted => {
                let gone = groups.content_relist.finish(groups.contents.keys());
                for name in &gone {
                    groups.contents.remove(name);
                }
                gone
            }
        }
    }

    pub fn group_class_event(&mut self, change: Change<&VolumeGroupSnapshotClass>) {
        let groups = &mut self.groups;
        match change {
            Change::Apply(object) | Change::Listed(object) => {
                let class = GroupClass::from_api(object);
                if matches!(change, Change::Listed(_)) {
                    groups.class_relist.saw(class.name.as_str());
                }
                groups.classes.insert(class.name.clone(), class);
            }
            Change::Delete(object) => {
                groups
                    .classes
                    .remove(object.metadata.name.as_deref().unwrap_or_default());
            }
            Change::Relist => groups.class_relist.start(),
            Change::Relisted => {
                for name in groups.class_relist.finish(groups.classes.keys()) {
                    groups.classes.remove(&name);
                }
            }
        }
    }
}

/// A resourceVersion as a number, as upstream compares them (0 when not a number).
fn version(text: &str) -> u64 {
    text.parse().unwrap_or(0)
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
        assert!(index.view("a").is_some());
        let other = content("b", "other", "3", serde_json::Value::Null);
        assert!(index.content_event(Change::Apply(&other)).is_empty());
        assert!(index.view("b").is_none() && !index.has_content("b"));
        assert_eq!(index.content_event(Change::Delete(&status_only)), vec!["a"]);
        assert!(index.view("a").is_none());
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
        assert_eq!(index.content_names(), vec!["a"]);
    }

    #[test]
    fn a_class_of_another_driver_hides_the_content() {
        let mut index = Index::new("d");
        let mut object = content("a", "d", "1", serde_json::Value::Null);
        object.spec.volume_snapshot_class_name = Some("c".into());
        index.content_event(Change::Apply(&object));
        assert!(index.view("a").is_some(), "an unknown class does not");
        let class: VolumeSnapshotClass =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "driver": "other"})).unwrap();
        index.class_event(Change::Apply(&class));
        assert!(index.view("a").is_none());
    }
}
