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
