//! The processes a run starts (`talosctl-rs`, `talos-opsd`): output to
//! files in the run's directory, killed with SIGKILL on request or when
//! dropped, and read afterwards for panics.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A process the run started.
pub struct Proc {
    /// What it is, for reports (`retire`, `resume`, `second-admin`, ...).
    pub role: String,
    child: Child,
    /// Its stdout and stderr files.
    pub stdout: PathBuf,
    /// See `stdout`.
    pub stderr: PathBuf,
    /// Its exit code once it ended (None: killed by a signal).
    pub code: Option<Option<i32>>,
    /// Killed by the campaign.
    pub killed: bool,
}

/// How one process ended, for the checks.
#[derive(Debug, Clone)]
pub struct Ended {
    /// Its role.
    pub role: String,
    /// Exit code (None: a signal).
    pub code: Option<i32>,
    /// Killed by the campaign.
    pub killed: bool,
    /// Its output, stdout then stderr.
    pub output: String,
}

impl Proc {
    /// Starts `program` with `args` and `env`; its output goes to
    /// `DIR/ROLE-N.out` and `.err`.
    pub fn start(
        dir: &Path,
        role: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
    ) -> std::io::Result<Proc> {
        let n = std::fs::read_dir(dir)?.count();
        let stdout = dir.join(format!("{n:02}-{role}.out"));
        let stderr = dir.join(format!("{n:02}-{role}.err"));
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?)
            .env_remove("TALOSCONFIG")
            .env_remove("TALOS_OPSD_SOCKET")
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        Ok(Proc {
            role: role.to_string(),
            child: command.spawn()?,
            stdout,
            stderr,
            code: None,
            killed: false,
        })
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        if self.code.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.code = Some(status.code());
                false
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// SIGKILL, as a crash would stop it; waits for the exit.
    pub async fn kill(&mut self) {
        if !self.running() {
            return;
        }
        let _ = self.child.start_kill();
        if let Ok(status) = self.child.wait().await {
            self.code = Some(status.code());
        }
        self.killed = true;
    }

    /// Waits for the exit until `deadline`; kills it then (false).
    pub async fn wait_until(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.code = Some(status.code());
                true
            }
            Ok(Err(_)) => true,
            Err(_) => {
                self.kill().await;
                false
            }
        }
    }

    /// Its stdout.
    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// How it ended (call once it has).
    pub fn ended(&mut self) -> Ended {
        self.running();
        let output = format!(
            "{}{}",
            self.stdout_text(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        Ended {
            role: self.role.clone(),
            code: self.code.flatten(),
            killed: self.killed,
            output,
        }
    }
}

/// Waits until `path` accepts connections (a daemon's socket), up to
/// `limit`.
pub async fn wait_for_socket(path: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
