//! The accessibility requirements of a CreateVolume call, from a StorageClass's
//! allowedTopologies, the scheduler's selected node, and what CSINodes and Nodes report.
//!
//! Properties of every answer:
//! - requisite is non-empty, without empty or repeated segments, and preferred holds the same
//!   segments in another order;
//! - with allowedTopologies (and no strict selected node) every requisite segment is one of
//!   the class's flattened terms;
//! - strict topology with a selected node asks for exactly that node's segment; otherwise
//!   preferred starts with a segment the selected node is in;
//! - the StatefulSet spreading offset of `name-N` is the base's plus N.
//!
//! allowedTopologies terms have distinct keys and a bounded product of values, as API
//! validation and the size of real classes make them: the flattening is a cartesian product,
//! as upstream's.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use external_provisioner::topology::{
    NodeMaps, Request, Term, flatten, requirements, spread_offset,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct NodeInput {
    name: String,
    /// `None`: no CSINode; `Some(empty)`: the driver is not registered there.
    keys: Option<Vec<String>>,
    /// `None`: no Node object.
    labels: Option<Vec<(String, String)>>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    nodes: Vec<NodeInput>,
    allowed: Vec<Vec<(String, Vec<String>)>>,
    selected: Option<u8>,
    claim_name: String,
    ordinal: u16,
    strict: bool,
    immediate: bool,
}

type Segment = BTreeMap<String, String>;

fn segments(topologies: &[csi_proto::v1::Topology]) -> Vec<Segment> {
    topologies
        .iter()
        .map(|t| {
            t.segments
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .collect()
}

fn as_segment(term: &Term) -> Segment {
    term.iter().cloned().collect()
}

fuzz_target!(|input: Input| {
    let mut cluster = NodeMaps::default();
    let mut names = Vec::new();
    for node in input.nodes {
        if let Some(keys) = node.keys {
            cluster.keys.insert(node.name.clone(), keys);
        }
        if let Some(labels) = node.labels {
            cluster
                .labels
                .insert(node.name.clone(), labels.into_iter().collect());
        }
        names.push(node.name);
    }
    let mut product = 0usize;
    let allowed: Vec<Vec<(String, Vec<String>)>> = input
        .allowed
        .into_iter()
        .map(|term| {
            let mut seen = BTreeSet::new();
            let term: Vec<_> = term
                .into_iter()
                .filter(|(key, _)| seen.insert(key.clone()))
                .collect();
            product += term
                .iter()
                .map(|(_, values)| values.len().max(1))
                .fold(1usize, |a, b| a.saturating_mul(b));
            term
        })
        .collect();
    if product > 4096 {
        return;
    }
    let flattened: Vec<Segment> = flatten(&allowed).iter().map(as_segment).collect();

    let selected = input
        .selected
        .and_then(|i| names.get(usize::from(i) % names.len().max(1)))
        .map(String::as_str);
    let request = Request {
        claim_name: &input.claim_name,
        allowed: &allowed,
        selected_node: selected,
        strict: input.strict,
        immediate: input.immediate,
    };
    let answer = requirements(request, &cluster);
    assert_eq!(answer, requirements(request, &cluster), "not deterministic");
    if let Ok(Some(requirement)) = answer {
        let requisite = segments(&requirement.requisite);
        let preferred = segments(&requirement.preferred);
        assert!(!requisite.is_empty());
        assert!(requisite.iter().all(|s| !s.is_empty()), "{requisite:?}");
        let unique: BTreeSet<&Segment> = requisite.iter().collect();
        assert_eq!(
            unique.len(),
            requisite.len(),
            "repeated segment: {requisite:?}"
        );
        let mut sorted_requisite = requisite.clone();
        let mut sorted_preferred = preferred.clone();
        sorted_requisite.sort();
        sorted_preferred.sort();
        assert_eq!(sorted_requisite, sorted_preferred);

        let selected_segment = selected.map(|node| {
            let labels = &cluster.labels[node];
            cluster.keys[node]
                .iter()
                .map(|k| (k.clone(), labels[k].clone()))
                .collect::<Segment>()
        });
        match (&selected_segment, input.strict) {
            (Some(segment), true) => assert_eq!(requisite, vec![segment.clone()]),
            (Some(segment), false) => {
                assert!(
                    preferred[0].iter().all(|(k, v)| segment.get(k) == Some(v)),
                    "{:?} does not hold the selected node's {segment:?}",
                    preferred[0]
                );
            }
            (None, _) => {}
        }
        let strict_node = selected.is_some() && input.strict;
        if !(allowed.is_empty() || strict_node) {
            for segment in &requisite {
                assert!(flattened.contains(segment), "{segment:?} not allowed");
            }
        }
    }

    // StatefulSet spreading: `base-N` is offset N from `base-0`.
    let base = input.claim_name.replace('-', "");
    let zero = spread_offset(&format!("sts-{base}-0"));
    let nth = spread_offset(&format!("sts-{base}-{}", input.ordinal));
    assert_eq!(nth, zero.wrapping_add(u32::from(input.ordinal)));
});
