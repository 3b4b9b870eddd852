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
