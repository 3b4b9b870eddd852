//! Running real etcd members as child processes: the etcd release the
//! node's Talos runs (`DefaultEtcdVersion` in
//! pkg/machinery/constants/constants.go: v3.6.12 at Talos v1.13.9, v3.7.1
//! at v1.14), built by `scripts/etcd.sh`, with the flags Talos's etcd
//! service gives it (internal/app/machined/pkg/system/services/etcd.go,
//! argsForInit and argsForControlPlane, at each tag).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::SimError;
use super::etcd_client::EtcdClient;
use super::etcd_tls::{EtcdPki, MemberCerts};

/// An etcd release a simulated node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EtcdRelease {
    /// etcd v3.6.12 (Talos v1.13.9).
    V3_6_12,
    /// etcd v3.7.1 (Talos v1.14): HTTP endpoints on their own port, TLS
    /// 1.3 at least, feature gates instead of the `experimental-` flags.
    V3_7_1,
}

impl EtcdRelease {
    /// The release tag, `v3.6.12`.
    pub fn tag(self) -> &'static str {
        match self {
            EtcdRelease::V3_6_12 => "v3.6.12",
            EtcdRelease::V3_7_1 => "v3.7.1",
        }
    }

    /// The version etcd reports (`3.6.12`).
    pub fn version(self) -> &'static str {
        &self.tag()[1..]
    }
}

/// The directory `scripts/etcd.sh` builds into, one `etcd-vX.Y.Z/`
/// (etcd, etcdutl, etcdctl) per release: `$TALOS_SIM_ETCD_CACHE`, else
/// `$XDG_CACHE_HOME/talos-client`, else `~/.cache/talos-client`.
pub fn default_etcd_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("TALOS_SIM_ETCD_CACHE") {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("talos-client")
}

/// The binaries of one etcd release in a cache directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdBinaries {
    /// The release.
    pub release: EtcdRelease,
    dir: PathBuf,
}

impl EtcdBinaries {
    /// The binaries of `release` under `cache`; an error naming the script
    /// that builds them when they are missing.
    pub fn find(cache: &Path, release: EtcdRelease) -> Result<EtcdBinaries, SimError> {
        let binaries = EtcdBinaries {
            release,
            dir: cache.join(format!("etcd-{}", release.tag())),
        };
        for path in [binaries.etcd(), binaries.etcdutl()] {
            if !path.is_file() {
                return Err(SimError::EtcdNotBuilt {
                    release: release.tag(),
                    path,
                });
            }
        }
        Ok(binaries)
    }

    /// The etcd server.
    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    /// etcdutl (snapshot restore and status).
    pub fn etcdutl(&self) -> PathBuf {
        self.dir.join("etcdutl")
    }

    /// etcdctl.
    pub fn etcdctl(&self) -> PathBuf {
        self.dir.join("etcdctl")
    }
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
/// single-member cluster, with `etcdutl snapshot restore` of the node's
/// etcd release (Talos's recoverFromSnapshot runs etcdutl's snapshot
/// package with the same settings, services/etcd.go).
pub(crate) async fn restore_snapshot(
    binaries: &EtcdBinaries,
    snapshot: &Path,
    target: RestoreTarget<'_>,
    initial_cluster: &str,
    skip_hash_check: bool,
) -> Result<(), String> {
    let data = target.data_dir;
    if data.exists() {
        std::fs::remove_dir_all(data).map_err(|e| e.to_string())?;
    }
    let mut command = Command::new(binaries.etcdutl());
    command
        .arg("snapshot")
        .arg("restore")
        .arg(snapshot)
        .arg("--data-dir")
        .arg(data)
        .arg("--name")
        .arg(target.name)
        .arg("--initial-cluster")
        .arg(initial_cluster)
        .arg("--initial-advertise-peer-urls")
        .arg(target.peer_url);
    if skip_hash_check {
        command.arg("--skip-hash-check");
    }
    let output = command
        .output()
        .await
        .map_err(|e| format!("cannot run {}: {e}", binaries.etcdutl().display()))?;
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
    /// Client port (gRPC, and HTTP too before etcd 3.7).
    pub client_port: u16,
    /// Peer port.
    pub peer_port: u16,
    /// The client HTTP port (`/health`, `/metrics`) of etcd 3.7 under
    /// Talos 1.14 (`EtcdClientHTTPPort`, 2383 on a real node).
    pub http_port: u16,
    /// Data directory.
    pub data_dir: PathBuf,
    /// `name=peer-url,...` of the members to start with.
    pub initial_cluster: String,
    /// New or existing cluster.
    pub state: ClusterState,
    /// Backend quota in bytes.
    pub quota_backend_bytes: u64,
    /// The release to run, and where its binaries are.
    pub binaries: EtcdBinaries,
    /// Where the member's certificates are written.
    pub certs_dir: PathBuf,
}

impl EtcdSpec {
    /// The URL clients use.
    pub fn client_url(&self) -> String {
        format!("https://{}:{}", self.ip, self.client_port)
    }

    /// The URL peers use.
    pub fn peer_url(&self) -> String {
        format!("https://{}:{}", self.ip, self.peer_port)
    }

    /// The URL of the HTTP endpoints on etcd 3.7 (none before).
    pub fn http_url(&self) -> Option<String> {
        (self.binaries.release == EtcdRelease::V3_7_1)
            .then(|| format!("https://{}:{}", self.ip, self.http_port))
    }

    /// The flags Talos starts this release with (services/etcd.go at the
    /// Talos tag that ships it), plus the simulator's backend quota.
    fn args(&self, certs: &MemberCerts) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        let mut args: Vec<(&str, String)> = vec![
            ("name", self.name.clone()),
            ("auto-tls", "false".into()),
            ("peer-auto-tls", "false".into()),
            ("data-dir", path(&self.data_dir)),
            ("listen-peer-urls", self.peer_url()),
            ("listen-client-urls", self.client_url()),
            ("client-cert-auth", "true".into()),
            ("cert-file", path(&certs.server.0)),
            ("key-file", path(&certs.server.1)),
            ("trusted-ca-file", path(&certs.ca)),
            ("peer-client-cert-auth", "true".into()),
            ("peer-cert-file", path(&certs.peer.0)),
            ("peer-key-file", path(&certs.peer.1)),
            ("peer-trusted-ca-file", path(&certs.ca)),
            (
                "initial-cluster-state",
                match self.state {
                    ClusterState::New => "new",
                    ClusterState::Existing => "existing",
                }
                .into(),
            ),
            ("initial-cluster", self.initial_cluster.clone()),
            ("initial-advertise-peer-urls", self.peer_url()),
            ("advertise-client-urls", self.client_url()),
            ("quota-backend-bytes", self.quota_backend_bytes.to_string()),
        ];
        match self.http_url() {
            // Talos 1.14: HTTP on its own listener, gRPC alone on 2379,
            // TLS 1.3 at least, feature gates for the corruption checks.
            Some(http) => args.extend([
                ("listen-client-http-urls", http),
                (
                    "feature-gates",
                    "InitialCorruptCheck=true,CompactHashCheck=true".into(),
                ),
                ("watch-progress-notify-interval", "5s".into()),
                ("tls-min-version", "TLS1.3".into()),
            ]),
            None => args.extend([
                ("experimental-initial-corrupt-check", "true".into()),
                ("experimental-watch-progress-notify-interval", "5s".into()),
                ("experimental-compact-hash-check-enabled", "true".into()),
            ]),
        }
        args.into_iter()
            .map(|(flag, value)| format!("--{flag}={value}"))
            .collect()
    }
}

/// A running etcd member. Killed when dropped; [`EtcdProcess::stop`] stops it
/// gracefully.
pub struct EtcdProcess {
    child: Child,
    spec: EtcdSpec,
}

impl EtcdProcess {
    /// Writes the member's certificates, starts etcd and waits until it
    /// answers on its client URL. The child gets SIGKILL if this process
    /// dies, so no etcd outlives the simulator.
    pub async fn start(spec: EtcdSpec, pki: &EtcdPki, log: &Path) -> Result<EtcdProcess, SimError> {
        std::fs::create_dir_all(&spec.data_dir).map_err(|e| SimError::io(&spec.data_dir, e))?;
        let certs = pki.write_member(&spec.certs_dir, &spec.name, spec.ip)?;
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| SimError::io(log, e))?;
        let binary = spec.binaries.etcd();
        let mut command = Command::new(&binary);
        command
            .args(spec.args(&certs))
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
        let child = command
            .spawn()
            .map_err(|source| SimError::EtcdSpawn { binary, source })?;
        let mut process = EtcdProcess { child, spec };
        process
            .wait_ready(Duration::from_secs(60), pki, log)
            .await?;
        Ok(process)
    }

    /// Polls the member's status until it answers, the process exits, or the
    /// deadline passes.
    async fn wait_ready(
        &mut self,
        timeout: Duration,
        pki: &EtcdPki,
        log: &Path,
    ) -> Result<(), SimError> {
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
            if let Ok(client) = EtcdClient::connect(std::slice::from_ref(&url), pki).await
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
