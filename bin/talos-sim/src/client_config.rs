//! MachineService.GenerateClientConfiguration as machined answers it
//! (internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go at
//! v1.13.9): on a control-plane node only, a positive TTL required, a client
//! certificate issued by the OS CA of the node's running configuration
//! (`machine.ca`) with the requested roles as its organisation values
//! (pkg/machinery/config/generate/secrets/ca.go, NewAdminCertificateAndKey:
//! valid from now for the TTL, digital signature, client auth only), and a
//! talosconfig holding it whose one context is named after the cluster
//! (`ROLE@CLUSTER` when exactly one role is asked for) with no endpoints.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use time::OffsetDateTime;
use tonic::Status;

use crate::api::machine;
use crate::node::Node;
use crate::pki::{Ca, LeafSpec};
use talos_client::config::{Context, TalosConfig};

/// The API name machined's control-plane check uses in its errors.
const API: &str = "generate client configuration";

/// The answer to `request` on `node`.
pub(crate) fn generate(
    node: &Node,
    request: machine::GenerateClientConfigurationRequest,
) -> Result<machine::GenerateClientConfigurationResponse, Status> {
    node.check_controlplane(API)?;
    let ttl = request
        .crt_ttl
        .and_then(|d| std::time::Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Status::invalid_argument("crt_ttl should be positive"))?;
    let roles = parse_roles(&request.roles);
    let config = node.active_config();
    let (ca, cluster) = ca_and_cluster(&config)?;
    let now = OffsetDateTime::now_utc();
    let organizations: Vec<&str> = roles.iter().map(String::as_str).collect();
    let spec = LeafSpec::client(&organizations).valid(now, now + ttl);
    let issued = ca
        .issue(&spec)
        .map_err(|e| Status::internal(format!("client certificate: {e}")))?;
    let name = match roles.as_slice() {
        [one] => format!("{}@{cluster}", one.trim_start_matches("os:")),
        _ => cluster,
    };
    let context = Context::new(
        Vec::new(),
        ca.cert_pem.as_bytes(),
        issued.cert_pem.as_bytes(),
        issued.key_pem.as_bytes(),
    );
    let talosconfig = TalosConfig::with_context(name, context).to_yaml();
    Ok(machine::GenerateClientConfigurationResponse {
        messages: vec![machine::GenerateClientConfiguration {
            metadata: None,
            ca: ca.cert_pem.clone().into_bytes(),
            crt: issued.cert_pem.into_bytes(),
            key: issued.key_pem.into_bytes(),
            talosconfig: talosconfig.into_bytes(),
        }],
    })
}

/// role.Parse then Strings: trimmed, empty values dropped, unknown roles
/// kept, each once, sorted.
fn parse_roles(given: &[String]) -> Vec<String> {
    let mut roles: Vec<String> = given
        .iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect();
    roles.sort();
    roles.dedup();
    roles
}

/// The OS CA (`machine.ca`) and cluster name (`cluster.clusterName`) of a
/// machine configuration.
fn ca_and_cluster(config: &str) -> Result<(Ca, String), Status> {
    let field = crate::kubeconfig::v1alpha1_fields(config)?;
    let pem = |path: &[&str]| -> Result<String, Status> {
        let bytes = BASE64
            .decode(field(path)?.trim())
            .map_err(|e| Status::internal(format!("{}: {e}", path.join("."))))?;
        String::from_utf8(bytes)
            .map_err(|_| Status::internal(format!("{} is not PEM", path.join("."))))
    };
    let ca = Ca::load(
        &pem(&["machine", "ca", "crt"])?,
        &pem(&["machine", "ca", "key"])?,
    )
    .map_err(|e| Status::internal(format!("machine.ca: {e}")))?;
    Ok((ca, field(&["cluster", "clusterName"])?))
}

#[cfg(test)]
mod tests {
    use super::parse_roles;

    #[test]
    fn roles_are_parsed_as_upstream_parses_them() {
        let given = [" os:reader", "", "os:admin", "os:reader", "custom:thing"].map(String::from);
        assert_eq!(
            parse_roles(&given),
            ["custom:thing", "os:admin", "os:reader"]
        );
    }
}
