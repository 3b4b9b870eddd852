//! The simulator's etcd calls, through our client, against real etcd.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use sha2::Digest as _;
use talos_client::Error;
use talos_client::client::MemberId;

#[tokio::test]
async fn snapshot_carries_a_sha256_trailer_of_its_contents() {
    let sim = SimCluster::start(3).await;
    let client = sim.admin();
    // Through apid on node 1, proxied to node 2.
    let stream = client.node(sim.ip(2)).etcd_snapshot().await.unwrap();
    let path = sim.dir.path().join("snap.db");
    let size = talos_test_support::stream_to_file(stream, &path)
        .await
        .unwrap();
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data.len() as u64, size);
    assert_eq!(size % 512, 32, "a bbolt file plus a 32-byte trailer");
    let (contents, trailer) = data.split_at(data.len() - 32);
    assert_eq!(sha2::Sha256::digest(contents).as_slice(), trailer);
}

#[tokio::test]
async fn leave_removes_the_member_and_the_node_keeps_answering() {
    let sim = SimCluster::start(3).await;
    let client = sim.admin();
    let leaver = client.node(sim.ip(3));
    leaver.etcd_leave_cluster().await.expect("leave");

    let members = client
        .node(sim.ip(1))
        .etcd_member_list(false)
        .await
        .unwrap();
    let names: Vec<_> = members.iter().map(|m| m.hostname.as_str()).collect();
    assert_eq!(members.len(), 2, "{names:?}");
    assert!(!names.contains(&"cp-3"));
    // The node that left still answers the API, as real Talos does...
    assert_eq!(leaver.version().await.unwrap().tag, "v1.13.9");
    // ...but has no etcd any more (its etcd calls wait for one until the
    // caller's deadline), and its data is gone.
    let status = client
        .with_call_timeout(std::time::Duration::from_millis(500))
        .node(sim.ip(3))
        .etcd_status()
        .await;
    assert!(
        matches!(status, Err(Error::DeadlineExceeded(_))),
        "{status:?}"
    );
    let node = sim.cluster.node("cp-3").unwrap();
    assert!(!node.etcd_data_dir().exists());
}

#[tokio::test]
async fn status_forfeit_and_remove_member() {
    let sim = SimCluster::start(3).await;
    let client = sim.admin();
    let statuses = client
        .nodes([sim.ip(1), sim.ip(2), sim.ip(3)])
        .etcd_status()
        .await
        .unwrap();
    let statuses: Vec<_> = statuses
        .into_iter()
        .map(|r| (r.node, r.result.unwrap()))
        .collect();
    let leader_id = statuses[0].1.leader;
    assert!(
        statuses
            .iter()
            .all(|(_, s)| s.leader == leader_id && !s.is_learner)
    );
    // Talos 1.13.9 runs etcd v3.6.12, whose storage version is 3.6.0.
    assert_eq!(statuses[0].1.protocol_version, "3.6.12");
    assert_eq!(statuses[0].1.storage_version, "3.6.0");
    let (leader_node, _) = statuses
        .iter()
        .find(|(_, s)| s.is_leader())
        .expect("a leader");

    // A follower is not the leader: nothing to forfeit.
    let (follower, _) = statuses.iter().find(|(_, s)| !s.is_leader()).unwrap();
    assert_eq!(
        client
            .node(follower.as_str())
            .etcd_forfeit_leadership()
            .await
            .unwrap(),
        None
    );

    let new_leader = client
        .node(leader_node.as_str())
        .etcd_forfeit_leadership()
        .await
        .unwrap()
        .expect("the leader hands over");
    let status = wait_for("leadership to move", Duration::from_secs(10), || async {
        let s = client.node(leader_node.as_str()).etcd_status().await.ok()?;
        (s.leader != leader_id && s.leader.0 != 0).then_some(s)
    })
    .await;
    let members = client.etcd_member_list(false).await.unwrap();
    let leader_member = members.iter().find(|m| m.id == status.leader).unwrap();
    assert_eq!(leader_member.hostname, new_leader);

    match client.etcd_remove_member_by_id(MemberId(0x1234)).await {
        Err(Error::NotFound(f)) => assert!(f.message.contains("member not found"), "{f}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[tokio::test]
async fn alarms_defragment_and_services() {
    let sim = SimCluster::start(3).await;
    let client = sim.admin().node(sim.ip(1));
    assert!(client.etcd_alarm_list().await.unwrap().is_empty());

    let status = client.etcd_status().await.unwrap();
    let etcd = talos_sim::etcd_client::EtcdClient::connect(
        &[sim.cluster.nodes()[0].etcd_client_url.clone()],
        &sim.cluster.etcd_pki(),
    )
    .await
    .unwrap();
    etcd.alarm_activate(
        status.member_id.0,
        talos_sim::api::etcdserverpb::AlarmType::Nospace,
    )
    .await
    .unwrap();
    let alarms = client.etcd_alarm_list().await.unwrap();
    assert_eq!(alarms.len(), 1);
    assert_eq!(alarms[0].member_id, status.member_id);
    assert_eq!(alarms[0].alarm, talos_client::client::AlarmType::Nospace);
    let disarmed = client.etcd_alarm_disarm().await.unwrap();
    assert_eq!(disarmed.len(), 1);
    assert!(client.etcd_alarm_list().await.unwrap().is_empty());

    client.etcd_defragment().await.expect("defragment");

    // Healthy once the service's first health check has run.
    let etcd = wait_for("etcd to be healthy", Duration::from_secs(10), || async {
        let services = client.service_list().await.ok()?;
        services
            .into_iter()
            .find(|s| s.id == "etcd" && s.health.healthy)
    })
    .await;
    assert_eq!(etcd.state, "Running");
    assert_eq!(client.hostname().await.unwrap(), "cp-1");
}

#[tokio::test]
async fn an_added_node_joins_as_learner_and_is_promoted() {
    let sim = SimCluster::start(3).await;
    let client = sim.admin();
    let added = sim.cluster.add_node().await.expect("add node");
    assert_eq!(added.name, "cp-4");

    let members = client.etcd_member_list(false).await.unwrap();
    assert_eq!(members.len(), 4);
    let promoted = wait_for(
        "cp-4 to become a voter",
        Duration::from_secs(60),
        || async {
            let members = client.etcd_member_list(false).await.ok()?;
            let m = members.into_iter().find(|m| m.hostname == "cp-4")?;
            (!m.is_learner).then_some(m)
        },
    )
    .await;
    assert!(!promoted.is_learner);
    // The new node serves the API like the others.
    assert_eq!(
        client.node(added.ip.to_string()).hostname().await.unwrap(),
        "cp-4"
    );
}

#[tokio::test]
async fn a_membership_change_right_after_the_leader_leaves_is_one_call_as_on_talos() {
    // Talos retries a leave refused as "unhealthy cluster" for 5 minutes;
    // scaled down it is 30 s, which one slow removal of the leader on a
    // loaded machine outlasted. Two minutes here, still within upstream's.
    let sim = SimCluster::start_with(3, |cfg| {
        cfg.timing.leave_retry_limit = Duration::from_secs(120);
    })
    .await;
    let client = sim.admin();
    // Whichever node leads is the one that leaves.
    let leader_ip = sim.leader().await;
    let leader = client.node(leader_ip.as_str());
    let survivor = (1..=3)
        .map(|i| sim.ip(i))
        .find(|ip| *ip != leader_ip)
        .unwrap();
    let id = leader.etcd_status().await.unwrap().member_id;
    // On a loaded machine etcd's removal of its leader alone can take
    // longer than the client's default 30 s call deadline.
    client
        .with_call_timeout(Duration::from_secs(120))
        .node(leader_ip.as_str())
        .etcd_leave_cluster()
        .await
        .unwrap();
    wait_for(
        "a survivor to apply the removal",
        Duration::from_secs(20),
        || async {
            let members = client
                .node(survivor.as_str())
                .etcd_member_list(true)
                .await
                .ok()?;
            (members.len() == 2).then_some(())
        },
    )
    .await;
    // etcd drops a membership proposal made while the new leader still has
    // the removal unapplied, and the call then waits for its deadline: a
    // Talos node makes one MemberRemove and does not propose it again
    // (v1alpha1_server.go, EtcdRemoveMemberByID). Answered or not, it ends
    // no later than the caller's deadline, and a later call is answered.
    let short = client.with_call_timeout(Duration::from_secs(10));
    let survivor_client = short.node(survivor.as_str());
    let started = std::time::Instant::now();
    match survivor_client.etcd_remove_member_by_id(id).await {
        Err(Error::NotFound(_)) => {}
        Err(Error::DeadlineExceeded(_)) => {
            assert!(started.elapsed() >= Duration::from_secs(9));
        }
        other => panic!("expected NotFound or the caller's deadline, got {other:?}"),
    }
    wait_for(
        "the departed member's removal answered NotFound",
        Duration::from_secs(60),
        || async {
            match survivor_client.etcd_remove_member_by_id(id).await {
                Err(Error::NotFound(_)) => Some(()),
                _ => None,
            }
        },
    )
    .await;
}

/// Forfeits leadership on the current leader and checks upstream's rule
/// (internal/pkg/etcd/etcd.go): the target is the first other member in
/// etcd's member list (ordered by id), learners included; a learner target
/// makes etcd refuse the move and the call fail, leaving the leader as it
/// was. Returns whether the target was the learner.
async fn forfeit_follows_upstreams_rule(
    sim: &SimCluster,
    etcd: &talos_sim::etcd_client::EtcdClient,
) -> bool {
    let leader_ip = sim.leader().await;
    let leader = sim.admin().node(leader_ip.as_str());
    let before = leader.etcd_status().await.unwrap();
    let mut members = etcd.member_list().await.unwrap();
    members.sort_by_key(|m| m.id);
    let target = members
        .iter()
        .find(|m| m.id != before.member_id.0)
        .unwrap()
        .clone();
    let result = leader.etcd_forfeit_leadership().await;
    if target.is_learner {
        let err = result.expect_err("moving leadership to a learner fails");
        assert!(
            err.to_string().contains("failed to forfeit leadership"),
            "{err}"
        );
        assert_eq!(leader.etcd_status().await.unwrap().leader, before.leader);
    } else {
        assert_eq!(result.unwrap().as_deref(), Some(target.name.as_str()));
    }
    target.is_learner
}

#[tokio::test]
async fn forfeit_picks_the_first_other_member_even_a_learner() {
    let sim = SimCluster::start(3).await;
    let urls: Vec<String> = sim
        .cluster
        .nodes()
        .iter()
        .map(|n| n.etcd_client_url.clone())
        .collect();
    let etcd = talos_sim::etcd_client::EtcdClient::connect(&urls, &sim.cluster.etcd_pki())
        .await
        .unwrap();
    let mut voters: Vec<u64> = etcd
        .member_list()
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    voters.sort();
    // Member ids are random. A learner (never started) whose id sorts below
    // the second-lowest voter is the first "other" member of the lowest
    // voter, or of any voter when it sorts lowest; re-add it until so. The
    // chance that 300 tries all miss is below 1e-4 even over unlucky voter
    // ids, and the rule is still checked on whatever order results. etcd
    // refuses additions ("unhealthy cluster") until every voter has been
    // connected for five seconds.
    let mut learner = 0;
    for port in 1..=300u16 {
        let url = format!("http://127.0.0.1:{port}");
        let added = wait_for(
            "etcd to accept a learner",
            Duration::from_secs(30),
            || async { etcd.member_add(&url, true).await.ok() },
        )
        .await;
        learner = added.id;
        if learner < voters[1] || port == 300 {
            break;
        }
        etcd.member_remove(learner).await.unwrap();
    }

    // At most three hand-overs reach the learner's turn: the leader moves to
    // the first other voter until the learner is the first other member.
    let mut reached_learner = false;
    for _ in 0..3 {
        if forfeit_follows_upstreams_rule(&sim, &etcd).await {
            reached_learner = true;
            break;
        }
    }
    if learner < voters[1] {
        assert!(reached_learner, "the learner was never the forfeit target");
    }

    // With the learner gone, forfeiting hands leadership to a voter.
    etcd.member_remove(learner).await.unwrap();
    assert!(!forfeit_follows_upstreams_rule(&sim, &etcd).await);
}

#[tokio::test]
async fn a_snapshot_read_error_ends_the_stream_with_status_ok() {
    // Upstream's chunker logs the read error and closes the stream: the
    // call succeeds with a short snapshot (pkg/chunker/stream).
    let sim = SimCluster::start(1).await;
    sim.cluster.fill("/registry/x/", 100, 4096).await.unwrap();
    let node = sim.cluster.node("cp-1").unwrap();
    node.fail_next_snapshot_after(10_000);
    let stream = sim.admin().node(sim.ip(1)).etcd_snapshot().await.unwrap();
    let path = sim.dir.path().join("short.db");
    let size = talos_test_support::stream_to_file(stream, &path)
        .await
        .expect("no error reaches the client");
    assert_eq!(size, 10_000);
    // The fault was for one snapshot only.
    let stream = sim.admin().node(sim.ip(1)).etcd_snapshot().await.unwrap();
    let whole = talos_test_support::stream_to_file(stream, &path)
        .await
        .unwrap();
    assert_eq!(whole % 512, 32);
}
