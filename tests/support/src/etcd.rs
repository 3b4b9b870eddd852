//! Test support for the snapshot tests: a throwaway single-member etcd (the
//! Debian `etcd` 3.4 and `etcdctl` binaries) and snapshots taken from it.
//!
//! Used by the `snapshot_*` tests.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

const ETCD: &str = "/usr/bin/etcd";
const ETCDCTL: &str = "/usr/bin/etcdctl";

/// A running etcd member in a temporary data directory; killed (and waited
/// for) on drop, so a failing test leaves no process behind.
pub struct Etcd {
    child: Child,
    /// `127.0.0.1:port` of the client URL.
    pub endpoint: String,
    dir: tempfile::TempDir,
}

fn free_ports() -> (u16, u16) {
    // Hold both listeners until both ports are known, so they differ.
    let a = TcpListener::bind("127.0.0.1:0").expect("bind");
    let b = TcpListener::bind("127.0.0.1:0").expect("bind");
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

impl Etcd {
    /// Starts etcd with `extra` arguments and waits until it is healthy.
    pub fn start(extra: &[&str]) -> Etcd {
        // A port picked free can be taken before etcd binds it: retry.
        let mut last = String::new();
        for _ in 0..3 {
            match Etcd::try_start(extra) {
                Ok(etcd) => return etcd,
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start: {last}");
    }

    fn try_start(extra: &[&str]) -> Result<Etcd, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let (client, peer) = free_ports();
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = File::create(dir.path().join("etcd.log")).expect("log file");
        let child = Command::new(ETCD)
            .arg("--name=snaptest")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=snaptest={peer_url}"))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {ETCD}: {e}"))?;
        let mut etcd = Etcd {
            child,
            endpoint: format!("127.0.0.1:{client}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = etcd.child.try_wait() {
                return Err(format!("etcd exited ({status}): {}", etcd.log_tail()));
            }
            let health = etcd.ctl(&["endpoint", "health", "--command-timeout=2s"]);
            if health.status.success() {
                return Ok(etcd);
            }
            if Instant::now() > deadline {
                return Err(format!("etcd not healthy after 30 s: {}", etcd.log_tail()));
            }
            // Poll interval, not synchronisation: the loop ends on health.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of etcd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Runs `etcdctl` (API v3) against this member.
    pub fn ctl(&self, args: &[&str]) -> Output {
        ctl_command()
            .arg(format!("--endpoints={}", self.endpoint))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run etcdctl")
    }

    /// Runs one `etcdctl txn` with `ops` as the success branch (each a line
    /// like `put key "value"` or `del key`); panics unless it succeeds.
    pub fn txn(&self, ops: &[String]) {
        let mut script = String::from("\n");
        for op in ops {
            script.push_str(op);
            script.push('\n');
        }
        script.push_str("\n\n");
        let mut child = ctl_command()
            .arg(format!("--endpoints={}", self.endpoint))
            .arg("txn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run etcdctl txn");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .expect("write txn");
        let out = child.wait_with_output().expect("etcdctl txn");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.starts_with("SUCCESS"),
            "etcdctl txn failed: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Puts one key through etcd's JSON gateway (no process per request).
    pub fn http_put(&self, key: &[u8], value: &[u8]) {
        self.http_put_base64(key, &BASE64.encode(value));
    }

    /// Like [`Etcd::http_put`] with the value already in base64, so a
    /// large value can be encoded once for many puts.
    pub fn http_put_base64(&self, key: &[u8], value: &str) {
        let body = format!(
            "{{\"key\":\"{}\",\"value\":\"{value}\"}}",
            BASE64.encode(key)
        );
        let mut stream = TcpStream::connect(&self.endpoint).expect("connect to etcd");
        write!(
            stream,
            "POST /v3/kv/put HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Connection: close\r\nContent-Length: {}\r\n\r\n",
            self.endpoint,
            body.len()
        )
        .and_then(|()| stream.write_all(body.as_bytes()))
        .expect("send put");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read reply");
        assert!(
            response.starts_with("HTTP/1.1 200") && response.contains("\"revision\""),
            "put failed: {}",
            &response[..response.len().min(500)]
        );
    }

    /// `etcdctl snapshot save path`; panics unless it succeeds.
    pub fn snapshot(&self, path: &Path) {
        let out = self.ctl(&["snapshot", "save", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "snapshot save failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ctl_command() -> Command {
    let mut command = Command::new(ETCDCTL);
    command.env("ETCDCTL_API", "3");
    command
}

/// `etcdctl snapshot status FILE -w json` (offline), parsed.
pub fn etcdctl_status(path: &Path) -> serde_json::Value {
    let out = ctl_command()
        .args(["snapshot", "status", "-w", "json"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .expect("run etcdctl snapshot status");
    assert!(
        out.status.success(),
        "etcdctl snapshot status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// Fills etcd with a few hundred keys over several revisions: puts,
/// overwrites, deletes, and values larger than a page (overflow pages).
pub fn populate(etcd: &Etcd) {
    let key = |i: usize| format!("/registry/test/key-{i:04}");
    // 400 keys in 4 transactions (etcd allows 128 operations per txn).
    for batch in 0..4 {
        let ops: Vec<String> = (batch * 100..batch * 100 + 100)
            .map(|i| format!("put {} \"value {i} first\"", key(i)))
            .collect();
        etcd.txn(&ops);
    }
    // Overwrite every third key, twice.
    for round in 0..2 {
        let ops: Vec<String> = (0..400)
            .step_by(3)
            .take(120)
            .map(|i| format!("put {} \"value {i} round {round}\"", key(i)))
            .collect();
        etcd.txn(&ops);
    }
    // Delete every seventh key.
    let ops: Vec<String> = (0..400)
        .step_by(7)
        .map(|i| format!("del {}", key(i)))
        .collect();
    etcd.txn(&ops);
    // Values of 10 KB and 100 KB: overflow pages.
    etcd.http_put(b"/registry/test/big-10k", &vec![b'x'; 10_000]);
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    etcd.http_put(b"/registry/test/big-100k", &big);
    etcd.http_put(b"/registry/test/big-10k", &vec![b'y'; 10_000]);
}

/// A snapshot of a populated etcd, as `etcdctl snapshot save` writes it
/// (with the sha256 trailer, as the server streams it). Taken once per test
/// process; etcd is stopped and its directory removed before this returns.
pub fn fixture() -> &'static [u8] {
    static SNAPSHOT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let etcd = Etcd::start(&[]);
        populate(&etcd);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fixture.db");
        etcd.snapshot(&path);
        drop(etcd);
        std::fs::read(&path).expect("read snapshot")
    })
}

/// Writes `bytes` to `name` in `dir` and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write file");
    path
}

/// Replaces the sha256 trailer of a snapshot with the hash of its contents.
pub fn reseal(snapshot: &mut [u8]) {
    use sha2::Digest;
    let cut = snapshot.len() - 32;
    let digest = sha2::Sha256::digest(&snapshot[..cut]);
    snapshot[cut..].copy_from_slice(&digest);
}
