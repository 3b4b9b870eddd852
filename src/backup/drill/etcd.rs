//! The throwaway etcd of a drill: restore, start on free loopback ports,
//! read back, stop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::process::{Child, Command};

use crate::snapshot::SnapshotReport;

use super::{BackupMetadata, DrillOptions, DrillReport};
use crate::backup::RecoveryKit;
use crate::backup::at_rest::{self, ENCRYPTED_PREFIX};

const MEMBER: &str = "drill";

/// What the restored etcd is compared with.
pub(super) struct Expected<'a> {
    /// The sidecar.
    pub meta: &'a BackupMetadata,
    /// What verifying the fetched snapshot found.
    pub verified: &'a SnapshotReport,
    /// The decrypted recovery kit, if the backup has one.
    pub kit: Option<&'a RecoveryKit>,
}

/// Restores `snapshot`, starts etcd on it and records the `restore`,
/// `start`, `revision`, `keys` and `prefixes` checks.
pub(super) async fn restore_and_compare(
    snapshot: &Path,
    work: &Path,
    expected: Expected<'_>,
    options: &DrillOptions,
    report: &mut DrillReport,
) {
    let Expected {
        meta,
        verified,
        kit,
    } = expected;
    let bin = options.etcd_bin_dir.as_deref();
    let Some(etcd) = find(bin, "etcd") else {
        report.fail("restore", "no etcd binary in PATH");
        return;
    };
    let Some(etcdctl) = find(bin, "etcdctl") else {
        report.fail("restore", "no etcdctl binary in PATH");
        return;
    };
    let (client_port, peer_port) = free_ports();
    let peer = format!("http://127.0.0.1:{peer_port}");
    let client = format!("http://127.0.0.1:{client_port}");
    let data = work.join("data");
    let (tool, mut restore) = match find(bin, "etcdutl") {
        Some(etcdutl) => ("etcdutl", Command::new(etcdutl)),
        None => ("etcdctl", Command::new(&etcdctl)),
    };
    report.restore_tool = Some(tool.into());
    restore
        .env("ETCDCTL_API", "3")
        .arg("snapshot")
        .arg("restore")
        .arg(snapshot)
        .arg(format!("--name={MEMBER}"))
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--initial-cluster={MEMBER}={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"));
    match restore.stdin(Stdio::null()).output().await {
        Ok(out) if out.status.success() => {
            report.pass("restore", format!("{tool} snapshot restore"))
        }
        Ok(out) => {
            report.fail("restore", format!("{tool}: {}", tail(&out.stderr)));
            return;
        }
        Err(e) => {
            report.fail("restore", format!("{tool}: {e}"));
            return;
        }
    }

    let log = work.join("etcd.log");
    let mut child = match start(&etcd, &data, &client, &peer, &log) {
        Ok(child) => child,
        Err(e) => {
            report.fail("start", format!("etcd: {e}"));
            return;
        }
    };
    let ctl = Ctl {
        etcdctl,
        endpoint: format!("127.0.0.1:{client_port}"),
    };
    let revision = wait_healthy(&mut child, &ctl, &log, options.start_timeout, report).await;
    if let Some(revision) = revision {
        compare(&ctl, revision, meta, verified, report).await;
        if let Some(kit) = kit
            && report.ok
        {
            open_a_secret(&ctl, kit, report).await;
        }
    }
    let _ = child.kill().await;
}

fn start(etcd: &Path, data: &Path, client: &str, peer: &str, log: &Path) -> std::io::Result<Child> {
    let out = std::fs::File::create(log)?;
    Command::new(etcd)
        .arg(format!("--name={MEMBER}"))
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster={MEMBER}={peer}"))
        .arg("--log-level=warn")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
}

/// Waits until the restored etcd answers; records `start` and returns its
/// revision.
async fn wait_healthy(
    child: &mut Child,
    ctl: &Ctl,
    log: &Path,
    timeout: Duration,
    report: &mut DrillReport,
) -> Option<i64> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read(log).unwrap_or_default();
            report.fail("start", format!("etcd exited ({status}): {}", tail(&log)));
            return None;
        }
        if let Some(status) = ctl.json(&["endpoint", "status"]).await {
            let revision = status[0]["Status"]["header"]["revision"].as_i64();
            if let Some(revision) = revision {
                report.pass("start", format!("etcd healthy on {}", ctl.endpoint));
                return Some(revision);
            }
        }
        if Instant::now() > deadline {
            report.fail("start", format!("etcd not answering after {timeout:?}"));
            return None;
        }
        // A poll interval; the loop ends on an answer or the deadline.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn compare(
    ctl: &Ctl,
    revision: i64,
    meta: &BackupMetadata,
    verified: &SnapshotReport,
    report: &mut DrillReport,
) {
    report.revision = Some(revision);
    let expected = meta.snapshot.status.revision;
    if revision != expected || verified.status.revision != expected {
        report.fail(
            "revision",
            format!("etcd reports {revision}; the sidecar says {expected}"),
        );
        return;
    }
    report.pass("revision", revision.to_string());

    // Every key from "" on (etcd 3.4's etcdctl has no --count-only):
    // `count` is the number of keys, `kvs` the keys themselves.
    let Some(listing) = ctl.json(&["get", "", "--from-key", "--keys-only"]).await else {
        report.fail("keys", "etcdctl get --from-key --keys-only failed");
        return;
    };
    let keys = listing["count"].as_u64().unwrap_or(0);
    report.keys = Some(keys);
    if keys != meta.snapshot.status.total_keys {
        report.fail(
            "keys",
            format!(
                "etcd holds {keys} keys; the sidecar says {}",
                meta.snapshot.status.total_keys
            ),
        );
        return;
    }
    report.pass("keys", keys.to_string());

    let mut prefixes = BTreeMap::new();
    for kv in listing["kvs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let key = kv["key"]
            .as_str()
            .and_then(|k| BASE64.decode(k).ok())
            .unwrap_or_default();
        *prefixes.entry(top_prefix(&key)).or_insert(0u64) += 1;
    }
    let read: u64 = prefixes.values().sum();
    report.prefixes = prefixes;
    if read != keys {
        report.fail("prefixes", format!("read {read} keys back of {keys}"));
        return;
    }
    report.pass(
        "prefixes",
        format!("{} prefixes, {read} keys read", report.prefixes.len()),
    );
}

/// The `kit-secret` check: the first Secret kube-apiserver encrypted at
/// rest opens with the kit's key, so the kit restores a cluster whose
/// Secrets can be read.
async fn open_a_secret(ctl: &Ctl, kit: &RecoveryKit, report: &mut DrillReport) {
    const SECRETS: &str = "/registry/secrets/";
    let Some(listing) = ctl.json(&["get", SECRETS, "--prefix"]).await else {
        report.fail(
            "kit-secret",
            format!("etcdctl get {SECRETS} --prefix failed"),
        );
        return;
    };
    let kvs = listing["kvs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let decode = |field: &serde_json::Value| {
        field
            .as_str()
            .and_then(|v| BASE64.decode(v).ok())
            .unwrap_or_default()
    };
    let Some((key, value)) = kvs
        .iter()
        .map(|kv| (decode(&kv["key"]), decode(&kv["value"])))
        .find(|(_, value)| value.starts_with(ENCRYPTED_PREFIX))
    else {
        report.pass(
            "kit-secret",
            format!("{} Secret(s), none encrypted at rest", kvs.len()),
        );
        return;
    };
    let key = String::from_utf8_lossy(&key).into_owned();
    match at_rest::open(kit, &value) {
        Ok(opened) if opened.is_kubernetes_object() => report.pass(
            "kit-secret",
            format!(
                "{key} opened with the kit's {} key {} ({} bytes)",
                opened.provider,
                opened.key_name,
                opened.plain.len()
            ),
        ),
        Ok(opened) => report.fail(
            "kit-secret",
            format!(
                "{key} opened with the kit's {} key but is not a Kubernetes object",
                opened.provider
            ),
        ),
        Err(e) => report.fail("kit-secret", format!("{key}: {e}")),
    }
}

/// The top-level prefix of a key: `/registry/<type>` for Kubernetes keys,
/// else the first segment.
pub(crate) fn top_prefix(key: &[u8]) -> String {
    let key = String::from_utf8_lossy(key);
    let segments = if key.starts_with("/registry/") {
        3
    } else if key.starts_with('/') {
        2
    } else {
        1
    };
    key.splitn(segments + 1, '/')
        .take(segments)
        .collect::<Vec<_>>()
        .join("/")
}

struct Ctl {
    etcdctl: PathBuf,
    endpoint: String,
}

impl Ctl {
    /// `etcdctl ARGS -w json` against the drill's etcd, parsed.
    async fn json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let out = Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .arg("--command-timeout=5s")
            .args(args)
            .args(["-w", "json"])
            .stdin(Stdio::null())
            .output()
            .await
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

/// Looks `name` up in `dir`, or else in `PATH`.
fn find(dir: Option<&Path>, name: &str) -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = match dir {
        Some(dir) => vec![dir.to_owned()],
        None => std::env::split_paths(&std::env::var_os("PATH")?).collect(),
    };
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn free_ports() -> (u16, u16) {
    // Both held until both are known, so they differ.
    let a = std::net::TcpListener::bind("127.0.0.1:0");
    let b = std::net::TcpListener::bind("127.0.0.1:0");
    let port = |l: &std::io::Result<std::net::TcpListener>| {
        l.as_ref()
            .ok()
            .and_then(|l| l.local_addr().ok())
            .map_or(0, |a| a.port())
    };
    (port(&a), port(&b))
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::top_prefix;

    #[test]
    fn prefixes_are_the_kubernetes_type_or_the_first_segment() {
        assert_eq!(
            top_prefix(b"/registry/pods/default/web-0"),
            "/registry/pods"
        );
        assert_eq!(top_prefix(b"/registry/secrets"), "/registry/secrets");
        assert_eq!(top_prefix(b"/small/a"), "/small");
        assert_eq!(top_prefix(b"plain"), "plain");
        assert_eq!(top_prefix(b"a/b/c"), "a");
    }
}
