//! Every step of every operation declares a precondition exactly when it
//! is destructive, and the engine can build each declared check from the
//! operation's facts.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::client::MemberId;
use crate::ops::apply::{ApplyFacts, ApplyPhase, ApplyStep};
use crate::ops::defrag::{DefragFacts, DefragMember, DefragPhase, DefragStep};
use crate::ops::drill::DrillStep;
use crate::ops::join::{JoinFacts, JoinStep, PlannedMaintenance};
use crate::ops::migrate::{MigrateFacts, MigrateStep};
use crate::ops::restore::{RestoreFacts, RestoreStep};
use crate::ops::retire::{PlannedMember, RetireFacts, RetireStep};
use crate::ops::snapshot::SnapshotStep;
use crate::ops::upgrade::{UpgradeFacts, UpgradeNode, UpgradePhase, UpgradeStep};

const NODE: &str = "10.5.0.2";

// Each list below sits beside an exhaustive match of the same enum: a new
// variant does not compile until it is listed here too.

fn retire_steps() -> Vec<RetireStep> {
    use RetireStep::*;
    let all = vec![
        Snapshot, Check, Forfeit, Leave, Remove, Reset, Confirm, WaitSilent,
    ];
    for s in &all {
        match s {
            Snapshot | Check | Forfeit | Leave | Remove | Reset | Confirm | WaitSilent => {}
        }
    }
    all
}

fn join_steps() -> Vec<JoinStep> {
    let all = vec![JoinStep::ApplyConfig, JoinStep::WaitVoter];
    for s in &all {
        match s {
            JoinStep::ApplyConfig | JoinStep::WaitVoter => {}
        }
    }
    all
}

fn apply_phases() -> Vec<ApplyPhase> {
    use ApplyPhase::*;
    let all = vec![Try, Gate, Confirm, Reboot, WaitBack];
    for p in &all {
        match p {
            Try | Gate | Confirm | Reboot | WaitBack => {}
        }
    }
    all
}

fn defrag_phases() -> Vec<DefragPhase> {
    use DefragPhase::*;
    let all = vec![Check, Forfeit, Defrag, Disarm];
    for p in &all {
        match p {
            Check | Forfeit | Defrag | Disarm => {}
        }
    }
    all
}

fn upgrade_phases() -> Vec<UpgradePhase> {
    use UpgradePhase::*;
    let all = vec![Check, Snapshot, Forfeit, Upgrade, WaitBack];
    for p in &all {
        match p {
            Check | Snapshot | Forfeit | Upgrade | WaitBack => {}
        }
    }
    all
}

fn restore_steps() -> Vec<RestoreStep> {
    use RestoreStep::*;
    let all = vec![Verify, Upload, Bootstrap, Check, Rejoin];
    for s in &all {
        match s {
            Verify | Upload | Bootstrap | Check | Rejoin => {}
        }
    }
    all
}

fn snapshot_steps() -> Vec<SnapshotStep> {
    let all = vec![SnapshotStep::Snapshot, SnapshotStep::Retention];
    for s in &all {
        match s {
            SnapshotStep::Snapshot | SnapshotStep::Retention => {}
        }
    }
    all
}

fn migrate_steps() -> Vec<MigrateStep> {
    let mut all: Vec<MigrateStep> = join_steps().into_iter().map(MigrateStep::Join).collect();
    all.push(MigrateStep::CheckRetire);
    all.extend(retire_steps().into_iter().map(MigrateStep::Retire));
    for s in &all {
        match s {
            MigrateStep::Join(_) | MigrateStep::CheckRetire | MigrateStep::Retire(_) => {}
        }
    }
    all
}

fn retire_facts() -> RetireFacts {
    RetireFacts {
        address: NODE.into(),
        member: Some(PlannedMember {
            member_id: MemberId(2),
            hostname: "cp-2".into(),
        }),
        leads: None,
        dead: false,
        identity: None,
        source: None,
        wipe: vec!["STATE".into()],
        snapshot_dir: PathBuf::from("/s"),
        silence_timeout: Duration::from_secs(1),
        snapshot: None,
        leave_to_reset_gap_ms: None,
        api_server_accepting: None,
        lease_probe: None,
        lease_renewals: None,
    }
}

fn join_facts() -> JoinFacts {
    JoinFacts {
        node: NODE.into(),
        timeout: Duration::from_secs(1),
        maintenance: Some(PlannedMaintenance {
            config_path: PathBuf::from("/c.yaml"),
            config_sha256: "00".into(),
            cert_fingerprints: Vec::new(),
        }),
        join_seconds: None,
    }
}

/// Every step of every operation, with facts of its operation as a plan
/// (and, for a confirmation, its try) would have recorded them.
fn every_step() -> Vec<(Step, Facts)> {
    let mut all = Vec::new();
    for s in snapshot_steps() {
        let facts: Facts = serde_json::from_value(serde_json::json!({
            "op": "snapshot", "source": {"name": "cp-1", "address": NODE},
            "dir": "/s", "keep": 0, "snapshot": null
        }))
        .unwrap();
        all.push((Step::Snapshot(s), facts));
    }
    for s in retire_steps() {
        all.push((Step::Retire(s), Facts::Retire(retire_facts())));
    }
    for s in join_steps() {
        all.push((Step::Join(s), Facts::Join(join_facts())));
    }
    for s in migrate_steps() {
        let facts = MigrateFacts {
            join: join_facts(),
            retire: retire_facts(),
        };
        all.push((Step::Migrate(s), Facts::Migrate(facts)));
    }
    for phase in apply_phases() {
        let mut facts = ApplyFacts::default();
        facts.try_deadline_ms.insert(NODE.into(), 1);
        let step = ApplyStep {
            phase,
            node: NODE.into(),
        };
        all.push((Step::Apply(step), Facts::Apply(facts)));
    }
    let drill: Facts = serde_json::from_value(serde_json::json!({
        "op": "drill", "store": "/b", "key": "k", "revision": 1, "report": null
    }))
    .unwrap();
    all.push((Step::Drill(DrillStep::Drill), drill));
    for phase in defrag_phases() {
        let facts = DefragFacts {
            members: vec![DefragMember {
                hostname: "cp-2".into(),
                address: NODE.into(),
                member_id: MemberId(2),
                db_size: 1,
                db_size_in_use: 1,
                leads: false,
                db_size_after: None,
            }],
            nospace: Vec::new(),
        };
        let step = DefragStep {
            phase,
            node: NODE.into(),
        };
        all.push((Step::Defrag(step), Facts::Defrag(facts)));
    }
    for phase in upgrade_phases() {
        let facts = UpgradeFacts {
            target: "v1.14.0".into(),
            nodes: vec![UpgradeNode {
                hostname: "cp-2".into(),
                address: NODE.into(),
                member_id: MemberId(2),
                worker: false,
                leads: false,
                version: "v1.13.9".into(),
            }],
            snapshot_dir: PathBuf::from("/s"),
            source: None,
            snapshot: None,
            boot_ids: Default::default(),
            sent_ms: Default::default(),
        };
        let step = UpgradeStep {
            phase,
            node: NODE.into(),
        };
        all.push((Step::Upgrade(step), Facts::Upgrade(facts)));
    }
    for s in restore_steps() {
        let facts = RestoreFacts {
            snapshot: PathBuf::from("/s/db"),
            sha256: "00".into(),
            revision: 1,
            total_keys: 1,
            node: NODE.into(),
            others: vec!["10.5.0.3".into()],
            restored: None,
            proof: None,
            fetched_from: None,
        };
        all.push((Step::Restore(s), Facts::Restore(facts)));
    }
    // Every kind is here.
    for kind in [
        OpKind::Snapshot,
        OpKind::Retire,
        OpKind::Join,
        OpKind::Migrate,
        OpKind::Apply,
        OpKind::Drill,
        OpKind::Defrag,
        OpKind::Upgrade,
        OpKind::Restore,
    ] {
        match kind {
            OpKind::Snapshot
            | OpKind::Retire
            | OpKind::Join
            | OpKind::Migrate
            | OpKind::Apply
            | OpKind::Drill
            | OpKind::Defrag
            | OpKind::Upgrade
            | OpKind::Restore => {}
        }
        assert!(
            all.iter().any(|(s, _)| step_kind(s) == kind),
            "no step of {kind:?}"
        );
    }
    all
}

fn step_kind(step: &Step) -> OpKind {
    match step {
        Step::Snapshot(_) => OpKind::Snapshot,
        Step::Retire(_) => OpKind::Retire,
        Step::Join(_) => OpKind::Join,
        Step::Migrate(_) => OpKind::Migrate,
        Step::Apply(_) => OpKind::Apply,
        Step::Drill(_) => OpKind::Drill,
        Step::Defrag(_) => OpKind::Defrag,
        Step::Upgrade(_) => OpKind::Upgrade,
        Step::Restore(_) => OpKind::Restore,
    }
}

#[test]
fn every_destructive_step_declares_a_check_and_only_those() {
    let all = every_step();
    let destructive = all.iter().filter(|(s, _)| s.destructive()).count();
    assert!(destructive >= 20, "{destructive} destructive steps");
    for (step, _) in &all {
        assert_eq!(
            step.destructive(),
            step.precondition().is_some(),
            "{:?}: destructive {} but precondition {:?}",
            step,
            step.destructive(),
            step.precondition()
        );
    }
}

#[test]
fn the_engine_builds_every_declared_check_from_the_facts() {
    for (step, facts) in every_step() {
        let check = step
            .check(&facts)
            .unwrap_or_else(|e| panic!("{step:?}: {e}"));
        assert_eq!(
            check.as_ref().map(|c| c.kind()),
            step.precondition(),
            "{step:?}"
        );
    }
}

/// The checks named in the plan of a step: what each destructive step
/// waits on, pinned so that a change to it is a visible decision.
#[test]
fn each_destructive_step_checks_what_it_puts_at_risk() {
    use crate::ops::CheckKind::*;
    let want = [
        ("retire forfeit", QuorumWithout),
        ("retire leave", QuorumWithout),
        ("retire remove", QuorumWithout),
        ("retire reset", OutOfEtcd),
        ("join apply-config", InMaintenance),
        ("apply try", ApplyReady),
        ("apply confirm", TryPending),
        ("apply reboot", ApplyReady),
        ("defrag forfeit", VotersHealthy),
        ("defrag defrag", VotersHealthy),
        ("defrag disarm", VotersHealthy),
        ("upgrade forfeit", VotersHealthy),
        ("upgrade upgrade", VotersHealthy),
        ("restore upload", QuorumLost),
        ("restore bootstrap", QuorumLost),
    ];
    for (step, _) in every_step() {
        let Some(kind) = step.precondition() else {
            continue;
        };
        let name = format!("{} {}", step_kind(&step).name(), step.name());
        if let Step::Migrate(_) = step {
            continue;
        }
        let expected = want
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} is destructive and not pinned here"));
        assert_eq!(kind, expected.1, "{name}");
    }
}
