//! What the watches tell the sidecar, kept between requests so that no request reads it from
//! the API server: the VolumeSnapshotClasses of its driver and the audience of its
//! SnapshotMetadataService. No I/O.

use std::collections::BTreeMap;

use sidecar_kit::pipeline::Change;

use crate::model::{Class, SnapshotMetadataService, VolumeSnapshotClass};

#[derive(Debug, Default)]
pub struct Index {
    driver: String,
    classes: BTreeMap<String, Class>,
    /// The classes of a list under way; they replace the known ones when it completes.
    listing: Option<BTreeMap<String, Class>>,
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
        &self.classes
    }

    /// The audience the driver's SnapshotMetadataService names, if there is one.
    pub fn audience(&self) -> Option<&str> {
        self.audience.as_deref()
    }

    pub fn class_event(&mut self, change: Change<&VolumeSnapshotClass>) {
        let name = |class: &VolumeSnapshotClass| class.metadata.name.clone().unwrap_or_default();
        match change {
            Change::Apply(class) if class.driver == self.driver => {
                self.classes.insert(name(class), Class::from_api(class));
            }
            // A class whose driver changed is no longer one of ours.
            Change::Apply(class) | Change::Delete(class) => {
                self.classes.remove(&name(class));
            }
            Change::Relist => self.listing = Some(BTreeMap::new()),
            Change::Listed(class) => {
                if let Some(listing) = self.listing.as_mut()
                    && class.driver == self.driver
                {
                    listing.insert(name(class), Class::from_api(class));
                }
            }
            Change::Relisted => {
                if let Some(listing) = self.listing.take() {
                    self.classes = listing;
                }
            }
        }
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
