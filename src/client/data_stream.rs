//! A server stream of `common.Data` messages (an etcd snapshot, a file) read
//! straight off the HTTP/2 response body.
//!
//! Talos sends an etcd snapshot in 1 KiB messages: a gigabyte is a million of
//! them. Decoded one by one, each costs a copy into the decoder's buffer, a
//! `Data` value and a reference-counted `Bytes`; here the gRPC frames and the
//! two fields of `Data` are parsed where they arrive, and the payloads are
//! copied once, into batches of about [`BATCH`] bytes. A message split between
//! two HTTP/2 DATA frames is the only one put together first.
//!
//! What the caller sees of the call is what tonic's `Streaming` gives: the
//! status of a trailers-only answer, the `grpc-status` trailer at the end (or
//! the status inferred from the HTTP status when it is missing), transport
//! errors mapped by [`Status::from_error`], and `Internal` for a malformed
//! frame or message.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use prost::Message as _;
use tonic::Status;

use super::MAX_MESSAGE_SIZE;
use crate::api::common;

/// A batch is handed out once it holds this many payload bytes.
pub(crate) const BATCH: usize = 256 * 1024;

/// While the body has nothing more for now, a batch this large is handed out
/// rather than held for more.
pub(crate) const EAGER: usize = 64 * 1024;

/// Room for one more DATA frame's payloads beyond [`BATCH`], so that a batch
/// is filled without growing (and copying) it.
const SLACK: usize = super::transport::MAX_FRAME_SIZE as usize;

/// gRPC's message prefix: compression flag and big-endian length.
const PREFIX: usize = 5;

type BoxBody = Pin<Box<dyn http_body::Body<Data = Bytes, Error = Status> + Send>>;

/// One item of the stream: a batch of payload bytes, or the error of a
/// message whose metadata carries one (Talos's per-node error).
pub(crate) enum Item {
    Bytes(Bytes),
    Failed(common::Metadata),
}

/// The answer of a server-streaming call whose messages are `common.Data`.
pub(crate) struct DataStream {
    body: Option<BoxBody>,
    http_status: http::StatusCode,
    trailers: Option<http::HeaderMap>,
    /// An incomplete message carried over from the previous DATA frame.
    partial: BytesMut,
    /// Payload bytes not yet handed out.
    batch: BytesMut,
    /// What to hand out after the batch: a failed message or an error.
    pending: Option<Result<common::Metadata, Status>>,
    done: bool,
}

impl DataStream {
    /// Reads `response`: fails at once on a trailers-only error answer, as
    /// tonic's client does.
    pub(crate) fn new<B>(response: http::Response<B>) -> Result<DataStream, Status>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = response.into_parts();
        let trailers_only = Status::from_header_map(&parts.headers);
        if let Some(status) = &trailers_only
            && status.code() != tonic::Code::Ok
        {
            return Err(status.clone());
        }
        let body: BoxBody = Box::pin(http_body_util::BodyExt::map_err(body, |e| {
            Status::from_error(e.into())
        }));
        Ok(DataStream {
            // A trailers-only OK answer has no messages.
            body: trailers_only.is_none().then_some(body),
            http_status: parts.status,
            trailers: None,
            partial: BytesMut::new(),
            batch: BytesMut::new(),
            pending: None,
            done: false,
        })
    }

    /// The next batch, failed message or error; `None` after the end or
    /// after an error.
    pub(crate) fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Item, Status>>> {
        loop {
            if self.pending.is_some() || self.done {
                if !self.batch.is_empty() {
                    return Poll::Ready(Some(Ok(Item::Bytes(self.batch.split().freeze()))));
                }
                return Poll::Ready(match self.pending.take() {
                    Some(Ok(failed)) => Some(Ok(Item::Failed(failed))),
                    Some(Err(status)) => {
                        self.done = true;
                        Some(Err(status))
                    }
                    None => None,
                });
            }
            if self.batch.len() >= BATCH {
                return Poll::Ready(Some(Ok(Item::Bytes(self.batch.split().freeze()))));
            }
            let Some(body) = self.body.as_mut() else {
                self.done = true;
                continue;
            };
            let frame = match body.as_mut().poll_frame(cx) {
                Poll::Pending if self.batch.len() >= EAGER => {
                    return Poll::Ready(Some(Ok(Item::Bytes(self.batch.split().freeze()))));
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(frame) => frame,
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if let Err(status) = self.take(data) {
                            self.fail(status);
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.trailers
                                .get_or_insert_with(Default::default)
                                .extend(trailers);
                        }
                    }
                },
                Some(Err(status)) => self.fail(status),
                None => {
                    self.body = None;
                    if !self.partial.is_empty() {
                        self.fail(Status::internal("Unexpected EOF decoding stream."));
                    } else if let Err(status) = self.final_status() {
                        self.fail(status);
                    } else {
                        self.done = true;
                    }
                }
            }
        }
    }

    fn fail(&mut self, status: Status) {
        self.body = None;
        if self.pending.is_none() {
            self.pending = Some(Err(status));
        }
    }

    /// The call's status at the end: the `grpc-status` trailer, or one
    /// inferred from the HTTP status (the gRPC spec's mapping, as tonic
    /// applies it).
    fn final_status(&self) -> Result<(), Status> {
        if let Some(status) = self.trailers.as_ref().and_then(Status::from_header_map) {
            return match status.code() {
                tonic::Code::Ok => Ok(()),
                _ => Err(status),
            };
        }
        use http::StatusCode as H;
        use tonic::Code;
        let code = match self.http_status {
            H::OK => {
                return Err(Status::unknown(
                    "protocol error: missing grpc-status trailer, stream was terminated without a final status",
                ));
            }
            H::BAD_REQUEST => Code::Internal,
            H::UNAUTHORIZED => Code::Unauthenticated,
            H::FORBIDDEN => Code::PermissionDenied,
            H::NOT_FOUND => Code::Unimplemented,
            H::TOO_MANY_REQUESTS | H::BAD_GATEWAY | H::SERVICE_UNAVAILABLE | H::GATEWAY_TIMEOUT => {
                Code::Unavailable
            }
            _ => Code::Unknown,
        };
        Err(Status::new(
            code,
            format!(
                "grpc-status header missing, mapped from HTTP status code {}",
                self.http_status.as_u16()
            ),
        ))
    }

    /// Parses the messages of one DATA frame: whole ones in place, a split
    /// one through `partial`.
    fn take(&mut self, mut data: Bytes) -> Result<(), Status> {
        while !self.partial.is_empty() {
            let need = match message_len(&self.partial)? {
                Some(len) => PREFIX + len - self.partial.len(),
                None => PREFIX - self.partial.len(),
            };
            let n = need.min(data.len());
            self.partial.extend_from_slice(&data[..n]);
            data.advance(n);
            match message_len(&self.partial)? {
                Some(len) if self.partial.len() == PREFIX + len => {
                    let mut message = std::mem::take(&mut self.partial);
                    self.message(&message[PREFIX..])?;
                    message.clear();
                    self.partial = message;
                    if self.pending.is_some() {
                        return Ok(());
                    }
                }
                // Short still; a prefix just completed reads on.
                _ if data.is_empty() => return Ok(()),
                _ => {}
            }
        }
        let mut rest = &data[..];
        while let Some(len) = message_len(rest)? {
            if rest.len() < PREFIX + len {
                break;
            }
            self.message(&rest[PREFIX..PREFIX + len])?;
            rest = &rest[PREFIX + len..];
            if self.pending.is_some() {
                return Ok(());
            }
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    /// One `common.Data` message: its payload joins the batch; metadata
    /// carrying an error stops the stream there.
    fn message(&mut self, message: &[u8]) -> Result<(), Status> {
        let fields = DataFields::parse(message)?;
        if let Some(metadata) = fields.metadata {
            let metadata = common::Metadata::decode(&metadata[..]).map_err(decode_error)?;
            if super::reply::metadata_error(Some(&metadata)).is_some() {
                self.pending = Some(Ok(metadata));
                self.body = None;
                return Ok(());
            }
        }
        if self.batch.capacity() - self.batch.len() < fields.bytes.len() {
            self.batch.reserve((BATCH + SLACK).max(fields.bytes.len()));
        }
        self.batch.extend_from_slice(fields.bytes);
        Ok(())
    }
}

/// The length of the message a buffer starts with, once its prefix is
/// complete.
fn message_len(buf: &[u8]) -> Result<Option<usize>, Status> {
    if buf.len() < PREFIX {
        return Ok(None);
    }
    match buf[0] {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ));
        }
        flag => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1)"
            )));
        }
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_MESSAGE_SIZE {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {len} bytes, the limit is: {MAX_MESSAGE_SIZE} bytes"
        )));
    }
    Ok(Some(len))
}

fn decode_error(e: prost::DecodeError) -> Status {
    Status::internal(e.to_string())
}

/// A `common.Data` message that does not parse, worded as prost's
/// decoding errors are.
fn malformed(description: &str) -> Status {
    Status::internal(format!("failed to decode Protobuf message: {description}"))
}

/// The fields of one `common.Data` (`metadata = 1`, `bytes = 2`), as
/// protobuf reads them: the last `bytes` wins, every `metadata` merges (so
/// their encodings are joined), unknown fields are skipped.
struct DataFields<'a> {
    metadata: Option<Vec<u8>>,
    bytes: &'a [u8],
}

impl<'a> DataFields<'a> {
    fn parse(mut message: &'a [u8]) -> Result<DataFields<'a>, Status> {
        let mut fields = DataFields {
            metadata: None,
            bytes: &[],
        };
        while !message.is_empty() {
            let key = prost::encoding::decode_varint(&mut message).map_err(decode_error)?;
            let (field, wire_type) = (key >> 3, key & 7);
            if field == 0 || field > u64::from(u32::MAX >> 3) {
                return Err(malformed("invalid tag value: 0"));
            }
            match wire_type {
                0 => {
                    prost::encoding::decode_varint(&mut message).map_err(decode_error)?;
                }
                1 | 5 => {
                    let n = if wire_type == 1 { 8 } else { 4 };
                    if message.len() < n {
                        return Err(malformed("buffer underflow"));
                    }
                    message = &message[n..];
                }
                2 => {
                    let len = prost::encoding::decode_varint(&mut message).map_err(decode_error)?;
                    let len = usize::try_from(len)
                        .ok()
                        .filter(|&len| len <= message.len())
                        .ok_or_else(|| malformed("buffer underflow"))?;
                    let (value, rest) = message.split_at(len);
                    message = rest;
                    match field {
                        1 => fields
                            .metadata
                            .get_or_insert_with(Vec::new)
                            .extend_from_slice(value),
                        2 => fields.bytes = value,
                        _ => {}
                    }
                }
                _ => {
                    return Err(malformed(&format!("invalid wire type value: {wire_type}")));
                }
            }
        }
        Ok(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt as _, StreamBody};

    fn data(metadata: Option<common::Metadata>, bytes: &[u8]) -> Vec<u8> {
        let message = common::Data {
            metadata,
            bytes: Bytes::copy_from_slice(bytes),
        }
        .encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        framed
    }

    fn trailers(code: i32, message: &str) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        map.insert("grpc-status", code.to_string().parse().unwrap());
        if !message.is_empty() {
            map.insert("grpc-message", message.parse().unwrap());
        }
        map
    }

    /// The stream of a body made of `frames` (DATA frames, then trailers).
    fn stream(frames: Vec<Vec<u8>>, end: Option<http::HeaderMap>) -> DataStream {
        let mut items: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = frames
            .into_iter()
            .map(|f| Ok(http_body::Frame::data(Bytes::from(f))))
            .collect();
        if let Some(end) = end {
            items.push(Ok(http_body::Frame::trailers(end)));
        }
        let body = StreamBody::new(futures::stream::iter(items)).boxed();
        DataStream::new(http::Response::new(body)).unwrap()
    }

    async fn collect(
        mut stream: DataStream,
    ) -> (Vec<u8>, Option<Result<common::Metadata, Status>>) {
        let mut out = Vec::new();
        let mut end = None;
        while let Some(item) = std::future::poll_fn(|cx| stream.poll_item(cx)).await {
            match item {
                Ok(Item::Bytes(b)) => {
                    assert!(b.len() <= BATCH + SLACK);
                    out.extend_from_slice(&b);
                }
                Ok(Item::Failed(md)) => {
                    end = Some(Ok(md));
                    break;
                }
                Err(status) => {
                    end = Some(Err(status));
                    break;
                }
            }
        }
        (out, end)
    }

    /// Every split of a stream of messages into DATA frames, including
    /// splits inside a prefix, gives the same bytes.
    #[tokio::test]
    async fn messages_split_anywhere_between_frames_read_whole() {
        // One empty message (no fields at all) among them.
        let payloads: Vec<Vec<u8>> = (0..7u8)
            .map(|i| vec![i; if i == 3 { 0 } else { 300 + usize::from(i) * 97 }])
            .collect();
        let wire: Vec<u8> = payloads.iter().flat_map(|p| data(None, p)).collect();
        let expected: Vec<u8> = payloads.concat();
        for cut in [1, 2, 3, 4, 5, 6, 7, 301, 306, 1000, 1500] {
            let frames: Vec<Vec<u8>> = wire.chunks(cut).map(<[u8]>::to_vec).collect();
            let (got, end) = collect(stream(frames, Some(trailers(0, "")))).await;
            assert!(end.is_none(), "cut {cut}");
            assert_eq!(got, expected, "cut {cut}");
        }
    }

    #[tokio::test]
    async fn batches_stay_within_their_bound() {
        let chunk = vec![7u8; 1024];
        let wire: Vec<u8> = (0..3000).flat_map(|_| data(None, &chunk)).collect();
        let frames: Vec<Vec<u8>> = wire.chunks(16 * 1024).map(<[u8]>::to_vec).collect();
        let mut s = stream(frames, Some(trailers(0, "")));
        let mut sizes = Vec::new();
        while let Some(item) = std::future::poll_fn(|cx| s.poll_item(cx)).await {
            match item.unwrap() {
                Item::Bytes(b) => sizes.push(b.len()),
                Item::Failed(_) => panic!("no failure sent"),
            }
        }
        assert_eq!(sizes.iter().sum::<usize>(), 3000 * 1024);
        assert!(sizes.iter().all(|&n| n <= BATCH + SLACK), "{sizes:?}");
        assert!(sizes.len() >= 3000 * 1024 / (BATCH + SLACK), "{sizes:?}");
    }

    #[tokio::test]
    async fn an_error_trailer_follows_the_bytes_before_it() {
        let wire = data(None, b"abc");
        let (got, end) = collect(stream(vec![wire], Some(trailers(14, "node down")))).await;
        assert_eq!(got, b"abc");
        let status = end.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "node down");
    }

    #[tokio::test]
    async fn a_missing_trailer_is_an_error_and_a_cut_message_too() {
        let (_, end) = collect(stream(vec![data(None, b"abc")], None)).await;
        assert_eq!(end.unwrap().unwrap_err().code(), tonic::Code::Unknown);
        let mut cut = data(None, b"abcdef");
        cut.truncate(cut.len() - 2);
        let (got, end) = collect(stream(vec![cut], Some(trailers(0, "")))).await;
        assert!(got.is_empty());
        let status = end.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
    }

    #[tokio::test]
    async fn metadata_with_an_error_ends_the_stream_after_the_bytes_before_it() {
        let failed = common::Metadata {
            hostname: "cp-2".into(),
            error: "etcd is not running".into(),
            ..Default::default()
        };
        let fine = common::Metadata {
            hostname: "cp-2".into(),
            ..Default::default()
        };
        let mut wire = data(Some(fine), b"one");
        wire.extend(data(Some(failed), b"two"));
        wire.extend(data(None, b"three"));
        let (got, end) = collect(stream(vec![wire], Some(trailers(0, "")))).await;
        assert_eq!(got, b"one");
        assert_eq!(end.unwrap().unwrap().error, "etcd is not running");
    }

    #[test]
    fn the_last_bytes_field_wins_and_unknown_fields_are_skipped() {
        // field 2 "ab", field 7 varint 150, field 9 fixed32, field 2 "xyz"
        let message = [
            0x12, 2, b'a', b'b', 0x38, 0x96, 0x01, 0x4d, 1, 2, 3, 4, 0x12, 3, b'x', b'y', b'z',
        ];
        let fields = DataFields::parse(&message).unwrap();
        assert_eq!(fields.bytes, b"xyz");
        assert!(fields.metadata.is_none());
        assert_eq!(
            DataFields::parse(&[0x12, 5, b'a']).err().unwrap().code(),
            tonic::Code::Internal
        );
        assert_eq!(
            DataFields::parse(&[0x0b]).err().unwrap().code(),
            tonic::Code::Internal,
            "groups are not part of common.Data"
        );
    }

    #[tokio::test]
    async fn a_compressed_message_is_refused() {
        let mut wire = data(None, b"abc");
        wire[0] = 1;
        let (_, end) = collect(stream(vec![wire], Some(trailers(0, "")))).await;
        assert_eq!(end.unwrap().unwrap_err().code(), tonic::Code::Internal);
    }

    #[tokio::test]
    async fn a_trailers_only_error_fails_the_call() {
        let mut response = http::Response::new(http_body_util::Empty::<Bytes>::new());
        *response.headers_mut() = trailers(7, "not allowed");
        let status = DataStream::new(response).err().unwrap();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
    }
}
