//! Every call of our proto subset against the Go stub server, through the
//! typed API and through the generated stubs. The stub answers
//! InvalidArgument when a request differs from what it expects, so a call
//! that succeeds also proves the request arrived field for field.

use bytes::Bytes;
use futures::StreamExt as _;
use time::OffsetDateTime;

use super::canned::{self, *};
use talos_client::Client;
use talos_client::api::machine;
use talos_client::client::{
    AlarmType, ApplyMode, ApplyRequest, EtcdMember, EtcdMemberStatus, HealthCheckRequest,
    MemberAlarm, MemberId, RebootMode, ResetRequest, ServiceEvent, ServiceHealth, ServiceInfo,
    VersionInfo, WipeMode,
};

fn at(seconds: i64, nanos: i64) -> Option<OffsetDateTime> {
    Some(
        OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(seconds) * 1_000_000_000 + i128::from(nanos),
        )
        .unwrap(),
    )
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The upload for EtcdRecover, in uneven chunks.
fn recover_chunks() -> impl futures::Stream<Item = Bytes> + Send + 'static {
    let data: Vec<u8> = (0..RECOVER_SIZE).map(recover_byte).collect();
    let chunks: Vec<Bytes> = [1000, 3000, 999, 1]
        .iter()
        .scan(0, |offset, &len| {
            let chunk = Bytes::copy_from_slice(&data[*offset..*offset + len]);
            *offset += len;
            Some(chunk)
        })
        .collect();
    futures::stream::iter(chunks)
}

fn expected_snapshot() -> Vec<u8> {
    (0..SNAPSHOT_CHUNKS.iter().sum())
        .map(snapshot_byte)
        .collect()
}

/// Calls every RPC through the typed client and checks every field it
/// exposes.
pub async fn typed_calls(client: &Client, scratch: &std::path::Path) {
    let node = client.node(STUB_NODE);

    let version = node.version().await.expect("Version");
    // The response types are #[non_exhaustive]: compared field by field.
    let VersionInfo {
        tag,
        sha,
        built,
        go_version,
        os,
        arch,
        platform,
        platform_mode,
        rbac,
        ..
    } = version;
    assert_eq!(
        (tag, sha, built, go_version, os, arch),
        (
            "v1.13.9-interop".to_string(),
            "sha-0123abcd".to_string(),
            "built-2026-08-21T10:11:12Z".to_string(),
            "go1.26.8-interop".to_string(),
            "os-linux".to_string(),
            "arch-amd64".to_string()
        )
    );
    assert_eq!(
        (platform, platform_mode, rbac),
        (
            Some("platform-metal".to_string()),
            Some("mode-metal".to_string()),
            true
        )
    );
    assert_eq!(
        node.hostname().await.expect("Hostname"),
        "answered-hostname"
    );

    let services = node.service_list().await.expect("ServiceList");
    type Event = (String, String, Option<OffsetDateTime>);
    type Health = (bool, bool, String, Option<OffsetDateTime>);
    let seen: Vec<(String, String, Health, Vec<Event>)> = services
        .iter()
        .map(|s: &ServiceInfo| {
            let h: &ServiceHealth = &s.health;
            (
                s.id.clone(),
                s.state.clone(),
                (h.unknown, h.healthy, h.last_message.clone(), h.last_change),
                s.events
                    .iter()
                    .map(|e: &ServiceEvent| (e.msg.clone(), e.state.clone(), e.ts))
                    .collect(),
            )
        })
        .collect();
    let event = |msg: &str, state: &str, ts| -> Event { (msg.into(), state.into(), ts) };
    assert_eq!(
        seen,
        vec![
            (
                "etcd".to_string(),
                "Running".to_string(),
                (
                    false,
                    true,
                    "etcd is healthy".to_string(),
                    at(1_700_000_003, 333)
                ),
                vec![
                    event("Starting etcd", "Preparing", at(1_700_000_001, 111)),
                    event("Started etcd", "Running", at(1_700_000_002, 222_000_222)),
                ],
            ),
            (
                "apid".to_string(),
                "Waiting".to_string(),
                (
                    true,
                    false,
                    "apid health unknown".to_string(),
                    at(1_700_000_006, 666)
                ),
                vec![
                    event("Waiting for network", "Waiting", at(1_700_000_004, 444)),
                    event("Still waiting", "Waiting", at(1_700_000_005, 555)),
                ],
            ),
        ]
    );

    let members = node.etcd_member_list(true).await.expect("EtcdMemberList");
    let seen: Vec<_> = members
        .iter()
        .map(|m: &EtcdMember| {
            (
                m.id,
                m.hostname.clone(),
                m.peer_urls.clone(),
                m.client_urls.clone(),
                m.is_learner,
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                MemberId(MEMBER_ONE),
                "member-one".to_string(),
                strings(&["https://10.0.1.1:2380", "https://[fd00::1]:2380"]),
                strings(&["https://10.0.1.1:2379", "https://[fd00::1]:2379"]),
                false,
            ),
            (
                MemberId(MEMBER_TWO),
                "member-two".to_string(),
                strings(&["https://10.0.1.2:2380", "https://[fd00::2]:2380"]),
                strings(&["https://10.0.1.2:2379", "https://[fd00::2]:2379"]),
                true,
            ),
        ]
    );
    assert_eq!(members[0].id.to_string(), "8000000000000001");

    let status = node.etcd_status().await.expect("EtcdStatus");
    let s: &EtcdMemberStatus = &status;
    assert_eq!(
        (
            s.member_id,
            s.protocol_version.as_str(),
            s.storage_version.as_str(),
            s.db_size,
            s.db_size_in_use,
            s.leader
        ),
        (
            MemberId(MEMBER_TWO),
            "3.6.0-protocol",
            "3.6.0-storage",
            (1 << 40) + 1,
            2_222_222,
            MemberId(MEMBER_ONE)
        )
    );
    assert_eq!(
        (
            s.raft_index,
            s.raft_term,
            s.raft_applied_index,
            s.errors.clone(),
            s.is_learner
        ),
        (
            3333,
            44,
            3332,
            strings(&["status error one", "status error two"]),
            true
        )
    );
    assert!(!status.is_leader());

    let alarm = |id, alarm| (MemberId(id), alarm);
    let pairs = |alarms: Vec<MemberAlarm>| -> Vec<(MemberId, AlarmType)> {
        alarms.iter().map(|a| (a.member_id, a.alarm)).collect()
    };
    assert_eq!(
        pairs(node.etcd_alarm_list().await.expect("EtcdAlarmList")),
        vec![
            alarm(MEMBER_ONE, AlarmType::Nospace),
            alarm(MEMBER_TWO, AlarmType::Corrupt)
        ]
    );
    assert_eq!(
        pairs(node.etcd_alarm_disarm().await.expect("EtcdAlarmDisarm")),
        vec![
            alarm(0x1111, AlarmType::Corrupt),
            alarm(0x2222, AlarmType::Nospace)
        ]
    );
    node.etcd_defragment().await.expect("EtcdDefragment");
    assert_eq!(
        node.etcd_forfeit_leadership()
            .await
            .expect("EtcdForfeitLeadership"),
        Some("member-two".to_string())
    );
    node.etcd_leave_cluster().await.expect("EtcdLeaveCluster");
    node.etcd_remove_member_by_id(MemberId(REMOVE_MEMBER_ID))
        .await
        .expect("EtcdRemoveMemberByID");
    node.bootstrap(true, true).await.expect("Bootstrap");

    let applied = node
        .apply_configuration(
            ApplyRequest::new(APPLY_DATA, ApplyMode::Try)
                .with_dry_run(true)
                .with_try_timeout(TRY_TIMEOUT),
        )
        .await
        .expect("ApplyConfiguration");
    assert_eq!(applied.mode, ApplyMode::Staged);
    assert_eq!(
        applied.mode_details,
        "apply mode details: staged for next boot"
    );
    assert_eq!(
        applied.warnings,
        strings(&["apply warning one", "apply warning two"])
    );

    let reset = ResetRequest::default()
        .with_graceful(true)
        .with_reboot(true)
        .with_system_labels_to_wipe(strings(&RESET_LABELS))
        .with_user_disks_to_wipe(strings(&USER_DISKS))
        .with_mode(WipeMode::SystemDisk);
    assert_eq!(node.reset(reset).await.expect("Reset"), "actor-reset-0003");
    assert_eq!(
        node.reboot(RebootMode::Powercycle).await.expect("Reboot"),
        "actor-reboot-0001"
    );
    assert_eq!(
        node.shutdown(true).await.expect("Shutdown"),
        "actor-shutdown-0002"
    );

    let stream = node.etcd_snapshot().await.expect("EtcdSnapshot");
    assert_eq!(stream.node(), STUB_NODE);
    let path = scratch.join("typed-snapshot.db");
    let written = talos_test_support::stream_to_file(stream, &path)
        .await
        .expect("snapshot written");
    assert_eq!(written as usize, expected_snapshot().len());
    assert_eq!(std::fs::read(&path).unwrap(), expected_snapshot());

    node.etcd_recover(recover_chunks())
        .await
        .expect("EtcdRecover");

    let progress: Vec<String> = node
        .health_check(
            HealthCheckRequest::new(HEALTH_WAIT)
                .with_control_plane_nodes(strings(&CONTROL_PLANE_NODES))
                .with_worker_nodes(strings(&WORKER_NODES))
                .with_force_endpoint(FORCE_ENDPOINT),
        )
        .await
        .expect("HealthCheck")
        .map(|line| line.expect("progress line"))
        .collect()
        .await;
    assert_eq!(
        progress,
        strings(&[
            "health progress one",
            "health progress two",
            "health progress three"
        ])
    );
}

/// Calls every RPC through the generated stubs and compares whole decoded
/// responses, metadata included.
pub async fn raw_calls(client: &Client) {
    let node = client.node(STUB_NODE);
    let mut m = node.machine_service().await.expect("machine stub");

    macro_rules! same {
        ($call:expr, $expected:expr) => {
            assert_eq!(
                $call.await.expect(stringify!($call)).into_inner(),
                $expected
            )
        };
    }
    same!(
        m.apply_configuration(canned::apply_request()),
        canned::apply()
    );
    same!(
        m.bootstrap(machine::BootstrapRequest {
            recover_etcd: true,
            recover_skip_hash_check: true,
        }),
        canned::bootstrap()
    );
    same!(
        m.etcd_member_list(machine::EtcdMemberListRequest { query_local: true }),
        canned::member_list()
    );
    same!(
        m.etcd_remove_member_by_id(machine::EtcdRemoveMemberByIdRequest {
            member_id: REMOVE_MEMBER_ID,
        }),
        canned::remove_member()
    );
    same!(
        m.etcd_leave_cluster(machine::EtcdLeaveClusterRequest {}),
        canned::leave()
    );
    same!(
        m.etcd_forfeit_leadership(machine::EtcdForfeitLeadershipRequest {}),
        canned::forfeit()
    );
    same!(m.etcd_alarm_list(()), canned::alarm_list());
    same!(m.etcd_alarm_disarm(()), canned::alarm_disarm());
    same!(m.etcd_defragment(()), canned::defragment());
    same!(m.etcd_status(()), canned::status());
    same!(m.hostname(()), canned::hostname());
    same!(m.version(()), canned::version());
    same!(m.service_list(()), canned::services());
    same!(
        m.reboot(machine::RebootRequest {
            mode: machine::reboot_request::Mode::Powercycle as i32,
        }),
        canned::reboot()
    );
    same!(
        m.shutdown(machine::ShutdownRequest { force: true }),
        canned::shutdown()
    );
    same!(m.reset(canned::reset_request()), canned::reset());
    let upload = recover_chunks().map(|bytes| talos_client::api::common::Data {
        metadata: None,
        bytes,
    });
    same!(m.etcd_recover(upload), canned::recover());

    let chunks: Vec<_> = m
        .etcd_snapshot(machine::EtcdSnapshotRequest {})
        .await
        .expect("EtcdSnapshot")
        .into_inner()
        .map(|chunk| chunk.expect("snapshot chunk"))
        .collect()
        .await;
    assert_eq!(chunks, canned::snapshot_chunks());

    let mut c = node.cluster_service().await.expect("cluster stub");
    let progress: Vec<_> = c
        .health_check(canned::health_request())
        .await
        .expect("HealthCheck")
        .into_inner()
        .map(|p| p.expect("progress"))
        .collect()
        .await;
    assert_eq!(progress, canned::health_progress());
}
