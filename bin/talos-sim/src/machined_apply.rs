//! ApplyConfiguration on a configured node, as upstream's handler
//! (internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go) and
//! the runtime's config handling (runtime/v1alpha1/v1alpha1_runtime.go).

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::diff;
use super::immediate;
use super::machined::{DEFAULT_TRY_TIMEOUT, Machined};
use super::node::Node;
use crate::api::machine::{self, apply_configuration_request::Mode};

fn one<T>(message: T) -> Result<Response<T>, Status> {
    Ok(Response::new(message))
}

impl Machined {
    /// The handler after its role check.
    pub(crate) async fn apply_configuration_call(
        &self,
        request: Request<machine::ApplyConfigurationRequest>,
    ) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
        let _guard = self.node.apply_lock.try_lock().map_err(|_| {
            Status::failed_precondition("another apply configuration is already in progress")
        })?;
        if self.node.config.lock().expect("config lock").rebooting {
            return Err(Status::failed_precondition(
                "configuration was already applied and node is rebooting, cannot apply more configuration changes until next reboot",
            ));
        }
        if !self.node.is_configured() {
            return crate::maintenance::apply(&self.shared, &self.node, request.into_inner());
        }
        if !super::auth::is_admin(&request) {
            return Err(Status::permission_denied("not authorized"));
        }
        let request = request.into_inner();
        // Talos 1.13.9 cancels a pending TRY rollback for any request that is
        // not itself TRY, before parsing or validating it: dry runs and
        // invalid configurations included (v1alpha1_server.go; fixed after
        // 1.13.9, talos#14343). The simulator reports 1.13.9.
        if request.mode != Mode::Try as i32
            && let Some(rollback) = self
                .node
                .config
                .lock()
                .expect("config lock")
                .rollback
                .take()
        {
            rollback.abort();
        }
        let mode = Mode::try_from(request.mode).map_err(|_| {
            Status::invalid_argument(format!("unknown apply mode {}", request.mode))
        })?;
        crate::strict::check(&request.data, self.node.talos_version())?;
        let config = diff::parse(&request.data)?;
        // Talos 1.14 refuses REBOOT once the configuration has loaded,
        // before validating it (v1alpha1_server.go at v1.14.0).
        let v1_14 = self.node.talos_version().at_least_1_14();
        if v1_14 && mode == Mode::Reboot {
            return Err(Status::unimplemented(
                "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead",
            ));
        }
        // Validate runs before anything depends on the new configuration
        // (v1alpha1_server.go); its warnings come back with the result.
        let version = self.node.talos_version();
        let mut warnings = crate::validate::check(&config, version)?;
        // Then RuntimeValidate; its warnings follow Validate's.
        warnings.extend(crate::runtime_validate::check(&config, version)?);
        config.check_role(self.node.is_worker())?;
        let active = self.node.config.lock().expect("config lock").active.clone();
        let current = diff::parse(active.as_bytes());
        // Whether the change can take effect without a reboot decides the
        // mode, as upstream's ApplyConfiguration does (v1alpha1_server.go,
        // CanApplyImmediate in v1alpha1_runtime.go).
        // Talos 1.14 applies AUTO, NO_REBOOT and TRY in place without the
        // immediate-apply check (v1alpha1_server.go at v1.14.0).
        let immediate = || match &current {
            _ if v1_14 => Ok(()),
            Ok(current) => immediate::check(current, &config),
            Err(_) => Ok(()),
        };
        let mut mode_error = String::new();
        let (mode, details) = match mode {
            Mode::Try | Mode::NoReboot => {
                immediate().map_err(Status::invalid_argument)?;
                (mode, "Applied configuration without a reboot")
            }
            Mode::Auto => match immediate() {
                Ok(()) => (Mode::NoReboot, "Applied configuration without a reboot"),
                Err(e) => {
                    mode_error = format!(": {e}");
                    (Mode::Reboot, "Applied configuration with a reboot")
                }
            },
            Mode::Staged => (
                Mode::Staged,
                "Staged configuration to be applied after the next reboot",
            ),
            Mode::Reboot => (Mode::Reboot, "Applied configuration with a reboot"),
        };
        let config = config.encode();
        self.node.ledger.record(crate::ledger::Event::Apply {
            node: self.node.name.clone(),
            mode: mode.as_str_name().to_ascii_lowercase().replace('_', "-"),
            dry_run: request.dry_run,
        });
        if request.dry_run {
            let old = diff::normalize(active.as_bytes()).unwrap_or(active);
            let mut changes = diff::unified(&old, &config);
            if changes.is_empty() {
                changes = "No changes.".into();
            }
            return one(machine::ApplyConfigurationResponse {
                messages: vec![machine::ApplyConfiguration {
                    metadata: None,
                    warnings: vec![],
                    mode: mode as i32,
                    mode_details: format!(
                        "Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{changes}"
                    ),
                }],
            });
        }
        // Unset: the default; zero: an immediate rollback, as upstream.
        let try_timeout = match request.try_mode_timeout {
            None => DEFAULT_TRY_TIMEOUT,
            Some(d) => Duration::try_from(d).unwrap_or(Duration::ZERO),
        };
        let mode_details = self.apply(config, mode, try_timeout)? + &mode_error;
        // The static pods follow the configuration now running.
        crate::kube_apiserver::reconcile(&self.node);
        crate::kubeprism::reconcile(&self.node);
        one(machine::ApplyConfigurationResponse {
            messages: vec![machine::ApplyConfiguration {
                metadata: None,
                warnings,
                mode: mode as i32,
                mode_details,
            }],
        })
    }

    /// Applies a validated configuration in `mode`; returns the details line.
    fn apply(&self, config: String, mode: Mode, try_timeout: Duration) -> Result<String, Status> {
        let node = &self.node;
        let mut state = node.config.lock().expect("config lock");
        if mode != Mode::Try
            && let Some(rollback) = state.rollback.take()
        {
            // A later non-TRY apply confirms the tried configuration.
            rollback.abort();
        }
        // Upstream's handler returns the state's error as is, which
        // grpc-go sends as Unknown (v1alpha1_server.go).
        let persist = |yaml: &str| {
            node.persist_config(yaml)
                .map_err(|e| Status::unknown(format!("failed to persist config: {e}")))
        };
        Ok(match mode {
            Mode::Try => {
                if let Some(previous) = state.rollback.take() {
                    previous.abort();
                }
                // The rollback goes back to the configuration active now,
                // which after an earlier TRY is that TRY's, not the
                // persisted one (v1alpha1_runtime.go, RollbackToConfigAfter).
                let before = std::mem::replace(&mut state.active, config);
                node.kubelet.restart_on_change(&before, &state.active);
                let task = tokio::spawn(crate::ledger::with_cause(
                    crate::ledger::Cause::simulator("try rollback"),
                    roll_back_after(node.clone(), before, try_timeout),
                ));
                state.rollback = Some(task.abort_handle());
                format!(
                    "Applied configuration without a reboot\nThe config is applied in 'try' mode and will be automatically reverted back in {}",
                    diff::go_duration(try_timeout)
                )
            }
            Mode::NoReboot | Mode::Auto => {
                persist(&config)?;
                node.kubelet.restart_on_change(&state.active, &config);
                state.active = config;
                "Applied configuration without a reboot".into()
            }
            Mode::Staged => {
                persist(&config)?;
                "Staged configuration to be applied after the next reboot".into()
            }
            Mode::Reboot => {
                persist(&config)?;
                state.rebooting = true;
                node.queue(crate::node::Action::Reboot {
                    actor: String::new(),
                });
                "Applied configuration with a reboot".into()
            }
        })
    }
}

/// Restores `previous`, the configuration active when a TRY apply started,
/// unless it is confirmed within `timeout` (upstream's
/// RollbackToConfigAfter); a zero timeout rolls back at once.
async fn roll_back_after(node: Arc<Node>, previous: String, timeout: Duration) {
    tokio::time::sleep(timeout).await;
    {
        let mut state = node.config.lock().expect("config lock");
        tracing::info!(node = %node.name, "rolling back the configuration applied in try mode");
        node.ledger.record(crate::ledger::Event::Rollback {
            node: node.name.clone(),
        });
        node.kubelet.restart_on_change(&state.active, &previous);
        state.active = previous;
        state.rollback = None;
    }
    crate::kube_apiserver::reconcile(&node);
    crate::kubeprism::reconcile(&node);
}
