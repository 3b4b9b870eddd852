//! The calls the ledger records, by gRPC method, and who sent them.

use serde::{Deserialize, Serialize};

/// A call the ledger records: those that change something, and the reads
/// a check before a send uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallKind {
    /// EtcdLeaveCluster.
    Leave,
    /// EtcdRemoveMemberByID.
    RemoveMember,
    /// EtcdForfeitLeadership.
    Forfeit,
    /// Reset.
    Reset,
    /// Reboot.
    Reboot,
    /// Shutdown.
    Shutdown,
    /// MachineService.Upgrade (the legacy upgrade, which reboots).
    Upgrade,
    /// LifecycleService.Upgrade (installs for the next boot).
    LifecycleUpgrade,
    /// ApplyConfiguration (its mode follows as an `apply` event).
    Apply,
    /// EtcdDefragment.
    Defrag,
    /// Bootstrap (with or without recovery).
    Bootstrap,
    /// EtcdRecover (a snapshot uploaded for a recovery).
    Recover,
    /// EtcdAlarmDisarm.
    AlarmDisarm,
    /// EtcdSnapshot (a read, recorded as an operation's snapshot).
    Snapshot,
    /// EtcdMemberList (a read).
    MemberList,
    /// EtcdStatus (a read).
    Status,
    /// ServiceList (a read).
    ServiceList,
    /// EtcdAlarmList (a read).
    AlarmList,
    /// ClusterService.HealthCheck (a read).
    HealthCheck,
}

impl CallKind {
    /// The kind of the call to gRPC method `path`, when the ledger records
    /// it.
    pub fn of_method(path: &str) -> Option<CallKind> {
        let (service, method) = path.trim_start_matches('/').split_once('/')?;
        Some(match (service, method) {
            ("machine.LifecycleService", "Upgrade") => CallKind::LifecycleUpgrade,
            ("cluster.ClusterService", "HealthCheck") => CallKind::HealthCheck,
            ("machine.MachineService", method) => match method {
                "EtcdLeaveCluster" => CallKind::Leave,
                "EtcdRemoveMemberByID" => CallKind::RemoveMember,
                "EtcdForfeitLeadership" => CallKind::Forfeit,
                "Reset" => CallKind::Reset,
                "Reboot" => CallKind::Reboot,
                "Shutdown" => CallKind::Shutdown,
                "Upgrade" => CallKind::Upgrade,
                "ApplyConfiguration" => CallKind::Apply,
                "EtcdDefragment" => CallKind::Defrag,
                "Bootstrap" => CallKind::Bootstrap,
                "EtcdRecover" => CallKind::Recover,
                "EtcdAlarmDisarm" => CallKind::AlarmDisarm,
                "EtcdSnapshot" => CallKind::Snapshot,
                "EtcdMemberList" => CallKind::MemberList,
                "EtcdStatus" => CallKind::Status,
                "ServiceList" => CallKind::ServiceList,
                "EtcdAlarmList" => CallKind::AlarmList,
                _ => return None,
            },
            _ => return None,
        })
    }

    /// Whether it changes the cluster or a node (an apply's dry run is
    /// told apart by its `apply` event).
    pub fn changes_something(self) -> bool {
        !matches!(
            self,
            CallKind::Snapshot
                | CallKind::MemberList
                | CallKind::Status
                | CallKind::ServiceList
                | CallKind::AlarmList
                | CallKind::HealthCheck
        )
    }
}

/// Who sent a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// The client certificate's subject (`CN=...,O=...`), or "" without
    /// one (a node in maintenance mode).
    pub subject: String,
    /// The client's address, as the node it entered by saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The node the call entered the cluster by (its apid routed it here).
    pub entry: String,
}

impl Caller {
    /// The caller of a connection: its certificate's subject and address,
    /// entering by `entry`.
    pub(crate) fn of_peer(peer: Option<&crate::serve::PeerInfo>, entry: &str) -> Caller {
        let subject = peer
            .and_then(|p| p.certificates.first())
            .map(|leaf| subject_of(leaf.as_ref()))
            .unwrap_or_default();
        Caller {
            subject,
            peer: peer.and_then(|p| p.remote_addr).map(|a| a.to_string()),
            entry: entry.to_string(),
        }
    }

    /// As a header value, to travel with a call one apid forwards to
    /// another over the network.
    pub(crate) fn to_header(&self) -> Option<http::HeaderValue> {
        use base64::Engine as _;
        let json = serde_json::to_vec(self).ok()?;
        http::HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(json)).ok()
    }

    /// From [`Caller::to_header`]'s value.
    pub(crate) fn from_header(value: &http::HeaderValue) -> Option<Caller> {
        use base64::Engine as _;
        let json = base64::engine::general_purpose::STANDARD
            .decode(value.as_bytes())
            .ok()?;
        serde_json::from_slice(&json).ok()
    }
}

/// `CN=...,O=...,O=...` of a DER certificate ("" when it does not parse).
fn subject_of(der: &[u8]) -> String {
    use x509_parser::prelude::FromDer as _;
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(der) else {
        return String::new();
    };
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .map(|v| format!("CN={v}"));
    let o = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .map(|v| format!("O={v}"));
    cn.chain(o).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::CallKind;

    #[test]
    fn methods_map_to_kinds() {
        assert_eq!(
            CallKind::of_method("/machine.MachineService/EtcdLeaveCluster"),
            Some(CallKind::Leave)
        );
        assert_eq!(
            CallKind::of_method("/machine.LifecycleService/Upgrade"),
            Some(CallKind::LifecycleUpgrade)
        );
        assert_eq!(
            CallKind::of_method("/machine.MachineService/Upgrade"),
            Some(CallKind::Upgrade)
        );
        assert_eq!(CallKind::of_method("/machine.MachineService/Version"), None);
        assert!(CallKind::Reset.changes_something());
        assert!(!CallKind::MemberList.changes_something());
    }
}
