//! The span of one operation: a worker's pass over a key, with children for the time the key
//! waited in its queue and, after a failure, for its backoff. A pass the sidecar does not
//! [`describe`] as an operation, and that did not fail, did nothing worth a trace: it is not
//! exported. A key worked on again after a
//! failure continues the trace of its first pass, so that one operation is one trace however
//! often it is retried.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceId, Tracer as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The passes [`describe`]d so far and not finished: the others did nothing worth a trace.
static DESCRIBED: Mutex<Option<HashSet<tracing::Id>>> = Mutex::new(None);

/// Sampled passes begun and not finished, by their span: what a stop ends itself when their
/// tasks cannot (a fatal exit, a worker still busy at SIGTERM), see [`interrupted`].
static OPEN: Mutex<Option<HashMap<SpanId, Open>>> = Mutex::new(None);
/// Spans [`interrupted`] ended in their pass's stead: if the pass ends after all, its own span
/// is not exported a second time.
static SUBSTITUTED: Mutex<Option<HashSet<(TraceId, SpanId)>>> = Mutex::new(None);
static ANY_SUBSTITUTED: AtomicBool = AtomicBool::new(false);

/// What an open pass's span holds so far.
struct Open {
    context: SpanContext,
    /// The first pass's span, when this one continues its trace.
    parent: Option<SpanContext>,
    name: String,
    started: SystemTime,
    attributes: Vec<KeyValue>,
}

/// Ends the spans of the operations still open, each marked `csi.sidecar.interrupted` with an
/// error status, for a stop to export before the process ends.
pub(super) fn interrupted() -> Vec<SpanData> {
    let open: Vec<Open> = OPEN
        .lock()
        .ok()
        .and_then(|mut open| open.take())
        .map(|open| open.into_values().collect())
        .unwrap_or_default();
    if open.is_empty() {
        return Vec::new();
    }
    if let Ok(mut substituted) = SUBSTITUTED.lock() {
        let substituted = substituted.get_or_insert_with(HashSet::new);
        substituted.extend(
            open.iter()
                .map(|open| (open.context.trace_id(), open.context.span_id())),
        );
        ANY_SUBSTITUTED.store(true, Ordering::Release);
    }
    let now = SystemTime::now();
    open.into_iter()
        .map(|open| {
            let mut attributes = open.attributes;
            attributes.push(KeyValue::new(INTERRUPTED, true));
            SpanData {
                span_context: open.context,
                parent_span_id: open
                    .parent
                    .as_ref()
                    .map_or(SpanId::INVALID, SpanContext::span_id),
                parent_span_is_remote: open.parent.is_some(),
                span_kind: SpanKind::Internal,
                name: open.name.into(),
                start_time: open.started,
                end_time: now,
                attributes,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: Status::error("the process stopped before the operation ended"),
                instrumentation_scope: InstrumentationScope::builder(super::TRACER).build(),
            }
        })
        .collect()
}

/// Whether `span` was ended by [`interrupted`] already.
pub(super) fn substituted(span: &SpanContext) -> bool {
    ANY_SUBSTITUTED.load(Ordering::Acquire)
        && SUBSTITUTED
            .lock()
            .ok()
            .and_then(|set| {
                set.as_ref()
                    .map(|set| set.contains(&(span.trace_id(), span.span_id())))
            })
            .unwrap_or(false)
}

/// The attribute of an operation's span that a stop ended (see [`interrupted`]).
pub(super) const INTERRUPTED: &str = "csi.sidecar.interrupted";

/// Registers an open operation as [`Retries::begin`] does, for tests of what a stop exports.
#[cfg(test)]
pub(super) fn open_for_test(context: SpanContext, name: &str) {
    if let Ok(mut open) = OPEN.lock() {
        open.get_or_insert_with(HashMap::new).insert(
            context.span_id(),
            Open {
                context,
                parent: None,
                name: name.to_string(),
                started: SystemTime::now(),
                attributes: Vec::new(),
            },
        );
    }
}

/// The attribute that marks the root of a pass that turned out to be no operation (a claim of
/// another provisioner, an object already as it should be): the export drops it.
pub(super) const IDLE: &str = "csi.sidecar.idle";

/// Operations that failed and will be retried: the span context of their first pass and when
/// the last pass ended. Holds a key only while its queue retries it.
#[derive(Debug)]
pub struct Retries<K> {
    pending: Mutex<HashMap<K, (SpanContext, SystemTime)>>,
}

impl<K> Default for Retries<K> {
    fn default() -> Self {
        Self {
            pending: Mutex::new(HashMap::new()),
        }
    }
}

/// One pass of a worker over `key`; `finish` it when the pass ends.
pub struct Pass<K> {
    pub span: tracing::Span,
    /// Its span's id, under which it is [`OPEN`] until it ends.
    own: SpanId,
    key: K,
    /// The first pass's span, when this one continues it.
    first: Option<SpanContext>,
    /// When the last pass failed, for a retry.
    failed_at: Option<SystemTime>,
    /// When the key was put in its lane.
    queued: SystemTime,
    started: SystemTime,
    failures: u32,
}

impl<K: Clone + Eq + Hash + Debug> Retries<K> {
    /// The span of a pass over `key` of `queue`'s `lane`, which waited `waited` in the lane
    /// and has failed `failures` times before; `None` when tracing is off.
    pub fn begin(
        &self,
        service: Option<&Arc<str>>,
        queue: &str,
        lane: &str,
        key: &K,
        waited: Duration,
        failures: u32,
    ) -> Option<Pass<K>> {
        if !super::enabled() {
            return None;
        }
        let span = tracing::info_span!(
            parent: None,
            "operation",
            otel.name = %format_args!("{queue} {lane}"),
            csi.sidecar.queue = queue,
            csi.sidecar.key = ?key,
            csi.sidecar.retries = failures,
        );
        let previous = self
            .pending
            .lock()
            .ok()
            .and_then(|mut pending| pending.remove(key));
        let (first, failed_at) = previous.unzip();
        if let Some(first) = &first {
            let _ = span.set_parent(Context::new().with_remote_span_context(first.clone()));
        }
        // At once: the pass's children may be exported before it ends. This starts the span;
        // `describe` renames a started span too.
        if let Some(service) = service {
            super::attribute_to(&span, service);
        }
        let started = SystemTime::now();
        let own = span.context().span().span_context().clone();
        if own.is_sampled()
            && let Ok(mut open) = OPEN.lock()
        {
            open.get_or_insert_with(HashMap::new).insert(
                own.span_id(),
                Open {
                    context: own.clone(),
                    parent: first.clone(),
                    name: format!("{queue} {lane}"),
                    started,
                    attributes: vec![
                        KeyValue::new("csi.sidecar.queue", queue.to_string()),
                        KeyValue::new("csi.sidecar.key", format!("{key:?}")),
                    ],
                },
            );
        }
        Some(Pass {
            span,
            own: own.span_id(),
            key: key.clone(),
            first,
            failed_at,
            queued: started.checked_sub(waited).unwrap_or(started),
            started,
            failures,
        })
    }

    /// Ends `pass` with children for its waits; when its key is to be retried (`failures` >
    /// 0) the next pass continues its trace.
    pub fn finish(&self, mut pass: Pass<K>, failures: u32) {
        let described = pass.span.id().is_some_and(|id| {
            DESCRIBED
                .lock()
                .ok()
                .and_then(|mut described| described.as_mut().map(|set| set.remove(&id)))
                .unwrap_or(false)
        });
        if !described && failures == 0 {
            pass.span.set_attribute(IDLE, true);
            if pass.first.is_none() {
                super::unattribute(&pass.span);
            }
            return;
        }
        let context = pass.span.context();
        let sampled = context.span().span_context().is_sampled();
        if sampled {
            super::attribute_work_done();
            if failures > 0 {
                pass.span
                    .set_status(Status::error("the operation failed; it is retried"));
            }
        }
        if let Some(failed_at) = pass.failed_at
            && sampled
            && failed_at < pass.queued
        {
            child(
                &context,
                "backoff",
                failed_at,
                pass.queued,
                vec![KeyValue::new(
                    "csi.sidecar.retries",
                    i64::from(pass.failures),
                )],
            );
        }
        if sampled {
            child(
                &context,
                "queue wait",
                pass.queued,
                pass.started,
                Vec::new(),
            );
        }
        if failures > 0
            && let Ok(mut pending) = self.pending.lock()
        {
            let first = pass
                .first
                .take()
                .unwrap_or_else(|| context.span().span_context().clone());
            pending.insert(pass.key.clone(), (first, SystemTime::now()));
        }
    }
}

impl<K> Drop for Pass<K> {
    /// A pass ends here, finished or not (its task cancelled): it is no longer open.
    fn drop(&mut self) {
        if let Ok(mut open) = OPEN.lock()
            && let Some(open) = open.as_mut()
        {
            open.remove(&self.own);
        }
        if let (Some(id), Ok(mut described)) = (self.span.id(), DESCRIBED.lock())
            && let Some(described) = described.as_mut()
        {
            described.remove(&id);
        }
    }
}

/// A finished child span of `parent` from `start` to `end`: time that passed with no code of
/// ours running (waits), so made after the fact.
fn child(
    parent: &Context,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
) {
    let tracer = opentelemetry::global::tracer(super::TRACER);
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&tracer, parent);
    opentelemetry::trace::Span::end_with_timestamp(&mut span, end);
}

/// Names the operation the current pass turned out to be (`provision`, `delete`, `attach`...)
/// and what it acts on, as OpenTelemetry's attributes (`k8s.namespace.name`, `k8s.pvc.name`,
/// ...): a backend's search for an object finds every operation of every sidecar on it.
pub fn describe(name: &str, attributes: &[(&'static str, &str)]) {
    if !super::enabled() {
        return;
    }
    let span = tracing::Span::current();
    if let (Some(id), Ok(mut described)) = (span.id(), DESCRIBED.lock()) {
        described.get_or_insert_with(HashSet::new).insert(id);
    }
    if !super::sampled(&span) {
        return;
    }
    super::attribute_work_done();
    span.record("otel.name", name);
    // Once the span has started (a child or an event started it), only this renames it.
    let context = span.context();
    context.span().update_name(name.to_string());
    for (key, value) in attributes {
        span.set_attribute(*key, value.to_string());
    }
    if let Ok(mut open) = OPEN.lock()
        && let Some(open) = open
            .as_mut()
            .and_then(|open| open.get_mut(&context.span().span_context().span_id()))
    {
        open.name = name.to_string();
        open.attributes.extend(
            attributes
                .iter()
                .map(|(key, value)| KeyValue::new(*key, value.to_string())),
        );
    }
}

/// The root span of an operation that no queue hands out: a periodic round (the health
/// monitor's ListVolumes), under `service`. A disabled span when tracing is off.
pub fn round(service: Option<&Arc<str>>, name: &'static str) -> tracing::Span {
    if !super::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(parent: None, "operation", otel.name = name);
    if let Some(service) = service {
        super::attribute_to(&span, service);
    }
    span
}
