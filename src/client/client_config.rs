//! A new client identity issued by a node (MachineService
//! `GenerateClientConfiguration`, what `talosctl config new` calls): a
//! certificate signed by the cluster's OS CA with the roles asked for.

use std::time::Duration;

use super::{Client, Idempotency, Result, Scope, machine_stub};
use crate::api::machine;

/// What a node generated: the OS CA, the new certificate and key (PEM),
/// and a talosconfig holding them (one context, no endpoints).
#[derive(Clone)]
#[non_exhaustive]
pub struct GeneratedConfig {
    /// The OS CA certificate, PEM.
    pub ca_pem: Vec<u8>,
    /// The client certificate, PEM.
    pub crt_pem: Vec<u8>,
    key_pem: Vec<u8>,
    talosconfig: Vec<u8>,
}

impl std::fmt::Debug for GeneratedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedConfig")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("crt_pem", &format_args!("{} bytes", self.crt_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .field("talosconfig", &format_args!("<redacted>"))
            .finish()
    }
}

impl GeneratedConfig {
    /// The private key, PEM. Never log it.
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    /// The talosconfig the node wrote (YAML, holding the key). Never log it.
    pub fn talosconfig_yaml(&self) -> &[u8] {
        &self.talosconfig
    }
}

impl<S: Scope> Client<S> {
    /// Has the node issue a client certificate with `roles` (organisation
    /// values such as `os:reader`, `os:etcd:backup`) valid for `ttl`, and a
    /// talosconfig for it. Talos serves this to `os:admin` only, on
    /// control-plane nodes; it refuses a TTL of zero. Not retried.
    pub async fn generate_client_configuration(
        &self,
        roles: &[String],
        ttl: Duration,
    ) -> Result<S::Output<GeneratedConfig>> {
        let request = machine::GenerateClientConfigurationRequest {
            roles: roles.to_vec(),
            crt_ttl: prost_types::Duration::try_from(ttl).ok(),
        };
        self.unary(
            Idempotency::Mutation,
            move |t| {
                let request = request.clone();
                async move { machine_stub(t).generate_client_configuration(request).await }
            },
            |m: machine::GenerateClientConfiguration| {
                Ok(GeneratedConfig {
                    ca_pem: m.ca,
                    crt_pem: m.crt,
                    key_pem: m.key,
                    talosconfig: m.talosconfig,
                })
            },
        )
        .await
    }
}
