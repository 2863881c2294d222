//! Secret-name templates of StorageClasses (`${pvc.name}`, `${pvc.namespace}`, `${pv.name}`,
//! `${pvc.annotations['key']}`), expanded as Go's `os.Expand`.
//!
//! Properties:
//! - a template built from literals and known variables expands to the literals and the
//!   variables' values, in order; a template without `$` expands to itself;
//! - an unknown variable is an error that names it;
//! - a resolved secret reference only ever holds a valid namespace (RFC 1123 label) and a
//!   valid secret name (RFC 1123 subdomain), whatever the templates and the claim hold.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use external_provisioner::params::{
    NODE_STAGE_SECRET, PROVISIONER_SECRET, TemplateInputs, secret_ref,
};
use libfuzzer_sys::fuzz_target;
use sidecar_kit::values::names::resolve_template;

#[path = "../common/names.rs"]
mod names;
use names::{label_ok, subdomain_ok};

#[derive(Arbitrary, Debug)]
enum Part {
    Literal(String),
    /// `${name}` of a known variable (index into the parameters).
    Known(u8),
    /// `${name}` of a variable that is not a parameter.
    Unknown(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    parts: Vec<Part>,
    raw_name: String,
    raw_namespace: String,
    pv_name: String,
    claim: Option<(String, String)>,
    annotations: Vec<(String, String)>,
    /// Use the provisioner kind's own keys (else the default pair).
    own_keys: bool,
}

fn check_built(parts: &[Part], params: &BTreeMap<String, String>) {
    let names: Vec<&String> = params.keys().collect();
    let mut template = String::new();
    let mut expected = String::new();
    let mut unknown = Vec::new();
    for part in parts {
        match part {
            Part::Literal(text) => {
                // `$` would start a variable: literals in this shape have none.
                let text = text.replace('$', "");
                template.push_str(&text);
                expected.push_str(&text);
            }
            Part::Known(index) if !names.is_empty() => {
                let name = names[usize::from(*index) % names.len()];
                // An annotation key with `}` cannot be named in a template.
                if name.contains('}') {
                    continue;
                }
                template.push_str(&format!("${{{name}}}"));
                expected.push_str(&params[name]);
            }
            Part::Known(_) => {}
            Part::Unknown(name) => {
                // A name with `}` ends early, an empty one is invalid syntax.
                let name = name.replace('}', "");
                if name.is_empty() || params.contains_key(&name) {
                    continue;
                }
                template.push_str(&format!("${{{name}}}"));
                unknown.push(name);
            }
        }
    }
    match resolve_template(&template, params) {
        Ok(resolved) => {
            assert!(
                unknown.is_empty(),
                "{template:?} resolved despite {unknown:?}"
            );
            assert_eq!(resolved, expected, "{template:?}");
        }
        Err(message) => {
            assert!(!unknown.is_empty(), "{template:?}: {message}");
            for name in &unknown {
                assert!(
                    message.contains(&format!("{name:?}")),
                    "{message} lacks {name:?}"
                );
            }
        }
    }
    if !template.contains('$') {
        assert_eq!(
            resolve_template(&template, params).as_deref(),
            Ok(&*template)
        );
    }
}

fuzz_target!(|input: Input| {
    let annotations: BTreeMap<String, String> = input.annotations.iter().cloned().collect();
    let mut params = BTreeMap::new();
    params.insert("pv.name".to_string(), input.pv_name.clone());
    if let Some((namespace, name)) = &input.claim {
        params.insert("pvc.namespace".to_string(), namespace.clone());
        params.insert("pvc.name".to_string(), name.clone());
    }
    for (key, value) in &annotations {
        params.insert(format!("pvc.annotations['{key}']"), value.clone());
    }
    check_built(&input.parts, &params);
    let _ = resolve_template(&input.raw_name, &params);

    let inputs = TemplateInputs {
        pv_name: &input.pv_name,
        claim: input
            .claim
            .as_ref()
            .map(|(namespace, name)| (namespace.as_str(), name.as_str())),
        claim_annotations: Some(&annotations),
    };
    let (name_key, namespace_key) = if input.own_keys {
        (
            PROVISIONER_SECRET.name_key,
            PROVISIONER_SECRET.namespace_key,
        )
    } else {
        (
            "csi.storage.k8s.io/secret-name",
            "csi.storage.k8s.io/secret-namespace",
        )
    };
    let class = BTreeMap::from([
        (name_key.to_string(), input.raw_name.clone()),
        (namespace_key.to_string(), input.raw_namespace.clone()),
    ]);
    for kind in [&PROVISIONER_SECRET, &NODE_STAGE_SECRET] {
        if let Ok(Some(found)) = secret_ref(kind, &class, &inputs) {
            assert!(
                label_ok(&found.namespace),
                "namespace {:?}",
                found.namespace
            );
            assert!(subdomain_ok(&found.name), "name {:?}", found.name);
        }
    }
});
