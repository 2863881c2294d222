//! Finished spans held back until the local root of their trace ends: a pass that turns out to
//! be no operation drops its root, and its children (an API read before it decided nothing)
//! must go with it, or they would reach the collector with a parent that never arrives.
//! Bounded: past the bound the oldest trace's spans are let go as they are.

use std::collections::{HashMap, VecDeque};

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::SpanData;

/// Traces whose root ended, remembered so that a late child follows its root's fate.
const REMEMBERED_ROOTS: usize = 4096;

/// What became of a finished span.
#[derive(Debug, Default)]
pub struct Release {
    /// To export, in the order they ended.
    pub export: Vec<SpanData>,
    /// Children of a dropped root, dropped with it.
    pub dropped: usize,
}

#[derive(Debug)]
pub struct Held {
    by_trace: HashMap<TraceId, Vec<SpanData>>,
    /// Traces in the order their first span was held.
    order: VecDeque<TraceId>,
    count: usize,
    max: usize,
    /// Traces whose root ended, and whether it was dropped.
    ended: HashMap<TraceId, bool>,
    ended_order: VecDeque<TraceId>,
}

impl Held {
    /// Holds at most `max` spans at once.
    pub fn new(max: usize) -> Self {
        Self {
            by_trace: HashMap::new(),
            order: VecDeque::new(),
            count: 0,
            max,
            ended: HashMap::new(),
            ended_order: VecDeque::new(),
        }
    }

    /// Takes a finished span: holds it, or releases it with what it was holding back.
    /// `dropped_root`: the span is a root that is not to be exported.
    pub fn finished(&mut self, span: SpanData, dropped_root: bool) -> Release {
        let trace = span.span_context.trace_id();
        let local_root = span.parent_span_id == SpanId::INVALID || span.parent_span_is_remote;
        let mut release = Release::default();
        if local_root {
            let children = self.take(trace);
            self.remember_end(trace, dropped_root);
            if dropped_root {
                release.dropped = children.len();
            } else {
                release.export = children;
                release.export.push(span);
            }
            return release;
        }
        match self.ended.get(&trace) {
            Some(true) => release.dropped = 1,
            Some(false) => release.export.push(span),
            None => {
                if self.count >= self.max {
                    // The oldest trace is let go; its root may still end and be exported.
                    if let Some(oldest) = self.order.front().copied() {
                        release.export = self.take(oldest);
                    }
                }
                if self.count >= self.max {
                    release.export.push(span);
                } else {
                    let spans = self.by_trace.entry(trace).or_insert_with(|| {
                        self.order.push_back(trace);
                        Vec::new()
                    });
                    spans.push(span);
                    self.count += 1;
                }
            }
        }
        release
    }

    fn take(&mut self, trace: TraceId) -> Vec<SpanData> {
        let spans = self.by_trace.remove(&trace).unwrap_or_default();
        if !spans.is_empty() {
            self.count -= spans.len();
            if let Some(at) = self.order.iter().position(|t| *t == trace) {
                self.order.remove(at);
            }
        }
        spans
    }

    fn remember_end(&mut self, trace: TraceId, dropped: bool) {
        if self.ended.insert(trace, dropped).is_none() {
            self.ended_order.push_back(trace);
            if self.ended_order.len() > REMEMBERED_ROOTS
                && let Some(old) = self.ended_order.pop_front()
            {
                self.ended.remove(&old);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::borrow::Cow;
    use std::time::SystemTime;

    use opentelemetry::InstrumentationScope;
    use opentelemetry::trace::{SpanContext, SpanKind, Status, TraceFlags, TraceState};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};

    use super::*;

    /// A finished, sampled span of `trace` with `parent` (0: none).
    pub(in crate::telemetry) fn span(
        trace: u128,
        id: u64,
        parent: u64,
        remote_parent: bool,
    ) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(trace),
                SpanId::from(id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::from(parent),
            parent_span_is_remote: remote_parent,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("s"),
            start_time: SystemTime::UNIX_EPOCH,
            end_time: SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("t").build(),
        }
    }

    fn ids(spans: &[SpanData]) -> Vec<u64> {
        spans
            .iter()
            .map(|s| u64::from_be_bytes(s.span_context.span_id().to_bytes()))
            .collect()
    }

    #[test]
    fn children_go_with_their_root_whichever_way_it_goes() {
        let mut held = Held::new(100);
        assert!(held.finished(span(1, 2, 1, false), false).export.is_empty());
        assert!(held.finished(span(1, 3, 2, false), false).export.is_empty());
        let release = held.finished(span(1, 1, 0, false), false);
        assert_eq!(ids(&release.export), vec![2, 3, 1]);

        held.finished(span(7, 2, 1, false), false);
        let release = held.finished(span(7, 1, 0, false), true);
        assert!(release.export.is_empty());
        assert_eq!(release.dropped, 1);
        // A child that ends after its dropped root is dropped too; after an exported one, sent.
        assert_eq!(held.finished(span(7, 4, 1, false), false).dropped, 1);
        assert_eq!(
            ids(&held.finished(span(1, 5, 1, false), false).export),
            vec![5]
        );
        assert_eq!(held.count, 0);
    }

    #[test]
    fn a_span_under_a_remote_parent_is_the_root_of_what_this_process_made() {
        let mut held = Held::new(100);
        held.finished(span(3, 11, 10, false), false);
        let release = held.finished(span(3, 10, 99, true), false);
        assert_eq!(ids(&release.export), vec![11, 10]);
    }

    #[test]
    fn past_its_bound_the_oldest_trace_is_let_go() {
        let mut held = Held::new(2);
        held.finished(span(1, 2, 1, false), false);
        held.finished(span(2, 2, 1, false), false);
        let release = held.finished(span(3, 2, 1, false), false);
        assert_eq!(
            release
                .export
                .iter()
                .map(|s| s.span_context.trace_id())
                .collect::<Vec<_>>(),
            vec![TraceId::from(1u128)]
        );
        assert_eq!(held.count, 2);
    }
}
