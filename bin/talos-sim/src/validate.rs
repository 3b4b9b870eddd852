//! The v1alpha1 document's Validate, as a node runs it on every apply
//! (pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go, called
//! through pkg/machinery/config/container/container.go, which prefixes
//! `v1alpha1.Config: `): the checks of the sections the simulator's users
//! write, with upstream's messages, collected as go-multierror lists them.
//! Checks of sections a simulated node has no use for (network devices,
//! disks, disk encryption, kubelet, labels) are not simulated.

use serde_norway::Value;
use tonic::Status;

use super::TalosVersion;
use super::diff::MachineConfig;

/// go-multierror's list format (`ListFormatFunc`).
pub(crate) fn multierror(errors: &[String]) -> String {
    if errors.len() == 1 {
        return format!("1 error occurred:\n\t* {}\n\n", errors[0]);
    }
    let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
    format!(
        "{} errors occurred:\n\t{}\n\n",
        errors.len(),
        points.join("\n\t")
    )
}

/// The machine type a `machine.type` string parses as
/// (pkg/machinery/config/machine/machine.go, ParseType): empty and `join`
/// mean worker; anything else unknown is unknown.
pub(crate) fn parse_type(raw: &str) -> Option<&'static str> {
    match raw {
        "init" => Some("init"),
        "controlplane" => Some("controlplane"),
        "worker" | "join" | "" => Some("worker"),
        _ => None,
    }
}

fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .filter(|v| !v.is_null())
}

fn text<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    at(value, path).and_then(Value::as_str).unwrap_or_default()
}

fn flag(value: &Value, path: &[&str]) -> bool {
    at(value, path).and_then(Value::as_bool).unwrap_or(false)
}

fn non_empty_list(value: &Value, path: &[&str]) -> bool {
    at(value, path)
        .and_then(Value::as_sequence)
        .is_some_and(|s| !s.is_empty())
}

fn non_empty_map(value: &Value, path: &[&str]) -> bool {
    at(value, path)
        .and_then(Value::as_mapping)
        .is_some_and(|m| !m.is_empty())
}

fn strings(value: &Value, path: &[&str]) -> Vec<String> {
    at(value, path)
        .and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs the container's Validate: the v1alpha1 document's, then the other
/// documents' (see [`crate::documents`]); returns the warnings, or
/// InvalidArgument with upstream's text.
pub(crate) fn check(config: &MachineConfig, version: TalosVersion) -> Result<Vec<String>, Status> {
    let (mut warnings, mut errors) = validate(&config.v1alpha1);
    if version.at_least_1_14() {
        // 1.14's Validate starts by warning about sections it deprecated.
        let v1 = &config.v1alpha1;
        let mut deprecated = Vec::new();
        if non_empty_list(v1, &["machine", "files"]) {
            deprecated.push(
                ".machine.files is deprecated; use dedicated configuration documents instead",
            );
        }
        if non_empty_map(v1, &["machine", "baseRuntimeSpecOverrides"]) {
            deprecated.push(".machine.baseRuntimeSpecOverrides is deprecated; use a CRIBaseRuntimeSpecConfig document instead");
        }
        warnings.splice(0..0, deprecated.into_iter().map(String::from));
    }
    // 1.14 checks the Kubernetes images last in Validate
    // (ValidateKubernetesVersions); 1.13.9 in RuntimeValidate.
    if version.at_least_1_14() && at(&config.v1alpha1, &["machine"]).is_some() {
        errors.extend(crate::runtime_validate::kubernetes_versions(
            &config.v1alpha1,
            version,
        ));
    }
    let mut outer = Vec::new();
    if !errors.is_empty() {
        outer.push(format!("v1alpha1.Config: {}", multierror(&errors)));
    }
    let (document_warnings, document_errors) = crate::documents::validate(config, version);
    warnings.extend(document_warnings);
    outer.extend(document_errors);
    if outer.is_empty() {
        return Ok(warnings);
    }
    Err(Status::invalid_argument(multierror(&outer)))
}

/// The errors and warnings of the v1alpha1 document `c`, in upstream's order.
fn validate(c: &Value) -> (Vec<String>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut errors = Vec::new();
    let Some(machine) = at(c, &["machine"]) else {
        errors.push("machine instructions are required".to_string());
        return (warnings, errors);
    };
    let raw_type = text(machine, &["type"]);
    let machine_type = parse_type(raw_type);
    let control_plane = matches!(machine_type, Some("init" | "controlplane"));
    validate_cluster(at(c, &["cluster"]), control_plane, &mut errors);

    if flag(machine, &["features", "hostDNS", "forwardKubeDNSToHost"])
        && !flag(machine, &["features", "hostDNS", "enabled"])
    {
        errors.push("feature hostDNS.forwardKubeDNSToHost requires hostDNS.enabled to be true (.machine.features.hostDNS)".into());
    }
    if let Some(t) = machine_type
        && t != raw_type
    {
        warnings.push(format!(
            "use {t:?} instead of {raw_type:?} for machine type"
        ));
    }
    let ca = at(machine, &["ca"]);
    let accepted = non_empty_list(machine, &["acceptedCAs"]);
    if ca.is_none() && !accepted {
        errors.push(
            "issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)"
                .into(),
        );
    }
    let ca_has = |field: &str| ca.is_some_and(|ca| !text(ca, &[field]).is_empty());
    match machine_type {
        Some("init" | "controlplane") => {
            validate_cni(c, &mut warnings, &mut errors);
            if ca.is_none() {
                errors.push("issuing CA is required (.machine.ca)".into());
            } else if !ca_has("key") {
                errors.push(
                    "issuing CA key is required for controlplane nodes (.machine.ca.key)".into(),
                );
            }
        }
        Some(_) => {
            let devices = at(machine, &["network", "interfaces"])
                .and_then(Value::as_sequence)
                .cloned()
                .unwrap_or_default();
            for device in &devices {
                if at(device, &["vip"]).is_some() {
                    errors.push(
                        "virtual (shared) IP is not allowed on non-controlplane nodes".into(),
                    );
                }
                for vlan in at(device, &["vlans"])
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                {
                    if at(vlan, &["vip"]).is_some() {
                        errors.push(
                            "virtual (shared) IP is not allowed on non-controlplane nodes".into(),
                        );
                    }
                }
            }
            if ca.is_some() {
                if ca_has("key") {
                    errors.push("issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)".into());
                }
                if !ca_has("crt") && !accepted {
                    errors.push("trusted CA certificates are required on non-controlplane nodes (.machine.ca.crt, .machine.acceptedCAs)".into());
                }
            }
            if !text(c, &["cluster", "ca", "key"]).is_empty() {
                errors.push("issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)".into());
            }
        }
        None => errors.push(format!("unknown machine type {raw_type:?}")),
    }

    // System extensions: a duplicate image is refused, and any at all is
    // warned about (RuntimeValidate warns a second time).
    let mut images: Vec<&str> = Vec::new();
    for extension in at(machine, &["install", "extensions"])
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let image = text(extension, &["image"]);
        if images.contains(&image) {
            errors.push(format!("duplicate system extension {image:?}"));
        } else {
            images.push(image);
        }
    }
    if !images.is_empty() {
        warnings.push(crate::runtime_validate::EXTENSIONS_DEPRECATED.to_string());
    }

    if flag(
        machine,
        &["features", "kubernetesTalosAPIAccess", "enabled"],
    ) {
        if !control_plane {
            errors.push(
                "feature Kubernetes Talos API Access can only be enabled on control plane machines"
                    .into(),
            );
        }
        for role in strings(
            machine,
            &["features", "kubernetesTalosAPIAccess", "allowedRoles"],
        ) {
            if !ROLES.contains(&role.as_str()) {
                errors.push(format!(
                    "invalid role {role:?} in allowed roles for Kubernetes Talos API Access"
                ));
            }
        }
    }
    if c.get("persist").and_then(Value::as_bool) == Some(false) {
        errors.push(".persist should be enabled".into());
    }
    for (section, name) in [("config", "config"), ("mirrors", "mirrors")] {
        if let Some(entries) = at(machine, &["registries", section]).and_then(Value::as_mapping) {
            for (key, value) in entries {
                if value.is_null() {
                    errors.push(format!(
                        "registries.{name}[{:?}] is null",
                        key.as_str().unwrap_or_default()
                    ));
                }
            }
        }
    }
    (warnings, errors)
}

/// Talos API roles (pkg/machinery/role/role.go).
const ROLES: &[&str] = &[
    "os:admin",
    "os:operator",
    "os:reader",
    "os:etcd:backup",
    "os:impersonator",
];

/// ClusterConfig.Validate: a missing section or endpoint ends the check.
fn validate_cluster(cluster: Option<&Value>, control_plane: bool, errors: &mut Vec<String>) {
    let Some(cluster) = cluster else {
        errors.push("cluster instructions are required".into());
        return;
    };
    let Some(endpoint) = at(cluster, &["controlPlane", "endpoint"]) else {
        errors.push("cluster controlplane endpoint is required".into());
        return;
    };
    if let Err(e) = validate_endpoint_uri(endpoint.as_str().unwrap_or_default()) {
        errors.push(format!("invalid controlplane endpoint: {e}"));
    }
    let domain = text(cluster, &["network", "dnsDomain"]);
    if !domain.is_empty() && !is_valid_dns_name(domain) {
        errors.push(format!("{domain:?} is not a valid DNS name"));
    }
    if let Some(ecp) = at(cluster, &["externalCloudProvider"])
        && !flag(ecp, &["enabled"])
        && non_empty_list(ecp, &["manifests"])
    {
        errors.push("external cloud provider is disabled, but manifests are provided".into());
    }
    if let Some(etcd) = at(cluster, &["etcd"]) {
        if control_plane {
            if at(etcd, &["ca"]).is_none() {
                errors.push("key/cert combination should not be empty".into());
            }
            if !text(etcd, &["subnet"]).is_empty() && non_empty_list(etcd, &["advertisedSubnets"]) {
                errors.push("etcd subnet can't be set when advertised subnets are set".into());
            }
        } else {
            errors.push("etcd config is only allowed on control plane machines".into());
        }
    }
    if !control_plane && !text(cluster, &["ca", "key"]).is_empty() {
        errors.push("cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)".into());
    }
    let mut names = Vec::new();
    for manifest in at(cluster, &["inlineManifests"])
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let name = text(manifest, &["name"]);
        if name.trim().is_empty() {
            errors.push("inline manifest name can't be empty".into());
        }
        if names.contains(&name) {
            errors.push(format!("inline manifest name {name:?} is duplicate"));
        }
        names.push(name);
    }
    if flag(cluster, &["discovery", "enabled"])
        && !flag(cluster, &["discovery", "registries", "service", "disabled"])
    {
        if text(cluster, &["id"]).is_empty() {
            errors.push("cluster discovery service requires .cluster.id".into());
        }
        if text(cluster, &["secret"]).is_empty() {
            errors.push("cluster discovery service requires .cluster.secret".into());
        }
    }
}

/// ValidateCNI for a control plane; the CNI defaults to flannel.
fn validate_cni(c: &Value, warnings: &mut Vec<String>, errors: &mut Vec<String>) {
    let Some(cni) = at(c, &["cluster", "network", "cni"]) else {
        return;
    };
    let name = text(cni, &["name"]);
    let urls = non_empty_list(cni, &["urls"]);
    let extra_args = non_empty_map(cni, &["flannel", "extraArgs"]);
    let policies = flag(cni, &["flannel", "kubeNetworkPoliciesEnabled"]);
    match name {
        "flannel" => {
            if urls {
                errors.push(format!("\"urls\" field should be empty for {name:?} CNI"));
            }
        }
        "none" | "custom" => {
            if name == "none" && urls {
                errors.push(format!("\"urls\" field should be empty for {name:?} CNI"));
            }
            if name == "custom" && !urls {
                warnings.push(format!(
                    "\"urls\" field should not be empty for {name:?} CNI"
                ));
            }
            if extra_args {
                errors.push(format!(
                    "\"flanneldExtraArgs\" field should be empty for {name:?} CNI"
                ));
            }
            if policies {
                errors.push(format!(
                    "\"flannelKubeNetworkPoliciesEnabled\" should not be enabled for {name:?} CNI"
                ));
            }
            if name == "custom" {
                for url in strings(cni, &["urls"]) {
                    if let Err(e) = validate_endpoint_uri(&url) {
                        errors.push(e);
                    }
                }
            }
        }
        _ => {
            errors.push("cni name should be one of [\"flannel\", \"custom\", \"none\"]".to_string())
        }
    }
}

/// siderolabs/net ValidateEndpointURI over Go's url.Parse, for the
/// shapes an endpoint takes (`scheme://host[:port][/path]`, a bare word).
fn validate_endpoint_uri(endpoint: &str) -> Result<(), String> {
    let host = match endpoint.split_once("://") {
        Some((scheme, rest))
            if scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            authority.rsplit_once('@').map_or(authority, |(_, h)| h)
        }
        // Without `//` Go's parser finds no host.
        _ => "",
    };
    if host.matches(':').count() > 2 && (!host.contains('[') || !host.contains(']')) {
        return Err("IPv6 addresses MUST be enclosed by square brackets".into());
    }
    let (hostname, port) = split_host_port(host);
    if hostname.is_empty() {
        return Err("hostname must not be blank".into());
    }
    if !port.is_empty() {
        let port: i64 = port
            .parse()
            .map_err(|_| "port number must be numeric".to_string())?;
        if !(1..=65535).contains(&port) {
            return Err("port number must be between 1 and 65535".into());
        }
    }
    Ok(())
}

/// url.URL's Hostname and Port.
fn split_host_port(host: &str) -> (&str, &str) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((name, tail)) => (name, tail.strip_prefix(':').unwrap_or_default()),
            None => (rest, ""),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, port),
        _ => (host, ""),
    }
}

/// isValidDNSName of v1alpha1_validation.go: labels of letters, digits,
/// `_` and `-` (not leading `-`), at most 63 characters, dot-separated,
/// with an optional trailing `.` or `_`.
fn is_valid_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() - name.matches('.').count() > 255 {
        return false;
    }
    let body = name
        .strip_suffix('.')
        .or_else(|| name.strip_suffix('_'))
        .unwrap_or(name);
    let label_ok = |label: &str| {
        let mut chars = label.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
            && label.len() <= 63
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    // The trailing `_` may also belong to the last label.
    body.split('.').all(label_ok) || name.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_as_upstream_checks_them() {
        assert_eq!(validate_endpoint_uri("https://10.0.0.1:6443"), Ok(()));
        assert_eq!(validate_endpoint_uri("https://[::1]:6443/x"), Ok(()));
        assert_eq!(validate_endpoint_uri("https://cp.example"), Ok(()));
        assert_eq!(
            validate_endpoint_uri("cp.example").unwrap_err(),
            "hostname must not be blank"
        );
        assert_eq!(
            validate_endpoint_uri("https://cp:70000").unwrap_err(),
            "port number must be between 1 and 65535"
        );
        assert_eq!(
            validate_endpoint_uri("https://fd00::1:6443").unwrap_err(),
            "IPv6 addresses MUST be enclosed by square brackets"
        );
    }

    #[test]
    fn dns_names() {
        assert!(is_valid_dns_name("cluster.local"));
        assert!(is_valid_dns_name("cluster.local."));
        assert!(!is_valid_dns_name("-bad.local"));
        assert!(!is_valid_dns_name("bad..local"));
        assert!(!is_valid_dns_name("a b"));
    }

    #[test]
    fn errors_are_listed_as_go_multierror_lists_them() {
        assert_eq!(multierror(&["a".into()]), "1 error occurred:\n\t* a\n\n");
        assert_eq!(
            multierror(&["a".into(), "b".into()]),
            "2 errors occurred:\n\t* a\n\t* b\n\n"
        );
    }
}
