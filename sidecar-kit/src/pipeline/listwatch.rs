//! One kind's list and watch, as client-go's reflector makes them: a list served by the API
//! server's watch cache (`resourceVersion=0`), then a watch from the list's resourceVersion,
//! started again from the last version seen whenever it ends. Each object is decoded on its
//! own as its bytes arrive (see [`ListBody`]), so a list of 100 000 claims never sits in
//! memory whole.
//!
//! A list rather than a streaming list (`sendInitialEvents`): kube-apiserver v1.34 answers a
//! list of 100 000 claims from its cache in about 2 s, and streams the same claims as watch
//! events in 13 s or more.

use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::core::{Request, Status};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::io::StreamReader;

use crate::pipeline::Change;
use crate::pipeline::listing::{ListBody, ListError, ListReader, Part, drop_managed_fields};
use crate::pipeline::protobuf::{self, Decoder, ProtobufList, list_version};

/// The largest object read from a list or a watch: well above what etcd stores (1.5 MiB by
/// default), and what a hostile or broken server can make one object cost.
pub const MAX_OBJECT: usize = 8 << 20;

/// The most of an error's body that is read.
const MAX_STATUS: usize = 64 << 10;

/// How long a watch asks to last unless configured otherwise (kube-apiserver's limit is less
/// than 5 minutes); it is started again from the last version seen.
const WATCH_TIMEOUT: u32 = 290;

/// Why a list or watch ended early.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Request(kube::Error),
    #[error("the API server answered {code}: {message}")]
    Status { code: u16, message: String },
    /// The watch's resourceVersion is older than the server still has: list again.
    #[error("the resourceVersion watched from is gone from the API server")]
    Gone,
    #[error("reading the answer: {0}")]
    Read(std::io::Error),
    #[error("the list's body: {0}")]
    List(#[from] ListError),
    #[error("the list's metadata: {0}")]
    Metadata(String),
    #[error("the list has no resourceVersion to watch from")]
    NoVersion,
    /// A watch event that cannot be read is a change lost: list again.
    #[error("a watch event cannot be read: {0}")]
    Event(String),
}

impl Failure {
    fn of_status(status: &Status) -> Self {
        if status.code == 410 {
            Self::Gone
        } else {
            Self::Status {
                code: status.code,
                message: status.message.clone(),
            }
        }
    }
}

/// What a list is asked for in when its kind has a [`Decoder`]: protobuf, as upstream's
/// sidecars do, or JSON from a server that has no protobuf for it.
const PROTOBUF_OR_JSON: &str = "application/vnd.kubernetes.protobuf, application/json";

/// Where one kind's objects are listed and watched.
pub struct Source {
    kind: String,
    client: kube::Client,
    request: Request,
    labels: Option<String>,
    fields: Option<String>,
    timeout: u32,
}

impl Source {
    pub fn new<K: kube::Resource>(kind: String, api: Api<K>, config: &watcher::Config) -> Self {
        Self {
            kind,
            request: Request::new(api.resource_url()),
            client: api.into_client(),
            labels: config.label_selector.clone(),
            fields: config.field_selector.clone(),
            timeout: config.timeout.unwrap_or(WATCH_TIMEOUT),
        }
    }

    /// The kind's name, in logs.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Lists the objects, handing `each` a [`Change::Relist`] once the server answers, then
    /// every object as [`Change::Listed`] as soon as it is read; returns the list's
    /// resourceVersion. `consistent` lists at the server's newest version instead of what its
    /// cache has: after a watch whose version is gone, so that the list does not go back.
    /// An object that cannot be read is logged and left out, rather than failing every list.
    /// With a `protobuf` decoder the list is asked for in protobuf, and read in whichever of
    /// protobuf and JSON the server answers in.
    pub async fn list<K: DeserializeOwned>(
        &self,
        consistent: bool,
        protobuf: Option<Decoder<K>>,
        mut each: impl FnMut(Change<K>),
    ) -> Result<String, Failure> {
        let mut params = ListParams {
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            ..ListParams::default()
        };
        if !consistent {
            params = params.at("0");
        }
        let mut request = self
            .request
            .list(&params)
            .map_err(|e| Failure::Request(kube::Error::BuildRequest(e)))?;
        if protobuf.is_some() {
            request.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(PROTOBUF_OR_JSON),
            );
        }
        let started = std::time::Instant::now();
        let (headers, mut body) = self.open(request).await?;
        let in_protobuf = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(protobuf::MEDIA_TYPE));
        let decoder = protobuf.filter(|_| in_protobuf);
        each(Change::Relist);
        let mut list: Box<dyn ListReader> = match decoder {
            Some(_) => Box::new(ProtobufList::new(MAX_OBJECT)),
            None => Box::new(ListBody::new(MAX_OBJECT)),
        };
        let mut version = None;
        let (mut listed, mut unreadable) = (0usize, 0usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(Failure::Request)?;
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            let mut input = &chunk[..];
            while let Some(part) = list.next(&mut input)? {
                match part {
                    Part::Item(item) => {
                        let object = match decoder {
                            Some(decode) => decode(item).map_err(|e| e.to_string()),
                            None => {
                                drop_managed_fields(item, &[]);
                                serde_json::from_slice::<K>(item).map_err(|e| e.to_string())
                            }
                        };
                        match object {
                            Ok(object) => {
                                listed += 1;
                                each(Change::Listed(object));
                            }
                            Err(error) => {
                                unreadable += 1;
                                // The first names the cause; the count of the rest follows.
                                if unreadable == 1 {
                                    tracing::warn!(kind = %self.kind, %error, "an object of the list cannot be read; it is left out");
                                }
                            }
                        }
                    }
                    Part::Metadata(meta) => {
                        version = match decoder {
                            Some(_) => list_version(meta).map_err(|e| e.to_string()),
                            None => serde_json::from_slice::<ListMeta>(meta)
                                .map(|meta| meta.resource_version)
                                .map_err(|e| e.to_string()),
                        }
                        .map_err(Failure::Metadata)?;
                    }
                }
            }
        }
        list.finish()?;
        if unreadable > 0 {
            tracing::warn!(kind = %self.kind, unreadable, "listed without the objects that cannot be read");
        }
        let encoding = if decoder.is_some() {
            "protobuf"
        } else {
            "json"
        };
        tracing::info!(kind = %self.kind, objects = listed, encoding, elapsed = ?started.elapsed(), "listed");
        version.filter(|v| !v.is_empty()).ok_or(Failure::NoVersion)
    }

    /// Watches from `version`, handing `each` every change and moving `version` past it;
    /// returns when the server ends the watch (its timeout), to be watched again from there.
    pub async fn watch<K: kube::Resource + DeserializeOwned + Clone>(
        &self,
        version: &mut String,
        mut each: impl FnMut(Change<K>),
    ) -> Result<(), Failure> {
        let params = WatchParams {
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            timeout: Some(self.timeout),
            bookmarks: true,
            send_initial_events: false,
        };
        let request = self.request.watch(&params, version);
        let (_, body) = self
            .open(request.map_err(|e| Failure::Request(kube::Error::BuildRequest(e)))?)
            .await?;
        let bytes = body.into_data_stream().map_err(std::io::Error::other);
        let mut lines = FramedRead::new(
            StreamReader::new(bytes),
            LinesCodec::new_with_max_length(MAX_OBJECT),
        );
        while let Some(line) = lines.next().await {
            let line = match line {
                Ok(line) => line,
                Err(LinesCodecError::MaxLineLengthExceeded) => {
                    return Err(Failure::Event(format!("longer than {MAX_OBJECT} bytes")));
                }
                Err(LinesCodecError::Io(error)) => return Err(Failure::Read(error)),
            };
            let mut line = line.into_bytes();
            drop_managed_fields(&mut line, &[b"object"]);
            let event = match serde_json::from_slice::<WatchEvent<K>>(&line) {
                Ok(event) => event,
                Err(error) => return Err(Failure::Event(error.to_string())),
            };
            let (seen, change) = match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    (o.meta().resource_version.clone(), Some(Change::Apply(o)))
                }
                WatchEvent::Deleted(o) => {
                    (o.meta().resource_version.clone(), Some(Change::Delete(o)))
                }
                WatchEvent::Bookmark(bookmark) => (Some(bookmark.metadata.resource_version), None),
                WatchEvent::Error(status) => return Err(Failure::of_status(&status)),
            };
            if let Some(seen) = seen.filter(|v| !v.is_empty()) {
                *version = seen;
            }
            if let Some(change) = change {
                each(change);
            }
        }
        Ok(())
    }

    /// Sends `request`; an answer other than success is read (a bounded part) as a Status.
    async fn open(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<(http::HeaderMap, kube::client::Body), Failure> {
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(Failure::Request)?;
        let (head, body) = response.into_parts();
        if head.status.is_success() {
            return Ok((head.headers, body));
        }
        let text = http_body_util::Limited::new(body, MAX_STATUS)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if let Some((code, message)) = protobuf::status(&text).filter(|(code, _)| *code != 0) {
            return Err(Failure::of_status(&Status {
                code,
                message,
                ..Status::default()
            }));
        }
        match serde_json::from_slice::<Status>(&text) {
            Ok(status) if status.code != 0 => Err(Failure::of_status(&status)),
            _ => Err(Failure::of_status(&Status {
                code: head.status.as_u16(),
                message: String::from_utf8_lossy(&text).into_owned(),
                ..Status::default()
            })),
        }
    }
}
