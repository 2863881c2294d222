//! The sidecar processes: two replicas each of the provisioner, the attacher, the resizer and the
//! snapshotter, and one all-in-one replica running them all on the same Leases (a rollout
//! halfway through), each in a UTS namespace of its own so that its host name, which is its
//! leader-election identity as in a pod, differs from the others'. The suite plays the kubelet: a replica that is killed or
//! exits is started again.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use testkit::process::CleanEnv;
use tokio::process::Child;

const BIN: &str = env!("CARGO_BIN_EXE_csi-sidecars");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sidecar {
    Provisioner,
    Attacher,
    Resizer,
    Snapshotter,
    /// `csi-sidecars --controllers=*`: every controller, each on the single sidecar's Lease.
    AllInOne,
}

impl Sidecar {
    fn command(self) -> &'static str {
        match self {
            Sidecar::Provisioner => "csi-provisioner",
            Sidecar::Attacher => "csi-attacher",
            Sidecar::Resizer => "csi-resizer",
            Sidecar::Snapshotter => "csi-snapshotter",
            Sidecar::AllInOne => "--controllers=*",
        }
    }

    /// Whether this replica runs `controller` (a single sidecar's kind).
    pub fn runs(self, controller: Sidecar) -> bool {
        self == controller || self == Sidecar::AllInOne
    }

    /// The Lease name `controller` elects its leader on, for the driver `sanitized`.
    pub fn lease(self, sanitized: &str) -> String {
        match self {
            Sidecar::Attacher => format!("external-attacher-leader-{sanitized}"),
            Sidecar::Resizer => format!("external-resizer-{sanitized}"),
            Sidecar::Snapshotter => format!("external-snapshotter-leader-{sanitized}"),
            Sidecar::Provisioner | Sidecar::AllInOne => sanitized.to_string(),
        }
    }
}

/// What every replica is started with.
pub struct Launch {
    pub kubeconfig: PathBuf,
    pub csi_address: String,
    pub namespace: String,
    pub log_dir: PathBuf,
}

pub struct Replica {
    pub sidecar: Sidecar,
    /// Its host name and so its leader-election identity.
    pub name: String,
    child: Option<Child>,
    log: PathBuf,
    /// Exits nobody asked for: how each ended and its last log line.
    pub exits: Vec<String>,
}

impl Replica {
    pub fn new(sidecar: Sidecar, name: &str, launch: &Launch) -> Self {
        Self {
            sidecar,
            name: name.to_string(),
            child: None,
            log: launch.log_dir.join(format!("{name}.log")),
            exits: Vec::new(),
        }
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    fn args(&self, launch: &Launch) -> Vec<String> {
        let mut args = vec![
            self.sidecar.command().to_string(),
            format!("--kubeconfig={}", launch.kubeconfig.display()),
            format!("--csi-address={}", launch.csi_address),
            "--leader-election".into(),
            format!("--leader-election-namespace={}", launch.namespace),
            // Short terms so that a failover takes seconds, not the default 15 s.
            "--leader-election-lease-duration=3s".into(),
            "--leader-election-renew-deadline=2s".into(),
            "--leader-election-retry-period=500ms".into(),
            "--timeout=2s".into(),
            "--retry-interval-start=100ms".into(),
            "--retry-interval-max=2s".into(),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
            "--v=4".into(),
        ];
        match self.sidecar {
            Sidecar::Attacher => args.push("--reconcile-sync=5s".into()),
            Sidecar::AllInOne => args.push("--attacher-reconcile-sync=5s".into()),
            _ => {}
        }
        if self.sidecar.runs(Sidecar::Snapshotter) {
            args.push("--feature-gates=CSIVolumeGroupSnapshot=true".into());
        }
        args
    }

    /// Starts the process (if it does not run). Host names need a UTS namespace: as root
    /// directly, otherwise inside a user namespace.
    pub fn start(&mut self, launch: &Launch) -> std::io::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut command = testkit::process::with_hostname(&self.name, BIN);
        command
            .clean_env()
            .args(self.args(launch))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        testkit::process::die_with_parent(&mut command);
        self.child = Some(command.spawn()?);
        Ok(())
    }

    /// SIGKILL, as `kill -9`; waits for the process to be gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process ended by itself; records how.
    pub fn reap(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                // Other threads may still log after the fatal line: find it near the end.
                let tail = self.log_tail(20);
                let reason = tail
                    .lines()
                    .rev()
                    .find(|l| l.contains("ERROR"))
                    .or_else(|| tail.lines().last())
                    .unwrap_or("")
                    .to_string();
                self.exits.push(format!("{status}: {reason}"));
                self.child = None;
                true
            }
            Ok(None) | Err(_) => false,
        }
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}
