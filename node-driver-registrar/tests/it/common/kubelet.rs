//! A fake kubelet plugin watcher, behaving as kubelet's `pluginwatcher`, `operation_generator` and
//! connection monitor do with a CSI plugin, and calling it as kubelet's grpc-go client does
//! (socket path as `:authority`, HPACK with indexing; see `testkit::grpcgo`):
//!
//! * watches a directory for new `*.sock` files (names starting with `.` ignored; re-created
//!   sockets count as new), and for removed ones (deregistration);
//! * registers each: dial (10 s), `GetInfo` within 1 s, checks the type, defaults an empty
//!   endpoint to the socket path, validates the versions as the CSI handler does (non-empty,
//!   highest version with major <= 1 must have major 1), optionally calls `NodeGetInfo` on the
//!   endpoint as `RegisterPlugin` does, then `NotifyRegistrationStatus` (5 s);
//! * afterwards calls `GetInfo` on a fresh connection every `monitor_period` (kubelet >= 1.34:
//!   10 s) and deregisters the plugin after 2 consecutive failures.
//!
//! Everything it does is reported as an [`Event`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use csi_proto::methods::node::NODE_GET_INFO;
use csi_proto::methods::registration::{GET_INFO, NOTIFY_REGISTRATION_STATUS};
use csi_proto::pluginregistration::{
    CSI_PLUGIN, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use csi_proto::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
use sidecar_kit::driver::connection::DriverIo;
use sidecar_kit::driver::endpoint::Endpoint;
use testkit::grpcgo;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
const MONITOR_GET_INFO_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_MONITOR_FAILURES: u32 = 2;
/// How often the directory is scanned; kubelet is told by fsnotify instead.
const SCAN_PERIOD: Duration = Duration::from_millis(20);

/// What the fake kubelet answers after validating a plugin.
#[derive(Clone, Debug)]
pub enum Verdict {
    Accept,
    Reject(String),
}

#[derive(Clone, Debug)]
pub struct KubeletOptions {
    pub verdict: Verdict,
    pub monitor_period: Duration,
    /// Call NodeGetInfo on the registered endpoint before accepting, as kubelet's CSI handler.
    pub node_get_info: bool,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            verdict: Verdict::Accept,
            monitor_period: Duration::from_millis(100),
            node_get_info: true,
        }
    }
}

// The sockets and errors are read through `Debug`, in the messages of failed assertions.
#[allow(dead_code)]
#[derive(Clone, Debug)]
pub enum Event {
    /// NotifyRegistrationStatus{true} was delivered.
    Registered {
        socket: PathBuf,
        info: PluginInfo,
    },
    /// NotifyRegistrationStatus{false} was delivered (or its delivery failed).
    Rejected {
        socket: PathBuf,
        error: String,
        delivered: bool,
    },
    /// The registration failed before a verdict (dial or GetInfo).
    Failed {
        socket: PathBuf,
        error: String,
    },
    MonitorOk {
        socket: PathBuf,
    },
    MonitorFailed {
        socket: PathBuf,
        error: String,
    },
    Deregistered {
        socket: PathBuf,
        reason: String,
    },
}

pub struct FakeKubelet {
    events: mpsc::UnboundedReceiver<Event>,
    seen: Vec<Event>,
    stop: CancellationToken,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeKubelet {
    /// Starts watching `dir` (which must exist).
    pub fn start(dir: &Path, options: KubeletOptions) -> Self {
        let (sender, events) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        tokio::spawn(watch(dir.to_path_buf(), options, sender, stop.clone()));
        Self {
            events,
            seen: Vec::new(),
            stop,
        }
    }

    /// Waits for the next event matching `wanted`, skipping others.
    pub async fn wait_for(&mut self, timeout: Duration, wanted: impl Fn(&Event) -> bool) -> Event {
        let found = tokio::time::timeout(timeout, async {
            loop {
                let event = self.events.recv().await.expect("the watcher runs");
                self.seen.push(event.clone());
                if wanted(&event) {
                    return event;
                }
            }
        })
        .await;
        match found {
            Ok(event) => event,
            Err(_) => panic!(
                "no matching kubelet event within {timeout:?}; seen: {:#?}",
                self.seen
            ),
        }
    }

    pub async fn registered(&mut self, timeout: Duration) -> PluginInfo {
        match self
            .wait_for(timeout, |e| matches!(e, Event::Registered { .. }))
            .await
        {
            Event::Registered { info, .. } => info,
            _ => unreachable!(),
        }
    }
}

/// A file's identity, so that a re-created socket counts as new.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Generation {
    #[cfg(unix)]
    ino: u64,
    modified: Option<SystemTime>,
}

fn socket_generation(path: &Path) -> Option<Generation> {
    let metadata = std::fs::symlink_metadata(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if !metadata.file_type().is_socket() {
            return None;
        }
        Some(Generation {
            ino: metadata.ino(),
            modified: metadata.modified().ok(),
        })
    }
    #[cfg(not(unix))]
    {
        // Kubelet on Windows dials to tell sockets apart; any *.sock file is a candidate here.
        Some(Generation {
            modified: metadata.modified().ok(),
        })
    }
}

async fn watch(
    dir: PathBuf,
    options: KubeletOptions,
    events: mpsc::UnboundedSender<Event>,
    stop: CancellationToken,
) {
    let mut known: HashMap<PathBuf, (Generation, CancellationToken)> = HashMap::new();
    loop {
        let mut present = HashMap::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || !name.ends_with(".sock") {
                    continue;
                }
                let path = entry.path();
                if let Some(generation) = socket_generation(&path) {
                    present.insert(path, generation);
                }
            }
        }
        known.retain(|path, (generation, plugin)| {
            let keep = present.get(path) == Some(generation);
            if !keep {
                plugin.cancel();
                let _ = events.send(Event::Deregistered {
                    socket: path.clone(),
                    reason: "socket removed".into(),
                });
            }
            keep
        });
        for (path, generation) in present {
            if known.contains_key(&path) {
                continue;
            }
            let plugin = stop.child_token();
            known.insert(path.clone(), (generation, plugin.clone()));
            tokio::spawn(register(path, options.clone(), events.clone(), plugin));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SCAN_PERIOD) => {}
        }
    }
}

/// A fresh connection to the unix socket at `path`, speaking HTTP/2 as kubelet's grpc-go client
/// does: the socket path is the `:authority` of every call.
pub async fn connect(
    path: &Path,
    timeout: Duration,
) -> Result<grpcgo::Client<Box<dyn DriverIo>>, String> {
    let endpoint = Endpoint::Unix(path.to_path_buf());
    let options = grpcgo::Options {
        timeout: Some(timeout),
        ..grpcgo::Options::kubelet(path)
    };
    let connecting = async {
        let stream = sidecar_kit::driver::connection::dial(&endpoint).await?;
        grpcgo::Client::handshake(stream, options)
            .await
            .map_err(std::io::Error::other)
    };
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(err)) => Err(format!("dial {}: {err}", path.display())),
        Err(_) => Err(format!("dial {}: timed out", path.display())),
    }
}

async fn get_info(path: &Path, timeout: Duration) -> Result<PluginInfo, String> {
    let mut client = connect(path, DIAL_TIMEOUT).await?;
    grpcgo::with_timeout(timeout, client.unary(GET_INFO, &InfoRequest {}))
        .await
        .map_err(|err| format!("GetInfo: {err}"))
}

/// Kubelet's CSI `validateVersions`: non-empty; versions above major 1 ignored; the highest of
/// the rest must have major 1.
pub fn validate_versions(versions: &[String]) -> Result<(u64, u64, u64), String> {
    if versions.is_empty() {
        return Err("plugin reported no supported versions".into());
    }
    let mut highest = None;
    for text in versions {
        let parsed = parse_generic(text).ok_or_else(|| format!("invalid version {text:?}"))?;
        if parsed.0 > 1 {
            continue;
        }
        highest = highest.max(Some(parsed));
    }
    match highest {
        Some(version) if version.0 == 1 => Ok(version),
        _ => Err(format!(
            "none of the versions specified {versions:?} are supported"
        )),
    }
}

fn parse_generic(text: &str) -> Option<(u64, u64, u64)> {
    let text = text.strip_prefix('v').unwrap_or(text);
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(patch) => patch.parse().ok()?,
        None => 0,
    };
    Some((major, minor, patch))
}

async fn notify(path: &Path, registered: bool, error: String) -> Result<(), String> {
    let mut client = connect(path, DIAL_TIMEOUT).await?;
    let status = RegistrationStatus {
        plugin_registered: registered,
        error,
    };
    let _: RegistrationStatusResponse = grpcgo::with_timeout(
        NOTIFY_TIMEOUT,
        client.unary(NOTIFY_REGISTRATION_STATUS, &status),
    )
    .await
    .map_err(|err| format!("NotifyRegistrationStatus: {err}"))?;
    Ok(())
}

/// What kubelet's operation generator decides for a plugin's info.
async fn verdict_for(socket: &Path, info: &mut PluginInfo, options: &KubeletOptions) -> Verdict {
    if info.r#type != CSI_PLUGIN {
        return Verdict::Reject("no handler registered for plugin type".into());
    }
    if info.endpoint.is_empty() {
        info.endpoint = socket.display().to_string();
    }
    if info.name.is_empty() {
        return Verdict::Reject("plugin name is empty".into());
    }
    if let Err(error) = validate_versions(&info.supported_versions) {
        return Verdict::Reject(error);
    }
    if options.node_get_info {
        let node_info = async {
            let mut client = connect(Path::new(&info.endpoint), DIAL_TIMEOUT).await?;
            grpcgo::with_timeout(
                DIAL_TIMEOUT,
                client.unary::<_, NodeGetInfoResponse>(NODE_GET_INFO, &NodeGetInfoRequest {}),
            )
            .await
            .map_err(|err| format!("NodeGetInfo: {err}"))
        };
        match node_info.await {
            Ok(response) if response.node_id.is_empty() => {
                return Verdict::Reject("node ID is empty".into());
            }
            Ok(_) => {}
            Err(error) => return Verdict::Reject(format!("error updating CSI node: {error}")),
        }
    }
    options.verdict.clone()
}

async fn register(
    socket: PathBuf,
    options: KubeletOptions,
    events: mpsc::UnboundedSender<Event>,
    plugin: CancellationToken,
) {
    let mut info = match get_info(&socket, GET_INFO_TIMEOUT).await {
        Ok(info) => info,
        Err(error) => {
            let _ = events.send(Event::Failed { socket, error });
            return;
        }
    };
    match verdict_for(&socket, &mut info, &options).await {
        Verdict::Reject(error) => {
            let delivered = notify(&socket, false, error.clone()).await.is_ok();
            let _ = events.send(Event::Rejected {
                socket,
                error,
                delivered,
            });
        }
        Verdict::Accept => match notify(&socket, true, String::new()).await {
            Ok(()) => {
                let _ = events.send(Event::Registered {
                    socket: socket.clone(),
                    info,
                });
                monitor(socket, options.monitor_period, events, plugin).await;
            }
            Err(error) => {
                let _ = events.send(Event::Failed { socket, error });
            }
        },
    }
}

async fn monitor(
    socket: PathBuf,
    period: Duration,
    events: mpsc::UnboundedSender<Event>,
    plugin: CancellationToken,
) {
    let mut failures = 0;
    loop {
        tokio::select! {
            _ = plugin.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        match get_info(&socket, MONITOR_GET_INFO_TIMEOUT).await {
            Ok(_) => {
                failures = 0;
                let _ = events.send(Event::MonitorOk {
                    socket: socket.clone(),
                });
            }
            Err(error) => {
                failures += 1;
                let _ = events.send(Event::MonitorFailed {
                    socket: socket.clone(),
                    error,
                });
                if failures >= MAX_MONITOR_FAILURES {
                    let _ = events.send(Event::Deregistered {
                        socket,
                        reason: "connection monitor".into(),
                    });
                    return;
                }
            }
        }
    }
}
