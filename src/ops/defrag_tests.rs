//! The defragmentation's tests: its order, ratios, reclaimed sizes in
//! words, and what its plan's fingerprint covers.

use super::*;

fn member(name: &str, size: i64, in_use: i64, leads: bool) -> DefragMember {
    DefragMember {
        hostname: name.into(),
        address: format!("10.0.0.{}", name.len()),
        member_id: MemberId(name.len() as u64),
        db_size: size,
        db_size_in_use: in_use,
        leads,
        db_size_after: None,
    }
}

#[test]
fn the_leader_goes_last_after_a_forfeit_and_the_disarm_follows_all() {
    let mut leader = member("cp-1", 100, 10, true);
    leader.address = "10.0.0.1".into();
    let mut follower = member("cp-2", 100, 10, false);
    follower.address = "10.0.0.2".into();
    let facts = DefragFacts {
        members: vec![follower, leader],
        nospace: vec![MemberId(7)],
    };
    let steps: Vec<(String, Option<String>)> = defrag_steps(&facts)
        .iter()
        .map(|s| (s.name.to_string(), s.node.clone()))
        .collect();
    let at = |n: &str| Some(n.to_string());
    assert_eq!(
        steps,
        [
            ("check".into(), None),
            ("defrag".into(), at("10.0.0.2")),
            ("forfeit".into(), at("10.0.0.1")),
            ("defrag".into(), at("10.0.0.1")),
            ("disarm".into(), at("10.0.0.1")),
        ]
    );
}

/// A database that grew while it was defragmented is said to have
/// grown, in words, never "-212.0 KiB reclaimed".
#[test]
fn a_database_that_grew_is_reported_in_words() {
    let grew = size_change("cp-1", 20 << 10, 232 << 10);
    assert_eq!(
        grew,
        "cp-1: 20.0 KiB -> 232.0 KiB: the database grew by 212.0 KiB while it ran (writes went on), nothing to report as reclaimed"
    );
    assert!(!grew.contains("-212"), "{grew}");
    assert_eq!(
        size_change("cp-2", 4 << 20, 1 << 20),
        "cp-2: 4.0 MiB -> 1.0 MiB, 3.0 MiB reclaimed"
    );
}

/// Two plans of the same defragmentation whose members' databases
/// changed size in between have the same fingerprint; a change of the
/// members or their order does not.
#[test]
fn the_fingerprint_does_not_cover_database_sizes() {
    let plan = |a: i64, b: i64, leader_first: bool| {
        let mut first = member("cp-1", a, a / 10, false);
        first.address = "10.0.0.1".into();
        let mut second = member("cp-2", b, b / 10, true);
        second.address = "10.0.0.2".into();
        let members = if leader_first {
            vec![second, first]
        } else {
            vec![first, second]
        };
        let facts = DefragFacts {
            members,
            nospace: Vec::new(),
        };
        let steps = defrag_steps(&facts);
        Plan::new(
            OpSpec::Defrag(DefragOptions::new()),
            steps,
            vec![format!("{a} bytes")],
            Facts::Defrag(facts),
            "basis",
        )
    };
    let before = plan(20 << 10, 24 << 10, false);
    let busy = plan(232 << 10, 300 << 10, false);
    assert_eq!(before.fingerprint, busy.fingerprint);
    assert_ne!(
        before.fingerprint,
        plan(20 << 10, 24 << 10, true).fingerprint
    );
}

#[test]
fn ratios_and_reclaimed_bytes() {
    let mut m = member("cp-1", 4 << 20, 1 << 20, false);
    assert!((m.ratio() - 0.25).abs() < 1e-9);
    assert_eq!(m.reclaimed(), None);
    m.db_size_after = Some(1 << 20);
    assert_eq!(m.reclaimed(), Some(3 << 20));
    assert_eq!(member("x", 0, 0, false).ratio(), 1.0);
    assert!(only_nospace(&["memberID:1 alarm:NOSPACE".into()]));
    assert!(!only_nospace(&["etcdserver: no leader".into()]));
}
