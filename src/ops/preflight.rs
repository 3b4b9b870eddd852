//! Checks of a later step's parameters against the node itself, made in the
//! preflight so that nothing destructive runs before a parameter that would
//! fail is found.

use super::{Ops, OpsError, Refusal};

impl Ops {
    /// Refuses unless every label in `wipe` names a volume that `address`
    /// reports (COSI VolumeStatus) with a location: upstream's Reset looks
    /// each label up as a VolumeStatus and fails on a missing or unlocated
    /// one (v1alpha1_server.go), which after a leave would leave the node
    /// out of etcd but still serving.
    pub(super) async fn check_wipe_labels(
        &self,
        address: &str,
        wipe: &[String],
    ) -> Result<(), OpsError> {
        let volumes = self
            .client
            .node(address)
            .resources()
            .volume_statuses()
            .await
            .map_err(|e| Refusal::VolumesUnknown {
                node: address.to_string(),
                error: e.to_string(),
            })?;
        let located: Vec<String> = volumes
            .into_iter()
            .filter(|v| !v.location.is_empty())
            .map(|v| v.id)
            .collect();
        match wipe.iter().find(|l| !located.contains(l)) {
            Some(label) => Err(Refusal::UnknownWipeLabel {
                node: address.to_string(),
                label: label.clone(),
                volumes: located,
            }
            .into()),
            None => Ok(()),
        }
    }
}
