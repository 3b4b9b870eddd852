//! The cluster lock every admin host sees (the Lease
//! kube-system/talos-client-operation), against the simulator's real
//! kube-apiserver: a second admin host (another state directory and
//! talosconfig) is refused naming the holder; a lease taken away
//! mid-operation stops the holder before its next destructive step; a
//! crashed holder's resume takes its lease again.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod ops_fixture;

use ops_fixture::Fixture;
use talos_client::kube::{KubeClient, KubeConfig};
use talos_client::ops::{ClusterLockPolicy, ClusterLockRecord, Event, OpSpec, OpsError};
use talos_test_support::sim::wait_for;

const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/talos-client-operation";

/// A second admin host: its own state directory and its own copy of the
/// admin talosconfig.
struct OtherHost {
    dir: tempfile::TempDir,
}

impl OtherHost {
    fn new(f: &Fixture) -> OtherHost {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(f.talosconfig(), dir.path().join("talosconfig")).unwrap();
        OtherHost { dir }
    }

    fn talosconfig(&self) -> PathBuf {
        self.dir.path().join("talosconfig")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

/// The admin's Kubernetes client on node `ip`'s API server.
async fn kube(f: &Fixture, ip: &str) -> KubeClient {
    let yaml = f.sim.admin().node(ip).kubeconfig().await.unwrap();
    let config = KubeConfig::from_yaml(&yaml)
        .unwrap()
        .with_server(format!("https://{ip}:6443"));
    KubeClient::new(&config).unwrap()
}

/// `ops apply` of a certSANs change to `ip` (try window `window`).
fn apply_args<'a>(ip: &'a str, file: &'a Path, window: &'a str) -> Vec<&'a str> {
    vec![
        "--yes",
        "-n",
        ip,
        "apply",
        "-f",
        file.to_str().unwrap(),
        "--expect-change",
        "machine.certSANs",
        "--try-timeout",
        window,
    ]
}

async fn run_cli(tc: &Path, state: &Path, args: &[&str]) -> talos_test_support::cli::Run {
    let mut all = vec!["-o", "json", "ops", "--state-dir", state.to_str().unwrap()];
    all.extend_from_slice(args);
    talos_test_support::cli::run(tc, &all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_a_second_host_is_refused_and_a_lease_taken_away_stops_the_holder() {
    let f = Fixture::with_kubernetes(1).await;
    let ip = f.sim.ip(1);
    let node = f.sim.cluster.node("cp-1").unwrap();
    let file = f.config_with("sans.yaml", &[("certSANs: []", "certSANs: [vip.example]")]);

    // The first host plans (and so holds the lock through its
    // confirmation and run) as a library user does.
    let mut ops = f.open_ops();
    ops.set_cluster_lock_policy(ClusterLockPolicy::Required);
    let mut options = talos_client::ops::ApplyOptions::new(vec![ip.clone()], file.clone());
    options.expect_change = vec!["machine.certSANs".into()];
    options.try_timeout = Duration::from_secs(15);
    let plan = ops.plan(&OpSpec::Apply(options)).await.unwrap();
    let Some(ClusterLockRecord::Held {
        holder,
        transitions,
        ..
    }) = plan.cluster_lock().cloned()
    else {
        panic!("no lease held: {:?}", plan.cluster_lock())
    };
    assert!(
        holder.starts_with(&format!("{}@", plan.id))
            && holder.ends_with(&f.state.path().display().to_string()),
        "{holder}"
    );

    // The second host, with its own state directory and talosconfig, is
    // refused before anything is sent, and told who holds the cluster.
    let other = OtherHost::new(&f);
    let refused = run_cli(
        &other.talosconfig(),
        &other.state(),
        &apply_args(&ip, &file, "15s"),
    )
    .await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("another operation holds this cluster")
            && refused.stderr.contains(&holder),
        "{}",
        refused.stderr
    );
    assert!(!node.active_config().contains("vip.example"));

    // Mid-operation, while the gate runs, the lease is taken away (forced:
    // another holder written through the Kubernetes API).
    let (gate_tx, mut gate_rx) = tokio::sync::mpsc::unbounded_channel();
    let run = tokio::spawn(async move {
        let mut observe = move |event: Event<'_>| {
            if let Event::StepStarted { name: "gate", .. } = event {
                let _ = gate_tx.send(());
            }
        };
        let result = ops.run(plan, &mut observe).await;
        (result, ops)
    });
    gate_rx.recv().await.expect("the gate starts");
    let k = kube(&f, &ip).await;
    // The holder renews meanwhile: a write at a stale version is tried
    // again.
    let mut forced = false;
    for _ in 0..10 {
        let mut lease = k.get(LEASE).await.unwrap();
        assert_eq!(lease["spec"]["holderIdentity"], holder.as_str());
        lease["spec"]["holderIdentity"] = "intruder@elsewhere:/state".into();
        lease["spec"]["leaseTransitions"] = (transitions + 1).into();
        match k.put(LEASE, &lease).await {
            Ok(_) => {
                forced = true;
                break;
            }
            Err(e) if e.status() == Some(409) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(forced, "the lease could not be written");

    let (result, ops) = run.await.unwrap();
    let error = result.unwrap_err();
    let OpsError::NeedsAttention { step, reason } = &error else {
        panic!("{error}")
    };
    assert_eq!(step, &format!("confirm {ip}"));
    assert!(
        reason.contains("intruder@elsewhere:/state") && reason.contains("nothing was sent"),
        "{reason}"
    );
    // The confirmation was never sent: the trial still waits for its
    // rollback, and the journal shows the try fenced with our lease.
    assert!(node.rollback_pending(), "the confirmation was sent");
    let record = ops.list().unwrap().remove(0);
    let fence = record.steps[0].fence.as_ref().expect("the try was fenced");
    assert_eq!(
        (fence.holder.as_str(), fence.transitions),
        (holder.as_str(), transitions)
    );
    assert_eq!(record.steps[2].state, talos_client::ops::StepState::Failed);
}

#[tokio::test]
async fn kubernetes_a_crashed_holder_keeps_others_out_and_its_resume_takes_the_lease_again() {
    let f = Fixture::with_kubernetes(1).await;
    let ip = f.sim.ip(1);
    let node = f.sim.cluster.node("cp-1").unwrap();
    let file = f.config_with("sans.yaml", &[("certSANs: []", "certSANs: [vip.example]")]);

    let crash_at = format!("answered:try {ip}");
    let crashed = f
        .ops_locked(
            &f.talosconfig(),
            &apply_args(&ip, &file, "60s"),
            Some(&crash_at),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    let op = ops_fixture::newest(&f).await;
    let id = op["id"].as_str().unwrap().to_string();
    let holder = op["cluster_lock"]["holder"].as_str().unwrap().to_string();
    assert!(holder.starts_with(&format!("{id}@")), "{op}");

    // Its lease lives on until it expires: another host is refused.
    let other = OtherHost::new(&f);
    let refused = run_cli(
        &other.talosconfig(),
        &other.state(),
        &apply_args(&ip, &file, "15s"),
    )
    .await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains(&holder), "{}", refused.stderr);

    // Nobody renews it: it expires (its renew time a lease duration old).
    let k = kube(&f, &ip).await;
    wait_for(
        "the crashed holder's lease to expire",
        Duration::from_secs(40),
        || async {
            use time::format_description::well_known::Rfc3339;
            let lease = k.get(LEASE).await.ok()?;
            assert_eq!(lease["spec"]["holderIdentity"], holder.as_str());
            let renewed =
                time::OffsetDateTime::parse(lease["spec"]["renewTime"].as_str()?, &Rfc3339).ok()?;
            let duration = lease["spec"]["leaseDurationSeconds"].as_i64()?;
            let age = time::OffsetDateTime::now_utc() - renewed;
            (age > time::Duration::seconds(duration)).then_some(())
        },
    )
    .await;

    // The resume (same host, state directory and operation) takes its
    // lease again and ends the apply.
    let resumed = f
        .ops_locked(&f.talosconfig(), &["resume", &id], None)
        .await
        .ok()
        .json();
    assert_eq!(resumed["state"], "succeeded", "{resumed}");
    assert_eq!(resumed["cluster_lock"]["holder"], holder.as_str());
    let confirm = &resumed["steps"][2];
    assert_eq!(confirm["fence"]["holder"], holder.as_str(), "{confirm}");
    assert!(node.active_config().contains("vip.example"));

    // Ended, it released the lease (client-go's release: no holder).
    let lease = wait_for("the lease released", Duration::from_secs(10), || async {
        let lease = k.get(LEASE).await.ok()?;
        (lease["spec"]["holderIdentity"].as_str() == Some("")).then_some(lease)
    })
    .await;
    assert!(lease["spec"]["leaseTransitions"].as_u64().is_some());
}
