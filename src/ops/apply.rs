//! `apply -n NODE[,NODE...] -f FILE`: the seeds' trial-mode change, done
//! safely. The preflight reads each node's configuration, shows the changed
//! paths and the server's dry run, and refuses what the guards forbid; then
//! each node in turn gets the file in TRY mode, a health gate within the try
//! window, and a confirmation, or nothing more and a verified rollback.
//!
//! Every dry run is sent in TRY mode: Talos 1.13.9 cancels a pending TRY
//! rollback on any other request, dry runs included (talos#14343), and a
//! TRY dry run is what can tell the running configuration apart from the
//! persisted one without touching either.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use sha2::Digest as _;

use super::config_diff::{Documents, covered, string_at};
use super::{OpKind, Ops, OpsError, Plan, PlannedStep};
use crate::client::{ApplyMode, ApplyRequest};
use crate::{Client, Error};

/// Where a node keeps its persisted machine configuration.
pub(crate) const CONFIG_PATH: &str = "/system/state/config.yaml";

/// Options of [`Ops::plan_apply`].
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// The nodes, applied one at a time in this order.
    pub nodes: Vec<String>,
    /// The configuration file (named in messages; read again on resume).
    pub config_path: PathBuf,
    /// Its contents.
    pub config: Vec<u8>,
    /// Paths that may change (`cluster.controlPlane.endpoint`,
    /// `Layer2VIPConfig`, ...); empty: any. A changed path outside them
    /// refuses.
    pub expect_change: Vec<String>,
    /// Allow a change of the service-account issuer (by default refused:
    /// it breaks every token issued so far).
    pub allow_issuer_change: bool,
    /// Allow a change that needs a reboot (applied in REBOOT mode, with no
    /// automatic rollback).
    pub allow_reboot: bool,
    /// The TRY window: the node rolls back after it unless confirmed.
    pub try_timeout: Duration,
    /// How long a node may take to come back from a reboot.
    pub reboot_timeout: Duration,
    /// A command run by `sh -c` that must exit 0 for the gate to pass.
    pub check: Option<String>,
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

/// Reads the configuration file named in an operation's `params` again and
/// checks it is the one planned with (the journal keeps its path and hash,
/// never its contents: a machine configuration holds keys).
pub(crate) fn load_planned_file(params: &serde_json::Value) -> Result<Vec<u8>, OpsError> {
    let path = params["config_path"].as_str().unwrap_or_default();
    let config = std::fs::read(path).map_err(|source| OpsError::Io {
        path: path.into(),
        source,
    })?;
    if params["config_sha256"].as_str() != Some(sha256_hex(&config).as_str()) {
        return Err(OpsError::Refused(format!(
            "{path} changed since the operation was planned: put the planned file back, or abandon the operation"
        )));
    }
    Ok(config)
}

/// Reads a node's persisted configuration.
pub(crate) async fn read_config(client: &Client, node: &str) -> Result<Vec<u8>, Error> {
    let mut stream = client.node(node).read(CONFIG_PATH).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next_chunk().await? {
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A dry run in TRY mode, which never cancels a pending rollback.
pub(crate) async fn try_dry_run(
    client: &Client,
    node: &str,
    config: &[u8],
) -> Result<DryRun, Error> {
    let request = ApplyRequest::new(config.to_vec(), ApplyMode::Try).with_dry_run(true);
    match client.node(node).apply_configuration(request).await {
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

/// The service-account issuer a configuration gives the API server: a
/// pinned one (a `KubeServiceAccountConfig` document's `issuer.issuerURL`,
/// or `cluster.apiServer.extraArgs.service-account-issuer`), else the
/// control-plane endpoint, which Talos uses by default
/// (internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go).
fn issuer(docs: &Documents) -> (Option<String>, bool) {
    if let Some(url) = docs
        .of_kind("KubeServiceAccountConfig")
        .and_then(|d| string_at(d, &["issuer", "issuerURL"]))
    {
        return (Some(url.to_string()), true);
    }
    let extra = docs
        .v1alpha1()
        .get("cluster")
        .and_then(|c| c.get("apiServer"))
        .and_then(|a| a.get("extraArgs"))
        .and_then(|e| e.get("service-account-issuer"));
    let pinned = match extra {
        Some(serde_norway::Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(serde_norway::Value::Sequence(list)) => {
            list.first().and_then(|v| v.as_str()).map(str::to_string)
        }
        _ => None,
    };
    if pinned.is_some() {
        return (pinned, true);
    }
    (
        string_at(docs.v1alpha1(), &["cluster", "controlPlane", "endpoint"]).map(str::to_string),
        false,
    )
}

impl Ops {
    /// Preflight of an apply: for each node, reads its configuration and
    /// dry-runs the file (in TRY mode), then refuses, changing nothing, when
    /// a changed path is outside `expect_change`, the service-account issuer
    /// would change without `allow_issuer_change`, or the change needs a
    /// reboot without `allow_reboot`. The plan's notes carry each node's
    /// changed paths and the server's dry run.
    pub async fn plan_apply(&self, options: &ApplyOptions) -> Result<Plan, OpsError> {
        let file = options.config_path.display().to_string();
        if options.nodes.is_empty() {
            return Err(OpsError::Refused(
                "no node to apply to: pass --nodes (-n)".into(),
            ));
        }
        let new = Documents::parse(&options.config)
            .map_err(|e| OpsError::Refused(format!("{file}: {e}")))?;
        let mut steps = Vec::new();
        let mut notes = Vec::new();
        let mut changes = serde_json::Map::new();
        let mut reboot = serde_json::Map::new();
        for node in &options.nodes {
            let current = read_config(&self.client, node).await?;
            let current = Documents::parse(&current).map_err(|e| {
                OpsError::Refused(format!("{node}: its configuration does not parse: {e}"))
            })?;
            let paths = current.changed_paths(&new);
            self.guard_paths(node, &file, &paths, options)?;
            guard_issuer(node, &current, &new, options.allow_issuer_change)?;
            let needs_reboot = match try_dry_run(&self.client, node, &options.config).await {
                Ok(DryRun::InPlace(summary)) => {
                    if paths.is_empty() && no_changes(&summary) {
                        notes.push(format!("{node} already runs {file}: nothing to apply"));
                        continue;
                    }
                    notes.push(format!("{node}: dry run:\n{summary}"));
                    false
                }
                Ok(DryRun::NeedsReboot(reason)) if options.allow_reboot => {
                    notes.push(format!(
                        "{node}: the change needs a reboot (--allow-reboot): no automatic rollback\n{reason}"
                    ));
                    true
                }
                Ok(DryRun::NeedsReboot(reason)) => {
                    return Err(OpsError::Refused(format!(
                        "{node}: {file} cannot be applied without a reboot, so it cannot be tried and rolled back; pass --allow-reboot to apply it with a reboot and no automatic rollback. The node says: {reason}"
                    )));
                }
                Err(Error::InvalidArgument(f)) => {
                    return Err(OpsError::Refused(format!(
                        "{node} rejects {file}: {}",
                        f.message
                    )));
                }
                Err(e) => return Err(e.into()),
            };
            notes.push(format!(
                "{node}: changed paths: {}",
                if paths.is_empty() {
                    "none (formatting only)".to_string()
                } else {
                    paths.join(", ")
                }
            ));
            changes.insert(node.clone(), json!(paths));
            reboot.insert(node.clone(), json!(needs_reboot));
            steps.extend(node_steps(node, &file, needs_reboot, options));
        }
        Ok(Plan {
            kind: OpKind::Apply,
            params: json!({
                "nodes": options.nodes,
                "config_path": options.config_path,
                "config_sha256": sha256_hex(&options.config),
                "expect_change": options.expect_change,
                "allow_issuer_change": options.allow_issuer_change,
                "allow_reboot": options.allow_reboot,
                "try_timeout_ms": options.try_timeout.as_millis() as u64,
                "reboot_timeout_s": options.reboot_timeout.as_secs(),
                "check": options.check,
            }),
            steps,
            notes,
            facts: {
                let mut facts = serde_json::Map::new();
                facts.insert("changes".into(), changes.into());
                facts.insert("reboot".into(), reboot.into());
                facts
            },
        })
    }

    fn guard_paths(
        &self,
        node: &str,
        file: &str,
        paths: &[String],
        options: &ApplyOptions,
    ) -> Result<(), OpsError> {
        if options.expect_change.is_empty() {
            return Ok(());
        }
        let unexpected: Vec<&str> = paths
            .iter()
            .filter(|p| !options.expect_change.iter().any(|e| covered(p, e)))
            .map(String::as_str)
            .collect();
        if unexpected.is_empty() {
            return Ok(());
        }
        Err(OpsError::Refused(format!(
            "{node}: {file} changes {}, outside --expect-change {}: stop and find out why before applying",
            unexpected.join(", "),
            options.expect_change.join(", ")
        )))
    }
}

/// Refuses a change of the service-account issuer: every token issued with
/// the old one is rejected until renewed (the seeds' first surprise).
fn guard_issuer(
    node: &str,
    current: &Documents,
    new: &Documents,
    allowed: bool,
) -> Result<(), OpsError> {
    let (old_issuer, _) = issuer(current);
    let (new_issuer, pinned) = issuer(new);
    if allowed || old_issuer == new_issuer {
        return Ok(());
    }
    let old = old_issuer.unwrap_or_else(|| "(none)".into());
    let new_value = new_issuer.unwrap_or_else(|| "(none)".into());
    let cause = if pinned {
        format!("the service-account issuer changes from {old} to {new_value}")
    } else {
        format!(
            "cluster.controlPlane.endpoint changes to {new_value} while the service-account issuer is not pinned, so the issuer changes from {old} to {new_value}"
        )
    };
    Err(OpsError::Refused(format!(
        "{node}: {cause}: every service-account token issued so far (the projected tokens of pods such as CoreDNS, the CNI agents and operators, and tokens held outside the cluster) is rejected as Unauthorized until it is renewed. Pin the issuer to {old} (a KubeServiceAccountConfig document with issuer.issuerURL: {old}, or cluster.apiServer.extraArgs.service-account-issuer) or pass --allow-issuer-change"
    )))
}

fn node_steps(node: &str, file: &str, reboot: bool, options: &ApplyOptions) -> Vec<PlannedStep> {
    let step = |name: &str, description: String, destructive: bool| PlannedStep {
        name: format!("{name}:{node}"),
        description,
        destructive,
    };
    let gate = match &options.check {
        Some(cmd) => format!(
            "{node} answers, every etcd member is healthy and the lists agree, {node}'s services are running and healthy, and `{cmd}` exits 0"
        ),
        None => format!(
            "{node} answers, every etcd member is healthy and the lists agree, and {node}'s services are running and healthy"
        ),
    };
    if reboot {
        return vec![
            step(
                "reboot",
                format!(
                    "apply {file} to {node} in REBOOT mode: it reboots into it, with NO automatic rollback"
                ),
                true,
            ),
            step(
                "wait-back",
                format!(
                    "wait up to {} s until {node} has rebooted and {gate}",
                    options.reboot_timeout.as_secs()
                ),
                false,
            ),
        ];
    }
    let window = humantime_like(options.try_timeout);
    vec![
        step(
            "try",
            format!(
                "apply {file} to {node} in TRY mode: it rolls back by itself after {window} unless confirmed"
            ),
            true,
        ),
        step(
            "gate",
            format!(
                "health gate within the try window: {gate}; if it fails, send nothing more and verify the rollback"
            ),
            false,
        ),
        step(
            "confirm",
            format!(
                "apply the same file to {node} in NO_REBOOT mode, ending the try, and check it is persisted"
            ),
            true,
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
