//! What the watches tell the sidecar, kept between requests so that no request reads it from
//! the API server: the VolumeSnapshotClasses of its driver and the audience of its
//! SnapshotMetadataService. No I/O.

use std::collections::BTreeMap;

use sidecar_kit::pipeline::Change;

use crate::model::{
    Class, SnapshotMetadataService, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent,
};

/// Objects of one kind by key, as a watch reports them: a list under way replaces the known
/// ones only when it completes.
#[derive(Debug)]
pub struct Keyed<K, V> {
    known: BTreeMap<K, V>,
    listing: Option<BTreeMap<K, V>>,
}

impl<K, V> Default for Keyed<K, V> {
    fn default() -> Self {
        Self {
            known: BTreeMap::new(),
            listing: None,
        }
    }
}

impl<K: Ord, V> Keyed<K, V> {
    pub fn get(&self, key: &K) -> Option<&V> {
        self.known.get(key)
    }

    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Takes a change of an object `T`: kept as `view` makes it (`None`: not kept).
    pub fn apply<T>(
        &mut self,
        change: Change<&T>,
        key: impl Fn(&T) -> K,
        view: impl Fn(&T) -> Option<V>,
    ) {
        match change {
            Change::Apply(object) => match view(object) {
                Some(kept) => {
                    self.known.insert(key(object), kept);
                }
                None => {
                    self.known.remove(&key(object));
                }
            },
            Change::Delete(object) => {
                self.known.remove(&key(object));
            }
            Change::Relist => self.listing = Some(BTreeMap::new()),
            Change::Listed(object) => {
                if let (Some(listing), Some(kept)) = (self.listing.as_mut(), view(object)) {
                    listing.insert(key(object), kept);
                }
            }
            Change::Relisted => {
                if let Some(listing) = self.listing.take() {
                    self.known = listing;
                }
            }
        }
    }
}

#[derive(Debug, Default)]
pub struct Index {
    driver: String,
    classes: Keyed<String, Class>,
    /// VolumeSnapshots by namespace and name: what a request resolves without reading them.
    snapshots: Keyed<(String, String), VolumeSnapshot>,
    contents: Keyed<String, VolumeSnapshotContent>,
    /// The audience of the driver's SnapshotMetadataService; `None` while there is none.
    audience: Option<String>,
    audience_listing: Option<Option<String>>,
}

impl Index {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            ..Self::default()
        }
    }

    /// The driver's classes by name.
    pub fn classes(&self) -> &BTreeMap<String, Class> {
        &self.classes.known
    }

    /// The VolumeSnapshot `namespace/name`, as last seen.
    pub fn snapshot(&self, namespace: &str, name: &str) -> Option<&VolumeSnapshot> {
        self.snapshots
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// The VolumeSnapshotContent `name`, as last seen.
    pub fn content(&self, name: &str) -> Option<&VolumeSnapshotContent> {
        self.contents.get(&name.to_string())
    }

    /// Keeps what a request reads of a VolumeSnapshot: its class and status.
    pub fn snapshot_event(&mut self, change: Change<&VolumeSnapshot>) {
        self.snapshots.apply(
            change,
            |s| {
                (
                    s.metadata.namespace.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default(),
                )
            },
            |s| {
                Some(VolumeSnapshot {
                    metadata: Default::default(),
                    spec: s.spec.clone(),
                    status: s.status.clone(),
                })
            },
        );
    }

    /// Keeps what a request reads of a VolumeSnapshotContent: its driver and status.
    pub fn content_event(&mut self, change: Change<&VolumeSnapshotContent>) {
        self.contents.apply(
            change,
            |c| c.metadata.name.clone().unwrap_or_default(),
            |c| {
                Some(VolumeSnapshotContent {
                    metadata: Default::default(),
                    spec: c.spec.clone(),
                    status: c.status.clone(),
                })
            },
        );
    }

    /// The audience the driver's SnapshotMetadataService names, if there is one.
    pub fn audience(&self) -> Option<&str> {
        self.audience.as_deref()
    }

    pub fn class_event(&mut self, change: Change<&VolumeSnapshotClass>) {
        let driver = self.driver.clone();
        // A class whose driver changed is no longer one of ours.
        self.classes.apply(
            change,
            |class| class.metadata.name.clone().unwrap_or_default(),
            |class| Class::of_driver(class, &driver),
        );
    }

    /// A change of the SnapshotMetadataService objects named after the driver.
    pub fn service_event(&mut self, change: Change<&SnapshotMetadataService>) {
        let ours = |service: &SnapshotMetadataService| {
            service.metadata.name.as_deref() == Some(&self.driver)
        };
        match change {
            Change::Apply(service) if ours(service) => {
                self.audience = Some(service.spec.audience.clone());
            }
            Change::Delete(service) if ours(service) => self.audience = None,
            Change::Apply(_) | Change::Delete(_) => {}
            Change::Relist => self.audience_listing = Some(None),
            Change::Listed(service) => {
                if ours(service)
                    && let Some(listing) = self.audience_listing.as_mut()
                {
                    *listing = Some(service.spec.audience.clone());
                }
            }
            Change::Relisted => {
                if let Some(listing) = self.audience_listing.take() {
                    self.audience = listing;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn class(name: &str, driver: &str, default: bool) -> VolumeSnapshotClass {
        let mut metadata = ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        };
        if default {
            metadata.annotations = Some(BTreeMap::from([(
                crate::model::DEFAULT_CLASS.to_string(),
                "true".to_string(),
            )]));
        }
        VolumeSnapshotClass {
            metadata,
            driver: driver.to_string(),
            parameters: BTreeMap::new(),
        }
    }

    #[test]
    fn only_the_driver_s_classes_are_kept_and_a_relist_drops_the_gone() {
        let mut index = Index::new("d");
        index.class_event(Change::Apply(&class("a", "d", true)));
        index.class_event(Change::Apply(&class("b", "other", false)));
        index.class_event(Change::Apply(&class("c", "d", false)));
        assert_eq!(index.classes().keys().collect::<Vec<_>>(), ["a", "c"]);
        assert!(index.classes()["a"].is_default);

        index.class_event(Change::Relist);
        index.class_event(Change::Listed(&class("c", "d", false)));
        assert_eq!(index.classes().len(), 2, "known until the list completes");
        index.class_event(Change::Relisted);
        assert_eq!(index.classes().keys().collect::<Vec<_>>(), ["c"]);

        index.class_event(Change::Apply(&class("c", "moved", false)));
        assert!(index.classes().is_empty());
    }

    #[test]
    fn the_audience_follows_the_service_named_after_the_driver() {
        let service = |name: &str, audience: &str| SnapshotMetadataService {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: crate::model::ServiceSpec {
                address: "a:6443".to_string(),
                audience: audience.to_string(),
            },
        };
        let mut index = Index::new("d");
        assert_eq!(index.audience(), None);
        index.service_event(Change::Apply(&service("other", "x")));
        assert_eq!(index.audience(), None);
        index.service_event(Change::Apply(&service("d", "backup")));
        assert_eq!(index.audience(), Some("backup"));
        index.service_event(Change::Relist);
        index.service_event(Change::Relisted);
        assert_eq!(index.audience(), None, "gone while the watch was down");
    }
}
