//! Node facts: version, hostname, services, and the cluster health check.

use futures::{Stream, StreamExt as _};
use time::OffsetDateTime;

use super::reply::metadata_error;
use super::{Client, Error, Idempotency, One, Result, Scope, cluster_stub, machine_stub};
use crate::api::{cluster, machine};

/// Talos version and platform of a node.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct VersionInfo {
    /// Release tag, e.g. `v1.13.9`.
    pub tag: String,
    /// Git commit.
    pub sha: String,
    /// Build time.
    pub built: String,
    /// Go toolchain version.
    pub go_version: String,
    /// Operating system.
    pub os: String,
    /// CPU architecture.
    pub arch: String,
    /// Platform name (metal, aws, ...), if reported.
    pub platform: Option<String>,
    /// Platform mode (metal, cloud, container), if reported.
    pub platform_mode: Option<String>,
    /// Whether the node enforces role-based access.
    pub rbac: bool,
}

/// Health of a service.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct ServiceHealth {
    /// True while health is not known yet.
    pub unknown: bool,
    /// Whether the last check passed.
    pub healthy: bool,
    /// Message of the last check.
    pub last_message: String,
    /// When health last changed.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_change: Option<OffsetDateTime>,
}

/// One state change of a service.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ServiceEvent {
    /// What happened.
    pub msg: String,
    /// The state entered.
    pub state: String,
    /// When.
    #[serde(with = "time::serde::rfc3339::option")]
    pub ts: Option<OffsetDateTime>,
}

/// A system service on a node (etcd, apid, kubelet, ...).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ServiceInfo {
    /// Service id.
    pub id: String,
    /// Current state (Running, Finished, ...).
    pub state: String,
    /// Health.
    pub health: ServiceHealth,
    /// Recent events, oldest first.
    pub events: Vec<ServiceEvent>,
}

/// The services Talos runs with a health check of its own
/// (internal/app/machined/pkg/system/services: each has a HealthFunc). Their
/// health is unknown only until the first check after a (re)start.
const HEALTH_CHECKED: [&str; 8] = [
    "apid",
    "containerd",
    "cri",
    "etcd",
    "kubelet",
    "machined",
    "trustd",
    "udevd",
];

impl ServiceInfo {
    /// Whether the service is up as machined counts it
    /// (internal/app/machined/pkg/system/service_runner.go, the "up" state
    /// event): finished or skipped, or running and, when Talos checks its
    /// health, healthy. A health-checked service whose health is still
    /// unknown (just restarted, such as the kubelet after a kubelet change)
    /// is not up; another service (an extension) with unknown health is.
    pub fn is_up(&self) -> bool {
        self.problem().is_none()
    }

    /// Why the service is not up, as "ID (STATE...)"; `None` when it is.
    pub fn problem(&self) -> Option<String> {
        let (id, state) = (&self.id, &self.state);
        match state.as_str() {
            "Finished" | "Skipped" => return None,
            "Running" => {}
            _ => return Some(format!("{id} ({state})")),
        }
        let h = &self.health;
        if h.unknown {
            return HEALTH_CHECKED
                .contains(&id.as_str())
                .then(|| format!("{id} ({state}, health not known yet)"));
        }
        match (h.healthy, h.last_message.is_empty()) {
            (true, _) => None,
            (false, true) => Some(format!("{id} ({state}, unhealthy)")),
            (false, false) => Some(format!("{id} ({state}, unhealthy: {})", h.last_message)),
        }
    }
}

fn timestamp(ts: Option<prost_types::Timestamp>) -> Option<OffsetDateTime> {
    let ts = ts?;
    let nanos = i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos);
    OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

impl From<machine::ServiceInfo> for ServiceInfo {
    fn from(s: machine::ServiceInfo) -> Self {
        let health = s.health.unwrap_or_default();
        ServiceInfo {
            id: s.id,
            state: s.state,
            health: ServiceHealth {
                unknown: health.unknown,
                healthy: health.healthy,
                last_message: health.last_message,
                last_change: timestamp(health.last_change),
            },
            events: s
                .events
                .unwrap_or_default()
                .events
                .into_iter()
                .map(|e| ServiceEvent {
                    msg: e.msg,
                    state: e.state,
                    ts: timestamp(e.ts),
                })
                .collect(),
        }
    }
}

impl<S: Scope> Client<S> {
    /// The node's Talos version.
    pub async fn version(&self) -> Result<S::Output<VersionInfo>> {
        self.unary(
            Idempotency::Read,
            |t| async move { machine_stub(t).version(()).await },
            |m: machine::Version| {
                let v = m.version.unwrap_or_default();
                Ok(VersionInfo {
                    tag: v.tag,
                    sha: v.sha,
                    built: v.built,
                    go_version: v.go_version,
                    os: v.os,
                    arch: v.arch,
                    platform: m.platform.as_ref().map(|p| p.name.clone()),
                    platform_mode: m.platform.map(|p| p.mode),
                    rbac: m.features.is_some_and(|f| f.rbac),
                })
            },
        )
        .await
    }

    /// The node's hostname.
    pub async fn hostname(&self) -> Result<S::Output<String>> {
        self.unary(
            Idempotency::Read,
            |t| async move { machine_stub(t).hostname(()).await },
            |m: machine::Hostname| Ok(m.hostname),
        )
        .await
    }

    /// The node's system services.
    pub async fn service_list(&self) -> Result<S::Output<Vec<ServiceInfo>>> {
        self.unary(
            Idempotency::Read,
            |t| async move { machine_stub(t).service_list(()).await },
            |m: machine::ServiceList| Ok(m.services.into_iter().map(ServiceInfo::from).collect()),
        )
        .await
    }
}

/// What the cluster health check should expect.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct HealthCheckRequest {
    /// How long the server may wait for the cluster to become healthy.
    pub wait_timeout: std::time::Duration,
    /// Expected control-plane nodes (empty: discover).
    pub control_plane_nodes: Vec<String>,
    /// Expected worker nodes (empty: discover).
    pub worker_nodes: Vec<String>,
    /// Kubernetes endpoint to use instead of the discovered one.
    pub force_endpoint: String,
}

impl HealthCheckRequest {
    /// A check the server may wait `wait_timeout` for, discovering the
    /// nodes.
    pub fn new(wait_timeout: std::time::Duration) -> Self {
        HealthCheckRequest {
            wait_timeout,
            ..HealthCheckRequest::default()
        }
    }

    /// Expects these control-plane nodes (empty: discover).
    pub fn with_control_plane_nodes(mut self, nodes: Vec<String>) -> Self {
        self.control_plane_nodes = nodes;
        self
    }

    /// Expects these worker nodes (empty: discover).
    pub fn with_worker_nodes(mut self, nodes: Vec<String>) -> Self {
        self.worker_nodes = nodes;
        self
    }

    /// Uses this Kubernetes endpoint instead of the discovered one.
    pub fn with_force_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.force_endpoint = endpoint.into();
        self
    }
}

impl Client<One> {
    /// Runs the server-side cluster health check; yields its progress lines.
    pub async fn health_check(
        &self,
        request: HealthCheckRequest,
    ) -> Result<impl Stream<Item = Result<String>> + Send + Unpin + use<>> {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let wait = prost_types::Duration::try_from(request.wait_timeout).unwrap_or_default();
        let response = cluster_stub(transport)
            .health_check(cluster::HealthCheckRequest {
                wait_timeout: Some(wait),
                cluster_info: Some(cluster::ClusterInfo {
                    control_plane_nodes: request.control_plane_nodes,
                    worker_nodes: request.worker_nodes,
                    force_endpoint: request.force_endpoint,
                }),
            })
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?;
        Ok(response.into_inner().map(move |item| match item {
            Ok(progress) => match metadata_error(progress.metadata.as_ref()) {
                Some(error) => Err(error.with_node(&node)),
                None => Ok(progress.message),
            },
            Err(status) => Err(Error::from_status(&status, Some(&node))),
        }))
    }
}

#[cfg(test)]
mod service_tests {
    use super::*;

    fn service(id: &str, state: &str, unknown: bool, healthy: bool, msg: &str) -> ServiceInfo {
        ServiceInfo {
            id: id.into(),
            state: state.into(),
            health: ServiceHealth {
                unknown,
                healthy,
                last_message: msg.into(),
                last_change: None,
            },
            events: Vec::new(),
        }
    }

    #[test]
    fn a_service_is_up_as_machined_counts_it() {
        assert!(service("etcd", "Running", false, true, "").is_up());
        assert!(service("ext-foo", "Finished", true, false, "").is_up());
        // An extension without a health check stays unknown for good.
        assert!(service("ext-iscsid", "Running", true, false, "").is_up());
        assert_eq!(
            service("kubelet", "Running", true, false, "")
                .problem()
                .as_deref(),
            Some("kubelet (Running, health not known yet)")
        );
        assert_eq!(
            service("kubelet", "Running", false, false, "connection refused")
                .problem()
                .as_deref(),
            Some("kubelet (Running, unhealthy: connection refused)")
        );
        assert_eq!(
            service("etcd", "Preparing", true, false, "")
                .problem()
                .as_deref(),
            Some("etcd (Preparing)")
        );
    }
}
