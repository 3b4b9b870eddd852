//! COSI resources on the simulator, read through our client: what each
//! role may read, configurations through every apply mode, watches, the
//! Layer-2 VIP, and the STATE switch.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use futures::StreamExt as _;
use talos_client::Error;
use talos_client::client::resources::{ConfigId, EventKind, types};
use talos_client::client::{ApplyMode, ApplyRequest};

fn base(sim: &SimCluster) -> String {
    std::fs::read_to_string(sim.dir.path().join("controlplane.yaml")).unwrap()
}

/// A change that applies without a reboot.
fn renamed(sim: &SimCluster, name: &str) -> String {
    base(sim).replace("clusterName: talos-sim", &format!("clusterName: {name}"))
}

fn with_vip(config: &str, vip: &str) -> String {
    format!("{config}\n---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: {vip}\nlink: eth0\n")
}

#[tokio::test]
async fn typed_reads_and_role_rules() {
    let sim = SimCluster::start(2).await;
    let admin = sim.admin().node(sim.ip(2));
    let config = admin
        .resources()
        .machine_config(ConfigId::Active)
        .await
        .unwrap();
    assert_eq!(
        config.yaml,
        sim.cluster.node("cp-2").unwrap().active_config()
    );
    let status = admin.resources().machine_status().await.unwrap();
    assert_eq!(status.stage, "running");
    assert!(status.ready, "{status:?}");
    let member = admin.resources().etcd_member().await.unwrap();
    let own = admin.etcd_status().await.unwrap().member_id;
    assert_eq!(member.member_id, own);
    let members = admin.resources().cluster_members().await.unwrap();
    let names: Vec<_> = members.iter().map(|m| m.hostname.as_str()).collect();
    assert_eq!(names, ["cp-1", "cp-2"]);
    assert_eq!(
        admin.resources().version().await.unwrap().version,
        "v1.13.9"
    );
    let services = admin.resources().services().await.unwrap();
    assert!(
        services
            .iter()
            .any(|s| s.id == "etcd" && s.running && s.healthy)
    );
    let volumes = admin.resources().volume_statuses().await.unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v.id == "EPHEMERAL" && v.phase == "ready")
    );

    // Upstream's access filter: MachineConfig is sensitive.
    let reader = sim.client_from("talosconfig-reader").node(sim.ip(2));
    let denied = reader.resources().machine_config(ConfigId::Active).await;
    assert!(
        matches!(denied, Err(Error::PermissionDenied(_))),
        "{denied:?}"
    );
    assert!(reader.resources().machine_status().await.unwrap().ready);
    // etcd:backup holds none of the roles State allows.
    let backup = sim.client_from("talosconfig-backup");
    let denied = backup.resources().machine_status().await;
    assert!(
        matches!(denied, Err(Error::PermissionDenied(_))),
        "{denied:?}"
    );

    let unknown = admin
        .resources()
        .get("runtime", "Foos.runtime.talos.dev", "x")
        .await;
    match unknown {
        Err(Error::UnknownResourceType { resource_type, .. }) => {
            assert_eq!(resource_type, "Foos.runtime.talos.dev")
        }
        other => panic!("{other:?}"),
    }
    let missing = admin
        .resources()
        .get("config", types::MACHINE_CONFIG, "nope")
        .await;
    assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
    let alias = admin.resources().resolve("mc").await.unwrap();
    assert_eq!(alias.resource_type, types::MACHINE_CONFIG);
    assert!(matches!(
        admin.resources().resolve("nothing").await,
        Err(Error::UnknownResourceType { .. })
    ));
}

#[tokio::test]
async fn apply_modes_move_active_and_persistent_as_upstream() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let res = client.resources();
    let active = || async { res.machine_config(ConfigId::Active).await.unwrap() };
    let persistent = || async { res.machine_config(ConfigId::Persistent).await.unwrap() };
    let start = active().await;
    assert_eq!(start.yaml, persistent().await.yaml);

    // STAGED: saved only.
    client
        .apply_configuration(ApplyRequest::new(
            renamed(&sim, "staged"),
            ApplyMode::Staged,
        ))
        .await
        .unwrap();
    assert!(persistent().await.yaml.contains("clusterName: staged"));
    assert_eq!(active().await.yaml, start.yaml);
    // NO_REBOOT: both.
    client
        .apply_configuration(ApplyRequest::new(
            renamed(&sim, "both"),
            ApplyMode::NoReboot,
        ))
        .await
        .unwrap();
    let both = active().await;
    assert!(both.yaml.contains("clusterName: both"));
    assert_ne!(both.version, start.version);
    assert_eq!(persistent().await.yaml, both.yaml);
    // TRY: running only, and back after the rollback.
    let tried = ApplyRequest::new(renamed(&sim, "tried"), ApplyMode::Try)
        .with_try_timeout(Duration::from_secs(1));
    client.apply_configuration(tried).await.unwrap();
    assert!(active().await.yaml.contains("clusterName: tried"));
    assert!(persistent().await.yaml.contains("clusterName: both"));
    wait_for("the rollback", Duration::from_secs(10), || async {
        active()
            .await
            .yaml
            .contains("clusterName: both")
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn watch_sees_an_apply_and_ends_when_the_node_powers_off() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let mut watch = client
        .resources()
        .watch(
            types::CONFIG_NAMESPACE,
            types::MACHINE_CONFIG,
            Some("v1alpha1"),
        )
        .await
        .unwrap();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.kind, EventKind::Created);
    client
        .apply_configuration(ApplyRequest::new(
            renamed(&sim, "watched"),
            ApplyMode::NoReboot,
        ))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.kind, EventKind::Updated);
    assert!(
        next.resource
            .unwrap()
            .spec_yaml
            .contains("clusterName: watched")
    );

    sim.cluster.power_off("cp-1").await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the watch outlived the node");
}

#[tokio::test]
async fn a_layer2_vip_is_held_by_exactly_one_node_and_moves_when_it_leaves() {
    let sim = SimCluster::start(3).await;
    let client = sim.admin();
    let vip = "10.99.0.50";
    for i in 1..=3 {
        let config = with_vip(&sim.cluster.node(&sim.ip(i)).unwrap().active_config(), vip);
        client
            .node(sim.ip(i))
            .apply_configuration(ApplyRequest::new(config, ApplyMode::NoReboot))
            .await
            .unwrap();
    }
    let holders = || async {
        let mut held = Vec::new();
        for i in 1..=3 {
            let addresses = client
                .node(sim.ip(i))
                .resources()
                .address_statuses()
                .await
                .ok()?;
            if addresses.iter().any(|a| a.address == format!("{vip}/32")) {
                held.push(i);
            }
        }
        Some(held)
    };
    let first = holders().await.unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    // Leave waits for the local member's healthy service, then retries
    // etcd's "unhealthy cluster" (just after start): both before the call's
    // 30 s deadline only once the members are healthy.
    // On a loaded machine etcd's member removal alone can take longer than
    // the client's default 30 s call deadline: the call gets its own.
    sim.wait_etcd_healthy(3).await;
    client
        .with_call_timeout(Duration::from_secs(120))
        .node(sim.ip(first[0]))
        .etcd_leave_cluster()
        .await
        .unwrap();
    let moved = wait_for("the VIP to move", Duration::from_secs(20), || async {
        let held = holders().await?;
        (held.len() == 1 && held[0] != first[0]).then_some(held[0])
    })
    .await;
    assert_ne!(moved, first[0]);
}

#[tokio::test]
async fn read_of_the_config_file_is_not_found_unless_state_is_mounted() {
    let sim = SimCluster::start(1).await;
    let client = sim.admin();
    let path = "/system/state/config.yaml";
    let read = || async {
        let mut stream = client.read(path).await?;
        while let Some(chunk) = stream.next().await {
            chunk?;
        }
        Ok::<(), Error>(())
    };
    // As on Talos 1.13.9: STATE is not mounted.
    assert!(matches!(read().await, Err(Error::NotFound(_))));
    sim.cluster
        .set_state_partition_mounted("cp-1", true)
        .unwrap();
    assert!(read().await.is_ok(), "served once STATE is mounted");
    sim.cluster
        .set_state_partition_mounted("cp-1", false)
        .unwrap();
    assert!(matches!(read().await, Err(Error::NotFound(_))));
    // The configuration is still there through COSI.
    let config = client
        .resources()
        .machine_config(ConfigId::Persistent)
        .await
        .unwrap();
    assert!(config.yaml.contains("clusterName: talos-sim"));
    assert!(
        sim.cluster
            .set_state_partition_mounted("cp-9", false)
            .is_err()
    );
}
