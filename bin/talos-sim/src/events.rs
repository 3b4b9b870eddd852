//! A node's runtime events, as machined keeps and streams them
//! (internal/app/machined/pkg/runtime/events.go and the Events handler of
//! v1alpha1_server.go): each event has a sortable xid, an actor id and a
//! payload typed `talos/runtime/machine.<Message>`; a watch sends an empty
//! hello event first, then the past events `tail_events`, `tail_id` or
//! `tail_seconds` ask for (at most one of them), then new ones. The log is
//! in memory, so a reboot starts it afresh.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;
use tonic::Status;

use crate::api::machine::{self, EventsRequest};

/// How many events a node keeps.
const KEPT: usize = 1000;

/// One stored event.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    id: [u8; 12],
    at: SystemTime,
    actor: String,
    type_url: String,
    value: Vec<u8>,
}

impl Stored {
    fn to_event(&self) -> machine::Event {
        machine::Event {
            metadata: None,
            data: Some(prost_types::Any {
                type_url: self.type_url.clone(),
                value: self.value.clone(),
            }),
            id: xid_string(&self.id),
            actor_id: self.actor.clone(),
        }
    }
}

/// A node's event log.
pub(crate) struct EventLog {
    kept: Mutex<Vec<Stored>>,
    tx: broadcast::Sender<Stored>,
    /// The stage of the last MachineStatusEvent (machine.proto's
    /// `MachineStage` number), which the machine status resource shows.
    stage: Mutex<Option<i32>>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A new xid: 4 bytes of seconds, 5 bytes of machine and process, 3 bytes
/// of counter (rs/xid's layout).
fn new_xid() -> [u8; 12] {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as u32;
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let mut id = [0u8; 12];
    id[..4].copy_from_slice(&secs.to_be_bytes());
    id[4..7].copy_from_slice(&[0x5a, 0x1d, 0x0c]);
    id[7..9].copy_from_slice(&(pid as u16).to_be_bytes());
    id[9..].copy_from_slice(&count.to_be_bytes()[1..]);
    id
}

const XID_ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";

fn xid_string(id: &[u8; 12]) -> String {
    let mut bits: u128 = 0;
    for b in id {
        bits = (bits << 8) | u128::from(*b);
    }
    // 96 bits as 20 base32hex digits, padded on the right to 100 bits.
    bits <<= 4;
    (0..20)
        .rev()
        .map(|i| XID_ALPHABET[((bits >> (i * 5)) & 31) as usize] as char)
        .collect()
}

fn parse_xid(text: &str) -> Option<[u8; 12]> {
    if text.len() != 20 {
        return None;
    }
    let mut bits: u128 = 0;
    for c in text.bytes() {
        let v = XID_ALPHABET.iter().position(|a| *a == c)? as u128;
        bits = (bits << 5) | v;
    }
    if bits & 0xf != 0 {
        return None;
    }
    bits >>= 4;
    let mut id = [0u8; 12];
    for (i, b) in id.iter_mut().enumerate() {
        *b = (bits >> (8 * (11 - i))) as u8;
    }
    Some(id)
}

/// Which past events a watch starts with.
enum Tail {
    None,
    Last(usize),
    All,
    After([u8; 12]),
    Since(SystemTime),
}

fn tail_of(request: &EventsRequest) -> Result<Tail, Status> {
    let given = [
        request.tail_events != 0,
        !request.tail_id.is_empty(),
        request.tail_seconds != 0,
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        // WatchOptions refuse combinations (runtime/events.go).
        let first = if given[0] {
            "WithTailEvents can't be specified at the same time with WithTailID or WithTailDuration"
        } else {
            "WithTailID can't be specified at the same time with WithTailEvents or WithTailDuration"
        };
        return Err(Status::unknown(first));
    }
    Ok(if request.tail_events > 0 {
        Tail::Last(request.tail_events as usize)
    } else if request.tail_events < 0 {
        Tail::All
    } else if !request.tail_id.is_empty() {
        let id = parse_xid(&request.tail_id)
            .ok_or_else(|| Status::unknown("error parsing tail_id: xid: invalid ID"))?;
        Tail::After(id)
    } else if request.tail_seconds != 0 {
        let back = Duration::from_secs(request.tail_seconds.unsigned_abs().into());
        Tail::Since(SystemTime::now() - back)
    } else {
        Tail::None
    })
}

impl EventLog {
    pub(crate) fn new() -> EventLog {
        EventLog {
            kept: Mutex::new(Vec::new()),
            tx: broadcast::channel(KEPT).0,
            stage: Mutex::new(None),
        }
    }

    /// The stage the machine last entered in this boot, if any.
    pub(crate) fn stage(&self) -> Option<i32> {
        *self.stage.lock().expect("stage lock")
    }

    /// Records `payload` (a `machine.<name>` message) caused by `actor`.
    pub(crate) fn publish<M: prost::Message>(&self, name: &str, payload: &M, actor: &str) {
        let stored = Stored {
            id: new_xid(),
            at: SystemTime::now(),
            actor: actor.to_string(),
            type_url: format!("talos/runtime/machine.{name}"),
            value: payload.encode_to_vec(),
        };
        let mut kept = self.kept.lock().expect("events lock");
        kept.push(stored.clone());
        let excess = kept.len().saturating_sub(KEPT);
        kept.drain(..excess);
        let _ = self.tx.send(stored);
    }

    /// Forgets every event (the log lives in memory: a boot starts anew).
    pub(crate) fn clear(&self) {
        self.kept.lock().expect("events lock").clear();
        *self.stage.lock().expect("stage lock") = None;
    }

    /// The hello event, the requested past events, then a receiver of new
    /// ones, all filtered by `with_actor_id`.
    pub(crate) fn watch(
        &self,
        request: &EventsRequest,
    ) -> Result<(Vec<machine::Event>, broadcast::Receiver<Stored>), Status> {
        let tail = tail_of(request)?;
        let kept = self.kept.lock().expect("events lock");
        let receiver = self.tx.subscribe();
        let actor = request.with_actor_id.as_str();
        let matching: Vec<&Stored> = kept
            .iter()
            .filter(|e| actor.is_empty() || e.actor == actor)
            .collect();
        let past: Vec<&Stored> = match tail {
            Tail::None => Vec::new(),
            Tail::All => matching,
            Tail::Last(n) => matching[matching.len().saturating_sub(n)..].to_vec(),
            Tail::After(id) => matching.into_iter().filter(|e| e.id > id).collect(),
            Tail::Since(t) => matching.into_iter().filter(|e| e.at >= t).collect(),
        };
        let hello = machine::Event {
            metadata: None,
            data: Some(prost_types::Any::default()),
            id: xid_string(&new_xid()),
            actor_id: request.with_actor_id.clone(),
        };
        let mut events = vec![hello];
        events.extend(past.into_iter().map(Stored::to_event));
        Ok((events, receiver))
    }
}

/// Whether a new event passes the watch's actor filter; its wire form.
pub(crate) fn deliver(stored: &Stored, with_actor_id: &str) -> Option<machine::Event> {
    (with_actor_id.is_empty() || stored.actor == with_actor_id).then(|| stored.to_event())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_round_trip_and_sort() {
        let a = new_xid();
        let b = new_xid();
        assert!(b > a);
        let text = xid_string(&a);
        assert_eq!(text.len(), 20);
        assert_eq!(parse_xid(&text), Some(a));
        assert!(xid_string(&b) > text);
        assert_eq!(parse_xid("not-an-xid"), None);
    }

    #[test]
    fn tails_select_past_events() {
        let log = EventLog::new();
        let payload = machine::PhaseEvent {
            phase: "x".into(),
            action: 0,
        };
        log.publish("PhaseEvent", &payload, "a1");
        log.publish("PhaseEvent", &payload, "a2");
        log.publish("PhaseEvent", &payload, "a1");
        let watch = |r: EventsRequest| log.watch(&r).unwrap().0;
        assert_eq!(watch(EventsRequest::default()).len(), 1);
        assert_eq!(
            watch(EventsRequest {
                tail_events: 2,
                ..Default::default()
            })
            .len(),
            3
        );
        let all = watch(EventsRequest {
            tail_events: -1,
            ..Default::default()
        });
        assert_eq!(all.len(), 4);
        let after = watch(EventsRequest {
            tail_id: all[1].id.clone(),
            ..Default::default()
        });
        assert_eq!(after.len(), 3);
        let only_a1 = watch(EventsRequest {
            tail_events: -1,
            with_actor_id: "a1".into(),
            ..Default::default()
        });
        assert_eq!(only_a1.len(), 3);
        assert!(
            log.watch(&EventsRequest {
                tail_events: 1,
                tail_seconds: 5,
                ..Default::default()
            })
            .is_err()
        );
    }
}

/// Publishing the events of machined's sequences.
pub(crate) mod publish {
    use super::EventLog;
    use crate::api::{common, machine};
    use machine::machine_status_event::{MachineStage, MachineStatus};

    /// A sequence starting (`error` empty) or ending.
    pub(crate) fn sequence(log: &EventLog, name: &str, start: bool, error: &str, actor: &str) {
        use machine::sequence_event::Action;
        let event = machine::SequenceEvent {
            sequence: name.to_string(),
            action: if start { Action::Start } else { Action::Stop } as i32,
            error: (!error.is_empty()).then(|| common::Error {
                code: common::Code::Fatal as i32,
                message: error.to_string(),
                details: Vec::new(),
            }),
        };
        log.publish("SequenceEvent", &event, actor);
    }

    /// The machine entering `stage`.
    pub(crate) fn stage(log: &EventLog, stage: MachineStage, ready: bool, actor: &str) {
        *log.stage.lock().expect("stage lock") = Some(stage as i32);
        let event = machine::MachineStatusEvent {
            stage: stage as i32,
            status: Some(MachineStatus {
                ready,
                unmet_conditions: Vec::new(),
            }),
        };
        log.publish("MachineStatusEvent", &event, actor);
    }

    /// A phase starting or stopping.
    pub(crate) fn phase(log: &EventLog, name: &str, start: bool, actor: &str) {
        use machine::phase_event::Action;
        let event = machine::PhaseEvent {
            phase: name.to_string(),
            action: if start { Action::Start } else { Action::Stop } as i32,
        };
        log.publish("PhaseEvent", &event, actor);
    }

    /// A task starting or stopping.
    pub(crate) fn task(log: &EventLog, name: &str, start: bool, actor: &str) {
        use machine::task_event::Action;
        let event = machine::TaskEvent {
            task: name.to_string(),
            action: if start { Action::Start } else { Action::Stop } as i32,
        };
        log.publish("TaskEvent", &event, actor);
    }

    /// A phase of one task that ran to its end.
    pub(crate) fn phase_with_task(log: &EventLog, phase_name: &str, task_name: &str, actor: &str) {
        phase(log, phase_name, true, actor);
        task(log, task_name, true, actor);
        task(log, task_name, false, actor);
        phase(log, phase_name, false, actor);
    }
}

/// The kernel messages a simulated node has to show: its boot, as a
/// kernel and machined would log it, each line as machined's Dmesg sends
/// one (`FACILITY: PRIORITY: [TIME]: MESSAGE`, the priority right-aligned
/// in seven columns, the time RFC 3339 with nanoseconds; v1alpha1_server.go).
pub(crate) fn kernel_boot_messages(node: &crate::node::Node) {
    let lines = [
        (
            "kern",
            "info",
            format!(
                "Linux version (simulated) for Talos {}",
                node.talos_version().tag()
            ),
        ),
        (
            "user",
            "warning",
            format!("[talos] hostname set to {}", node.name),
        ),
        (
            "user",
            "warning",
            format!("[talos] node address {} configured", node.ip),
        ),
        ("user", "warning", "[talos] boot sequence: done".to_string()),
    ];
    let at = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    node.kmsg
        .lock()
        .expect("kmsg lock")
        .extend(lines.into_iter().map(|(facility, priority, message)| {
            format!("{facility}: {priority:>7}: [{at}]: {message}")
        }));
}
