//! Upstream's per-method role table (internal/app/machined/pkg/system/
//! services/machined.go, the `rules` map) enforced for every call a
//! simulated node serves: one test per role. Each test checks the calls
//! the role may make (written out here from upstream's table, so a wrong
//! table fails) and sends every method of the table the role may not call,
//! which must be refused `PermissionDenied: not authorized` before anything
//! happens. The call log shows the roles each call was judged by.

use talos_test_support as common;

use std::time::Duration;

use common::sim::SimCluster;
use talos_client::api::machine;
use talos_client::{Client, Error};
use talos_sim::TalosVersion;
use talos_sim::pki::LeafSpec;
use talos_sim::rules::RULES;

/// A client of node 1 presenting a certificate with `roles`.
fn client_with(sim: &SimCluster, roles: &[&str]) -> Client {
    let credentials = sim
        .cluster
        .issue_client(&LeafSpec::client(roles))
        .expect("certificate");
    Client::builder()
        .endpoints([sim.cluster.nodes()[0].api.clone()])
        .credentials(credentials)
        .connect_timeout(Duration::from_secs(5))
        .call_timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Sends an empty message to `path` and returns the status it ends with.
async fn raw(client: &Client, path: &'static str) -> tonic::Status {
    let transport = client.grpc_transport().await.expect("transport");
    let mut grpc = tonic::client::Grpc::new(transport);
    grpc.ready().await.expect("ready");
    match grpc
        .unary::<(), (), _>(
            tonic::Request::new(()),
            http::uri::PathAndQuery::from_static(path),
            tonic_prost::ProstCodec::default(),
        )
        .await
    {
        Ok(_) => tonic::Status::ok(""),
        Err(status) => status,
    }
}

/// Every method of the table that `roles` may not call is refused before
/// any handler runs, and logged as refused with those roles.
async fn every_other_method_is_refused(sim: &SimCluster, client: &Client, roles: &[&str]) {
    let held: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
    let mut refused = 0;
    for rule in RULES.iter().filter(|r| !r.since_1_14) {
        if rule.roles.iter().any(|r| roles.contains(r)) {
            continue;
        }
        let status = raw(client, rule.path).await;
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::PermissionDenied, "not authorized"),
            "{} with {roles:?}",
            rule.path
        );
        refused += 1;
    }
    assert!(refused > 0);
    let logged = sim
        .cluster
        .calls()
        .into_iter()
        .filter(|c| c.roles == held && !c.allowed)
        .count();
    assert!(
        logged >= refused,
        "{logged} refusals logged, {refused} sent"
    );
}

fn denied<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    match result {
        Err(Error::PermissionDenied(f)) => assert_eq!(f.message, "not authorized", "{what}"),
        other => panic!("{what}: expected PermissionDenied, got {other:?}"),
    }
}

fn not_denied<T: std::fmt::Debug>(what: &str, result: &Result<T, Error>) {
    assert!(
        !matches!(result, Err(Error::PermissionDenied(_))),
        "{what}: refused: {result:?}"
    );
}

/// Reads a snapshot stream to its end: its size, or the error.
async fn snapshot_size(client: &Client) -> Result<usize, Error> {
    let mut stream = client.etcd_snapshot().await?;
    let mut size = 0;
    while let Some(chunk) = stream.next_chunk().await? {
        size += chunk.len();
    }
    Ok(size)
}

/// The calls every reading role (admin, operator, reader) may make.
async fn reads_pass(client: &Client) {
    assert_eq!(client.hostname().await.unwrap(), "cp-1");
    client.version().await.unwrap();
    client.service_list().await.unwrap();
    client.etcd_member_list(false).await.unwrap();
    client.etcd_status().await.unwrap();
    client.etcd_alarm_list().await.unwrap();
    client.resources().machine_status().await.unwrap();
}

/// The calls only admin may make, each refused.
async fn admin_calls_refused(client: &Client) {
    denied("leave", client.etcd_leave_cluster().await);
    denied(
        "remove",
        client
            .etcd_remove_member_by_id(talos_client::client::MemberId(0xdead))
            .await,
    );
    denied("forfeit", client.etcd_forfeit_leadership().await);
    denied("kubeconfig", client.kubeconfig().await);
    denied(
        "generate",
        client
            .generate_client_configuration(&["os:admin".into()], Duration::from_secs(60))
            .await,
    );
    let reset = talos_client::client::ResetRequest::default();
    denied("reset", client.reset(reset).await);
}

#[tokio::test]
async fn admin_may_call_everything() {
    let sim = SimCluster::start(1).await;
    let admin = client_with(&sim, &["os:admin"]);
    reads_pass(&admin).await;
    assert!(snapshot_size(&admin).await.unwrap() > 0);
    admin.kubeconfig().await.unwrap();
    // Calls that would change the node go through the table and are then
    // refused by the handler for what they ask.
    not_denied(
        "remove an unknown member",
        &admin
            .etcd_remove_member_by_id(talos_client::client::MemberId(0xdead))
            .await,
    );
    let mut m = admin.machine_service().await.unwrap();
    let bad_reset = m
        .reset(machine::ResetRequest {
            system_partitions_to_wipe: vec![machine::ResetPartitionSpec {
                label: "NO-SUCH-LABEL".into(),
                wipe: true,
            }],
            ..Default::default()
        })
        .await;
    assert!(
        matches!(&bad_reset, Err(s) if s.code() != tonic::Code::PermissionDenied),
        "{bad_reset:?}"
    );
    let generated = admin
        .generate_client_configuration(&["os:reader".into()], Duration::from_secs(3600))
        .await;
    not_denied("generate", &generated);
    // Every method of the table, sent empty, gets past the table (the
    // services only 1.14 has are unknown to this 1.13.9 node).
    for rule in RULES.iter().filter(|r| !r.since_1_14).filter(|r| {
        // Empty messages that would change the node.
        ![
            "EtcdLeaveCluster",
            "EtcdForfeitLeadership",
            "Reboot",
            "Shutdown",
            "Reset",
            "Bootstrap",
            "Upgrade",
            "Install",
            "Rollback",
            "ApplyConfiguration",
            "EtcdAlarmDisarm",
            "EtcdDefragment",
            "EtcdRecover",
            "Pull",
        ]
        .iter()
        .any(|m| r.path.ends_with(&format!("/{m}")))
    }) {
        // A streaming method (Events, Logs with follow) may answer for as
        // long as it likes: the table judges before any handler runs, and
        // the call log says how it judged.
        let judged = tokio::time::timeout(Duration::from_secs(5), raw(&admin, rule.path)).await;
        // COSI filters by resource type after the table (an empty message
        // names none, which it refuses): the call log holds the table's word.
        if let (Ok(status), false) = (judged, rule.path.starts_with("/cosi.")) {
            assert_ne!(
                status.code(),
                tonic::Code::PermissionDenied,
                "{}",
                rule.path
            );
        }
        let verdict = sim
            .cluster
            .calls()
            .into_iter()
            .rev()
            .find(|c| c.method == rule.path)
            .map(|c| c.allowed);
        assert_eq!(verdict, Some(true), "{}", rule.path);
    }
}

#[tokio::test]
async fn operator_reads_snapshots_and_manages_but_gets_no_secrets() {
    let sim = SimCluster::start(1).await;
    let operator = client_with(&sim, &["os:operator"]);
    reads_pass(&operator).await;
    assert!(snapshot_size(&operator).await.unwrap() > 0);
    not_denied("defragment", &operator.etcd_defragment().await);
    not_denied("disarm", &operator.etcd_alarm_disarm().await);
    admin_calls_refused(&operator).await;
    denied(
        "machine config",
        operator
            .resources()
            .machine_config(talos_client::client::resources::ConfigId::Active)
            .await,
    );
    every_other_method_is_refused(&sim, &operator, &["os:operator"]).await;
}

#[tokio::test]
async fn reader_reads_and_nothing_else() {
    let sim = SimCluster::start(1).await;
    let reader = client_with(&sim, &["os:reader"]);
    reads_pass(&reader).await;
    denied("snapshot", snapshot_size(&reader).await);
    denied("defragment", reader.etcd_defragment().await);
    denied("disarm", reader.etcd_alarm_disarm().await);
    admin_calls_refused(&reader).await;
    every_other_method_is_refused(&sim, &reader, &["os:reader"]).await;
}

#[tokio::test]
async fn etcd_backup_snapshots_and_is_refused_a_leave() {
    let sim = SimCluster::start(1).await;
    let backup = client_with(&sim, &["os:etcd:backup"]);
    assert!(snapshot_size(&backup).await.unwrap() > 0);
    backup.etcd_member_list(false).await.unwrap();
    backup.etcd_status().await.unwrap();
    backup.etcd_alarm_list().await.unwrap();
    denied("version", backup.version().await);
    denied("hostname", backup.hostname().await);
    denied("services", backup.service_list().await);
    denied("resources", backup.resources().machine_status().await);
    admin_calls_refused(&backup).await;
    every_other_method_is_refused(&sim, &backup, &["os:etcd:backup"]).await;
    // The node is still a voting member with its data.
    assert_eq!(sim.admin().etcd_member_list(false).await.unwrap().len(), 1);
}

#[tokio::test]
async fn image_verifier_and_meta_writer_reach_only_their_calls() {
    let sim = SimCluster::start(1).await;
    let verifier = client_with(&sim, &["os:image:verifier"]);
    let status = raw(&verifier, "/machine.ImageService/Verify").await;
    assert_ne!(status.code(), tonic::Code::PermissionDenied);
    denied("version", verifier.version().await);
    every_other_method_is_refused(&sim, &verifier, &["os:image:verifier"]).await;

    let writer = client_with(&sim, &["os:meta:writer"]);
    let status = raw(&writer, "/machine.MachineService/MetaWrite").await;
    assert_ne!(status.code(), tonic::Code::PermissionDenied);
    denied("snapshot", snapshot_size(&writer).await);
    every_other_method_is_refused(&sim, &writer, &["os:meta:writer"]).await;
}

#[tokio::test]
async fn impersonator_without_forwarded_roles_and_unknown_roles_get_nothing() {
    let sim = SimCluster::start(1).await;
    let impersonator = client_with(&sim, &["os:impersonator"]);
    denied("version", impersonator.version().await);
    every_other_method_is_refused(&sim, &impersonator, &["os:impersonator"]).await;
    let custom = client_with(&sim, &["custom:role"]);
    denied("version", custom.version().await);
    denied("members", custom.etcd_member_list(false).await);
    let none = client_with(&sim, &[]);
    denied("members", none.etcd_member_list(false).await);
}

#[test]
fn the_table_is_the_same_on_1_14_but_for_its_additions() {
    for rule in RULES {
        let on_1_13 = talos_sim::rules::allowed(rule.path, TalosVersion::V1_13_9);
        let on_1_14 = talos_sim::rules::allowed(rule.path, TalosVersion::V1_14_0);
        assert_eq!(on_1_14, rule.roles, "{}", rule.path);
        if rule.since_1_14 {
            assert_eq!(on_1_13, ["os:admin"], "{}", rule.path);
        } else {
            assert_eq!(on_1_13, on_1_14, "{}", rule.path);
        }
    }
}
