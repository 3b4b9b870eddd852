//! talosconfig: the client configuration file shared with talosctl.
//!
//! - [`file`](mod@file): the serde mirror of the YAML ([`TalosConfig`], [`Context`]),
//!   which keeps keys it does not know so a round trip loses nothing;
//! - [`loader`]: where the file is found, reading and atomic writing, merging,
//!   and resolving a context (with overrides) into a [`ResolvedContext`] that a
//!   [`Client`](crate::Client) connects with.

pub mod file;
pub mod loader;

pub use file::{Context, TalosConfig};
pub use loader::{
    ConfigError, ConfigPath, EndpointAddr, Overrides, Rename, ResolvedContext, default_paths,
    default_paths_with, normalize_endpoint,
};
