//! The labels a retire (or a migration's retire half) wipes. By default the
//! node's configuration and ephemeral data (`STATE`, `EPHEMERAL`); on a node
//! that keeps etcd's data on a volume of its own (`ETCD`, Talos 1.14:
//! constants.EtcdDataVolumeID) also that volume, or the old member's data
//! would stay behind on the disk. The node's volumes are read through COSI
//! (`VolumeStatuses`), as `talosctl get volumestatus` does.

use super::Ops;

/// The volume Talos 1.14 keeps etcd's data on.
pub(crate) const ETCD_VOLUME: &str = "ETCD";

/// The labels a retire wipes unless told otherwise: the node's
/// configuration and its ephemeral data. [`Ops::wipe_labels`] adds `ETCD`
/// where the node has it.
pub(crate) fn default_wipe() -> Vec<String> {
    vec!["STATE".to_string(), "EPHEMERAL".to_string()]
}

impl Ops {
    /// The labels to wipe on `address` when `requested` were asked for: the
    /// default wipe gains `ETCD` when the node has that volume (a wipe named
    /// otherwise is kept as given); with a note for the plan saying so, or
    /// why the volumes could not be read.
    pub(super) async fn wipe_labels(
        &self,
        address: &str,
        requested: &[String],
    ) -> (Vec<String>, Option<String>) {
        let mut wipe = requested.to_vec();
        if requested != default_wipe().as_slice() {
            return (wipe, None);
        }
        match self
            .client
            .node(address)
            .resources()
            .volume_statuses()
            .await
        {
            Ok(volumes) if volumes.iter().any(|v| v.id == ETCD_VOLUME) => {
                wipe.push(ETCD_VOLUME.to_string());
                let note = format!(
                    "{address} keeps etcd's data on its own volume {ETCD_VOLUME} (Talos 1.14): the reset wipes it too ({})",
                    requested_list(&wipe)
                );
                (wipe, Some(note))
            }
            Ok(_) => (wipe, None),
            Err(e) => (
                wipe,
                Some(format!(
                    "{address}'s volumes could not be read ({e}): the reset wipes {} only; if the node keeps etcd's data on a volume {ETCD_VOLUME}, add {ETCD_VOLUME} to the labels to wipe",
                    requested_list(requested)
                )),
            ),
        }
    }
}

fn requested_list(labels: &[String]) -> String {
    labels.join(", ")
}
