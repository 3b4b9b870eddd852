//! The control socket of a running simulator (`DIR/control.sock`, mode
//! 0600): one JSON [`Request`] per line in, one JSON [`Reply`] per line out.
//! The binary's `add-node` and `fill` commands, and tests, use [`send`].

use std::path::Path;
use std::sync::Weak;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};

use crate::SimError;
use crate::shared::{NodeInfo, Shared};
use crate::upgrade_state::UpgradeFault;

/// What a client asks of a running simulator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "kebab-case")]
pub enum Request {
    /// Add a control-plane node (an etcd learner, promoted once caught up).
    AddNode,
    /// Add a node in maintenance mode (no configuration).
    AddMaintenanceNode,
    /// List the nodes.
    Nodes,
    /// Write `count` keys of `value_size` bytes under `/talos-sim/fill/`.
    Fill {
        /// How many keys.
        count: usize,
        /// Bytes per value.
        value_size: usize,
    },
    /// Delete the keys under `/talos-sim/fill/` and compact etcd's
    /// history: the members keep the space until defragmented.
    Clear,
    /// Make the next snapshot from `node` end early (status OK) after
    /// `after_bytes`, as Talos does when reading etcd fails part-way.
    FailNextSnapshot {
        /// The node's name.
        node: String,
        /// Bytes sent before the fault.
        after_bytes: u64,
    },
    /// Freeze the node's etcd (SIGSTOP): its API answers, its etcd hangs.
    FreezeEtcd {
        /// The node's name or address.
        node: String,
    },
    /// Thaw an etcd frozen by [`Request::FreezeEtcd`].
    ThawEtcd {
        /// The node's name or address.
        node: String,
    },
    /// Cut the node's API off the network while it keeps running (see
    /// [`crate::cluster::Cluster::partition`]).
    Partition {
        /// The node's name or address.
        node: String,
    },
    /// End a [`Request::Partition`].
    Heal {
        /// The node's name or address.
        node: String,
    },
    /// Power the node off as a pulled plug would: its API and its etcd stop
    /// at once, and nothing answers until the simulator restarts.
    PowerOff {
        /// The node's name or address.
        node: String,
    },
    /// Make the node's next EtcdLeaveCluster remove its member only after
    /// `millis`, even when the caller has given up by then.
    DelayLeave {
        /// The node's name or address.
        node: String,
        /// The delay, in milliseconds.
        millis: u64,
    },
    /// Make the node's next upgrade go wrong at its boot: it boots the old
    /// partition (back on its old version), or never comes back.
    FailNextUpgrade {
        /// The node's name or address.
        node: String,
        /// What goes wrong.
        fault: UpgradeFault,
    },
    /// The calls the nodes answered or refused, with the roles each was
    /// judged by ([`crate::Cluster::calls`]).
    Calls,
}

impl Request {
    /// The fault this request injects and the node it hits, if it is one
    /// (the ledger records it, and what it causes).
    pub fn fault(&self) -> Option<(&'static str, &str)> {
        Some(match self {
            Request::FailNextSnapshot { node, .. } => ("fail-next-snapshot", node),
            Request::FreezeEtcd { node } => ("freeze-etcd", node),
            Request::ThawEtcd { node } => ("thaw-etcd", node),
            Request::Partition { node } => ("partition", node),
            Request::Heal { node } => ("heal", node),
            Request::PowerOff { node } => ("power-off", node),
            Request::DelayLeave { node, .. } => ("delay-leave", node),
            Request::FailNextUpgrade { node, .. } => ("fail-next-upgrade", node),
            _ => return None,
        })
    }
}

/// The simulator's answer to one [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub enum Reply {
    /// The node that was added.
    Added {
        /// The new node.
        node: NodeInfo,
    },
    /// Every node.
    Nodes {
        /// The nodes, in order.
        nodes: Vec<NodeInfo>,
    },
    /// The keys were written.
    Filled,
    /// Keys were deleted and the history compacted.
    Cleared {
        /// How many keys.
        deleted: i64,
    },
    /// The fault is armed.
    Armed,
    /// The calls, oldest first.
    Calls {
        /// Each call.
        calls: Vec<crate::CallRecord>,
    },
    /// The request failed or was not understood.
    Error {
        /// Why.
        message: String,
    },
}

/// Answers requests on `listener` until the cluster behind `shared` is gone.
pub(crate) fn serve(listener: UnixListener, shared: Weak<Shared>) {
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            tokio::spawn(answer(stream, shared));
        }
    });
}

async fn answer(stream: UnixStream, shared: std::sync::Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    let mut lines = tokio::io::BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(request) => match request.fault() {
                Some((fault, node)) => {
                    shared.ledger.note_fault(fault, Some(node));
                    let cause = crate::ledger::Cause::fault(fault);
                    crate::ledger::with_cause(cause, carry_out(&shared, request)).await
                }
                None => carry_out(&shared, request).await,
            },
            Err(e) => Reply::Error {
                message: format!("not a request ({e}): {line}"),
            },
        };
        let mut text = serde_json::to_string(&reply).expect("replies serialize");
        text.push('\n');
        if write.write_all(text.as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn carry_out(shared: &std::sync::Arc<Shared>, request: Request) -> Reply {
    let failed = |e: SimError| Reply::Error {
        message: e.to_string(),
    };
    match request {
        Request::AddNode => match crate::supervisor::add_node(shared, false).await {
            Ok(node) => Reply::Added { node },
            Err(e) => failed(e),
        },
        Request::AddMaintenanceNode => match crate::supervisor::add_node(shared, true).await {
            Ok(node) => Reply::Added { node },
            Err(e) => failed(e),
        },
        Request::Nodes => Reply::Nodes {
            nodes: shared.node_infos(),
        },
        Request::Calls => Reply::Calls {
            calls: shared.calls.calls(),
        },
        Request::FailNextSnapshot { node, after_bytes } => match shared.find(&node) {
            Some(n) => {
                n.fail_next_snapshot_after(after_bytes);
                Reply::Armed
            }
            None => Reply::Error {
                message: format!("no node {node:?}"),
            },
        },
        Request::FreezeEtcd { node } => freeze(shared, &node, true).await,
        Request::ThawEtcd { node } => freeze(shared, &node, false).await,
        Request::Partition { node } => partition(shared, &node, true).await,
        Request::Heal { node } => partition(shared, &node, false).await,
        Request::PowerOff { node } => match shared.find(&node) {
            Some(n) => {
                crate::lifecycle::power_off(&n).await;
                Reply::Armed
            }
            None => Reply::Error {
                message: format!("no node {node:?}"),
            },
        },
        Request::DelayLeave { node, millis } => match shared.find(&node) {
            Some(n) => {
                n.delay_next_leave(Duration::from_millis(millis));
                Reply::Armed
            }
            None => Reply::Error {
                message: format!("no node {node:?}"),
            },
        },
        Request::FailNextUpgrade { node, fault } => match shared.find(&node) {
            Some(n) => {
                n.fail_next_upgrade(fault);
                Reply::Armed
            }
            None => Reply::Error {
                message: format!("no node {node:?}"),
            },
        },
        Request::Clear => match shared.clear("/talos-sim/fill/").await {
            Ok(deleted) => Reply::Cleared { deleted },
            Err(e) => failed(e),
        },
        Request::Fill { count, value_size } => {
            match shared.fill("/talos-sim/fill/", count, value_size).await {
                Ok(()) => Reply::Filled,
                Err(e) => failed(e),
            }
        }
    }
}

async fn freeze(shared: &std::sync::Arc<Shared>, node: &str, frozen: bool) -> Reply {
    let Some(n) = shared.find(node) else {
        return Reply::Error {
            message: format!("no node {node:?}"),
        };
    };
    let done = if frozen {
        n.freeze_etcd().await
    } else {
        n.thaw_etcd().await
    };
    if done {
        Reply::Armed
    } else {
        Reply::Error {
            message: format!("{node}: etcd does not run"),
        }
    }
}

async fn partition(shared: &std::sync::Arc<Shared>, node: &str, cut: bool) -> Reply {
    let Some(n) = shared.find(node) else {
        return Reply::Error {
            message: format!("no node {node:?}"),
        };
    };
    let done = if cut {
        crate::lifecycle::partition(&n).await
    } else {
        crate::supervisor::heal(shared, &n).await
    };
    match done {
        Ok(true) => Reply::Armed,
        Ok(false) if cut => Reply::Error {
            message: format!("{node}: not up, or already partitioned"),
        },
        Ok(false) => Reply::Error {
            message: format!("{node}: not partitioned"),
        },
        Err(e) => Reply::Error {
            message: e.to_string(),
        },
    }
}

/// Sends `request` to the simulator running in `dir` and returns its reply;
/// a [`Reply::Error`] becomes [`SimError::Refused`].
pub async fn send(dir: &Path, request: &Request) -> Result<Reply, SimError> {
    let socket = dir.join("control.sock");
    let not_running = |e: std::io::Error| SimError::Control {
        socket: socket.clone(),
        reason: format!("no talos-sim running in {} ({e})", dir.display()),
    };
    let stream = UnixStream::connect(&socket).await.map_err(not_running)?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(request).expect("requests serialize");
    line.push('\n');
    write
        .write_all(line.as_bytes())
        .await
        .map_err(not_running)?;
    let mut lines = tokio::io::BufReader::new(read).lines();
    let broken = |reason: String| SimError::Control {
        socket: socket.clone(),
        reason,
    };
    // Filling a large database can take long; a reply always comes.
    let reply = tokio::time::timeout(Duration::from_secs(3600), lines.next_line())
        .await
        .map_err(|_| broken("no reply within an hour".into()))?
        .map_err(|e| broken(e.to_string()))?
        .ok_or_else(|| broken("the simulator closed the connection".into()))?;
    match serde_json::from_str(&reply).map_err(|e| broken(format!("bad reply ({e}): {reply}")))? {
        Reply::Error { message } => Err(SimError::Refused(message)),
        other => Ok(other),
    }
}
