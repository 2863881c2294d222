//! Handing the trace on: W3C `traceparent`/`tracestate` in the headers of API requests and the
//! metadata of CSI calls, and a client span for each API request (its verb, resource, status
//! code and the wait for the rate limiter inside it).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use tower::{Layer, Service};
use tracing::Instrument;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Writes `span`'s context into `headers`, as `OTEL_PROPAGATORS` says.
pub fn inject_headers(span: &tracing::Span, headers: &mut HeaderMap) {
    if let Some(propagator) = super::propagator() {
        propagator.inject_context(&span.context(), &mut HeaderInjector(headers));
    }
}

/// Writes `span`'s context into a gRPC request's metadata, as `OTEL_PROPAGATORS` says.
pub fn inject_metadata(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    if let Some(propagator) = super::propagator() {
        propagator.inject_context(&span.context(), &mut MetadataInjector(metadata));
    }
}

/// The server span of a gRPC call this process answers (`method`: `package.Service/Method`),
/// continuing the caller's trace when its metadata carries one; a disabled span when tracing
/// is off. End it with [`crate::driver::csi::record_code`].
pub fn server_span(method: &'static str, metadata: &tonic::metadata::MetadataMap) -> tracing::Span {
    if !super::enabled() {
        return tracing::Span::none();
    }
    let (service, name) = method.split_once('/').unwrap_or(("", method));
    let span = tracing::info_span!(
        parent: None,
        "grpc server",
        otel.name = method,
        otel.kind = "server",
        otel.status_code = Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = name,
        rpc.grpc.status_code = Empty,
    );
    if let Some(propagator) = super::propagator() {
        let caller = propagator.extract(&MetadataExtractor(metadata));
        if caller.span().span_context().is_valid() {
            let _ = span.set_parent(caller);
        }
    }
    span
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl opentelemetry::propagation::Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// What an API request is about, from its path: `/api/v1/namespaces/ns/pods/name/status`.
#[derive(Debug, PartialEq, Eq)]
pub struct ApiTarget<'a> {
    pub namespace: Option<&'a str>,
    pub resource: &'a str,
    pub name: Option<&'a str>,
    pub subresource: Option<&'a str>,
}

/// Reads the target of a Kubernetes API path; `None` for anything else (discovery, /version).
pub fn api_target(path: &str) -> Option<ApiTarget<'_>> {
    let mut parts = path.trim_start_matches('/').split('/');
    match parts.next()? {
        "api" => {
            parts.next()?;
        }
        "apis" => {
            parts.next()?;
            parts.next()?;
        }
        _ => return None,
    }
    let rest: Vec<&str> = parts.filter(|p| !p.is_empty()).collect();
    let (namespace, rest) = match rest.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(*ns), tail),
        other => (None, other),
    };
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub, ..] => (*resource, Some(*name), Some(*sub)),
        _ => return None,
    };
    Some(ApiTarget {
        namespace,
        resource,
        name,
        subresource,
    })
}

/// The Kubernetes verb of a request (client-go's words).
fn verb(method: &http::Method, target: &ApiTarget<'_>, query: Option<&str>) -> &'static str {
    let watch = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if target.name.is_none() => "list",
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if target.name.is_none() => "deletecollection",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// Tower layer giving each API request made inside a traced operation a client span and the
/// `traceparent` header; requests outside one (watches, lists of the caches, Lease renewals)
/// pass untouched.
#[derive(Clone, Debug)]
pub struct ApiTraceLayer {
    server: Arc<ApiServer>,
}

/// The API server as OpenTelemetry's HTTP client attributes name it.
#[derive(Debug)]
struct ApiServer {
    address: String,
    port: u16,
    /// `scheme://host:port`, for `url.full`.
    base: String,
}

impl ApiTraceLayer {
    /// Spans for requests to the API server at `cluster_url`.
    pub fn new(cluster_url: &http::Uri) -> Self {
        let scheme = cluster_url.scheme_str().unwrap_or("https");
        let port = cluster_url
            .port_u16()
            .unwrap_or(if scheme == "http" { 80 } else { 443 });
        let host = cluster_url.host().unwrap_or_default();
        Self {
            server: Arc::new(ApiServer {
                address: host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
                port,
                base: format!("{scheme}://{host}:{port}"),
            }),
        }
    }
}

impl<S> Layer<S> for ApiTraceLayer {
    type Service = ApiTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiTrace {
            inner,
            server: self.server.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ApiTrace<S> {
    inner: S,
    server: Arc<ApiServer>,
}

impl<S, B, R> Service<Request<B>> for ApiTrace<S>
where
    S: Service<Request<B>, Response = Response<R>> + Send,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let current = tracing::Span::current();
        let traced = super::enabled() && !current.is_none();
        let target = traced.then(|| api_target(request.uri().path())).flatten();
        let Some(target) = target else {
            return Box::pin(self.inner.call(request));
        };
        if !super::sampled(&current) {
            // The API server is told the trace is not sampled, and nothing else is built.
            inject_headers(&current, request.headers_mut());
            return Box::pin(self.inner.call(request));
        }
        let verb = verb(request.method(), &target, request.uri().query());
        if verb == "watch" {
            return Box::pin(self.inner.call(request));
        }
        super::attribute_work_done();
        let resource = match target.subresource {
            Some(sub) => format!("{}/{sub}", target.resource),
            None => target.resource.to_string(),
        };
        // The path and query only: credentials travel in headers, never in the URL.
        let path_and_query = request
            .uri()
            .path_and_query()
            .map_or_else(|| request.uri().path(), |p| p.as_str());
        let span = tracing::info_span!(
            "api request",
            otel.name = %format_args!("{verb} {resource}"),
            otel.kind = "client",
            otel.status_code = Empty,
            http.request.method = %request.method(),
            server.address = self.server.address.as_str(),
            server.port = self.server.port,
            url.full = %format_args!("{}{path_and_query}", self.server.base),
            url.path = request.uri().path(),
            k8s.verb = verb,
            k8s.resource = %resource,
            k8s.namespace.name = target.namespace,
            k8s.object.name = target.name,
            http.response.status_code = Empty,
            error.type = Empty,
        );
        inject_headers(&span, request.headers_mut());
        let pending = span.in_scope(|| self.inner.call(request));
        Box::pin(
            async move {
                let answer = pending.await;
                let current = tracing::Span::current();
                match &answer {
                    Ok(response) => {
                        let status = response.status();
                        current.record("http.response.status_code", status.as_u16());
                        if status.is_server_error() || status.is_client_error() {
                            current.record("otel.status_code", "ERROR");
                            current.record("error.type", status.as_str());
                        }
                    }
                    Err(_) => {
                        current.record("otel.status_code", "ERROR");
                        // No answer: the convention's word for an error of no known type.
                        current.record("error.type", "_OTHER");
                    }
                }
                answer
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_name_their_target() {
        assert_eq!(
            api_target("/api/v1/namespaces/ns/persistentvolumeclaims/c1/status"),
            Some(ApiTarget {
                namespace: Some("ns"),
                resource: "persistentvolumeclaims",
                name: Some("c1"),
                subresource: Some("status"),
            })
        );
        assert_eq!(
            api_target("/apis/storage.k8s.io/v1/volumeattachments"),
            Some(ApiTarget {
                namespace: None,
                resource: "volumeattachments",
                name: None,
                subresource: None,
            })
        );
        assert_eq!(
            api_target("/api/v1/namespaces/ns"),
            Some(ApiTarget {
                namespace: None,
                resource: "namespaces",
                name: Some("ns"),
                subresource: None,
            })
        );
        assert_eq!(api_target("/version"), None);
        assert_eq!(api_target("/apis"), None);
    }

    #[test]
    fn verbs_are_client_gos() {
        let named = api_target("/api/v1/namespaces/ns/pods/p").unwrap();
        let list = api_target("/api/v1/namespaces/ns/pods").unwrap();
        assert_eq!(verb(&http::Method::GET, &named, None), "get");
        assert_eq!(verb(&http::Method::GET, &list, Some("limit=500")), "list");
        assert_eq!(
            verb(
                &http::Method::GET,
                &list,
                Some("watch=true&resourceVersion=1")
            ),
            "watch"
        );
        assert_eq!(verb(&http::Method::PUT, &named, None), "update");
        assert_eq!(verb(&http::Method::DELETE, &list, None), "deletecollection");
    }
}
