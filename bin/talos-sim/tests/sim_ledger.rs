//! The ledger: the simulator's own record of what happened, checked
//! against what a test did to a real etcd cluster.

use std::time::Duration;

use talos_client::client::ResetRequest;
use talos_sim::ledger::{CallKind, Cause, Down, Entry, Event, Ledger, MemberChange};
use talos_test_support::sim::{SimCluster, wait_for};

/// The quorum events, as (held, voters, serving, the cause's kind of call
/// or fault name).
fn quorum_changes(entries: &[Entry]) -> Vec<(bool, Vec<String>, Vec<String>, String)> {
    entries
        .iter()
        .filter_map(|e| match (&e.event, &e.cause) {
            (
                Event::Quorum {
                    held,
                    voters,
                    serving,
                },
                Some(cause),
            ) => {
                let why = match cause {
                    Cause::Call { kind, .. } => format!("{kind:?}"),
                    Cause::Fault { fault } => fault.clone(),
                    Cause::Simulator { what } => what.clone(),
                };
                Some((*held, voters.clone(), serving.clone(), why))
            }
            _ => None,
        })
        .collect()
}

/// A leave shrinks the voters as the simulator saw it happen (the call
/// recorded with its caller, the removal caused by it); a freeze of one
/// of the two voters left then loses quorum, and a thaw regains it, each
/// caused by the fault. The file holds what memory holds.
#[tokio::test]
async fn membership_and_quorum_follow_a_leave_and_a_freeze() {
    let sim = SimCluster::start(3).await;
    sim.wait_etcd_healthy(3).await;
    let ledger = sim.cluster.ledger();
    assert_eq!(ledger.voters(), ["cp-1", "cp-2", "cp-3"]);
    assert!(ledger.has_quorum());

    let admin = sim.admin();
    // Its own deadline: on a loaded machine etcd's removal alone can take
    // longer than the default 30 s.
    admin
        .with_call_timeout(Duration::from_secs(120))
        .node(sim.ip(2))
        .etcd_leave_cluster()
        .await
        .unwrap();
    assert_eq!(ledger.voters(), ["cp-1", "cp-3"]);
    assert!(ledger.has_quorum(), "two of two serve");

    let cp3 = sim.cluster.node("cp-3").unwrap();
    let frozen = talos_sim::ledger::with_cause(Cause::fault("freeze-etcd"), cp3.freeze_etcd());
    assert!(frozen.await);
    assert!(!ledger.has_quorum(), "one of two serves");
    let thawed = talos_sim::ledger::with_cause(Cause::fault("thaw-etcd"), cp3.thaw_etcd());
    assert!(thawed.await);
    assert!(ledger.has_quorum());

    let entries = ledger.entries();
    let two = vec!["cp-1".to_string(), "cp-3".to_string()];
    assert_eq!(
        quorum_changes(&entries),
        [
            (
                false,
                two.clone(),
                vec!["cp-1".to_string()],
                "freeze-etcd".to_string()
            ),
            (true, two.clone(), two, "thaw-etcd".to_string()),
        ]
    );
    // The leave: handled by cp-2, sent by the admin certificate from the
    // test's address, entering by the talosconfig's first endpoint.
    let (call, caller) = entries
        .iter()
        .find_map(|e| match &e.event {
            Event::Call {
                call,
                node,
                kind: CallKind::Leave,
                caller,
                ..
            } if node == "cp-2" => Some((*call, caller.clone())),
            _ => None,
        })
        .expect("the leave call is recorded");
    assert!(caller.subject.contains("O=os:admin"), "{caller:?}");
    assert!(caller.peer.is_some(), "{caller:?}");
    assert_eq!(caller.entry, "cp-1");
    let removed = entries.iter().find(|e| {
        matches!(
            &e.event,
            Event::Member {
                change: MemberChange::Removed,
                name,
                ..
            } if name == "cp-2"
        )
    });
    assert!(
        matches!(removed.and_then(|e| e.cause.clone()), Some(Cause::Call { call: c, .. }) if c == call),
        "{removed:?}"
    );
    let file = Ledger::read(ledger.path().unwrap()).unwrap();
    assert_eq!(file, ledger.entries());
}

/// A reset of a serving voter goes down as one, with the quorum the
/// others keep; a reboot of a voter while another is off goes down with
/// no quorum left, and the ledger names the reboot as the loss's cause.
#[tokio::test]
async fn a_reset_and_a_reboot_record_whether_the_node_was_a_live_voter() {
    let sim = SimCluster::start(3).await;
    sim.wait_etcd_healthy(3).await;
    let admin = sim.admin();
    let reset = ResetRequest::default()
        .with_graceful(false)
        .with_reboot(false)
        .with_system_labels_to_wipe(vec!["STATE".into(), "EPHEMERAL".into()]);
    admin.node(sim.ip(3)).reset(reset).await.unwrap();
    let ledger = sim.cluster.ledger();
    let downs = || {
        ledger
            .entries()
            .into_iter()
            .filter_map(|e| match e.event {
                Event::Down {
                    node,
                    how,
                    voter,
                    live,
                    quorum_without,
                    ..
                } => Some((node, how, voter, live, quorum_without)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    wait_for("cp-3 to go down", Duration::from_secs(30), || async {
        (!downs().is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        downs(),
        [("cp-3".to_string(), Down::Reset, true, true, true)]
    );
    assert!(ledger.has_quorum(), "two of three serve");

    admin
        .node(sim.ip(2))
        .reboot(talos_client::client::RebootMode::Default)
        .await
        .unwrap();
    wait_for("cp-2 to go down", Duration::from_secs(30), || async {
        (downs().len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        downs()[1],
        ("cp-2".to_string(), Down::Reboot, true, true, false)
    );
    wait_for("cp-2 to come back", Duration::from_secs(60), || async {
        ledger.has_quorum().then_some(())
    })
    .await;
    let changes = quorum_changes(&ledger.entries());
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(
        (changes[0].0, changes[0].3.as_str()),
        (false, "Reboot"),
        "{changes:?}"
    );
    assert!(changes[1].0, "{changes:?}");
}
