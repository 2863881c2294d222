//! The HTTP edge: routing, content negotiation, Status bodies and watch streams.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::counters::{RequestCounters, Verb};
use super::discovery::{self, IncludeObject};
use super::error::ApiError;
use super::faults::{Faults, Hang, RequestInfo, Verdict};
use super::protobuf;
use super::registry::{Kind, KindId, Registry};
use super::reviews::{self, Reviews};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{
    Deleted, EventType, ListQuery, PatchType, Preconditions, Store, Target, WatchEvent, WatchFrom,
    WatchStart,
};

mod watch;

use watch::*;

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// State shared by all connections of one server.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Arc<Mutex<Store>>,
    pub registry: Arc<Registry>,
    pub faults: Faults,
    pub counters: RequestCounters,
    pub bookmark_interval: Duration,
    pub shutdown: CancellationToken,
    /// `127.0.0.1:PORT`, for `/api`'s serverAddressByClientCIDRs.
    pub address: String,
    /// The bearer tokens served besides [`super::ADMIN_TOKEN`] (`None`: every request).
    pub tokens: Mutex<Option<Vec<String>>>,
    /// What TokenReviews and SubjectAccessReviews are answered from.
    pub reviews: Reviews,
}

impl Shared {
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Serves one request; every failure becomes a Status response.
pub(crate) async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    // Errors are Status bodies in the negotiated encoding, as upstream.
    let proto_status = negotiate(req.headers()) == Ok(Rendering::Protobuf);
    if !authenticated(&shared, req.headers()) {
        return status_response(&ApiError::from_code(401, "Unauthorized"), proto_status);
    }
    match route(&shared, req).await {
        Ok(resp) => resp,
        Err(e) => status_response(&e, proto_status),
    }
}

/// Whether the request's bearer token is one the server accepts now.
fn authenticated(shared: &Shared, headers: &header::HeaderMap) -> bool {
    let tokens = shared.tokens.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(tokens) = tokens.as_ref() else {
        return true;
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    token.is_some_and(|t| t == super::ADMIN_TOKEN || tokens.iter().any(|a| a == t))
}

fn body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

fn respond(code: u16, content_type: &str, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(body(bytes));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    respond(
        code,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

/// An object in the negotiated encoding: protobuf when asked for and the kind has it.
fn object_response(code: u16, rendering: Rendering, v: &Value) -> Response<Body> {
    if rendering == Rendering::Protobuf {
        let api_version = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
        if protobuf::supported(api_version, kind)
            && let Ok(bytes) = protobuf::encode_object(v)
        {
            return respond(code, protobuf::MEDIA_TYPE, bytes);
        }
    }
    json_response(code, v)
}

fn status_response(e: &ApiError, protobuf: bool) -> Response<Body> {
    let mut resp = status_body(e.code, &e.to_status(), protobuf);
    // As the real server does for any Status that carries a retry delay.
    if let Some(seconds) = e.retry_after_seconds() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
    }
    resp
}

/// A `Status` body: protobuf when the client prefers it, JSON otherwise.
fn status_body(code: u16, status: &Value, protobuf: bool) -> Response<Body> {
    if protobuf {
        match protobuf::encode_status(status) {
            Ok(bytes) => return respond(code, protobuf::MEDIA_TYPE, bytes),
            Err(e) => tracing::warn!("a Status has no protobuf encoding: {e}"),
        }
    }
    json_response(code, status)
}

fn not_found_path() -> ApiError {
    ApiError::from_code(404, "the server could not find the requested resource")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn flag(q: &HashMap<String, String>, name: &str) -> bool {
    q.get(name).is_some_and(|v| v == "true" || v == "1")
}

/// How the client wants objects rendered, from the Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rendering {
    Json,
    Table,
    /// Protobuf for the kinds that have it here, JSON for the others (client-go
    /// decodes a response by its Content-Type).
    Protobuf,
}

fn negotiate(headers: &header::HeaderMap) -> Result<Rendering, ApiError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(Rendering::Json);
    };
    let mut json_ok = false;
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        let params: Vec<&str> = parts.collect();
        let is_json = matches!(media, "application/json" | "*/*" | "application/*" | "");
        let as_other = params.iter().any(|p| p.starts_with("as="));
        if protobuf::is_protobuf(media) && !as_other && !json_ok {
            return Ok(Rendering::Protobuf);
        }
        if is_json && params.contains(&"as=Table") {
            if params.contains(&"g=meta.k8s.io")
                && (params.contains(&"v=v1") || params.contains(&"v=v1beta1"))
            {
                return Ok(Rendering::Table);
            }
            continue;
        }
        // Other `as=` renderings (PartialObjectMetadata, aggregated discovery) fall through to plain JSON.
        json_ok |= is_json;
    }
    if json_ok {
        Ok(Rendering::Json)
    } else {
        Err(ApiError::not_acceptable(format!(
            "the server was unable to respond with a content type that the client supports (accept: {accept})"
        )))
    }
}

/// Whether the Accept header (or its absence) allows a JSON answer.
fn accepts_json(headers: &header::HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    accept.split(',').any(|e| {
        matches!(
            e.split(';').next().unwrap_or("").trim(),
            "application/json" | "*/*" | "application/*" | ""
        )
    })
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let segments: Vec<String> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let get_only = |doc: Option<Value>| -> Result<Response<Body>, ApiError> {
        if req.method() != Method::GET {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        doc.map(|d| json_response(200, &d))
            .ok_or_else(not_found_path)
    };
    match segs.as_slice() {
        ["healthz" | "livez" | "readyz", ..] => Ok(respond(200, "text/plain; charset=utf-8", "ok")),
        ["version"] => get_only(Some(discovery::version())),
        // The feature gate gauges of kube-apiserver's metrics, so a client can tell
        // which gated fields the server keeps.
        ["metrics"] if req.method() == Method::GET => Ok(respond(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            shared.store().feature_gates().metrics_text(),
        )),
        ["api"] => get_only(Some(discovery::api_versions(&shared.address))),
        ["api", version] => get_only(discovery::api_resource_list(&shared.registry, "", version)),
        ["apis"] => get_only(Some(discovery::api_group_list(&shared.registry))),
        ["apis", group] => get_only(discovery::api_group(&shared.registry, group)),
        ["apis", group, version] => get_only(discovery::api_resource_list(
            &shared.registry,
            group,
            version,
        )),
        ["openapi", "v3"] => get_only(Some(discovery::openapi_v3_root(&shared.registry))),
        ["openapi", "v3", "api", version] => get_only(discovery::openapi_v3_group_version(
            &shared.registry,
            "",
            version,
        )),
        ["openapi", "v3", "apis", group, version] => get_only(discovery::openapi_v3_group_version(
            &shared.registry,
            group,
            version,
        )),
        ["apis", group, "v1", plural] if reviews::is_review(group, plural) => {
            let plural = plural.to_string();
            review(shared, req, &plural).await
        }
        ["api", version, rest @ ..] => {
            resource(
                shared,
                req,
                "",
                version,
                &rest.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .await
        }
        ["apis", group, version, rest @ ..] => {
            let (g, v) = (group.to_string(), version.to_string());
            resource(
                shared,
                req,
                &g,
                &v,
                &rest.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .await
        }
        _ => Err(not_found_path()),
    }
}

/// A resolved resource URL.
#[derive(Debug)]
struct ResourcePath {
    kind: KindId,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn resolve(
    registry: &Registry,
    group: &str,
    version: &str,
    rest: &[String],
) -> Result<ResourcePath, ApiError> {
    let namespace_sub = rest.len() == 3 && matches!(rest[2].as_str(), "status" | "finalize");
    let (namespace, rest) = match rest {
        [ns_word, ns, tail @ ..]
            if ns_word == "namespaces" && !tail.is_empty() && !namespace_sub =>
        {
            (Some(ns.clone()), tail)
        }
        _ => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [p] => (p, None, None),
        [p, n] => (p, Some(n.clone()), None),
        [p, n, s] => (p, Some(n.clone()), Some(s.clone())),
        _ => return Err(not_found_path()),
    };
    let kind = registry
        .lookup(group, version, plural)
        .ok_or_else(not_found_path)?;
    let k = registry.get(kind);
    let scope_ok = !matches!(
        (k.namespaced, &namespace, &name),
        (false, Some(_), _) | (true, None, Some(_))
    );
    let sub_ok = subresource
        .as_deref()
        .is_none_or(|s| s == "status" && k.status_subresource);
    if !scope_ok || !sub_ok {
        return Err(not_found_path());
    }
    Ok(ResourcePath {
        kind,
        namespace,
        name,
        subresource,
    })
}

fn dry_run(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid dry run value: {other:?}, valid values are: All"
        ))),
    }
}

async fn read_json(req: Request<Incoming>) -> Result<Value, ApiError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let bytes = read_body(req).await?;
    let media = content_type.split(';').next().unwrap_or("").trim();
    if protobuf::is_protobuf(media) {
        return protobuf::decode_object(&bytes).map_err(|e| match e {
            protobuf::ProtoError::Unsupported { .. } => ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json ({e})"
            )),
            other => ApiError::bad_request(format!("error decoding request body: {other}")),
        });
    }
    if !matches!(media, "application/json" | "" | "*/*") {
        return Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/vnd.kubernetes.protobuf (got {media})"
        )));
    }
    parse_json(&bytes)
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    req.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))
}

fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

fn list_query<'a>(
    k: &Kind,
    q: &'a HashMap<String, String>,
    namespace: Option<&'a str>,
) -> Result<ListQuery<'a>, ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""), k)
        .map_err(|e| ApiError::bad_request(e.0))?;
    let limit = match q.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => Some(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?
                .max(0) as usize,
        ),
        None => None,
    };
    let exact = match q.get("resourceVersionMatch").map(String::as_str) {
        None | Some("") | Some("NotOlderThan") => false,
        Some("Exact") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                k,
                "",
                "resourceVersionMatch",
                "FieldValueNotSupported",
                &format!("Unsupported value: {other:?}"),
            ));
        }
    };
    Ok(ListQuery {
        namespace,
        labels,
        fields,
        limit,
        continue_token: q.get("continue").map(String::as_str),
        resource_version: q.get("resourceVersion").map(String::as_str),
        exact,
    })
}

async fn resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[String],
) -> Result<Response<Body>, ApiError> {
    let path = resolve(&shared.registry, group, version, rest)?;
    let q = parse_query(req.uri().query());
    let verb = match (req.method().clone(), path.name.is_some()) {
        (Method::GET, false) if flag(&q, "watch") => Verb::Watch,
        (Method::GET, false) => Verb::List,
        (Method::GET, true) => Verb::Get,
        (Method::POST, false) => Verb::Create,
        (Method::PUT, true) => Verb::Update,
        (Method::PATCH, true) => Verb::Patch,
        (Method::DELETE, true) => Verb::Delete,
        (Method::DELETE, false) => Verb::DeleteCollection,
        (m, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            )));
        }
    };
    let k = shared.registry.get(path.kind).clone();
    let agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    shared
        .counters
        .record(verb, k.plural, path.subresource.as_deref(), agent);
    if let Some(traceparent) = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
    {
        shared.counters.record_traceparent(
            verb,
            k.plural,
            path.subresource.as_deref(),
            traceparent,
        );
    }
    let info = RequestInfo {
        verb,
        resource: k.plural,
        subresource: path.subresource.as_deref(),
        name: path.name.as_deref(),
        namespace: path.namespace.as_deref(),
    };
    let verdict = shared.faults.check(&info);
    faulted(shared, verdict, serve_verb(shared, req, path, &q, verb, &k)).await
}

/// Serves a request as the faults' verdict says: after their latency, failed with their
/// error, or never answered when they hang it (before or after it is served).
async fn faulted(
    shared: &Arc<Shared>,
    verdict: Verdict,
    serve: impl Future<Output = Result<Response<Body>, ApiError>>,
) -> Result<Response<Body>, ApiError> {
    if !verdict.delay.is_zero() {
        tokio::time::sleep(verdict.delay).await;
    }
    if let Some(e) = verdict.error {
        return Err(e);
    }
    if verdict.hang == Some(Hang::BeforeServing) {
        return hang_up(shared).await;
    }
    let answer = serve.await;
    if verdict.hang == Some(Hang::AfterServing) {
        return hang_up(shared).await;
    }
    answer
}

/// A TokenReview or SubjectAccessReview (`plural`): only created, never stored; counted and
/// faulted as a create of that resource.
async fn review(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    plural: &str,
) -> Result<Response<Body>, ApiError> {
    if req.method() != Method::POST {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            req.method()
        )));
    }
    let agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    shared.counters.record(Verb::Create, plural, None, agent);
    let verdict = shared.faults.check(&RequestInfo {
        verb: Verb::Create,
        resource: plural,
        subresource: None,
        name: None,
        namespace: None,
    });
    let serve = async {
        // Protobuf when the client prefers it, as client-go's typed clients do; JSON otherwise
        // (a Table is not rendered for a create).
        let rendering = negotiate(req.headers())?;
        let body = read_review(req, plural).await?;
        let answer = if plural == "tokenreviews" {
            shared
                .reviews
                .token_review(&body, std::time::SystemTime::now())?
        } else {
            shared.reviews.subject_access_review(&body)?
        };
        if rendering == Rendering::Protobuf {
            match protobuf::encode_object(&answer) {
                Ok(bytes) => return Ok(respond(201, protobuf::MEDIA_TYPE, bytes)),
                Err(e) => tracing::warn!("a {plural} answer has no protobuf encoding: {e}"),
            }
        }
        Ok(json_response(201, &answer))
    };
    faulted(shared, verdict, serve).await
}

/// The body of a review sent to `plural`, in JSON or protobuf. A protobuf envelope must
/// carry the resource's type (or none, which is taken to be it), as the real server's
/// decoding into the endpoint's kind demands.
async fn read_review(req: Request<Incoming>, plural: &str) -> Result<Value, ApiError> {
    let is_protobuf = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| protobuf::is_protobuf(ct.split(';').next().unwrap_or("")));
    if !is_protobuf {
        return read_json(req).await;
    }
    let (group, kind) = reviews::RESOURCES
        .iter()
        .find(|(_, p, _)| *p == plural)
        .map(|(g, _, k)| (*g, *k))
        .ok_or_else(not_found_path)?;
    let expected = format!("{group}/v1");
    let bytes = read_body(req).await?;
    let (mut api_version, mut sent_kind, raw) = protobuf::unwrap_envelope(&bytes)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
    if api_version.is_empty() {
        api_version.clone_from(&expected);
    }
    if sent_kind.is_empty() {
        sent_kind = kind.to_string();
    }
    if api_version != expected {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({expected})"
        )));
    }
    if sent_kind != kind {
        return Err(ApiError::bad_request(format!(
            "{sent_kind} in version \"v1\" cannot be handled as a {kind}: no kind \"{sent_kind}\" is registered for version \"{expected}\""
        )));
    }
    protobuf::decode_raw(&api_version, kind, &raw)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

/// A request that is never answered: it waits until the server shuts down.
async fn hang_up(shared: &Arc<Shared>) -> Result<Response<Body>, ApiError> {
    shared.shutdown.cancelled().await;
    Err(ApiError::from_code(503, "the server is shutting down"))
}

/// Serves one resource request that has passed the faults.
async fn serve_verb(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    path: ResourcePath,
    q: &HashMap<String, String>,
    verb: Verb,
    k: &Kind,
) -> Result<Response<Body>, ApiError> {
    let rendering = negotiate(req.headers())?;
    if rendering == Rendering::Protobuf
        && !protobuf::supported(&k.api_version(), k.kind)
        && !accepts_json(req.headers())
    {
        return Err(ApiError::not_acceptable(format!(
            "the server was unable to respond with a content type that the client supports (no protobuf encoding of {} here)",
            k.kind
        )));
    }
    let ns = path.namespace.clone().unwrap_or_default();
    let name = path.name.clone().unwrap_or_default();
    let target = if path.subresource.is_some() {
        Target::Status
    } else {
        Target::Main
    };
    match verb {
        Verb::Get => {
            let obj = shared.store().get(path.kind, &ns, &name)?;
            Ok(match rendering {
                Rendering::Json => respond(
                    200,
                    "application/json",
                    serde_json::to_vec(&*obj).unwrap_or_default(),
                ),
                Rendering::Protobuf => object_response(200, rendering, &obj),
                Rendering::Table => {
                    let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
                    json_response(
                        200,
                        &discovery::table([&*obj], meta, include_object(q)?, true),
                    )
                }
            })
        }
        Verb::List => list(
            shared,
            k,
            path.kind,
            q,
            path.namespace.as_deref(),
            rendering,
        ),
        Verb::Watch => watch(shared, k, path.kind, q, path.namespace, rendering),
        Verb::Create => {
            let dry = dry_run(q)?;
            let obj = read_json(req).await?;
            let created = shared.store().create(path.kind, &ns, obj, dry)?;
            Ok(object_response(201, rendering, &created))
        }
        Verb::Update => {
            let dry = dry_run(q)?;
            let obj = read_json(req).await?;
            let updated = shared
                .store()
                .update(path.kind, &ns, &name, obj, target, dry)?;
            Ok(object_response(200, rendering, &updated))
        }
        Verb::Patch => {
            let dry = dry_run(q)?;
            let content_type = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let patch_type = match content_type.as_str() {
                "application/merge-patch+json" => PatchType::Merge,
                "application/json-patch+json" => PatchType::Json,
                "application/strategic-merge-patch+json" => PatchType::Strategic,
                "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                    return Err(ApiError::unsupported_media_type(
                        "server-side apply is not supported by this API server; use a merge, JSON or strategic merge patch",
                    ));
                }
                other => {
                    return Err(ApiError::unsupported_media_type(format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                    )));
                }
            };
            let patch = parse_json(&read_body(req).await?)?;
            let patched = shared
                .store()
                .patch(path.kind, &ns, &name, patch_type, &patch, target, dry)?;
            Ok(object_response(200, rendering, &patched))
        }
        Verb::Delete => {
            let (pre, body_dry) = delete_options(req).await?;
            let dry = dry_run(q)? || body_dry;
            let outcome = shared.store().delete(path.kind, &ns, &name, &pre, dry)?;
            Ok(match outcome {
                Deleted::Removed(obj) if !k.custom => status_body(
                    200,
                    &deleted_status(k, &obj),
                    rendering == Rendering::Protobuf,
                ),
                Deleted::Removed(obj) | Deleted::Pending(obj) => {
                    object_response(200, rendering, &obj)
                }
            })
        }
        Verb::DeleteCollection => {
            let (pre, body_dry) = delete_options(req).await?;
            let dry = dry_run(q)? || body_dry;
            let query = list_query(k, q, path.namespace.as_deref())?;
            let mut store = shared.store();
            let page = store.list(
                path.kind,
                &ListQuery {
                    limit: None,
                    continue_token: None,
                    resource_version: None,
                    ..query
                },
            )?;
            let mut items = Vec::new();
            for obj in page.items {
                let (ons, oname) = super::store::key_of(&obj);
                match store.delete(path.kind, &ons, &oname, &pre, dry) {
                    Ok(Deleted::Removed(o) | Deleted::Pending(o)) => items.push(o),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let rv = store.resource_version();
            drop(store);
            let meta = json!({"resourceVersion": rv.to_string()});
            Ok(match rendering {
                Rendering::Protobuf => list_response(k, &items, meta),
                Rendering::Json | Rendering::Table => {
                    respond(200, "application/json", list_bytes(k, &items, meta))
                }
            })
        }
    }
}

async fn delete_options(req: Request<Incoming>) -> Result<(Preconditions, bool), ApiError> {
    let proto = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| protobuf::is_protobuf(ct.split(';').next().unwrap_or("")));
    let bytes = read_body(req).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok((Preconditions::default(), false));
    }
    let v = if proto {
        protobuf::decode_delete_options(&bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    } else {
        parse_json(&bytes)?
    };
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    let dry = v
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok((
        Preconditions {
            uid: s("/preconditions/uid"),
            resource_version: s("/preconditions/resourceVersion"),
        },
        dry,
    ))
}

fn deleted_status(k: &Kind, obj: &Value) -> Value {
    let mut details =
        json!({"name": obj["metadata"]["name"], "kind": k.plural, "uid": obj["metadata"]["uid"]});
    if !k.group.is_empty() {
        details["group"] = json!(k.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

fn include_object(q: &HashMap<String, String>) -> Result<IncludeObject, ApiError> {
    match q.get("includeObject").map(String::as_str) {
        None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
        Some("None") => Ok(IncludeObject::None),
        Some("Object") => Ok(IncludeObject::Object),
        Some(other) => Err(ApiError::bad_request(format!(
            "unsupported includeObject {other:?}"
        ))),
    }
}

/// Serializes a list response, reusing each item's JSON without building one big Value.
fn list_bytes(k: &Kind, items: &[Arc<Value>], meta: Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + items.len() * 512);
    out.extend_from_slice(b"{\"kind\":\"");
    out.extend_from_slice(discovery::list_kind(k).as_bytes());
    out.extend_from_slice(b"\",\"apiVersion\":\"");
    out.extend_from_slice(k.api_version().as_bytes());
    out.extend_from_slice(b"\",\"metadata\":");
    out.extend_from_slice(meta.to_string().as_bytes());
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Serializing a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &**item);
    }
    out.extend_from_slice(b"]}");
    out
}

/// A list for a client that prefers protobuf: protobuf for the kinds that
/// have it, JSON for the others (which client-go decodes by Content-Type).
fn list_response(k: &Kind, items: &[Arc<Value>], meta: Value) -> Response<Body> {
    if protobuf::supported(&k.api_version(), k.kind) {
        let refs: Vec<&Value> = items.iter().map(|o| &**o).collect();
        match protobuf::encode_list(&k.api_version(), k.kind, &refs, &meta) {
            Ok(bytes) => return respond(200, protobuf::MEDIA_TYPE, bytes),
            Err(e) => tracing::warn!("a {} list has no protobuf encoding: {e}", k.kind),
        }
    }
    respond(200, "application/json", list_bytes(k, items, meta))
}

fn list(
    shared: &Shared,
    k: &Kind,
    kind: KindId,
    q: &HashMap<String, String>,
    namespace: Option<&str>,
    rendering: Rendering,
) -> Result<Response<Body>, ApiError> {
    let query = list_query(k, q, namespace)?;
    let page = shared.store().list(kind, &query)?;
    let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(r) = page.remaining {
        meta["remainingItemCount"] = json!(r);
    }
    Ok(match rendering {
        Rendering::Protobuf => {
            let response = list_response(k, &page.items, meta);
            let content_type = response.headers().get(header::CONTENT_TYPE);
            if content_type.is_some_and(|v| v == protobuf::MEDIA_TYPE) {
                shared.counters.record_protobuf_list(k.plural);
            }
            response
        }
        Rendering::Json => respond(200, "application/json", list_bytes(k, &page.items, meta)),
        Rendering::Table => json_response(
            200,
            &discovery::table(
                page.items.iter().map(|o| &**o),
                meta,
                include_object(q)?,
                true,
            ),
        ),
    })
}

#[cfg(test)]
mod tests;
