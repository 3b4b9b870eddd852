//! Files a simulated node serves through MachineService `Read`, as
//! machined's Read handler does (internal/app/machined/internal/server/
//! v1alpha1/v1alpha1_server.go): a missing path is NotFound with Go's
//! `stat` text, anything but a regular file fails. Like Talos 1.13.9 a node
//! does not mount STATE, so every path answers NotFound; with the STATE
//! switch on ([`crate::cosi::set_state_partition_mounted`]) the STATE
//! volume is served: `/system/state/config.yaml` is the node's persisted
//! machine configuration.

use tonic::Status;

use crate::node::Node;

/// The bytes of `path` on `node`.
pub(crate) fn read(node: &Node, path: &str) -> Result<Vec<u8>, Status> {
    let missing = || Status::not_found(format!("stat {path}: no such file or directory"));
    // The kernel's id of the current boot: new at every boot.
    if path == "/proc/sys/kernel/random/boot_id" {
        return Ok(format!("{}\n", node.boot_id()).into_bytes());
    }
    if !crate::cosi::state_partition_mounted(node) {
        return Err(missing());
    }
    let Some(rest) = path.strip_prefix("/system/state") else {
        return Err(missing());
    };
    let relative = rest.trim_start_matches('/');
    if relative.split('/').any(|part| part == "..") {
        return Err(missing());
    }
    let local = node.volume("STATE").join(relative);
    let meta = std::fs::metadata(&local).map_err(|_| missing())?;
    if !meta.is_file() {
        return Err(Status::unknown("path must be a regular file"));
    }
    std::fs::read(&local).map_err(|e| Status::unknown(format!("open {path}: {e}")))
}
