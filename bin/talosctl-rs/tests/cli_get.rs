//! The real talosctl-rs binary against talos-sim: `get` of COSI resources.

use talos_test_support as common;

use std::io::BufRead as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::cli::{command, run};
use common::sim::SimCluster;
use talos_client::client::{ApplyMode, ApplyRequest};

fn yaml_documents(text: &str) -> Vec<serde_norway::Value> {
    text.split("\n---\n")
        .map(|doc| serde_norway::from_str(doc).unwrap_or_else(|e| panic!("{e}: {doc}")))
        .collect()
}

fn json_documents(text: &str) -> Vec<serde_json::Value> {
    serde_json::Deserializer::from_str(text)
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test]
async fn machine_config_status_members_addresses_and_etcd() {
    let sim = SimCluster::start(2).await;
    let tc = sim.dir.path().join("talosconfig");
    let node = sim.cluster.node("cp-1").unwrap();

    let mc = run(&tc, &["-n", &sim.ip(1), "get", "mc", "-o", "yaml"])
        .await
        .ok();
    let docs = yaml_documents(&mc.stdout);
    let ids: Vec<_> = docs
        .iter()
        .map(|d| d["metadata"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["persistent", "v1alpha1"]);
    assert_eq!(docs[1]["node"].as_str(), Some(sim.ip(1).as_str()));
    assert_eq!(
        docs[1]["spec"].as_str(),
        Some(node.active_config().as_str())
    );
    assert_eq!(
        docs[1]["metadata"]["type"].as_str(),
        Some("MachineConfigs.config.talos.dev")
    );

    let status = run(&tc, &["-n", &sim.ip(1), "get", "machinestatus"])
        .await
        .ok();
    let lines: Vec<Vec<&str>> = status
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NODE",
            "NAMESPACE",
            "TYPE",
            "ID",
            "VERSION",
            "STAGE",
            "READY"
        ]
    );
    assert_eq!(lines[1][1..4], ["runtime", "MachineStatus", "machine"]);
    assert_eq!(lines[1][5..], ["running", "true"]);

    let nodes = format!("{},{}", sim.ip(1), sim.ip(2));
    let members = run(&tc, &["-n", &nodes, "get", "members"]).await.ok();
    let lines: Vec<&str> = members.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "NODE",
            "NAMESPACE",
            "TYPE",
            "ID",
            "VERSION",
            "HOSTNAME",
            "MACHINE",
            "TYPE",
            "OS",
            "ADDRESSES"
        ]
    );
    assert_eq!(
        lines.len(),
        5,
        "two members seen from each of two nodes:\n{}",
        members.stdout
    );
    assert!(lines[1].starts_with(&sim.ip(1)) && lines[4].starts_with(&sim.ip(2)));
    assert!(
        lines[1].contains(&format!("controlplane   Talos (v1.13.9)   [{}]", sim.ip(1))),
        "{}",
        lines[1]
    );

    let addresses = run(&tc, &["-n", &sim.ip(2), "get", "addresses", "-o", "json"])
        .await
        .ok();
    let docs = json_documents(&addresses.stdout);
    assert!(
        docs.iter()
            .any(|d| d["spec"]["address"] == format!("{}/24", sim.ip(2)))
    );

    let etcd = run(&tc, &["-n", &sim.ip(2), "get", "etcdmembers", "-o", "json"])
        .await
        .ok();
    let docs = json_documents(&etcd.stdout);
    let own = sim
        .admin()
        .node(sim.ip(2))
        .etcd_status()
        .await
        .unwrap()
        .member_id;
    assert_eq!(docs[0]["spec"]["memberID"], own.to_string());
    assert_eq!(docs[0]["metadata"]["id"], "local");
}

#[tokio::test]
async fn roles_and_unknown_types_fail_clearly() {
    let sim = SimCluster::start(1).await;
    let reader = sim.dir.path().join("talosconfig-reader");
    let denied = run(&reader, &["get", "mc"]).await;
    assert_eq!(denied.code, 1, "{}", denied.stdout);
    assert!(
        denied.stderr.contains("permission denied"),
        "{}",
        denied.stderr
    );
    assert!(
        run(&reader, &["get", "services"])
            .await
            .ok()
            .stdout
            .contains("etcd")
    );

    let tc = sim.dir.path().join("talosconfig");
    let unknown = run(&tc, &["get", "flux-capacitors"]).await;
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("\"flux-capacitors\""),
        "{}",
        unknown.stderr
    );
    assert!(unknown.stderr.contains("get rd"), "{}", unknown.stderr);
}

/// Lines of a running command's stdout, read in a thread.
fn lines_of(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for a line containing `needle`, failing after `timeout`.
fn wait_line(
    rx: &std::sync::mpsc::Receiver<String>,
    needle: &str,
    timeout: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => panic!("no line with {needle:?} in time; saw:\n{}", seen.join("\n")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_an_apply_changing_v1alpha1() {
    let sim = SimCluster::start(1).await;
    let tc = sim.dir.path().join("talosconfig");
    let mut child = command(&tc)
        .args(["get", "mc", "v1alpha1", "--watch", "-o", "yaml"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rx = lines_of(child.stdout.take().unwrap());
    let watched = async {
        let first = tokio::task::block_in_place(|| {
            wait_line(&rx, "event: created", Duration::from_secs(30))
        });
        assert!(first.iter().any(|l| l.starts_with("node: ")), "{first:?}");
        let base = std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap();
        let changed = base.replace("clusterName: talos-sim", "clusterName: watched");
        sim.admin()
            .apply_configuration(ApplyRequest::new(changed, ApplyMode::NoReboot))
            .await
            .unwrap();
        let update = tokio::task::block_in_place(|| {
            wait_line(&rx, "event: updated", Duration::from_secs(30))
        });
        assert!(update.iter().any(|l| l.starts_with("---")), "{update:?}");
        tokio::task::block_in_place(|| {
            wait_line(&rx, "clusterName: watched", Duration::from_secs(30))
        });
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(watched)).await;
    let _ = child.kill();
    let _ = child.wait();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
