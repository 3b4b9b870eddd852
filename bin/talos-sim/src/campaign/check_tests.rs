//! The checks find what they are for: ledgers recorded through the
//! ledger's own methods, as the simulator records them (the quorum
//! entries and their causes are the ledger's, not written here), fed to
//! [`check`].

use std::time::Duration;

use super::check::{Known, Violation, check};
use super::run::Gathered;
use crate::ledger::{CallKind, Caller, Cause, Down, EtcdState, Ledger, with_cause};

const OPERATOR: &str = "CN=campaign-operator,O=os:admin";
const PREPARATION: &str = "CN=campaign-preparation,O=os:admin";

/// Three voters cp-1..cp-3, each on and serving.
fn three_voters() -> Ledger {
    let ledger = Ledger::in_memory();
    for node in ["cp-1", "cp-2", "cp-3"] {
        ledger.power(node, true, "on");
        ledger.etcd(node, EtcdState::Running);
    }
    ledger.seed_members([(1, "cp-1".into()), (2, "cp-2".into()), (3, "cp-3".into())]);
    assert!(ledger.has_quorum());
    ledger
}

fn caller(subject: &str) -> Caller {
    Caller {
        subject: subject.into(),
        peer: None,
        entry: "cp-1".into(),
    }
}

/// `subject` resets cp-2 (as the simulator records a reset: the call,
/// then the node going down and its etcd stopping, under the call's
/// cause), after reading cp-1's members when `read_first`.
async fn reset_cp2(ledger: &Ledger, subject: &str) {
    let cause = ledger.call(
        "cp-2",
        "/machine.MachineService/Reset",
        CallKind::Reset,
        caller(subject),
    );
    with_cause(cause, async {
        ledger.down("cp-2", Down::Reset, &["EPHEMERAL".into()]);
        ledger.etcd("cp-2", EtcdState::Stopped);
        ledger.power("cp-2", false, "rebooting");
    })
    .await;
}

async fn freeze_cp3(ledger: &Ledger) {
    with_cause(Cause::fault("freeze"), async {
        ledger.etcd("cp-3", EtcdState::Frozen);
    })
    .await;
}

fn violations(ledger: &Ledger) -> Vec<Violation> {
    let name_of = |address: &str| Some(address.to_string());
    let known = Known {
        ours: vec![OPERATOR.into()],
        name_of: &name_of,
    };
    let gathered = Gathered {
        faults: Vec::new(),
        procs: Vec::new(),
        operator: Vec::new(),
        second: Vec::new(),
        ledger: ledger.entries(),
        bound: Duration::from_secs(60),
        overran: Vec::new(),
        unreadable: Vec::new(),
    };
    check(&known, &gathered)
}

fn invariants(found: &[Violation]) -> Vec<&'static str> {
    found.iter().map(|v| v.invariant).collect()
}

/// cp-3 frozen by a fault, then the operator resets cp-2 without reading
/// anything: the reset took quorum (I1) and took down a live voter (I2).
#[tokio::test]
async fn a_reset_that_loses_quorum_breaks_i1_and_i2() {
    let ledger = three_voters();
    freeze_cp3(&ledger).await;
    assert!(ledger.has_quorum(), "two of three still serve");
    reset_cp2(&ledger, OPERATOR).await;
    assert!(!ledger.has_quorum());
    let found = violations(&ledger);
    assert_eq!(invariants(&found), ["I1", "I2"], "{found:#?}");
    assert!(found[0].what.contains("Reset on cp-2"), "{found:#?}");
    assert!(
        found[1].what.contains("cp-2 reset while a live voter"),
        "{found:#?}"
    );
}

/// The same reset sent by the campaign's preparation is not an
/// operation's: nothing to report.
#[tokio::test]
async fn the_same_reset_by_another_host_is_not_held_against_the_operations() {
    let ledger = three_voters();
    freeze_cp3(&ledger).await;
    reset_cp2(&ledger, PREPARATION).await;
    assert!(!ledger.has_quorum());
    assert_eq!(violations(&ledger), []);
}

/// The operator read the members (a fresh check), then the fault struck,
/// then the reset: no check could have seen the freeze, so the loss is
/// excused; without the fault there is no loss at all.
#[tokio::test]
async fn a_fault_after_a_fresh_read_excuses_the_loss() {
    let ledger = three_voters();
    ledger.call(
        "cp-1",
        "/machine.MachineService/EtcdMemberList",
        CallKind::MemberList,
        caller(OPERATOR),
    );
    freeze_cp3(&ledger).await;
    reset_cp2(&ledger, OPERATOR).await;
    assert!(!ledger.has_quorum());
    // The reset of a live voter is I2 whatever the others did: a reset
    // takes a member's data for good.
    assert_eq!(invariants(&violations(&ledger)), ["I2"]);

    let quiet = three_voters();
    reset_cp2(&quiet, OPERATOR).await;
    assert!(quiet.has_quorum());
    assert_eq!(invariants(&violations(&quiet)), ["I2"]);
}

/// A journal record of kind `op` with `params` (as `ops list -o json`
/// writes them), in progress from `from` to `to` (seconds of one minute).
fn record(id: &str, params: serde_json::Value, from: u32, to: u32) -> serde_json::Value {
    serde_json::json!({
        "id": id,
        "kind": params["op"],
        "state": "succeeded",
        "params": params,
        "created": format!("2026-12-07T17:42:{from:02}Z"),
        "updated": format!("2026-12-07T17:42:{to:02}Z"),
        "steps": [],
        "facts": {},
    })
}

fn apply_params() -> serde_json::Value {
    serde_json::json!({"allow_issuer_change": [], "allow_reboot": false, "check": null,
        "config_path": "/tmp/apply.yaml", "expect_change": ["machine.certSANs"],
        "kube_check": true, "nodes": ["127.0.0.12"], "op": "apply",
        "reboot_timeout_ms": 600000, "try_timeout_ms": 60000, "vip_check": true})
}

fn i5(operator: Vec<serde_json::Value>, second: Vec<serde_json::Value>) -> Vec<&'static str> {
    let name_of = |address: &str| Some(address.to_string());
    let known = Known {
        ours: vec![OPERATOR.into(), PREPARATION.into()],
        name_of: &name_of,
    };
    let gathered = Gathered {
        faults: Vec::new(),
        procs: Vec::new(),
        operator,
        second,
        ledger: Vec::new(),
        bound: Duration::from_secs(60),
        overran: Vec::new(),
        unreadable: Vec::new(),
    };
    let found = check(&known, &gathered);
    found
        .iter()
        .filter(|v| v.invariant == "I5")
        .map(|v| v.invariant)
        .collect()
}

/// Two applies of two hosts at once break I5; a snapshot (read-only, no
/// cluster lock by design) beside an apply does not, nor do two applies
/// one after the other.
#[test]
fn i5_counts_the_operations_that_may_change_the_cluster() {
    let apply = |id, from, to| record(id, apply_params(), from, to);
    let snapshot = serde_json::json!({"dir": null, "keep": null, "op": "snapshot"});
    assert_eq!(
        i5(vec![apply("a", 10, 30)], vec![apply("b", 20, 25)]),
        ["I5"]
    );
    assert_eq!(
        i5(
            vec![apply("a", 10, 30)],
            vec![record("s", snapshot, 20, 21)]
        ),
        Vec::<&str>::new()
    );
    assert_eq!(
        i5(vec![apply("a", 10, 20)], vec![apply("b", 21, 25)]),
        Vec::<&str>::new()
    );
}
