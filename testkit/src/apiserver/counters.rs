//! Per-(verb, resource, subresource) request counters, read by tests and benchmarks.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

/// A request verb, named as Kubernetes names it (RBAC, audit logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }

    /// Whether the verb changes state.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Self::Create | Self::Update | Self::Patch | Self::Delete | Self::DeleteCollection
        )
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown verb name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown verb {0:?}")]
pub struct UnknownVerb(pub String);

impl FromStr for Verb {
    type Err = UnknownVerb;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "get" => Self::Get,
            "list" => Self::List,
            "watch" => Self::Watch,
            "create" => Self::Create,
            "update" => Self::Update,
            "patch" => Self::Patch,
            "delete" => Self::Delete,
            "deletecollection" => Self::DeleteCollection,
            other => return Err(UnknownVerb(other.to_string())),
        })
    }
}

/// What one counter counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    pub verb: Verb,
    /// Resource plural, e.g. `volumeattachments`.
    pub resource: String,
    /// e.g. `status`; `None` for the resource itself.
    pub subresource: Option<String>,
}

/// Shared request counters of one server. Every resource request is counted
/// when it arrives, including those failed by injected faults.
#[derive(Debug, Clone, Default)]
pub struct RequestCounters {
    inner: Arc<Mutex<HashMap<CounterKey, u64>>>,
    /// Watches that began with the objects as events (`sendInitialEvents`), by resource.
    streamed: Arc<Mutex<HashMap<String, u64>>>,
    /// Lists answered in protobuf, by resource.
    in_protobuf: Arc<Mutex<HashMap<String, u64>>>,
    /// The same counts by the program that made them: the User-Agent up to its first `/`, as
    /// kube-apiserver names a write's field manager (`csi-provisioner/v6.3.0 (linux/amd64)`).
    programs: Arc<Mutex<HashMap<String, HashMap<CounterKey, u64>>>>,
    /// The requests that carried a W3C `traceparent`, with it, the newest [`TRACED_KEPT`].
    traced: Arc<Mutex<std::collections::VecDeque<(CounterKey, String)>>>,
}

/// How many traced requests the server remembers.
const TRACED_KEPT: usize = 10_000;

impl RequestCounters {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<CounterKey, u64>) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn record(
        &self,
        verb: Verb,
        resource: &str,
        subresource: Option<&str>,
        user_agent: Option<&str>,
    ) {
        let key = CounterKey {
            verb,
            resource: resource.to_string(),
            subresource: subresource.map(str::to_string),
        };
        if let Some(agent) = user_agent {
            let program = agent.split('/').next().unwrap_or(agent).to_string();
            let mut programs = self.programs.lock().unwrap_or_else(PoisonError::into_inner);
            *programs
                .entry(program)
                .or_default()
                .entry(key.clone())
                .or_default() += 1;
        }
        self.with(|m| *m.entry(key).or_default() += 1);
    }

    /// The requests `program` made (its User-Agent's first part), sorted.
    pub fn of_program(&self, program: &str) -> BTreeMap<CounterKey, u64> {
        self.programs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(program)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }

    pub(crate) fn record_traceparent(
        &self,
        verb: Verb,
        resource: &str,
        subresource: Option<&str>,
        traceparent: &str,
    ) {
        let key = CounterKey {
            verb,
            resource: resource.to_string(),
            subresource: subresource.map(str::to_string),
        };
        let mut traced = self.traced.lock().unwrap_or_else(PoisonError::into_inner);
        if traced.len() == TRACED_KEPT {
            traced.pop_front();
        }
        traced.push_back((key, traceparent.to_string()));
    }

    /// The requests that carried a `traceparent`, oldest first, with it.
    pub fn traced(&self) -> Vec<(CounterKey, String)> {
        self.traced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    pub(crate) fn record_protobuf_list(&self, resource: &str) {
        let mut lists = self
            .in_protobuf
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *lists.entry(resource.to_string()).or_default() += 1;
    }

    /// Lists of the resource answered in protobuf.
    pub fn protobuf_lists(&self, resource: &str) -> u64 {
        let lists = self
            .in_protobuf
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lists.get(resource).copied().unwrap_or(0)
    }

    pub(crate) fn record_streamed_list(&self, resource: &str) {
        let mut streamed = self.streamed.lock().unwrap_or_else(PoisonError::into_inner);
        *streamed.entry(resource.to_string()).or_default() += 1;
    }

    /// Lists of the resource: list requests and watches that stream the list first
    /// (`sendInitialEvents`, which are also counted as watches).
    pub fn lists(&self, resource: &str) -> u64 {
        let streamed = self
            .streamed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .copied()
            .unwrap_or(0);
        self.get(Verb::List, resource) + streamed
    }

    /// Requests on the resource itself (no subresource).
    pub fn get(&self, verb: Verb, resource: &str) -> u64 {
        self.get_subresource(verb, resource, None)
    }

    /// Requests on one subresource (`None`: the resource itself).
    pub fn get_subresource(&self, verb: Verb, resource: &str, subresource: Option<&str>) -> u64 {
        let key = CounterKey {
            verb,
            resource: resource.to_string(),
            subresource: subresource.map(str::to_string),
        };
        self.with(|m| m.get(&key).copied().unwrap_or(0))
    }

    /// Requests on the resource and all its subresources.
    pub fn total(&self, verb: Verb, resource: &str) -> u64 {
        self.with(|m| {
            m.iter()
                .filter(|(k, _)| k.verb == verb && k.resource == resource)
                .map(|(_, n)| n)
                .sum()
        })
    }

    /// All create/update/patch/delete requests, on any resource.
    pub fn writes(&self) -> u64 {
        self.with(|m| {
            m.iter()
                .filter(|(k, _)| k.verb.is_write())
                .map(|(_, n)| n)
                .sum()
        })
    }

    /// Every counter, sorted.
    pub fn snapshot(&self) -> BTreeMap<CounterKey, u64> {
        self.with(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
    }

    pub fn reset(&self) {
        self.with(HashMap::clear);
        self.programs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.streamed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.in_protobuf
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_verb_resource_and_subresource() {
        let c = RequestCounters::default();
        let attacher = Some("csi-attacher/v4.12.0 (linux/amd64)");
        c.record(Verb::Patch, "volumeattachments", None, attacher);
        c.record(Verb::Patch, "volumeattachments", Some("status"), attacher);
        c.record(Verb::Patch, "volumeattachments", Some("status"), None);
        c.record(Verb::Get, "persistentvolumes", None, Some("kubectl"));
        assert_eq!(c.get(Verb::Patch, "volumeattachments"), 1);
        assert_eq!(
            c.get_subresource(Verb::Patch, "volumeattachments", Some("status")),
            2
        );
        assert_eq!(c.total(Verb::Patch, "volumeattachments"), 3);
        assert_eq!(c.writes(), 3);
        assert_eq!(c.snapshot().len(), 3);
        assert_eq!(c.of_program("csi-attacher").values().sum::<u64>(), 2);
        assert_eq!(c.of_program("kubectl").len(), 1);
        c.reset();
        assert!(c.of_program("csi-attacher").is_empty());
        assert_eq!(c.writes(), 0);
        assert_eq!(
            "deletecollection".parse::<Verb>().unwrap(),
            Verb::DeleteCollection
        );
        assert!("frob".parse::<Verb>().is_err());
    }
}
