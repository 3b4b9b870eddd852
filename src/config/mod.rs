//! talosconfig: the client configuration file shared with talosctl.
//!
//! - the serde mirror of the YAML ([`TalosConfig`], [`Context`]), which keeps
//!   keys it does not know so a round trip loses nothing;
//! - where the file is found ([`default_paths`]), reading and atomic writing,
//!   merging, and resolving a context (with [`Overrides`]) into a
//!   [`ResolvedContext`] that a [`Client`](crate::Client) connects with.

mod file;
mod loader;

pub use file::{Context, TalosConfig};
pub use loader::{
    ConfigError, ConfigPath, DEFAULT_API_PORT, EndpointAddr, Overrides, Rename, ResolvedContext,
    SERVICE_ACCOUNT_CONFIG, default_paths, default_paths_with, normalize_endpoint,
};
