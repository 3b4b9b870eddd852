//! The talosconfig YAML, mirrored field by field from upstream's
//! `pkg/machinery/client/config/config.go`.
//!
//! Keys this crate does not model are kept in `extra` maps and written back,
//! so reading and saving a file written by a newer talosctl loses nothing.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_norway::Mapping;

/// A whole talosconfig file.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TalosConfig {
    /// Name of the current context.
    #[serde(default)]
    pub context: String,
    /// All contexts by name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub contexts: BTreeMap<String, Context>,
    /// Top-level keys not modelled here, preserved verbatim.
    #[serde(flatten)]
    pub extra: Mapping,
}

/// One context: where to connect and with which identity.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Context {
    /// Deprecated single endpoint; folded into `endpoints` when read.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// apid addresses to connect to (`host`, `host:port` or `https://host[:port]`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub endpoints: Vec<String>,
    /// Default target nodes for calls.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub nodes: Vec<String>,
    /// Base64 (standard alphabet) of the CA certificate PEM.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca: String,
    /// Base64 of the client certificate PEM.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub crt: String,
    /// Base64 of the client private key PEM.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Alternative authentication (basic, siderov1), kept as written.
    #[serde(default, skip_serializing_if = "Mapping::is_empty")]
    pub auth: Mapping,
    /// Omni cluster name, kept as written.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// Context keys not modelled here, preserved verbatim.
    #[serde(flatten)]
    pub extra: Mapping,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl fmt::Debug for TalosConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosConfig")
            .field("context", &self.context)
            .field("contexts", &self.contexts)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("endpoints", &self.endpoints)
            .field("nodes", &self.nodes)
            .field("ca", &format_args!("{} chars", self.ca.len()))
            .field("crt", &format_args!("{} chars", self.crt.len()))
            .field("key", &format_args!("<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Builds a context from endpoints and PEM material (encoded as base64).
    pub fn new(endpoints: Vec<String>, ca_pem: &[u8], crt_pem: &[u8], key_pem: &[u8]) -> Context {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        Context {
            endpoints,
            ca: b64.encode(ca_pem),
            crt: b64.encode(crt_pem),
            key: b64.encode(key_pem),
            ..Context::default()
        }
    }

    /// Moves the deprecated `target` into `endpoints`, as upstream does on read.
    pub(crate) fn upgrade(&mut self) {
        if !self.target.is_empty() {
            let target = std::mem::take(&mut self.target);
            self.endpoints.push(target);
        }
    }
}

impl TalosConfig {
    /// A configuration with one context, made current.
    pub fn with_context(name: impl Into<String>, context: Context) -> TalosConfig {
        let name = name.into();
        TalosConfig {
            context: name.clone(),
            contexts: BTreeMap::from([(name, context)]),
            extra: Mapping::new(),
        }
    }
}
