//! Validate of the documents next to the v1alpha1 one, as the container
//! runs it after the v1alpha1 document's (pkg/machinery/config/container/
//! container.go at v1.13.9, container/validate.go at v1.14.0): each
//! document's own checks, prefixed by its id (`Kind` or `Kind/name`), then
//! its conflicts with the v1alpha1 document, then (1.14) the checks of the
//! whole container. Simulated for the kinds the simulator's users write:
//! Layer2VIPConfig and HCloudVIPConfig (pkg/machinery/config/types/network)
//! and KubeServiceAccountConfig (types/k8s/service_account.go, 1.14).

use serde_norway::Value;

use super::TalosVersion;
use super::diff::MachineConfig;

/// Kinds 1.14 allows on control-plane machines only (the documents of
/// pkg/machinery/config/types/k8s marked ControlplaneOnlyDocument).
const CONTROL_PLANE_ONLY: &[&str] = &[
    "KubeAPIServerConfig",
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeEtcdEncryptionConfig",
    "KubeFlannelCNIConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeTalosAPIAccessConfig",
];

fn text<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The warnings and the errors (each one entry of the container's
/// go-multierror list) of the documents other than v1alpha1.
pub(crate) fn validate(
    config: &MachineConfig,
    version: TalosVersion,
) -> (Vec<String>, Vec<String>) {
    let mut errors = Vec::new();
    for document in &config.documents {
        let kind = text(document, &["kind"]);
        let found = match kind {
            "Layer2VIPConfig" => vip(document, false),
            "HCloudVIPConfig" => vip(document, true),
            "KubeServiceAccountConfig" => service_account(document),
            _ => Vec::new(),
        };
        if !found.is_empty() {
            let name = text(document, &["name"]);
            let id = match kind {
                "KubeServiceAccountConfig" => kind.to_string(),
                _ => format!("{kind}/{name}"),
            };
            // errors.Join: one message per line.
            errors.push(format!("{id}: {}", found.join("\n")));
        }
    }
    let v1 = &config.v1alpha1;
    for document in &config.documents {
        let service_account = v1
            .get("cluster")
            .and_then(|c| c.get("serviceAccount"))
            .is_some_and(|s| !s.is_null());
        if text(document, &["kind"]) == "KubeServiceAccountConfig" && service_account {
            errors.push(
                "service account is already set in v1alpha1 config (.cluster.serviceAccount)"
                    .into(),
            );
        }
    }
    let control_plane = matches!(
        super::validate::parse_type(config.machine_type()),
        Some("init" | "controlplane")
    );
    if version.at_least_1_14() && !control_plane {
        let mut kinds: Vec<&str> = config
            .documents
            .iter()
            .map(|d| text(d, &["kind"]))
            .filter(|k| CONTROL_PLANE_ONLY.contains(k))
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        if !kinds.is_empty() {
            errors.push(format!(
                "the following document kinds are only allowed on control plane machines: [{}]",
                kinds.join(" ")
            ));
        }
    }
    (Vec::new(), errors)
}

/// Layer2VIPConfig's and HCloudVIPConfig's Validate.
fn vip(document: &Value, hcloud: bool) -> Vec<String> {
    let mut errors = Vec::new();
    let name = text(document, &["name"]);
    if name.is_empty() {
        errors.push("name must be specified".to_string());
    } else if let Err(e) = parse_addr(name) {
        errors.push(format!("name must be a valid IP address: {e}"));
    }
    if text(document, &["link"]).is_empty() {
        errors.push("link must be specified".into());
    }
    if hcloud && text(document, &["apiToken"]).is_empty() {
        errors.push("apiToken must be specified".into());
    }
    errors
}

/// KubeServiceAccountConfig's Validate: the issuer's key and URL.
fn service_account(document: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let key = text(document, &["issuer", "privateKey"]);
    if key.is_empty() {
        errors.push("service issuer private key is required".to_string());
    } else if let Err(e) = private_key(key) {
        errors.push(format!("service issuer private key is invalid: {e}"));
    }
    if text(document, &["issuer", "issuerURL"]).is_empty() {
        errors.push("service issuer URL is required".into());
    }
    errors
}

/// The PEM block check of siderolabs/crypto's PEMEncodedKey.GetKey: a PEM
/// block of one of the private key types it reads. The key inside is not
/// parsed.
fn private_key(pem: &str) -> Result<(), String> {
    let label = pem
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("-----BEGIN ")?.strip_suffix("-----"));
    let Some(label) = label else {
        return Err("failed to parse PEM block".into());
    };
    if !pem.contains(&format!("-----END {label}-----")) {
        return Err("failed to parse PEM block".into());
    }
    match label {
        "RSA PRIVATE KEY" | "EC PRIVATE KEY" | "ED25519 PRIVATE KEY" | "PRIVATE KEY" => Ok(()),
        other => Err(format!("unsupported key type {other:?}")),
    }
}

/// Go's netip.ParseAddr errors for what is no address: the first `.` or
/// `:` decides IPv4 or IPv6; without either it is no address at all.
fn parse_addr(s: &str) -> Result<(), String> {
    let fail = |msg: &str, at: Option<&str>| match at {
        Some(at) => format!("ParseAddr({s:?}): {msg} (at {at:?})"),
        None => format!("ParseAddr({s:?}): {msg}"),
    };
    match s.bytes().position(|b| matches!(b, b'.' | b':' | b'%')) {
        None => Err(fail("unable to parse IP", None)),
        Some(i) if s.as_bytes()[i] == b'%' => Err(fail("missing IPv6 address", None)),
        Some(i) if s.as_bytes()[i] == b':' => s
            .parse::<std::net::Ipv6Addr>()
            .map(drop)
            .map_err(|_| fail("unable to parse IP", None)),
        Some(_) => ipv4(s).map_err(|(msg, at)| fail(msg, at)),
    }
}

/// netip's IPv4 field parser: its errors, in the order it finds them.
fn ipv4(s: &str) -> Result<(), (&'static str, Option<&str>)> {
    let bytes = s.as_bytes();
    let (mut value, mut digits, mut fields) = (0u32, 0, 0);
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'0'..=b'9' => {
                if digits == 1 && value == 0 {
                    return Err(("IPv4 field has octet with leading zero", None));
                }
                value = value * 10 + u32::from(b - b'0');
                digits += 1;
                if value > 255 {
                    return Err(("IPv4 field has value >255", None));
                }
            }
            b'.' => {
                if i == 0 || i == bytes.len() - 1 || bytes[i - 1] == b'.' {
                    return Err(("IPv4 field must have at least one digit", Some(&s[i..])));
                }
                if fields == 3 {
                    return Err(("IPv4 address too long", None));
                }
                fields += 1;
                value = 0;
                digits = 0;
            }
            _ => return Err(("unexpected character", Some(&s[i..]))),
        }
    }
    if fields < 3 {
        return Err(("IPv4 address too short", None));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_fail_as_netip_parse_addr_does() {
        assert_eq!(parse_addr("10.0.0.50"), Ok(()));
        assert_eq!(parse_addr("fd00::5"), Ok(()));
        assert_eq!(
            parse_addr("vip").unwrap_err(),
            "ParseAddr(\"vip\"): unable to parse IP"
        );
        assert_eq!(
            parse_addr("10.0.0").unwrap_err(),
            "ParseAddr(\"10.0.0\"): IPv4 address too short"
        );
        assert_eq!(
            parse_addr("10.0.0.256").unwrap_err(),
            "ParseAddr(\"10.0.0.256\"): IPv4 field has value >255"
        );
        assert_eq!(
            parse_addr("10..0.1").unwrap_err(),
            "ParseAddr(\"10..0.1\"): IPv4 field must have at least one digit (at \".0.1\")"
        );
        assert_eq!(
            parse_addr("10.0.0.x").unwrap_err(),
            "ParseAddr(\"10.0.0.x\"): unexpected character (at \"x\")"
        );
    }

    #[test]
    fn private_keys_need_a_pem_block_of_a_key_type() {
        assert_eq!(
            private_key("-----BEGIN PRIVATE KEY-----\nMC4=\n-----END PRIVATE KEY-----\n"),
            Ok(())
        );
        assert_eq!(
            private_key("not a key").unwrap_err(),
            "failed to parse PEM block"
        );
        assert_eq!(
            private_key("-----BEGIN CERTIFICATE-----\nMC4=\n-----END CERTIFICATE-----\n")
                .unwrap_err(),
            "unsupported key type \"CERTIFICATE\""
        );
    }
}
