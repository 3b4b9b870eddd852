//! Which roles may call which method: the whole rule table machined's
//! authorizer applies, as the `rules` map of siderolabs/talos
//! internal/app/machined/pkg/system/services/machined.go states it at
//! v1.13.9, with the entries v1.14.0-rc.1 adds. A method the table does not
//! name is admin-only (the authorizer's `FallbackRoles`), and a call whose
//! roles share none with the method's set is refused PermissionDenied
//! `not authorized` (pkg/grpc/middleware/authz/authorizer.go).
//!
//! Roles are the organisation values of the client certificate
//! (pkg/machinery/role/role.go).

use crate::TalosVersion;

/// Every call.
pub const ADMIN: &str = "os:admin";
/// Reads and management calls that expose no secret.
pub const OPERATOR: &str = "os:operator";
/// Reads that expose no secret.
pub const READER: &str = "os:reader";
/// etcd snapshots and the etcd reads around them.
pub const ETCD_BACKUP: &str = "os:etcd:backup";
/// Image verification.
pub const IMAGE_VERIFIER: &str = "os:image:verifier";
/// Writing and deleting META values.
pub const META_WRITER: &str = "os:meta:writer";
/// Lets a peer apid pass on the roles of the original caller.
pub const IMPERSONATOR: &str = "os:impersonator";

const A: &[&str] = &[ADMIN];
const AO: &[&str] = &[ADMIN, OPERATOR];
const AOR: &[&str] = &[ADMIN, OPERATOR, READER];
const AOB: &[&str] = &[ADMIN, OPERATOR, ETCD_BACKUP];
const AORB: &[&str] = &[ADMIN, OPERATOR, READER, ETCD_BACKUP];
const AORV: &[&str] = &[ADMIN, OPERATOR, READER, IMAGE_VERIFIER];
const AM: &[&str] = &[ADMIN, META_WRITER];
/// Admin, and readers in maintenance mode (the handler checks the mode).
const A_MAINTENANCE_R: &[&str] = &[ADMIN, READER];

/// One entry: the method's full gRPC path, its roles, and whether only
/// 1.14 lists it (1.13.9 falls back to admin-only for it).
pub struct Rule {
    /// `/package.Service/Method`.
    pub path: &'static str,
    /// The roles allowed.
    pub roles: &'static [&'static str],
    /// Listed from 1.14 only.
    pub since_1_14: bool,
}

const fn rule(path: &'static str, roles: &'static [&'static str]) -> Rule {
    Rule {
        path,
        roles,
        since_1_14: false,
    }
}

const fn rule_1_14(path: &'static str, roles: &'static [&'static str]) -> Rule {
    Rule {
        path,
        roles,
        since_1_14: true,
    }
}

/// The table, in upstream's order.
pub const RULES: &[Rule] = &[
    rule("/cluster.ClusterService/HealthCheck", AOR),
    rule("/inspect.InspectService/ControllerRuntimeDependencies", AOR),
    rule("/machine.ImageService/Import", A),
    rule("/machine.ImageService/List", AOR),
    rule("/machine.ImageService/Pull", AO),
    rule("/machine.ImageService/Remove", A),
    rule("/machine.ImageService/Verify", AORV),
    rule("/machine.DebugService/ContainerRun", A),
    rule("/machine.LifecycleService/Install", A),
    rule("/machine.LifecycleService/Upgrade", A),
    rule(
        "/machine.MachineService/ApplyConfiguration",
        A_MAINTENANCE_R,
    ),
    rule("/machine.MachineService/Bootstrap", A),
    rule("/machine.MachineService/CPUInfo", AOR),
    rule("/machine.MachineService/CPUFreqStats", AOR),
    rule("/machine.MachineService/Containers", AOR),
    rule("/machine.MachineService/Copy", A),
    rule("/machine.MachineService/DiskStats", AOR),
    rule("/machine.MachineService/DiskUsage", AOR),
    rule("/machine.MachineService/Dmesg", AOR),
    rule("/machine.MachineService/EtcdAlarmList", AORB),
    rule("/machine.MachineService/EtcdAlarmDisarm", AO),
    rule("/machine.MachineService/EtcdDefragment", AO),
    rule("/machine.MachineService/EtcdForfeitLeadership", A),
    rule("/machine.MachineService/EtcdLeaveCluster", A),
    rule("/machine.MachineService/EtcdMemberList", AORB),
    rule("/machine.MachineService/EtcdRecover", A),
    rule("/machine.MachineService/EtcdRemoveMemberByID", A),
    rule("/machine.MachineService/EtcdSnapshot", AOB),
    rule("/machine.MachineService/EtcdStatus", AORB),
    rule("/machine.MachineService/EtcdDowngradeCancel", A),
    rule("/machine.MachineService/EtcdDowngradeEnable", A),
    rule("/machine.MachineService/EtcdDowngradeValidate", A),
    rule("/machine.MachineService/Events", AOR),
    rule("/machine.MachineService/GenerateClientConfiguration", A),
    rule("/machine.MachineService/Hostname", AOR),
    rule("/machine.MachineService/ImageList", AOR),
    rule("/machine.MachineService/ImagePull", AO),
    rule("/machine.MachineService/Kubeconfig", A),
    rule("/machine.MachineService/List", AOR),
    rule("/machine.MachineService/LoadAvg", AOR),
    rule("/machine.MachineService/Logs", AOR),
    rule("/machine.MachineService/LogsContainers", AOR),
    rule("/machine.MachineService/Memory", AOR),
    rule("/machine.MachineService/MetaWrite", AM),
    rule("/machine.MachineService/MetaDelete", AM),
    rule("/machine.MachineService/Mounts", AOR),
    rule("/machine.MachineService/NetworkDeviceStats", AOR),
    rule("/machine.MachineService/Netstat", AOR),
    rule("/machine.MachineService/PacketCapture", AO),
    rule("/machine.MachineService/Processes", AOR),
    rule("/machine.MachineService/Read", A),
    rule("/machine.MachineService/Reboot", AO),
    rule("/machine.MachineService/Reset", A),
    rule("/machine.MachineService/Restart", AO),
    rule("/machine.MachineService/Rollback", A),
    rule("/machine.MachineService/ServiceList", AOR),
    rule("/machine.MachineService/ServiceRestart", AO),
    rule("/machine.MachineService/ServiceStart", AO),
    rule("/machine.MachineService/ServiceStop", AO),
    rule("/machine.MachineService/Shutdown", AO),
    rule("/machine.MachineService/Stats", AOR),
    rule("/machine.MachineService/SystemStat", AOR),
    rule("/machine.MachineService/Upgrade", A),
    rule("/machine.MachineService/Version", AOR),
    // COSI: the service filters by resource type itself (sensitive types
    // need admin).
    rule("/cosi.resource.State/Create", A),
    rule("/cosi.resource.State/Destroy", A),
    rule_1_14("/cosi.resource.State/Teardown", A),
    rule_1_14("/cosi.resource.State/TeardownAndDestroy", A),
    rule("/cosi.resource.State/Get", AOR),
    rule("/cosi.resource.State/List", AOR),
    rule("/cosi.resource.State/Update", A),
    rule("/cosi.resource.State/Watch", AOR),
    rule("/storage.StorageService/Disks", AOR),
    rule("/storage.StorageService/BlockDeviceWipe", A_MAINTENANCE_R),
    rule_1_14("/machine.LVMService/LogicalVolumeRemove", A_MAINTENANCE_R),
    rule_1_14("/machine.LVMService/VolumeGroupRemove", A_MAINTENANCE_R),
    rule_1_14("/machine.LVMService/PhysicalVolumeRemove", A_MAINTENANCE_R),
    rule_1_14("/machine.MDService/Destroy", A_MAINTENANCE_R),
    rule("/time.TimeService/Time", AOR),
    rule("/time.TimeService/TimeCheck", AOR),
];

/// The roles allowed to call `path` on a node of `version`.
pub fn allowed(path: &str, version: TalosVersion) -> &'static [&'static str] {
    RULES
        .iter()
        .find(|r| r.path == path && (!r.since_1_14 || version.at_least_1_14()))
        .map_or(A, |r| r.roles)
}

/// Whether a caller holding `roles` may call `path` on a node of `version`
/// (upstream's `IncludesAny`: one shared role is enough).
pub fn permits(roles: &[String], path: &str, version: TalosVersion) -> bool {
    allowed(path, version)
        .iter()
        .any(|allowed| roles.iter().any(|r| r == allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlisted_methods_are_admin_only() {
        let v = TalosVersion::V1_13_9;
        assert_eq!(allowed("/machine.MachineService/NoSuchCall", v), A);
        assert_eq!(allowed("/machine.LVMService/VolumeGroupRemove", v), A);
        assert_eq!(
            allowed(
                "/machine.LVMService/VolumeGroupRemove",
                TalosVersion::V1_14_0
            ),
            A_MAINTENANCE_R
        );
    }

    #[test]
    fn every_path_is_listed_once() {
        let mut paths: Vec<&str> = RULES.iter().map(|r| r.path).collect();
        paths.sort_unstable();
        let before = paths.len();
        paths.dedup();
        assert_eq!(before, paths.len());
    }
}
