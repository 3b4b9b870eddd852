//! ClusterService.HealthCheck as upstream runs it
//! (internal/app/machined/internal/server/v1alpha1/v1alpha1_cluster.go,
//! pkg/cluster/check/{default,etcd,service}.go).

use talos_test_support as common;

use std::time::{Duration, Instant};

use common::sim::{SimCluster, wait_for};
use futures::StreamExt as _;
use talos_client::Error;
use talos_client::client::HealthCheckRequest;
use talos_sim::TalosTiming;

/// Runs the check through `ip`; returns its progress lines and how it ended.
async fn run(
    sim: &SimCluster,
    ip: String,
    request: HealthCheckRequest,
) -> (Vec<String>, Result<(), Error>) {
    let mut stream = match sim.admin().node(ip).health_check(request).await {
        Ok(stream) => stream,
        Err(e) => return (Vec::new(), Err(e)),
    };
    let mut lines = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(line) => lines.push(line),
            Err(e) => return (lines, Err(e)),
        }
    }
    (lines, Ok(()))
}

fn wait(seconds: u64) -> HealthCheckRequest {
    HealthCheckRequest::new(Duration::from_secs(seconds))
}

async fn healthy_cluster(
    nodes: usize,
    adjust: impl FnOnce(&mut talos_sim::SimConfig),
) -> SimCluster {
    let sim = SimCluster::start_with(nodes, |cfg| {
        cfg.timing = TalosTiming::scaled_down(10);
        adjust(cfg)
    })
    .await;
    sim.wait_etcd_healthy(nodes).await;
    sim
}

#[tokio::test]
async fn a_healthy_cluster_passes_and_a_zero_wait_fails_at_once() {
    let sim = healthy_cluster(3, |_| {}).await;
    let (lines, end) = run(&sim, sim.ip(1), wait(30)).await;
    end.expect("healthy");
    let ips: Vec<String> = (1..=3).map(|i| format!("{:?}", sim.ip(i))).collect();
    assert_eq!(lines[0], format!("discovered nodes: [{}]", ips.join(" ")));
    for check in [
        "etcd to be healthy",
        "etcd members to be consistent across nodes",
        "etcd members to be control plane nodes",
        "apid to be ready",
        "all nodes memory sizes",
        "all nodes disk sizes",
        "no diagnostics",
        "kubelet to be healthy",
        "all nodes to finish boot sequence",
    ] {
        assert!(
            lines.contains(&format!("waiting for {check}: OK")),
            "{lines:?}"
        );
    }

    let started = Instant::now();
    let (_, end) = run(&sim, sim.ip(1), wait(0)).await;
    assert!(
        matches!(end, Err(Error::DeadlineExceeded(_))),
        "zero wait: {end:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_powered_off_member_stays_discovered_and_is_named() {
    let sim = healthy_cluster(3, |_| {}).await;
    sim.cluster.power_off(&sim.ip(3)).await.unwrap();
    let (lines, end) = run(&sim, sim.ip(1), wait(2)).await;
    let Err(Error::DeadlineExceeded(f)) = end else {
        panic!("expected DeadlineExceeded, got {end:?} after {lines:?}");
    };
    assert!(f.message.contains(&sim.ip(3)), "{}", f.message);
    assert!(lines[0].contains(&sim.ip(3)), "{lines:?}");
}

#[tokio::test]
async fn cluster_info_sets_the_expected_control_plane() {
    let sim = healthy_cluster(3, |_| {}).await;
    let request = wait(2).with_control_plane_nodes(vec![sim.ip(1), sim.ip(2)]);
    let (_, end) = run(&sim, sim.ip(1), request).await;
    let Err(Error::DeadlineExceeded(f)) = end else {
        panic!("expected DeadlineExceeded, got {end:?}");
    };
    assert!(
        f.message
            .contains("are not subset of control plane node ips"),
        "{}",
        f.message
    );
}

#[tokio::test]
async fn a_learner_is_not_healthy_and_a_worker_cannot_run_the_check() {
    let sim = healthy_cluster(3, |cfg| {
        cfg.workers = 1;
        cfg.timing.promote_interval = Duration::from_secs(600);
    })
    .await;
    let added = sim.cluster.add_node().await.unwrap();
    let learner = added.ip.to_string();
    let client = sim.admin().node(learner.clone());
    wait_for(
        "the learner's first health check",
        Duration::from_secs(20),
        || async {
            let services = client.service_list().await.ok()?;
            services
                .into_iter()
                .find(|s| s.id == "etcd" && !s.health.unknown)
        },
    )
    .await;
    let (_, end) = run(&sim, sim.ip(1), wait(2)).await;
    let Err(Error::DeadlineExceeded(f)) = end else {
        panic!("expected DeadlineExceeded, got {end:?}");
    };
    assert!(
        f.message
            .contains(&format!("{learner}: service is not healthy: etcd")),
        "{}",
        f.message
    );

    let worker = sim
        .cluster
        .nodes()
        .into_iter()
        .find(|n| n.worker)
        .unwrap()
        .ip
        .to_string();
    let (_, end) = run(&sim, worker, wait(2)).await;
    let Err(Error::Unimplemented(f)) = end else {
        panic!("expected Unimplemented, got {end:?}");
    };
    assert_eq!(
        f.message,
        "cluster health check is only available on control plane nodes"
    );
}

/// Without a quorum the check cannot pass, though every node's API answers
/// and every etcd runs: the etcd service's health read is linearizable
/// (services/etcd.go, HealthFunc), and so is the member list the next
/// assertion reads (EtcdMemberList). Right after the quorum goes, the
/// service's last check may still say healthy (as on Talos, until its next
/// period), and the member list is what fails, naming the node.
#[tokio::test]
async fn a_cluster_without_quorum_is_not_healthy() {
    let sim = healthy_cluster(3, |_| {}).await;
    for i in [2, 3] {
        let node = sim.cluster.node(&format!("cp-{i}")).unwrap();
        assert!(node.freeze_etcd().await, "cp-{i}'s etcd froze");
    }
    let (lines, end) = run(&sim, sim.ip(1), wait(10)).await;
    let Err(Error::DeadlineExceeded(f)) = end else {
        panic!("expected DeadlineExceeded, got {end:?} after {lines:?}");
    };
    let ip = sim.ip(1);
    assert!(
        f.message
            .contains(&format!("{ip}: service is not healthy: etcd"))
            || f.message.contains(&format!(
                "etcd members to be consistent across nodes: {ip}: context deadline exceeded"
            )),
        "{}",
        f.message
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("etcd members to be control plane nodes")),
        "{lines:?}"
    );
    for i in [2, 3] {
        sim.cluster
            .node(&format!("cp-{i}"))
            .unwrap()
            .thaw_etcd()
            .await;
    }
}

/// After apid, the check waits for the kubelet service to be healthy on the
/// control plane (pkg/cluster/check/default.go, PreBootSequenceChecks;
/// service.go, ServiceHealthAssertion): a kubelet whose first health check
/// has not run yet is not healthy, and the node is named.
#[tokio::test]
async fn a_kubelet_not_checked_yet_is_not_healthy() {
    let sim = healthy_cluster(2, |cfg| {
        cfg.timing.kubelet_health_initial_delay = Duration::from_secs(3600);
    })
    .await;
    let (lines, end) = run(&sim, sim.ip(1), wait(3)).await;
    let Err(Error::DeadlineExceeded(f)) = end else {
        panic!("expected DeadlineExceeded, got {end:?} after {lines:?}");
    };
    assert!(
        lines.contains(&"waiting for apid to be ready: OK".to_string()),
        "{lines:?}"
    );
    for i in [1, 2] {
        assert!(
            f.message
                .contains(&format!("{}: service is not healthy: kubelet", sim.ip(i))),
            "{}",
            f.message
        );
    }
}
