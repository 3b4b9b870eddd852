//! `upgrade`: moves the control plane to a new Talos release one node at a
//! time, and counts a node as upgraded only on positive evidence.
//!
//! An upgrade reboots the node; while it is down its etcd member is too, so
//! the nodes go one at a time, followers first and the leader last (after
//! handing its leadership over), and each must come back before the next
//! starts. "Came back" is read from the node, never assumed: its boot id
//! changed, `Version` reports the image's release (a node that booted its
//! old partition answers on its old version, and that fails the step), its
//! machine status is running and ready, its
//! etcd member is a healthy voter again, the members' lists agree, it has
//! caught up, and its services are healthy. The first failed gate stops
//! the operation with the exact state; no further node is touched.
//!
//! The preflight wants every voter healthy and agreeing, no learner, no
//! alarm, an image whose tag names a release, and a supported step: no
//! downgrade across a Talos minor release and no skip of more than one
//! minor release, unless the options accept it knowingly. A verified
//! snapshot comes first.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

use super::cluster::{ClusterView, member_address};
use super::fresh::{Check, CheckKind, Guard, PlannedNode, Voters};
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo, need};
use super::policy::{Source, pick_source, unhealthy_voters};
use super::spec::millis;
use super::{OpSpec, Ops, OpsError, Outcome, Refusal};
use crate::client::{
    ImageNamespace, InstallProgress, MemberId, TalosVersion, UpgradePath, UpgradeRequest,
    upgrade_path,
};

/// Options of an upgrade ([`OpSpec::Upgrade`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct UpgradeOptions {
    /// The installer image (`ghcr.io/siderolabs/installer:v1.14.0`); its
    /// tag names the release the nodes must come back on.
    pub image: String,
    /// The control-plane nodes to upgrade, by address or hostname (empty:
    /// every voter).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Where the verified snapshot goes (`None`: the operations layer's
    /// snapshot directory).
    #[serde(default)]
    pub snapshot_dir: Option<PathBuf>,
    /// Then the workers too (every worker discovery lists, or those of
    /// `nodes` that are workers).
    #[serde(default)]
    pub workers: bool,
    /// How many workers go at once (control-plane nodes always go one at
    /// a time).
    #[serde(default = "one")]
    pub parallel: usize,
    /// Accept a step of more than one Talos minor release.
    #[serde(default)]
    pub allow_minor_skip: bool,
    /// Accept a downgrade to an earlier Talos minor release (which may take
    /// etcd back a minor version under data the newer one wrote).
    #[serde(default)]
    pub allow_downgrade: bool,
    /// How long each node may take to come back and pass its gate.
    #[serde(
        default = "default_reboot_timeout",
        with = "millis",
        rename = "reboot_timeout_ms"
    )]
    pub reboot_timeout: Duration,
}

impl UpgradeOptions {
    /// How long a node may take to come back by default: an installer
    /// pull, an install and a reboot of a real machine.
    pub const DEFAULT_REBOOT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

    /// Every voter to the release `image` names, one at a time.
    pub fn new(image: impl Into<String>) -> UpgradeOptions {
        UpgradeOptions {
            image: image.into(),
            nodes: Vec::new(),
            snapshot_dir: None,
            workers: false,
            parallel: 1,
            allow_minor_skip: false,
            allow_downgrade: false,
            reboot_timeout: UpgradeOptions::DEFAULT_REBOOT_TIMEOUT,
        }
    }
}

fn one() -> usize {
    1
}

fn default_reboot_timeout() -> Duration {
    UpgradeOptions::DEFAULT_REBOOT_TIMEOUT
}

/// What a step of an upgrade does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradePhase {
    /// Read the cluster again: every voter healthy, no learner, no alarm.
    Check,
    /// A verified snapshot from a healthy voter.
    Snapshot,
    /// Hand the leadership over (the leader's turn comes last).
    Forfeit,
    /// Send the upgrade (pull and install, then reboot; or the legacy call).
    Upgrade,
    /// Wait for the node to come back on the new release, and gate it.
    WaitBack,
}

/// One step of an upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeStep {
    /// What it does.
    pub phase: UpgradePhase,
    /// The node's address ("" for the cluster-wide steps).
    pub node: String,
}

impl StepInfo for UpgradeStep {
    fn name(&self) -> &'static str {
        match self.phase {
            UpgradePhase::Check => "check",
            UpgradePhase::Snapshot => "snapshot",
            UpgradePhase::Forfeit => "forfeit",
            UpgradePhase::Upgrade => "upgrade",
            UpgradePhase::WaitBack => "wait-back",
        }
    }

    fn destructive(&self) -> bool {
        matches!(self.phase, UpgradePhase::Forfeit | UpgradePhase::Upgrade)
    }

    fn node(&self) -> Option<&str> {
        (!self.node.is_empty()).then_some(self.node.as_str())
    }

    fn point_of_no_return(&self) -> bool {
        // An installed release cannot be taken back by stopping.
        self.phase == UpgradePhase::Upgrade
    }

    fn precondition(&self) -> Option<CheckKind> {
        matches!(self.phase, UpgradePhase::Forfeit | UpgradePhase::Upgrade)
            .then_some(CheckKind::VotersHealthy)
    }
}

impl UpgradeStep {
    /// Its precondition with its subject: every voter healthy, the node
    /// still the planned member (a worker: it answers).
    pub(crate) fn check(&self, facts: &UpgradeFacts) -> Result<Option<Check>, OpsError> {
        if self.precondition().is_none() {
            return Ok(None);
        }
        let node = node_at(facts, &self.node, self.name())?;
        Ok(Some(Check::VotersHealthy(Voters {
            node: Some(PlannedNode {
                address: node.address.clone(),
                hostname: node.hostname.clone(),
                member_id: (!node.worker).then_some(node.member_id),
            }),
            except: None,
            nospace_ok: false,
        })))
    }
}

/// A node as the plan read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct UpgradeNode {
    /// Its hostname.
    pub hostname: String,
    /// Its address.
    pub address: String,
    /// Its etcd member id (0 for a worker).
    pub member_id: MemberId,
    /// A worker: no etcd member, its gate is its boot, release and
    /// services.
    #[serde(default)]
    pub worker: bool,
    /// Whether it led at plan time.
    pub leads: bool,
    /// The release it ran at plan time.
    pub version: String,
}

/// What an upgrade's preflight found and its steps recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct UpgradeFacts {
    /// The release the image names (`v1.14.0`).
    pub target: String,
    /// The nodes, in order (the leader last).
    pub nodes: Vec<UpgradeNode>,
    /// Where the snapshot goes.
    pub snapshot_dir: PathBuf,
    /// The voter the snapshot comes from.
    pub source: Option<Source>,
    /// The verified snapshot, once taken.
    #[serde(default)]
    pub snapshot: Option<PathBuf>,
    /// Each node's boot id before its upgrade was sent, read from it.
    #[serde(default)]
    pub boot_ids: BTreeMap<String, String>,
    /// When each node's upgrade was sent (Unix ms).
    #[serde(default)]
    pub sent_ms: BTreeMap<String, u64>,
}

/// Raft entries a node may trail the others by to count as caught up.
const CAUGHT_UP: u64 = 100;

/// How often a node coming back is read.
const POLL: Duration = Duration::from_millis(500);

/// The release an installer image's tag names
/// (`ghcr.io/siderolabs/installer:v1.14.0` names v1.14.0).
pub fn image_release(image: &str) -> Option<TalosVersion> {
    let name = image.rsplit('/').next()?;
    let tag = name.split_once(':')?.1.split('@').next()?;
    tag.parse().ok()
}

/// Why going from `from` to `to` is refused, if it is: a downgrade to an
/// earlier minor release unless `allow_downgrade`, a skip of more than one
/// minor release unless `allow_minor_skip`.
pub(crate) fn step_refusal(
    from: &TalosVersion,
    to: &TalosVersion,
    allow_minor_skip: bool,
    allow_downgrade: bool,
) -> Option<String> {
    let (f, t) = ((from.major, from.minor), (to.major, to.minor));
    if t < f && !allow_downgrade {
        return Some(format!(
            "a downgrade from {}.{} to {}.{} can take etcd back a minor version under data the newer one wrote",
            f.0, f.1, t.0, t.1
        ));
    }
    if t > f && !allow_minor_skip && (t.0 != f.0 || t.1 > f.1 + 1) {
        return Some(format!(
            "{}.{} to {}.{} skips a minor release; Talos supports upgrades one minor release at a time",
            f.0, f.1, t.0, t.1
        ));
    }
    None
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long after an answered reboot Talos may still look as before (its
/// reboot sequence starts asynchronously): a resumed upgrade watches the
/// node that long before it believes the release it answers.
const REBOOT_STARTS_WITHIN: Duration = Duration::from_secs(5);

impl Ops {
    /// Plans an upgrade: the image's release, the cluster read (every
    /// voter healthy, no learner, lists agreeing, no alarm), each node's
    /// release and the step to the target checked, followers first and the
    /// leader last.
    pub(super) async fn plan_upgrade(&self, options: &UpgradeOptions) -> Result<Plan, OpsError> {
        let Some(target) = image_release(&options.image) else {
            return Err(Refusal::ImageWithoutRelease {
                image: options.image.clone(),
            }
            .into());
        };
        let view = self.read_view().await?;
        check_cluster(&view)?;
        let alarms = self.client.etcd_alarm_list().await?;
        if !alarms.is_empty() {
            return Err(Refusal::AlarmsRaised {
                alarms: alarms
                    .iter()
                    .map(|a| format!("{:?} on member {}", a.alarm, a.member_id))
                    .collect(),
            }
            .into());
        }
        // Workers are no etcd members: discovery names them.
        let named_elsewhere = options.nodes.iter().any(|n| view.find(n).is_none());
        let discovered: Vec<crate::client::resources::ClusterMember> =
            if options.workers || named_elsewhere {
                self.client
                    .resources()
                    .cluster_members()
                    .await?
                    .into_iter()
                    .filter(|m| m.machine_type == "worker")
                    .collect()
            } else {
                Vec::new()
            };
        let mut chosen = Vec::new();
        let mut workers: Vec<&crate::client::resources::ClusterMember> = Vec::new();
        for node in &options.nodes {
            if let Some(member) = view.find(node) {
                if !chosen
                    .iter()
                    .any(|m: &&crate::client::EtcdMember| m.id == member.id)
                {
                    chosen.push(member);
                }
            } else if let Some(worker) = discovered
                .iter()
                .find(|w| w.hostname == *node || w.addresses.iter().any(|a| a.to_string() == *node))
            {
                if !workers.iter().any(|w| w.hostname == worker.hostname) {
                    workers.push(worker);
                }
            } else {
                let mut members = super::cluster::names(&view.members);
                members.extend(
                    discovered
                        .iter()
                        .map(|w| format!("{} (worker)", w.hostname)),
                );
                return Err(Refusal::NotMember {
                    node: node.clone(),
                    members,
                }
                .into());
            }
        }
        if options.nodes.is_empty() {
            chosen = view.voters().collect();
            if options.workers {
                workers = discovered.iter().collect();
            }
        }
        let leader = view.leader();
        let mut nodes = Vec::new();
        let mut notes = Vec::new();
        for member in chosen {
            let address = member_address(member).ok_or_else(|| Refusal::NoAddress {
                member: member.hostname.clone(),
            })?;
            let (version, running) = self
                .checked_release(&address, &member.hostname, &target, options)
                .await?;
            if running == target {
                notes.push(format!(
                    "{} already runs {version}: it is upgraded again (same release)",
                    member.hostname
                ));
            }
            nodes.push(UpgradeNode {
                hostname: member.hostname.clone(),
                address,
                member_id: member.id,
                leads: leader == Some(member.id),
                worker: false,
                version,
            });
        }
        // Followers first, the leader last; then the workers.
        nodes.sort_by_key(|n| n.leads);
        for worker in workers {
            let address = worker
                .addresses
                .first()
                .map(|a| a.to_string())
                .ok_or_else(|| Refusal::NoAddress {
                    member: worker.hostname.clone(),
                })?;
            let (version, _) = self
                .checked_release(&address, &worker.hostname, &target, options)
                .await?;
            nodes.push(UpgradeNode {
                hostname: worker.hostname.clone(),
                address,
                member_id: MemberId(0),
                leads: false,
                worker: true,
                version,
            });
        }
        notes.push(format!(
            "order: {} (control-plane nodes one at a time, the leader last; workers {} at a time); image {}",
            nodes
                .iter()
                .map(|n| format!("{} {} -> v{target}", n.hostname, n.version))
                .collect::<Vec<_>>()
                .join(", "),
            options.parallel.max(1),
            options.image
        ));
        notes.push(format!(
            "expected: a pull, an install and a reboot per node; each node has up to {} s to come back and pass its gate, so at most {} s in all",
            options.reboot_timeout.as_secs(),
            options.reboot_timeout.as_secs() * nodes.len() as u64
        ));
        let source = pick_source(&view, None)?;
        let facts = UpgradeFacts {
            target: format!("v{target}"),
            nodes,
            snapshot_dir: self.snapshot_dir(options.snapshot_dir.as_ref()),
            source: Some(source),
            snapshot: None,
            boot_ids: BTreeMap::new(),
            sent_ms: BTreeMap::new(),
        };
        let steps = upgrade_steps(&facts, options.parallel);
        Ok(Plan::new(
            OpSpec::Upgrade(options.clone()),
            steps,
            notes,
            Facts::Upgrade(facts),
            &view.basis(),
        ))
    }

    /// The release the node at `address` runs (as reported and parsed),
    /// refused when going from it to `target` is a step Talos does not
    /// support and `options` do not accept.
    async fn checked_release(
        &self,
        address: &str,
        hostname: &str,
        target: &TalosVersion,
        options: &UpgradeOptions,
    ) -> Result<(String, TalosVersion), OpsError> {
        let version = self.client.node(address).version().await?.tag;
        let running: TalosVersion =
            version
                .parse()
                .map_err(|e: crate::client::VersionParseError| {
                    OpsError::step("plan", format!("{hostname}: {e}"))
                })?;
        if let Some(reason) = step_refusal(
            &running,
            target,
            options.allow_minor_skip,
            options.allow_downgrade,
        ) {
            return Err(Refusal::UnsupportedStep {
                node: hostname.to_string(),
                from: version,
                to: format!("v{target}"),
                reason,
            }
            .into());
        }
        Ok((version, running))
    }

    pub(super) async fn upgrade_step(
        &self,
        options: &UpgradeOptions,
        step: &UpgradeStep,
        facts: &mut UpgradeFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let name = step.name();
        match step.phase {
            UpgradePhase::Check => {
                let view = self.read_view().await?;
                check_cluster(&view).map_err(|r| OpsError::step(name, r))?;
                Ok(Outcome::done(format!(
                    "{} healthy voters",
                    view.voters().count()
                )))
            }
            UpgradePhase::Snapshot => {
                let first = need(&facts.source, "source")?.clone();
                let (path, source, note) = self
                    .take_snapshot_retrying(&first, None, &facts.snapshot_dir)
                    .await?;
                let detail = format!("{} (from {}){note}", path.display(), source.address);
                facts.source = Some(source);
                facts.snapshot = Some(path);
                Ok(Outcome::done(detail))
            }
            UpgradePhase::Forfeit => {
                let node = node_at(facts, &step.node, name)?.clone();
                self.hand_over(&node.address, &node.hostname, node.member_id, guard)
                    .await
            }
            UpgradePhase::Upgrade => self.send_upgrade(options, &step.node, facts, guard).await,
            UpgradePhase::WaitBack => self.wait_upgraded(options, &step.node, facts).await,
        }
    }

    /// The release the node runs, once it answers (within `limit`).
    async fn answering_version(
        &self,
        address: &str,
        limit: Duration,
        step: &str,
    ) -> Result<String, OpsError> {
        let until = Instant::now() + limit;
        loop {
            match self.client.node(address).version().await {
                Ok(v) => return Ok(v.tag),
                Err(e) if Instant::now() >= until => {
                    return Err(OpsError::step(
                        step,
                        format!("{address} does not answer: {e}"),
                    ));
                }
                Err(_) => {}
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(POLL).await;
        }
    }

    /// The release node `address` runs once it answers and is not on its
    /// way down, watched [`REBOOT_STARTS_WITHIN`] for a reboot to begin: a
    /// reboot sent before a crash goes on asynchronously (the node answers
    /// for a moment with its old release and its machine status running,
    /// then says `rebooting`, then stops answering), so that is waited out,
    /// within `limit`. Stages as upstream's `MachineStage` names them
    /// (machine.proto).
    async fn settled_version(
        &self,
        address: &str,
        limit: Duration,
        step: &str,
    ) -> Result<String, OpsError> {
        const GOING_DOWN: [&str; 3] = ["rebooting", "shutting down", "upgrading"];
        let until = Instant::now() + limit;
        // Talos starts the reboot sequence a moment after it answers the
        // call: until then the node looks as it did before. It is watched
        // that long for a sign of it before what it answers is believed.
        let watch = Instant::now() + REBOOT_STARTS_WITHIN;
        let mut went_down = false;
        loop {
            let version = self
                .answering_version(
                    address,
                    until.saturating_duration_since(Instant::now()),
                    step,
                )
                .await?;
            let node = self.client.node(address);
            let stage = node.resources().machine_status().await.map(|s| s.stage);
            let now = Instant::now();
            match stage {
                Ok(stage) if GOING_DOWN.contains(&stage.as_str()) => {
                    went_down = true;
                    if now >= until {
                        return Err(OpsError::step(
                            step,
                            format!("{address} is still {stage} after {} s", limit.as_secs()),
                        ));
                    }
                }
                Ok(_) if went_down || now >= watch => return Ok(version),
                Ok(_) => {}
                // Gone between the two reads (on its way down), or a status
                // it does not serve: what answered is all there is to go on
                // once the time is up.
                Err(_) if now >= until => return Ok(version),
                Err(_) => went_down = true,
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(POLL).await;
        }
    }

    /// An upgrade in flight at a crash: once the node answers (it may be
    /// rebooting from an upgrade sent before the crash), done when it runs
    /// the target though the plan found another release; else it is sent
    /// again, after its check.
    pub(super) async fn reconcile_upgrade(
        &self,
        options: &UpgradeOptions,
        step: &UpgradeStep,
        facts: &UpgradeFacts,
    ) -> Result<Option<Outcome>, OpsError> {
        if step.phase != UpgradePhase::Upgrade {
            return Ok(None);
        }
        let node = node_at(facts, &step.node, "upgrade")?;
        let version = self
            .settled_version(&node.address, options.reboot_timeout, "upgrade")
            .await?;
        Ok(
            (version == facts.target && node.version != facts.target).then(|| {
                Outcome::skipped(format!(
                    "{} already runs {version}: an upgrade sent before took",
                    node.hostname
                ))
            }),
        )
    }

    /// Sends the node its upgrade, as talosctl 1.13.9 would: on a release
    /// that serves it, ImageService.Pull, LifecycleService.Upgrade and a
    /// reboot (the install and the reboot each on a fresh check); else the
    /// legacy MachineService.Upgrade.
    async fn send_upgrade(
        &self,
        options: &UpgradeOptions,
        address: &str,
        facts: &mut UpgradeFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let step = "upgrade";
        let node = node_at(facts, address, step)?.clone();
        let target = self.client.node(address);
        let version = self
            .answering_version(address, options.reboot_timeout, step)
            .await?;
        let boot = self.boot_id(address).await?;
        facts.boot_ids.insert(address.to_string(), boot);
        let path = upgrade_path([(address, version.as_str())])?;
        match path {
            UpgradePath::Legacy => {
                let fresh = guard.proof(self).await?;
                facts.sent_ms.insert(address.to_string(), now_ms());
                self.send_upgrade_legacy(fresh, &target, &UpgradeRequest::new(&options.image))
                    .await?;
                Ok(Outcome::done(format!(
                    "{} ({version}): legacy upgrade to {} sent",
                    node.hostname, options.image
                )))
            }
            UpgradePath::Lifecycle => {
                let name = target
                    .pull_image(&options.image, ImageNamespace::System)
                    .await?;
                let fresh = guard.proof(self).await?;
                facts.sent_ms.insert(address.to_string(), now_ms());
                let mut progress = self.send_install(fresh, &target, &name).await?;
                let mut exit_code = None;
                while let Some(item) = progress.next().await {
                    if let InstallProgress::ExitCode(code) = item? {
                        exit_code = Some(code);
                    }
                }
                let failed = match exit_code {
                    Some(0) => None,
                    Some(code) => Some(format!("the install failed with exit code {code}")),
                    None => Some("the install ended without an exit code".to_string()),
                };
                if let Some(failed) = failed {
                    return Err(OpsError::step(
                        step,
                        format!("{}: {failed}; the node was not rebooted", node.hostname),
                    ));
                }
                // The install took a while: the reboot has a check of its
                // own.
                let fresh = guard.proof(self).await?;
                self.send_reboot(fresh, &target).await?;
                Ok(Outcome::done(format!(
                    "{} ({version}): {name} pulled and installed, reboot sent",
                    node.hostname
                )))
            }
        }
    }

    /// Waits until the node answers from a new boot, then requires the
    /// target release, its member a healthy voter that caught up, the
    /// lists agreeing and its services healthy. A node back on another
    /// release fails at once: it booted its old partition.
    async fn wait_upgraded(
        &self,
        options: &UpgradeOptions,
        address: &str,
        facts: &UpgradeFacts,
    ) -> Result<Outcome, OpsError> {
        let step = "wait-back";
        let node = node_at(facts, address, step)?;
        // Without a recorded boot id (the upgrade step was interrupted
        // before its facts were journaled) the release alone is the
        // evidence of a new boot.
        let before = facts.boot_ids.get(address).cloned();
        let started = Instant::now();
        let until = started + options.reboot_timeout;
        let target = self.client.node(address);
        let mut last = String::from("not answering yet");
        while Instant::now() < until {
            match self.boot_id(address).await {
                Ok(now) if before.as_ref() == Some(&now) => last = "it has not rebooted yet".into(),
                Ok(_) => {
                    let running = match target.version().await {
                        Ok(v) => v.tag,
                        Err(e) => {
                            last = format!("Version: {e}");
                            OpsError::poll_stop(&self.stop)?;
                            tokio::time::sleep(POLL).await;
                            continue;
                        }
                    };
                    if running != facts.target {
                        return Err(OpsError::step(
                            step,
                            format!(
                                "{} came back from a new boot on {running}, not {}: it booted its old partition, so the upgrade did not take; no other node was touched",
                                node.hostname, facts.target
                            ),
                        ));
                    }
                    match self.gate_upgraded(node).await {
                        Ok(summary) => {
                            return Ok(Outcome::done(format!(
                                "{} back on {running} after {} ms: {summary}",
                                node.hostname,
                                started.elapsed().as_millis()
                            )));
                        }
                        Err(reason) => last = reason,
                    }
                }
                Err(e) => last = e.to_string(),
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(POLL).await;
        }
        Err(OpsError::step(
            step,
            format!(
                "{} not back on {} and healthy within {} s: {last}",
                node.hostname,
                facts.target,
                options.reboot_timeout.as_secs()
            ),
        ))
    }

    /// One pass of the gate on a node that is back: its machine status
    /// running and ready, its member a healthy voter, every voter healthy,
    /// the lists agreeing, it caught up, and its services healthy. The error says what is not yet so.
    async fn gate_upgraded(&self, node: &UpgradeNode) -> Result<String, String> {
        let status = self
            .client
            .node(node.address.as_str())
            .resources()
            .machine_status()
            .await
            .map_err(|e| format!("{}'s machine status cannot be read: {e}", node.hostname))?;
        if status.stage != "running" || !status.ready {
            let unmet: Vec<String> = status
                .unmet_conditions
                .iter()
                .map(|c| format!("{}: {}", c.name, c.reason))
                .collect();
            return Err(format!(
                "{} is {}{}",
                node.hostname,
                status.stage,
                if status.ready {
                    String::new()
                } else {
                    format!(", not ready ({})", unmet.join("; "))
                }
            ));
        }
        if node.worker {
            let services = self.healthy_services(node).await?;
            return Ok(format!("{services} services healthy"));
        }
        let view = self.read_view().await.map_err(|e| e.to_string())?;
        check_cluster(&view).map_err(|r| r.to_string())?;
        let Some(member) = view.find_id_member(node.member_id) else {
            return Err(format!(
                "{} is not listed as member {}",
                node.hostname, node.member_id
            ));
        };
        if member.is_learner {
            return Err(format!("{} is a learner", node.hostname));
        }
        let indexes: Vec<(MemberId, u64)> = view
            .statuses
            .iter()
            .filter_map(|(m, s)| s.as_ref().ok().map(|s| (m.id, s.raft_index)))
            .collect();
        let top = indexes.iter().map(|(_, i)| *i).max().unwrap_or(0);
        let own = indexes
            .iter()
            .find(|(id, _)| *id == node.member_id)
            .map(|(_, i)| *i)
            .ok_or_else(|| format!("{}'s etcd status cannot be read", node.hostname))?;
        if top.saturating_sub(own) > CAUGHT_UP {
            return Err(format!("{} is at raft index {own} of {top}", node.hostname));
        }
        let services = self.healthy_services(node).await?;
        Ok(format!(
            "a healthy voter caught up (raft index {own} of {top}), {} voters agree, {} services healthy",
            view.voters().count(),
            services
        ))
    }

    /// How many services the node runs, all healthy; the error names
    /// those that are not.
    async fn healthy_services(&self, node: &UpgradeNode) -> Result<usize, String> {
        let services = self
            .client
            .node(node.address.as_str())
            .service_list()
            .await
            .map_err(|e| format!("{}'s services cannot be read: {e}", node.hostname))?;
        let bad: Vec<String> = services.iter().filter_map(|s| s.problem()).collect();
        if !bad.is_empty() {
            return Err(format!(
                "{}'s services are not healthy: {}",
                node.hostname,
                bad.join(", ")
            ));
        }
        Ok(services.len())
    }
}

/// Every voter healthy, no learner, the members' lists agreeing.
fn check_cluster(view: &ClusterView) -> Result<(), Refusal> {
    if let Some(learner) = view.members.iter().find(|m| m.is_learner) {
        return Err(Refusal::LearnerCatchingUp {
            learner: learner.hostname.clone(),
        });
    }
    if !view.disagreements.is_empty() {
        return Err(Refusal::ListsDisagree {
            details: view.disagreements.clone(),
        });
    }
    let unhealthy = unhealthy_voters(view, None);
    if !unhealthy.is_empty() {
        return Err(Refusal::UnhealthyVoters { voters: unhealthy });
    }
    Ok(())
}

fn node_at<'a>(
    facts: &'a UpgradeFacts,
    address: &str,
    step: &str,
) -> Result<&'a UpgradeNode, OpsError> {
    facts
        .nodes
        .iter()
        .find(|n| n.address == address)
        .ok_or_else(|| OpsError::step(step, format!("{address} is not in the plan")))
}

/// The steps: a check and a snapshot, then per control-plane node (the
/// leader's preceded by a forfeit) the upgrade and the wait for it to come
/// back; then the workers, `parallel` at a time.
fn upgrade_steps(facts: &UpgradeFacts, parallel: usize) -> Vec<PlannedStep> {
    let step = |phase, node: &str| {
        Step::Upgrade(UpgradeStep {
            phase,
            node: node.to_string(),
        })
    };
    let mut steps = vec![
        PlannedStep::new(
            step(UpgradePhase::Check, ""),
            "read the cluster again: every voter healthy, no learner, the lists agreeing".into(),
        ),
        PlannedStep::new(
            step(UpgradePhase::Snapshot, ""),
            format!(
                "verified snapshot from a healthy voter into {}",
                facts.snapshot_dir.display()
            ),
        ),
    ];
    let upgrade = |n: &UpgradeNode| {
        PlannedStep::new(
            step(UpgradePhase::Upgrade, &n.address),
            format!(
                "upgrade {} ({}) from {} to {}: pull and install the image, then reboot",
                n.hostname, n.address, n.version, facts.target
            ),
        )
    };
    let wait = |n: &UpgradeNode| {
        let gate = if n.worker {
            "its services healthy"
        } else {
            "its member a healthy voter caught up, its services healthy"
        };
        PlannedStep::new(
            step(UpgradePhase::WaitBack, &n.address),
            format!(
                "wait for {} to come back from a new boot on {}, {gate}",
                n.hostname, facts.target
            ),
        )
    };
    for n in facts.nodes.iter().filter(|n| !n.worker) {
        if n.leads {
            steps.push(PlannedStep::new(
                step(UpgradePhase::Forfeit, &n.address),
                format!("{} leads: hand leadership over before its turn", n.hostname),
            ));
        }
        steps.push(upgrade(n));
        steps.push(wait(n));
    }
    // Workers `parallel` at a time: their upgrades sent, then each awaited.
    let workers: Vec<&UpgradeNode> = facts.nodes.iter().filter(|n| n.worker).collect();
    for batch in workers.chunks(parallel.max(1)) {
        steps.extend(batch.iter().map(|n| upgrade(n)));
        steps.extend(batch.iter().map(|n| wait(n)));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> TalosVersion {
        s.parse().unwrap()
    }

    #[test]
    fn the_image_tag_names_the_release() {
        assert_eq!(
            image_release("ghcr.io/siderolabs/installer:v1.14.0"),
            Some(v("1.14.0"))
        );
        assert_eq!(
            image_release("localhost:5000/installer:v1.13.9@sha256:abc"),
            Some(v("1.13.9"))
        );
        assert_eq!(image_release("ghcr.io/siderolabs/installer"), None);
        assert_eq!(image_release("ghcr.io/siderolabs/installer:latest"), None);
    }

    #[test]
    fn supported_steps() {
        let refused = |from, to| step_refusal(&v(from), &v(to), false, false);
        assert_eq!(refused("1.13.9", "1.14.0"), None);
        assert_eq!(refused("1.13.9", "1.13.10"), None);
        assert_eq!(refused("1.13.9", "1.13.2"), None, "a patch downgrade");
        assert!(
            refused("1.12.4", "1.14.0")
                .unwrap()
                .contains("skips a minor")
        );
        assert!(refused("1.14.0", "1.13.9").unwrap().contains("downgrade"));
        assert!(refused("1.13.9", "2.0.0").unwrap().contains("skips"));
        assert_eq!(step_refusal(&v("1.12.4"), &v("1.14.0"), true, false), None);
        assert_eq!(step_refusal(&v("1.14.0"), &v("1.13.9"), false, true), None);
    }
}
