//! The streaming calls that show what happens on a node: Events (machined's
//! runtime events), Logs (a service's log: the simulator has etcd's) and
//! Dmesg (the kernel's messages: the simulated boot). Each stream ends when
//! the node's API goes down, as the connection to a real node breaks.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::events::{Stored, deliver};
use super::node::Node;
use crate::api::{common, machine};

type Stream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

/// How often a followed file or buffer is looked at again.
const POLL: Duration = Duration::from_millis(200);

fn token(node: &Node) -> CancellationToken {
    node.front_token().unwrap_or_default()
}

/// Events: the hello event and the requested past events, then new ones.
pub(crate) fn events(
    node: &Arc<Node>,
    request: machine::EventsRequest,
) -> Result<Stream<machine::Event>, Status> {
    let (backlog, receiver) = node.runtime_events.watch(&request)?;
    let state = (
        VecDeque::from(backlog),
        receiver,
        token(node),
        request.with_actor_id,
    );
    let stream = futures::stream::unfold(state, |mut state| async move {
        if let Some(event) = state.0.pop_front() {
            return Some((Ok(event), state));
        }
        loop {
            // What was published before the API went down still goes out.
            let next: Result<Stored, RecvError> = tokio::select! {
                biased;
                next = state.1.recv() => next,
                () = state.2.cancelled() => return None,
            };
            match next {
                Ok(stored) => {
                    if let Some(event) = deliver(&stored, &state.3) {
                        return Some((Ok(event), state));
                    }
                }
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return None,
            }
        }
    });
    Ok(Box::pin(stream))
}

fn data(bytes: Vec<u8>) -> common::Data {
    common::Data {
        metadata: None,
        bytes: bytes.into(),
    }
}

/// The last `tail` lines of `text` (all when negative).
fn last_lines(text: &str, tail: i32) -> &str {
    let Ok(tail) = usize::try_from(tail) else {
        return text;
    };
    if tail == 0 {
        return "";
    }
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    match trimmed.rmatch_indices('\n').nth(tail - 1) {
        Some((at, _)) => &text[at + 1..],
        None => text,
    }
}

/// How many bytes one Data message of a log carries at most (upstream's
/// log chunker reads in 1024-byte chunks, pkg/chunker/stream).
const LOG_CHUNK: usize = 1024;

/// Logs: a service's log in the system namespace (the simulator keeps
/// etcd's; every other service's log is empty, as a log Talos has not
/// written to), or a container's in another namespace (the kube-apiserver
/// static pod's), its last `tail_lines` lines, then, with `follow`, what it
/// appends (v1alpha1_server.go: Logs, k8slogs).
pub(crate) async fn logs(
    node: &Arc<Node>,
    request: machine::LogsRequest,
) -> Result<Stream<common::Data>, Status> {
    let path = if request.namespace == crate::machined_control::SYSTEM_NAMESPACE
        || request.id == "kubelet"
    {
        (request.id == "etcd" && node.is_control_plane()).then(|| node.etcd_log())
    } else {
        let containers =
            crate::machined_control::containers(node, &request.namespace, request.driver).await?;
        let found = containers
            .into_iter()
            .find(|c| container_matches(&c.info, &request.id))
            .ok_or_else(|| Status::unknown(format!("container \"{}\" not found", request.id)))?;
        found.log
    };
    let Some(path) = path else {
        return Ok(match request.follow {
            false => Box::pin(futures::stream::empty()),
            true => {
                let token = token(node);
                Box::pin(
                    futures::stream::once(async move {
                        token.cancelled().await;
                        None
                    })
                    .filter_map(|item| async move { item }),
                )
            }
        });
    };
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let first: Vec<Vec<u8>> = last_lines(&text, request.tail_lines)
        .as_bytes()
        .chunks(LOG_CHUNK)
        .map(<[u8]>::to_vec)
        .collect();
    let offset = text.len() as u64;
    if !request.follow {
        return Ok(Box::pin(futures::stream::iter(
            first.into_iter().map(|c| Ok(data(c))),
        )));
    }
    let state = (VecDeque::from(first), path, offset, token(node));
    Ok(Box::pin(futures::stream::unfold(state, follow_file)))
}

/// Whether `id` names the container as upstream's inspectors look one up:
/// its display id, or a CRI container by `NAMESPACE/POD:NAME` with or
/// without the container id's prefix.
fn container_matches(info: &machine::ContainerInfo, id: &str) -> bool {
    if info.id == id {
        return true;
    }
    let mut parts = id.splitn(3, ':');
    let (Some(pod), Some(name)) = (parts.next(), parts.next()) else {
        return false;
    };
    let wanted = parts.next().unwrap_or("");
    info.pod_id == pod && info.name == name && info.internal_id.contains(wanted)
}

type Follow = (VecDeque<Vec<u8>>, PathBuf, u64, CancellationToken);

async fn follow_file(mut state: Follow) -> Option<(Result<common::Data, Status>, Follow)> {
    loop {
        if let Some(chunk) = state.0.pop_front() {
            return Some((Ok(data(chunk)), state));
        }
        let bytes = std::fs::read(&state.1).unwrap_or_default();
        if (bytes.len() as u64) < state.2 {
            state.2 = 0; // a new log after a restart
        }
        if (bytes.len() as u64) > state.2 {
            state.0.extend(
                bytes[state.2 as usize..]
                    .chunks(LOG_CHUNK)
                    .map(<[u8]>::to_vec),
            );
            state.2 = bytes.len() as u64;
            continue;
        }
        tokio::select! {
            () = state.3.cancelled() => return None,
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Dmesg: the kernel's messages since boot (none with `tail`), then, with
/// `follow`, new ones.
pub(crate) fn dmesg(node: &Arc<Node>, request: machine::DmesgRequest) -> Stream<common::Data> {
    let kept = node.kmsg.lock().expect("kmsg lock").clone();
    let start = if request.tail { kept.len() } else { 0 };
    let lines: Vec<String> = kept[start..].to_vec();
    if !request.follow {
        let items: Vec<_> = lines
            .into_iter()
            .map(|l| Ok(data(format!("{l}\n").into_bytes())))
            .collect();
        return Box::pin(futures::stream::iter(items));
    }
    let state = (node.clone(), start, token(node));
    Box::pin(futures::stream::unfold(state, |mut state| async move {
        loop {
            let next = state
                .0
                .kmsg
                .lock()
                .expect("kmsg lock")
                .get(state.1)
                .cloned();
            if let Some(line) = next {
                state.1 += 1;
                return Some((Ok(data(format!("{line}\n").into_bytes())), state));
            }
            tokio::select! {
                () = state.2.cancelled() => return None,
                () = tokio::time::sleep(POLL) => {}
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::last_lines;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc\n", 5), "a\nb\nc\n");
        assert_eq!(last_lines("a\nb\nc\n", -1), "a\nb\nc\n");
        assert_eq!(last_lines("a\nb\nc\n", 0), "");
    }
}
