//! Time bounds on every request to the API server, so that a connection the network black-holes
//! (a control-plane node gone after the handshake, a stalled load balancer) costs a controller
//! one failed call, never a stuck worker, journal or Event writer.
//!
//! - A call other than a watch or a read must be answered, its body included, within
//!   [`REQUEST_TIMEOUT`].
//! - A read (GET) must be answered within the same time, and then show a frame of its body at
//!   least once per [`REQUEST_TIMEOUT`]: a large list sent slowly (a server without streaming
//!   lists sends a whole collection at once; kube-apiserver itself allows it 60 s) completes as
//!   long as it moves, and a stalled one fails as fast as a stalled write.
//! - A watch must be answered within the same time, and then show a frame (an event or a
//!   bookmark) at least once per its own `timeoutSeconds` plus [`WATCH_SLACK`]: the server ends
//!   a watch at its timeout, and kube-apiserver's watch cache sends a bookmark every minute, so
//!   a watch silent for longer is dead and is re-established from its last resourceVersion.
//!
//! A request that runs out of time is abandoned with its connection (an HTTP/1.1 connection
//! with a request in flight is never handed out again), so the caller's retry goes out on a new
//! one. Retrying is the caller's: the layer cannot tell whether a write reached the server.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Service};

/// Longest time a call other than a watch may take, answer and body included. kube-apiserver
/// ends a request itself after 60 s (its `--request-timeout`), but a write it answers at all is
/// answered within a second, or within the time of its admission webhooks; 30 s lets a stalled
/// write be retried on a new connection while the claim that waits for it is still young.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long past its own timeout a silent watch is still given.
pub const WATCH_SLACK: Duration = Duration::from_secs(10);

/// The watch timeout assumed when a watch names none (kube-rs's default `timeoutSeconds`).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(290);

/// Why a request was abandoned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeadlineError {
    #[error("no complete answer from the API server within {0:?}")]
    Request(Duration),
    #[error("the watch showed nothing (no event, no bookmark) for {0:?}")]
    WatchIdle(Duration),
    #[error("the answer's body stalled (nothing received) for {0:?}")]
    Stalled(Duration),
}

/// Whether a request to `uri` is a watch (`watch=true` or `watch=1` in its query).
pub fn is_watch(uri: &http::Uri) -> bool {
    uri.query()
        .unwrap_or("")
        .split('&')
        .any(|pair| matches!(pair.split_once('='), Some(("watch", "true" | "1"))))
}

/// The time bound of one request, from its method and URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Answer and body within this time.
    Total(Duration),
    /// Answer within [`REQUEST_TIMEOUT`], then a frame at least this often (a watch).
    Idle(Duration),
    /// Answer within [`REQUEST_TIMEOUT`], then a body frame at least this often (a read).
    Progress(Duration),
}

impl Bound {
    /// The bound of a `method` request to `uri`: a watch (`watch=true` or `watch=1` in its
    /// query) is bounded by its silence, any other read by its progress, any other call by
    /// its total time.
    pub fn of(method: &http::Method, uri: &http::Uri) -> Self {
        let mut watch = false;
        let mut timeout = None;
        for pair in uri.query().unwrap_or("").split('&') {
            match pair.split_once('=') {
                Some(("watch", "true" | "1")) => watch = true,
                Some(("timeoutSeconds", seconds)) => timeout = seconds.parse::<u64>().ok(),
                _ => {}
            }
        }
        if !watch {
            return if method == http::Method::GET {
                Self::Progress(REQUEST_TIMEOUT)
            } else {
                Self::Total(REQUEST_TIMEOUT)
            };
        }
        let timeout = timeout.map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
        Self::Idle(timeout.saturating_add(WATCH_SLACK))
    }
}

/// The transport with [`Bound`]s applied.
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
}

impl<S> Deadline<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ReqBody> Service<Request<ReqBody>> for Deadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Bounded<B>>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let bound = Bound::of(request.method(), request.uri());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let started = Instant::now();
            let head_deadline = started + REQUEST_TIMEOUT;
            let response = match tokio::time::timeout_at(head_deadline, answer).await {
                Ok(response) => response.map_err(Into::into)?,
                Err(_) => return Err(DeadlineError::Request(REQUEST_TIMEOUT).into()),
            };
            Ok(response.map(|body| Bounded::new(body, bound, started)))
        })
    }
}

/// A response body that fails once its [`Bound`] is passed.
#[derive(Debug)]
pub struct Bounded<B> {
    inner: B,
    bound: Bound,
    timer: Pin<Box<Sleep>>,
}

impl<B> Bounded<B> {
    fn new(inner: B, bound: Bound, started: Instant) -> Self {
        let deadline = match bound {
            Bound::Total(limit) => started + limit,
            Bound::Idle(limit) | Bound::Progress(limit) => Instant::now() + limit,
        };
        Self {
            inner,
            bound,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }
}

impl<B> Body for Bounded<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Bound::Idle(limit) | Bound::Progress(limit) = this.bound {
                this.timer.as_mut().reset(Instant::now() + limit);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        ready!(this.timer.as_mut().poll(cx));
        let error = match this.bound {
            Bound::Total(limit) => DeadlineError::Request(limit),
            Bound::Idle(limit) => DeadlineError::WatchIdle(limit),
            Bound::Progress(limit) => DeadlineError::Stalled(limit),
        };
        Poll::Ready(Some(Err(error.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::StreamExt;
    use http_body_util::{BodyExt, StreamBody};

    #[test]
    fn watches_are_bounded_by_their_silence_reads_by_their_progress_and_writes_by_their_time() {
        let bound = |uri: &str| Bound::of(&http::Method::GET, &uri.parse().unwrap());
        let write = |method: http::Method| {
            Bound::of(
                &method,
                &"/api/v1/namespaces/ns/configmaps/j".parse().unwrap(),
            )
        };
        for method in [
            http::Method::PUT,
            http::Method::POST,
            http::Method::PATCH,
            http::Method::DELETE,
        ] {
            assert_eq!(write(method), Bound::Total(REQUEST_TIMEOUT));
        }
        assert_eq!(
            bound(
                "/api/v1/persistentvolumes?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true"
            ),
            Bound::Idle(Duration::from_secs(300))
        );
        assert_eq!(
            bound("/api/v1/persistentvolumes?watch=1"),
            Bound::Idle(DEFAULT_WATCH_TIMEOUT + WATCH_SLACK)
        );
        assert_eq!(
            bound("/api/v1/persistentvolumes?limit=500"),
            Bound::Progress(REQUEST_TIMEOUT)
        );
        assert_eq!(
            bound("/api/v1/persistentvolumes?watch=false"),
            Bound::Progress(REQUEST_TIMEOUT)
        );
        assert_eq!(bound("/version"), Bound::Progress(REQUEST_TIMEOUT));
    }

    fn trickle(
        gaps: Vec<Duration>,
    ) -> StreamBody<impl futures::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>>>
    {
        StreamBody::new(futures::stream::iter(gaps).then(|gap| async move {
            tokio::time::sleep(gap).await;
            Ok(Frame::data(Bytes::from_static(b"x")))
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_lives_while_it_shows_frames_and_dies_when_silent() {
        let limit = Duration::from_secs(10);
        let gaps = vec![Duration::from_secs(9); 5]
            .into_iter()
            .chain([Duration::from_secs(11)])
            .collect();
        let mut body = Bounded::new(Box::pin(trickle(gaps)), Bound::Idle(limit), Instant::now());
        for _ in 0..5 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            error.downcast_ref::<DeadlineError>(),
            Some(&DeadlineError::WatchIdle(limit))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_lives_while_its_body_moves_however_long_it_takes() {
        // A large list trickled over 45 s, a frame every 9 s, then a stall.
        let limit = REQUEST_TIMEOUT;
        let gaps = vec![Duration::from_secs(9); 5]
            .into_iter()
            .chain([Duration::from_secs(31)])
            .collect();
        let started = Instant::now();
        let mut body = Bounded::new(Box::pin(trickle(gaps)), Bound::Progress(limit), started);
        for _ in 0..5 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        assert_eq!(started.elapsed(), Duration::from_secs(45));
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            error.downcast_ref::<DeadlineError>(),
            Some(&DeadlineError::Stalled(limit))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_body_must_end_within_the_total_time() {
        let limit = Duration::from_secs(30);
        let gaps = vec![Duration::from_secs(9); 5];
        let mut body = Bounded::new(Box::pin(trickle(gaps)), Bound::Total(limit), Instant::now());
        for _ in 0..3 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            error.downcast_ref::<DeadlineError>(),
            Some(&DeadlineError::Request(limit))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_never_comes_fails_the_call() {
        let never = tower::service_fn(|_: Request<()>| {
            futures::future::pending::<Result<Response<String>, std::convert::Infallible>>()
        });
        let started = Instant::now();
        let error = tower::ServiceExt::oneshot(
            Deadline::new(never),
            Request::get("/api/v1/namespaces/ns/configmaps/j")
                .body(())
                .unwrap(),
        )
        .await
        .unwrap_err();
        assert_eq!(started.elapsed(), REQUEST_TIMEOUT);
        assert_eq!(
            error.downcast_ref::<DeadlineError>(),
            Some(&DeadlineError::Request(REQUEST_TIMEOUT))
        );
    }
}
