//! The generated wire layer: prost messages and tonic client/server stubs for
//! every `.proto` file under `proto/`.
//!
//! This is the escape hatch for calls the typed [`Client`](crate::Client) does
//! not wrap. Module paths follow the protobuf packages: [`machine`],
//! [`common`], [`cluster`], [`google::rpc`].

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/talos_api.rs"));

/// The stubs' codec: prost, with a 1 KiB first buffer per call instead of
/// tonic's 8 KiB. Talos answers are mostly a few hundred bytes, and a
/// fan-out holds one encode and one decode buffer per node at once; larger
/// messages grow the buffer as they arrive.
#[doc(hidden)]
#[derive(Debug)]
pub struct TalosCodec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for TalosCodec<T, U> {
    fn default() -> Self {
        TalosCodec(std::marker::PhantomData)
    }
}

fn codec_buffers() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(1024, 32 * 1024)
}

impl<T, U> tonic::codec::Codec for TalosCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<T, U>::raw_encoder(codec_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<T, U>::raw_decoder(codec_buffers())
    }
}
