//! Step events on the wire: from a running operation's [`Event`]s, or
//! replayed from its journaled steps.

use talos_client::ops::{Event, OpRecord, StepState};

use crate::proto::{self, operation_event::Event as Ev};
use crate::{state_name, step_state_name};

/// The message of a step event (`None` for events the API does not carry);
/// its operation id is the caller's to set.
pub fn event_to_proto(event: &Event<'_>) -> Option<proto::OperationEvent> {
    let ev = match *event {
        Event::StepStarted {
            index,
            name,
            node,
            destructive,
        } => Ev::StepStarted(proto::StepStarted {
            index: index as u32,
            name: name.into(),
            node: node.unwrap_or_default().into(),
            destructive,
        }),
        Event::StepEnded {
            index,
            name,
            node,
            state,
            duration_ms,
            detail,
        } => Ev::StepEnded(proto::StepEnded {
            index: index as u32,
            name: name.into(),
            node: node.unwrap_or_default().into(),
            state: step_state_name(state),
            duration_ms,
            detail: detail.into(),
        }),
        _ => return None,
    };
    Some(proto::OperationEvent {
        operation_id: String::new(),
        event: Some(ev),
    })
}

/// The events of an operation that is not running here: its journaled
/// steps in order, then its state.
pub fn step_events(record: &OpRecord) -> Vec<proto::OperationEvent> {
    let event = |ev| proto::OperationEvent {
        operation_id: record.id.clone(),
        event: Some(ev),
    };
    let mut events = Vec::new();
    for step in record
        .steps
        .iter()
        .filter(|s| s.state != StepState::Pending)
    {
        let node = step.node.clone().unwrap_or_default();
        events.push(event(Ev::StepStarted(proto::StepStarted {
            index: step.index as u32,
            name: step.name.clone(),
            node: node.clone(),
            destructive: step.destructive,
        })));
        if step.state != StepState::Running {
            events.push(event(Ev::StepEnded(proto::StepEnded {
                index: step.index as u32,
                name: step.name.clone(),
                node,
                state: step_state_name(step.state),
                duration_ms: step.duration_ms.unwrap_or_default(),
                detail: step.detail.clone().unwrap_or_default(),
            })));
        }
    }
    events.push(event(Ev::Finished(proto::Finished {
        state: state_name(record.state),
        error: String::new(),
    })));
    events
}
