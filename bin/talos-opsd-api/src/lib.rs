//! The talos-opsd daemon's API as both ends use it: the generated protocol
//! (`proto/opsd/v1/opsd.proto`), the one mapping between an operation's
//! [`OpSpec`] and its request message, the journal's records and plans as
//! messages and back, the state names, and the state directory the CLI and
//! the daemon share by default. It links nothing of the daemon itself, so
//! the CLI does not either.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use talos_client::ops::{
    ApplyOptions, ClusterLockRecord, DefragOptions, JoinOptions, LeaseProbe, MachineRole,
    MaintenanceApply, MigrateOptions, OpRecord, OpSpec, OpState, Plan, RetireOptions,
    SnapshotOptions, StepState, UpgradeOptions,
};

mod events;

pub use events::{event_to_proto, step_events};

/// The generated API (`proto/opsd/v1/opsd.proto`): client and server.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("opsd.v1");
}

use proto::start_operation_request::Kind;

/// Why a spec or a message does not convert.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// An option the daemon does not take from a caller.
    #[error("{0} is not available through talos-opsd")]
    LocalOnly(&'static str),
    /// A message that does not hold what it must.
    #[error("{0}")]
    Invalid(String),
}

/// The gRPC metadata key under which the daemon sends a refusal's typed
/// reason (JSON of [`talos_client::ops::Refusal`]) with the status of a refusal.
pub const REFUSAL_METADATA: &str = "x-opsd-refusal-bin";

/// The status for `refusal`, its reason attached: INVALID_ARGUMENT for
/// options no cluster could make valid, else FAILED_PRECONDITION.
pub fn refusal_status(refusal: &talos_client::ops::Refusal, message: String) -> tonic::Status {
    use talos_client::ops::Refusal;
    // Options that no cluster could make valid are malformed input; every
    // other refusal depends on the cluster as read.
    let mut status = match refusal {
        Refusal::OutOfBounds { .. }
        | Refusal::BadOption { .. }
        | Refusal::BadThreshold { .. }
        | Refusal::PinsAndInsecure => tonic::Status::invalid_argument(message),
        _ => tonic::Status::failed_precondition(message),
    };
    if let Ok(json) = serde_json::to_vec(refusal) {
        status.metadata_mut().insert_bin(
            REFUSAL_METADATA,
            tonic::metadata::MetadataValue::from_bytes(&json),
        );
    }
    status
}

/// The typed reason of a daemon's refusal, when the status carries one.
pub fn refusal_of(status: &tonic::Status) -> Option<talos_client::ops::Refusal> {
    let value = status.metadata().get_bin(REFUSAL_METADATA)?;
    serde_json::from_slice(&value.to_bytes().ok()?).ok()
}

/// The default state directory of the CLI and the daemon (journal, locks,
/// snapshots): `$XDG_STATE_HOME/talosctl-rs`, else
/// `~/.local/state/talosctl-rs`. Both use it unless told otherwise, so
/// they share one journal and one lock per cluster.
pub fn default_state_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir).join("talosctl-rs")),
        None => std::env::home_dir().map(|h| h.join(".local/state/talosctl-rs")),
    }
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX).max(1)
}

/// `secs` seconds, or `default` for 0.
fn or_default(secs: u32, default: Duration) -> Duration {
    if secs == 0 {
        default
    } else {
        Duration::from_secs(secs.into())
    }
}

fn maintenance_to_proto(m: &Option<MaintenanceApply>) -> Option<proto::MaintenanceConfig> {
    m.as_ref().map(|m| proto::MaintenanceConfig {
        config_path: std::path::absolute(&m.config_path)
            .unwrap_or_else(|_| m.config_path.clone())
            .display()
            .to_string(),
        cert_fingerprints: m.cert_fingerprints.clone(),
        insecure: m.insecure,
    })
}

fn maintenance_from_proto(m: Option<proto::MaintenanceConfig>) -> Option<MaintenanceApply> {
    m.map(|m| {
        if m.insecure {
            let mut apply = MaintenanceApply::insecure(m.config_path);
            apply.cert_fingerprints = m.cert_fingerprints;
            apply
        } else {
            MaintenanceApply::pinned(m.config_path, m.cert_fingerprints)
        }
    })
}

/// The request message of `spec`. Files are named by absolute path (the
/// daemon reads them on its host); a snapshot directory and an apply's
/// user check stay with the caller (the daemon uses its configured
/// directory and runs no caller's command).
pub fn spec_to_proto(spec: &OpSpec) -> Result<Kind, ConvertError> {
    Ok(match spec {
        OpSpec::Snapshot(o) => {
            if o.dir.is_some() {
                return Err(ConvertError::LocalOnly(
                    "a snapshot directory (the daemon uses its configured one)",
                ));
            }
            if o.store.is_some() || !o.encrypt.is_empty() || o.kit || !o.tiers.is_empty() {
                return Err(ConvertError::LocalOnly(
                    "an off-host store (the daemon uses its configured one)",
                ));
            }
            Kind::Snapshot(proto::SnapshotParams {
                keep: o.keep.map_or(0, |k| u32::try_from(k).unwrap_or(u32::MAX)),
            })
        }
        OpSpec::Retire(o) => {
            if o.snapshot_dir.is_some() {
                return Err(ConvertError::LocalOnly("a snapshot directory"));
            }
            Kind::Retire(proto::RetireParams {
                node: o.node.clone(),
                wipe: o.wipe.clone(),
                already_left: o.already_left,
                silence_timeout_s: secs(o.silence_timeout),
                lease_probe: o.lease_probe.as_ref().map(probe_to_proto),
            })
        }
        OpSpec::Join(o) => Kind::Join(proto::JoinParams {
            node: o.node.clone(),
            timeout_s: secs(o.timeout),
            maintenance: maintenance_to_proto(&o.maintenance),
        }),
        OpSpec::Migrate(o) => {
            if o.snapshot_dir.is_some() {
                return Err(ConvertError::LocalOnly("a snapshot directory"));
            }
            Kind::Migrate(proto::MigrateParams {
                from: o.from.clone(),
                to: o.to.clone(),
                maintenance: maintenance_to_proto(&o.maintenance),
                join_timeout_s: secs(o.join_timeout),
                wipe: o.wipe.clone(),
                silence_timeout_s: secs(o.silence_timeout),
                lease_probe: o.lease_probe.as_ref().map(probe_to_proto),
            })
        }
        OpSpec::Apply(o) => {
            if o.check.is_some() {
                return Err(ConvertError::LocalOnly("an apply's health-gate command"));
            }
            Kind::Apply(proto::ApplyParams {
                nodes: o.nodes.clone(),
                config_path: std::path::absolute(&o.config_path)
                    .unwrap_or_else(|_| o.config_path.clone())
                    .display()
                    .to_string(),
                expect_change: o.expect_change.clone(),
                allow_issuer_change: !o.allow_issuer_change.is_empty(),
                allow_reboot: o.allow_reboot,
                try_timeout_s: secs(o.try_timeout),
                reboot_timeout_s: secs(o.reboot_timeout),
                vip_check: Some(o.vip_check),
                kube_check: Some(o.kube_check),
            })
        }
        OpSpec::Upgrade(o) => Kind::Upgrade(proto::UpgradeParams {
            image: o.image.clone(),
            nodes: o.nodes.clone(),
            allow_minor_skip: o.allow_minor_skip,
            allow_downgrade: o.allow_downgrade,
            reboot_timeout_s: secs(o.reboot_timeout),
            workers: o.workers,
            parallel: u32::try_from(o.parallel).unwrap_or(u32::MAX),
        }),
        OpSpec::Defrag(o) => Kind::Defrag(proto::DefragParams {
            nodes: o.nodes.clone(),
            threshold: Some(o.threshold),
            all: o.all,
        }),
        _ => return Err(ConvertError::LocalOnly("this operation")),
    })
}

fn probe_to_proto(p: &LeaseProbe) -> proto::LeaseProbe {
    proto::LeaseProbe {
        server: p.server.clone(),
        tls_server_name: p.tls_server_name.clone().unwrap_or_default(),
        renew_deadline_ms: u32::try_from(p.renew_deadline.as_millis()).unwrap_or(u32::MAX),
    }
}

/// A probe from the wire: an unset deadline is the library's, and it
/// renews every fifth of the deadline.
fn probe_from_proto(p: proto::LeaseProbe) -> LeaseProbe {
    let mut probe = LeaseProbe::new(p.server);
    probe.tls_server_name = Some(p.tls_server_name).filter(|n| !n.is_empty());
    if p.renew_deadline_ms != 0 {
        probe.renew_deadline = Duration::from_millis(p.renew_deadline_ms.into());
        probe.retry_period = probe.renew_deadline / 5;
    }
    probe
}

/// The spec a request message asks for; unset numbers and lists take the
/// options types' defaults.
pub fn spec_from_proto(kind: Kind) -> OpSpec {
    match kind {
        Kind::Snapshot(p) => OpSpec::Snapshot(SnapshotOptions::new(
            None,
            (p.keep != 0).then_some(p.keep as usize),
        )),
        Kind::Retire(p) => {
            let mut o = RetireOptions::new(p.node);
            if !p.wipe.is_empty() {
                o.wipe = p.wipe;
            }
            o.already_left = p.already_left;
            o.silence_timeout = or_default(p.silence_timeout_s, o.silence_timeout);
            o.lease_probe = p.lease_probe.map(probe_from_proto);
            OpSpec::Retire(o)
        }
        Kind::Join(p) => {
            let mut o = JoinOptions::new(p.node);
            o.timeout = or_default(p.timeout_s, o.timeout);
            o.maintenance = maintenance_from_proto(p.maintenance);
            OpSpec::Join(o)
        }
        Kind::Migrate(p) => {
            let mut o = MigrateOptions::new(p.from, p.to);
            o.maintenance = maintenance_from_proto(p.maintenance);
            o.join_timeout = or_default(p.join_timeout_s, o.join_timeout);
            if !p.wipe.is_empty() {
                o.wipe = p.wipe;
            }
            o.silence_timeout = or_default(p.silence_timeout_s, o.silence_timeout);
            o.lease_probe = p.lease_probe.map(probe_from_proto);
            OpSpec::Migrate(o)
        }
        Kind::Apply(p) => {
            let mut o = ApplyOptions::new(p.nodes, p.config_path.into());
            o.expect_change = p.expect_change;
            // The wire keeps a bool: true allows the roles that run an API
            // server.
            if p.allow_issuer_change {
                o.allow_issuer_change = vec![MachineRole::Controlplane, MachineRole::Init];
            }
            o.allow_reboot = p.allow_reboot;
            o.try_timeout = or_default(p.try_timeout_s, o.try_timeout);
            o.reboot_timeout = or_default(p.reboot_timeout_s, o.reboot_timeout);
            if let Some(on) = p.vip_check {
                o.vip_check = on;
            }
            if let Some(on) = p.kube_check {
                o.kube_check = on;
            }
            OpSpec::Apply(o)
        }
        Kind::Upgrade(p) => {
            let mut o = UpgradeOptions::new(p.image);
            o.nodes = p.nodes;
            o.allow_minor_skip = p.allow_minor_skip;
            o.allow_downgrade = p.allow_downgrade;
            o.reboot_timeout = or_default(p.reboot_timeout_s, o.reboot_timeout);
            o.workers = p.workers;
            o.parallel = usize::try_from(p.parallel.max(1)).unwrap_or(1);
            OpSpec::Upgrade(o)
        }
        Kind::Defrag(p) => {
            let mut o = DefragOptions::new();
            o.nodes = p.nodes;
            if let Some(threshold) = p.threshold {
                o.threshold = threshold;
            }
            o.all = p.all;
            OpSpec::Defrag(o)
        }
    }
}

/// An operation state as the API writes it (`running`, `needs-attention`).
pub fn state_name(state: OpState) -> String {
    name_of(state)
}

/// A step state as the API writes it (`pending`, `done`, ...).
pub fn step_state_name(state: StepState) -> String {
    name_of(state)
}

fn name_of<T: Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A step state from its API name.
pub fn parse_step_state(name: &str) -> Result<StepState, ConvertError> {
    serde_json::from_value(serde_json::Value::String(name.into()))
        .map_err(|_| ConvertError::Invalid(format!("step state {name:?}")))
}

fn opt(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// The API's view of a journaled operation (`cluster`: its name in the
/// daemon's configuration; `notes`: the preflight's, on a start).
pub fn record_to_proto(record: &OpRecord, cluster: String, notes: Vec<String>) -> proto::Operation {
    proto::Operation {
        id: record.id.clone(),
        cluster,
        kind: record.kind.clone(),
        context: record.context.clone(),
        state: state_name(record.state),
        created: record.created.clone(),
        updated: record.updated.clone(),
        steps: record
            .steps
            .iter()
            .map(|s| proto::Step {
                index: s.index as u32,
                name: s.name.clone(),
                node: s.node.clone().unwrap_or_default(),
                description: s.description.clone(),
                destructive: s.destructive,
                state: step_state_name(s.state),
                started: s.started.clone().unwrap_or_default(),
                finished: s.finished.clone().unwrap_or_default(),
                duration_ms: s.duration_ms.unwrap_or_default(),
                detail: s.detail.clone().unwrap_or_default(),
                fence: s.fence.as_ref().map(|f| proto::Fence {
                    holder: f.holder.clone(),
                    transitions: f.transitions,
                    renewed: f.renewed.clone(),
                }),
                checks: s
                    .checks
                    .iter()
                    .map(|c| proto::Check {
                        check: c.check.name().to_string(),
                        held: c.held,
                        saw: c.saw.clone(),
                        read_at: c.read_at.clone(),
                        gap_ms: c.gap_ms,
                    })
                    .collect(),
            })
            .collect(),
        params_json: record.params.to_string(),
        facts_json: record.facts.to_string(),
        notes,
        ca_fingerprint: record.ca_fingerprint.clone(),
        format: record.format,
        cluster_lock: record.cluster_lock.as_ref().map(lock_to_proto),
    }
}

fn lock_to_proto(lock: &ClusterLockRecord) -> proto::ClusterLock {
    match lock {
        ClusterLockRecord::Held {
            lease,
            holder,
            transitions,
        } => proto::ClusterLock {
            lease: lease.clone(),
            holder: holder.clone(),
            transitions: *transitions,
            without: false,
            reason: String::new(),
        },
        ClusterLockRecord::Without { reason } => proto::ClusterLock {
            lease: format!(
                "{}/{}",
                talos_client::ops::LEASE_NAMESPACE,
                talos_client::ops::LEASE_NAME
            ),
            holder: String::new(),
            transitions: 0,
            without: true,
            reason: reason.clone(),
        },
    }
}

fn lock_from_proto(lock: proto::ClusterLock) -> serde_json::Value {
    use serde_json::json;
    if lock.without {
        json!({"mode": "without", "reason": lock.reason})
    } else {
        json!({"mode": "held", "lease": lock.lease, "holder": lock.holder, "transitions": lock.transitions})
    }
}

/// The journal's record of an operation from the API's view.
pub fn record_from_proto(op: proto::Operation) -> Result<OpRecord, ConvertError> {
    use serde_json::json;
    let steps: Vec<_> = op
        .steps
        .iter()
        .map(|s| {
            let ended = !s.finished.is_empty();
            json!({
                "index": s.index,
                "name": s.name,
                "node": opt(&s.node),
                "description": s.description,
                "destructive": s.destructive,
                "state": s.state,
                "started": opt(&s.started),
                "finished": opt(&s.finished),
                "duration_ms": ended.then_some(s.duration_ms),
                "detail": opt(&s.detail),
                "fence": s.fence.as_ref().map(|f| json!({
                    "holder": f.holder, "transitions": f.transitions, "renewed": f.renewed,
                })),
                "checks": s.checks.iter().map(|c| json!({
                    "check": c.check, "held": c.held, "saw": c.saw,
                    "read_at": c.read_at, "gap_ms": c.gap_ms,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap_or_default();
    serde_json::from_value(json!({
        "id": op.id,
        "kind": op.kind,
        "context": op.context,
        "ca_fingerprint": op.ca_fingerprint,
        "params": parse(&op.params_json),
        "facts": parse(&op.facts_json),
        "format": op.format,
        "state": op.state,
        "created": op.created,
        "updated": op.updated,
        "steps": steps,
        "cluster_lock": op.cluster_lock.map(lock_from_proto),
    }))
    .map_err(|e| ConvertError::Invalid(format!("the daemon's operation record: {e}")))
}

/// A plan as shown before confirmation, from this process's planner or a
/// daemon's: the CLI prints both the same way.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanView {
    /// The kind.
    pub kind: String,
    /// The operation.
    pub spec: serde_json::Value,
    /// The steps.
    pub steps: Vec<PlanStepView>,
    /// The preflight's notes.
    pub notes: Vec<String>,
    /// The preflight's facts.
    pub facts: serde_json::Value,
    /// The plan's fingerprint.
    pub fingerprint: String,
}

/// One step of a [`PlanView`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanStepView {
    /// Its name.
    pub name: String,
    /// Its node, when the operation has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What it does.
    pub description: String,
    /// Whether it changes the cluster.
    pub destructive: bool,
}

impl PlanView {
    /// Whether any step changes the cluster.
    pub fn is_destructive(&self) -> bool {
        self.steps.iter().any(|s| s.destructive)
    }
}

impl From<&Plan> for PlanView {
    fn from(plan: &Plan) -> PlanView {
        PlanView {
            kind: plan.kind.name().into(),
            spec: serde_json::to_value(&plan.spec).unwrap_or_default(),
            steps: plan
                .steps
                .iter()
                .map(|s| PlanStepView {
                    name: s.name.into(),
                    node: s.node.clone(),
                    description: s.description.clone(),
                    destructive: s.destructive,
                })
                .collect(),
            notes: plan.notes.clone(),
            facts: serde_json::to_value(&plan.facts).unwrap_or_default(),
            fingerprint: plan.fingerprint.clone(),
        }
    }
}

/// The plan message of `plan`.
pub fn plan_to_proto(plan: &Plan) -> proto::Plan {
    let view = PlanView::from(plan);
    proto::Plan {
        kind: view.kind,
        steps: view
            .steps
            .into_iter()
            .map(|s| proto::PlannedStep {
                name: s.name,
                node: s.node.unwrap_or_default(),
                description: s.description,
                destructive: s.destructive,
            })
            .collect(),
        notes: view.notes,
        facts_json: view.facts.to_string(),
        spec_json: view.spec.to_string(),
        fingerprint: view.fingerprint,
    }
}

/// Planned steps as a plan shows them.
fn step_views(steps: Vec<proto::PlannedStep>) -> Vec<PlanStepView> {
    steps
        .into_iter()
        .map(|s| PlanStepView {
            node: opt(&s.node).map(str::to_string),
            name: s.name,
            description: s.description,
            destructive: s.destructive,
        })
        .collect()
}

impl From<proto::Plan> for PlanView {
    fn from(plan: proto::Plan) -> PlanView {
        let parse = |text: &str| serde_json::from_str(text).unwrap_or_default();
        PlanView {
            kind: plan.kind,
            spec: parse(&plan.spec_json),
            steps: step_views(plan.steps),
            notes: plan.notes,
            facts: parse(&plan.facts_json),
            fingerprint: plan.fingerprint,
        }
    }
}

impl From<proto::ResumePlan> for PlanView {
    /// A resume's plan as a plan is shown: the operation's kind and
    /// parameters, the steps a resume runs (the one in flight first), its
    /// notes and the fingerprint to confirm with.
    fn from(plan: proto::ResumePlan) -> PlanView {
        let operation = plan.operation.unwrap_or_default();
        let parse = |text: &str| serde_json::from_str(text).unwrap_or_default();
        PlanView {
            kind: operation.kind,
            spec: parse(&operation.params_json),
            steps: step_views(plan.steps),
            notes: plan.notes,
            facts: parse(&operation.facts_json),
            fingerprint: plan.fingerprint,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the CLI sends is what the daemon plans: every spec that can go
    /// through the daemon comes back equal (durations in whole seconds).
    #[test]
    fn specs_survive_the_wire() {
        let mut apply = ApplyOptions::new(vec!["a".into(), "b".into()], "/etc/cp.yaml".into());
        apply.expect_change = vec!["cluster".into()];
        apply.allow_reboot = true;
        apply.try_timeout = Duration::from_secs(90);
        let mut join = JoinOptions::new("10.0.0.9:50001");
        join.maintenance = Some(MaintenanceApply::insecure("/etc/cp.yaml"));
        let mut migrate = MigrateOptions::new("cp-1", "10.0.0.9");
        migrate.maintenance = Some(MaintenanceApply::pinned("/etc/cp.yaml", vec!["fp".into()]));
        migrate.wipe = vec!["STATE".into()];
        migrate.lease_probe = Some(LeaseProbe::new("https://10.0.0.4:6443"));
        let mut retire = RetireOptions::new("cp-1");
        retire.already_left = true;
        let mut probed = RetireOptions::new("cp-2");
        let mut probe = LeaseProbe::new("https://10.0.0.3:7445");
        probe.tls_server_name = Some("localhost".into());
        probe.renew_deadline = Duration::from_secs(3);
        probe.retry_period = Duration::from_millis(600);
        probed.lease_probe = Some(probe);
        let mut unchecked = ApplyOptions::new(vec!["a".into()], "/etc/cp.yaml".into());
        unchecked.kube_check = false;
        let specs = [
            OpSpec::Retire(probed),
            OpSpec::Apply(unchecked),
            OpSpec::Snapshot(SnapshotOptions::new(None, Some(3))),
            OpSpec::Snapshot(SnapshotOptions::default()),
            OpSpec::Retire(retire),
            OpSpec::Join(join),
            OpSpec::Migrate(migrate),
            OpSpec::Apply(apply),
        ];
        for spec in specs {
            let back = spec_from_proto(spec_to_proto(&spec).unwrap());
            assert_eq!(back, spec);
        }
    }

    #[test]
    fn what_stays_local_is_refused_by_name() {
        let mut apply = ApplyOptions::new(vec!["a".into()], "/f".into());
        apply.check = Some("true".into());
        let refused = spec_to_proto(&OpSpec::Apply(apply)).unwrap_err();
        assert!(
            refused.to_string().contains("health-gate command"),
            "{refused}"
        );
        let snapshot = SnapshotOptions::new(Some("/tmp".into()), None);
        assert!(spec_to_proto(&OpSpec::Snapshot(snapshot)).is_err());
    }

    /// Unset numbers take the library's defaults, not the API's own.
    #[test]
    fn zero_means_the_library_default() {
        let spec = spec_from_proto(Kind::Apply(proto::ApplyParams {
            nodes: vec!["n".into()],
            config_path: "/f".into(),
            ..Default::default()
        }));
        let OpSpec::Apply(o) = spec else {
            panic!("{spec:?}")
        };
        assert_eq!(o.try_timeout, ApplyOptions::DEFAULT_TRY_TIMEOUT);
        assert_eq!(o.reboot_timeout, ApplyOptions::DEFAULT_REBOOT_TIMEOUT);
        assert_eq!(o.vip_check, ApplyOptions::DEFAULT_VIP_CHECK);
        let spec = spec_from_proto(Kind::Apply(proto::ApplyParams {
            nodes: vec!["n".into()],
            config_path: "/f".into(),
            vip_check: Some(!ApplyOptions::DEFAULT_VIP_CHECK),
            ..Default::default()
        }));
        let OpSpec::Apply(o) = spec else {
            panic!("{spec:?}")
        };
        assert_eq!(o.vip_check, !ApplyOptions::DEFAULT_VIP_CHECK);
    }
}
