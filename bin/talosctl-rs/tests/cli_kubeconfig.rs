//! `talosctl-rs kubeconfig` against the simulator: the archive Talos sends
//! is unpacked, written 0600, merged with renames, replaced with --force,
//! and an existing file is never overwritten by accident.

use std::os::unix::fs::PermissionsExt as _;

use talos_test_support::cli::run;
use talos_test_support::sim::SimCluster;

fn yaml(path: &std::path::Path) -> serde_json::Value {
    serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn names(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn kubeconfig_writes_merges_and_forces() {
    let sim = SimCluster::start(1).await;
    let tc = sim.dir.path().join("talosconfig");
    let node = sim.ip(1);
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("kubeconfig");

    // A directory gets `kubeconfig` inside.
    run(
        &tc,
        &["-n", &node, "kubeconfig", out.path().to_str().unwrap()],
    )
    .await
    .ok();
    let first = yaml(&path);
    assert_eq!(first["current-context"], "admin@talos-sim");
    assert_eq!(
        first["clusters"][0]["cluster"]["server"],
        format!("https://{node}:6443")
    );
    assert!(
        first["users"][0]["user"]["client-key-data"]
            .as_str()
            .is_some_and(|k| !k.is_empty())
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Merging again renames every clashing name and switches to the new one.
    let merged = run(&tc, &["-n", &node, "kubeconfig", path.to_str().unwrap()])
        .await
        .ok();
    assert!(
        merged
            .stderr
            .contains(r#"renamed context "admin@talos-sim" -> "admin@talos-sim-1""#),
        "{}",
        merged.stderr
    );
    let second = yaml(&path);
    assert_eq!(names(&second, "clusters"), ["talos-sim", "talos-sim-1"]);
    assert_eq!(
        names(&second, "users"),
        ["admin@talos-sim", "admin@talos-sim-1"]
    );
    assert_eq!(second["current-context"], "admin@talos-sim-1");
    assert_eq!(second["contexts"][1]["context"]["cluster"], "talos-sim-1");

    // --force replaces the clashing entries instead.
    run(
        &tc,
        &["-n", &node, "kubeconfig", "--force", path.to_str().unwrap()],
    )
    .await
    .ok();
    let forced = yaml(&path);
    assert_eq!(names(&forced, "clusters"), ["talos-sim-1", "talos-sim"]);
    assert_eq!(forced["current-context"], "admin@talos-sim");

    // Without merge, an existing file is refused and left as it was.
    let before = std::fs::read(&path).unwrap();
    let refused = run(
        &tc,
        &[
            "-n",
            &node,
            "kubeconfig",
            "--merge=false",
            path.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("already exists"),
        "{}",
        refused.stderr
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);

    // A reader may not fetch it (admin only, as upstream).
    let reader = run(
        &sim.dir.path().join("talosconfig-reader"),
        &[
            "-n",
            &node,
            "kubeconfig",
            out.path().join("r").to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(reader.code, 1);
    assert!(
        reader.stderr.contains("permission denied"),
        "{}",
        reader.stderr
    );
}

/// Runs openssl with `args`, panicking with its output when it fails.
fn openssl(args: &[&str]) -> String {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs (scripts/install-deps.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "openssl {args:?}: {text}");
    text
}

/// The kubeconfig's PKI is the cluster's Kubernetes PKI as upstream makes it
/// (pkg/machinery/config/generate/secrets/ca.go, NewKubernetesCA; the admin
/// pair from siderolabs/crypto NewKeyPair): an ECDSA P-256 CA with
/// `O=kubernetes`, not the Talos OS CA, and an ECDSA client key that
/// OpenSSL-based clients load (they cannot load Ed25519 keys under Talos's
/// own PEM label).
#[tokio::test]
async fn the_kubeconfig_is_issued_by_the_clusters_ecdsa_kubernetes_ca_and_opens_with_openssl() {
    use base64::Engine as _;
    let sim = SimCluster::start(1).await;
    let tc = sim.dir.path().join("talosconfig");
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("kubeconfig");
    run(
        &tc,
        &["-n", &sim.ip(1), "kubeconfig", path.to_str().unwrap()],
    )
    .await
    .ok();
    let config = yaml(&path);
    let decode = |v: &serde_json::Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    let ca = decode(&config["clusters"][0]["cluster"]["certificate-authority-data"]);
    let crt = decode(&config["users"][0]["user"]["client-certificate-data"]);
    let key = decode(&config["users"][0]["user"]["client-key-data"]);
    for (name, bytes) in [("ca.crt", &ca), ("admin.crt", &crt), ("admin.key", &key)] {
        std::fs::write(out.path().join(name), bytes).unwrap();
    }
    let file = |name: &str| out.path().join(name).to_str().unwrap().to_string();

    assert_eq!(
        ca,
        std::fs::read(sim.dir.path().join("pki/kubernetes-ca.crt")).unwrap(),
        "the kubeconfig trusts the cluster's Kubernetes CA"
    );
    assert_ne!(
        ca,
        std::fs::read(sim.dir.path().join("pki/ca.crt")).unwrap(),
        "the Talos OS CA is not the Kubernetes CA"
    );
    let ca_text = openssl(&["x509", "-in", &file("ca.crt"), "-noout", "-text"]);
    assert!(ca_text.contains("Subject: O = kubernetes"), "{ca_text}");
    assert!(ca_text.contains("NIST CURVE: P-256"), "{ca_text}");
    assert!(ca_text.contains("CA:TRUE"), "{ca_text}");

    assert!(String::from_utf8_lossy(&key).starts_with("-----BEGIN EC PRIVATE KEY-----"));
    let key_text = openssl(&["pkey", "-in", &file("admin.key"), "-noout", "-text"]);
    assert!(key_text.contains("NIST CURVE: P-256"), "{key_text}");
    let crt_text = openssl(&["x509", "-in", &file("admin.crt"), "-noout", "-subject"]);
    assert!(
        crt_text.contains("subject=O = system:masters, CN = admin"),
        "{crt_text}"
    );
    openssl(&["verify", "-CAfile", &file("ca.crt"), &file("admin.crt")]);
    // The key is the certificate's: same public key.
    let from_key = openssl(&["pkey", "-in", &file("admin.key"), "-pubout"]);
    let from_crt = openssl(&["x509", "-in", &file("admin.crt"), "-noout", "-pubkey"]);
    assert_eq!(from_key, from_crt);
}
