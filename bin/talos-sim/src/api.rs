//! The simulator's wire layer: the Talos messages of `talos_client::api`,
//! server stubs for the Talos services over those very types, and a client
//! for etcd's v3 API (the members behind each simulated node).

#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub use talos_client::api::{cluster, common, cosi, google, machine, talos};

/// Server stubs for `machine.MachineService` and `cluster.ClusterService`.
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/talos_server.rs"));
}

/// The server stub for `cosi.resource.State`.
pub mod cosi_server {
    include!(concat!(env!("OUT_DIR"), "/cosi_server.rs"));
}

include!(concat!(env!("OUT_DIR"), "/etcd_api.rs"));

/// The server stubs' codec: encoded messages go to HTTP/2 in chunks of up
/// to 256 KiB instead of tonic's 32 KiB. A stream of many small messages
/// (an etcd snapshot in 1 KiB messages) then leaves in large DATA frames
/// where the client allows them, so in few writes; a stream whose source
/// has nothing more for now is sent as it is.
pub type SimCodec<T, U> = talos_client::api::BufferedCodec<T, U, { 8 * 1024 }, { 256 * 1024 }>;
