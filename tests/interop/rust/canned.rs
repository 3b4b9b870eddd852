//! What the Go stub server (tests/interop/cmd/stubserver/canned.go) sends
//! and expects, written again from our own protos. If a field number, type or
//! name differs between upstream's generated Go code and ours, a decoded
//! value differs from these.

use std::time::Duration;

use prost::Message as _;
use prost_types::{Any, Timestamp};
use talos_client::api::{cluster, common, google, machine};

/// The node the stub answers for.
pub const STUB_NODE: &str = "10.20.30.40";
/// A node for which every call fails with PermissionDenied.
pub const DENIED_NODE: &str = "denied.invalid";
/// A node whose snapshot stream ends with an error frame.
pub const FAILING_NODE: &str = "snapshot-fails.invalid";
/// metadata.hostname on every canned message.
pub const ANSWER_HOSTNAME: &str = "stub-host";
/// The talosconfig context upstream's generator names after the cluster.
pub const CONTEXT: &str = "interop-stub";

pub const SNAPSHOT_CHUNKS: [usize; 3] = [1024, 1024, 777];
pub const RECOVER_SIZE: usize = 5000;

pub fn snapshot_byte(i: usize) -> u8 {
    ((i * 31 + 7) % 256) as u8
}

pub fn recover_byte(i: usize) -> u8 {
    ((i * 13 + 5) % 256) as u8
}

pub fn md() -> Option<common::Metadata> {
    Some(common::Metadata {
        hostname: ANSWER_HOSTNAME.into(),
        ..Default::default()
    })
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn ts(seconds: i64, nanos: i32) -> Option<Timestamp> {
    Some(Timestamp { seconds, nanos })
}

pub const MEMBER_ONE: u64 = 0x8000_0000_0000_0001;
pub const MEMBER_TWO: u64 = 0x0123_4567_89ab_cdef;

pub fn apply() -> machine::ApplyConfigurationResponse {
    machine::ApplyConfigurationResponse {
        messages: vec![machine::ApplyConfiguration {
            metadata: md(),
            warnings: strings(&["apply warning one", "apply warning two"]),
            mode: machine::apply_configuration_request::Mode::Staged as i32,
            mode_details: "apply mode details: staged for next boot".into(),
        }],
    }
}

pub fn members() -> Vec<machine::EtcdMember> {
    vec![
        machine::EtcdMember {
            id: MEMBER_ONE,
            hostname: "member-one".into(),
            peer_urls: strings(&["https://10.0.1.1:2380", "https://[fd00::1]:2380"]),
            client_urls: strings(&["https://10.0.1.1:2379", "https://[fd00::1]:2379"]),
            is_learner: false,
        },
        machine::EtcdMember {
            id: MEMBER_TWO,
            hostname: "member-two".into(),
            peer_urls: strings(&["https://10.0.1.2:2380", "https://[fd00::2]:2380"]),
            client_urls: strings(&["https://10.0.1.2:2379", "https://[fd00::2]:2379"]),
            is_learner: true,
        },
    ]
}

pub fn member_list() -> machine::EtcdMemberListResponse {
    machine::EtcdMemberListResponse {
        messages: vec![machine::EtcdMembers {
            metadata: md(),
            legacy_members: strings(&["legacy-member-a", "legacy-member-b"]),
            members: members(),
        }],
    }
}

/// apid's stand-in for a node it could not reach, as the stub builds it.
pub fn down_metadata(node: &str) -> Option<common::Metadata> {
    let message = format!("connection refused by {node}");
    Some(common::Metadata {
        hostname: node.into(),
        error: format!("rpc error: code = Unavailable desc = {message}"),
        status: Some(google::rpc::Status {
            code: tonic::Code::Unavailable as i32,
            message,
            details: vec![
                Any {
                    type_url: "type.googleapis.com/google.protobuf.StringValue".into(),
                    value: format!("detail for {node}").encode_to_vec(),
                },
                Any {
                    type_url: "type.googleapis.com/google.protobuf.Duration".into(),
                    value: prost_types::Duration {
                        seconds: 1,
                        nanos: 500_000_000,
                    }
                    .encode_to_vec(),
                },
            ],
        }),
    })
}

/// The member list as apid aggregates it for nodes node-a, down-b, node-c.
pub fn member_list_aggregate() -> machine::EtcdMemberListResponse {
    let for_node = |node: &str| machine::EtcdMembers {
        metadata: Some(common::Metadata {
            hostname: node.into(),
            ..Default::default()
        }),
        ..member_list().messages[0].clone()
    };
    machine::EtcdMemberListResponse {
        messages: vec![
            for_node("node-a"),
            machine::EtcdMembers {
                metadata: down_metadata("down-b"),
                ..Default::default()
            },
            for_node("node-c"),
        ],
    }
}

pub fn member_alarms(a: u64, b: u64, first: i32, second: i32) -> Vec<machine::EtcdMemberAlarm> {
    vec![
        machine::EtcdMemberAlarm {
            member_id: a,
            alarm: first,
        },
        machine::EtcdMemberAlarm {
            member_id: b,
            alarm: second,
        },
    ]
}

use machine::etcd_member_alarm::AlarmType;

pub fn alarm_list() -> machine::EtcdAlarmListResponse {
    machine::EtcdAlarmListResponse {
        messages: vec![machine::EtcdAlarm {
            metadata: md(),
            member_alarms: member_alarms(
                MEMBER_ONE,
                MEMBER_TWO,
                AlarmType::Nospace as i32,
                AlarmType::Corrupt as i32,
            ),
        }],
    }
}

pub fn alarm_disarm() -> machine::EtcdAlarmDisarmResponse {
    machine::EtcdAlarmDisarmResponse {
        messages: vec![machine::EtcdAlarmDisarm {
            metadata: md(),
            member_alarms: member_alarms(
                0x1111,
                0x2222,
                AlarmType::Corrupt as i32,
                AlarmType::Nospace as i32,
            ),
        }],
    }
}

pub fn member_status() -> machine::EtcdMemberStatus {
    machine::EtcdMemberStatus {
        protocol_version: "3.6.0-protocol".into(),
        db_size: (1 << 40) + 1,
        db_size_in_use: 2_222_222,
        leader: MEMBER_ONE,
        raft_index: 3333,
        raft_term: 44,
        raft_applied_index: 3332,
        errors: strings(&["status error one", "status error two"]),
        is_learner: true,
        member_id: MEMBER_TWO,
        storage_version: "3.6.0-storage".into(),
    }
}

pub fn status() -> machine::EtcdStatusResponse {
    machine::EtcdStatusResponse {
        messages: vec![machine::EtcdStatus {
            metadata: md(),
            member_status: Some(member_status()),
        }],
    }
}

pub fn hostname() -> machine::HostnameResponse {
    machine::HostnameResponse {
        messages: vec![machine::Hostname {
            metadata: md(),
            hostname: "answered-hostname".into(),
        }],
    }
}

pub fn version() -> machine::VersionResponse {
    machine::VersionResponse {
        messages: vec![machine::Version {
            metadata: md(),
            version: Some(machine::VersionInfo {
                tag: "v1.13.9-interop".into(),
                sha: "sha-0123abcd".into(),
                built: "built-2026-08-21T10:11:12Z".into(),
                go_version: "go1.26.8-interop".into(),
                os: "os-linux".into(),
                arch: "arch-amd64".into(),
            }),
            platform: Some(machine::PlatformInfo {
                name: "platform-metal".into(),
                mode: "mode-metal".into(),
            }),
            features: Some(machine::FeaturesInfo { rbac: true }),
        }],
    }
}

fn event(msg: &str, state: &str, ts: Option<Timestamp>) -> machine::ServiceEvent {
    machine::ServiceEvent {
        msg: msg.into(),
        state: state.into(),
        ts,
    }
}

pub fn services() -> machine::ServiceListResponse {
    let etcd = machine::ServiceInfo {
        id: "etcd".into(),
        state: "Running".into(),
        events: Some(machine::ServiceEvents {
            events: vec![
                event("Starting etcd", "Preparing", ts(1_700_000_001, 111)),
                event("Started etcd", "Running", ts(1_700_000_002, 222_000_222)),
            ],
        }),
        health: Some(machine::ServiceHealth {
            unknown: false,
            healthy: true,
            last_message: "etcd is healthy".into(),
            last_change: ts(1_700_000_003, 333),
        }),
    };
    let apid = machine::ServiceInfo {
        id: "apid".into(),
        state: "Waiting".into(),
        events: Some(machine::ServiceEvents {
            events: vec![
                event("Waiting for network", "Waiting", ts(1_700_000_004, 444)),
                event("Still waiting", "Waiting", ts(1_700_000_005, 555)),
            ],
        }),
        health: Some(machine::ServiceHealth {
            unknown: true,
            healthy: false,
            last_message: "apid health unknown".into(),
            last_change: ts(1_700_000_006, 666),
        }),
    };
    machine::ServiceListResponse {
        messages: vec![machine::ServiceList {
            metadata: md(),
            services: vec![etcd, apid],
        }],
    }
}

macro_rules! metadata_only {
    ($name:ident, $response:ident, $item:ident) => {
        pub fn $name() -> machine::$response {
            machine::$response {
                messages: vec![machine::$item { metadata: md() }],
            }
        }
    };
}

metadata_only!(bootstrap, BootstrapResponse, Bootstrap);
metadata_only!(
    remove_member,
    EtcdRemoveMemberByIdResponse,
    EtcdRemoveMemberById
);
metadata_only!(leave, EtcdLeaveClusterResponse, EtcdLeaveCluster);
metadata_only!(recover, EtcdRecoverResponse, EtcdRecover);
metadata_only!(defragment, EtcdDefragmentResponse, EtcdDefragment);

pub fn forfeit() -> machine::EtcdForfeitLeadershipResponse {
    machine::EtcdForfeitLeadershipResponse {
        messages: vec![machine::EtcdForfeitLeadership {
            metadata: md(),
            member: "member-two".into(),
        }],
    }
}

macro_rules! actor {
    ($name:ident, $response:ident, $item:ident, $actor:literal) => {
        pub fn $name() -> machine::$response {
            machine::$response {
                messages: vec![machine::$item {
                    metadata: md(),
                    actor_id: $actor.into(),
                }],
            }
        }
    };
}

actor!(reboot, RebootResponse, Reboot, "actor-reboot-0001");
actor!(shutdown, ShutdownResponse, Shutdown, "actor-shutdown-0002");
actor!(reset, ResetResponse, Reset, "actor-reset-0003");

pub fn snapshot_chunks() -> Vec<common::Data> {
    let mut offset = 0;
    SNAPSHOT_CHUNKS
        .iter()
        .map(|&size| {
            let bytes: Vec<u8> = (offset..offset + size).map(snapshot_byte).collect();
            offset += size;
            common::Data {
                metadata: md(),
                bytes: bytes.into(),
            }
        })
        .collect()
}

pub fn health_progress() -> Vec<cluster::HealthCheckProgress> {
    [
        "health progress one",
        "health progress two",
        "health progress three",
    ]
    .iter()
    .map(|m| cluster::HealthCheckProgress {
        metadata: md(),
        message: m.to_string(),
    })
    .collect()
}

// The requests the stub expects.

pub const APPLY_DATA: &[u8] = b"# interop apply-config payload\nversion: v1alpha1\n";
pub const TRY_TIMEOUT: Duration = Duration::from_millis(90_250);
pub const REMOVE_MEMBER_ID: u64 = 0xfedc_ba98_7654_3210;
pub const USER_DISKS: [&str; 2] = ["/dev/sdb", "/dev/nvme1n1"];
pub const RESET_LABELS: [&str; 2] = ["STATE", "EPHEMERAL"];
pub const HEALTH_WAIT: Duration = Duration::from_millis(123_500);
pub const CONTROL_PLANE_NODES: [&str; 2] = ["10.0.0.1", "10.0.0.2"];
pub const WORKER_NODES: [&str; 2] = ["10.0.0.3", "10.0.0.4"];
pub const FORCE_ENDPOINT: &str = "k8s.interop.invalid:6443";

pub fn apply_request() -> machine::ApplyConfigurationRequest {
    machine::ApplyConfigurationRequest {
        data: APPLY_DATA.to_vec(),
        mode: machine::apply_configuration_request::Mode::Try as i32,
        dry_run: true,
        try_mode_timeout: Some(TRY_TIMEOUT.try_into().unwrap()),
    }
}

pub fn reset_request() -> machine::ResetRequest {
    machine::ResetRequest {
        graceful: true,
        reboot: true,
        system_partitions_to_wipe: RESET_LABELS
            .iter()
            .map(|label| machine::ResetPartitionSpec {
                label: label.to_string(),
                wipe: true,
            })
            .collect(),
        user_disks_to_wipe: strings(&USER_DISKS),
        mode: machine::reset_request::WipeMode::SystemDisk as i32,
    }
}

pub fn health_request() -> cluster::HealthCheckRequest {
    cluster::HealthCheckRequest {
        wait_timeout: Some(HEALTH_WAIT.try_into().unwrap()),
        cluster_info: Some(cluster::ClusterInfo {
            control_plane_nodes: strings(&CONTROL_PLANE_NODES),
            worker_nodes: strings(&WORKER_NODES),
            force_endpoint: FORCE_ENDPOINT.into(),
        }),
    }
}
