//! The simulator's wire layer: the Talos messages of `talos_client::api`,
//! server stubs for the Talos services over those very types, and a client
//! for etcd's v3 API (the members behind each simulated node).

#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub use talos_client::api::{cluster, common, google, machine};

/// Server stubs for `machine.MachineService` and `cluster.ClusterService`.
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/talos_server.rs"));
}

include!(concat!(env!("OUT_DIR"), "/etcd_api.rs"));

/// The server stubs' codec: prost, yielding encoded messages to HTTP/2 in
/// chunks of up to 256 KiB instead of tonic's 32 KiB. A stream of many
/// small messages (an etcd snapshot in 1 KiB messages) then leaves in large
/// DATA frames where the client allows them, so in few writes; a stream
/// whose source has nothing more for now is sent as it is, as before.
#[derive(Debug)]
pub struct SimCodec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for SimCodec<T, U> {
    fn default() -> Self {
        SimCodec(std::marker::PhantomData)
    }
}

fn codec_buffers() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(8 * 1024, 256 * 1024)
}

impl<T, U> tonic::codec::Codec for SimCodec<T, U>
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
