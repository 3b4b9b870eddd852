//! A real `talos-opsd` process for tests: its own temporary directory,
//! socket and configuration; killed when dropped, also when a test fails.

#![allow(dead_code)]

pub mod tls;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use talos_opsd::proto::opsd_client::OpsdClient;
use talos_test_support::cli::cargo_bin;
use talos_test_support::sim::wait_for;
use tonic::transport::{Channel, Endpoint, Uri};

/// A daemon process.
pub struct Daemon {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    env: Vec<(String, String)>,
    args: Vec<String>,
}

impl Daemon {
    /// Writes `config` (TOML, with `state_dir` and `socket` prepended) into
    /// `dir` and starts the daemon; returns once its socket answers.
    pub async fn start(dir: &Path, config: &str) -> Daemon {
        Daemon::start_with(dir, config, &[], &[]).await
    }

    pub async fn start_with(
        dir: &Path,
        config: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Daemon {
        let socket = dir.join("opsd.sock");
        let path = dir.join("config.toml");
        let text = format!(
            "state_dir = {:?}\nsocket = {:?}\n{config}",
            dir.join("state"),
            socket
        );
        std::fs::write(&path, text).unwrap();
        let mut daemon = Daemon {
            child: None,
            dir: dir.to_owned(),
            socket,
            config: path,
            log: dir.join("daemon.log"),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        daemon.spawn().await;
        daemon
    }

    /// (Re)starts the process with the same configuration.
    pub async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(cargo_bin("talos-opsd"));
        cmd.arg("--config")
            .arg(&self.config)
            .args(&self.args)
            .env("TALOS_OPSD_LOG", "info")
            .env_remove("TALOS_OPSD_TEST_CRASH")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.env {
            assert!(
                !k.starts_with("TALOS_OPSD_TEST_") || cfg!(feature = "test-hooks"),
                "{k} needs the daemon's test-only hooks: \
                 run this test with `--features test-hooks` (the test command does)"
            );
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("talos-opsd starts"));
        let socket = self.socket.clone();
        let log = self.log.clone();
        wait_for("the daemon's socket", Duration::from_secs(30), || {
            let socket = socket.clone();
            async move { std::os::unix::net::UnixStream::connect(&socket).ok() }
        })
        .await;
        let _ = log;
    }

    /// Replaces the configuration (the same state directory and socket).
    pub fn rewrite(&self, config: &str) {
        let text = format!(
            "state_dir = {:?}\nsocket = {:?}\n{config}",
            self.dir.join("state"),
            self.socket
        );
        std::fs::write(&self.config, text).unwrap();
    }

    /// Sets the environment of the next spawn.
    pub fn set_env(&mut self, env: &[(&str, &str)]) {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// A client on the socket.
    pub async fn client(&self) -> OpsdClient<Channel> {
        connect_unix(&self.socket).await
    }

    /// Waits until operation `id` has ended (within 120 s); returns it.
    pub async fn until_ended(&self, id: &str) -> talos_opsd::proto::Operation {
        let client = self.client().await;
        wait_for("the operation to end", Duration::from_secs(120), || {
            let mut client = client.clone();
            let id = id.to_string();
            async move {
                let op = client
                    .get_operation(talos_opsd::proto::GetOperationRequest { id })
                    .await
                    .ok()?
                    .into_inner();
                (op.state != "running").then_some(op)
            }
        })
        .await
    }

    /// Sends `signal` and waits for the exit; returns the exit code.
    pub async fn signal_and_wait(&mut self, signal: i32) -> Option<i32> {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill with a pid we own.
        unsafe { libc::kill(child.id() as i32, signal) };
        tokio::task::spawn_blocking(move || child.wait().unwrap().code())
            .await
            .unwrap()
    }

    /// Waits for the process to exit by itself (a crash hook).
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (30 s) until the log holds `line`. The daemon binds its TCP
    /// listeners (`mutual TLS listener`, `metrics served on /metrics`, each
    /// logged once bound) after the socket [`Daemon::start`] waits for, so
    /// on a loaded machine a connection right after the start was refused.
    pub async fn until_logged(&self, line: &str) {
        wait_for(line, Duration::from_secs(30), || {
            let found = self.log_text().contains(line);
            async move { found.then_some(()) }
        })
        .await;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- talos-opsd log ---\n{}", self.log_text());
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A gRPC client over a Unix socket.
pub async fn connect_unix(path: &Path) -> OpsdClient<Channel> {
    OpsdClient::new(connect_unix_channel(path).await)
}

/// A channel over a Unix socket.
pub async fn connect_unix_channel(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::try_from("http://opsd.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

/// A `[[cluster]]` table for a simulated cluster.
pub fn cluster_toml(name: &str, talosconfig: &Path, extra: &str) -> String {
    format!("\n[[cluster]]\nname = {name:?}\ntalosconfig = {talosconfig:?}\n{extra}\n")
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` from the daemon's metrics listener on `port`, the whole
/// answer; `None` while it does not answer.
pub async fn scrape(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.ok()?;
    Some(answer)
}

/// Runs `talos-opsd ARGS` until it exits by itself (within 60 s, else it
/// is killed and the test fails); returns its exit status and stderr.
pub async fn run_to_exit(args: &[&std::ffi::OsStr]) -> (std::process::ExitStatus, String) {
    /// Kills the process should the test fail while it runs.
    struct Reaped(Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut child = Reaped(
        Command::new(cargo_bin("talos-opsd"))
            .args(args)
            .env("TALOS_OPSD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(err.reopen().unwrap())
            .spawn()
            .unwrap(),
    );
    let status = wait_for("talos-opsd to exit", Duration::from_secs(60), || {
        let status = child.0.try_wait().unwrap();
        async move { status }
    })
    .await;
    (status, std::fs::read_to_string(err.path()).unwrap())
}

/// The resident memory of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The daemon's process id.
impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends SIGHUP (reload) and waits until the log has one more line
    /// containing `says` than before.
    pub async fn reload_and_wait(&self, says: &str) -> String {
        let before = self.log_text().matches(says).count();
        // SAFETY: kill with a pid we own.
        unsafe { libc::kill(self.pid() as i32, libc::SIGHUP) };
        let log = self.log.clone();
        let says = says.to_string();
        wait_for("the reload's log line", Duration::from_secs(30), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let says = says.clone();
            async move { (text.matches(says.as_str()).count() > before).then_some(text) }
        })
        .await
    }
}

/// A copy of talosconfig `tc` at `out` whose contexts list `endpoint`
/// first (before the cluster's own), or only, with `only`.
pub fn talosconfig_with_endpoint(tc: &Path, out: &Path, endpoint: &str, only: bool) {
    let mut config = talos_client::config::TalosConfig::read(tc).unwrap();
    for context in config.contexts.values_mut() {
        if only {
            context.endpoints.clear();
        }
        context.endpoints.insert(0, endpoint.to_string());
    }
    std::fs::write(out, config.to_yaml()).unwrap();
}

/// The CA fingerprint the journal and locks name the cluster of
/// talosconfig `tc` by.
pub fn cluster_fingerprint(tc: &Path, state: &Path) -> String {
    let config = talos_client::config::TalosConfig::read(tc).unwrap();
    let context = config
        .resolve(&talos_client::config::Overrides::default(), tc)
        .unwrap();
    let client = talos_client::Client::from_context(&context).unwrap();
    talos_client::ops::Ops::open(&context, client, state)
        .unwrap()
        .fingerprint()
        .to_string()
}

/// `talosctl-rs -o json ops ARGS` against talosconfig `tc`, through the
/// daemon on `socket`.
pub async fn ops_cli(tc: &Path, socket: &Path, args: &[&str]) -> talos_test_support::cli::Run {
    let mut cmd = talos_test_support::cli::command(tc);
    cmd.args(["-o", "json", "ops", "--without-cluster-lock"])
        .env("TALOS_OPSD_SOCKET", socket)
        .args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    talos_test_support::cli::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits (within `timeout`) until `enough` holds of cluster `cluster`'s
/// succeeded operations, newest first, and returns them.
pub async fn until_succeeded(
    client: &OpsdClient<Channel>,
    cluster: &str,
    what: &str,
    timeout: Duration,
    enough: impl Fn(&[talos_opsd::proto::Operation]) -> bool,
) -> Vec<talos_opsd::proto::Operation> {
    wait_for(what, timeout, || {
        let mut client = client.clone();
        let request = talos_opsd::proto::ListOperationsRequest {
            cluster: cluster.into(),
            state: "succeeded".into(),
        };
        let enough = &enough;
        async move {
            let ops = client
                .list_operations(request)
                .await
                .ok()?
                .into_inner()
                .operations;
            enough(&ops).then_some(ops)
        }
    })
    .await
}

/// Waits (within 30 s) until `counter` reaches `count`.
pub async fn wait_for_count(what: &str, counter: &std::sync::atomic::AtomicUsize, count: usize) {
    wait_for(what, Duration::from_secs(30), || {
        let now = counter.load(std::sync::atomic::Ordering::SeqCst);
        async move { (now >= count).then_some(()) }
    })
    .await;
}
