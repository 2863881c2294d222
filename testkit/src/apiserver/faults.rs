//! Fault injection: failing requests, adding latency, requests that are never answered,
//! closing watches, a server that is unreachable or frozen.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::counters::Verb;
use super::error::ApiError;
use super::store::Store;

/// Which requests a fault applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMatch {
    verb: Verb,
    resource: String,
    /// `None`: any; `Some(None)`: the resource itself; `Some(Some(s))`: subresource `s`.
    subresource: Option<Option<String>>,
    name: Option<String>,
    namespace: Option<String>,
}

impl RequestMatch {
    /// Requests with this verb on this resource plural (and any of its subresources).
    pub fn new(verb: Verb, resource: impl Into<String>) -> Self {
        Self {
            verb,
            resource: resource.into(),
            subresource: None,
            name: None,
            namespace: None,
        }
    }

    /// Only requests on this subresource (e.g. `status`).
    pub fn subresource(mut self, sub: impl Into<String>) -> Self {
        self.subresource = Some(Some(sub.into()));
        self
    }

    /// Only requests on the resource itself, not its subresources.
    pub fn main_resource(mut self) -> Self {
        self.subresource = Some(None);
        self
    }

    /// Only requests naming this object.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Only requests in this namespace.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    fn matches(&self, req: &RequestInfo<'_>) -> bool {
        self.verb == req.verb
            && self.resource == req.resource
            && self
                .subresource
                .as_ref()
                .is_none_or(|s| s.as_deref() == req.subresource)
            && self.name.as_deref().is_none_or(|n| Some(n) == req.name)
            && self
                .namespace
                .as_deref()
                .is_none_or(|n| Some(n) == req.namespace)
    }
}

/// The routing facts of one request, as faults see them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestInfo<'a> {
    pub verb: Verb,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub name: Option<&'a str>,
    pub namespace: Option<&'a str>,
}

#[derive(Debug)]
struct Failure {
    on: RequestMatch,
    remaining: u32,
    error: ApiError,
}

/// Where a hanging request stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hang {
    /// Accepted and never served: nothing is written, no answer comes.
    BeforeServing,
    /// Served (a write takes effect), but the answer never comes.
    AfterServing,
}

#[derive(Debug)]
struct Hanging {
    on: RequestMatch,
    remaining: u32,
    at: Hang,
}

#[derive(Debug, Default)]
struct State {
    failures: Vec<Failure>,
    latencies: Vec<(RequestMatch, Duration)>,
    hangs: Vec<Hanging>,
}

/// What the faults make of one request.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub delay: Duration,
    pub error: Option<ApiError>,
    pub hang: Option<Hang>,
}

/// Handle to inject faults into a running server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Faults {
    state: Arc<Mutex<State>>,
    store: Arc<Mutex<Store>>,
    /// While true the server is unreachable: open connections are cut, new ones closed at once.
    unreachable: tokio::sync::watch::Sender<bool>,
    /// While true the server is frozen: see [`Faults::set_frozen`].
    frozen: tokio::sync::watch::Sender<bool>,
}

impl Faults {
    pub(crate) fn new(store: Arc<Mutex<Store>>) -> Self {
        Self {
            state: Arc::default(),
            store,
            unreachable: tokio::sync::watch::Sender::new(false),
            frozen: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Freezes the server, as `kill -STOP` freezes kube-apiserver: connections stay open and
    /// new ones are accepted (the kernel completes their handshakes), but nothing is read from
    /// them or answered, watches included, until `false` thaws it; then everything goes on
    /// where it stopped.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Follows [`set_frozen`](Self::set_frozen), for the connection tasks.
    pub(crate) fn freezing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.frozen.subscribe()
    }

    /// The next `times` matching requests are never answered, while their connections stay
    /// open (as on a connection the network black-holes after the request went out); `at`
    /// says whether they take effect first.
    pub fn hang_next(&self, on: RequestMatch, times: u32, at: Hang) {
        self.with(|s| {
            s.hangs.push(Hanging {
                on,
                remaining: times,
                at,
            })
        });
    }

    /// How many injected hangs have not fired yet.
    pub fn pending_hangs(&self) -> u32 {
        self.with(|s| s.hangs.iter().map(|h| h.remaining).sum())
    }

    /// Makes the server unreachable, as while a kube-apiserver restarts: every open connection
    /// (watches included) is cut without a response and new connections are closed as soon as
    /// they are accepted. `false` serves again.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.send_replace(unreachable);
    }

    /// Whether [`set_unreachable`](Self::set_unreachable) is in force.
    pub fn is_unreachable(&self) -> bool {
        *self.unreachable.borrow()
    }

    /// Follows [`set_unreachable`](Self::set_unreachable), for the connection tasks.
    pub(crate) fn reachability(&self) -> tokio::sync::watch::Receiver<bool> {
        self.unreachable.subscribe()
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Fails the next `times` matching requests with `code` and a Status body
    /// whose reason fits the code (500 InternalError, 409 Conflict, ...).
    pub fn fail_next(&self, on: RequestMatch, times: u32, code: u16) {
        self.fail_next_with(
            on,
            times,
            ApiError::from_code(code, format!("injected fault ({code})")),
        );
    }

    /// Fails the next `times` matching requests with exactly this error.
    pub fn fail_next_with(&self, on: RequestMatch, times: u32, error: ApiError) {
        self.with(|s| {
            s.failures.push(Failure {
                on,
                remaining: times,
                error,
            })
        });
    }

    /// How many injected failures have not fired yet.
    pub fn pending_failures(&self) -> u32 {
        self.with(|s| s.failures.iter().map(|f| f.remaining).sum())
    }

    /// Delays every matching request by `delay` before it is served.
    pub fn add_latency(&self, on: RequestMatch, delay: Duration) {
        self.with(|s| s.latencies.push((on, delay)));
    }

    /// Removes all injected failures, latencies and hangs, and makes the server reachable and
    /// thawed again. Requests already hanging stay so.
    pub fn clear(&self) {
        self.with(|s| *s = State::default());
        self.set_unreachable(false);
        self.set_frozen(false);
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends every open watch, or those on one resource plural. Clients see the
    /// stream end cleanly and re-watch, as after an API server restart.
    pub fn close_watches(&self, resource: Option<&str>) {
        let mut store = self.store();
        match resource {
            None => store.close_watches(None),
            Some(plural) => {
                let ids: Vec<usize> = store
                    .registry()
                    .kinds()
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| k.plural == plural)
                    .map(|(id, _)| id)
                    .collect();
                for id in ids {
                    store.close_watches(Some(id));
                }
            }
        }
    }

    /// Drops the watch history, as an etcd compaction does: watches and list
    /// continuations from older resourceVersions get `410 Gone`.
    pub fn compact_history(&self) {
        self.store().compact();
    }

    /// What happens to one request: its delay, the injected error or hang (consuming one).
    pub(crate) fn check(&self, req: &RequestInfo<'_>) -> Verdict {
        self.with(|s| {
            let delay = s
                .latencies
                .iter()
                .filter(|(m, _)| m.matches(req))
                .map(|(_, d)| *d)
                .sum();
            let error = s
                .failures
                .iter_mut()
                .find(|f| f.remaining > 0 && f.on.matches(req))
                .map(|f| {
                    f.remaining -= 1;
                    f.error.clone()
                });
            s.failures.retain(|f| f.remaining > 0);
            let hang = if error.is_some() {
                None
            } else {
                s.hangs
                    .iter_mut()
                    .find(|h| h.remaining > 0 && h.on.matches(req))
                    .map(|h| {
                        h.remaining -= 1;
                        h.at
                    })
            };
            s.hangs.retain(|h| h.remaining > 0);
            Verdict { delay, error, hang }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    fn info<'a>(verb: Verb, sub: Option<&'a str>, name: Option<&'a str>) -> RequestInfo<'a> {
        RequestInfo {
            verb,
            resource: "volumeattachments",
            subresource: sub,
            name,
            namespace: None,
        }
    }

    #[test]
    fn failures_fire_the_requested_number_of_times() {
        let store = Arc::new(Mutex::new(Store::new(
            Arc::new(Registry::builtin()),
            10,
            10,
        )));
        let f = Faults::new(store);
        f.fail_next(
            RequestMatch::new(Verb::Patch, "volumeattachments")
                .subresource("status")
                .name("va"),
            2,
            500,
        );
        assert!(
            f.check(&info(Verb::Patch, None, Some("va")))
                .error
                .is_none()
        );
        assert!(
            f.check(&info(Verb::Patch, Some("status"), Some("other")))
                .error
                .is_none()
        );
        let e = f
            .check(&info(Verb::Patch, Some("status"), Some("va")))
            .error
            .unwrap();
        assert_eq!((e.code, e.reason), (500, "InternalError"));
        assert_eq!(f.pending_failures(), 1);
        assert!(
            f.check(&info(Verb::Patch, Some("status"), Some("va")))
                .error
                .is_some()
        );
        assert!(
            f.check(&info(Verb::Patch, Some("status"), Some("va")))
                .error
                .is_none()
        );
        f.add_latency(
            RequestMatch::new(Verb::Get, "volumeattachments").main_resource(),
            Duration::from_millis(5),
        );
        assert_eq!(
            f.check(&info(Verb::Get, None, None)).delay,
            Duration::from_millis(5)
        );
        assert_eq!(
            f.check(&info(Verb::Get, Some("status"), None)).delay,
            Duration::ZERO
        );
        f.clear();
        assert_eq!(f.check(&info(Verb::Get, None, None)).delay, Duration::ZERO);
    }

    #[test]
    fn hangs_fire_the_requested_number_of_times_after_failures() {
        let store = Arc::new(Mutex::new(Store::new(
            Arc::new(Registry::builtin()),
            10,
            10,
        )));
        let f = Faults::new(store);
        let on = RequestMatch::new(Verb::Patch, "volumeattachments").subresource("status");
        f.hang_next(on.clone(), 1, Hang::AfterServing);
        f.fail_next(on, 1, 500);
        let status = info(Verb::Patch, Some("status"), Some("va"));
        assert!(f.check(&info(Verb::Patch, None, Some("va"))).hang.is_none());
        let first = f.check(&status);
        assert!(first.error.is_some() && first.hang.is_none());
        assert_eq!(f.check(&status).hang, Some(Hang::AfterServing));
        assert_eq!(f.pending_hangs(), 0);
        assert!(f.check(&status).hang.is_none());
    }
}
