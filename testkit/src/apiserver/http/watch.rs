//! Watches: the stream of a kind's events, filtered and encoded (JSON or protobuf), with
//! bookmarks, the initial events of a watch-list, and the end of a watch at its timeout.

use super::*;
use crate::apiserver::gates::Gate;

/// Which events of a kind one watcher sees.
#[derive(Debug)]
pub(super) struct WatchFilter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl WatchFilter {
    fn visible(&self, o: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns))
            && self.labels.matches(o)
            && self.fields.matches(o)
    }
}

/// Per-watch rendering state.
#[derive(Debug)]
pub(super) struct WatchOutput {
    filter: WatchFilter,
    table: Option<IncludeObject>,
    headers_sent: bool,
    /// Frames of `meta.v1.WatchEvent` messages rather than JSON lines.
    protobuf: bool,
}

pub(super) fn event_line(etype: &str, object_json: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(object_json.len() + 32);
    v.extend_from_slice(b"{\"type\":\"");
    v.extend_from_slice(etype.as_bytes());
    v.extend_from_slice(b"\",\"object\":");
    v.extend_from_slice(object_json);
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

impl WatchOutput {
    /// The line this watcher gets for an event, if any. An object that stops
    /// (starts) matching the selectors is reported as DELETED (ADDED), as the
    /// real server's watch cache does.
    fn render(&mut self, ev: &WatchEvent) -> Option<Bytes> {
        let now = self.filter.visible(&ev.object);
        let before = ev.prev.as_deref().is_some_and(|p| self.filter.visible(p));
        let (etype, rewritten) = match ev.etype {
            EventType::Added if now => (EventType::Added, None),
            EventType::Deleted if before => (EventType::Deleted, None),
            EventType::Modified => match (before, now) {
                (true, true) => (EventType::Modified, None),
                (false, true) => (EventType::Added, None),
                (true, false) => {
                    // The previous state, stamped with this event's resourceVersion.
                    let mut prev = ev.prev.as_deref().cloned().unwrap_or(Value::Null);
                    prev["metadata"]["resourceVersion"] = json!(ev.rv.to_string());
                    (EventType::Deleted, Some(prev))
                }
                (false, false) => return None,
            },
            _ => return None,
        };
        let object = rewritten.as_ref().unwrap_or(&ev.object);
        if self.protobuf {
            let encoded = match &rewritten {
                None => ev.encoded_protobuf().cloned(),
                Some(v) => protobuf::encode_object(v).ok().map(Bytes::from),
            };
            return encoded.map(|b| protobuf::watch_frame(etype.as_str(), &b));
        }
        match self.table {
            None => match &rewritten {
                None => Some(event_line(etype.as_str(), ev.encoded_object())),
                Some(v) => Some(event_line(
                    etype.as_str(),
                    &serde_json::to_vec(v).unwrap_or_default(),
                )),
            },
            Some(include) => {
                let meta = json!({"resourceVersion": ev.rv.to_string()});
                let table = discovery::table([object], meta, include, !self.headers_sent);
                self.headers_sent = true;
                Some(event_line(
                    etype.as_str(),
                    &serde_json::to_vec(&table).unwrap_or_default(),
                ))
            }
        }
    }
}

pub(super) fn bookmark_line(k: &Kind, rv: u64, initial_events_end: bool, protobuf: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_events_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": k.kind, "apiVersion": k.api_version(), "metadata": meta});
    if protobuf && let Ok(bytes) = protobuf::encode_object(&obj) {
        return protobuf::watch_frame("BOOKMARK", &bytes);
    }
    event_line("BOOKMARK", obj.to_string().as_bytes())
}

/// An ERROR event carrying a Status, in the stream's encoding.
pub(super) fn error_line(status: &Value, protobuf: bool) -> Bytes {
    if protobuf && let Ok(bytes) = protobuf::encode_status(status) {
        return protobuf::watch_frame("ERROR", &bytes);
    }
    event_line("ERROR", status.to_string().as_bytes())
}

pub(super) fn watch(
    shared: &Arc<Shared>,
    k: &Kind,
    kind: KindId,
    q: &HashMap<String, String>,
    namespace: Option<String>,
    rendering: Rendering,
) -> Result<Response<Body>, ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""), k)
        .map_err(|e| ApiError::bad_request(e.0))?;
    let bookmarks = flag(q, "allowWatchBookmarks");
    let send_initial = q.get("sendInitialEvents").map(|v| v == "true" || v == "1");
    if send_initial == Some(true) {
        if !shared.store().feature_gates().enabled(Gate::WatchList) {
            return Err(ApiError::invalid(
                k,
                "",
                "sendInitialEvents",
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            ));
        }
        let rvm = q
            .get("resourceVersionMatch")
            .map(String::as_str)
            .unwrap_or("");
        if rvm != "NotOlderThan" || !bookmarks {
            return Err(ApiError::invalid(
                k,
                "",
                "sendInitialEvents",
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan and allowWatchBookmarks",
            ));
        }
        shared.counters.record_streamed_list(k.plural);
    }
    let timeout = match q.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(t) => Some(Duration::from_secs(t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds {t:?}"))
        })?)),
        None => None,
    };
    let rv = q
        .get("resourceVersion")
        .map(String::as_str)
        .filter(|r| !r.is_empty() && *r != "0");
    let from = match (rv, send_initial) {
        (_, Some(true)) | (None, _) => WatchFrom::Current,
        (Some(r), _) => WatchFrom::After(
            r.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {r:?}")))?,
        ),
    };
    let proto = rendering == Rendering::Protobuf && protobuf::supported(&k.api_version(), k.kind);
    let content_type = if proto {
        protobuf::WATCH_MEDIA_TYPE
    } else {
        "application/json"
    };
    let start = match shared.store().watch(kind, from) {
        Ok(mut s) => {
            // "Start at most recent" without initial events.
            if rv.is_none() && send_initial == Some(false) {
                s.initial.clear();
            }
            s
        }
        Err(e) if e.code == 410 => {
            // Like the real server: 200, then an ERROR event carrying a 410 Status.
            let line = error_line(&e.to_status(), proto);
            return Ok(respond(200, content_type, line));
        }
        Err(e) => return Err(e),
    };
    let table = match rendering {
        Rendering::Table => Some(include_object(q)?),
        Rendering::Json | Rendering::Protobuf => None,
    };
    let output = WatchOutput {
        filter: WatchFilter {
            namespace,
            labels,
            fields,
        },
        table,
        headers_sent: false,
        protobuf: proto,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let opts = WatchOpts {
        bookmarks,
        initial_events_end: send_initial == Some(true),
        timeout,
        protobuf: proto,
    };
    tokio::spawn(run_watch(
        shared.clone(),
        k.clone(),
        start,
        output,
        opts,
        tx,
    ));
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    Ok(resp)
}

#[derive(Debug, Clone, Copy)]
pub(super) struct WatchOpts {
    bookmarks: bool,
    initial_events_end: bool,
    timeout: Option<Duration>,
    protobuf: bool,
}

pub(super) async fn run_watch(
    shared: Arc<Shared>,
    k: Kind,
    mut start: WatchStart,
    mut out: WatchOutput,
    opts: WatchOpts,
    tx: mpsc::Sender<Bytes>,
) {
    for ev in std::mem::take(&mut start.initial) {
        if let Some(line) = out.render(&ev)
            && tx.send(line).await.is_err()
        {
            return;
        }
    }
    if opts.initial_events_end
        && tx
            .send(bookmark_line(&k, start.after, true, opts.protobuf))
            .await
            .is_err()
    {
        return;
    }
    let deadline = opts.timeout.map(|t| Instant::now() + t);
    let expired = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    let mut ticker = tokio::time::interval_at(
        Instant::now() + shared.bookmark_interval,
        shared.bookmark_interval,
    );
    let mut last_rv = start.after;
    loop {
        let batch: Vec<Arc<WatchEvent>>;
        let mut bookmark = None;
        tokio::select! {
            ev = start.events.recv() => match ev {
                Some(ev) => batch = vec![ev],
                None => break,
            },
            _ = ticker.tick(), if opts.bookmarks => {
                // Read the revision and drain under the store lock, so that no
                // event at or below the bookmark is still in flight.
                let store = shared.store();
                let rv = store.resource_version();
                let mut drained = Vec::new();
                while let Ok(ev) = start.events.try_recv() {
                    drained.push(ev);
                }
                drop(store);
                batch = drained;
                bookmark = Some(rv);
            }
            _ = &mut expired => {
                if opts.bookmarks {
                    let _ = tx.send(bookmark_line(&k, last_rv, false, opts.protobuf)).await;
                }
                break;
            }
            _ = shared.shutdown.cancelled() => break,
            _ = tx.closed() => break,
        }
        for ev in batch {
            if ev.rv <= start.after {
                continue;
            }
            last_rv = last_rv.max(ev.rv);
            if let Some(line) = out.render(&ev)
                && tx.send(line).await.is_err()
            {
                return;
            }
        }
        if let Some(rv) = bookmark {
            last_rv = last_rv.max(rv);
            if tx
                .send(bookmark_line(&k, last_rv, false, opts.protobuf))
                .await
                .is_err()
            {
                return;
            }
        }
    }
}
