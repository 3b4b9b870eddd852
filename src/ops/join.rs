//! `join NODE`: wait until a new control-plane node is a voting etcd member
//! (its learner promoted), its etcd service is healthy, and every member is
//! healthy. With a configuration it first applies it to NODE in maintenance
//! mode (what `talosctl apply-config --insecure` does by hand), which makes NODE join.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::apply::{read_planned, sha256_hex};
use super::cluster::{ClusterView, host_of, names};
use super::fresh::{Check, CheckKind, Guard};
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo, need};
use super::policy::unhealthy_voters;
use super::spec::millis;
use super::{OpSpec, Ops, OpsError, Outcome, Refusal};
use crate::client::{ApplyMode, ApplyRequest};
use crate::maintenance::MaintenanceClient;

fn default_join_timeout() -> Duration {
    JoinOptions::DEFAULT_TIMEOUT
}

/// Options of a join ([`OpSpec::Join`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JoinOptions {
    /// The new node: hostname or address (`host:port` for a maintenance
    /// node on another port).
    pub node: String,
    /// How long to wait.
    #[serde(
        default = "default_join_timeout",
        with = "millis",
        rename = "timeout_ms"
    )]
    pub timeout: Duration,
    /// A configuration to apply to NODE in maintenance mode first.
    #[serde(default)]
    pub maintenance: Option<MaintenanceApply>,
}

impl JoinOptions {
    /// How long a new node may take to become a healthy voter, by default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

    /// Wait for `node` with the default timeout, applying nothing.
    pub fn new(node: impl Into<String>) -> JoinOptions {
        JoinOptions {
            node: node.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            maintenance: None,
        }
    }
}

/// A control-plane configuration for a node in maintenance mode, where the
/// node has no certificate from the cluster's CA: it is pinned by SPKI
/// fingerprint, or explicitly not verified. The file is read at plan time
/// and again (checked against its hash) when applied; the journal keeps
/// its path and hash, never its contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MaintenanceApply {
    /// The file.
    pub config_path: PathBuf,
    /// SPKI fingerprints the node's certificate must match.
    #[serde(default)]
    pub cert_fingerprints: Vec<String>,
    /// The node is NOT verified (talosctl's bare `--insecure`).
    #[serde(default)]
    pub insecure: bool,
}

impl MaintenanceApply {
    /// `path`, with the node's certificate pinned to `fingerprints`.
    pub fn pinned(path: impl Into<PathBuf>, fingerprints: Vec<String>) -> MaintenanceApply {
        MaintenanceApply {
            config_path: path.into(),
            cert_fingerprints: fingerprints,
            insecure: false,
        }
    }

    /// `path`, with the node not verified at all.
    pub fn insecure(path: impl Into<PathBuf>) -> MaintenanceApply {
        MaintenanceApply {
            config_path: path.into(),
            cert_fingerprints: Vec::new(),
            insecure: true,
        }
    }

    /// Refuses neither pinned nor explicitly insecure, or both.
    fn check(&self) -> Result<(), Refusal> {
        match (self.cert_fingerprints.is_empty(), self.insecure) {
            (true, false) => Err(Refusal::MaintenanceUnverified {
                file: self.config_path.display().to_string(),
            }),
            (false, true) => Err(Refusal::PinsAndInsecure),
            _ => Ok(()),
        }
    }
}

/// The steps of a join (and of a migration's join half).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JoinStep {
    /// Apply the configuration to the node in maintenance mode.
    ApplyConfig,
    /// Wait until it is a healthy voter.
    WaitVoter,
}

impl StepInfo for JoinStep {
    fn name(&self) -> &'static str {
        match self {
            JoinStep::ApplyConfig => "apply-config",
            JoinStep::WaitVoter => "wait-voter",
        }
    }

    fn destructive(&self) -> bool {
        matches!(self, JoinStep::ApplyConfig)
    }

    fn precondition(&self) -> Option<CheckKind> {
        matches!(self, JoinStep::ApplyConfig).then_some(CheckKind::InMaintenance)
    }
}

impl JoinStep {
    /// Its precondition with its subject: the node as planned, with its
    /// certificate pins.
    pub(crate) fn check(self, facts: &JoinFacts) -> Result<Option<Check>, OpsError> {
        if self.precondition().is_none() {
            return Ok(None);
        }
        let m = need(&facts.maintenance, "maintenance")?;
        Ok(Some(Check::InMaintenance {
            node: facts.node.clone(),
            pins: m.cert_fingerprints.clone(),
        }))
    }
}

/// The maintenance apply as planned: the file's path and hash, the pins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PlannedMaintenance {
    /// The file (absolute).
    pub config_path: PathBuf,
    /// sha256 of its contents at plan time (hex).
    pub config_sha256: String,
    /// The pins (empty: not verified).
    pub cert_fingerprints: Vec<String>,
}

/// What a join's preflight found and its steps recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JoinFacts {
    /// The node as given.
    pub node: String,
    /// How long to wait.
    #[serde(with = "millis", rename = "timeout_ms")]
    pub timeout: Duration,
    /// The maintenance apply, when there is one.
    pub maintenance: Option<PlannedMaintenance>,
    /// Seconds until it was a healthy voter.
    pub join_seconds: Option<f64>,
}

impl JoinFacts {
    /// The steps for these facts.
    pub(crate) fn steps(&self) -> Vec<JoinStep> {
        match self.maintenance {
            Some(_) => vec![JoinStep::ApplyConfig, JoinStep::WaitVoter],
            None => vec![JoinStep::WaitVoter],
        }
    }
}

impl JoinStep {
    /// What the step does, in the cluster's terms.
    pub(crate) fn describe(self, f: &JoinFacts) -> String {
        let node = &f.node;
        match (self, &f.maintenance) {
            (JoinStep::ApplyConfig, Some(m)) => {
                let verified = if m.cert_fingerprints.is_empty() {
                    "its certificate NOT verified".to_string()
                } else {
                    format!(
                        "its certificate pinned to {}",
                        m.cert_fingerprints.join(", ")
                    )
                };
                format!(
                    "apply {} to {node} in maintenance mode, {verified}: it boots configured and joins etcd as a learner",
                    m.config_path.display()
                )
            }
            (JoinStep::ApplyConfig, None) => format!("apply nothing to {node}"),
            (JoinStep::WaitVoter, _) => format!(
                "wait up to {} s until {node} is a voting member and every member is healthy",
                f.timeout.as_secs()
            ),
        }
    }
}

pub(super) fn maintenance_client(
    node: &str,
    pins: &[String],
) -> Result<MaintenanceClient, crate::Error> {
    if pins.is_empty() {
        MaintenanceClient::dangerous_unverified(node)
    } else {
        let pins: Vec<&str> = pins.iter().map(String::as_str).collect();
        MaintenanceClient::pinned(node, &pins)
    }
}

/// Notes when `count` members make an even count.
pub(crate) fn even_note(node: &str, count: usize) -> Option<String> {
    count.is_multiple_of(2).then(|| {
        format!(
            "with {node} the cluster has {count} members, an even count: it survives no more failures than {}",
            count - 1
        )
    })
}

impl Ops {
    /// Plans the wait; notes when the join makes the member count even (an
    /// even count survives no more failures than one fewer).
    pub(super) async fn plan_join(&self, options: &JoinOptions) -> Result<Plan, OpsError> {
        let view = self.read_view().await?;
        let after = view.members.len() + usize::from(view.find(&options.node).is_none());
        let notes = even_note(&options.node, after).into_iter().collect();
        let facts = self
            .join_facts(
                &view,
                &options.node,
                options.timeout,
                options.maintenance.as_ref(),
            )
            .await?;
        let steps = facts
            .steps()
            .into_iter()
            .map(|s| PlannedStep::new(Step::Join(s), s.describe(&facts)))
            .collect();
        Ok(Plan::new(
            OpSpec::Join(options.clone()),
            steps,
            notes,
            Facts::Join(facts),
            &view.basis(),
        ))
    }

    /// The join half's facts: with a configuration, refuses unless NODE
    /// answers in maintenance mode, is no member yet and the file parses.
    pub(super) async fn join_facts(
        &self,
        view: &ClusterView,
        node: &str,
        timeout: Duration,
        maintenance: Option<&MaintenanceApply>,
    ) -> Result<JoinFacts, OpsError> {
        let planned = match maintenance {
            Some(m) => Some(self.preflight_maintenance(view, node, m).await?),
            None => None,
        };
        Ok(JoinFacts {
            node: node.to_string(),
            timeout,
            maintenance: planned,
            join_seconds: None,
        })
    }

    async fn preflight_maintenance(
        &self,
        view: &ClusterView,
        node: &str,
        m: &MaintenanceApply,
    ) -> Result<PlannedMaintenance, OpsError> {
        m.check()?;
        let path = std::path::absolute(&m.config_path).unwrap_or_else(|_| m.config_path.clone());
        let file = path.display().to_string();
        if let Some(member) = view.find(node) {
            return Err(Refusal::AlreadyMember {
                node: node.into(),
                member_id: member.id.to_string(),
                hostname: member.hostname.clone(),
            }
            .into());
        }
        let config = read_file(&path)?;
        super::config_diff::Documents::parse(&config).map_err(|e| Refusal::BadConfig {
            file: file.clone(),
            error: e.to_string(),
        })?;
        let client = maintenance_client(node, &m.cert_fingerprints)?;
        client
            .version()
            .await
            .map_err(|e| Refusal::NotInMaintenance {
                node: node.into(),
                error: e.to_string(),
            })?;
        Ok(PlannedMaintenance {
            config_path: path,
            config_sha256: sha256_hex(&config),
            cert_fingerprints: m.cert_fingerprints.clone(),
        })
    }

    /// Applies the planned file to the maintenance node.
    async fn apply_in_maintenance(
        &self,
        facts: &JoinFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let m = need(&facts.maintenance, "maintenance")?;
        let config = read_planned(&m.config_path, &m.config_sha256)?;
        let node = &facts.node;
        let client = maintenance_client(node, &m.cert_fingerprints)?;
        let fresh = guard.proof(self).await?;
        let result = self
            .send_maintenance_apply(fresh, &client, ApplyRequest::new(config, ApplyMode::Auto))
            .await?;
        Ok(Outcome::done(format!(
            "{node}: {}",
            result.mode_details.replace('\n', "; ")
        )))
    }

    /// An apply in maintenance mode in flight at a crash is done when the
    /// node is an etcd member or answers with the cluster's certificate.
    pub(super) async fn reconcile_join(
        &self,
        step: JoinStep,
        facts: &JoinFacts,
    ) -> Result<Option<Outcome>, OpsError> {
        if step != JoinStep::ApplyConfig {
            return Ok(None);
        }
        let node = &facts.node;
        let member = self.read_view().await.is_ok_and(|v| v.find(node).is_some());
        let configured = self.client.node(host_of(node)).version().await.is_ok();
        Ok((member || configured)
            .then(|| Outcome::done(format!("reconciled: {node} had taken the configuration"))))
    }

    pub(super) async fn join_step(
        &mut self,
        step: JoinStep,
        facts: &mut JoinFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        match step {
            JoinStep::ApplyConfig => self.apply_in_maintenance(facts, guard).await,
            JoinStep::WaitVoter => self.wait_voter(facts).await,
        }
    }

    async fn wait_voter(&self, facts: &mut JoinFacts) -> Result<Outcome, OpsError> {
        let node = facts.node.clone();
        let started = Instant::now();
        let mut last;
        loop {
            last = match self.read_view().await {
                Ok(view) => match view.find(&node) {
                    None => format!(
                        "{node} is not a member yet ({})",
                        names(&view.members).join(", ")
                    ),
                    Some(m) if m.is_learner => format!("{node} is still a learner"),
                    Some(m) => {
                        let unhealthy = unhealthy_voters(&view, None);
                        let service = if unhealthy.is_empty() && view.disagreements.is_empty() {
                            etcd_service_problem(&self.client, m).await
                        } else {
                            None
                        };
                        if let Some(problem) = service {
                            problem
                        } else {
                            if unhealthy.is_empty() && view.disagreements.is_empty() {
                                let took = started.elapsed().as_secs_f64();
                                facts.join_seconds = Some(took);
                                let count = view.members.len();
                                let even = if count % 2 == 0 {
                                    " (an even count)"
                                } else {
                                    ""
                                };
                                return Ok(Outcome::done(format!(
                                    "{node} is a healthy voter after {took:.1} s; {count} members{even}"
                                )));
                            }
                            format!(
                                "unhealthy: {} {}",
                                unhealthy.join(", "),
                                view.disagreements.join("; ")
                            )
                        }
                    }
                },
                Err(e) => e.to_string(),
            };
            if started.elapsed() > facts.timeout {
                return Err(OpsError::step("wait-voter", format!("timed out: {last}")));
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Why the etcd service of the new member `m` is not healthy yet, if it is
/// not: a promoted member's service stays unhealthy until Talos's next
/// health check, and until then the node has no local member for leave or
/// forfeit (Talos's EtcdMembers resource needs a healthy service).
async fn etcd_service_problem(
    client: &crate::Client,
    m: &crate::client::EtcdMember,
) -> Option<String> {
    let address = super::cluster::member_address(m)?;
    let name = &m.hostname;
    match client.node(address.as_str()).service_list().await {
        Ok(services) => match services.iter().find(|s| s.id == "etcd") {
            Some(s) if s.health.healthy => None,
            Some(_) => Some(format!("{name}'s etcd service is not healthy yet")),
            None => Some(format!("{name} lists no etcd service")),
        },
        Err(e) => Some(format!("{name}'s services: {e}")),
    }
}

/// Reads a file named in an operation, the error naming it.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, OpsError> {
    std::fs::read(path).map_err(|source| OpsError::Io {
        path: path.to_owned(),
        source,
    })
}
