//! Bearer tokens read from a file, as a pod's projected service-account token is: the kubelet
//! rewrites the file well before the token expires, and the API server refuses the old one
//! (401) once it has.
//!
//! kube-rs reads such a file again once a minute, so after a rotation a sidecar could be refused
//! for most of a minute, long enough to lose its Lease. Here the file is looked at again at most
//! once per [`RECHECK`] and read again whenever it changed, and a 401 makes the next request
//! read it whatever its time stamp says (as client-go resets its cached token on 401). A file
//! that cannot be read keeps the last token (it may be mounted only at start, kubernetes#68164).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Request, Response, StatusCode, header};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// How often the file is looked at for a new token.
pub const RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the token file {0} does not hold a token usable in an HTTP header")]
    Invalid(String),
}

/// What identifies a version of the file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    // Follows symbolic links: the kubelet swaps the directory a link points at.
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    })
}

#[derive(Debug)]
struct State {
    header: HeaderValue,
    stamp: Option<Stamp>,
    checked: Instant,
    refused: bool,
}

/// The token of one file, shared by every request of a client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TokenFile {
    path: PathBuf,
    state: Arc<Mutex<State>>,
}

fn bearer(path: &Path) -> Result<HeaderValue, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut value = HeaderValue::from_str(&format!("Bearer {}", text.trim()))
        .map_err(|_| TokenError::Invalid(path.display().to_string()))?;
    value.set_sensitive(true);
    Ok(value)
}

impl TokenFile {
    /// Reads the token at `path` (it must be readable now).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, TokenError> {
        let path = path.into();
        let stamp = stamp(&path);
        let header = bearer(&path)?;
        Ok(Self {
            path,
            state: Arc::new(Mutex::new(State {
                header,
                stamp,
                checked: Instant::now(),
                refused: false,
            })),
        })
    }

    /// The `Authorization` value to send now.
    pub fn header(&self) -> HeaderValue {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.refused || state.checked.elapsed() >= RECHECK {
            state.checked = Instant::now();
            let now = stamp(&self.path);
            if state.refused || now != state.stamp {
                match bearer(&self.path) {
                    Ok(header) => {
                        state.header = header;
                        state.stamp = now;
                    }
                    Err(err) => tracing::warn!(error = %err, "keeping the last token"),
                }
                state.refused = false;
            }
        }
        state.header.clone()
    }

    /// The API server refused the token: read the file again before the next request.
    pub fn refused(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .refused = true;
    }
}

/// Adds the token of a [`TokenFile`] to every request.
#[derive(Clone, Debug)]
pub struct TokenLayer(pub TokenFile);

impl<S> Layer<S> for TokenLayer {
    type Service = WithToken<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithToken {
            inner,
            token: self.0.clone(),
        }
    }
}

/// The service made by [`TokenLayer`].
#[derive(Clone, Debug)]
pub struct WithToken<S> {
    inner: S,
    token: TokenFile,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for WithToken<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        request
            .headers_mut()
            .insert(header::AUTHORIZATION, self.token.header());
        let answer = self.inner.call(request);
        let token = self.token.clone();
        Box::pin(async move {
            let response = answer.await.map_err(Into::into)?;
            if response.status() == StatusCode::UNAUTHORIZED {
                token.refused();
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replaces the token as the kubelet does: a new file renamed over the old.
    fn rotate(path: &Path, token: &str) {
        let next = path.with_extension("next");
        std::fs::write(&next, token).unwrap();
        std::fs::rename(&next, path).unwrap();
    }

    fn sent(token: &TokenFile) -> String {
        token.header().to_str().unwrap().to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn a_rotated_token_is_sent_within_a_second_or_at_once_after_a_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = TokenFile::open(&path).unwrap();
        assert_eq!(sent(&token), "Bearer first");
        assert!(token.header().is_sensitive());

        rotate(&path, "second-token");
        assert_eq!(sent(&token), "Bearer first", "looked at once a second");
        tokio::time::advance(RECHECK).await;
        assert_eq!(sent(&token), "Bearer second-token");

        rotate(&path, "third");
        token.refused();
        assert_eq!(sent(&token), "Bearer third", "read again after a 401");

        std::fs::remove_file(&path).unwrap();
        token.refused();
        assert_eq!(sent(&token), "Bearer third", "the last token is kept");
    }

    #[test]
    fn an_unreadable_token_file_is_an_error_naming_it() {
        let err = TokenFile::open("/nonexistent/token").unwrap_err();
        assert!(err.to_string().contains("/nonexistent/token"), "{err}");
    }
}
