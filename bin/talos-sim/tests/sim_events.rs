//! Events, Logs and Dmesg as machined streams them (the Events handler of
//! internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go,
//! internal/app/machined/pkg/runtime/events.go; the reset sequence of
//! runtime/v1alpha1/v1alpha1_sequencer.go), so that talosctl's action
//! tracker can follow a reset.

use talos_test_support as common;

use std::time::Duration;

use common::sim::{SimCluster, wait_for};
use futures::StreamExt as _;
use prost::Message as _;
use talos_client::api::machine::{self, DmesgRequest, EventsRequest, LogsRequest};
use talos_client::client::ResetRequest;
use talos_sim::TalosTiming;

async fn start() -> SimCluster {
    SimCluster::start_with(3, |cfg| cfg.timing = TalosTiming::scaled_down(10)).await
}

/// A readable line per event: `Type name ACTION`.
fn describe(event: &machine::Event) -> String {
    let data = event.data.clone().unwrap_or_default();
    let value = data.value.as_slice();
    match data.type_url.as_str() {
        "talos/runtime/machine.SequenceEvent" => {
            let e = machine::SequenceEvent::decode(value).unwrap();
            format!("sequence {} {}", e.sequence, e.action().as_str_name())
        }
        "talos/runtime/machine.PhaseEvent" => {
            let e = machine::PhaseEvent::decode(value).unwrap();
            format!("phase {} {}", e.phase, e.action().as_str_name())
        }
        "talos/runtime/machine.TaskEvent" => {
            let e = machine::TaskEvent::decode(value).unwrap();
            format!("task {} {}", e.task, e.action().as_str_name())
        }
        "talos/runtime/machine.MachineStatusEvent" => {
            let e = machine::MachineStatusEvent::decode(value).unwrap();
            format!("stage {}", e.stage().as_str_name())
        }
        "" => "hello".to_string(),
        other => other.to_string(),
    }
}

#[tokio::test]
async fn a_watch_sees_a_reset_go_through_its_phases_and_the_node_stop() {
    let sim = start().await;
    let node = sim.admin().node(sim.ip(3));
    let mut stream = node
        .machine_service()
        .await
        .unwrap()
        .events(EventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let hello = stream.next().await.unwrap().unwrap();
    assert_eq!(describe(&hello), "hello");
    assert_eq!(hello.id.len(), 20);

    let actor = node
        .reset(
            ResetRequest::default()
                .with_graceful(true)
                .with_reboot(false)
                .with_system_labels_to_wipe(vec!["STATE".into(), "EPHEMERAL".into()]),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut last_id = hello.id.clone();
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(item) = stream.next().await {
            let Ok(event) = item else { break };
            assert!(event.id > last_id, "ids increase");
            last_id = event.id.clone();
            assert_eq!(event.actor_id, actor, "{}", describe(&event));
            seen.push(describe(&event));
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream ends when the node goes down: {seen:?}"
    );
    for expected in [
        "sequence reset START",
        "stage RESETTING",
        "phase leave START",
        "task leaveEtcd STOP",
        "task stopAllServices STOP",
        "phase resetSpec START",
        "phase shutdown STOP",
    ] {
        assert!(
            seen.contains(&expected.to_string()),
            "{expected} in {seen:?}"
        );
    }
    let position = |s: &str| seen.iter().position(|e| e == s).unwrap();
    assert!(position("task leaveEtcd STOP") < position("task stopAllServices STOP"));
    wait_for(
        "the node to stop answering",
        Duration::from_secs(20),
        || async { node.version().await.is_err().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn tails_select_past_events_and_bad_requests_fail() {
    let sim = start().await;
    let node = sim.admin().node(sim.ip(1));
    let mut stub = node.machine_service().await.unwrap();
    let collect = |request: EventsRequest| {
        let mut stub = stub.clone();
        async move {
            let mut stream = stub.events(request).await?.into_inner();
            let mut events = Vec::new();
            // The hello event and the past ones arrive at once.
            while let Ok(Some(item)) =
                tokio::time::timeout(Duration::from_millis(500), stream.next()).await
            {
                events.push(item?);
            }
            Ok::<_, tonic::Status>(events)
        }
    };
    let all = collect(EventsRequest {
        tail_events: -1,
        ..EventsRequest::default()
    })
    .await
    .unwrap();
    let described: Vec<String> = all.iter().map(describe).collect();
    assert_eq!(
        described,
        [
            "hello",
            "sequence boot START",
            "stage BOOTING",
            "sequence boot STOP",
            "stage RUNNING"
        ]
    );
    let last_two = collect(EventsRequest {
        tail_events: 2,
        ..EventsRequest::default()
    })
    .await
    .unwrap();
    assert_eq!(last_two.len(), 3);
    let after = collect(EventsRequest {
        tail_id: all[2].id.clone(),
        ..EventsRequest::default()
    })
    .await
    .unwrap();
    assert_eq!(after.len(), 3, "hello and the two after the given id");
    let recent = collect(EventsRequest {
        tail_seconds: 600,
        ..EventsRequest::default()
    })
    .await
    .unwrap();
    assert_eq!(recent.len(), 5);
    let err = collect(EventsRequest {
        tail_id: "not-an-id".into(),
        ..EventsRequest::default()
    })
    .await
    .unwrap_err();
    assert_eq!(err.message(), "error parsing tail_id: xid: invalid ID");
    let err = stub
        .events(EventsRequest {
            tail_events: 1,
            tail_seconds: 1,
            ..EventsRequest::default()
        })
        .await;
    let failed = match err {
        Err(status) => Some(status),
        Ok(response) => response.into_inner().next().await.and_then(|r| r.err()),
    };
    assert!(failed.is_some(), "two tails at once are refused");
}

#[tokio::test]
async fn logs_serve_etcds_log_and_dmesg_the_boot() {
    let sim = start().await;
    let node = sim.admin().node(sim.ip(1));
    let mut stub = node.machine_service().await.unwrap();
    let read = |mut stream: tonic::Streaming<talos_client::api::common::Data>| async move {
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            out.extend_from_slice(&item.unwrap().bytes);
        }
        String::from_utf8(out).unwrap()
    };
    let logs = stub
        .logs(LogsRequest {
            namespace: "system".into(),
            id: "etcd".into(),
            tail_lines: 3,
            ..LogsRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let text = read(logs).await;
    assert_eq!(text.lines().count(), 3, "{text}");
    let dmesg = stub
        .dmesg(DmesgRequest::default())
        .await
        .unwrap()
        .into_inner();
    let text = read(dmesg).await;
    assert!(text.contains("hostname set to cp-1"), "{text}");
    // Each message as machined formats it: FACILITY: PRIORITY (seven
    // columns): [RFC 3339 time]: text.
    for line in text.lines() {
        let (facility, rest) = line.split_once(": ").unwrap();
        assert!(["kern", "user"].contains(&facility), "{line}");
        let (priority, rest) = rest.split_at(7);
        assert!(["   info", "warning"].contains(&priority), "{line}");
        let stamp = rest.strip_prefix(": [").unwrap().split(']').next().unwrap();
        time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{stamp}: {e}"));
    }
    // Upstream serves any service's log in the system namespace: one
    // nothing was written to is empty, not an error.
    let kubelet = stub
        .logs(LogsRequest {
            namespace: "system".into(),
            id: "kubelet".into(),
            tail_lines: -1,
            ..LogsRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read(kubelet).await, "");
    // A container that does not exist in another namespace is an error.
    let err = stub
        .logs(LogsRequest {
            namespace: "k8s.io".into(),
            driver: talos_client::api::common::ContainerDriver::Cri as i32,
            id: "kube-system/nothing:here".into(),
            tail_lines: -1,
            ..LogsRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.message(),
        "container \"kube-system/nothing:here\" not found"
    );
    let err = stub
        .logs(LogsRequest {
            id: "etcd".into(),
            tail_lines: -1,
            ..LogsRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert_eq!(err.message(), "namespace can't be empty");
}

/// A log goes out in messages of at most 1024 bytes, as upstream's log
/// chunker reads it.
#[tokio::test]
async fn a_log_arrives_in_chunks_of_at_most_1024_bytes() {
    let sim = start().await;
    let mut stub = sim.admin().node(sim.ip(1)).machine_service().await.unwrap();
    let mut logs = stub
        .logs(LogsRequest {
            namespace: "system".into(),
            id: "etcd".into(),
            tail_lines: -1,
            ..LogsRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut sizes = Vec::new();
    while let Some(item) = logs.next().await {
        sizes.push(item.unwrap().bytes.len());
    }
    assert!(sizes.len() > 1, "{sizes:?}");
    assert!(sizes.iter().all(|s| *s <= 1024 && *s > 0), "{sizes:?}");
}

/// A reset while another sequence holds machined's sequencer lock is
/// answered, then refused by the lock with a LOCKED sequence event and
/// nothing wiped (runtime/v1alpha1/v1alpha1_controller.go, Run).
#[tokio::test]
async fn a_reset_during_another_sequence_is_refused_by_the_lock() {
    let sim = start().await;
    let node = sim.admin().node(sim.ip(3));
    let sim_node = sim.cluster.node("cp-3").unwrap();
    let mut stream = node
        .machine_service()
        .await
        .unwrap()
        .events(EventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    stream.next().await.unwrap().unwrap();
    let held = sim_node.hold_sequence_lock().await;
    node.reset(
        ResetRequest::default()
            .with_graceful(false)
            .with_reboot(false)
            .with_system_labels_to_wipe(vec!["STATE".into(), "EPHEMERAL".into()]),
    )
    .await
    .expect("the reset is answered");
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(event)) = stream.next().await {
            let data = event.data.unwrap_or_default();
            if data.type_url == "talos/runtime/machine.SequenceEvent" {
                return Some(machine::SequenceEvent::decode(data.value.as_slice()).unwrap());
            }
        }
        None
    })
    .await
    .expect("a sequence event")
    .expect("the stream stays open");
    assert_eq!(refused.sequence, "reset");
    assert_eq!(refused.action(), machine::sequence_event::Action::Noop);
    let error = refused.error.unwrap();
    assert_eq!(error.code, talos_client::api::common::Code::Locked as i32);
    assert_eq!(error.message, "sequence not started: locked");
    drop(held);
    assert!(sim_node.config_path().exists(), "nothing was wiped");
    assert!(sim_node.etcd_data_dir().join("member").exists());
    assert!(node.version().await.is_ok(), "the node still answers");
}
