//! One lock per cluster that every admin host sees: the Lease
//! `kube-system/talos-client-operation` in the cluster's own Kubernetes,
//! taken and renewed as client-go's leader election does
//! ([`crate::kube::HeldLease`]). Its holder is the operation on a host and
//! state directory (`OPID@HOST:STATE_DIR`). An operation that may change
//! the cluster takes it from its plan to its end; before each destructive
//! step the engine confirms it is still held with the transition count it
//! was taken at (fencing), and records that with the step.
//!
//! Kubernetes is reached with the admin kubeconfig a control-plane node
//! serves through the Talos API, at the kubeconfig's server and at each
//! endpoint's API server in turn. Where it cannot be reached (quorum lost,
//! a restore, a cluster without Kubernetes), an operation goes on only when
//! told to ([`ClusterLockPolicy::AllowWithout`]), and its record says so.
//! The state directory's own lock ([`super::ClusterLock`]) still guards
//! the host.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Ops, OpsError, Refusal};
use crate::kube::{ElectionError, ElectionOptions, HeldLease, KubeClient, KubeConfig};

/// The Lease's namespace.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// The Lease's name.
pub const LEASE_NAME: &str = "talos-client-operation";
/// How long each request about the Lease may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether [`Ops::plan`] and [`Ops::resume`] take the cluster lock for an
/// operation that may change the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClusterLockPolicy {
    /// Take it; refuse where Kubernetes cannot be reached.
    #[default]
    Required,
    /// Take it where Kubernetes can be reached, else go on with the state
    /// directory's lock alone, journaled (`--without-cluster-lock`).
    AllowWithout,
    /// Do not take it: a plan only shown, never run; a run of such a plan
    /// takes it first. ([`Ops::preview`](super::Ops::preview) takes no
    /// lock at all, whatever the policy.)
    PlanOnly,
}

/// How an operation held the cluster lock, as journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum ClusterLockRecord {
    /// Held in the Lease.
    Held {
        /// `namespace/name`.
        lease: String,
        /// Its holder identity (`OPID@HOST:STATE_DIR`).
        holder: String,
        /// The Lease's transition count when it was taken.
        transitions: u64,
    },
    /// Run without one, as told, and why Kubernetes could not hold it.
    Without {
        /// Why the Lease could not be taken.
        reason: String,
    },
}

impl std::fmt::Display for ClusterLockRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterLockRecord::Held {
                lease,
                holder,
                transitions,
            } => write!(
                f,
                "Lease {lease} held by {holder} (transition {transitions})"
            ),
            ClusterLockRecord::Without { reason } => {
                write!(f, "none (--without-cluster-lock: {reason})")
            }
        }
    }
}

/// What a fencing check saw before a destructive step, as journaled with
/// the step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Fence {
    /// The holder the Lease named (this operation).
    pub holder: String,
    /// Its transition count (the one the lock was taken at).
    pub transitions: u64,
    /// The renew time written by the check.
    pub renewed: String,
}

/// The cluster lock as a plan or a run holds it.
#[derive(Debug, Clone)]
pub(crate) struct ClusterLockHold {
    pub record: ClusterLockRecord,
    pub lease: Option<Arc<HeldLease>>,
}

/// Why the lock was not taken.
enum Untaken {
    /// Another holder has it.
    Held(String),
    /// Kubernetes cannot be reached.
    Unreachable(String),
}

/// `OPID@HOST:STATE_DIR`.
fn identity(op_id: &str, state_dir: &std::path::Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_owned());
    format!("{op_id}@{host}:{}", dir.display())
}

impl Ops {
    /// Takes the cluster lock for operation `op_id` as the policy says:
    /// `None` when not taken (a plan only shown).
    pub(crate) async fn take_cluster_lock(
        &self,
        op_id: &str,
    ) -> Result<Option<ClusterLockHold>, OpsError> {
        if self.cluster_lock_policy == ClusterLockPolicy::PlanOnly {
            return Ok(None);
        }
        match self.acquire_lease(op_id).await {
            Ok(lease) => Ok(Some(ClusterLockHold {
                record: ClusterLockRecord::Held {
                    lease: lease.lease(),
                    holder: lease.holder().to_string(),
                    transitions: lease.transitions(),
                },
                lease: Some(Arc::new(lease)),
            })),
            Err(Untaken::Held(holder)) => Err(OpsError::Busy { holder }),
            Err(Untaken::Unreachable(reason))
                if self.cluster_lock_policy == ClusterLockPolicy::AllowWithout =>
            {
                Ok(Some(ClusterLockHold {
                    record: ClusterLockRecord::Without { reason },
                    lease: None,
                }))
            }
            Err(Untaken::Unreachable(reason)) => {
                Err(Refusal::ClusterLockUnavailable { reason }.into())
            }
        }
    }

    async fn acquire_lease(&self, op_id: &str) -> Result<HeldLease, Untaken> {
        let clients = self.lease_clients().await.map_err(Untaken::Unreachable)?;
        let options = ElectionOptions::new(
            LEASE_NAMESPACE,
            LEASE_NAME,
            identity(op_id, &self.state_dir),
        );
        HeldLease::acquire(clients, options)
            .await
            .map_err(|e| match e {
                ElectionError::Held { holder, renewed, .. } => Untaken::Held(format!(
                    "{holder} (the cluster lock, Lease {LEASE_NAMESPACE}/{LEASE_NAME}, renewed {renewed})"
                )),
                other => Untaken::Unreachable(other.to_string()),
            })
    }

    /// A client per API server: the served kubeconfig's server, then each
    /// endpoint's port 6443.
    pub(super) async fn lease_clients(&self) -> Result<Vec<KubeClient>, String> {
        let hosts = self.endpoint_hosts();
        let mut yaml = self.client.kubeconfig().await.map_err(|e| e.to_string());
        for host in &hosts {
            if yaml.is_ok() {
                break;
            }
            if let Ok(found) = self.client.node(host.as_str()).kubeconfig().await {
                yaml = Ok(found);
            }
        }
        let yaml = yaml.map_err(|e| format!("no control-plane node serves a kubeconfig ({e})"))?;
        let config = KubeConfig::from_yaml(&yaml).map_err(|e| e.to_string())?;
        let mut servers = vec![config.server().to_string()];
        for host in hosts {
            let url = match host.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V6(ip)) => format!("https://[{ip}]:6443"),
                _ => format!("https://{host}:6443"),
            };
            if !servers.contains(&url) {
                servers.push(url);
            }
        }
        let clients: Vec<KubeClient> = servers
            .into_iter()
            .filter_map(|server| KubeClient::new(&config.clone().with_server(server)).ok())
            .map(|c| c.with_timeout(REQUEST_TIMEOUT))
            .collect();
        if clients.is_empty() {
            return Err("the served kubeconfig names no usable API server".into());
        }
        Ok(clients)
    }

    /// The fencing check right before a send of destructive step `index`
    /// of operation `id` (made by [`Ops::guard_destructive`] once the
    /// step's check held): the Lease must still name this operation with
    /// the transition count it was taken at (it is renewed on the spot);
    /// journaled with the step. Without a lease (none needed, or run
    /// without one) it passes.
    pub(crate) async fn fence(&self, id: &str, index: usize, label: &str) -> Result<(), OpsError> {
        let Some(lease) = self.cluster_lease.as_ref() else {
            return Ok(());
        };
        match lease.confirm().await {
            Ok(confirmed) => {
                let fence = Fence {
                    holder: confirmed.holder,
                    transitions: confirmed.transitions,
                    renewed: confirmed.renewed,
                };
                self.journal.step_fenced(id, index, &fence)
            }
            Err(e) => Err(OpsError::NeedsAttention {
                step: label.to_string(),
                reason: format!(
                    "the cluster lock is no longer this operation's: {e}; stopped before this step, nothing was sent"
                ),
            }),
        }
    }

    /// Lets the run's cluster lock go (released as client-go releases a
    /// lease, when it is still ours).
    pub(crate) async fn release_cluster_lock(&mut self) {
        if let Some(lease) = self.cluster_lease.take() {
            lease.release().await;
        }
    }
}
