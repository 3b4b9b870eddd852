//! ApplyConfiguration on a node in maintenance mode, as machined answers it
//! there (internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go):
//! any caller may apply, REBOOT means NO_REBOOT, nothing is checked against
//! a running configuration, and the node then boots into the new one: it
//! serves the cluster's certificate and, with a control-plane
//! configuration, joins etcd as a learner (a worker has no etcd).

use std::sync::Arc;

use base64::Engine as _;
use tonic::{Response, Status};

use super::diff;
use super::node::Node;
use super::shared::Shared;
use crate::api::machine::{self, apply_configuration_request::Mode};

/// Answers an apply on a node without configuration.
pub(crate) fn apply(
    shared: &Arc<Shared>,
    node: &Arc<Node>,
    request: machine::ApplyConfigurationRequest,
) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
    let mode = Mode::try_from(request.mode)
        .map_err(|_| Status::invalid_argument(format!("unknown apply mode {}", request.mode)))?;
    crate::strict::check(&request.data, node.talos_version())?;
    let config = diff::parse(&request.data)?;
    // The same Validate as on a configured node (v1alpha1_server.go).
    let version = node.talos_version();
    let mut warnings = crate::validate::check(&config, version)?;
    warnings.extend(crate::runtime_validate::check(&config, version)?);
    check_cluster_ca(shared, &config)?;
    let worker = config.is_worker();
    let mode = match mode {
        Mode::Reboot | Mode::Auto => Mode::NoReboot,
        other => other,
    };
    let details = "Applied configuration without a reboot";
    let config = config.encode();
    if request.dry_run {
        return Ok(Response::new(response(
            mode,
            vec![],
            format!(
                "Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{}",
                diff::unified("", &config)
            ),
        )));
    }
    node.set_worker(worker);
    node.persist_config(&config)
        .map_err(|e| Status::unknown(format!("failed to persist config: {e}")))?;
    node.config.lock().expect("config lock").active = config;
    // The maintenance API goes away; the node boots configured.
    node.queue(crate::node::Action::BootConfigured);
    Ok(Response::new(response(mode, warnings, details.to_string())))
}

fn response(
    mode: Mode,
    warnings: Vec<String>,
    mode_details: String,
) -> machine::ApplyConfigurationResponse {
    machine::ApplyConfigurationResponse {
        messages: vec![machine::ApplyConfiguration {
            metadata: None,
            warnings,
            mode: mode as i32,
            mode_details,
        }],
    }
}

/// A node takes its PKI from the configuration; the simulator serves one
/// cluster, so the configuration must carry that cluster's CA.
fn check_cluster_ca(shared: &Shared, config: &diff::MachineConfig) -> Result<(), Status> {
    let crt = config
        .v1alpha1
        .get("machine")
        .and_then(|m| m.get("ca"))
        .and_then(|ca| ca.get("crt"))
        .and_then(|c| c.as_str())
        .ok_or_else(|| Status::invalid_argument("1 error occurred:\n\t* machine.ca is required"))?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(crt.trim())
        .map_err(|e| Status::invalid_argument(format!("machine.ca.crt: {e}")))?;
    if String::from_utf8_lossy(&pem).trim() != shared.ca().cert_pem.trim() {
        return Err(Status::invalid_argument(
            "machine.ca is not this cluster's CA: the simulator runs one cluster, so a node can only join it",
        ));
    }
    Ok(())
}
