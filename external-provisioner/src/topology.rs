//! The accessibility requirements of a CreateVolume call, computed as upstream computes them
//! from the StorageClass's allowedTopologies, the selected node, and the topology the driver
//! registered on the nodes (CSINode keys, Node labels).

use std::collections::{BTreeMap, HashMap};

use csi_proto::v1::{Topology, TopologyRequirement};

use crate::model::TopologySelectorTerm;

/// One topology segment: key/value pairs sorted by key.
pub type Term = Vec<(String, String)>;

/// What the cluster says about topology: per node, the keys the driver registered (CSINodes)
/// and the node's labels.
pub trait ClusterTopology {
    /// `None`: no CSINode of that name; `Some(empty)`: the driver is not registered there.
    fn keys_of(&self, node: &str) -> Option<Vec<String>>;
    fn labels_of(&self, node: &str) -> Option<&BTreeMap<String, String>>;
    /// Keys of any node where the driver registered some.
    fn any_keys(&self) -> Option<Vec<String>>;
    /// Every node's labels.
    fn all_labels(&self) -> Box<dyn Iterator<Item = &BTreeMap<String, String>> + '_>;
}

/// A cluster's nodes as plain maps, for computing requirements without the watch-fed index
/// (tests, fuzzing). [`NodeMaps::EMPTY`] has no nodes: topology then comes from
/// allowedTopologies alone.
#[derive(Clone, Debug, Default)]
pub struct NodeMaps {
    /// Node name → the topology keys its CSINode lists for the driver.
    pub keys: BTreeMap<String, Vec<String>>,
    /// Node name → its labels.
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl NodeMaps {
    pub const EMPTY: NodeMaps = NodeMaps {
        keys: BTreeMap::new(),
        labels: BTreeMap::new(),
    };

    /// Adds a node with its CSINode's topology keys and its labels.
    pub fn with_node(mut self, name: &str, keys: &[&str], labels: &[(&str, &str)]) -> Self {
        self.keys
            .insert(name.into(), keys.iter().map(|k| k.to_string()).collect());
        self.labels.insert(
            name.into(),
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self
    }
}

impl ClusterTopology for NodeMaps {
    fn keys_of(&self, node: &str) -> Option<Vec<String>> {
        self.keys.get(node).cloned()
    }
    fn labels_of(&self, node: &str) -> Option<&BTreeMap<String, String>> {
        self.labels.get(node)
    }
    fn any_keys(&self) -> Option<Vec<String>> {
        self.keys.values().find(|k| !k.is_empty()).cloned()
    }
    fn all_labels(&self) -> Box<dyn Iterator<Item = &BTreeMap<String, String>> + '_> {
        Box::new(self.labels.values())
    }
}

/// The requirements, or why none could be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The selected node's Node or CSINode does not exist: the scheduler should pick another.
    #[error("{0}")]
    NotFound(String),
    #[error("error generating accessibility requirements: {0}")]
    Other(String),
}

/// What a requirement is computed from.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub claim_name: &'a str,
    pub allowed: &'a [TopologySelectorTerm],
    pub selected_node: Option<&'a str>,
    pub strict: bool,
    pub immediate: bool,
}

fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

fn go_term(term: &Term) -> String {
    let parts: Vec<String> = term.iter().map(|(k, v)| format!("{{{k} {v}}}")).collect();
    format!("[{}]", parts.join(" "))
}

fn go_map(map: &BTreeMap<String, String>) -> String {
    let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", parts.join(" "))
}

/// The segment of `labels` for `keys`; `None` when a key is missing.
fn term_of(labels: &BTreeMap<String, String>, keys: &[String]) -> Option<Term> {
    let mut term: Term = keys
        .iter()
        .map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
        .collect::<Option<_>>()?;
    term.sort();
    Some(term)
}

/// The most segments allowedTopologies may expand to. A term expands to the product of its
/// expressions' value counts, so a class with a dozen expressions of a few values each would
/// expand to millions of segments, costing the provisioner seconds and gigabytes per claim;
/// no driver could take such a request anyway (gRPC's default limit is 4 MiB).
pub const MAX_ALLOWED_SEGMENTS: usize = 10_000;

/// An upper bound of `flatten(allowed).len()`, without expanding.
pub fn flattened_len(allowed: &[TopologySelectorTerm]) -> usize {
    allowed
        .iter()
        .map(|term| {
            term.iter()
                .map(|(_, values)| values.len().max(1))
                .fold(1usize, usize::saturating_mul)
        })
        .fold(0usize, usize::saturating_add)
}

/// Distributes each allowedTopologies term's OR of values over its AND of keys.
pub fn flatten(allowed: &[TopologySelectorTerm]) -> Vec<Term> {
    let mut out = Vec::new();
    for selector in allowed {
        let mut terms: Vec<Term> = Vec::new();
        for (key, values) in selector {
            let mut next = Vec::new();
            for value in values {
                if terms.is_empty() {
                    next.push(vec![(key.clone(), value.clone())]);
                } else {
                    for old in &terms {
                        let mut term = old.clone();
                        term.push((key.clone(), value.clone()));
                        next.push(term);
                    }
                }
            }
            terms = next;
        }
        out.extend(terms);
    }
    for term in &mut out {
        term.sort();
    }
    out
}

/// Whether every pair of `small` is in `big` (both sorted by key).
fn subset(small: &Term, big: &Term) -> bool {
    small.iter().all(|pair| big.contains(pair))
}

fn compare(a: &Term, b: &Term) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// FNV-1 (32 bit), as Go's `hash/fnv.New32`.
fn fnv1_32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |hash, b| {
        hash.wrapping_mul(0x0100_0193) ^ u32::from(*b)
    })
}

/// The spreading offset of a claim name: the hash of the StatefulSet name plus the ordinal, as
/// in-tree volume plugins spread StatefulSet volumes.
pub fn spread_offset(claim_name: &str) -> u32 {
    let mut hashed = claim_name;
    let mut index = 0u32;
    if let Some(dash) = claim_name.rfind('-')
        && let Ok(ordinal) = claim_name[dash + 1..].parse::<u32>()
        && !claim_name[dash + 1..].starts_with('+')
    {
        index = ordinal;
        hashed = &claim_name[..dash];
        if let Some(dash) = hashed.rfind('-') {
            hashed = &hashed[dash + 1..];
        }
    }
    fnv1_32(hashed.as_bytes()).wrapping_add(index)
}

fn to_csi(terms: &[Term]) -> Vec<Topology> {
    terms
        .iter()
        .filter(|t| !t.is_empty())
        .map(|t| Topology {
            segments: t.iter().cloned().collect::<HashMap<_, _>>(),
        })
        .collect()
}

/// The accessibility requirements of a claim's volume; `Ok(None)` when there are none to give.
pub fn requirements(
    request: Request<'_>,
    cluster: &dyn ClusterTopology,
) -> Result<Option<TopologyRequirement>, TopologyError> {
    let other = |m: String| TopologyError::Other(m);
    let size = flattened_len(request.allowed);
    if size > MAX_ALLOWED_SEGMENTS {
        return Err(other(format!(
            "allowedTopologies expand to {size} topology segments, more than the {MAX_ALLOWED_SEGMENTS} supported"
        )));
    }
    let mut requisite: Vec<Term> = Vec::new();
    let mut selected_term: Term = Vec::new();
    let mut keys: Vec<String> = Vec::new();

    if let Some(node) = request.selected_node {
        keys = cluster.keys_of(node).ok_or_else(|| {
            TopologyError::NotFound(format!("csinode.storage.k8s.io \"{node}\" not found"))
        })?;
        if keys.is_empty() {
            return Err(other(format!("no topology key found for node {node}")));
        }
        let labels = cluster
            .labels_of(node)
            .ok_or_else(|| TopologyError::NotFound(format!("node \"{node}\" not found")))?;
        selected_term = term_of(labels, &keys).ok_or_else(|| {
            other(format!(
                "topology labels from selected node {} does not match topology keys from CSINode {}",
                go_map(labels),
                go_list(&keys)
            ))
        })?;
        if request.strict {
            if !request.allowed.is_empty() {
                let allowed = flatten(request.allowed);
                if !allowed.iter().any(|t| subset(t, &selected_term)) {
                    let list: Vec<String> = allowed.iter().map(go_term).collect();
                    return Err(other(format!(
                        "selected node '\"{node}\"' topology '{}' is not in allowed topologies: {}",
                        go_term(&selected_term),
                        go_list(&list)
                    )));
                }
            }
            requisite.push(selected_term.clone());
        }
    }

    if requisite.is_empty() {
        if !request.allowed.is_empty() {
            requisite = flatten(request.allowed);
        } else {
            if request.selected_node.is_none() && !request.immediate {
                return Ok(None);
            }
            if request.selected_node.is_none() {
                match cluster.any_keys() {
                    Some(found) => keys = found,
                    None => {
                        tracing::warn!("No topology keys found on any node");
                        return Err(other("no available topology found".into()));
                    }
                }
            }
            requisite = cluster
                .all_labels()
                .filter_map(|labels| term_of(labels, &keys))
                .collect();
            if requisite.is_empty() {
                return Err(other(format!(
                    "topologyKeys {} were not found on any nodes",
                    go_list(&keys)
                )));
            }
        }
    }

    requisite.sort_by(compare);
    requisite.dedup();
    if requisite.iter().all(Vec::is_empty) {
        return Ok(None);
    }

    let preferred: Vec<Term> = match request.selected_node {
        None => {
            let shift = spread_offset(request.claim_name) as usize % requisite.len();
            let mut rotated = requisite.clone();
            rotated.rotate_left(shift);
            rotated
        }
        Some(_) if request.strict => requisite.clone(),
        Some(node) => {
            let start = requisite
                .iter()
                .position(|t| subset(t, &selected_term))
                .ok_or_else(|| {
                    let list: Vec<String> = requisite.iter().map(go_term).collect();
                    other(format!(
                        "topology {} from selected node \"{node}\" is not in requisite: {}",
                        go_term(&selected_term),
                        go_list(&list)
                    ))
                })?;
            let mut rotated = requisite.clone();
            rotated.rotate_left(start);
            rotated
        }
    };
    Ok(Some(TopologyRequirement {
        requisite: to_csi(&requisite),
        preferred: to_csi(&preferred),
    }))
}

/// Whether a PV with `affinity` is accessible from a node whose driver reports `topology`
/// (upstream's `VolumeIsAccessible`): no topology on either side means accessible; otherwise
/// one of the affinity's terms must match the topology taken as the node's labels.
pub fn volume_is_accessible(
    affinity: Option<&k8s_openapi::api::core::v1::VolumeNodeAffinity>,
    topology: Option<&BTreeMap<String, String>>,
) -> bool {
    let (Some(topology), Some(required)) = (topology, affinity.and_then(|a| a.required.as_ref()))
    else {
        return true;
    };
    required.node_selector_terms.iter().any(|term| {
        // A term with no requirements matches nothing, as Kubernetes' node selector does.
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        !expressions.is_empty()
            && expressions.iter().all(|e| {
                let value = topology.get(&e.key);
                let values = e.values.as_deref().unwrap_or_default();
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    "Gt" | "Lt" => {
                        let parse = |s: &str| s.parse::<i64>().ok();
                        match (
                            value.and_then(|v| parse(v)),
                            values.first().and_then(|v| parse(v)),
                        ) {
                            (Some(v), Some(bound)) if e.operator == "Gt" => v > bound,
                            (Some(v), Some(bound)) => v < bound,
                            _ => false,
                        }
                    }
                    _ => false,
                }
            })
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn allowed_topologies_that_expand_to_too_many_segments_are_refused() {
        // 4^12 = 16 777 216 segments: expanding them took seconds and gigabytes.
        let term: TopologySelectorTerm = (0..12)
            .map(|k| (format!("k{k}"), (0..4).map(|v| v.to_string()).collect()))
            .collect();
        assert_eq!(flattened_len(std::slice::from_ref(&term)), 1 << 24);
        let request = |allowed| Request {
            claim_name: "c",
            allowed,
            selected_node: None,
            strict: false,
            immediate: true,
        };
        let err = requirements(request(std::slice::from_ref(&term)), &NodeMaps::EMPTY).unwrap_err();
        assert!(
            err.to_string().contains("16777216 topology segments"),
            "{err}"
        );
        let small: Vec<TopologySelectorTerm> = vec![term[..6].to_vec()];
        assert_eq!(flattened_len(&small), 4096);
        let answer = requirements(request(&small), &NodeMaps::EMPTY)
            .unwrap()
            .unwrap();
        assert_eq!(answer.requisite.len(), 4096);
    }

    #[test]
    fn volumes_are_accessible_where_their_affinity_matches() {
        let affinity: k8s_openapi::api::core::v1::VolumeNodeAffinity =
            serde_json::from_value(serde_json::json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                      {"key": "rack", "operator": "Exists"}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
            ]}}))
            .unwrap();
        let node = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(volume_is_accessible(
            Some(&affinity),
            Some(&node(&[("zone", "a"), ("rack", "1")]))
        ));
        assert!(!volume_is_accessible(
            Some(&affinity),
            Some(&node(&[("zone", "a")]))
        ));
        assert!(volume_is_accessible(
            Some(&affinity),
            Some(&node(&[("zone", "b")]))
        ));
        assert!(!volume_is_accessible(
            Some(&affinity),
            Some(&node(&[("zone", "c")]))
        ));
        assert!(
            volume_is_accessible(Some(&affinity), None),
            "a node without topology"
        );
        assert!(
            volume_is_accessible(None, Some(&node(&[("zone", "c")]))),
            "a volume without affinity"
        );
        let numeric: k8s_openapi::api::core::v1::VolumeNodeAffinity =
            serde_json::from_value(serde_json::json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["3"]},
                                      {"key": "x", "operator": "DoesNotExist"}]}
            ]}}))
            .unwrap();
        assert!(volume_is_accessible(
            Some(&numeric),
            Some(&node(&[("n", "4")]))
        ));
        assert!(!volume_is_accessible(
            Some(&numeric),
            Some(&node(&[("n", "3")]))
        ));
        assert!(!volume_is_accessible(
            Some(&numeric),
            Some(&node(&[("n", "4"), ("x", "")]))
        ));
    }

    use super::*;

    fn zones() -> NodeMaps {
        NodeMaps::default()
            .with_node("n1", &["zone"], &[("zone", "a"), ("other", "x")])
            .with_node("n2", &["zone"], &[("zone", "b")])
            .with_node("n3", &["zone"], &[("zone", "c")])
            .with_node("n4", &[], &[("zone", "a")])
            .with_node("nolabel", &["zone"], &[])
    }

    fn segs(topologies: &[Topology]) -> Vec<String> {
        topologies
            .iter()
            .map(|t| t.segments.get("zone").cloned().unwrap_or_default())
            .collect()
    }

    fn request<'a>(selected: Option<&'a str>, allowed: &'a [TopologySelectorTerm]) -> Request<'a> {
        Request {
            claim_name: "data-web-1",
            allowed,
            selected_node: selected,
            strict: false,
            immediate: true,
        }
    }

    #[test]
    fn late_binding_prefers_the_selected_node() {
        let r = requirements(request(Some("n2"), &[]), &zones())
            .unwrap()
            .unwrap();
        assert_eq!(segs(&r.requisite), ["a", "b", "c"]);
        assert_eq!(segs(&r.preferred), ["b", "c", "a"]);
    }

    #[test]
    fn strict_topology_gives_only_the_selected_node() {
        let strict = Request {
            strict: true,
            ..request(Some("n3"), &[])
        };
        let r = requirements(strict, &zones()).unwrap().unwrap();
        assert_eq!(segs(&r.requisite), ["c"]);
        assert_eq!(segs(&r.preferred), ["c"]);
        let allowed = vec![vec![("zone".to_string(), vec!["a".to_string()])]];
        let refused = Request {
            strict: true,
            ..request(Some("n3"), &allowed)
        };
        let err = requirements(refused, &zones()).unwrap_err();
        assert!(
            err.to_string().contains("is not in allowed topologies"),
            "{err}"
        );
    }

    #[test]
    fn allowed_topologies_are_flattened() {
        let allowed = vec![vec![
            ("zone".to_string(), vec!["a".to_string(), "b".to_string()]),
            ("rack".to_string(), vec!["r1".to_string(), "r2".to_string()]),
        ]];
        let flat = flatten(&allowed);
        assert_eq!(flat.len(), 4);
        assert!(flat.iter().all(|t| t[0].0 == "rack" && t[1].0 == "zone"));
        let r = requirements(request(None, &allowed), &zones())
            .unwrap()
            .unwrap();
        assert_eq!(r.requisite.len(), 4);
    }

    #[test]
    fn immediate_binding_aggregates_and_spreads() {
        let r = requirements(request(None, &[]), &zones()).unwrap().unwrap();
        assert_eq!(segs(&r.requisite), ["a", "b", "c"]);
        // Consecutive ordinals of one StatefulSet start in consecutive zones.
        let first = |name: &str| {
            let r = requirements(
                Request {
                    claim_name: name,
                    ..request(None, &[])
                },
                &zones(),
            )
            .unwrap()
            .unwrap();
            segs(&r.preferred)[0].clone()
        };
        let (a, b, c) = (
            first("data-web-0"),
            first("data-web-1"),
            first("data-web-2"),
        );
        assert!(a != b && b != c && a != c, "{a} {b} {c}");
        assert_eq!(first("data-web-3"), a);
        let off = Request {
            immediate: false,
            ..request(None, &[])
        };
        assert_eq!(requirements(off, &zones()), Ok(None));
    }

    #[test]
    fn missing_objects() {
        assert!(matches!(
            requirements(request(Some("gone"), &[]), &zones()),
            Err(TopologyError::NotFound(_))
        ));
        assert_eq!(
            requirements(request(Some("n4"), &[]), &zones())
                .unwrap_err()
                .to_string(),
            "error generating accessibility requirements: no topology key found for node n4"
        );
        assert!(
            requirements(request(Some("nolabel"), &[]), &zones())
                .unwrap_err()
                .to_string()
                .contains("does not match topology keys from CSINode [zone]")
        );
        assert_eq!(
            requirements(request(None, &[]), &NodeMaps::default())
                .unwrap_err()
                .to_string(),
            "error generating accessibility requirements: no available topology found"
        );
    }

    #[test]
    fn fnv1_matches_go() {
        // hash/fnv New32 of "" and "a".
        assert_eq!(fnv1_32(b""), 0x811c9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c5d7e);
    }
}
