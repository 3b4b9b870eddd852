//! Running real etcd members (Debian's `etcd-server`) as child processes.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::SimError;
use super::etcd_client::EtcdClient;

/// The etcd binary, overridable with `TALOS_SIM_ETCD`.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("TALOS_SIM_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// The etcdctl binary, overridable with `TALOS_SIM_ETCDCTL`.
pub fn etcdctl_binary() -> PathBuf {
    std::env::var_os("TALOS_SIM_ETCDCTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcdctl"))
}

/// Where and as whom a snapshot is restored.
pub(crate) struct RestoreTarget<'a> {
    /// The member's data directory (replaced).
    pub data_dir: &'a Path,
    /// The member's name.
    pub name: &'a str,
    /// The member's peer URL.
    pub peer_url: &'a str,
}

/// Restores `snapshot` into the member's (emptied) data directory as a new
/// single-member cluster, with `etcdctl snapshot restore`.
pub(crate) async fn restore_snapshot(
    snapshot: &Path,
    target: RestoreTarget<'_>,
    initial_cluster: &str,
    skip_hash_check: bool,
) -> Result<(), String> {
    let data = target.data_dir;
    if data.exists() {
        std::fs::remove_dir_all(data).map_err(|e| e.to_string())?;
    }
    let mut command = Command::new(etcdctl_binary());
    command
        .env("ETCDCTL_API", "3")
        .arg("snapshot")
        .arg("restore")
        .arg(snapshot)
        .arg("--data-dir")
        .arg(data)
        .arg("--name")
        .arg(target.name)
        .arg("--initial-cluster")
        .arg(initial_cluster)
        .arg("--initial-cluster-token")
        .arg("talos-sim")
        .arg("--initial-advertise-peer-urls")
        .arg(target.peer_url);
    if skip_hash_check {
        command.arg("--skip-hash-check");
    }
    let output = command
        .output()
        .await
        .map_err(|e| format!("cannot run {}: {e}", etcdctl_binary().display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
    }
}

/// Whether a member starts a new cluster or joins an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Part of the initial cluster.
    New,
    /// Joining a running cluster (after MemberAdd).
    Existing,
}

/// How to start one etcd member.
#[derive(Debug, Clone)]
pub struct EtcdSpec {
    /// Member name (the node's hostname, as Talos names members).
    pub name: String,
    /// Address to listen on.
    pub ip: Ipv4Addr,
    /// Client port.
    pub client_port: u16,
    /// Peer port.
    pub peer_port: u16,
    /// Data directory.
    pub data_dir: PathBuf,
    /// `name=peer-url,...` of the members to start with.
    pub initial_cluster: String,
    /// New or existing cluster.
    pub state: ClusterState,
    /// Backend quota in bytes.
    pub quota_backend_bytes: u64,
}

impl EtcdSpec {
    /// The URL clients use.
    pub fn client_url(&self) -> String {
        format!("http://{}:{}", self.ip, self.client_port)
    }

    /// The URL peers use.
    pub fn peer_url(&self) -> String {
        format!("http://{}:{}", self.ip, self.peer_port)
    }
}

/// A running etcd member. Killed when dropped; [`EtcdProcess::stop`] stops it
/// gracefully.
pub struct EtcdProcess {
    child: Child,
    spec: EtcdSpec,
}

impl EtcdProcess {
    /// Starts etcd and waits until it answers on its client URL. The child
    /// gets SIGKILL if this process dies, so no etcd outlives the simulator.
    pub async fn start(spec: EtcdSpec, log: &Path) -> Result<EtcdProcess, SimError> {
        std::fs::create_dir_all(&spec.data_dir).map_err(|e| SimError::io(&spec.data_dir, e))?;
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| SimError::io(log, e))?;
        let mut command = Command::new(etcd_binary());
        command
            .arg("--name")
            .arg(&spec.name)
            .arg("--data-dir")
            .arg(&spec.data_dir)
            .arg("--listen-client-urls")
            .arg(spec.client_url())
            .arg("--advertise-client-urls")
            .arg(spec.client_url())
            .arg("--listen-peer-urls")
            .arg(spec.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(spec.peer_url())
            .arg("--initial-cluster")
            .arg(&spec.initial_cluster)
            .arg("--initial-cluster-state")
            .arg(match spec.state {
                ClusterState::New => "new",
                ClusterState::Existing => "existing",
            })
            .arg("--initial-cluster-token")
            .arg("talos-sim")
            .arg("--quota-backend-bytes")
            .arg(spec.quota_backend_bytes.to_string())
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and only affects the child.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| SimError::EtcdSpawn {
            binary: etcd_binary(),
            source,
        })?;
        let mut process = EtcdProcess { child, spec };
        process.wait_ready(Duration::from_secs(60), log).await?;
        Ok(process)
    }

    /// Polls the member's status until it answers, the process exits, or the
    /// deadline passes.
    async fn wait_ready(&mut self, timeout: Duration, log: &Path) -> Result<(), SimError> {
        let deadline = Instant::now() + timeout;
        let url = self.spec.client_url();
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| SimError::io(log, e))? {
                return Err(SimError::EtcdExited {
                    name: self.spec.name.clone(),
                    status: status.to_string(),
                    log: log.to_path_buf(),
                });
            }
            if let Ok(client) = EtcdClient::connect(std::slice::from_ref(&url)).await
                && client.status(&url).await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(SimError::EtcdNotReady {
                    name: self.spec.name.clone(),
                    log: log.to_path_buf(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The start specification.
    pub fn spec(&self) -> &EtcdSpec {
        &self.spec
    }

    /// The etcd process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the process: a frozen etcd
    /// keeps its sockets open and answers nothing, as a member on a stalled
    /// disk or a hung host does.
    ///
    /// A freeze returns once every thread of the process has stopped (false
    /// if that is not seen within five seconds). SIGSTOP only asks: the
    /// thread that takes the signal stops the others when the scheduler
    /// next runs it, and on a loaded machine the other threads go on
    /// answering raft messages for tens of milliseconds meanwhile (a member
    /// "frozen" that way confirmed a linearizable read for the last one).
    pub async fn set_frozen(&self, frozen: bool) -> bool {
        let Some(pid) = self.child.id() else {
            return false;
        };
        let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
        if !frozen {
            // SIGCONT wakes every thread at once.
            return true;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }

    /// Stops etcd with SIGTERM, then SIGKILL after five seconds.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: sending a signal to our own child process.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in
/// /proc/PID/task/TID/stat; the state follows the command name, which is in
/// parentheses and may hold spaces).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state == "T")
        })
    })
}
