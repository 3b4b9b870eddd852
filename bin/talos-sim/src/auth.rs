//! Roles and permissions, as apid and machined apply them.

use tonic::Status;

/// The roles a request was authenticated with, placed in the request's
/// extensions by the front.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallerRoles(pub Vec<String>);

impl CallerRoles {
    fn has(&self, role: &str) -> bool {
        self.0.iter().any(|r| r == role)
    }
}

const ADMIN: &str = "os:admin";
const OPERATOR: &str = "os:operator";
pub(crate) const READER: &str = "os:reader";
const ETCD_BACKUP: &str = "os:etcd:backup";
/// Lets a peer apid pass on the roles of the original caller.
pub(crate) const IMPERSONATOR: &str = "os:impersonator";

/// The roles allowed to call `method` (a gRPC path), mirroring the rule table
/// in siderolabs/talos internal/app/machined/pkg/system/services/machined.go.
/// Methods not listed are admin-only.
fn allowed(method: &str) -> &'static [&'static str] {
    match method.rsplit('/').next().unwrap_or_default() {
        "EtcdSnapshot" => &[ADMIN, OPERATOR, ETCD_BACKUP],
        "EtcdMemberList" | "EtcdStatus" | "EtcdAlarmList" => {
            &[ADMIN, OPERATOR, READER, ETCD_BACKUP]
        }
        "EtcdAlarmDisarm" | "EtcdDefragment" | "Reboot" | "Shutdown" | "ServiceStart"
        | "ServiceStop" | "ServiceRestart" => &[ADMIN, OPERATOR],
        // ImageService.Pull.
        "Pull" => &[ADMIN, OPERATOR],
        "Version" | "Hostname" | "ServiceList" | "HealthCheck" | "Events" | "Logs" | "Dmesg"
        | "Containers" | "List" => &[ADMIN, OPERATOR, READER],
        // Readers only in maintenance mode, which the handler checks.
        "ApplyConfiguration" => &[ADMIN, READER],
        _ => &[ADMIN],
    }
}

/// Whether the caller holds the admin role.
pub(crate) fn is_admin<T>(request: &tonic::Request<T>) -> bool {
    request
        .extensions()
        .get::<CallerRoles>()
        .is_some_and(|r| r.has(ADMIN))
}

/// Fails with PermissionDenied ("not authorized", as upstream's authorizer)
/// unless the caller holds a role allowed for `method`.
pub(crate) fn authorize<T>(request: &tonic::Request<T>, method: &str) -> Result<(), Status> {
    let roles = request
        .extensions()
        .get::<CallerRoles>()
        .cloned()
        .unwrap_or_default();
    if allowed(method).iter().any(|r| roles.has(r)) {
        Ok(())
    } else {
        Err(Status::permission_denied("not authorized"))
    }
}
