//! apid's one-to-many proxying over raw gRPC frames: a call is sent to every
//! node named in `nodes` metadata and the answers are merged, each message
//! tagged with its node, a failed node contributing a message that carries
//! only its error. Mirrors siderolabs/talos
//! internal/app/apid/pkg/backend/apid.go (`AppendInfo`, `BuildError`) and the
//! one-to-many mode of siderolabs/grpc-proxy.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use futures::StreamExt as _;
use http_body::Frame;
use http_body_util::{BodyExt as _, StreamBody};
use prost::Message as _;
use tonic::body::Body;
use tonic::{Code, Status};

use crate::api::{common, google};
use crate::go_errors;

/// How a method streams, which decides how answers are merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MethodKind {
    /// One request, one response.
    Unary,
    /// One request, a stream of responses.
    ServerStreaming,
    /// A stream of requests.
    ClientStreaming,
}

/// The streaming kind of the calls this simulator serves.
pub(crate) fn method_kind(path: &str) -> MethodKind {
    match path {
        "/machine.MachineService/EtcdSnapshot"
        | "/machine.MachineService/Read"
        | "/machine.MachineService/Logs"
        | "/machine.MachineService/Events"
        | "/machine.MachineService/Dmesg"
        | "/machine.ImageService/List"
        | "/machine.MachineService/Kubeconfig"
        | "/machine.ImageService/Pull"
        | "/machine.LifecycleService/Upgrade"
        | "/cluster.ClusterService/HealthCheck" => MethodKind::ServerStreaming,
        "/machine.MachineService/EtcdRecover" => MethodKind::ClientStreaming,
        _ => MethodKind::Unary,
    }
}

/// Frames one message: compression flag, big-endian length, bytes.
pub(crate) fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

/// Splits a byte stream into gRPC messages.
#[derive(Default)]
pub(crate) struct Deframer {
    buffer: BytesMut,
}

impl Deframer {
    pub fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
    }

    /// The next complete message, if buffered.
    pub fn next_message(&mut self) -> Option<Bytes> {
        if self.buffer.len() < 5 {
            return None;
        }
        let len = u32::from_be_bytes(self.buffer[1..5].try_into().expect("4 bytes")) as usize;
        if self.buffer.len() < 5 + len {
            return None;
        }
        self.buffer.advance(5);
        Some(self.buffer.split_to(len).freeze())
    }
}

/// The message that stands in for a node that failed: only metadata, with
/// the error as Go formats it and as a status, details included
/// (`BuildError`: `status.Convert(err).Proto()`).
fn error_metadata(node: &str, status: &Status) -> common::Empty {
    common::Empty {
        metadata: Some(common::Metadata {
            hostname: node.to_string(),
            error: go_errors::rpc_error_text(status),
            status: Some(status_proto(status)),
        }),
    }
}

/// A status as google.rpc.Status: tonic keeps the encoded status it
/// received in `grpc-status-details-bin` as the details bytes.
fn status_proto(status: &Status) -> google::rpc::Status {
    let details = google::rpc::Status::decode(status.details())
        .map(|s| s.details)
        .unwrap_or_default();
    google::rpc::Status {
        code: status.code() as i32,
        message: status.message().to_string(),
        details,
    }
}

fn hostname_metadata(node: &str) -> Vec<u8> {
    common::Empty {
        metadata: Some(common::Metadata {
            hostname: node.to_string(),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

/// Adds `metadata.hostname` to every message of a unary response
/// (`repeated X messages = 1`): each field-1 record gets an encoded
/// `Metadata` field appended, which protobuf merges into the message.
pub(crate) fn append_info_unary(response: &[u8], node: &str) -> Result<Vec<u8>, Status> {
    let extra = hostname_metadata(node);
    let mut input = response;
    let mut out = Vec::with_capacity(response.len() + extra.len() + 8);
    while !input.is_empty() {
        let key = prost::encoding::decode_varint(&mut input)
            .map_err(|e| Status::internal(format!("unexpected message format: {e}")))?;
        if key != (1 << 3 | 2) {
            return Err(Status::internal(format!(
                "unexpected message format: {key}"
            )));
        }
        let len = prost::encoding::decode_varint(&mut input)
            .map_err(|e| Status::internal(format!("unexpected message size: {e}")))?
            as usize;
        if len > input.len() {
            return Err(Status::internal(format!("unexpected message size: {len}")));
        }
        let (inner, rest) = input.split_at(len);
        prost::encoding::encode_varint(key, &mut out);
        prost::encoding::encode_varint((len + extra.len()) as u64, &mut out);
        out.extend_from_slice(inner);
        out.extend_from_slice(&extra);
        input = rest;
    }
    Ok(out)
}

/// A unary backend's contribution: its tagged messages, or its error.
pub(crate) fn unary_part(node: &str, outcome: Result<Bytes, Status>) -> Vec<u8> {
    match outcome.and_then(|message| append_info_unary(&message, node)) {
        Ok(bytes) => bytes,
        Err(status) => common::EmptyResponse {
            messages: vec![error_metadata(node, &status)],
        }
        .encode_to_vec(),
    }
}

/// A streamed message tagged with its node (metadata appended).
pub(crate) fn streamed_message(node: &str, message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 32);
    out.extend_from_slice(message);
    out.extend_from_slice(&hostname_metadata(node));
    frame(&out)
}

/// A streamed stand-in for a node that failed.
pub(crate) fn streamed_error(node: &str, status: &Status) -> Bytes {
    frame(&error_metadata(node, status).encode_to_vec())
}

/// Reads a whole unary gRPC response: the single message, or the status.
pub(crate) async fn read_unary(response: http::Response<Body>) -> Result<Bytes, Status> {
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != Code::Ok
    {
        return Err(status);
    }
    let mut body = response.into_body();
    let mut deframer = Deframer::default();
    let mut message = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::unavailable(e.to_string()))?;
        match frame.into_data() {
            Ok(data) => {
                deframer.push(&data);
                if let Some(m) = deframer.next_message() {
                    message = Some(m);
                }
            }
            Err(frame) => {
                if let Some(trailers) = frame.trailers_ref()
                    && let Some(status) = Status::from_header_map(trailers)
                    && status.code() != Code::Ok
                {
                    return Err(status);
                }
            }
        }
    }
    message.ok_or_else(|| Status::internal("backend sent no message"))
}

/// Forwards a streamed backend response frame by frame into `tx`, tagging
/// each message with `node`; an error becomes a stand-in frame.
pub(crate) async fn pump_stream(
    node: String,
    response: Result<http::Response<Body>, Status>,
    tx: tokio::sync::mpsc::Sender<Bytes>,
) {
    let response = match response {
        Ok(r) => r,
        Err(status) => {
            let _ = tx.send(streamed_error(&node, &status)).await;
            return;
        }
    };
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != Code::Ok
    {
        let _ = tx.send(streamed_error(&node, &status)).await;
        return;
    }
    let mut body = response.into_body();
    let mut deframer = Deframer::default();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                let _ = tx
                    .send(streamed_error(&node, &Status::unavailable(e.to_string())))
                    .await;
                return;
            }
        };
        match frame.into_data() {
            Ok(data) => {
                deframer.push(&data);
                while let Some(message) = deframer.next_message() {
                    if tx.send(streamed_message(&node, &message)).await.is_err() {
                        return;
                    }
                }
            }
            Err(frame) => {
                if let Some(trailers) = frame.trailers_ref()
                    && let Some(status) = Status::from_header_map(trailers)
                    && status.code() != Code::Ok
                {
                    let _ = tx.send(streamed_error(&node, &status)).await;
                }
            }
        }
    }
}

/// A successful gRPC response whose body is the given frames, then an OK
/// status in the trailers.
pub(crate) fn grpc_response(
    frames: impl futures::Stream<Item = Bytes> + Send + 'static,
) -> http::Response<Body> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let body = frames
        .map(|bytes| Ok::<_, Status>(Frame::data(bytes)))
        .chain(futures::stream::once(async move {
            Ok(Frame::trailers(trailers))
        }));
    let mut response = http::Response::new(Body::new(StreamBody::new(body)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::machine;

    #[test]
    fn unary_messages_get_their_node() {
        let response = machine::HostnameResponse {
            messages: vec![machine::Hostname {
                metadata: None,
                hostname: "cp-1".into(),
            }],
        };
        let tagged = append_info_unary(&response.encode_to_vec(), "10.0.0.1").unwrap();
        let decoded = machine::HostnameResponse::decode(tagged.as_slice()).unwrap();
        assert_eq!(decoded.messages[0].hostname, "cp-1");
        assert_eq!(
            decoded.messages[0].metadata.as_ref().unwrap().hostname,
            "10.0.0.1"
        );
    }

    #[test]
    fn a_failed_node_decodes_as_any_response_with_only_metadata() {
        let part = unary_part("10.0.0.9", Err(Status::unavailable("connection refused")));
        let decoded = machine::EtcdMemberListResponse::decode(part.as_slice()).unwrap();
        let md = decoded.messages[0].metadata.as_ref().unwrap();
        assert_eq!(md.hostname, "10.0.0.9");
        assert_eq!(
            md.error,
            "rpc error: code = Unavailable desc = connection refused"
        );
        assert_eq!(md.status.as_ref().unwrap().code, Code::Unavailable as i32);
        assert!(decoded.messages[0].members.is_empty());
    }

    #[test]
    fn a_failed_nodes_status_keeps_its_details() {
        let detail = prost_types::Any {
            type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
            value: b"\x0a\x06reason".to_vec(),
        };
        let sent = google::rpc::Status {
            code: Code::FailedPrecondition as i32,
            message: "not now".into(),
            details: vec![detail.clone()],
        };
        let status = Status::with_details(
            Code::FailedPrecondition,
            "not now",
            sent.encode_to_vec().into(),
        );
        let part = unary_part("10.0.0.9", Err(status.clone()));
        let decoded = common::EmptyResponse::decode(part.as_slice()).unwrap();
        let md = decoded.messages[0].metadata.as_ref().unwrap();
        assert_eq!(md.status.as_ref().unwrap(), &sent);
        let streamed = streamed_error("10.0.0.9", &status);
        let streamed = common::Empty::decode(&streamed[5..]).unwrap();
        assert_eq!(
            streamed.metadata.unwrap().status.unwrap().details,
            vec![detail]
        );
    }

    #[test]
    fn deframer_splits_messages_across_pushes() {
        let mut d = Deframer::default();
        let a = frame(b"hello");
        let b = frame(b"world!");
        let joined = [a.as_ref(), b.as_ref()].concat();
        d.push(&joined[..7]);
        assert_eq!(d.next_message(), None);
        d.push(&joined[7..]);
        assert_eq!(d.next_message().unwrap(), Bytes::from_static(b"hello"));
        assert_eq!(d.next_message().unwrap(), Bytes::from_static(b"world!"));
        assert_eq!(d.next_message(), None);
    }
}
