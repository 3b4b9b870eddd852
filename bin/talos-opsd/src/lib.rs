//! talos-opsd: a long-running helper on an admin host that runs the safe
//! composite operations of `talos_client::ops` (the same code and journal
//! as `talosctl-rs ops --local`), with its own gRPC API on a Unix socket
//! (and optionally TCP with mutual TLS), scheduled verified snapshots with
//! a catalogue and retention, Prometheus metrics and an audit log.

pub mod accept;
pub mod cadence;
pub mod catalogue;
pub mod config;
pub mod daemon;
pub mod h2audit;
pub mod handshakes;
pub mod history;
pub mod input;
pub mod listen;
pub mod logline;
pub mod manager;
pub mod metrics;
pub mod ratelimit;
pub mod recover;
pub mod resume;
pub mod schedule;
pub mod service;
mod settle;
pub mod slots;
mod snapshots;
#[cfg(feature = "test-hooks")]
mod test_hooks;
pub mod track;
mod work;

/// The generated API (`bin/talos-opsd-api/proto/opsd/v1/opsd.proto`), from
/// the API crate that clients share.
pub use talos_opsd_api::proto;
