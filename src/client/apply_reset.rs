//! Calls that change a node: apply-config, reset, reboot, shutdown (the
//! requests and modes of applying a configuration and of resetting). None of
//! them is ever retried.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{Client, Idempotency, Result, Scope, machine_stub};
use crate::api::machine;

/// How a node takes a new machine configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyMode {
    /// Reboot to apply.
    Reboot,
    /// Apply without reboot when possible, else reboot (talosctl's default).
    #[default]
    Auto,
    /// Apply without reboot; fails if a reboot is needed.
    NoReboot,
    /// Store it for the next boot.
    Staged,
    /// Apply without reboot and roll back after a timeout unless confirmed.
    Try,
}

impl ApplyMode {
    fn to_wire(self) -> machine::apply_configuration_request::Mode {
        use machine::apply_configuration_request::Mode;
        match self {
            ApplyMode::Reboot => Mode::Reboot,
            ApplyMode::Auto => Mode::Auto,
            ApplyMode::NoReboot => Mode::NoReboot,
            ApplyMode::Staged => Mode::Staged,
            ApplyMode::Try => Mode::Try,
        }
    }

    fn from_wire(mode: i32) -> ApplyMode {
        use machine::apply_configuration_request::Mode;
        match Mode::try_from(mode) {
            Ok(Mode::Reboot) => ApplyMode::Reboot,
            Ok(Mode::NoReboot) => ApplyMode::NoReboot,
            Ok(Mode::Staged) => ApplyMode::Staged,
            Ok(Mode::Try) => ApplyMode::Try,
            Ok(Mode::Auto) | Err(_) => ApplyMode::Auto,
        }
    }
}

impl fmt::Display for ApplyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ApplyMode::Reboot => "reboot",
            ApplyMode::Auto => "auto",
            ApplyMode::NoReboot => "no-reboot",
            ApplyMode::Staged => "staged",
            ApplyMode::Try => "try",
        })
    }
}

/// A word that names no variant of an option, with the words accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {word:?} (expected {expected})")]
pub struct UnknownVariant {
    /// What was being parsed, e.g. "mode".
    pub what: &'static str,
    /// The word given.
    pub word: String,
    /// The words accepted.
    pub expected: &'static str,
}

impl FromStr for ApplyMode {
    type Err = UnknownVariant;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "reboot" => ApplyMode::Reboot,
            "auto" => ApplyMode::Auto,
            "no-reboot" => ApplyMode::NoReboot,
            "staged" => ApplyMode::Staged,
            "try" => ApplyMode::Try,
            other => {
                return Err(UnknownVariant {
                    what: "mode",
                    word: other.to_string(),
                    expected: "auto, no-reboot, reboot, staged or try",
                });
            }
        })
    }
}

/// An apply-config request.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ApplyRequest {
    /// The machine configuration YAML.
    pub config: Vec<u8>,
    /// How to apply it.
    pub mode: ApplyMode,
    /// Only report what would change.
    pub dry_run: bool,
    /// For [`ApplyMode::Try`]: how long until rollback (server default 1m).
    pub try_timeout: Option<Duration>,
}

impl ApplyRequest {
    /// A request applying `config` in `mode`.
    pub fn new(config: impl Into<Vec<u8>>, mode: ApplyMode) -> Self {
        ApplyRequest {
            config: config.into(),
            mode,
            ..ApplyRequest::default()
        }
    }

    /// Marks the request as a dry run.
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Sets the TRY-mode rollback timeout.
    pub fn with_try_timeout(mut self, timeout: Duration) -> Self {
        self.try_timeout = Some(timeout);
        self
    }
}

/// What the node did with an applied configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ApplyResult {
    /// The mode the node used (AUTO is reported as the mode it chose).
    pub mode: ApplyMode,
    /// The node's account; for a dry run, the configuration diff.
    pub mode_details: String,
    /// Warnings about the configuration.
    pub warnings: Vec<String>,
}

/// Which disks a reset wipes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WipeMode {
    /// System disk and user disks.
    #[default]
    All,
    /// The system disk only.
    SystemDisk,
    /// User disks only.
    UserDisks,
}

impl FromStr for WipeMode {
    type Err = UnknownVariant;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "all" => WipeMode::All,
            "system-disk" => WipeMode::SystemDisk,
            "user-disks" => WipeMode::UserDisks,
            other => {
                return Err(UnknownVariant {
                    what: "wipe mode",
                    word: other.to_string(),
                    expected: "all, system-disk or user-disks",
                });
            }
        })
    }
}

/// A reset request. `Default` is talosctl's default: graceful, reboot,
/// wipe everything.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ResetRequest {
    /// Leave etcd (and drain) before wiping.
    pub graceful: bool,
    /// Reboot afterwards; `false` powers the node off.
    pub reboot: bool,
    /// Wipe only these system volumes (STATE, EPHEMERAL, META, ...).
    pub system_labels_to_wipe: Vec<String>,
    /// User disks to wipe, by device path.
    pub user_disks_to_wipe: Vec<String>,
    /// Which disks to wipe.
    pub mode: WipeMode,
}

impl Default for ResetRequest {
    fn default() -> Self {
        ResetRequest {
            graceful: true,
            reboot: false,
            system_labels_to_wipe: Vec::new(),
            user_disks_to_wipe: Vec::new(),
            mode: WipeMode::All,
        }
    }
}

impl ResetRequest {
    /// Whether to leave etcd (and drain) before wiping.
    pub fn with_graceful(mut self, graceful: bool) -> Self {
        self.graceful = graceful;
        self
    }

    /// Whether to reboot afterwards; `false` powers the node off.
    pub fn with_reboot(mut self, reboot: bool) -> Self {
        self.reboot = reboot;
        self
    }

    /// Wipes only these system volumes (STATE, EPHEMERAL, META, ...).
    pub fn with_system_labels_to_wipe(mut self, labels: Vec<String>) -> Self {
        self.system_labels_to_wipe = labels;
        self
    }

    /// Wipes these user disks, by device path.
    pub fn with_user_disks_to_wipe(mut self, disks: Vec<String>) -> Self {
        self.user_disks_to_wipe = disks;
        self
    }

    /// Which disks to wipe.
    pub fn with_mode(mut self, mode: WipeMode) -> Self {
        self.mode = mode;
        self
    }
}

/// How a node reboots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RebootMode {
    /// Normal reboot (kexec when enabled).
    #[default]
    Default,
    /// Full power cycle.
    Powercycle,
    /// Skip the graceful shutdown steps.
    Force,
}

impl<S: Scope> Client<S> {
    /// Applies a machine configuration.
    pub async fn apply_configuration(
        &self,
        request: ApplyRequest,
    ) -> Result<S::Output<ApplyResult>> {
        let wire = machine::ApplyConfigurationRequest {
            data: request.config,
            mode: request.mode.to_wire() as i32,
            dry_run: request.dry_run,
            try_mode_timeout: request
                .try_timeout
                .and_then(|d| prost_types::Duration::try_from(d).ok()),
        };
        self.unary(
            Idempotency::Mutation,
            |t| {
                let wire = wire.clone();
                async move { machine_stub(t).apply_configuration(wire).await }
            },
            |m: machine::ApplyConfiguration| {
                Ok(ApplyResult {
                    mode: ApplyMode::from_wire(m.mode),
                    mode_details: m.mode_details,
                    warnings: m.warnings,
                })
            },
        )
        .await
    }

    /// Resets (wipes) the node. Returns the actor id of the reset.
    pub async fn reset(&self, request: ResetRequest) -> Result<S::Output<String>> {
        use machine::reset_request::WipeMode as Wire;
        let wire = machine::ResetRequest {
            graceful: request.graceful,
            reboot: request.reboot,
            system_partitions_to_wipe: request
                .system_labels_to_wipe
                .into_iter()
                .map(|label| machine::ResetPartitionSpec { label, wipe: true })
                .collect(),
            user_disks_to_wipe: request.user_disks_to_wipe,
            mode: match request.mode {
                WipeMode::All => Wire::All,
                WipeMode::SystemDisk => Wire::SystemDisk,
                WipeMode::UserDisks => Wire::UserDisks,
            } as i32,
        };
        self.unary(
            Idempotency::Mutation,
            |t| {
                let wire = wire.clone();
                async move { machine_stub(t).reset(wire).await }
            },
            |m: machine::Reset| Ok(m.actor_id),
        )
        .await
    }

    /// Reboots the node. Returns the actor id.
    pub async fn reboot(&self, mode: RebootMode) -> Result<S::Output<String>> {
        use machine::reboot_request::Mode;
        let mode = match mode {
            RebootMode::Default => Mode::Default,
            RebootMode::Powercycle => Mode::Powercycle,
            RebootMode::Force => Mode::Force,
        } as i32;
        self.unary(
            Idempotency::Mutation,
            |t| async move {
                machine_stub(t)
                    .reboot(machine::RebootRequest { mode })
                    .await
            },
            |m: machine::Reboot| Ok(m.actor_id),
        )
        .await
    }

    /// Shuts the node down. Returns the actor id.
    pub async fn shutdown(&self, force: bool) -> Result<S::Output<String>> {
        self.unary(
            Idempotency::Mutation,
            |t| async move {
                machine_stub(t)
                    .shutdown(machine::ShutdownRequest { force })
                    .await
            },
            |m: machine::Shutdown| Ok(m.actor_id),
        )
        .await
    }
}
