//! # talos-client
//!
//! A typed, async client for the [Talos Linux](https://www.talos.dev) machine
//! API: gRPC over mutual TLS (tonic + prost over rustls), wire-compatible with
//! upstream Talos, with no talosctl and no Go in the path.
//!
//! ```no_run
//! use talos_client::{Client, config::{Overrides, TalosConfig}};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Read the talosconfig talosctl uses ($TALOSCONFIG, ~/.talos/config, ...).
//! let (config, location) = TalosConfig::load(None)?;
//! let context = config.resolve(&Overrides::default(), &location.path)?;
//! let client = Client::from_context(&context)?;
//!
//! // One node: a plain result.
//! for member in client.node("10.0.0.2").etcd_member_list(true).await? {
//!     println!("{} {} learner={}", member.id, member.hostname, member.is_learner);
//! }
//!
//! // Several nodes: one result per node.
//! for reply in client.nodes(["10.0.0.2", "10.0.0.3"]).version().await? {
//!     match reply.result {
//!         Ok(v) => println!("{}: {}", reply.node, v.tag),
//!         Err(e) => eprintln!("{}: {e}", reply.node),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Layers, bottom up: [`api`] (generated client stubs) → [`Client`] (typed
//! calls, node targeting, failover; [`config`], [`tls`]) → [`snapshot`]
//! (verified etcd snapshots). Above them, behind features that are off by
//! default:
//!
//! - `kubernetes`: `kube`, a small Kubernetes API client for the gates
//!   (readyz, TokenRequest, SelfSubjectReview, nodes, Lease renewal);
//! - `ops`: `ops`, the safe composite operations (snapshot, retire, join,
//!   migrate, apply, upgrade, defrag, restore, drill) with their SQLite
//!   journal; turns on `kubernetes`;
//! - `backup`: `backup`, off-host backups (stores, the encrypted pipeline,
//!   recovery kits, retention, restore drills).
//!
//! Nothing climbs back: `ops` uses `backup` and `kube`, never the reverse,
//! and the library knows nothing of its tools. The `talosctl-rs` CLI, the
//! `talos-opsd` daemon (with its API crate, `talos-opsd-api`) and the
//! `talos-sim` simulator are separate packages of the same workspace built
//! on this crate. The manual is `docs/` in the repository.
//!
//! # The generated API
//!
//! [`api`] stays public: it is the escape hatch for calls the typed client
//! does not wrap ([`Client::machine_service`] hands out its stub over the
//! client's connection). It is outside this crate's semantic versioning:
//! its types are what the protos of the pinned Talos release generate, so a
//! minor release that follows a newer Talos may add fields to its structs
//! (plain prost structs: build them with `..Default::default()`) or change
//! them as upstream did. Everything else the crate exports is its own type
//! and follows semver.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod api;
mod atomic;

/// Writes a private file atomically: mode 0600, a temporary file in the
/// same directory, fsync, rename over `path`, fsync of the directory (a
/// missing directory is made 0700). A crash leaves the old file or the new
/// one, never a torn or world-readable one. This is how the crate writes
/// talosconfigs and snapshot sidecars; tools use it for the credentials
/// they write beside them (a kubeconfig, a simulator's keys).
pub fn write_private_file(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    atomic::write_atomic(path, data)
}
#[cfg(feature = "backup")]
pub mod backup;
pub mod client;
pub mod config;
pub mod input;
#[cfg(feature = "kubernetes")]
pub mod kube;
pub mod maintenance;
#[cfg(feature = "ops")]
pub mod ops;
pub mod snapshot;
pub mod text;
#[cfg(any(feature = "ops", feature = "backup"))]
mod tiers;
pub mod tls;

pub use client::{
    Client, ClientBuilder, Error, Many, NodeResult, NodeResults, One, Result, Target,
};

/// The README's Rust examples, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The manual's Rust examples (`docs/`), compiled by `cargo test --doc`;
/// `tests/manual.rs` checks that every page with one is listed here.
#[cfg(doctest)]
#[doc = include_str!("../docs/client.md")]
pub struct ManualClientDoctests;

/// See [`ManualClientDoctests`].
#[cfg(all(doctest, feature = "kubernetes"))]
#[doc = include_str!("../docs/kube.md")]
pub struct ManualKubeDoctests;

/// See [`ManualClientDoctests`].
#[cfg(all(doctest, feature = "backup"))]
#[doc = include_str!("../docs/backups.md")]
pub struct ManualBackupsDoctests;
