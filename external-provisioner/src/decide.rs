//! Pure decisions: which claims to provision, the CreateVolume request, the PersistentVolume to
//! write, how a failed call is classified, and what to do with a PersistentVolume. No I/O.

use std::collections::{BTreeMap, HashMap};

use csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_proto::v1::{
    CapacityRange, CreateVolumeRequest, DeleteVolumeRequest, Volume as CsiVolume, VolumeCapability,
    VolumeContentSource,
};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeSpec, SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use tonic::Code;

use sidecar_kit::migration::{
    TopologyRequirement, TopologyTerm, translate_csi_pv_to_in_tree, translate_in_tree_storage_class,
};

use crate::model::{self, Claim, ClaimSpec, Class, SecretRef, Volume};
use crate::params::{self, TemplateInputs};
use crate::sources::{AttributesClass, SourceError};
use crate::topology::{self, ClusterTopology, TopologyError};

/// What the driver can do, from GetPluginCapabilities and ControllerGetCapabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub controller_service: bool,
    pub accessibility_constraints: bool,
    pub create_delete_volume: bool,
    pub create_delete_snapshot: bool,
    pub clone_volume: bool,
    pub modify_volume: bool,
    pub publish_unpublish: bool,
    pub single_node_multi_writer: bool,
}

/// Everything the decisions depend on besides the objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub driver: String,
    /// The provisioner identity written into every PV's volume attributes.
    pub identity: String,
    pub caps: Capabilities,
    /// Topology is used: the driver has VOLUME_ACCESSIBILITY_CONSTRAINTS and the gate is on.
    pub topology: bool,
    pub strict_topology: bool,
    pub immediate_topology: bool,
    pub volume_name_prefix: String,
    pub volume_name_uuid_length: i32,
    pub default_fstype: String,
    pub extra_create_metadata: bool,
    pub controller_publish_readonly: bool,
    /// `--prevent-volume-mode-conversion`.
    pub prevent_volume_mode_conversion: bool,
    /// The CrossNamespaceVolumeDataSource gate.
    pub cross_namespace_sources: bool,
    /// The VolumeAttributesClass gate, after start-up turned it off on clusters without the API.
    pub attributes_classes: bool,
    /// Distributed provisioning (`--node-deployment`): the node this provisioner serves.
    pub node: Option<NodePolicy>,
}

/// Distributed provisioning: a provisioner on each node provisions the claims of its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePolicy {
    pub name: String,
    /// The driver's topology segment on this node (NodeGetInfo); `None` without topology.
    pub topology: Option<BTreeMap<String, String>>,
    /// Claims of Immediate classes are claimed by setting their selected node to this one.
    pub immediate_binding: bool,
}

/// How long a node waits before trying to claim an Immediate claim, after `attempts` earlier
/// tries: exponential from `base` up to `max`, less a random part (`random` in 0..1) of `base`,
/// so that the nodes do not all try at once (upstream's jittered rate limiter).
pub fn owner_delay(
    base: std::time::Duration,
    max: std::time::Duration,
    attempts: u32,
    random: f64,
) -> std::time::Duration {
    let exponential = base
        .checked_mul(2u32.saturating_pow(attempts))
        .unwrap_or(max)
        .min(max);
    let jitter = base.mul_f64(random.clamp(0.0, 1.0));
    exponential.saturating_sub(jitter)
}

/// How a provisioning attempt ended, as upstream's `ProvisioningState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not in progress: the next attempt starts over.
    Finished,
    /// The driver may still be creating the volume: repeat the identical call until it answers
    /// for sure, even if the claim is deleted meanwhile.
    InBackground,
    /// Give up for now and ask the scheduler for another node.
    Reschedule,
    /// Nothing changed: retry later.
    NoChange,
    /// Not for us after all (a volume populator fills the claim): stop without retrying.
    Ignored,
    /// The data source is not usable yet and a watch on it says when it changes: report once,
    /// then wait for the change instead of retrying.
    Wait,
}

/// A failed attempt: its state, its message, and whether it is "infeasible" (slow retries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub state: State,
    pub message: String,
    pub infeasible: bool,
}

impl Failure {
    pub fn new(state: State, message: impl Into<String>) -> Self {
        Self {
            state,
            message: message.into(),
            infeasible: false,
        }
    }
}

/// Why a claim is not provisioned by us (logged at debug level, no Event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    Bound,
    NotOurs,
    WaitingForNode,
    NoClass,
    VolumeExists,
    /// Distributed provisioning: another node's claim.
    OtherNode,
    /// Distributed provisioning: an Immediate claim no node has claimed yet; this one may.
    Unowned,
}

/// The volume name of a claim: `<prefix>-<uid>`, or the UID without dashes cut to `length`.
pub fn volume_name(prefix: &str, uid: &str, length: i32) -> Result<String, String> {
    if prefix.is_empty() {
        return Err("volume name prefix cannot be of length 0".into());
    }
    if uid.is_empty() {
        return Err("corrupted PVC object, it is missing UID".into());
    }
    Ok(sidecar_kit::values::names::uid_name(prefix, uid, length))
}

/// Whether the claim is one to provision now (upstream's `shouldProvision` and the checks that
/// precede `Provision`). `class` is the claim's StorageClass if it exists.
pub fn should_provision(
    policy: &Policy,
    claim: &Claim,
    class: Option<&Class>,
    volume_exists: bool,
) -> Result<(), Skip> {
    if claim.pending.is_none() {
        return Err(Skip::Bound);
    }
    let announced = claim.provisioner();
    let migrated = claim.annotation(model::ANN_MIGRATED_TO);
    if announced != Some(policy.driver.as_str()) && migrated != Some(policy.driver.as_str()) {
        return Err(Skip::NotOurs);
    }
    let Some(class) = class else {
        return Err(Skip::NoClass);
    };
    if let Some(node) = &policy.node {
        match claim.selected_node() {
            Some(selected) if selected == node.name => {}
            Some(_) => return Err(Skip::OtherNode),
            None if !class.wait_for_first_consumer && node.immediate_binding => {
                return Err(Skip::Unowned);
            }
            None => return Err(Skip::WaitingForNode),
        }
    }
    if class.wait_for_first_consumer && claim.selected_node().is_none() {
        return Err(Skip::WaitingForNode);
    }
    if volume_exists {
        return Err(Skip::VolumeExists);
    }
    Ok(())
}

/// What a prepared provisioning carries to the call and to the PV.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    /// The request, without secret values.
    #[serde(with = "request_bytes")]
    pub request: CreateVolumeRequest,
    /// Where the CreateVolume secrets come from.
    pub provisioner_secret: Option<SecretRef>,
    pub pv: PvTemplate,
    /// The `source` label of the provisioning metrics: the data source kind, or empty.
    pub source: String,
    /// The class names the in-tree plugin the driver replaces (CSI migration): the calls are
    /// labelled `migrated` and the PV is written with the in-tree source.
    #[serde(default)]
    pub migrated: bool,
}

/// A StorageClass as the driver sees it: translated to CSI when its provisioner is the in-tree
/// plugin the driver replaces (CSI migration), as is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverClass {
    pub class: Class,
    pub migrated: bool,
}

/// The class `class` is for the driver (upstream translates in-tree classes before anything
/// else reads them).
pub fn driver_class(policy: &Policy, class: &Class) -> Result<DriverClass, Failure> {
    let in_tree = sidecar_kit::migration::in_tree_name_of(&policy.driver);
    if in_tree != Some(class.provisioner.as_str()) {
        return Ok(DriverClass {
            class: class.clone(),
            migrated: false,
        });
    }
    let terms: Vec<TopologyTerm> = class
        .allowed_topologies
        .iter()
        .map(|term| {
            term.iter()
                .map(|(key, values)| TopologyRequirement {
                    key: key.clone(),
                    values: values.clone(),
                })
                .collect()
        })
        .collect();
    let translated = translate_in_tree_storage_class(&class.provisioner, &class.parameters, &terms)
        .map_err(|e| {
            Failure::new(
                State::Finished,
                format!("failed to translate storage class: {e}"),
            )
        })?;
    Ok(DriverClass {
        class: Class {
            provisioner: translated.provisioner,
            parameters: translated.parameters,
            allowed_topologies: translated
                .allowed_topologies
                .into_iter()
                .map(|term| term.into_iter().map(|r| (r.key, r.values)).collect())
                .collect(),
            ..class.clone()
        },
        migrated: true,
    })
}

/// The parts of the PersistentVolume known before CreateVolume answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PvTemplate {
    pub name: String,
    pub claim_ref: ObjectReference,
    pub storage_class: String,
    pub provisioned_by: String,
    pub reclaim_policy: String,
    pub mount_options: Vec<String>,
    pub access_modes: Vec<String>,
    pub volume_mode: Option<String>,
    pub block: bool,
    pub fs_type: String,
    pub read_only: bool,
    pub controller_publish_secret: Option<SecretRef>,
    pub node_stage_secret: Option<SecretRef>,
    pub node_publish_secret: Option<SecretRef>,
    pub controller_expand_secret: Option<SecretRef>,
    pub node_expand_secret: Option<SecretRef>,
    pub modify_secret: Option<SecretRef>,
    pub deletion_secret: Option<SecretRef>,
    #[serde(default)]
    pub volume_attributes_class: Option<String>,
}

/// What [`prepare`] needs that the controller looks up outside the index.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lookups {
    /// The content source of the claim's snapshot or claim to fill from, or why it cannot be
    /// used (`None`: nothing to fill from).
    pub content: Option<Result<VolumeContentSource, SourceError>>,
    /// A watch reports changes of the source: a source that is not ready is waited for.
    pub source_watched: bool,
    /// For a source in another namespace: whether a ReferenceGrant allows it, or the message
    /// saying why not.
    pub grant: Option<Result<(), String>>,
    /// The claim's VolumeAttributesClass, or the error getting it.
    pub attributes_class: Option<Result<AttributesClass, String>>,
}

/// Checks a claim and builds its CreateVolume request (upstream's `prepareProvision`).
pub fn prepare(
    policy: &Policy,
    claim: &Claim,
    class: &Class,
    cluster: &dyn ClusterTopology,
    lookups: &Lookups,
) -> Result<Prepared, Failure> {
    let finished = |m: String| Failure::new(State::Finished, m);
    let no_change = |m: String| Failure::new(State::NoChange, m);
    let Some(spec) = claim.pending.as_deref() else {
        return Err(finished("claim is already bound".into()));
    };
    if let Some(source) = &spec.data_source
        && source.namespace.is_some()
    {
        if !policy.cross_namespace_sources {
            return Err(finished(
                "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled".into(),
            ));
        }
        if let Some(Err(message)) = &lookups.grant {
            return Err(finished(message.clone()));
        }
    }
    let own_class = class;
    let DriverClass {
        class: translated,
        migrated,
    } = driver_class(policy, class)?;
    let class = &translated;
    let needs = data_source_needs(claim, spec)?;
    let attributes_class = spec
        .volume_attributes_class
        .as_ref()
        .filter(|_| policy.attributes_classes);
    check_capabilities(&policy.caps, needs, attributes_class.is_some())?;
    // The `source` label of the metrics, as upstream takes it: `spec.dataSource` only.
    let source = spec
        .data_source
        .as_ref()
        .filter(|s| !s.from_ref)
        .map(|s| s.kind.clone())
        .unwrap_or_default();
    if spec.has_selector {
        return Err(finished("claim Selector is not supported".into()));
    }
    let pv_name = volume_name(
        &policy.volume_name_prefix,
        &claim.uid,
        policy.volume_name_uuid_length,
    )
    .map_err(finished)?;
    let (fs_type, deprecated_fstype) =
        params::fs_type(&class.parameters, &policy.default_fstype).map_err(finished)?;
    if deprecated_fstype {
        tracing::warn!(
            "\"fstype\" is deprecated and will be removed in a future release, please use \"{}\" instead",
            params::FSTYPE_KEY
        );
    }
    for key in params::deprecated_keys(&class.parameters) {
        tracing::warn!(storage_class = %class.name, "\"{key}\" is deprecated and will be removed in a future release");
    }
    let required = required_bytes(claim)?;
    let capabilities = volume_capabilities(policy, spec, class, &fs_type).map_err(finished)?;
    let content_source = match (&needs, &lookups.content) {
        (Needs::Nothing, _) | (_, None) => None,
        (_, Some(Ok(content))) => Some(content.clone()),
        (_, Some(Err(error))) => {
            let state = if error.may_change && lookups.source_watched {
                State::Wait
            } else {
                State::NoChange
            };
            let message = spec
                .data_source
                .as_ref()
                .map(|s| crate::sources::wrap(s, &error.message))
                .unwrap_or_else(|| error.message.clone());
            return Err(Failure::new(state, message));
        }
    };

    let accessibility = if policy.topology {
        let request = topology::Request {
            claim_name: &claim.name,
            allowed: &class.allowed_topologies,
            selected_node: claim.selected_node(),
            strict: policy.strict_topology,
            immediate: policy.immediate_topology,
        };
        match topology::requirements(request, cluster) {
            Ok(r) => r,
            Err(TopologyError::NotFound(m)) => return Err(Failure::new(State::Reschedule, m)),
            Err(e) => return Err(no_change(e.to_string())),
        }
    } else {
        None
    };

    let inputs = TemplateInputs {
        pv_name: &pv_name,
        claim: Some((&claim.namespace, &claim.name)),
        claim_annotations: Some(&spec.annotations),
    };
    let secret = |kind| params::secret_ref(kind, &class.parameters, &inputs).map_err(no_change);
    let provisioner_secret = secret(&params::PROVISIONER_SECRET)?;
    let controller_publish_secret = secret(&params::CONTROLLER_PUBLISH_SECRET)?;
    let node_stage_secret = secret(&params::NODE_STAGE_SECRET)?;
    let node_publish_secret = secret(&params::NODE_PUBLISH_SECRET)?;
    let controller_expand_secret = secret(&params::CONTROLLER_EXPAND_SECRET)?;
    let node_expand_secret = secret(&params::NODE_EXPAND_SECRET)?;
    let modify_secret = secret(&params::CONTROLLER_MODIFY_SECRET)?;

    let mut parameters = params::driver_parameters(&class.parameters).map_err(finished)?;
    if policy.extra_create_metadata {
        parameters.insert(params::PVC_NAME_KEY.into(), claim.name.clone());
        parameters.insert(
            params::PVC_NAMESPACE_KEY.into(),
            claim.namespace.to_string(),
        );
        parameters.insert(params::PV_NAME_KEY.into(), pv_name.clone());
    }
    let mutable_parameters = match (attributes_class, &lookups.attributes_class) {
        (None, _) | (_, None) => HashMap::new(),
        (Some(_), Some(Err(message))) => return Err(no_change(message.clone())),
        (Some(name), Some(Ok(vac))) => {
            if vac.driver != policy.driver {
                return Err(finished(format!(
                    "VAC {name} referenced in PVC is for driver {} which does not match driver name {}",
                    vac.driver, policy.driver
                )));
            }
            vac.parameters.clone().into_iter().collect()
        }
    };
    let read_only = policy.controller_publish_readonly
        && capabilities.len() == 1
        && capabilities[0].access_mode.as_ref().map(|m| m.mode)
            == Some(
                csi_proto::v1::volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32,
            );

    let request = CreateVolumeRequest {
        name: pv_name.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: capabilities,
        parameters: parameters.into_iter().collect(),
        secrets: HashMap::new(),
        volume_content_source: content_source,
        accessibility_requirements: accessibility,
        mutable_parameters,
    };
    let pv = PvTemplate {
        name: pv_name,
        claim_ref: claim.object_ref(),
        storage_class: claim
            .storage_class
            .as_deref()
            .unwrap_or_default()
            .to_string(),
        // The class's own provisioner, in-tree for a migrated class, as upstream writes it.
        provisioned_by: own_class.provisioner.clone(),
        reclaim_policy: class.reclaim_policy.clone(),
        mount_options: class.mount_options.clone(),
        access_modes: spec.access_modes.clone(),
        volume_mode: spec.volume_mode.clone(),
        block: spec.block,
        fs_type,
        read_only,
        controller_publish_secret,
        node_stage_secret,
        node_publish_secret,
        controller_expand_secret,
        node_expand_secret,
        modify_secret,
        deletion_secret: provisioner_secret.clone(),
        volume_attributes_class: attributes_class.cloned(),
    };
    Ok(Prepared {
        request,
        provisioner_secret,
        pv,
        source,
        migrated,
    })
}

/// What a claim's data source asks of the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    Nothing,
    Restore,
    Clone,
}

/// What the claim's data source needs, or the failure of a source this provisioner does not
/// fill: other kinds belong to a volume populator.
fn data_source_needs(claim: &Claim, spec: &ClaimSpec) -> Result<Needs, Failure> {
    let Some(source) = &spec.data_source else {
        return Ok(Needs::Nothing);
    };
    if source.name.is_empty() {
        return Err(Failure::new(
            State::Finished,
            format!("the PVC source not found for PVC {}", claim.name),
        ));
    }
    match source.kind.as_str() {
        "VolumeSnapshot" if source.api_group != model::SNAPSHOT_GROUP => Err(Failure::new(
            State::Finished,
            format!(
                "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got {}",
                source.api_group
            ),
        )),
        "VolumeSnapshot" => Ok(Needs::Restore),
        "PersistentVolumeClaim" => Ok(Needs::Clone),
        _ => Err(Failure::new(State::Ignored, POPULATOR_MESSAGE)),
    }
}

/// The Normal event for claims whose data source belongs to a volume populator.
pub const POPULATOR_MESSAGE: &str = "Assuming an external populator will provision the volume";

fn check_capabilities(
    caps: &Capabilities,
    needs: Needs,
    attributes_class: bool,
) -> Result<(), Failure> {
    if !caps.controller_service {
        return Err(Failure::new(
            State::Finished,
            "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported",
        ));
    }
    if !caps.create_delete_volume {
        return Err(Failure::new(
            State::Finished,
            "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported",
        ));
    }
    if needs == Needs::Restore && !caps.create_delete_snapshot {
        return Err(Failure::new(
            State::Finished,
            "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported",
        ));
    }
    if needs == Needs::Clone && !caps.clone_volume {
        return Err(Failure::new(
            State::Finished,
            "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported",
        ));
    }
    if attributes_class && !caps.modify_volume {
        return Err(Failure::new(
            State::Finished,
            "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported",
        ));
    }
    Ok(())
}

/// The requested size in bytes. Kubernetes validates requests, but a claim written when the
/// rules were looser (or a real cluster's fuzzed object) must not crash us.
fn required_bytes(claim: &Claim) -> Result<i64, Failure> {
    let text = claim.request.as_deref().unwrap_or("0");
    let bytes = sidecar_kit::values::quantity::parse(text)
        .map_err(|e| Failure::new(State::Finished, format!("invalid storage request: {e}")))?;
    if bytes < 0 {
        return Err(Failure::new(
            State::Finished,
            format!("invalid storage request {text:?}: negative"),
        ));
    }
    i64::try_from(bytes).map_err(|_| {
        Failure::new(
            State::Finished,
            format!(
                "storage request {text:?} is larger than a volume can be ({} bytes)",
                i64::MAX
            ),
        )
    })
}

/// One capability per claim access mode: block or mount (fsType, class mount options).
fn volume_capabilities(
    policy: &Policy,
    spec: &ClaimSpec,
    class: &Class,
    fs_type: &str,
) -> Result<Vec<VolumeCapability>, String> {
    spec.access_modes
        .iter()
        .map(|mode| {
            let mode = sidecar_kit::values::accessmodes::to_csi(
                std::slice::from_ref(mode),
                policy.caps.single_node_multi_writer,
            )?;
            let access_type = if spec.block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: fs_type.to_string(),
                    mount_flags: class.mount_options.clone(),
                    volume_mount_group: String::new(),
                })
            };
            Ok(VolumeCapability {
                access_mode: Some(AccessMode { mode: mode as i32 }),
                access_type: Some(access_type),
            })
        })
        .collect()
}

/// How a failed CreateVolume is handled (upstream's `checkError`).
pub fn classify(code: Option<Code>, may_reschedule: bool) -> State {
    match code {
        None => State::InBackground,
        Some(Code::ResourceExhausted) if may_reschedule => State::Reschedule,
        Some(Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted) => {
            State::InBackground
        }
        Some(_) => State::Finished,
    }
}

/// What a CreateVolume answer means for the PV.
#[derive(Clone, Debug, PartialEq)]
pub enum Created {
    Pv(Box<PersistentVolume>),
    /// The volume is unusable and must be deleted before provisioning goes on.
    Undo {
        volume_id: String,
        message: String,
        reason: UndoReason,
    },
}

/// Why a created volume is deleted again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UndoReason {
    /// Smaller than requested.
    Capacity,
    /// Not filled from the data source it was asked to be filled from.
    ContentSource,
    /// Its PV cannot be written as the in-tree volume of a migrated class.
    Translation,
}

impl UndoReason {
    /// The message when deleting the volume failed too, in upstream's words for each reason.
    pub fn orphaned(self, message: &str, volume_name: &str, error: &str) -> String {
        let cleanup = match self {
            UndoReason::Capacity => "Cleanup",
            UndoReason::ContentSource => "cleanup",
            UndoReason::Translation => return message.to_string(),
        };
        format!("{message}. {cleanup} of volume {volume_name} failed, volume is orphaned: {error}")
    }

    /// How provisioning goes on once the volume is deleted again: a volume that came out
    /// wrong is created again; a translation that fails fails the same way next time.
    pub fn state_after_cleanup(self) -> State {
        match self {
            UndoReason::Capacity | UndoReason::ContentSource => State::InBackground,
            UndoReason::Translation => State::Finished,
        }
    }
}

/// The PersistentVolume of a created volume, or the reason to delete it again.
pub fn build_pv(policy: &Policy, prepared: &Prepared, volume: &CsiVolume) -> Created {
    let requested = prepared
        .request
        .capacity_range
        .as_ref()
        .map_or(0, |r| r.required_bytes);
    let capacity = if volume.capacity_bytes == 0 {
        requested
    } else if volume.capacity_bytes < requested {
        return Created::Undo {
            volume_id: volume.volume_id.clone(),
            message: format!(
                "created volume capacity {} less than requested capacity {requested}",
                volume.capacity_bytes
            ),
            reason: UndoReason::Capacity,
        };
    } else {
        volume.capacity_bytes
    };
    if prepared.request.volume_content_source.is_some() && volume.content_source.is_none() {
        return Created::Undo {
            volume_id: volume.volume_id.clone(),
            message: "volume content source missing".into(),
            reason: UndoReason::ContentSource,
        };
    }
    let t = &prepared.pv;
    let mut attributes: BTreeMap<String, String> = volume
        .volume_context
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    attributes.insert(model::PROVISIONER_ID_KEY.into(), policy.identity.clone());
    let secret = |r: &Option<SecretRef>| {
        r.as_ref().map(|r| SecretReference {
            name: Some(r.name.clone()),
            namespace: Some(r.namespace.clone()),
        })
    };
    let mut annotations = BTreeMap::new();
    annotations.insert(
        model::ANN_PROVISIONED_BY.to_string(),
        t.provisioned_by.clone(),
    );
    let (deletion_namespace, deletion_name) = t
        .deletion_secret
        .as_ref()
        .map_or((String::new(), String::new()), |r| {
            (r.namespace.clone(), r.name.clone())
        });
    annotations.insert(model::ANN_DELETION_SECRET_NAME.into(), deletion_name);
    annotations.insert(
        model::ANN_DELETION_SECRET_NAMESPACE.into(),
        deletion_namespace,
    );
    if let Some(modify) = &t.modify_secret {
        annotations.insert(model::ANN_MODIFY_SECRET_NAME.into(), modify.name.clone());
        annotations.insert(
            model::ANN_MODIFY_SECRET_NAMESPACE.into(),
            modify.namespace.clone(),
        );
    }
    let node_affinity = if policy.topology {
        node_affinity(&volume.accessible_topology)
    } else {
        None
    };
    let mut capacity_map = BTreeMap::new();
    capacity_map.insert(
        "storage".to_string(),
        Quantity(sidecar_kit::values::quantity::format_binary(capacity)),
    );
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(t.name.clone()),
            annotations: Some(annotations),
            finalizers: Some(vec![model::PV_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(t.access_modes.clone()),
            capacity: Some(capacity_map),
            claim_ref: Some(t.claim_ref.clone()),
            mount_options: (!t.mount_options.is_empty()).then(|| t.mount_options.clone()),
            persistent_volume_reclaim_policy: Some(t.reclaim_policy.clone()),
            storage_class_name: Some(t.storage_class.clone()),
            volume_mode: t.volume_mode.clone(),
            volume_attributes_class_name: t.volume_attributes_class.clone(),
            node_affinity,
            csi: Some(CSIPersistentVolumeSource {
                driver: policy.driver.clone(),
                volume_handle: volume.volume_id.clone(),
                volume_attributes: Some(attributes),
                fs_type: (!t.block)
                    .then(|| t.fs_type.clone())
                    .filter(|f| !f.is_empty()),
                read_only: t.read_only.then_some(true),
                controller_publish_secret_ref: secret(&t.controller_publish_secret),
                node_stage_secret_ref: secret(&t.node_stage_secret),
                node_publish_secret_ref: secret(&t.node_publish_secret),
                controller_expand_secret_ref: secret(&t.controller_expand_secret),
                node_expand_secret_ref: secret(&t.node_expand_secret),
            }),
            ..Default::default()
        }),
        status: None,
    };
    if prepared.migrated {
        return match translate_csi_pv_to_in_tree(&pv) {
            Ok(in_tree) => Created::Pv(Box::new(in_tree)),
            Err(e) => Created::Undo {
                volume_id: volume.volume_id.clone(),
                message: e.to_string(),
                reason: UndoReason::Translation,
            },
        };
    }
    Created::Pv(Box::new(pv))
}

/// One node selector term per accessible segment, each key `In` its single value.
fn node_affinity(topology: &[csi_proto::v1::Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = topology
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|t| {
            let sorted: BTreeMap<&String, &String> = t.segments.iter().collect();
            NodeSelectorTerm {
                match_expressions: Some(
                    sorted
                        .into_iter()
                        .map(|(k, v)| NodeSelectorRequirement {
                            key: k.clone(),
                            operator: "In".into(),
                            values: Some(vec![v.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    if topology.is_empty() {
        return None;
    }
    Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

/// What to do with a PersistentVolume of this driver.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumePlan {
    Nothing,
    AddFinalizer,
    RemoveFinalizer,
    /// DeleteVolume, then delete the PV, then drop the finalizer.
    Delete(DeletePlan),
    /// Refused: the message is the error to report.
    Refuse(String),
}

/// Where the secrets of a DeleteVolume come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletionSecret {
    None,
    /// From the PV's annotations.
    Annotated(SecretRef),
    /// Recomputed from the StorageClass (PVs written before the annotations existed).
    FromClass(Result<Option<SecretRef>, String>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct DeletePlan {
    pub request: DeleteVolumeRequest,
    pub secret: DeletionSecret,
    /// An in-tree volume deleted through the driver (CSI migration).
    pub migrated: bool,
}

/// The finalizer and deletion decisions for a PV (upstream's `syncVolume`). `attached_to` is the
/// node of a VolumeAttachment naming the PV, when the driver publishes volumes.
pub fn plan_volume(
    policy: &Policy,
    volume: &Volume,
    class: Option<&Class>,
    attached_to: Option<&str>,
) -> VolumePlan {
    // With distributed provisioning, each node manages the volumes accessible from it only.
    if !volume.owned_by(&policy.driver) || !volume.on_this_node {
        return VolumePlan::Nothing;
    }
    let delete_policy = volume.reclaim_policy == crate::model::RECLAIM_DELETE;
    if delete_policy && !volume.deleting && volume.phase == "Bound" && !volume.has_finalizer() {
        return VolumePlan::AddFinalizer;
    }
    if matches!(volume.reclaim_policy.as_str(), "Retain" | "Recycle") && volume.has_finalizer() {
        return VolumePlan::RemoveFinalizer;
    }
    let should_delete =
        (volume.has_finalizer() || !volume.deleting) && volume.phase == "Released" && delete_policy;
    if !should_delete {
        return VolumePlan::Nothing;
    }
    if let Some(error) = &volume.translation_error {
        return VolumePlan::Refuse(error.clone());
    }
    if volume.driver.is_empty() || volume.volume_handle.is_empty() {
        return VolumePlan::Refuse("invalid CSI PV".into());
    }
    if let Some(node) = attached_to {
        return VolumePlan::Refuse(format!(
            "persistentvolume {} is still attached to node {node}",
            volume.name
        ));
    }
    let secret = match &volume.deletion_secret {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            DeletionSecret::Annotated(SecretRef {
                namespace: namespace.clone(),
                name: name.clone(),
            })
        }
        Some(_) => DeletionSecret::None,
        None => match (class, &volume.claim) {
            (Some(class), Some((namespace, name))) => {
                let class = match driver_class(policy, class) {
                    Ok(translated) => translated.class,
                    Err(failure) => return VolumePlan::Refuse(failure.message),
                };
                let inputs = TemplateInputs {
                    pv_name: &volume.name,
                    claim: Some((namespace, name)),
                    claim_annotations: None,
                };
                DeletionSecret::FromClass(
                    params::secret_ref(&params::PROVISIONER_SECRET, &class.parameters, &inputs)
                        .map_err(|e| {
                            format!(
                                "failed to get secretreference for volume {}: {e}",
                                volume.name
                            )
                        }),
                )
            }
            _ => DeletionSecret::None,
        },
    };
    VolumePlan::Delete(DeletePlan {
        request: DeleteVolumeRequest {
            volume_id: volume.volume_handle.clone(),
            secrets: HashMap::new(),
        },
        secret,
        migrated: volume.migrated,
    })
}

/// A strategic merge patch that adds or removes only our finalizer, as upstream's does. It
/// carries no resourceVersion: the controller manager's pv-protection controller removes its own
/// finalizer from the same list right after the PV's deletion, and a guarded write would conflict
/// with it every time. The API server applies both edits to the list atomically.
pub fn finalizers_patch(add: bool) -> serde_json::Value {
    if add {
        serde_json::json!({"metadata": {"finalizers": [model::PV_FINALIZER]}})
    } else {
        serde_json::json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [model::PV_FINALIZER]}})
    }
}

/// Whether an existing PV is the one a replayed CreateVolume would have written.
pub fn same_volume(existing: &PersistentVolume, volume_id: &str) -> bool {
    existing
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|c| c.volume_handle == volume_id)
}

/// A CreateVolume request in the journal: its protobuf encoding in base64, so that every field
/// (present and future) survives unchanged.
mod request_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use csi_proto::v1::CreateVolumeRequest;
    use prost::Message;
    use serde::{Deserialize, Deserializer, Serializer, de};

    pub fn serialize<S: Serializer>(
        request: &CreateVolumeRequest,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(request.encode_to_vec()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CreateVolumeRequest, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = STANDARD.decode(text).map_err(de::Error::custom)?;
        CreateVolumeRequest::decode(bytes.as_slice()).map_err(de::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests;
