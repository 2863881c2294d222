//! Storage capacity tracking (`--enable-capacity`), the pure part: topology segments from Nodes
//! and CSINodes, the desired set of CSIStorageCapacity objects (one per segment × tracked
//! StorageClass), which existing object stands for which desired one, and what to write.
//! The watches, the GetCapacity calls and the API writes live in [`controller`].
//!
//! Work is keyed per object ([`Work`]): the same key queued twice is queued once, so the queue
//! never holds more entries than there are desired and obsolete objects, however many polls
//! and refreshes pile up.

pub mod controller;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use sidecar_kit::values::names::fnv32a;

pub const DRIVER_NAME_LABEL: &str = "csi.storage.k8s.io/drivername";
pub const MANAGED_BY_LABEL: &str = "csi.storage.k8s.io/managed-by";
/// The managed-by value of a central provisioner.
pub const MANAGED_BY: &str = "external-provisioner";
pub const GENERATE_NAME: &str = "csisc-";
/// Queue names, as upstream names them in the workqueue metrics.
pub const CAPACITY_QUEUE: &str = "csistoragecapacity";
pub const TOPOLOGY_QUEUE: &str = "csitopology";
/// The name of the invalid object whose creation tells which API version the cluster serves.
pub const PROBE_NAME: &str = "#%123-invalid-name";
pub const GROUP: &str = "storage.k8s.io";
pub const KIND: &str = "CSIStorageCapacity";
pub const PLURAL: &str = "csistoragecapacities";

/// A topology segment: the driver's topology keys and their values, sorted by key. Empty: all
/// nodes (a driver registered without topology keys).
pub type Segment = BTreeMap<String, String>;

/// One desired object: a tracked StorageClass in a segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub class: Arc<str>,
    pub segment: Arc<Segment>,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@", self.class)?;
        let mut first = true;
        for (k, v) in self.segment.iter() {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{k}={v}")?;
        }
        if first {
            f.write_str("<all nodes>")?;
        }
        Ok(())
    }
}

/// A unit of work of the capacity queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Ask the driver and create or update the object of this key.
    Sync(Key),
    /// Delete this object (by name) if it is still obsolete.
    Delete(String),
}

/// Which `storage.k8s.io` version serves CSIStorageCapacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVersion {
    V1,
    V1beta1,
}

impl ApiVersion {
    pub fn version(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta1 => "v1beta1",
        }
    }

    pub fn api_version(self) -> String {
        format!("{GROUP}/{}", self.version())
    }
}

/// What creating the invalid probe object answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeAnswer {
    Created,
    /// An API error with its HTTP code and message.
    Refused {
        code: u16,
        message: String,
    },
    /// No answer of the API server (connection error, …).
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("creating an invalid v1.CSIStorageCapacity didn't fail as expected")]
    Created,
    #[error("unexpected error when checking for the V1 CSIStorageCapacity API: {0}")]
    Unexpected(String),
}

/// Upstream's decision: NotFound means the cluster has no v1 API (use v1beta1), Invalid means
/// it has one; anything else is fatal.
pub fn probe_decision(answer: ProbeAnswer) -> Result<ApiVersion, ProbeError> {
    match answer {
        ProbeAnswer::Created => Err(ProbeError::Created),
        ProbeAnswer::Refused { code: 404, .. } => Ok(ApiVersion::V1beta1),
        ProbeAnswer::Refused { code: 422, .. } => Ok(ApiVersion::V1),
        ProbeAnswer::Refused { code, message } => {
            Err(ProbeError::Unexpected(format!("{code}: {message}")))
        }
        ProbeAnswer::Failed(message) => Err(ProbeError::Unexpected(message)),
    }
}

/// The managed-by label value: `external-provisioner`, or with distributed provisioning
/// The segments a PV's node affinity names, for the refresh after it was created or deleted
/// (upstream's `termToSegment`): each term whose expressions all are `In` with one value; other
/// terms are skipped.
pub fn affinity_segments(
    affinity: &k8s_openapi::api::core::v1::VolumeNodeAffinity,
) -> Vec<Segment> {
    let Some(required) = &affinity.required else {
        return Vec::new();
    };
    required
        .node_selector_terms
        .iter()
        .filter(|term| term.match_fields.as_ref().is_none_or(Vec::is_empty))
        .filter_map(|term| {
            term.match_expressions
                .iter()
                .flatten()
                .map(|e| match e.values.as_deref() {
                    Some([value]) if e.operator == "In" => Some((e.key.clone(), value.clone())),
                    _ => None,
                })
                .collect::<Option<Segment>>()
        })
        .collect()
}

/// `external-provisioner-<node>` cut to 63 characters as upstream cuts it.
pub fn managed_by(node: Option<&str>) -> String {
    match node {
        None => MANAGED_BY.to_string(),
        Some(node) => name_with_max_length(MANAGED_BY, node, 63),
    }
}

/// `<base>-<suffix>`, or when longer than `max`: the base shortened and an 8-digit FNV-1a hash
/// inserted (`<base>-<hash>-<suffix>`), or with a suffix too long `<base>-<hash of both>`, cut.
pub fn name_with_max_length(base: &str, suffix: &str, max: usize) -> String {
    let name = if base.is_empty() {
        suffix.to_string()
    } else {
        format!("{base}-{suffix}")
    };
    if name.len() <= max {
        return name;
    }
    let base_len = max as i64 - 10 - suffix.len() as i64;
    if base_len <= 0 {
        let hash = fnv32a(&name);
        let prefix_len = base.len().min(max.saturating_sub(9));
        let short = match base.get(..prefix_len).filter(|p| !p.is_empty()) {
            Some(prefix) => format!("{prefix}-{hash}"),
            None => hash,
        };
        return short.chars().take(max).collect();
    }
    let prefix = base.get(..base_len as usize).unwrap_or(base);
    format!("{prefix}-{}-{suffix}", fnv32a(base))
}

/// A StorageClass as capacity tracking sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassView {
    pub name: String,
    pub provisioner: String,
    /// `volumeBindingMode` as written (`None`: unset).
    pub binding_mode: Option<String>,
    pub parameters: BTreeMap<String, String>,
}

impl ClassView {
    pub fn from_api(sc: &StorageClass) -> Self {
        Self {
            name: sc.metadata.name.clone().unwrap_or_default(),
            provisioner: sc.provisioner.clone(),
            binding_mode: sc.volume_binding_mode.clone(),
            parameters: sc.parameters.clone().unwrap_or_default(),
        }
    }

    /// Whether objects are published for this class: it names the driver and, unless
    /// `immediate`, does not bind immediately (an unset mode counts as late, as upstream).
    pub fn tracked(&self, driver: &str, immediate: bool) -> bool {
        self.provisioner == driver
            && (immediate || self.binding_mode.as_deref() != Some("Immediate"))
    }
}

/// Nodes and CSINodes, reduced to what segments are made of.
#[derive(Debug, Default)]
pub struct TopologyInputs {
    /// CSINodes where the driver is registered: its topology keys, sorted.
    keys: HashMap<String, Vec<String>>,
    /// Node labels.
    labels: HashMap<String, BTreeMap<String, String>>,
}

impl TopologyInputs {
    /// Records a CSINode (`keys`: the driver's topology keys, `None` if not registered there);
    /// returns whether that changes anything.
    pub fn set_csinode(&mut self, name: &str, keys: Option<Vec<String>>) -> bool {
        match keys {
            Some(mut keys) => {
                keys.sort();
                keys.dedup();
                self.keys.insert(name.to_string(), keys.clone()) != Some(keys)
            }
            None => self.keys.remove(name).is_some(),
        }
    }

    pub fn remove_csinode(&mut self, name: &str) -> bool {
        self.keys.remove(name).is_some()
    }

    pub fn set_node(&mut self, name: &str, labels: BTreeMap<String, String>) -> bool {
        self.labels.insert(name.to_string(), labels.clone()) != Some(labels)
    }

    pub fn remove_node(&mut self, name: &str) -> bool {
        self.labels.remove(name).is_some()
    }

    pub fn csinode_names(&self) -> Vec<String> {
        self.keys.keys().cloned().collect()
    }

    pub fn node_names(&self) -> Vec<String> {
        self.labels.keys().cloned().collect()
    }

    /// The distinct segments, as upstream finds them: for every CSINode where the driver is
    /// registered and whose Node exists and carries all the driver's keys, the keys with the
    /// Node's values. A driver registered without keys yields the empty segment (all nodes).
    pub fn segments(&self) -> BTreeSet<Segment> {
        let mut out = BTreeSet::new();
        for (name, keys) in &self.keys {
            let Some(labels) = self.labels.get(name) else {
                continue;
            };
            let segment: Option<Segment> = keys
                .iter()
                .map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
                .collect();
            if let Some(segment) = segment {
                out.insert(segment);
            }
        }
        out
    }
}

/// The owner reference of the objects (always `controller: true`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl OwnerRef {
    pub fn to_json(&self) -> Value {
        json!({"apiVersion": self.api_version, "kind": self.kind, "name": self.name,
            "uid": self.uid, "controller": true})
    }
}

/// One object on the ownership chain, as read from the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerMeta {
    pub uid: String,
    /// `(apiVersion, kind, name, uid, controller)` of each owner reference.
    pub owners: Vec<(String, String, String, String, bool)>,
}

#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("get object: {0}")]
    Get(String),
    #[error(
        "{api_version}/{kind} {name:?} in namespace {namespace:?} has no controlling owner, cannot unwind the ownership further"
    )]
    NoController {
        api_version: String,
        kind: String,
        name: String,
        namespace: String,
    },
}

/// Walks `levels` controller references up from the object `(api_version, kind, name)` in
/// `namespace`, as upstream does: level 0 is the object itself; at the last step the owner
/// reference is taken as written, without reading the owner (so level 1 needs only `get` on the
/// start object: pods; level 2 also on its owner: replicasets). Negative: no owner.
pub async fn lookup_owner<F, Fut>(
    mut get: F,
    namespace: &str,
    start: (&str, &str, &str),
    levels: i32,
) -> Result<Option<OwnerRef>, OwnerError>
where
    F: FnMut(String, String, String) -> Fut,
    Fut: Future<Output = Result<OwnerMeta, String>>,
{
    if levels < 0 {
        return Ok(None);
    }
    let (mut api_version, mut kind, mut name) = (
        start.0.to_string(),
        start.1.to_string(),
        start.2.to_string(),
    );
    let mut levels = levels;
    loop {
        let meta = get(api_version.clone(), kind.clone(), name.clone())
            .await
            .map_err(OwnerError::Get)?;
        if levels == 0 {
            return Ok(Some(OwnerRef {
                api_version,
                kind,
                name,
                uid: meta.uid,
            }));
        }
        let Some((o_api, o_kind, o_name, o_uid, _)) = meta
            .owners
            .into_iter()
            .find(|(_, _, _, _, controller)| *controller)
        else {
            return Err(OwnerError::NoController {
                api_version,
                kind,
                name,
                namespace: namespace.to_string(),
            });
        };
        if levels == 1 {
            return Ok(Some(OwnerRef {
                api_version: o_api,
                kind: o_kind,
                name: o_name,
                uid: o_uid,
            }));
        }
        (api_version, kind, name) = (o_api, o_kind, o_name);
        levels -= 1;
    }
}

/// An existing CSIStorageCapacity object, projected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// Carries our driver and managed-by labels.
    pub managed: bool,
    /// Class and segment (`None`: a node topology that is no plain `matchLabels`).
    pub class: String,
    pub segment: Option<Segment>,
    pub capacity: Option<i128>,
    pub maximum: Option<i128>,
    pub owners: Vec<Value>,
}

impl Stored {
    pub fn from_object(obj: &DynamicObject, driver: &str, managed_by: &str) -> Self {
        let meta = &obj.metadata;
        let label = |k: &str| {
            meta.labels
                .as_ref()
                .and_then(|l| l.get(k))
                .map(String::as_str)
        };
        let managed =
            label(DRIVER_NAME_LABEL) == Some(driver) && label(MANAGED_BY_LABEL) == Some(managed_by);
        let data = &obj.data;
        let quantity = |field: &str| {
            data.get(field)
                .and_then(Value::as_str)
                .and_then(|q| sidecar_kit::values::quantity::parse(q).ok())
        };
        let segment = match data.get("nodeTopology") {
            Some(Value::Object(selector)) => {
                let plain = selector
                    .get("matchExpressions")
                    .is_none_or(|e| e.as_array().is_none_or(Vec::is_empty));
                let labels: Option<Segment> = match selector.get("matchLabels") {
                    None | Some(Value::Null) => Some(Segment::new()),
                    Some(Value::Object(m)) => m
                        .iter()
                        .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                        .collect(),
                    Some(_) => None,
                };
                labels.filter(|_| plain)
            }
            _ => None,
        };
        Self {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            managed,
            class: data
                .get("storageClassName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            segment,
            capacity: quantity("capacity"),
            maximum: quantity("maximumVolumeSize"),
            owners: meta
                .owner_references
                .iter()
                .flatten()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
        }
    }

    fn owned_by(&self, owner: &OwnerRef) -> bool {
        self.owners.iter().any(|o| {
            o.get("controller").and_then(Value::as_bool) == Some(true)
                && o.get("uid").and_then(Value::as_str) == Some(owner.uid.as_str())
        })
    }
}

/// What GetCapacity answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub available: i64,
    pub maximum: Option<i64>,
}

/// What to write for a key after asking the driver.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// The key is no longer desired.
    Skip,
    /// The object exists with these values (and our owner).
    Unchanged,
    /// Create this object.
    Create(Value),
    /// JSON merge patch of `name` (carrying its resourceVersion, so a stale view conflicts).
    Update { name: String, patch: Value },
}

/// Settings of a [`Tracker`].
#[derive(Clone, Debug)]
pub struct TrackerConfig {
    pub driver: String,
    pub managed_by: String,
    pub immediate: bool,
    pub owner: Option<OwnerRef>,
    pub api_version: ApiVersion,
}

/// Desired and existing objects, and which object stands for which key: the first seen object
/// of a desired key holds it; every other managed object is obsolete.
#[derive(Debug)]
pub struct Tracker {
    config: TrackerConfig,
    /// Tracked classes and their parameters.
    classes: BTreeMap<Arc<str>, Arc<BTreeMap<String, String>>>,
    segments: BTreeSet<Arc<Segment>>,
    objects: HashMap<String, Stored>,
    by_key: HashMap<Key, Vec<String>>,
}

/// Counts for the `csistoragecapacities_*` gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub goal: usize,
    pub current: usize,
    pub obsolete: usize,
}

impl Tracker {
    pub fn new(config: TrackerConfig) -> Self {
        Self {
            config,
            classes: BTreeMap::new(),
            segments: BTreeSet::new(),
            objects: HashMap::new(),
            by_key: HashMap::new(),
        }
    }

    pub fn config(&self) -> &TrackerConfig {
        &self.config
    }

    fn key_of(&self, stored: &Stored) -> Option<Key> {
        let segment = stored.segment.as_ref()?;
        let segment = self
            .segments
            .get(segment)
            .cloned()
            .unwrap_or_else(|| Arc::new(segment.clone()));
        let class = self
            .classes
            .get_key_value(stored.class.as_str())
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| Arc::from(stored.class.as_str()));
        Some(Key { class, segment })
    }

    pub fn desired(&self, key: &Key) -> bool {
        self.classes.contains_key(&key.class) && self.segments.contains(&key.segment)
    }

    /// The parameters of a tracked class.
    pub fn parameters(&self, class: &str) -> Option<Arc<BTreeMap<String, String>>> {
        self.classes.get(class).cloned()
    }

    /// The object holding `key`.
    pub fn holder(&self, key: &Key) -> Option<&Stored> {
        self.by_key
            .get(key)
            .and_then(|names| names.first())
            .and_then(|n| self.objects.get(n))
    }

    /// Whether the object `name` is ours and stands for no desired key.
    pub fn is_obsolete(&self, name: &str) -> bool {
        let Some(stored) = self.objects.get(name) else {
            return false;
        };
        match self.key_of(stored) {
            Some(key) => {
                !self.desired(&key)
                    || self
                        .by_key
                        .get(&key)
                        .and_then(|v| v.first())
                        .map(String::as_str)
                        != Some(name)
            }
            None => true,
        }
    }

    pub fn known(&self, name: &str) -> bool {
        self.objects.contains_key(name)
    }

    pub fn object_names(&self) -> Vec<String> {
        self.objects.keys().cloned().collect()
    }

    pub fn class_names(&self) -> Vec<String> {
        self.classes.keys().map(|k| k.to_string()).collect()
    }

    fn keys_where(&self, class: Option<&str>, segment: Option<&Segment>) -> Vec<Key> {
        let mut out = Vec::new();
        for (c, _) in self
            .classes
            .iter()
            .filter(|(c, _)| class.is_none_or(|x| &***c == x))
        {
            for s in self
                .segments
                .iter()
                .filter(|s| segment.is_none_or(|x| &***s == x))
            {
                out.push(Key {
                    class: c.clone(),
                    segment: s.clone(),
                });
            }
        }
        out
    }

    /// Sync work for the desired keys of `class` and/or `segment` (`None`: any).
    pub fn refresh(&self, class: Option<&str>, segment: Option<&Segment>) -> Vec<Work> {
        self.keys_where(class, segment)
            .into_iter()
            .map(Work::Sync)
            .collect()
    }

    /// Everything to look at: every desired key and every obsolete object.
    pub fn all_work(&self) -> Vec<Work> {
        let mut out = self.refresh(None, None);
        out.extend(self.obsolete_names().into_iter().map(Work::Delete));
        out
    }

    fn obsolete_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .objects
            .keys()
            .filter(|n| self.is_obsolete(n))
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Objects of the keys of `class` and/or `segment`, to delete once those keys are gone.
    fn deletions(&self, class: Option<&str>, segment: Option<&Segment>) -> Vec<Work> {
        let mut out = Vec::new();
        for (key, names) in &self.by_key {
            if class.is_some_and(|c| &*key.class != c)
                || segment.is_some_and(|s| &*key.segment != s)
            {
                continue;
            }
            out.extend(names.iter().cloned().map(Work::Delete));
        }
        out
    }

    /// A StorageClass was added or changed.
    pub fn set_class(&mut self, class: &ClassView) -> Vec<Work> {
        if !class.tracked(&self.config.driver, self.config.immediate) {
            return self.remove_class(&class.name);
        }
        let params = Arc::new(class.parameters.clone());
        let changed = match self.classes.get(class.name.as_str()) {
            Some(old) => **old != *params,
            None => true,
        };
        if !changed {
            return Vec::new();
        }
        self.classes.insert(Arc::from(class.name.as_str()), params);
        self.refresh(Some(&class.name), None)
    }

    /// A StorageClass was deleted (or is no longer tracked).
    pub fn remove_class(&mut self, name: &str) -> Vec<Work> {
        if self.classes.remove(name).is_none() {
            return Vec::new();
        }
        self.deletions(Some(name), None)
    }

    pub fn segment_set(&self) -> BTreeSet<Segment> {
        self.segments.iter().map(|s| (**s).clone()).collect()
    }

    /// The segments are now `new`.
    pub fn set_segments(&mut self, new: BTreeSet<Segment>) -> Vec<Work> {
        let removed: Vec<Arc<Segment>> = self
            .segments
            .iter()
            .filter(|s| !new.contains(&***s))
            .cloned()
            .collect();
        let added: Vec<Segment> = new
            .into_iter()
            .filter(|s| !self.segments.contains(s))
            .collect();
        let mut out = Vec::new();
        for segment in removed {
            self.segments.remove(&segment);
            out.extend(self.deletions(None, Some(&segment)));
        }
        for segment in added {
            let segment = Arc::new(segment);
            self.segments.insert(segment.clone());
            out.extend(self.refresh(None, Some(&segment)));
        }
        out
    }

    fn unlink(&mut self, name: &str) -> Option<(Stored, Option<Key>)> {
        let stored = self.objects.remove(name)?;
        let key = self.key_of(&stored);
        if let Some(key) = &key
            && let Some(names) = self.by_key.get_mut(key)
        {
            names.retain(|n| n != name);
            if names.is_empty() {
                self.by_key.remove(key);
            }
        }
        Some((stored, key))
    }

    /// The watch reports an object (new or changed).
    pub fn object_applied(&mut self, stored: Stored) -> Vec<Work> {
        let mut out = Vec::new();
        let name = stored.name.clone();
        let was_holder = self.holder_key_of(&name);
        if !stored.managed {
            // Not ours (any more): forget it; its key needs a new object.
            self.unlink(&name);
            out.extend(was_holder.into_iter().map(Work::Sync));
            return out;
        }
        let new_key = self.key_of(&stored);
        let same_key = self
            .objects
            .get(&name)
            .map(|old| self.key_of(old) == new_key);
        match same_key {
            Some(true) => {
                self.objects.insert(name.clone(), stored);
            }
            _ => {
                self.unlink(&name);
                self.objects.insert(name.clone(), stored);
                if let Some(key) = new_key {
                    self.by_key.entry(key).or_default().push(name.clone());
                }
                if let Some(old) = was_holder
                    && self.holder_key_of(&name).as_ref() != Some(&old)
                {
                    out.push(Work::Sync(old));
                }
            }
        }
        if self.is_obsolete(&name) {
            out.push(Work::Delete(name));
        }
        out
    }

    /// The key `name` holds, if it holds a desired one.
    fn holder_key_of(&self, name: &str) -> Option<Key> {
        let key = self.key_of(self.objects.get(name)?)?;
        (self.desired(&key)
            && self
                .by_key
                .get(&key)
                .and_then(|v| v.first())
                .map(String::as_str)
                == Some(name))
        .then_some(key)
    }

    /// Our own create answered with `stored`: recorded unless the watch was faster.
    pub fn object_created(&mut self, stored: Stored) -> Vec<Work> {
        if self.objects.contains_key(&stored.name) {
            return Vec::new();
        }
        self.object_applied(stored)
    }

    /// Our own update of an object last seen at `base_rv` answered with `stored`: recorded
    /// unless the watch already reported something newer.
    pub fn object_written(&mut self, stored: Stored, base_rv: &str) -> Vec<Work> {
        match self.objects.get(&stored.name) {
            Some(current) if current.resource_version == base_rv => self.object_applied(stored),
            _ => Vec::new(),
        }
    }

    /// The object is gone.
    pub fn object_deleted(&mut self, name: &str) -> Vec<Work> {
        let was_holder = self.holder_key_of(name);
        self.unlink(name);
        was_holder.into_iter().map(Work::Sync).collect()
    }

    /// What to write for `key` now that the driver answered `answer`.
    pub fn plan(&self, key: &Key, answer: &Answer) -> Plan {
        if !self.desired(key) {
            return Plan::Skip;
        }
        let capacity = sidecar_kit::values::quantity::format_binary(answer.available);
        let maximum = answer
            .maximum
            .map(sidecar_kit::values::quantity::format_binary);
        let owner = self.config.owner.as_ref();
        let Some(stored) = self.holder(key) else {
            let mut labels = serde_json::Map::new();
            labels.insert(DRIVER_NAME_LABEL.into(), json!(self.config.driver));
            labels.insert(MANAGED_BY_LABEL.into(), json!(self.config.managed_by));
            let mut metadata = json!({"generateName": GENERATE_NAME, "labels": labels});
            if let Some(owner) = owner {
                metadata["ownerReferences"] = json!([owner.to_json()]);
            }
            let mut body = json!({
                "apiVersion": self.config.api_version.api_version(),
                "kind": KIND,
                "metadata": metadata,
                "storageClassName": &*key.class,
                "nodeTopology": {"matchLabels": &*key.segment},
                "capacity": capacity,
            });
            if let Some(maximum) = maximum {
                body["maximumVolumeSize"] = json!(maximum);
            }
            return Plan::Create(body);
        };
        let same_capacity = stored.capacity == Some(i128::from(answer.available));
        let same_maximum = stored.maximum == answer.maximum.map(i128::from);
        let owned = owner.is_none_or(|o| stored.owned_by(o));
        if same_capacity && same_maximum && owned {
            return Plan::Unchanged;
        }
        let mut metadata = json!({"resourceVersion": stored.resource_version});
        if let Some(owner) = owner.filter(|_| !owned) {
            let mut owners = stored.owners.clone();
            owners.push(owner.to_json());
            metadata["ownerReferences"] = Value::Array(owners);
        }
        Plan::Update {
            name: stored.name.clone(),
            patch: json!({
                "metadata": metadata,
                "capacity": capacity,
                "maximumVolumeSize": maximum,
            }),
        }
    }

    /// Desired objects, those that exist, and obsolete ones.
    pub fn counts(&self) -> Counts {
        let goal = self.classes.len() * self.segments.len();
        let current = self.by_key.keys().filter(|k| self.desired(k)).count();
        let obsolete = self.objects.keys().filter(|n| self.is_obsolete(n)).count();
        Counts {
            goal,
            current,
            obsolete,
        }
    }
}

#[cfg(test)]
mod tests;
