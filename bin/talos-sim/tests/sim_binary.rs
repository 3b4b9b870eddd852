//! The talos-sim binary: `up` runs until SIGTERM and leaves no etcd behind,
//! a second `up` on the same directory works, and `add-node` reaches the
//! running cluster.

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use talos_client::Client;
use talos_client::config::{Overrides, TalosConfig};

/// A running `talos-sim up`; killed on drop if the test fails first.
struct Up {
    child: Child,
    json: serde_json::Value,
}

impl Up {
    fn start(dir: &Path) -> Up {
        Up::start_with(dir, &["--nodes", "3"])
    }

    fn start_with(dir: &Path, args: &[&str]) -> Up {
        let mut child = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
            .args(["up", "--isolated", "--json", "--no-kubernetes"])
            .args(args)
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // The JSON line is printed once the cluster is ready.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut up = Up {
            child,
            json: serde_json::Value::Null,
        };
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("talos-sim up reports its cluster within two minutes");
        up.json = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        up
    }

    /// Sends SIGTERM and waits (with a deadline) for a clean exit.
    fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "talos-sim exited with {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "talos-sim did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes whose command line mentions `dir` (etcd data directories live
/// under it).
fn processes_using(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        // The node's etcd runs from the build cache by its full path.
        .filter(|c| {
            let program = c.split(' ').next().unwrap_or("");
            Path::new(program).file_name() == Some("etcd".as_ref()) && c.contains(&needle)
        })
        .collect()
}

/// Every node's hostname, asked through the cluster's admin talosconfig.
async fn hostnames(up: &Up) -> Vec<String> {
    let talosconfig = Path::new(up.json["talosconfig"].as_str().unwrap());
    let config = TalosConfig::read(talosconfig).unwrap();
    let context = config.resolve(&Overrides::default(), talosconfig).unwrap();
    let client = Client::from_context(&context).unwrap();
    let ips: Vec<String> = up.json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["ip"].as_str().unwrap().to_string())
        .collect();
    let replies = client.nodes(ips).hostname().await.unwrap();
    replies.into_iter().map(|r| r.result.unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_stops_cleanly_restarts_and_adds_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let missing = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
        .args([
            "up",
            "--isolated",
            "--kube-apiserver",
            "/nonexistent/kube-apiserver",
            "--dir",
        ])
        .arg(dir.path().join("missing"))
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("--kube-apiserver /nonexistent/kube-apiserver: no such file"),
        "{stderr}"
    );
    let up = Up::start(dir.path());
    assert_eq!(up.json["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(up.json["kubernetes"], false, "--no-kubernetes");
    assert_eq!(hostnames(&up).await, ["cp-1", "cp-2", "cp-3"]);
    for file in ["talosconfig-reader", "talosconfig-backup", "pki/ca.crt"] {
        assert!(dir.path().join(file).exists(), "{file}");
    }
    assert_eq!(processes_using(dir.path()).len(), 3);

    let added = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
        .arg("add-node")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    assert!(String::from_utf8_lossy(&added.stdout).starts_with("added cp-4 at "));
    assert_eq!(processes_using(dir.path()).len(), 4);

    // The control socket speaks typed requests, for the binary and for
    // programs alike; garbage gets a typed error, not silence.
    let reply = talos_sim::control::send(dir.path(), &talos_sim::control::Request::Nodes)
        .await
        .unwrap();
    match reply {
        talos_sim::control::Reply::Nodes { nodes } => {
            let names: Vec<_> = nodes.iter().map(|n| n.name.as_str()).collect();
            assert_eq!(names, ["cp-1", "cp-2", "cp-3", "cp-4"]);
        }
        other => panic!("{other:?}"),
    }
    let garbage = async {
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::UnixStream::connect(dir.path().join("control.sock"))
            .await
            .unwrap();
        stream.write_all(b"add-node please\n").await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut line)
            .await
            .unwrap();
        line
    }
    .await;
    assert!(
        garbage.contains("\"reply\":\"error\"") && garbage.contains("not a request"),
        "{garbage}"
    );

    // A dead node by hand: cp-4 powered off, its etcd gone, the others up.
    let off = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
        .arg("fault")
        .arg(dir.path())
        .args(["power-off", "cp-4"])
        .output()
        .unwrap();
    assert!(
        off.status.success(),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
    assert_eq!(processes_using(dir.path()).len(), 3);
    assert_eq!(hostnames(&up).await.len(), 3);

    up.stop();
    assert_eq!(
        processes_using(dir.path()),
        Vec::<String>::new(),
        "no etcd outlives talos-sim"
    );

    // Same directory again: a fresh cluster with the same CA.
    let ca = std::fs::read(dir.path().join("pki/ca.crt")).unwrap();
    let again = Up::start(dir.path());
    assert_eq!(std::fs::read(dir.path().join("pki/ca.crt")).unwrap(), ca);
    assert_eq!(hostnames(&again).await, ["cp-1", "cp-2", "cp-3"]);
    again.stop();
    assert!(processes_using(dir.path()).is_empty());

    let no_cluster = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
        .arg("add-node")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(no_cluster.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_cluster.stderr).contains("no talos-sim running"));
}

#[test]
fn a_second_up_on_a_running_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path());
    let second = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
        .args(["up", "--isolated", "--no-kubernetes", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&second.stderr).contains("already running"));
    up.stop();
}

#[test]
fn gen_certs_writes_every_file_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pki");
    let status = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
        .arg("gen-certs")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let mut keys = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", path.display());
        keys += usize::from(path.extension().is_some_and(|e| e == "key"));
    }
    assert_eq!(keys, 5, "ca, server, admin, reader and etcd-backup keys");
    every_key_loads_in_openssl(&out);
}

/// OpenSSL 3 loads each key (and each talosconfig's key) once the Talos
/// PEM label is replaced by the standard one, as for keys from real Talos:
/// they are PKCS#8 v1, which OpenSSL 3.0 reads, not v2, which it refuses.
fn every_key_loads_in_openssl(dir: &Path) {
    use base64::Engine as _;
    let mut pems = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".key") {
            pems.push((name, std::fs::read_to_string(&path).unwrap()));
        } else if name.starts_with("talosconfig") {
            let config: serde_json::Value =
                serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let key = config["contexts"]["sim"]["key"].as_str().unwrap();
            let pem = base64::engine::general_purpose::STANDARD
                .decode(key)
                .unwrap();
            pems.push((name, String::from_utf8(pem).unwrap()));
        }
    }
    assert_eq!(pems.len(), 8, "5 key files and 3 talosconfigs");
    let scratch = tempfile::tempdir().unwrap();
    for (name, pem) in pems {
        assert!(
            pem.contains("BEGIN ED25519 PRIVATE KEY"),
            "{name}: Talos's label"
        );
        let relabelled = scratch.path().join("key.pem");
        std::fs::write(
            &relabelled,
            pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY"),
        )
        .unwrap();
        let out = Command::new("openssl")
            .args(["pkey", "-noout", "-in"])
            .arg(&relabelled)
            .output()
            .expect("openssl is installed (scripts/install-deps.sh)");
        assert!(
            out.status.success(),
            "openssl refuses {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `up --talos-version 1.14.0` runs the 1.14 profile: Version says so, and
/// a REBOOT apply is refused with upstream's message (v1alpha1_server.go
/// at v1.14.0); an unknown version is refused before anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_the_1_14_profile_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_talos-sim"))
        .args(["up", "--isolated", "--talos-version", "1.12.0", "--dir"])
        .arg(dir.path().join("refused"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--talos-version"), "{stderr}");
    assert!(!dir.path().join("refused").exists());

    let up = Up::start_with(dir.path(), &["--nodes", "1", "--talos-version", "1.14.0"]);
    let talosconfig = Path::new(up.json["talosconfig"].as_str().unwrap());
    let config = TalosConfig::read(talosconfig).unwrap();
    let context = config.resolve(&Overrides::default(), talosconfig).unwrap();
    let client = Client::from_context(&context).unwrap();
    assert_eq!(client.version().await.unwrap().tag, "v1.14.0");
    let yaml = std::fs::read(dir.path().join("controlplane.yaml")).unwrap();
    let request =
        talos_client::client::ApplyRequest::new(yaml, talos_client::client::ApplyMode::Reboot);
    match client.apply_configuration(request).await {
        Err(talos_client::Error::Unimplemented(f)) => assert_eq!(
            f.message,
            "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead"
        ),
        other => panic!("expected Unimplemented, got {other:?}"),
    }
    up.stop();
}
