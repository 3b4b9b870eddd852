//! `restore`: brings back a cluster that lost etcd's quorum from a verified
//! snapshot, as talosctl's `bootstrap --recover-from` does (EtcdRecover
//! uploads the snapshot, then Bootstrap with `recover_etcd` starts a new
//! one-member etcd from it; the other control-plane nodes, waiting to join
//! since their etcd data was wiped, join it).
//!
//! A restore on a live cluster throws away everything written since the
//! snapshot, so the preflight refuses while any member's etcd answers with
//! a leader, and on a node that still runs etcd. The snapshot is verified
//! before anything is sent and again right before the upload (the file
//! must be the one planned). Afterwards a verified snapshot taken from the
//! restored member proves the data is there: its revision is at least the
//! snapshot's, and the result says how many keys each holds.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo};
use super::{OpSpec, Ops, OpsError, Outcome, Refusal};

/// Options of a restore ([`OpSpec::Restore`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RestoreOptions {
    /// The snapshot file (as `ops snapshot` or `etcd snapshot` saved it).
    pub from: PathBuf,
    /// The control-plane node to restore onto (address or name).
    pub node: String,
    /// How long the other control-plane nodes may take to rejoin as voters.
    #[serde(with = "super::spec::millis")]
    pub rejoin_timeout: Duration,
}

impl RestoreOptions {
    /// The default wait for the other nodes: 10 minutes (Talos retries a
    /// join every few seconds for up to 30).
    pub const DEFAULT_REJOIN_TIMEOUT: Duration = Duration::from_secs(600);

    /// A restore of `from` onto `node`.
    pub fn new(from: impl Into<PathBuf>, node: impl Into<String>) -> RestoreOptions {
        RestoreOptions {
            from: from.into(),
            node: node.into(),
            rejoin_timeout: RestoreOptions::DEFAULT_REJOIN_TIMEOUT,
        }
    }
}

/// The steps of a restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestoreStep {
    /// The file is still the verified snapshot the plan saw.
    Verify,
    /// EtcdRecover: the snapshot to the node.
    Upload,
    /// Bootstrap with `recover_etcd`: a new etcd from the snapshot.
    Bootstrap,
    /// The restored member answers healthy; a verified snapshot of it has
    /// at least the snapshot's revision.
    Check,
    /// The other control-plane nodes rejoin as voters.
    Rejoin,
}

impl StepInfo for RestoreStep {
    fn name(&self) -> &'static str {
        match self {
            RestoreStep::Verify => "verify",
            RestoreStep::Upload => "upload",
            RestoreStep::Bootstrap => "bootstrap",
            RestoreStep::Check => "check",
            RestoreStep::Rejoin => "rejoin",
        }
    }

    fn destructive(&self) -> bool {
        matches!(self, RestoreStep::Upload | RestoreStep::Bootstrap)
    }

    fn point_of_no_return(&self) -> bool {
        matches!(self, RestoreStep::Bootstrap)
    }
}

/// What a restore's preflight found and its steps recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RestoreFacts {
    /// The snapshot file (absolute).
    pub snapshot: PathBuf,
    /// Its sha256 (hex) when verified at plan time.
    pub sha256: String,
    /// Its revision.
    pub revision: i64,
    /// Its live keys.
    pub total_keys: u64,
    /// The node restored onto (its address).
    pub node: String,
    /// The other control-plane nodes expected to rejoin (addresses).
    pub others: Vec<String>,
    /// The revision and keys a verified snapshot of the restored member
    /// showed.
    #[serde(default)]
    pub restored: Option<(i64, u64)>,
    /// That snapshot.
    #[serde(default)]
    pub proof: Option<PathBuf>,
}

/// How long one "is etcd alive here" question may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the restored member may take to answer healthy.
const START_TIMEOUT: Duration = Duration::from_secs(300);

impl Ops {
    /// Plans a restore: the snapshot verified; no member's etcd answering
    /// with a leader (nodes: the talosconfig's endpoints and the target);
    /// the target answering and running no etcd.
    pub(super) async fn plan_restore(&self, options: &RestoreOptions) -> Result<Plan, OpsError> {
        let snapshot = std::path::absolute(&options.from).unwrap_or_else(|_| options.from.clone());
        let report = crate::snapshot::verify_file(&snapshot).map_err(|e| Refusal::BadSnapshot {
            file: snapshot.display().to_string(),
            error: e.to_string(),
        })?;
        let node = super::cluster::host_of(&options.node).to_string();
        let probe = self.client.with_call_timeout(PROBE_TIMEOUT);
        probe
            .node(node.as_str())
            .version()
            .await
            .map_err(|e| Refusal::RestoreTarget {
                node: node.clone(),
                reason: format!("it does not answer: {e}"),
            })?;
        let mut hosts = self.endpoint_hosts();
        if !hosts.contains(&node) {
            hosts.push(node.clone());
        }
        for host in &hosts {
            if let Ok(status) = probe.node(host.as_str()).etcd_status().await {
                if status.leader.0 != 0 {
                    return Err(Refusal::LiveEtcd {
                        node: host.clone(),
                        leader: status.leader.to_string(),
                    }
                    .into());
                }
                if *host == node {
                    return Err(Refusal::RestoreTarget {
                        node: node.clone(),
                        reason: "its etcd runs: a restore needs a node whose etcd data was wiped (reset with EPHEMERAL)".into(),
                    }
                    .into());
                }
            }
        }
        let facts = RestoreFacts {
            snapshot: snapshot.clone(),
            sha256: report.sha256.clone(),
            revision: report.status.revision,
            total_keys: report.status.total_keys,
            node: node.clone(),
            others: hosts.into_iter().filter(|h| *h != node).collect(),
            restored: None,
            proof: None,
        };
        let step = |s: RestoreStep, text: String| PlannedStep::new(Step::Restore(s), text);
        let steps = vec![
            step(
                RestoreStep::Verify,
                format!(
                    "verify {} again (revision {}, {} keys, sha256 {})",
                    snapshot.display(),
                    facts.revision,
                    facts.total_keys,
                    &facts.sha256[..12]
                ),
            ),
            step(
                RestoreStep::Upload,
                format!("upload it to {node} (EtcdRecover)"),
            ),
            step(
                RestoreStep::Bootstrap,
                format!(
                    "bootstrap etcd on {node} from it (Bootstrap, recover_etcd): a new one-member cluster at revision {}",
                    facts.revision
                ),
            ),
            step(
                RestoreStep::Check,
                format!(
                    "wait until {node}'s etcd answers healthy, then take a verified snapshot of it: revision at least {}",
                    facts.revision
                ),
            ),
            step(
                RestoreStep::Rejoin,
                if facts.others.is_empty() {
                    "no other control-plane endpoint to wait for".into()
                } else {
                    format!(
                        "wait up to {} s until {} rejoin as voters",
                        options.rejoin_timeout.as_secs(),
                        facts.others.join(", ")
                    )
                },
            ),
        ];
        let notes = vec![format!(
            "everything written to etcd after revision {} is lost; the other control-plane nodes must have had their etcd data wiped (reset with EPHEMERAL) to join",
            facts.revision
        )];
        let basis = format!("restore {} {}", facts.sha256, node);
        Ok(Plan::new(
            OpSpec::Restore(options.clone()),
            steps,
            notes,
            Facts::Restore(facts),
            &basis,
        ))
    }

    pub(super) async fn restore_step(
        &self,
        options: &RestoreOptions,
        step: RestoreStep,
        facts: &mut RestoreFacts,
    ) -> Result<Outcome, OpsError> {
        let name = step.name();
        let node = self.client.node(facts.node.as_str());
        match step {
            RestoreStep::Verify => {
                let report = crate::snapshot::verify_file(&facts.snapshot)
                    .map_err(|e| OpsError::step(name, e))?;
                if report.sha256 != facts.sha256 {
                    return Err(OpsError::step(
                        name,
                        format!(
                            "{} changed since the plan (sha256 {}, planned {})",
                            facts.snapshot.display(),
                            report.sha256,
                            facts.sha256
                        ),
                    ));
                }
                Ok(Outcome::done(format!(
                    "revision {}, {} keys",
                    report.status.revision, report.status.total_keys
                )))
            }
            RestoreStep::Upload => {
                let file = tokio::fs::File::open(&facts.snapshot).await.map_err(|e| {
                    OpsError::step(name, format!("{}: {e}", facts.snapshot.display()))
                })?;
                // Read in 1 MiB chunks as they are sent: memory stays flat
                // whatever the snapshot's size. A read error ends the
                // stream short, which the size check below catches.
                let chunks = futures::stream::unfold(Some(file), |file| async move {
                    use tokio::io::AsyncReadExt as _;
                    let mut file = file?;
                    let mut buf = vec![0u8; 1 << 20];
                    match file.read(&mut buf).await {
                        Ok(0) | Err(_) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((bytes::Bytes::from(buf), Some(file)))
                        }
                    }
                });
                node.etcd_recover(chunks).await?;
                Ok(Outcome::done(format!(
                    "{} uploaded to {}",
                    facts.snapshot.display(),
                    facts.node
                )))
            }
            RestoreStep::Bootstrap => {
                node.bootstrap(true, false).await?;
                Ok(Outcome::done(format!(
                    "etcd bootstrapped on {} from the snapshot",
                    facts.node
                )))
            }
            RestoreStep::Check => self.check_restored(facts).await,
            RestoreStep::Rejoin => self.await_rejoin(options, facts).await,
        }
    }

    /// After a crash with the bootstrap in flight: done when the node's
    /// etcd runs.
    pub(super) async fn reconcile_restore(
        &self,
        step: RestoreStep,
        facts: &RestoreFacts,
    ) -> Result<Option<Outcome>, OpsError> {
        if step != RestoreStep::Bootstrap {
            return Ok(None);
        }
        let probe = self.client.with_call_timeout(PROBE_TIMEOUT);
        Ok(probe
            .node(facts.node.as_str())
            .etcd_status()
            .await
            .is_ok()
            .then(|| Outcome::done("reconciled: etcd runs on the node")))
    }

    async fn check_restored(&self, facts: &mut RestoreFacts) -> Result<Outcome, OpsError> {
        let node = self
            .client
            .with_call_timeout(PROBE_TIMEOUT)
            .node(facts.node.as_str());
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match node.etcd_status().await {
                Ok(s) if s.errors.is_empty() && s.leader.0 != 0 => break,
                Ok(_) | Err(_) if Instant::now() > deadline => {
                    return Err(OpsError::step(
                        "check",
                        format!(
                            "{}'s etcd is not healthy {} s after the bootstrap",
                            facts.node,
                            START_TIMEOUT.as_secs()
                        ),
                    ));
                }
                _ => {}
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let dir = self.snapshot_dir(None);
        let (proof, report) = self.take_snapshot(&facts.node, &dir).await?;
        facts.restored = Some((report.status.revision, report.status.total_keys));
        facts.proof = Some(proof.clone());
        if report.status.revision < facts.revision {
            return Err(OpsError::step(
                "check",
                format!(
                    "the restored member is at revision {}, before the snapshot's {}",
                    report.status.revision, facts.revision
                ),
            ));
        }
        Ok(Outcome::done(format!(
            "restored at revision {} with {} keys (the snapshot: revision {}, {} keys); verified snapshot {}",
            report.status.revision,
            report.status.total_keys,
            facts.revision,
            facts.total_keys,
            proof.display()
        )))
    }

    async fn await_rejoin(
        &self,
        options: &RestoreOptions,
        facts: &RestoreFacts,
    ) -> Result<Outcome, OpsError> {
        if facts.others.is_empty() {
            return Ok(Outcome::skipped("no other control-plane endpoint"));
        }
        let node = self
            .client
            .with_call_timeout(PROBE_TIMEOUT)
            .node(facts.node.as_str());
        let deadline = Instant::now() + options.rejoin_timeout;
        loop {
            let missing: Vec<&String> = match node.etcd_member_list(false).await {
                Ok(members) => facts
                    .others
                    .iter()
                    .filter(|host| {
                        !members.iter().any(|m| {
                            !m.is_learner
                                && super::cluster::member_address(m).as_deref()
                                    == Some(host.as_str())
                        })
                    })
                    .collect(),
                Err(_) => facts.others.iter().collect(),
            };
            if missing.is_empty() {
                return Ok(Outcome::done(format!(
                    "{} voters: {} and {}",
                    facts.others.len() + 1,
                    facts.node,
                    facts.others.join(", ")
                )));
            }
            if Instant::now() > deadline {
                return Err(OpsError::step(
                    "rejoin",
                    format!(
                        "{} did not rejoin as voters within {} s: wipe their etcd data (reset with EPHEMERAL) so that they join",
                        missing
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        options.rejoin_timeout.as_secs()
                    ),
                ));
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
