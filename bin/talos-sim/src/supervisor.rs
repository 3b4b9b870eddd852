//! Each node's supervisor: it starts the node's API, and runs the power
//! actions the API's handlers queue on the node ([`Action`]) through the
//! lifecycle below. The handlers never call the lifecycle themselves, so
//! the layers stack: the cluster facade over the supervisors, the
//! supervisors over the API and the lifecycle, all over the shared state.

use std::sync::{Arc, Weak};

use tokio_util::sync::CancellationToken;

use crate::SimError;
use crate::lifecycle;
use crate::machined::Machined;
use crate::node::{ACTION_DELAY, Action, Node, Power};
use crate::serve::{serve_http2, tls_incoming};
use crate::shared::{NodeInfo, NodeKind, Shared};

/// Runs `node`'s queue until the cluster stops: each action after
/// [`ACTION_DELAY`], each in a task of its own, so that an action which
/// meets a running sequence is refused by the sequencer's lock as upstream
/// refuses it, instead of waiting behind it.
pub(crate) fn supervise(shared: &Arc<Shared>, node: &Arc<Node>) {
    let Some(mut queue) = node.take_queue() else {
        return;
    };
    let (weak, node, stop) = (Arc::downgrade(shared), node.clone(), shared.stop.clone());
    tokio::spawn(async move {
        loop {
            let (action, cause) = tokio::select! {
                () = stop.cancelled() => return,
                action = queue.recv() => match action {
                    Some(action) => action,
                    None => return,
                },
            };
            // The action's events carry the cause it was queued under.
            tokio::spawn(crate::ledger::with_cause(
                cause,
                run(weak.clone(), node.clone(), action),
            ));
        }
    });
}

async fn run(shared: Weak<Shared>, node: Arc<Node>, action: Action) {
    tokio::time::sleep(ACTION_DELAY).await;
    let Some(shared) = shared.upgrade() else {
        return;
    };
    tracing::debug!(node = %node.name, ?action, "power action");
    match action {
        Action::Reboot { actor } => {
            let Some(_sequence) = lifecycle::lock_sequence(&node, "reboot") else {
                return;
            };
            lifecycle::reboot(&shared, &node, &actor).await;
            if lifecycle::switch_partition(&node) {
                boot(&shared, &node).await;
            }
        }
        Action::Upgrade {
            target,
            stage,
            actor,
        } => {
            let name = if stage { "stageUpgrade" } else { "upgrade" };
            let Some(_sequence) = lifecycle::lock_sequence(&node, name) else {
                return;
            };
            lifecycle::upgrade(&shared, &node, target, stage, &actor).await;
            if lifecycle::switch_partition(&node) {
                boot(&shared, &node).await;
            }
        }
        Action::Reset {
            graceful,
            reboot,
            labels,
            by_spec,
            actor,
        } => {
            let Some(_sequence) = lifecycle::lock_sequence(&node, "reset") else {
                return;
            };
            let boots =
                lifecycle::reset(&shared, &node, graceful, reboot, &labels, by_spec, &actor).await;
            if boots {
                boot(&shared, &node).await;
            }
        }
        Action::PowerOff => lifecycle::power_off_as(&node, crate::ledger::Down::Shutdown).await,
        Action::BootConfigured => {
            node.set_front(None);
            boot(&shared, &node).await;
        }
    }
}

/// Brings a node up: etcd (from its data, or joining), then its API.
async fn boot(shared: &Arc<Shared>, node: &Arc<Node>) {
    lifecycle::boot_begin(shared, node).await;
    if let Err(e) = start_front(shared, node).await {
        tracing::warn!(node = %node.name, error = %e, "node API did not start after boot");
    }
    lifecycle::boot_end(node);
    crate::kube_apiserver::reconcile(node);
    crate::kubeprism::reconcile(node);
}

/// Starts a node created with the cluster (etcd already running, or none):
/// its supervisor and its API, with the events of the boot it just had.
pub(crate) async fn start(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<(), SimError> {
    supervise(shared, node);
    start_front(shared, node).await?;
    lifecycle::record_boot(node);
    crate::kube_apiserver::reconcile(node);
    crate::kubeprism::attach(shared, node);
    crate::kubeprism::reconcile(node);
    Ok(())
}

/// One more node: a configured control-plane node that joins etcd as
/// a learner, or (`maintenance`) a node without configuration whose
/// API waits for one.
pub(crate) async fn add_node(
    shared: &Arc<Shared>,
    maintenance: bool,
) -> Result<NodeInfo, SimError> {
    let _one_at_a_time = shared.add_lock.lock().await;
    let index = shared.nodes().len() + 1;
    let kind = if maintenance {
        NodeKind::Maintenance
    } else {
        NodeKind::ControlPlane
    };
    let node = Arc::new(shared.create_node(index, kind)?);
    shared.nodes.write().expect("nodes lock").push(node.clone());
    if !maintenance {
        lifecycle::join_etcd(shared, &node, false).await?;
    }
    start(shared, &node).await?;
    Ok(NodeInfo::of(&node))
}

/// Serves the node's API on its address until its power goes off.
/// A partitioned node comes up silent; [`heal`] starts its API.
async fn start_front(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<(), SimError> {
    if node.is_partitioned() {
        node.set_power(Power::On);
        return Ok(());
    }
    let addr = node.api_addr();
    let listener = lifecycle::bind_with_retry(&addr).await?;
    let token = CancellationToken::new();
    node.set_front(Some((token.clone(), node.is_configured())));
    let machined = Machined {
        node: node.clone(),
        shared: shared.clone(),
    };
    let fronts = crate::front::services(machined.clone());
    let incoming = tls_incoming(listener, node.api_tls(), token.clone());
    let routes = tonic::service::Routes::new(fronts.machine)
        .add_service(fronts.cluster)
        .add_service(fronts.image)
        .add_service(fronts.lifecycle)
        .add_service(fronts.storage)
        .add_service(fronts.time)
        .add_service(fronts.inspect)
        .add_service(fronts.debug)
        .add_service(crate::cosi::front(machined));
    tokio::spawn(serve_http2(incoming, routes, token));
    node.set_power(Power::On);
    Ok(())
}

/// Ends a partition (`lifecycle::partition`): the silent listener goes and
/// the API serves again. False when the node was not partitioned.
pub(crate) async fn heal(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<bool, SimError> {
    if !node.is_partitioned() {
        return Ok(false);
    }
    node.set_blackhole(None);
    start_front(shared, node).await?;
    Ok(true)
}

/// Another machine at a powered-off node's address: its volumes wiped (a
/// new node identity), the cluster's control-plane configuration on
/// STATE, booted; its etcd joins as a new member under the node's name
/// (the member the old machine left behind, if any, removed first, as
/// upstream's join does). Refused while the node is on.
pub(crate) async fn boot_fresh(shared: &Arc<Shared>, node: &Arc<Node>) -> Result<(), SimError> {
    if node.power() != Power::Off {
        return Err(SimError::Refused(format!(
            "{}: still on; only a powered-off node's address can take a new machine",
            node.name
        )));
    }
    for label in crate::node::system_volumes(node.talos_version()) {
        node.wipe(label)
            .map_err(|e| SimError::io(&node.volume(label), e))?;
    }
    node.set_worker(false);
    node.persist_config(&shared.machine_config)
        .map_err(|e| SimError::io(&node.config_path(), e))?;
    *node.config.lock().expect("config lock") = Default::default();
    node.config.lock().expect("config lock").active = shared.machine_config.clone();
    boot(shared, node).await;
    Ok(())
}
