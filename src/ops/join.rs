//! `join NODE`: wait until a new control-plane node is a voting etcd member
//! (its learner promoted) and every member is healthy. With a configuration
//! it first applies it to NODE in maintenance mode (the seeds'
//! `apply-config --insecure`), which makes NODE join.

use std::time::{Duration, Instant};

use std::path::PathBuf;

use serde_json::json;

use super::apply::{load_planned_file, sha256_hex};
use super::cluster::{ClusterView, host_of, names};
use super::{OpKind, Ops, OpsError, Outcome, Plan, PlannedStep, fact};
use crate::client::{ApplyMode, ApplyRequest};
use crate::maintenance::MaintenanceClient;

/// Options of [`Ops::plan_join`].
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// The new node: hostname or address (`host:port` for a maintenance
    /// node on another port).
    pub node: String,
    /// How long to wait.
    pub timeout: Duration,
    /// A configuration to apply to NODE in maintenance mode first.
    pub maintenance: Option<MaintenanceApply>,
}

/// A control-plane configuration for a node in maintenance mode.
#[derive(Debug, Clone)]
pub struct MaintenanceApply {
    /// The file (named in messages; read again on resume).
    pub config_path: PathBuf,
    /// Its contents.
    pub config: Vec<u8>,
    /// SPKI fingerprints the node's certificate must match; empty: the
    /// node is NOT verified (talosctl's bare `--insecure`).
    pub cert_fingerprints: Vec<String>,
}

impl MaintenanceApply {
    /// Reads the configuration at `path` for a maintenance-mode apply. The
    /// node has no certificate from the cluster's CA there, so it is either
    /// pinned by SPKI fingerprint or, with `insecure`, not verified at all;
    /// neither is refused.
    pub fn load(
        path: &std::path::Path,
        cert_fingerprints: Vec<String>,
        insecure: bool,
    ) -> Result<MaintenanceApply, OpsError> {
        if cert_fingerprints.is_empty() && !insecure {
            return Err(OpsError::Refused(format!(
                "{} is applied in maintenance mode, where the node has no certificate from the cluster's CA: pin it with --cert-fingerprint FP (the node prints it) or pass --insecure to skip verification",
                path.display()
            )));
        }
        if !cert_fingerprints.is_empty() && insecure {
            return Err(OpsError::Refused(
                "--insecure and --cert-fingerprint exclude each other".into(),
            ));
        }
        let config = std::fs::read(path).map_err(|source| OpsError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(MaintenanceApply {
            config_path: std::path::absolute(path).unwrap_or_else(|_| path.to_owned()),
            config,
            cert_fingerprints,
        })
    }
}

fn maintenance_client(node: &str, pins: &[String]) -> Result<MaintenanceClient, crate::Error> {
    if pins.is_empty() {
        MaintenanceClient::dangerous_unverified(node)
    } else {
        let pins: Vec<&str> = pins.iter().map(String::as_str).collect();
        MaintenanceClient::pinned(node, &pins)
    }
}

fn pins_of(params: &serde_json::Value) -> Vec<String> {
    params["cert_fingerprints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

impl Ops {
    /// Plans the wait; notes when the join makes the member count even (an
    /// even count survives no more failures than one fewer).
    pub async fn plan_join(&self, options: &JoinOptions) -> Result<Plan, OpsError> {
        let view = ClusterView::read(&self.client).await?;
        let mut notes = Vec::new();
        let after = view.members.len() + usize::from(view.find(&options.node).is_none());
        if after % 2 == 0 {
            notes.push(format!(
                "with {} the cluster has {after} members, an even count: it survives no more failures than {}",
                options.node,
                after - 1
            ));
        }
        let mut steps = Vec::new();
        let mut params = json!({ "node": options.node, "timeout_s": options.timeout.as_secs() });
        if let Some(m) = &options.maintenance {
            steps.push(self.preflight_maintenance(&view, &options.node, m).await?);
            params["config_path"] = json!(m.config_path);
            params["config_sha256"] = json!(sha256_hex(&m.config));
            params["cert_fingerprints"] = json!(m.cert_fingerprints);
        }
        steps.push(PlannedStep {
            name: "wait-voter".into(),
            description: format!(
                "wait up to {} s until {} is a voting member and every member is healthy",
                options.timeout.as_secs(),
                options.node
            ),
            destructive: false,
        });
        let mut facts = serde_json::Map::new();
        facts.insert("node".into(), json!(options.node));
        Ok(Plan {
            kind: OpKind::Join,
            params,
            steps,
            notes,
            facts,
        })
    }

    /// Refuses unless NODE answers in maintenance mode and is no member
    /// yet; returns the apply step.
    pub(super) async fn preflight_maintenance(
        &self,
        view: &ClusterView,
        node: &str,
        m: &MaintenanceApply,
    ) -> Result<PlannedStep, OpsError> {
        let file = m.config_path.display();
        if let Some(member) = view.find(node) {
            return Err(OpsError::Refused(format!(
                "{node} is already etcd member {} ({}): it is not in maintenance mode; drop --config",
                member.id, member.hostname
            )));
        }
        super::config_diff::Documents::parse(&m.config)
            .map_err(|e| OpsError::Refused(format!("{file}: {e}")))?;
        let client = maintenance_client(node, &m.cert_fingerprints)?;
        client.version().await.map_err(|e| {
            OpsError::Refused(format!("{node} does not answer in maintenance mode: {e}"))
        })?;
        let verified = if m.cert_fingerprints.is_empty() {
            "its certificate NOT verified (--insecure)".to_string()
        } else {
            format!(
                "its certificate pinned to {}",
                m.cert_fingerprints.join(", ")
            )
        };
        Ok(PlannedStep {
            name: "apply-config".into(),
            description: format!(
                "apply {file} to {node} in maintenance mode, {verified}: it boots configured and joins etcd as a learner"
            ),
            destructive: true,
        })
    }

    /// Applies the planned file to the maintenance node.
    pub(super) async fn apply_in_maintenance(
        &self,
        facts: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        let params = facts.get("params").cloned().unwrap_or_default();
        let config = load_planned_file(&params)?;
        let node = fact(facts, "node");
        let client = maintenance_client(node, &pins_of(&params))?;
        let result = client
            .apply_configuration(ApplyRequest::new(config, ApplyMode::Auto))
            .await?;
        Ok(Outcome::done(format!(
            "{node}: {}",
            result.mode_details.replace('\n', "; ")
        )))
    }

    /// An apply in maintenance mode in flight at a crash is done when the
    /// node is an etcd member or answers with the cluster's certificate.
    pub(super) async fn reconcile_maintenance_apply(
        &self,
        facts: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<Outcome>, OpsError> {
        let node = fact(facts, "node");
        let member = ClusterView::read(&self.client)
            .await
            .is_ok_and(|v| v.find(node).is_some());
        let configured = self.client.node(host_of(node)).version().await.is_ok();
        Ok((member || configured)
            .then(|| Outcome::done(format!("reconciled: {node} had taken the configuration"))))
    }

    pub(super) async fn join_step(
        &mut self,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        if step == "apply-config" {
            return self.apply_in_maintenance(facts).await;
        }
        if step != "wait-voter" {
            return Err(OpsError::step(step, "unknown step"));
        }
        let node = fact(facts, "node").to_string();
        let timeout = Duration::from_secs(
            facts
                .get("params")
                .and_then(|p| p["timeout_s"].as_u64())
                .unwrap_or(600),
        );
        let started = Instant::now();
        let mut last;
        loop {
            last = match ClusterView::read(&self.client).await {
                Ok(view) => match view.find(&node) {
                    None => format!(
                        "{node} is not a member yet ({})",
                        names(&view.members).join(", ")
                    ),
                    Some(m) if m.is_learner => format!("{node} is still a learner"),
                    Some(_) => {
                        let unhealthy: Vec<_> = view
                            .voters()
                            .filter(|m| !view.healthy(m.id))
                            .map(|m| m.hostname.clone())
                            .collect();
                        if unhealthy.is_empty() && view.disagreements.is_empty() {
                            let took = started.elapsed().as_secs_f64();
                            facts.insert("join_seconds".into(), json!(took));
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
                },
                Err(e) => e.to_string(),
            };
            if started.elapsed() > timeout {
                return Err(OpsError::step("wait-voter", format!("timed out: {last}")));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
