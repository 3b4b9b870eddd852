//! Interop with upstream Talos's own Go code (the Go module in
//! tests/interop pins a released github.com/siderolabs/talos/pkg/machinery;
//! proto/README.md names the version):
//!
//! - a stub server built on upstream's generated Go stubs serves field-rich
//!   answers; our client must decode every field as sent, and the stub
//!   checks every field of our requests;
//! - its PKI and talosconfig come from upstream's generators, and our client
//!   must load and use them;
//! - upstream's official Go client drives talos-sim and must see what it
//!   would see against Talos (COSI resources included);
//! - our client reads COSI resources from cosi-project/runtime's own state
//!   server holding upstream's resource types.
//!
//! The Go programs are built here (or taken from INTEROP_BIN_DIR, see
//! tests/interop/run.sh). Without Go, or without the module proxy when
//! modules are missing, these tests fail: they never skip.

#[path = "canned.rs"]
mod canned;
#[path = "cosi.rs"]
mod cosi;
#[path = "harness.rs"]
mod harness;
#[path = "stub_calls.rs"]
mod stub_calls;

use std::ffi::OsString;
use std::fmt::Debug;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt as _;
use prost::Message;
use talos_client::api::machine;
use talos_client::client::{EtcdMember, MemberId};
use talos_client::config::{Overrides, TalosConfig};
use talos_client::{Client, Error};
use talos_sim::{Cluster, SimConfig};

use canned::*;
use harness::StubServer;

/// A client from the talosconfig upstream's generator wrote.
fn stub_client(stub: &StubServer) -> Client {
    let path = stub.talosconfig();
    let config = TalosConfig::read(&path).expect("our loader reads the upstream talosconfig");
    let context = config
        .resolve(&Overrides::default(), &path)
        .expect("the upstream talosconfig resolves");
    Client::builder_from_context(&context)
        .connect_timeout(Duration::from_secs(10))
        .call_timeout(Duration::from_secs(30))
        .read_attempts(1)
        .build()
        .expect("a client from the upstream talosconfig")
}

#[tokio::test]
async fn upstream_generated_talosconfig_connects_to_a_server_from_the_same_bundle() {
    let stub = StubServer::start().await;
    let path = stub.talosconfig();
    let context = TalosConfig::read(&path)
        .unwrap()
        .resolve(&Overrides::default(), &path)
        .unwrap();
    assert_eq!(context.name, CONTEXT);
    assert_eq!(context.endpoints, std::slice::from_ref(&stub.endpoint));
    assert!(context.nodes.is_empty());
    let key = String::from_utf8_lossy(context.credentials.key_pem()).to_string();
    assert!(
        key.contains("-----BEGIN ED25519 PRIVATE KEY-----"),
        "upstream labels its Ed25519 keys ED25519 PRIVATE KEY"
    );
    let info = context.credentials.certificate_info().unwrap();
    assert_eq!(info.roles, ["os:admin"]);
    assert!(info.issuer.contains("talos"), "issuer {}", info.issuer);
    assert!(info.client_auth_only && !info.is_ca);

    // Our client verifies the server certificate issued from the bundle's OS
    // CA, and the server verifies ours (and its role).
    let client = stub_client(&stub);
    assert_eq!(
        client.node(STUB_NODE).hostname().await.unwrap(),
        "answered-hostname"
    );
}

#[tokio::test]
async fn typed_api_against_upstream_stubs() {
    let stub = StubServer::start().await;
    let client = stub_client(&stub);
    stub_calls::typed_calls(&client, stub.dir.path()).await;
}

#[tokio::test]
async fn generated_stubs_against_upstream_stubs() {
    let stub = StubServer::start().await;
    let client = stub_client(&stub);
    stub_calls::raw_calls(&client).await;
}

/// Decodes one of the stub's binary dumps with our protos: the value must be
/// the expected one and re-encoding must give the same bytes, so no field
/// upstream sent was dropped as unknown.
fn decodes_losslessly<M>(dir: &Path, name: &str, expected: M) -> usize
where
    M: Message + Default + PartialEq + Debug,
{
    let bytes = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
    let decoded = M::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(decoded, expected, "{name}: decoded value");
    assert_eq!(
        decoded.encoded_len(),
        bytes.len(),
        "{name}: upstream's encoding has fields our protos lack"
    );
    assert_eq!(
        decoded.encode_to_vec(),
        bytes,
        "{name}: re-encoding differs"
    );
    1
}

#[tokio::test]
async fn upstream_encodings_decode_without_loss() {
    let stub = StubServer::start().await;
    let dir = stub.dump_dir();
    let d = dir.as_path();
    let mut checked = 0;
    checked += decodes_losslessly(d, "ApplyConfiguration", apply());
    checked += decodes_losslessly(d, "Bootstrap", bootstrap());
    checked += decodes_losslessly(d, "EtcdMemberList", member_list());
    checked += decodes_losslessly(d, "EtcdMemberList.aggregate", member_list_aggregate());
    checked += decodes_losslessly(d, "EtcdRemoveMemberByID", remove_member());
    checked += decodes_losslessly(d, "EtcdLeaveCluster", leave());
    checked += decodes_losslessly(d, "EtcdForfeitLeadership", forfeit());
    checked += decodes_losslessly(d, "EtcdRecover", recover());
    checked += decodes_losslessly(d, "EtcdAlarmList", alarm_list());
    checked += decodes_losslessly(d, "EtcdAlarmDisarm", alarm_disarm());
    checked += decodes_losslessly(d, "EtcdDefragment", defragment());
    checked += decodes_losslessly(d, "EtcdStatus", status());
    checked += decodes_losslessly(d, "Hostname", hostname());
    checked += decodes_losslessly(d, "Version", version());
    checked += decodes_losslessly(d, "ServiceList", services());
    checked += decodes_losslessly(d, "Reboot", reboot());
    checked += decodes_losslessly(d, "Shutdown", shutdown());
    checked += decodes_losslessly(d, "Reset", reset());
    for (i, chunk) in snapshot_chunks().into_iter().enumerate() {
        checked += decodes_losslessly(d, &format!("EtcdSnapshot.{i}"), chunk);
    }
    for (i, progress) in health_progress().into_iter().enumerate() {
        checked += decodes_losslessly(d, &format!("HealthCheck.{i}"), progress);
    }
    // Upstream's requests, with every field upstream defines set.
    checked += decodes_losslessly(d, "request.ApplyConfiguration", apply_request());
    checked += decodes_losslessly(
        d,
        "request.Bootstrap",
        machine::BootstrapRequest {
            recover_etcd: true,
            recover_skip_hash_check: true,
        },
    );
    checked += decodes_losslessly(
        d,
        "request.EtcdMemberList",
        machine::EtcdMemberListRequest { query_local: true },
    );
    checked += decodes_losslessly(
        d,
        "request.EtcdRemoveMemberByID",
        machine::EtcdRemoveMemberByIdRequest {
            member_id: REMOVE_MEMBER_ID,
        },
    );
    checked += decodes_losslessly(
        d,
        "request.Reboot",
        machine::RebootRequest {
            mode: machine::reboot_request::Mode::Powercycle as i32,
        },
    );
    checked += decodes_losslessly(
        d,
        "request.Shutdown",
        machine::ShutdownRequest { force: true },
    );
    checked += decodes_losslessly(d, "request.Reset", reset_request());
    checked += decodes_losslessly(d, "request.HealthCheck", health_request());
    let dumped = std::fs::read_dir(d).unwrap().count();
    assert_eq!(checked, dumped, "every dump the stub wrote is checked here");
}

#[tokio::test]
async fn aggregated_answer_with_a_failed_node() {
    let stub = StubServer::start().await;
    let client = stub_client(&stub);
    let nodes = ["node-a", "down-b", "node-c"];

    let replies = client
        .aggregate(nodes)
        .etcd_member_list(true)
        .await
        .expect("the aggregated call itself succeeds");
    let names: Vec<_> = replies.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(names, nodes);
    let typed: Vec<EtcdMember> = members().into_iter().map(EtcdMember::from).collect();
    assert_eq!(replies[0].result.as_ref().unwrap(), &typed);
    assert_eq!(replies[2].result.as_ref().unwrap(), &typed);
    assert_eq!(typed[1].id, MemberId(MEMBER_TWO));
    match &replies[1].result {
        // The official client reports status.FromProto(metadata.status) for
        // such a message: code and message of the status.
        Err(Error::Unavailable(failure)) => {
            assert_eq!(failure.node.as_deref(), Some("down-b"));
            assert_eq!(failure.message, "connection refused by down-b");
        }
        other => panic!("want down-b's own Unavailable error, got {other:?}"),
    }

    let versions = client
        .aggregate(["node-a", "down-x"])
        .version()
        .await
        .unwrap();
    assert_eq!(versions[0].result.as_ref().unwrap().tag, "v1.13.9-interop");
    assert!(
        matches!(&versions[1].result, Err(Error::Unavailable(f)) if f.node.as_deref() == Some("down-x"))
    );

    // The raw answer, metadata and status details included.
    let mut raw = client.endpoint_node().machine_service().await.unwrap();
    let mut request = tonic::Request::new(machine::EtcdMemberListRequest { query_local: true });
    for node in nodes {
        request
            .metadata_mut()
            .append("nodes", node.parse().unwrap());
    }
    let answer = raw.etcd_member_list(request).await.unwrap().into_inner();
    assert_eq!(answer, member_list_aggregate());
}

#[tokio::test]
async fn failures_reach_the_caller_with_their_codes() {
    let stub = StubServer::start().await;
    let client = stub_client(&stub);

    match client.node(DENIED_NODE).version().await {
        Err(Error::PermissionDenied(f)) => {
            assert_eq!(f.node.as_deref(), Some(DENIED_NODE));
            assert!(f.message.contains("not authorized"), "{f}");
        }
        other => panic!("want PermissionDenied, got {other:?}"),
    }

    // A snapshot stream that ends with an apid-style error frame: the bytes
    // before it arrive (in batches, not the server's chunks), then the error.
    let mut stream = client.node(FAILING_NODE).etcd_snapshot().await.unwrap();
    let expected: Vec<u8> = snapshot_chunks()[..2]
        .iter()
        .flat_map(|chunk| chunk.bytes.iter().copied())
        .collect();
    let mut received = Vec::new();
    while received.len() < expected.len() {
        received.extend_from_slice(&stream.next_chunk().await.unwrap().unwrap());
    }
    assert_eq!(received, expected);
    match stream.next().await {
        Some(Err(Error::Aborted(f))) => {
            assert_eq!(f.node.as_deref(), Some(FAILING_NODE));
            assert_eq!(f.message, "snapshot interrupted");
        }
        other => panic!("want the in-stream Aborted error, got {other:?}"),
    }

    // The stub's own checks can fail: a request that differs from the
    // expected one, and routing it does not expect.
    let mut raw = client.node(STUB_NODE).machine_service().await.unwrap();
    let status = raw
        .reboot(machine::RebootRequest {
            mode: machine::reboot_request::Mode::Force as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("mismatch"),
        "{}",
        status.message()
    );
    assert!(matches!(
        client.endpoint_node().version().await,
        Err(Error::InvalidArgument(_))
    ));
}

/// The checks the driver must report as passed.
const DRIVER_CHECKS: &[&str] = &[
    "setup",
    "version-context-nodes",
    "version-each-endpoint",
    "version-node",
    "hostname-nodes",
    "version-nodes",
    "nodes-targets",
    "etcd-member-list",
    "etcd-status",
    "etcd-alarm-list",
    "service-list",
    "logs-etcd",
    "logs-follow",
    "events-tail",
    "dmesg",
    "containers",
    "cosi-machine-config",
    "cosi-machine-status",
    "cosi-members",
    "cosi-addresses",
    "etcd-defragment",
    "etcd-snapshot",
    "etcd-snapshot-chunks",
    "etcd-snapshot-truncated",
    "reader-roles",
    "apply-dry-run",
    "apply-try",
    "apply-try-rollback-target",
    "apply-try-cancelled",
    "etcd-forfeit-leadership",
    "etcd-leave-cluster",
    "reset-power-off",
    "nodes-with-node-down",
    "node-down-one-to-one",
    "survivors-etcd",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn official_go_client_against_the_simulator() {
    harness::go_binaries();
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::up(SimConfig::isolated(dir.path(), 3))
        .await
        .expect("simulated cluster starts");
    let hostnames: Vec<String> = cluster.nodes().into_iter().map(|n| n.name).collect();
    let d = dir.path();
    cluster
        .serve_control(&d.join("control.sock"))
        .expect("control socket");
    let args: Vec<OsString> = vec![
        "--talosconfig".into(),
        d.join("talosconfig").into(),
        "--reader-talosconfig".into(),
        d.join("talosconfig-reader").into(),
        "--machine-config".into(),
        d.join("controlplane.yaml").into(),
        "--hostnames".into(),
        hostnames.join(",").into(),
        "--work-dir".into(),
        d.into(),
        "--control-socket".into(),
        d.join("control.sock").into(),
    ];
    let run = harness::run_driver(&args, Duration::from_secs(300)).await;
    println!("{}", run.output);
    assert!(
        run.success,
        "upstream's Go client disagrees with talos-sim:\n{}",
        run.output
    );
    for check in DRIVER_CHECKS {
        assert!(
            run.output.lines().any(|l| l == format!("ok {check}")),
            "the driver did not pass check {check}:\n{}",
            run.output
        );
    }
}
