//! `apply -n NODE[,NODE...] -f FILE`: a trial-mode configuration change,
//! done safely. The preflight reads each node's configuration, shows the changed
//! paths and the server's dry run, and refuses what the guards forbid; then
//! each node in turn gets the file in TRY mode, a health gate within the try
//! window, and a confirmation, or nothing more and a verified rollback.
//!
//! Every dry run is sent in TRY mode: Talos 1.13.9 cancels a pending TRY
//! rollback on any other request, dry runs included (talos#14343), and a
//! TRY dry run is what can tell the running configuration apart from the
//! persisted one without touching either.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::config_diff::Documents;
use super::fresh::{Check, CheckKind, PendingTry};
use super::join::read_file;
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo};
use super::spec::millis;
use super::{OpSpec, Ops, OpsError, Refusal};
use crate::client::resources::ConfigId;
use crate::{Client, Error};

fn default_try_timeout() -> Duration {
    ApplyOptions::DEFAULT_TRY_TIMEOUT
}

fn default_vip_check() -> bool {
    ApplyOptions::DEFAULT_VIP_CHECK
}

fn default_kube_check() -> bool {
    ApplyOptions::DEFAULT_KUBE_CHECK
}

fn default_reboot_timeout() -> Duration {
    ApplyOptions::DEFAULT_REBOOT_TIMEOUT
}

/// Options of an apply ([`OpSpec::Apply`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ApplyOptions {
    /// The nodes, applied one at a time in this order.
    pub nodes: Vec<String>,
    /// The configuration file (read at plan time and again, checked against
    /// its hash, by each step that sends it).
    pub config_path: PathBuf,
    /// Paths that may change (`cluster.controlPlane.endpoint`,
    /// `Layer2VIPConfig`, ...); empty: any. A changed path outside them
    /// refuses.
    #[serde(default)]
    pub expect_change: Vec<String>,
    /// The node roles whose API servers may stop accepting a
    /// service-account issuer, audience or key (by default none: it breaks
    /// every token issued so far). Workers are never judged.
    #[serde(default, deserialize_with = "super::sa_validation::roles_or_bool")]
    pub allow_issuer_change: Vec<super::MachineRole>,
    /// Allow a change that needs a reboot (applied in REBOOT mode, with no
    /// automatic rollback).
    #[serde(default)]
    pub allow_reboot: bool,
    /// The TRY window: the node rolls back after it unless confirmed.
    #[serde(
        default = "default_try_timeout",
        with = "millis",
        rename = "try_timeout_ms"
    )]
    pub try_timeout: Duration,
    /// How long a node may take to come back from a reboot.
    #[serde(
        default = "default_reboot_timeout",
        with = "millis",
        rename = "reboot_timeout_ms"
    )]
    pub reboot_timeout: Duration,
    /// A command run by `sh -c` that must exit 0 for the gate to pass.
    #[serde(default)]
    pub check: Option<String>,
    /// When the file changes a `Layer2VIPConfig` document, the gate also
    /// waits until each VIP it declares is held by exactly one control-plane
    /// node (its `AddressStatuses`, read through COSI) and that node answers
    /// the Talos API. On by default ([`ApplyOptions::DEFAULT_VIP_CHECK`]).
    #[serde(default = "default_vip_check")]
    pub vip_check: bool,
    /// On a control-plane node whose Kubernetes API server is ready, mint
    /// a service-account token before the change, and in the gate require
    /// the API server ready again and still accepting that token (so a
    /// change that breaks every token is rolled back even when the
    /// configuration guard was overridden). On by default
    /// ([`ApplyOptions::DEFAULT_KUBE_CHECK`]).
    #[serde(default = "default_kube_check")]
    pub kube_check: bool,
}

impl ApplyOptions {
    /// The TRY window unless told otherwise (Talos's own default is 1m;
    /// ours leaves the gate time to see the cluster settle).
    pub const DEFAULT_TRY_TIMEOUT: Duration = Duration::from_secs(120);
    /// How long a node may take to come back from a reboot, by default.
    pub const DEFAULT_REBOOT_TIMEOUT: Duration = Duration::from_secs(600);
    /// Whether the gate checks the VIPs of a changed `Layer2VIPConfig`
    /// unless told otherwise.
    pub const DEFAULT_VIP_CHECK: bool = true;
    /// Whether the gate asks Kubernetes unless told otherwise.
    pub const DEFAULT_KUBE_CHECK: bool = true;

    /// Apply `config_path` to `nodes` with the defaults: any path may
    /// change, no issuer change, no reboot, no user check.
    pub fn new(nodes: Vec<String>, config_path: PathBuf) -> ApplyOptions {
        ApplyOptions {
            nodes,
            config_path,
            expect_change: Vec::new(),
            allow_issuer_change: Vec::new(),
            allow_reboot: false,
            try_timeout: Self::DEFAULT_TRY_TIMEOUT,
            reboot_timeout: Self::DEFAULT_REBOOT_TIMEOUT,
            check: None,
            vip_check: Self::DEFAULT_VIP_CHECK,
            kube_check: Self::DEFAULT_KUBE_CHECK,
        }
    }
}

/// What a step of an apply does to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyPhase {
    /// Apply in TRY mode.
    Try,
    /// The health gate within the try window.
    Gate,
    /// Confirm with a NO_REBOOT apply.
    Confirm,
    /// Apply in REBOOT mode (allowed reboots only).
    Reboot,
    /// Wait until the node is back and healthy.
    WaitBack,
}

/// A step of an apply: a phase on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyStep {
    /// What it does.
    pub phase: ApplyPhase,
    /// To which node.
    pub node: String,
}

impl StepInfo for ApplyStep {
    fn name(&self) -> &'static str {
        match self.phase {
            ApplyPhase::Try => "try",
            ApplyPhase::Gate => "gate",
            ApplyPhase::Confirm => "confirm",
            ApplyPhase::Reboot => "reboot",
            ApplyPhase::WaitBack => "wait-back",
        }
    }

    fn destructive(&self) -> bool {
        matches!(
            self.phase,
            ApplyPhase::Try | ApplyPhase::Confirm | ApplyPhase::Reboot
        )
    }

    fn node(&self) -> Option<&str> {
        Some(&self.node)
    }

    fn precondition(&self) -> Option<CheckKind> {
        match self.phase {
            ApplyPhase::Try | ApplyPhase::Reboot => Some(CheckKind::ApplyReady),
            ApplyPhase::Confirm => Some(CheckKind::TryPending),
            ApplyPhase::Gate | ApplyPhase::WaitBack => None,
        }
    }
}

impl ApplyStep {
    /// Its precondition with its subject: the node (and, for a
    /// confirmation, the try it confirms).
    pub(crate) fn check(&self, facts: &ApplyFacts) -> Result<Option<Check>, OpsError> {
        let node = &self.node;
        Ok(match self.precondition() {
            Some(CheckKind::TryPending) => Some(Check::TryPending(PendingTry {
                node: node.clone(),
                config_path: facts.config_path.clone(),
                config_sha256: facts.config_sha256.clone(),
                deadline_ms: *super::plan::need(
                    &facts.try_deadline_ms.get(node).copied(),
                    "try_deadline_ms",
                )?,
                boot_id: facts.boot_ids.get(node).cloned(),
            })),
            Some(_) => Some(Check::ApplyReady(node.clone())),
            None => None,
        })
    }
}

/// What an apply's preflight found and its steps recorded, per node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ApplyFacts {
    /// The file (absolute).
    pub config_path: PathBuf,
    /// sha256 of its contents at plan time (hex).
    pub config_sha256: String,
    /// The changed paths, by node.
    pub changes: BTreeMap<String, Vec<String>>,
    /// Whether the node needs a reboot, by node.
    pub reboot: BTreeMap<String, bool>,
    /// When each node's TRY window closes (ms since the epoch).
    #[serde(default)]
    pub try_deadline_ms: BTreeMap<String, u64>,
    /// When each node's reboot was sent (ms since the epoch).
    #[serde(default)]
    pub reboot_sent_ms: BTreeMap<String, u64>,
    /// The Layer-2 VIPs the gate checks, by node: those of the file's
    /// changed `Layer2VIPConfig` documents (with the VIP check on).
    #[serde(default)]
    pub vips: BTreeMap<String, Vec<String>>,
    /// Each node's boot id (`/proc/sys/kernel/random/boot_id`, read from
    /// the node) before its TRY or reboot: a gate pass requires the same
    /// boot, a wait for the reboot a new one. No clock is compared.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub boot_ids: BTreeMap<String, String>,
    /// The Kubernetes check of each node, as found before its change:
    /// `token` (its API server was ready and minted a token, kept in
    /// memory), or why the node has no token check.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_check: BTreeMap<String, String>,
    /// What each node's change stops accepting (service-account issuers,
    /// audiences, keys) that `allow_issuer_change` let through: only the
    /// token minted before the change can show it harmless, so a gate that
    /// lost that token (a crash, a daemon restart) does not confirm it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sa_loss_allowed: BTreeMap<String, Vec<String>>,
    /// The control-plane nodes whose API server's service-account
    /// validation the change alters: their static pod restarts with new
    /// flags, and a gate pass counts only once it has.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub sa_changes: BTreeSet<String>,
    /// When each of those API servers' process started before the TRY
    /// (ms since the epoch, from its metrics): the gate waits for a later
    /// start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_started_ms: BTreeMap<String, u64>,
}

/// What one node's preflight found.
struct NodePreflight {
    /// The changed paths.
    paths: Vec<String>,
    /// Whether the change needs a reboot.
    reboot: bool,
    /// What service-account validation the change drops, allowed by
    /// `allow_issuer_change`.
    allowed_loss: Vec<String>,
    /// Whether the API server's service-account validation changes.
    sa_changes: bool,
}

/// What a TRY dry run said about a node.
pub(crate) enum DryRun {
    /// It can take the file in place; the server's summary.
    InPlace(String),
    /// It needs a reboot; the server's reason.
    NeedsReboot(String),
}

/// The hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reads a configuration file planned with again and checks it is the one
/// planned with (the journal keeps its path and hash, never its contents:
/// a machine configuration holds keys).
pub(crate) fn read_planned(path: &Path, sha256: &str) -> Result<Vec<u8>, OpsError> {
    let config = read_file(path)?;
    if sha256_hex(&config) != sha256 {
        return Err(Refusal::FileChanged {
            path: path.display().to_string(),
        }
        .into());
    }
    Ok(config)
}

/// Reads a node's machine configuration through COSI, as talosctl does
/// (`get mc`): `Active` (`v1alpha1`) is what it runs, a TRY's while one is
/// pending; `Persistent` is what it saved for the next boot. `Read` of
/// `/system/state/config.yaml` cannot serve: Talos no longer mounts STATE
/// since v1.12.0.
pub(crate) async fn read_config(
    client: &Client,
    node: &str,
    which: ConfigId,
) -> Result<Vec<u8>, Error> {
    let config = client.node(node).resources().machine_config(which).await?;
    Ok(config.yaml.into_bytes())
}

/// A dry run in TRY mode, which never cancels a pending rollback.
pub(crate) async fn try_dry_run(
    client: &Client,
    node: &str,
    config: &[u8],
) -> Result<DryRun, Error> {
    match super::send::try_dry_run(client, node, config).await {
        Ok(result) => Ok(DryRun::InPlace(result.mode_details)),
        Err(Error::InvalidArgument(f))
            if f.message.contains("can't be applied in immediate mode") =>
        {
            Ok(DryRun::NeedsReboot(f.message))
        }
        Err(e) => Err(e),
    }
}

/// Whether a dry run's summary says nothing would change.
pub(crate) fn no_changes(summary: &str) -> bool {
    summary.trim_end().ends_with("No changes.")
}

impl Ops {
    /// Preflight of an apply: for each node, reads the configuration it
    /// runs (COSI `MachineConfigs` `v1alpha1`) and
    /// dry-runs the file (in TRY mode), then refuses, changing nothing, when
    /// a changed path is outside `expect_change`, the service-account issuer
    /// would change without `allow_issuer_change`, or the change needs a
    /// reboot without `allow_reboot`. The plan's notes carry each node's
    /// changed paths and the server's dry run.
    pub(super) async fn plan_apply(&self, options: &ApplyOptions) -> Result<Plan, OpsError> {
        if options.nodes.is_empty() {
            return Err(Refusal::NoNodes.into());
        }
        let path = std::path::absolute(&options.config_path)
            .unwrap_or_else(|_| options.config_path.clone());
        let file = path.display().to_string();
        let config = read_file(&path)?;
        let new = Documents::parse(&config).map_err(|e| Refusal::BadConfig {
            file: file.clone(),
            error: e.to_string(),
        })?;
        let mut facts = ApplyFacts {
            config_path: path.clone(),
            config_sha256: sha256_hex(&config),
            ..ApplyFacts::default()
        };
        let mut steps = Vec::new();
        let mut notes = Vec::new();
        if !options.kube_check {
            notes.push(
                "the Kubernetes check is skipped (--skip-kube-check): no token is minted before the change, and the gate does not ask the API servers".into(),
            );
        }
        for node in &options.nodes {
            let Some(NodePreflight {
                paths,
                reboot: needs_reboot,
                allowed_loss,
                sa_changes,
            }) = self
                .preflight_node(node, &file, &config, &new, options, &mut notes)
                .await?
            else {
                continue;
            };
            if !allowed_loss.is_empty() {
                facts.sa_loss_allowed.insert(node.clone(), allowed_loss);
            }
            if sa_changes {
                facts.sa_changes.insert(node.clone());
            }
            notes.push(format!(
                "{node}: changed paths: {}",
                if paths.is_empty() {
                    "none (formatting only)".to_string()
                } else {
                    paths.join(", ")
                }
            ));
            let vips = if options.vip_check {
                changed_vips(&new, &paths)
            } else {
                Vec::new()
            };
            if !vips.is_empty() {
                notes.push(format!(
                    "{node}: the gate waits until {} held by exactly one control-plane node, which answers the Talos API (the VIP check: option vip_check)",
                    vip_list(&vips)
                ));
                facts.vips.insert(node.clone(), vips.clone());
            }
            facts.changes.insert(node.clone(), paths);
            facts.reboot.insert(node.clone(), needs_reboot);
            steps.extend(node_steps(node, &file, needs_reboot, options, &vips));
        }
        let basis = self
            .read_view()
            .await
            .map(|v| v.basis())
            .unwrap_or_default();
        Ok(Plan::new(
            OpSpec::Apply(options.clone()),
            steps,
            notes,
            Facts::Apply(facts),
            &basis,
        ))
    }

    /// One node's preflight, or `None` when it already runs the file;
    /// notes the dry run.
    async fn preflight_node(
        &self,
        node: &str,
        file: &str,
        config: &[u8],
        new: &Documents,
        options: &ApplyOptions,
        notes: &mut Vec<String>,
    ) -> Result<Option<NodePreflight>, OpsError> {
        let current = read_config(&self.client, node, ConfigId::Active).await?;
        let current = Documents::parse(&current).map_err(|e| Refusal::BadConfig {
            file: format!("{node}'s running configuration"),
            error: e.to_string(),
        })?;
        // The saved configuration must be the running one: otherwise a
        // staged or tried change is pending, and this apply would replace
        // it without anyone having seen it.
        match read_config(&self.client, node, ConfigId::Persistent).await {
            Ok(saved) => {
                let saved = Documents::parse(&saved).map_err(|e| Refusal::BadConfig {
                    file: format!("{node}'s saved configuration"),
                    error: e.to_string(),
                })?;
                let paths = current.changed_paths(&saved);
                if !paths.is_empty() {
                    return Err(Refusal::PendingConfig {
                        node: node.into(),
                        paths,
                    }
                    .into());
                }
            }
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let version = self.client.node(node).version().await?.tag;
        let sa = super::sa_validation::IssuerCheck {
            node,
            version: &version,
            role: super::MachineRole::of(&current),
            allowed: &options.allow_issuer_change,
        };
        sa.known(file, new)?;
        let paths = current.changed_paths(new);
        let secrets = super::secret_paths::changed_secrets(&current, new);
        super::secret_paths::guard_paths(node, file, &paths, &secrets, &options.expect_change)?;
        let judged = sa.judge(file, &current, new)?;
        notes.push(judged.note);
        let reboot = match try_dry_run(&self.client, node, config).await {
            Ok(DryRun::InPlace(summary)) => {
                if paths.is_empty() && no_changes(&summary) {
                    notes.push(format!("{node} already runs {file}: nothing to apply"));
                    return Ok(None);
                }
                notes.push(format!(
                    "{node}: dry run:\n{}",
                    super::secret_paths::redact_diff(&summary)
                ));
                false
            }
            Ok(DryRun::NeedsReboot(reason)) if options.allow_reboot => {
                notes.push(format!(
                    "{node}: the change needs a reboot (allowed): no automatic rollback\n{}",
                    super::secret_paths::redact_diff(&reason)
                ));
                true
            }
            Ok(DryRun::NeedsReboot(reason)) => {
                return Err(Refusal::NeedsReboot {
                    node: node.into(),
                    file: file.into(),
                    reason: super::secret_paths::redact_diff(&reason),
                }
                .into());
            }
            Err(Error::InvalidArgument(f)) => {
                return Err(Refusal::NodeRejects {
                    node: node.into(),
                    file: file.into(),
                    message: f.message,
                }
                .into());
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Some(NodePreflight {
            paths,
            reboot,
            allowed_loss: judged.allowed_loss,
            sa_changes: judged.changes,
        }))
    }
}

/// The VIPs of `new`'s `Layer2VIPConfig` documents that `paths` (changed
/// paths, `Layer2VIPConfig[VIP]...`) touch.
fn changed_vips(new: &Documents, paths: &[String]) -> Vec<String> {
    let mut vips: Vec<String> = paths
        .iter()
        .filter_map(|p| p.strip_prefix("Layer2VIPConfig["))
        .filter_map(|rest| rest.split(']').next())
        .filter(|vip| new.get(&format!("Layer2VIPConfig[{vip}]")).is_some())
        .map(str::to_string)
        .collect();
    vips.dedup();
    vips
}

fn vip_list(vips: &[String]) -> String {
    match vips {
        [one] => format!("the VIP {one} is"),
        _ => format!("the VIPs {} are each", vips.join(", ")),
    }
}

fn node_steps(
    node: &str,
    file: &str,
    reboot: bool,
    options: &ApplyOptions,
    vips: &[String],
) -> Vec<PlannedStep> {
    let step = |phase: ApplyPhase, description: String| {
        PlannedStep::new(
            Step::Apply(ApplyStep {
                phase,
                node: node.to_string(),
            }),
            description,
        )
    };
    let mut parts = vec![
        format!("{node} answers"),
        "every etcd member is healthy and the lists agree".to_string(),
        format!("{node}'s services are running and healthy"),
    ];
    if !vips.is_empty() {
        parts.push(format!(
            "{} held by exactly one control-plane node, which answers",
            vip_list(vips)
        ));
    }
    if let Some(cmd) = &options.check {
        parts.push(format!("`{cmd}` exits 0"));
    }
    if options.kube_check && !reboot {
        parts.push(format!(
            "(when {node}'s Kubernetes API server is ready before the change) it is ready again and still accepts a service-account token minted before the change"
        ));
    }
    let last = parts.pop().unwrap_or_default();
    let gate = format!("{}, and {last}", parts.join(", "));
    if reboot {
        return vec![
            step(
                ApplyPhase::Reboot,
                format!(
                    "apply {file} to {node} in REBOOT mode: it reboots into it, with NO automatic rollback"
                ),
            ),
            step(
                ApplyPhase::WaitBack,
                format!(
                    "wait up to {} s until {node} has rebooted and {gate}",
                    options.reboot_timeout.as_secs()
                ),
            ),
        ];
    }
    let window = humantime_like(options.try_timeout);
    vec![
        step(
            ApplyPhase::Try,
            format!(
                "apply {file} to {node} in TRY mode: it rolls back by itself after {window} unless confirmed"
            ),
        ),
        step(
            ApplyPhase::Gate,
            format!(
                "health gate within the try window: {gate}; if it fails, send nothing more and verify the rollback"
            ),
        ),
        step(
            ApplyPhase::Confirm,
            format!(
                "apply the same file to {node} in NO_REBOOT mode, ending the try, and check it is persisted"
            ),
        ),
    ]
}

/// `2m0s`-style, as talosctl prints durations.
pub(crate) fn humantime_like(d: Duration) -> String {
    let secs = d.as_secs();
    let millis = d.subsec_millis();
    match (secs / 60, secs % 60) {
        (0, s) if millis == 0 => format!("{s}s"),
        (0, s) => {
            let text = format!("{s}.{millis:03}");
            format!("{}s", text.trim_end_matches('0'))
        }
        (m, s) => format!("{m}m{s}s"),
    }
}
