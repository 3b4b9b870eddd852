//! Every destructive call the operations send, each behind the proof that
//! the step's check held moments ago ([`Fresh`], spent by the call). The
//! rest of `src/ops` never calls these methods of the client itself: a
//! test below reads the sources and fails if it does. The one dry run an
//! apply sends (in TRY mode, which changes nothing) lives here too, so that
//! every `apply_configuration` of the operations is in this file.

use bytes::Bytes;
use futures::Stream;

use super::fresh::Fresh;
use super::{Ops, OpsError};
use crate::client::{
    ApplyMode, ApplyRequest, ApplyResult, ImageNamespace, InstallProgress, MemberId, One,
    RebootMode, ResetRequest, UpgradeAck, UpgradeRequest,
};
use crate::maintenance::MaintenanceClient;
use crate::{Client, Error};

/// A send's own error, or the proof refused (too old).
pub(crate) enum Sent {
    /// The proof was refused: nothing was sent.
    Refused(OpsError),
    /// The call was sent and failed.
    Failed(Error),
}

impl From<Sent> for OpsError {
    fn from(sent: Sent) -> OpsError {
        match sent {
            Sent::Refused(e) => e,
            Sent::Failed(e) => e.into(),
        }
    }
}

type SendResult<T> = Result<T, Sent>;

impl Ops {
    fn proof(&self, fresh: Fresh) -> SendResult<()> {
        self.spend(fresh).map_err(Sent::Refused)
    }

    /// EtcdForfeitLeadership: the member it moved the leadership to, if it
    /// led.
    pub(super) async fn send_forfeit(
        &self,
        fresh: Fresh,
        node: &Client<One>,
    ) -> SendResult<Option<String>> {
        self.proof(fresh)?;
        node.etcd_forfeit_leadership().await.map_err(Sent::Failed)
    }

    /// EtcdLeaveCluster.
    pub(super) async fn send_leave(&self, fresh: Fresh, node: &Client<One>) -> SendResult<()> {
        self.proof(fresh)?;
        node.etcd_leave_cluster().await.map_err(Sent::Failed)
    }

    /// EtcdRemoveMemberByID through a survivor.
    pub(super) async fn send_remove_member(
        &self,
        fresh: Fresh,
        survivor: &Client<One>,
        id: MemberId,
    ) -> SendResult<()> {
        self.proof(fresh)?;
        survivor
            .etcd_remove_member_by_id(id)
            .await
            .map_err(Sent::Failed)
    }

    /// Reset.
    pub(super) async fn send_reset(
        &self,
        fresh: Fresh,
        node: &Client<One>,
        request: ResetRequest,
    ) -> SendResult<String> {
        self.proof(fresh)?;
        node.reset(request).await.map_err(Sent::Failed)
    }

    /// ApplyConfiguration in a mode that changes the node (TRY, NO_REBOOT,
    /// REBOOT); never a dry run.
    pub(super) async fn send_apply(
        &self,
        fresh: Fresh,
        node: &Client<One>,
        request: ApplyRequest,
    ) -> SendResult<ApplyResult> {
        self.proof(fresh)?;
        node.apply_configuration(request)
            .await
            .map_err(Sent::Failed)
    }

    /// ApplyConfiguration to a node in maintenance mode.
    pub(super) async fn send_maintenance_apply(
        &self,
        fresh: Fresh,
        node: &MaintenanceClient,
        request: ApplyRequest,
    ) -> SendResult<ApplyResult> {
        self.proof(fresh)?;
        node.apply_configuration(request)
            .await
            .map_err(Sent::Failed)
    }

    /// The legacy MachineService.Upgrade (install and reboot in one call).
    pub(super) async fn send_upgrade_legacy(
        &self,
        fresh: Fresh,
        node: &Client<One>,
        request: &UpgradeRequest,
    ) -> SendResult<UpgradeAck> {
        self.proof(fresh)?;
        node.upgrade_legacy(request).await.map_err(Sent::Failed)
    }

    /// LifecycleService.Upgrade: installs a pulled image (no reboot).
    pub(super) async fn send_install(
        &self,
        fresh: Fresh,
        node: &Client<One>,
        image: &str,
    ) -> SendResult<impl Stream<Item = Result<InstallProgress, Error>> + Send + Unpin + use<>> {
        self.proof(fresh)?;
        node.lifecycle_upgrade(image, ImageNamespace::System)
            .await
            .map_err(Sent::Failed)
    }

    /// Reboot.
    pub(super) async fn send_reboot(&self, fresh: Fresh, node: &Client<One>) -> SendResult<String> {
        self.proof(fresh)?;
        node.reboot(RebootMode::Default).await.map_err(Sent::Failed)
    }

    /// EtcdDefragment (the member answers nothing while it runs).
    pub(super) async fn send_defragment(&self, fresh: Fresh, node: &Client<One>) -> SendResult<()> {
        self.proof(fresh)?;
        node.etcd_defragment().await.map_err(Sent::Failed)
    }

    /// EtcdAlarmDisarm: the alarms it disarmed.
    pub(super) async fn send_alarm_disarm(
        &self,
        fresh: Fresh,
        node: &Client<One>,
    ) -> SendResult<usize> {
        self.proof(fresh)?;
        node.etcd_alarm_disarm()
            .await
            .map(|a| a.len())
            .map_err(Sent::Failed)
    }

    /// EtcdRecover: a snapshot uploaded for a bootstrap.
    pub(super) async fn send_etcd_recover<St>(
        &self,
        fresh: Fresh,
        node: &Client<One>,
        chunks: St,
    ) -> SendResult<()>
    where
        St: Stream<Item = Bytes> + Send + 'static,
    {
        self.proof(fresh)?;
        node.etcd_recover(chunks).await.map_err(Sent::Failed)
    }

    /// Bootstrap with `recover_etcd`: a new etcd from the uploaded
    /// snapshot.
    pub(super) async fn send_bootstrap_recover(
        &self,
        fresh: Fresh,
        node: &Client<One>,
    ) -> SendResult<()> {
        self.proof(fresh)?;
        node.bootstrap(true, false).await.map_err(Sent::Failed)
    }
}

/// A dry run in TRY mode: changes nothing (and, unlike other dry runs on
/// Talos 1.13.9, does not cancel a pending TRY rollback, talos#14343).
pub(crate) async fn try_dry_run(
    client: &Client,
    node: &str,
    config: &[u8],
) -> Result<ApplyResult, Error> {
    let request = ApplyRequest::new(config.to_vec(), ApplyMode::Try).with_dry_run(true);
    client.node(node).apply_configuration(request).await
}

#[cfg(test)]
mod tests {
    /// The calls of the client that change a cluster.
    const DESTRUCTIVE: &[&str] = &[
        ".etcd_forfeit_leadership(",
        ".etcd_leave_cluster(",
        ".etcd_remove_member_by_id(",
        ".reset(",
        ".apply_configuration(",
        ".upgrade_legacy(",
        ".lifecycle_upgrade(",
        ".reboot(",
        ".etcd_defragment(",
        ".etcd_alarm_disarm(",
        ".etcd_recover(",
        ".bootstrap(",
    ];

    /// No file of the operations but this one sends a destructive call: a
    /// step can only reach one through a function above, which takes the
    /// proof that only the engine's check makes.
    #[test]
    fn destructive_calls_are_sent_only_here() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ops");
        let mut offenders = Vec::new();
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".rs") || name == "send.rs" {
                continue;
            }
            read += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                for call in DESTRUCTIVE {
                    if line.contains(call) {
                        offenders.push(format!("{name}:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(read > 20, "the operations' sources were read ({read})");
        assert!(offenders.is_empty(), "{offenders:#?}");
    }
}
