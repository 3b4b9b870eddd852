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

use super::fresh::{Check, CheckKind, Guard};
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo};
use super::{OpSpec, Ops, OpsError, Outcome, Refusal};

/// Options of a restore ([`OpSpec::Restore`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RestoreOptions {
    /// The snapshot file (as `ops snapshot` or `etcd snapshot` saved it),
    /// or a store (feature `backup`): `s3://BUCKET/PREFIX` or a directory
    /// that `ops snapshot --encrypt` wrote to; its newest complete backup
    /// of this cluster, or `key`, fetched, decrypted and verified into the
    /// state directory first.
    pub from: String,
    /// The backup's object key in an off-host store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Files of age identities that decrypt an off-host backup; their
    /// contents are never journaled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identity_files: Vec<PathBuf>,
    /// How the S3 store is reached (addressing, region, endpoint).
    #[serde(flatten)]
    pub s3: super::S3Access,
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
    pub fn new(from: impl Into<String>, node: impl Into<String>) -> RestoreOptions {
        RestoreOptions {
            from: from.into(),
            key: None,
            identity_files: Vec::new(),
            s3: super::S3Access::default(),
            node: node.into(),
            rejoin_timeout: RestoreOptions::DEFAULT_REJOIN_TIMEOUT,
        }
    }

    /// Whether `from` names a store (`s3://...` or a directory) rather
    /// than a snapshot file.
    pub fn from_store(&self) -> bool {
        self.from.starts_with("s3://") || std::path::Path::new(&self.from).is_dir()
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

    fn precondition(&self) -> Option<CheckKind> {
        self.destructive().then_some(CheckKind::QuorumLost)
    }
}

impl RestoreStep {
    /// Its precondition with its subject: the node restored onto, and the
    /// hosts whose etcd must not answer with a leader.
    pub(crate) fn check(self, facts: &RestoreFacts) -> Option<Check> {
        self.precondition()?;
        let mut hosts = vec![facts.node.clone()];
        hosts.extend(facts.others.iter().cloned());
        Some(Check::QuorumLost {
            node: facts.node.clone(),
            hosts,
        })
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
    /// Where the snapshot was fetched from (`s3://BUCKET/PREFIX/KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_from: Option<String>,
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
        let (snapshot, fetched_from, mut notes) = if options.from_store() {
            self.fetch_for_restore(options).await?
        } else {
            let path = PathBuf::from(&options.from);
            (std::path::absolute(&path).unwrap_or(path), None, Vec::new())
        };
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
            fetched_from,
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
        notes.insert(0, format!(
            "everything written to etcd after revision {} is lost; the other control-plane nodes must have had their etcd data wiped (reset with EPHEMERAL) to join",
            facts.revision
        ));
        let basis = format!("restore {} {}", facts.sha256, node);
        Ok(Plan::new(
            OpSpec::Restore(options.clone()),
            steps,
            notes,
            Facts::Restore(facts),
            &basis,
        ))
    }

    /// Fetches an off-host backup for a restore into
    /// `STATE_DIR/restore/` (mode 0600): its object's sha256, age, zstd,
    /// every snapshot check and the sidecar compared, before the plan is
    /// shown. With a recovery kit, the target's secret-encryption key is
    /// compared with the kit's: a restored cluster whose configuration has
    /// another key cannot read its Secrets.
    async fn fetch_for_restore(
        &self,
        options: &RestoreOptions,
    ) -> Result<(PathBuf, Option<String>, Vec<String>), OpsError> {
        let bad = |error: String| Refusal::BadStore {
            store: options.from.clone(),
            error,
        };
        #[cfg(feature = "backup")]
        {
            use std::os::unix::fs::DirBuilderExt as _;
            let mut drill = super::DrillOptions::new(options.from.clone());
            drill.identity_files = options.identity_files.clone();
            drill.s3 = options.s3.clone();
            let (store, identities) = self.drill_inputs(&drill).map_err(bad)?;
            let entry = self
                .choose_backup(&*store, options.key.as_deref())
                .await
                .map_err(bad)?;
            let key = entry.metadata.object.key.clone();
            let dir = self.state_dir.join("restore");
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| bad(format!("{}: {e}", dir.display())))?;
            let base = key.rsplit('/').next().unwrap_or(&key);
            let base = base
                .strip_suffix(".zst.age")
                .or(base.strip_suffix(".zst"))
                .unwrap_or(base);
            let out = dir.join(format!(
                "{}-{base}",
                time::OffsetDateTime::now_utc().unix_timestamp()
            ));
            let fetched = crate::backup::fetch_snapshot(&*store, &key, &identities, &out)
                .await
                .map_err(|e| Refusal::BadSnapshot {
                    file: format!("{}/{key}", options.from.trim_end_matches('/')),
                    error: e.to_string(),
                })?;
            let mut notes = vec![format!(
                "{}/{key} fetched, decrypted and verified into {}",
                options.from.trim_end_matches('/'),
                out.display()
            )];
            if fetched.metadata.kit.is_some() {
                let kit = crate::backup::read_kit(&*store, &fetched.metadata, &identities)
                    .await
                    .map_err(|e| bad(format!("the recovery kit: {e}")))?;
                notes.push(self.compare_kit_keys(&options.node, &kit).await);
            }
            Ok((
                out,
                Some(format!("{}/{key}", options.from.trim_end_matches('/'))),
                notes,
            ))
        }
        #[cfg(not(feature = "backup"))]
        {
            Err(
                bad("this build has no off-host backups (talos-client feature `backup`)".into())
                    .into(),
            )
        }
    }

    /// Whether the target's configuration holds the kit's Kubernetes
    /// secret-encryption key, said as a note.
    #[cfg(feature = "backup")]
    async fn compare_kit_keys(&self, node: &str, kit: &crate::backup::RecoveryKit) -> String {
        let node = super::cluster::host_of(node).to_string();
        let config = self
            .client
            .with_call_timeout(PROBE_TIMEOUT)
            .node(node.as_str())
            .resources()
            .machine_config(crate::client::resources::ConfigId::Active)
            .await;
        let Ok(config) = config else {
            return format!(
                "the backup's recovery kit holds {} secret-encryption key(s); {node}'s configuration could not be read to compare them",
                kit.encryption_secrets.len()
            );
        };
        let missing: Vec<&str> = kit
            .encryption_secrets
            .iter()
            .filter(|s| !config.yaml.contains(s.secret.expose()))
            .map(|s| s.provider.as_str())
            .collect();
        if missing.is_empty() {
            format!(
                "{node}'s configuration holds the recovery kit's secret-encryption key(s): the restored Secrets can be read"
            )
        } else {
            format!(
                "WARNING: {node}'s configuration does not hold the recovery kit's {} key: kube-apiserver will not read the restored Secrets until cluster.{}EncryptionSecret is the kit's",
                missing.join(", "),
                missing[0]
            )
        }
    }

    pub(super) async fn restore_step(
        &self,
        options: &RestoreOptions,
        step: RestoreStep,
        facts: &mut RestoreFacts,
        guard: &mut Guard<'_>,
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
                let fresh = guard.proof(self).await?;
                self.send_etcd_recover(fresh, &node, chunks).await?;
                Ok(Outcome::done(format!(
                    "{} uploaded to {}",
                    facts.snapshot.display(),
                    facts.node
                )))
            }
            RestoreStep::Bootstrap => {
                let fresh = guard.proof(self).await?;
                self.send_bootstrap_recover(fresh, &node).await?;
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
