//! Running the real `talosctl-rs` binary in tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A binary of the workspace, built next to the running test executable
/// (`target/<profile>/deps/<test>` -> `target/<profile>/<name>`). Cargo
/// builds a package's binaries before its integration tests run.
pub fn cargo_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lies in target/<profile>/deps");
    let path = dir.join(name);
    assert!(path.exists(), "{} is not built", path.display());
    path
}

/// The built CLI.
pub fn binary() -> PathBuf {
    cargo_bin("talosctl-rs")
}

/// What a CLI run produced.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Fails the test unless the command succeeded.
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Parses stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// A command line with `--talosconfig` set; environment that could point it
/// elsewhere is cleared.
pub fn command(talosconfig: &Path) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("--talosconfig")
        .arg(talosconfig)
        .env_remove("TALOSCONFIG")
        .env_remove("TALOS_HOME");
    command
}

/// Runs the CLI (in a blocking thread, so an in-process simulator keeps
/// serving) and collects its output.
pub async fn run(talosconfig: &Path, args: &[&str]) -> Run {
    let mut command = command(talosconfig);
    command.args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("the CLI runs");
    Run::from(output)
}

/// Runs the CLI without a talosconfig flag, with `HOME` pointing at `home`.
pub async fn run_bare(home: &Path, args: &[&str]) -> Run {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_remove("TALOSCONFIG")
        .env_remove("TALOS_HOME")
        .env("HOME", home);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("the CLI runs");
    Run::from(output)
}

/// `-o json etcd members`, asked again while etcd has no leader: when the
/// member that leaves is the leader, the others are leaderless until they
/// elect one (an election timeout or so), and etcd answers "no leader".
pub async fn etcd_members_json(talosconfig: &Path) -> serde_json::Value {
    crate::sim::wait_for(
        "etcd members with a leader",
        std::time::Duration::from_secs(30),
        || async {
            let members = run(talosconfig, &["-o", "json", "etcd", "members"]).await;
            // The list is linearizable, as Talos's: right after a leave or
            // a forfeit, etcd answers "no leader" or "leader changed" until
            // the new leader settles, on a real node as on the simulator.
            if members.code != 0
                && (members.stdout.contains("etcdserver: no leader")
                    || members.stdout.contains("etcdserver: leader changed"))
            {
                return None;
            }
            Some(members.ok().json())
        },
    )
    .await
}
