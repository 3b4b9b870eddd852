//! The server-side cluster health check of the simulator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::Status;

use super::cluster::Shared;
use super::node::{Node, Power};
use crate::api::cluster::HealthCheckProgress;

/// Streams the server-side health checks: every running control-plane
/// node's etcd answers, all see the same members, and the members are
/// exactly the control-plane nodes. Each check is retried until `wait`.
pub(crate) async fn health_check(
    shared: &Shared,
    wait: Duration,
    tx: tokio::sync::mpsc::Sender<Result<HealthCheckProgress, Status>>,
) {
    let progress = |message: String| {
        Ok(HealthCheckProgress {
            metadata: None,
            message,
        })
    };
    let deadline = Instant::now() + wait;
    let nodes: Vec<_> = shared
        .nodes()
        .into_iter()
        .filter(|n| n.is_control_plane() && n.power() == Power::On)
        .collect();
    let names: Vec<_> = nodes.iter().map(|n| n.name.clone()).collect();
    let _ = tx
        .send(progress(format!(
            "discovered nodes: control plane: {names:?}"
        )))
        .await;
    for check in [
        "etcd to be healthy",
        "etcd members to be consistent across nodes",
        "etcd members to be control plane nodes",
    ] {
        let _ = tx.send(progress(format!("waiting for {check}"))).await;
        loop {
            let outcome = health_step(check, &nodes).await;
            match outcome {
                Ok(()) => {
                    let _ = tx.send(progress(format!("waiting for {check}: OK"))).await;
                    break;
                }
                Err(reason) if Instant::now() >= deadline => {
                    let _ = tx
                        .send(Err(Status::deadline_exceeded(format!(
                            "waiting for {check}: {reason}"
                        ))))
                        .await;
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
}

async fn health_step(check: &str, nodes: &[Arc<Node>]) -> Result<(), String> {
    let mut lists = Vec::new();
    for node in nodes {
        let (client, url) = node
            .local_etcd_now("health")
            .await
            .map_err(|s| format!("{}: {}", node.name, s.message()))?;
        if check == "etcd to be healthy" {
            client
                .status(&url)
                .await
                .map_err(|s| format!("{}: {}", node.name, s.message()))?;
            continue;
        }
        let mut members: Vec<String> = client
            .member_list()
            .await
            .map_err(|s| format!("{}: {}", node.name, s.message()))?
            .into_iter()
            .map(|m| m.name)
            .collect();
        members.sort();
        lists.push(members);
    }
    match check {
        "etcd members to be consistent across nodes" if lists.windows(2).any(|w| w[0] != w[1]) => {
            Err(format!("member lists differ: {lists:?}"))
        }
        "etcd members to be control plane nodes" => {
            let mut expected: Vec<_> = nodes.iter().map(|n| n.name.clone()).collect();
            expected.sort();
            match lists.first() {
                Some(members) if *members != expected => Err(format!(
                    "members {members:?}, control plane nodes {expected:?}"
                )),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}
