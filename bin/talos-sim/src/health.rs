//! The server-side cluster health check of the simulator, as upstream's
//! ClusterService.HealthCheck runs it
//! (internal/app/machined/internal/server/v1alpha1/v1alpha1_cluster.go and
//! pkg/cluster/check): only a control-plane node answers; `wait_timeout` is
//! the deadline of the whole check (zero fails at once); the nodes come
//! from `cluster_info` or else from discovery, which keeps a node that
//! powered off (its entry ages out, it does not vanish); the checks are
//! etcd service health, member lists compared as (hostname, id, learner),
//! member IPs within the control-plane IPs, apid readiness, memory, disks
//! and diagnostics (which a simulated node always passes), the kubelet
//! service's health on the control plane, and every node's boot sequence
//! finished (PreBootSequenceChecks in pkg/cluster/check/default.go). The
//! Kubernetes-level checks that follow upstream are not simulated.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::Status;

use super::node::{Node, Power};
use super::shared::Shared;
use crate::api::cluster::{HealthCheckProgress, HealthCheckRequest};

/// The nodes a check runs against: control plane and workers, by address.
struct ClusterInfo {
    control_plane: Vec<String>,
    workers: Vec<String>,
}

impl ClusterInfo {
    /// `cluster_info` when it names nodes; otherwise every node discovery
    /// knows of, powered off or not.
    fn build(shared: &Shared, request: &HealthCheckRequest) -> ClusterInfo {
        if let Some(info) = &request.cluster_info
            && (!info.control_plane_nodes.is_empty() || !info.worker_nodes.is_empty())
        {
            return ClusterInfo {
                control_plane: info.control_plane_nodes.clone(),
                workers: info.worker_nodes.clone(),
            };
        }
        let (mut control_plane, mut workers) = (Vec::new(), Vec::new());
        for node in shared.nodes().iter().filter(|n| n.is_configured()) {
            if node.is_worker() {
                workers.push(node.ip.to_string());
            } else {
                control_plane.push(node.ip.to_string());
            }
        }
        ClusterInfo {
            control_plane,
            workers,
        }
    }

    fn all(&self) -> Vec<String> {
        self.control_plane
            .iter()
            .chain(&self.workers)
            .cloned()
            .collect()
    }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// hashicorp/go-multierror's text.
fn multi_error(errors: &[String]) -> String {
    let points: String = errors.iter().map(|e| format!("\t* {e}\n")).collect();
    let noun = if errors.len() == 1 { "error" } else { "errors" };
    format!("{} {noun} occurred:\n{points}\n", errors.len())
}

const CHECKS: [&str; 9] = [
    "etcd to be healthy",
    "etcd members to be consistent across nodes",
    "etcd members to be control plane nodes",
    "apid to be ready",
    "all nodes memory sizes",
    "all nodes disk sizes",
    "no diagnostics",
    "kubelet to be healthy",
    "all nodes to finish boot sequence",
];

/// How often a failing check is tried again.
const RETRY: Duration = Duration::from_millis(500);

/// Streams the health checks until each passes or the deadline passes.
pub(crate) async fn health_check(
    shared: Arc<Shared>,
    request: HealthCheckRequest,
    tx: tokio::sync::mpsc::Sender<Result<HealthCheckProgress, Status>>,
) {
    let progress = |message: String| {
        Ok(HealthCheckProgress {
            metadata: None,
            message,
        })
    };
    let wait = request
        .wait_timeout
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    let deadline = Instant::now() + wait;
    let info = ClusterInfo::build(&shared, &request);
    let _ = tx
        .send(progress(format!(
            "discovered nodes: {}",
            go_quoted(&info.all())
        )))
        .await;
    for check in CHECKS {
        let mut last_line = String::new();
        loop {
            if Instant::now() >= deadline {
                let reason = if last_line.is_empty() {
                    "context deadline exceeded".to_string()
                } else {
                    last_line.trim_start_matches("waiting for ").to_string()
                };
                let _ = tx
                    .send(Err(Status::deadline_exceeded(if last_line.is_empty() {
                        format!("waiting for {check}: {reason}")
                    } else {
                        format!("waiting for {reason}")
                    })))
                    .await;
                return;
            }
            let outcome = step(&shared, check, &info).await;
            let line = match &outcome {
                Ok(()) => format!("waiting for {check}: OK"),
                Err(reason) => format!("waiting for {check}: {reason}"),
            };
            if line != last_line {
                let _ = tx.send(progress(line.clone())).await;
                last_line = line;
            }
            if outcome.is_ok() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(RETRY)).await;
        }
    }
}

/// A node's API as apid reaches it: an error naming its address when it
/// does not answer.
fn reachable(shared: &Shared, ip: &str) -> Result<Arc<Node>, String> {
    match shared.find(ip) {
        Some(node) if node.power() == Power::On => Ok(node),
        _ => Err(format!(
            "{ip}: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp {ip}:{}: connect: connection refused\"",
            shared.cfg.api_port
        )),
    }
}

async fn step(shared: &Arc<Shared>, check: &str, info: &ClusterInfo) -> Result<(), String> {
    match check {
        "etcd to be healthy" => etcd_healthy(shared, &info.control_plane).await,
        "etcd members to be consistent across nodes" => {
            members_consistent(shared, &info.control_plane).await
        }
        "etcd members to be control plane nodes" => {
            members_are_control_plane(shared, &info.control_plane).await
        }
        "all nodes memory sizes" | "all nodes disk sizes" | "no diagnostics" => Ok(()),
        "kubelet to be healthy" => kubelet_healthy(shared, &info.control_plane),
        "all nodes to finish boot sequence" => all_booted(shared, &info.all()),
        _ => {
            let errors: Vec<String> = info
                .all()
                .iter()
                .filter_map(|ip| reachable(shared, ip).err())
                .collect();
            if errors.is_empty() {
                Ok(())
            } else {
                Err(multi_error(&errors))
            }
        }
    }
}

/// pkg/cluster/check/service.go ServiceHealthAssertion for etcd.
async fn etcd_healthy(shared: &Arc<Shared>, nodes: &[String]) -> Result<(), String> {
    let mut errors = Vec::new();
    for ip in nodes {
        let node = match reachable(shared, ip) {
            Ok(node) => node,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if !node.etcd_running().await {
            let last = node.etcd_events().pop();
            let (state, msg) = last
                .map(|e| (e.state, e.message))
                .unwrap_or_else(|| ("Finished".into(), String::new()));
            errors.push(format!(
                "{ip}: service \"etcd\" not in expected state \"Running\": current state [{state}] {msg}"
            ));
        } else if !node.etcd_health.is_healthy() {
            errors.push(format!("{ip}: service is not healthy: etcd"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(multi_error(&errors))
    }
}

/// pkg/cluster/check/service.go ServiceHealthAssertion for the kubelet:
/// its health is unknown, so not healthy, until its first check after a
/// (re)start (see [`crate::kubelet`]).
fn kubelet_healthy(shared: &Shared, nodes: &[String]) -> Result<(), String> {
    let mut errors = Vec::new();
    for ip in nodes {
        match reachable(shared, ip) {
            Err(e) => errors.push(e),
            Ok(node) => {
                let checked = node
                    .kubelet
                    .state(node.timing.kubelet_health_initial_delay)
                    .is_some_and(|k| k.checked);
                if !checked {
                    errors.push(format!("{ip}: service is not healthy: kubelet"));
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(multi_error(&errors))
    }
}

/// pkg/cluster/check/events.go AllNodesBootedAssertion: every node's
/// machine stage is running; a node in maintenance mode is named under its
/// stage, and one that has not reported keeps the check waiting.
fn all_booted(shared: &Shared, nodes: &[String]) -> Result<(), String> {
    let mut maintenance = Vec::new();
    for ip in nodes {
        match shared.find(ip) {
            Some(node) if node.power() == Power::On => {
                if !node.is_configured() {
                    maintenance.push(ip.clone());
                }
            }
            _ => return Err("context deadline exceeded".into()),
        }
    }
    if maintenance.is_empty() {
        return Ok(());
    }
    maintenance.sort();
    Err(format!(
        "nodes are not running: maintenance: [{}]",
        maintenance.join(" ")
    ))
}

/// (hostname, id, learner) of every member, as one node lists them.
type MemberSet = BTreeSet<(String, u64, bool)>;

async fn member_list(
    shared: &Arc<Shared>,
    ip: &str,
) -> Result<(String, MemberSet, Vec<String>), String> {
    let node = reachable(shared, ip)?;
    let members = crate::machined_etcd::member_list(&node, shared, false)
        .await
        .map_err(|s| format!("{ip}: {}", s.message()))?;
    let ips = members
        .members
        .iter()
        .flat_map(|m| m.peer_urls.iter())
        .filter_map(|url| url.split("://").nth(1))
        .filter_map(|rest| rest.rsplit_once(':').map(|(host, _)| host.to_string()))
        .collect();
    let set = members
        .members
        .into_iter()
        .map(|m| (m.hostname, m.id, m.is_learner))
        .collect();
    Ok((node.name.clone(), set, ips))
}

/// pkg/cluster/check/etcd.go EtcdConsistentAssertion.
async fn members_consistent(shared: &Arc<Shared>, nodes: &[String]) -> Result<(), String> {
    let mut lists = Vec::new();
    for ip in nodes {
        let (hostname, set, _) = member_list(shared, ip).await?;
        lists.push((hostname, set));
    }
    lists.sort_by(|a, b| a.0.cmp(&b.0));
    let Some((_, known)) = lists.first() else {
        return Err("no messages returned".into());
    };
    for (hostname, set) in &lists[1..] {
        if set.len() != known.len() {
            let expected: Vec<&str> = known.iter().map(|m| m.0.as_str()).collect();
            let actual: Vec<&str> = set.iter().map(|m| m.0.as_str()).collect();
            return Err(format!(
                "{hostname}: expected to have [{}] members, got [{}]",
                expected.join(" "),
                actual.join(" ")
            ));
        }
        if let Some(unexpected) = set.iter().find(|m| !known.contains(m)) {
            return Err(format!(
                "{hostname}: found unexpected etcd member {}",
                unexpected.0
            ));
        }
    }
    Ok(())
}

/// pkg/cluster/check/etcd.go EtcdControlPlaneNodesAssertion.
async fn members_are_control_plane(shared: &Arc<Shared>, nodes: &[String]) -> Result<(), String> {
    let Some(first) = nodes.first() else {
        return Ok(());
    };
    let (_, _, member_ips) = member_list(shared, first).await?;
    if member_ips.iter().all(|ip| nodes.contains(ip)) {
        Ok(())
    } else {
        Err(format!(
            "etcd member ips {} are not subset of control plane node ips {}",
            go_quoted(&member_ips),
            go_quoted(nodes)
        ))
    }
}
