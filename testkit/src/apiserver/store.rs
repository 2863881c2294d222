//! The object store: objects as JSON, one resourceVersion counter for all kinds
//! (like etcd's revision), an event history for watches, and the write
//! semantics of the real server (preconditions, finalizers, status subresource,
//! generation). No I/O: the HTTP edge and the PV controller call in under a lock.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::gates::{FeatureGates, Gate};
use super::patch::{PatchError, json_patch, merge_patch, strategic_merge_patch};
use super::protection;
use super::registry::{Kind, KindId, Registry, StatusMetadata};
use super::selector::{FieldSelector, LabelSelector};
use super::validation;

mod objects;

use objects::*;
pub use objects::{apply_defaults, key_of, normalize_secret, now_timestamp, resource_version_of};

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds.
pub type ObjKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history and sent to watchers.
#[derive(Debug)]
pub struct WatchEvent {
    pub kind: KindId,
    pub etype: EventType,
    pub rv: u64,
    /// The object after the change; for deletions the last state, stamped with the deletion's resourceVersion.
    pub object: Arc<Value>,
    /// The object before the change (`None` for creations).
    pub prev: Option<Arc<Value>>,
    encoded: OnceLock<Bytes>,
    encoded_protobuf: OnceLock<Option<Bytes>>,
}

impl WatchEvent {
    fn new(
        kind: KindId,
        etype: EventType,
        rv: u64,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) -> Self {
        Self {
            kind,
            etype,
            rv,
            object,
            prev,
            encoded: OnceLock::new(),
            encoded_protobuf: OnceLock::new(),
        }
    }

    /// The object serialized once and shared by every watcher.
    pub fn encoded_object(&self) -> &Bytes {
        self.encoded
            .get_or_init(|| Bytes::from(serde_json::to_vec(&*self.object).unwrap_or_default()))
    }

    /// The object in the protobuf envelope, encoded once and shared by every
    /// protobuf watcher; `None` for a kind without a protobuf encoding.
    pub fn encoded_protobuf(&self) -> Option<&Bytes> {
        self.encoded_protobuf
            .get_or_init(|| match super::protobuf::encode_object(&self.object) {
                Ok(b) => Some(Bytes::from(b)),
                Err(e) => {
                    tracing::warn!(rv = self.rv, "a watch event has no protobuf encoding: {e}");
                    None
                }
            })
            .as_ref()
    }
}

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    Status,
}

/// The three patch formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
}

/// DELETE preconditions.
#[derive(Debug, Clone, Default)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// What a DELETE did.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// The object is gone; this is its last state.
    Removed(Arc<Value>),
    /// Finalizers keep the object; it now carries a deletionTimestamp.
    Pending(Arc<Value>),
}

/// A LIST request, already parsed.
#[derive(Debug, Clone, Default)]
pub struct ListQuery<'a> {
    pub namespace: Option<&'a str>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<&'a str>,
    pub resource_version: Option<&'a str>,
    /// `resourceVersionMatch=Exact`.
    pub exact: bool,
}

/// One page of a LIST.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// Synthetic ADDED events for the current state, then live events.
    Current,
    /// Every event after this resourceVersion.
    After(u64),
}

/// A registered watch: the events to send first, then the live channel.
#[derive(Debug)]
pub struct WatchStart {
    pub initial: Vec<Arc<WatchEvent>>,
    pub events: mpsc::Receiver<Arc<WatchEvent>>,
    /// Live events at or below this resourceVersion are skipped.
    pub after: u64,
}

#[derive(Debug)]
struct Watcher {
    tx: mpsc::Sender<Arc<WatchEvent>>,
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// The in-memory object store.
#[derive(Debug)]
pub struct Store {
    registry: Arc<Registry>,
    objects: Vec<BTreeMap<ObjKey, Arc<Value>>>,
    rv: u64,
    history: VecDeque<Arc<WatchEvent>>,
    history_limit: usize,
    /// Every event with a resourceVersion above this is still in `history`.
    history_floor: u64,
    watchers: Vec<Vec<Watcher>>,
    watch_buffer: usize,
    rng: u64,
    gates: FeatureGates,
}

impl Store {
    /// An empty store holding the namespaces every cluster has.
    pub fn new(registry: Arc<Registry>, history_limit: usize, watch_buffer: usize) -> Self {
        let n = registry.kinds().len();
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let mut store = Self {
            objects: vec![BTreeMap::new(); n],
            watchers: (0..n).map(|_| Vec::new()).collect(),
            registry,
            rv: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            history_floor: 0,
            watch_buffer: watch_buffer.max(1),
            rng: seed | 1,
            gates: FeatureGates::default(),
        };
        if let Some(ns_kind) = store.registry.core("namespaces") {
            for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                // Creating the well-known namespaces into an empty store cannot fail.
                let _ = store.create(ns_kind, "", json!({"metadata": {"name": name}}), false);
            }
        }
        store
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The feature gates writes are handled with (1.34's defaults unless set).
    pub fn feature_gates(&self) -> &FeatureGates {
        &self.gates
    }

    pub fn set_feature_gates(&mut self, gates: FeatureGates) {
        self.gates = gates;
    }

    /// The newest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn kind(&self, id: KindId) -> &Kind {
        self.registry.get(id)
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64: good enough for UIDs and generated names in tests.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn new_uid(&mut self) -> String {
        let (a, b) = (self.next_random(), self.next_random());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn generated_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[(self.next_random() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }

    /// Reads one object.
    pub fn get(&self, kind: KindId, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.objects[kind]
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(self.kind(kind), name))
    }

    /// All current objects of a kind, in key order.
    pub fn all(&self, kind: KindId) -> impl Iterator<Item = &Arc<Value>> {
        self.objects[kind].values()
    }

    /// The state of one kind at an older resourceVersion, rebuilt by undoing history.
    fn snapshot(&self, kind: KindId, at: u64) -> BTreeMap<ObjKey, Arc<Value>> {
        let mut m = self.objects[kind].clone();
        for ev in self.history.iter().rev().take_while(|e| e.rv > at) {
            if ev.kind != kind {
                continue;
            }
            let key = key_of(&ev.object);
            match &ev.prev {
                Some(p) => m.insert(key, p.clone()),
                None => m.remove(&key),
            };
        }
        m
    }

    /// LIST with selectors, paging and resourceVersion semantics.
    pub fn list(&self, kind: KindId, q: &ListQuery<'_>) -> Result<ListPage, ApiError> {
        let current = self.rv;
        let (at, start_after) = if let Some(token) = q.continue_token.filter(|t| !t.is_empty()) {
            let (rv, key) = decode_continue(token)
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
            if rv < self.history_floor {
                return Err(ApiError::expired(CONTINUE_EXPIRED));
            }
            (rv, Some(key))
        } else {
            match q.resource_version.filter(|rv| !rv.is_empty() && *rv != "0") {
                None => (current, None),
                Some(rv) => {
                    let rv = parse_rv(rv)?;
                    if rv > current {
                        return Err(ApiError::too_large_resource_version(rv, current));
                    }
                    // Exact (explicitly, or implied by legacy paging) reads the old state.
                    if q.exact || q.limit.is_some() {
                        if rv < self.history_floor {
                            return Err(ApiError::expired(format!(
                                "too old resource version: {rv} ({})",
                                self.history_floor + 1
                            )));
                        }
                        (rv, None)
                    } else {
                        (current, None)
                    }
                }
            }
        };
        let source: Cow<'_, BTreeMap<ObjKey, Arc<Value>>> = if at < current {
            Cow::Owned(self.snapshot(kind, at))
        } else {
            Cow::Borrowed(&self.objects[kind])
        };
        let lower = match &start_after {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        let filtered = !q.labels.is_empty() || !q.fields.is_empty();
        let mut matching = source
            .range((lower, Bound::Unbounded))
            .filter(|((ns, _), _)| q.namespace.is_none_or(|want| want == ns))
            .map(|(_, o)| o)
            .filter(|o| q.labels.matches(o) && q.fields.matches(o));
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let items: Vec<Arc<Value>> = matching.by_ref().take(limit).cloned().collect();
        let rest = matching.count() as u64;
        let (continue_token, remaining) = match items.last() {
            Some(last) if rest > 0 => (
                Some(encode_continue(at, &key_of(last))),
                (!filtered).then_some(rest),
            ),
            _ => (None, None),
        };
        Ok(ListPage {
            items,
            resource_version: at,
            continue_token,
            remaining,
        })
    }

    fn namespace_state(&self, ns: &str) -> Option<&Arc<Value>> {
        let nk = self.registry.core("namespaces")?;
        self.objects[nk].get(&(String::new(), ns.to_string()))
    }

    fn default_storage_class(&self) -> Option<String> {
        let sc = self
            .registry
            .lookup("storage.k8s.io", "v1", "storageclasses")?;
        self.objects[sc]
            .values()
            .filter(|o| {
                o.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                    .and_then(Value::as_str)
                    == Some("true")
            })
            .max_by_key(|o| {
                (
                    meta_str(o, "creationTimestamp").to_string(),
                    resource_version_of(o),
                )
            })
            .map(|o| meta_str(o, "name").to_string())
    }

    /// The PersistentVolumeClaimResize admission (validating, after the
    /// strategy's validation): a claim may grow only when bound and when its
    /// StorageClass allows volume expansion.
    fn admit_claim_resize(&self, k: &Kind, old: &Value, new: &Value) -> Result<(), ApiError> {
        let size = |v: &Value| {
            v.pointer("/spec/resources/requests/storage")
                .and_then(super::quantity::from_json)
                .and_then(Result::ok)
        };
        let (Some(new_size), old_size) = (size(new), size(old)) else {
            return Ok(());
        };
        if old_size.is_some_and(|o| new_size <= o) || old_size.is_none() && new_size.is_zero() {
            return Ok(());
        }
        let name = meta_str(new, "name");
        if old.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
            return Err(ApiError::forbidden(
                k,
                name,
                "Only bound persistent volume claims can be expanded",
            ));
        }
        // The beta annotation wins over spec.storageClassName, as GetPersistentVolumeClaimClass.
        let class = |v: &Value| {
            v.pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
                .or_else(|| v.pointer("/spec/storageClassName"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (new_class, old_class) = (class(new), class(old));
        let allowed = !new_class.is_empty()
            && new_class == old_class
            && self
                .registry
                .lookup("storage.k8s.io", "v1", "storageclasses")
                .and_then(|sc| self.objects[sc].get(&(String::new(), new_class.clone())))
                .and_then(|sc| sc.get("allowVolumeExpansion"))
                .and_then(Value::as_bool)
                == Some(true);
        if !allowed {
            return Err(ApiError::forbidden(
                k,
                name,
                "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
            ));
        }
        Ok(())
    }

    /// CREATE. `ns` is the namespace from the URL (ignored for cluster-scoped kinds).
    pub fn create(
        &mut self,
        kind: KindId,
        ns: &str,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let k = self.kind(kind).clone();
        check_type(&k, &mut obj)?;
        if k.is_core("Secret") {
            normalize_secret(&k, &mut obj)?;
        }
        validation::canonicalize_quantities(&k, &mut obj)?;
        validation::check_times(&k, &obj)?;
        validation::drop_empty_collections(&k, &mut obj);
        apply_defaults(&k, &mut obj);
        let body_ns = meta_str(&obj, "namespace").to_string();
        if k.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let ns = if k.namespaced {
            ns.to_string()
        } else {
            String::new()
        };
        if k.namespaced {
            let ns_kind = self.registry.core("namespaces");
            match self.namespace_state(&ns) {
                None => {
                    let nk = ns_kind
                        .map(|id| self.kind(id).clone())
                        .unwrap_or_else(|| k.clone());
                    return Err(ApiError::not_found(&nk, &ns));
                }
                Some(n) if being_deleted(n) => {
                    return Err(ApiError::forbidden(
                        &k,
                        meta_str(&obj, "name"),
                        &format!(
                            "unable to create new content in namespace {ns} because it is being terminated"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    &k,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                ));
            }
            loop {
                name = format!("{prefix}{}", self.generated_suffix());
                if !self.objects[kind].contains_key(&(ns.clone(), name.clone())) {
                    break;
                }
            }
        }
        let uid = self.new_uid();
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            if k.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now_timestamp()));
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
                "generation",
            ] {
                m.remove(f);
            }
            if k.tracks_generation {
                m.insert("generation".into(), json!(1));
            }
        }
        if k.status_subresource {
            match k.initial_status() {
                Some(s) => obj["status"] = s,
                None => {
                    if let Value::Object(m) = &mut obj {
                        m.remove("status");
                    }
                }
            }
        }
        if k.is_core("Namespace") {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
        }
        if k.is_core("PersistentVolume")
            && let Some(Value::Object(st)) = obj.get_mut("status")
        {
            st.insert("lastPhaseTransitionTime".into(), json!(now_timestamp()));
        }
        // Mutating admission: DefaultStorageClass, StorageObjectInUseProtection.
        if k.is_core("PersistentVolumeClaim")
            && obj.pointer("/spec/storageClassName").is_none()
            && let Some(class) = self.default_storage_class()
        {
            obj["spec"]["storageClassName"] = json!(class);
        }
        protection::admit(&k, &mut obj, &self.gates);
        drop_disabled_spec_fields(&k, &mut obj, None, &self.gates);
        let errs = validation::validate_create(&k, &obj, &self.gates);
        if !errs.is_empty() {
            return Err(validation::invalid(&k, &name, &errs));
        }
        let key = (ns, name.clone());
        if self.objects[kind].contains_key(&key) {
            return Err(ApiError::already_exists(&k, &name));
        }
        if dry_run {
            return Ok(Arc::new(obj));
        }
        Ok(self.commit_put(kind, key, obj, EventType::Added))
    }

    /// UPDATE (PUT) of the object or its status.
    pub fn update(
        &mut self,
        kind: KindId,
        ns: &str,
        name: &str,
        new: Value,
        target: Target,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let k = self.kind(kind).clone();
        let key = if k.namespaced {
            (ns.to_string(), name.to_string())
        } else {
            (String::new(), name.to_string())
        };
        let old = self.objects[kind]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&k, name))?;
        let new = prepare_update(&k, &old, new, target, &key, &self.gates)?;
        if k.is_core("PersistentVolumeClaim") && target == Target::Main {
            self.admit_claim_resize(&k, &old, &new)?;
        }
        if new == *old {
            // The real server skips writes that change nothing: no new resourceVersion, no event.
            return Ok(old);
        }
        if dry_run {
            return Ok(Arc::new(new));
        }
        if being_deleted(&new) && finalizers(&new).is_empty() {
            // Removing the last finalizer completes the deletion; the response and the DELETED
            // event carry the object as this update left it, without finalizers.
            return Ok(self.commit_remove(kind, &key, Some(new)).unwrap_or(old));
        }
        Ok(self.commit_put(kind, key, new, EventType::Modified))
    }

    /// PATCH: applies the patch to the current object, then stores it as an update.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        kind: KindId,
        ns: &str,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        target: Target,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let k = self.kind(kind).clone();
        let ns = if k.namespaced { ns } else { "" };
        let current = self.get(kind, ns, name)?;
        let mut doc = (*current).clone();
        let applied = match patch_type {
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "a JSON merge patch for an object must be a JSON object",
                    ));
                }
                merge_patch(&mut doc, patch);
                Ok(())
            }
            PatchType::Json => json_patch(&mut doc, patch),
            PatchType::Strategic if k.custom => {
                return Err(ApiError::unsupported_media_type(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            PatchType::Strategic => strategic_merge_patch(&mut doc, patch, &|p| k.list_strategy(p)),
        };
        applied.map_err(|e| match e {
            PatchError::BadRequest(m) => ApiError::bad_request(m),
            PatchError::NotApplicable(m) => ApiError::patch_not_applicable(&m),
            PatchError::Unsupported(m) => ApiError::unsupported_media_type(m),
        })?;
        if !doc.is_object() {
            return Err(ApiError::bad_request(
                "the patched document is not a JSON object",
            ));
        }
        self.update(kind, ns, name, doc, target, dry_run)
    }

    /// DELETE with preconditions and finalizer handling. Deleting a namespace
    /// also deletes everything in it, as the namespace controller would.
    pub fn delete(
        &mut self,
        kind: KindId,
        ns: &str,
        name: &str,
        pre: &Preconditions,
        dry_run: bool,
    ) -> Result<Deleted, ApiError> {
        let k = self.kind(kind).clone();
        let key = if k.namespaced {
            (ns.to_string(), name.to_string())
        } else {
            (String::new(), name.to_string())
        };
        let old = self.objects[kind]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&k, name))?;
        if let Some(uid) = pre.uid.as_deref().filter(|u| !u.is_empty())
            && uid != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                &k,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid")
                ),
            ));
        }
        if let Some(rv) = pre.resource_version.as_deref().filter(|r| !r.is_empty())
            && rv != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                &k,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&old, "resourceVersion")
                ),
            ));
        }
        if dry_run {
            return Ok(if finalizers(&old).is_empty() && !k.is_core("Namespace") {
                Deleted::Removed(old)
            } else {
                Deleted::Pending(old)
            });
        }
        if k.is_core("Namespace") {
            return Ok(self.delete_namespace(kind, key, old));
        }
        Ok(self.delete_object(kind, key, old))
    }

    fn mark_deleted(obj: &Value) -> Value {
        let mut marked = obj.clone();
        let m = meta_mut(&mut marked);
        m.insert("deletionTimestamp".into(), json!(now_timestamp()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        if let Some(generation) = m
            .get("generation")
            .and_then(Value::as_i64)
            .filter(|g| *g > 0)
        {
            m.insert("generation".into(), json!(generation + 1));
        }
        marked
    }

    fn delete_object(&mut self, kind: KindId, key: ObjKey, old: Arc<Value>) -> Deleted {
        if finalizers(&old).is_empty() {
            return Deleted::Removed(self.commit_remove(kind, &key, None).unwrap_or(old));
        }
        if being_deleted(&old) {
            return Deleted::Pending(old);
        }
        let marked = Self::mark_deleted(&old);
        Deleted::Pending(self.commit_put(kind, key, marked, EventType::Modified))
    }

    fn delete_namespace(&mut self, kind: KindId, key: ObjKey, old: Arc<Value>) -> Deleted {
        let ns = key.1.clone();
        let mut current = old.clone();
        if !being_deleted(&old) {
            let mut marked = Self::mark_deleted(&old);
            marked["status"] = json!({"phase": "Terminating"});
            current = self.commit_put(kind, key.clone(), marked, EventType::Modified);
        }
        let namespaced: Vec<KindId> = (0..self.objects.len())
            .filter(|id| self.kind(*id).namespaced)
            .collect();
        for id in namespaced {
            let keys: Vec<(ObjKey, Arc<Value>)> = self.objects[id]
                .iter()
                .filter(|((n, _), _)| *n == ns)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, v) in keys {
                self.delete_object(id, k, v);
            }
        }
        // The last removal inside the namespace removes the namespace (see commit_remove).
        match self.objects[kind].get(&key) {
            Some(still) if self.namespace_is_empty(&ns) => {
                let still = still.clone();
                Deleted::Removed(self.commit_remove(kind, &key, None).unwrap_or(still))
            }
            Some(still) => Deleted::Pending(still.clone()),
            None => Deleted::Removed(current),
        }
    }

    fn namespace_is_empty(&self, ns: &str) -> bool {
        self.objects
            .iter()
            .enumerate()
            .filter(|(id, _)| self.kind(*id).namespaced)
            .all(|(_, objs)| !objs.keys().any(|(n, _)| n == ns))
    }

    fn commit_put(
        &mut self,
        kind: KindId,
        key: ObjKey,
        mut obj: Value,
        etype: EventType,
    ) -> Arc<Value> {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let obj = Arc::new(obj);
        let prev = self.objects[kind].insert(key, obj.clone());
        self.record(kind, etype, obj.clone(), prev);
        obj
    }

    /// Removes an object; its last state is `last`, or what was stored.
    fn commit_remove(
        &mut self,
        kind: KindId,
        key: &ObjKey,
        last: Option<Value>,
    ) -> Option<Arc<Value>> {
        let prev = self.objects[kind].remove(key)?;
        self.rv += 1;
        let mut gone = last.unwrap_or_else(|| (*prev).clone());
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let gone = Arc::new(gone);
        self.record(kind, EventType::Deleted, gone.clone(), Some(prev));
        if self.kind(kind).namespaced {
            let ns = &key.0;
            let terminating = self.namespace_state(ns).is_some_and(|n| being_deleted(n));
            if terminating
                && self.namespace_is_empty(ns)
                && let Some(nk) = self.registry.core("namespaces")
            {
                self.commit_remove(nk, &(String::new(), ns.clone()), None);
            }
        }
        Some(gone)
    }

    fn record(
        &mut self,
        kind: KindId,
        etype: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let ev = Arc::new(WatchEvent::new(kind, etype, self.rv, object, prev));
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.history_floor = old.rv;
            }
        }
        // A watcher that cannot keep up is closed, as the real server does; its
        // client re-watches from the last resourceVersion it saw.
        self.watchers[kind].retain(|w| w.tx.try_send(ev.clone()).is_ok());
    }

    /// Registers a watch on one kind.
    pub fn watch(&mut self, kind: KindId, from: WatchFrom) -> Result<WatchStart, ApiError> {
        let (initial, after) = match from {
            WatchFrom::Current => {
                let initial = self.objects[kind]
                    .values()
                    .map(|o| {
                        Arc::new(WatchEvent::new(
                            kind,
                            EventType::Added,
                            resource_version_of(o),
                            o.clone(),
                            None,
                        ))
                    })
                    .collect();
                (initial, self.rv)
            }
            WatchFrom::After(rv) => {
                if rv < self.history_floor {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        self.history_floor + 1
                    )));
                }
                let initial = self
                    .history
                    .iter()
                    .filter(|e| e.rv > rv && e.kind == kind)
                    .cloned()
                    .collect();
                (initial, rv.max(self.rv))
            }
        };
        let (tx, events) = mpsc::channel(self.watch_buffer);
        self.watchers[kind].push(Watcher { tx });
        Ok(WatchStart {
            initial,
            events,
            after,
        })
    }

    /// Ends open watches (of one kind, or all): their streams finish after the buffered events.
    pub fn close_watches(&mut self, kind: Option<KindId>) {
        for (id, ws) in self.watchers.iter_mut().enumerate() {
            if kind.is_none_or(|k| k == id) {
                ws.clear();
            }
        }
    }

    /// Forgets the event history, as an etcd compaction does: watches and
    /// continue tokens from before now get `410 Gone`.
    pub fn compact(&mut self) {
        self.history.clear();
        self.history_floor = self.rv;
    }
}

#[cfg(test)]
mod tests;
