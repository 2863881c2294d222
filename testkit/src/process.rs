//! Child processes that do not outlive the process that started them.

/// Makes the child be killed (SIGKILL) when this process dies, however it dies, even by
/// SIGKILL: Linux's `PR_SET_PDEATHSIG`. Elsewhere this does nothing, and callers rely on
/// stopping their children themselves.
///
/// The kernel ties the signal to the *thread* that forked, not the process: spawn from a thread
/// that lives as long as the parent should (the main thread, a test's thread, a tokio runtime
/// worker; not a blocking-pool thread, which ends when idle).
pub fn die_with_parent(command: &mut tokio::process::Command) -> &mut tokio::process::Command {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and only makes
        // async-signal-safe calls (prctl, getppid) without allocating.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before prctl: then no signal would ever come.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    command
}

/// Starts `command` as a sidecar under test: the caller's environment kept out
/// ([`CleanEnv`]), standard output dropped, standard error to `stderr`, killed when its handle
/// is dropped and when this process dies ([`die_with_parent`]).
pub fn spawn_sidecar(
    command: &mut tokio::process::Command,
    stderr: std::process::Stdio,
) -> std::io::Result<tokio::process::Child> {
    die_with_parent(command.clean_env())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
}

/// A command running `program` under the host name `hostname`, which is a sidecar's
/// leader-election identity as a pod name is: in a UTS namespace of its own (`unshare`), inside
/// a user namespace when not run as root. Linux only; arguments are added to the returned
/// command.
#[cfg(target_os = "linux")]
pub fn with_hostname(
    hostname: &str,
    program: impl AsRef<std::ffi::OsStr>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("unshare");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        command.args(["--user", "--map-root-user"]);
    }
    command
        .args([
            "--uts",
            "--",
            "/bin/sh",
            "-c",
            "hostname \"$0\" && exec \"$@\"",
        ])
        .arg(hostname)
        .arg(program);
    command
}

/// Environment variables that change what a sidecar does: `KUBECONFIG` (the provisioner, as
/// upstream's, prefers it to `--kubeconfig`; the all-in-one process uses it when the flag is
/// absent),
/// `POD_NAMESPACE` (the Lease and journal namespace), `NAMESPACE` and `POD_NAME` (capacity
/// tracking), `NODE_NAME` (distributed provisioning). Inherited from whoever runs the tests or
/// the sandbox, they would point a child at the wrong cluster, namespace or node.
pub const SIDECAR_ENV: [&str; 7] = [
    "KUBECONFIG",
    "POD_NAMESPACE",
    "NAMESPACE",
    "NODE_NAME",
    "POD_NAME",
    // A developer's own collector must not turn tracing on in every test.
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// A command whose child gets only the environment its caller means.
pub trait CleanEnv {
    /// Keeps every variable of [`SIDECAR_ENV`] out of the child, except those set on this
    /// command with `env`/`envs` (before or after this call).
    fn clean_env(&mut self) -> &mut Self;
}

/// The variables of [`SIDECAR_ENV`] that `command` does not set itself.
fn unset_by(command: &std::process::Command) -> Vec<&'static str> {
    let explicit: Vec<&std::ffi::OsStr> = command
        .get_envs()
        .filter_map(|(name, value)| value.map(|_| name))
        .collect();
    SIDECAR_ENV
        .into_iter()
        .filter(|name| !explicit.iter().any(|set| set == name))
        .collect()
}

impl CleanEnv for std::process::Command {
    fn clean_env(&mut self) -> &mut Self {
        for name in unset_by(self) {
            self.env_remove(name);
        }
        self
    }
}

impl CleanEnv for tokio::process::Command {
    fn clean_env(&mut self) -> &mut Self {
        for name in unset_by(self.as_std()) {
            self.env_remove(name);
        }
        self
    }
}

/// Whether the process `pid` has ended (gone, or a zombie not yet reaped). Linux only.
#[cfg(target_os = "linux")]
pub fn has_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: std::time::Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Spawns `sleep` from a thread of its own that then ends; returns the child's pid.
    fn spawn_from_short_lived_thread(guarded: bool) -> u32 {
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut command = tokio::process::Command::new("sleep");
                command.clean_env().arg("600");
                if guarded {
                    die_with_parent(&mut command);
                }
                command.spawn().unwrap().id().unwrap()
            })
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_child_is_killed_when_the_thread_that_spawned_it_ends() {
        // The kernel treats the end of the forking thread as the parent's death, which makes
        // this testable in one process.
        let guarded = spawn_from_short_lived_thread(true);
        assert!(wait_until(Duration::from_secs(10), || has_ended(guarded)));

        let unguarded = spawn_from_short_lived_thread(false);
        assert!(!wait_until(Duration::from_millis(300), || has_ended(
            unguarded
        )));
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(unguarded as libc::pid_t, libc::SIGKILL) };
        assert!(wait_until(Duration::from_secs(10), || has_ended(unguarded)));
    }

    #[tokio::test]
    async fn a_guarded_child_runs_as_usual() {
        let output = die_with_parent(
            tokio::process::Command::new("sh")
                .clean_env()
                .args(["-c", "echo $PPID"]),
        )
        .output()
        .await
        .unwrap();
        assert!(output.status.success());
        let ppid: u32 = String::from_utf8(output.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(ppid, std::process::id());
    }
}

/// `target/<profile>`, where cargo puts the workspace's binaries, from a test binary (which
/// lives in its `deps` folder). `None` when the test runs from elsewhere.
pub fn target_bin_dir() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// Runs `binary` with `args` (without [`SIDECAR_ENV`]) and waits at most `limit` for it to exit;
/// its exit code (-1 when killed by a signal), stdout and stderr. Panics if it runs longer or
/// cannot start: meant for tests.
pub async fn run_to_exit(
    binary: &str,
    args: &[&str],
    limit: std::time::Duration,
) -> (i32, String, String) {
    let output = tokio::time::timeout(
        limit,
        tokio::process::Command::new(binary)
            .clean_env()
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{binary} {args:?} did not exit within {limit:?}"))
    .unwrap_or_else(|err| panic!("cannot run {binary}: {err}"));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The configuration a sidecar binary read at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeconfigRead {
    /// The file `--kubeconfig` names.
    Flag,
    /// The file `$KUBECONFIG` names.
    Environment,
    /// The pod's in-cluster configuration.
    InCluster,
}

/// What a sidecar binary reads with `--kubeconfig` and `$KUBECONFIG` both set, with the variable
/// alone, and with the flag alone: its rule, seen from outside. Each names a file that does not
/// exist, so the binary stops at once with an error naming the one it read (or the in-cluster
/// configuration, which outside a pod is missing too). `args` are what it needs besides.
pub async fn kubeconfig_reads(binary: &str, args: &[&str]) -> [KubeconfigRead; 3] {
    const FLAG: &str = "/nonexistent/flag-kubeconfig";
    const ENVIRONMENT: &str = "/nonexistent/environment-kubeconfig";
    let read = |flag: bool, environment: bool| async move {
        let mut command = tokio::process::Command::new(binary);
        command
            .clean_env()
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .args(args)
            .kill_on_drop(true);
        if flag {
            command.arg(format!("--kubeconfig={FLAG}"));
        }
        if environment {
            command.env("KUBECONFIG", ENVIRONMENT);
        }
        let output = tokio::time::timeout(std::time::Duration::from_secs(30), command.output())
            .await
            .unwrap_or_else(|_| panic!("{binary} {args:?} did not stop"))
            .unwrap_or_else(|err| panic!("cannot run {binary}: {err}"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{binary}: {stderr}");
        if stderr.contains(FLAG) {
            KubeconfigRead::Flag
        } else if stderr.contains(ENVIRONMENT) {
            KubeconfigRead::Environment
        } else if stderr.contains("in-cluster configuration") {
            KubeconfigRead::InCluster
        } else {
            panic!("{binary} read no kubeconfig it was given: {stderr}")
        }
    };
    [
        read(true, true).await,
        read(false, true).await,
        read(true, false).await,
    ]
}

#[cfg(test)]
mod clean_env_tests {
    use super::*;
    use std::ffi::OsStr;

    fn env_of(command: &std::process::Command) -> Vec<(&OsStr, Option<&OsStr>)> {
        let mut env: Vec<_> = command.get_envs().collect();
        env.sort();
        env
    }

    #[test]
    fn removes_every_sidecar_variable_but_those_set_on_the_command() {
        let mut command = std::process::Command::new("true");
        command
            .env("NODE_NAME", "node-a")
            .clean_env()
            .env("HOME", "/h");
        let mut expected: Vec<(&OsStr, Option<&OsStr>)> = vec![
            (OsStr::new("HOME"), Some(OsStr::new("/h"))),
            (OsStr::new("KUBECONFIG"), None),
            (OsStr::new("NAMESPACE"), None),
            (OsStr::new("NODE_NAME"), Some(OsStr::new("node-a"))),
            (OsStr::new("OTEL_EXPORTER_OTLP_ENDPOINT"), None),
            (OsStr::new("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), None),
            (OsStr::new("POD_NAME"), None),
            (OsStr::new("POD_NAMESPACE"), None),
        ];
        expected.sort();
        assert_eq!(env_of(&command), expected);
    }

    #[test]
    fn a_later_env_wins_on_a_tokio_command() {
        let mut command = tokio::process::Command::new("true");
        command.clean_env().env("KUBECONFIG", "/k");
        let env = env_of(command.as_std());
        assert!(env.contains(&(OsStr::new("KUBECONFIG"), Some(OsStr::new("/k")))));
        for name in ["POD_NAMESPACE", "NAMESPACE", "NODE_NAME", "POD_NAME"] {
            assert!(env.contains(&(OsStr::new(name), None)), "{name}: {env:?}");
        }
    }
}
