//! The generated wire layer: prost messages and tonic client/server stubs for
//! every `.proto` file under `proto/`.
//!
//! This is the escape hatch for calls the typed [`Client`](crate::Client) does
//! not wrap. Module paths follow the protobuf packages: [`machine`],
//! [`common`], [`cluster`], [`google::rpc`], and COSI's [`cosi::resource`]
//! with the Talos resource specs in [`talos::resource::definitions`].
//!
//! Its types follow the Talos protos this release pins, not the crate's
//! semantic versioning (see [the crate docs](crate#the-generated-api)).

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/talos_api.rs"));

/// A prost codec whose buffers start at `INITIAL` bytes and are yielded
/// to HTTP/2 once they hold `YIELD` bytes (tonic's defaults: 8 KiB and
/// 32 KiB). Larger messages grow the buffer as they arrive.
#[doc(hidden)]
#[derive(Debug)]
pub struct BufferedCodec<T, U, const INITIAL: usize, const YIELD: usize>(
    std::marker::PhantomData<(T, U)>,
);

/// The stubs' codec: a 1 KiB first buffer per call instead of tonic's
/// 8 KiB. Talos answers are mostly a few hundred bytes, and a fan-out holds
/// one encode and one decode buffer per node at once.
#[doc(hidden)]
pub type TalosCodec<T, U> = BufferedCodec<T, U, 1024, { 32 * 1024 }>;

impl<T, U, const INITIAL: usize, const YIELD: usize> Default
    for BufferedCodec<T, U, INITIAL, YIELD>
{
    fn default() -> Self {
        BufferedCodec(std::marker::PhantomData)
    }
}

impl<T, U, const INITIAL: usize, const YIELD: usize> tonic::codec::Codec
    for BufferedCodec<T, U, INITIAL, YIELD>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        let buffers = tonic::codec::BufferSettings::new(INITIAL, YIELD);
        tonic_prost::ProstCodec::<T, U>::raw_encoder(buffers)
    }

    fn decoder(&mut self) -> Self::Decoder {
        let buffers = tonic::codec::BufferSettings::new(INITIAL, YIELD);
        tonic_prost::ProstCodec::<T, U>::raw_decoder(buffers)
    }
}

// COSI's resource API (`cosi.resource`, `cosi.resource.meta`) and the Talos
// resource specs read through it (`talos.resource.definitions`).
include!(concat!(env!("OUT_DIR"), "/cosi_api.rs"));
