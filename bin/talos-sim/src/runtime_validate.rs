//! The checks of a machine configuration that need a running node, as
//! ApplyConfiguration runs them after Validate
//! (internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go):
//! the v1alpha1 document's RuntimeValidate
//! (pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go) and the
//! Kubernetes version check it shares with 1.14's Validate
//! (pkg/machinery/compatibility/kubernetes_version.go, talos113/talos114).
//!
//! What a simulated node has no use for is not simulated: install disk
//! selectors only matter before an install (a simulated node is installed),
//! and the SDBoot warning needs a node booted through systemd-boot.

use serde_norway::Value;
use tonic::Status;

use super::TalosVersion;
use super::diff::MachineConfig;
use super::validate::{multierror, parse_type};

/// The warning for `.machine.install.extensions` (both releases, from
/// Validate and again from RuntimeValidate).
pub(crate) const EXTENSIONS_DEPRECATED: &str = ".machine.install.extensions is deprecated, please see https://docs.siderolabs.com/talos/latest/platform-specific-installations/boot-assets";

/// Runs RuntimeValidate; returns its warnings, or InvalidArgument with
/// upstream's text (`v1alpha1.Config: ` inside go-multierror's list, as the
/// container wraps it in pkg/machinery/config/container).
pub(crate) fn check(config: &MachineConfig, version: TalosVersion) -> Result<Vec<String>, Status> {
    let c = &config.v1alpha1;
    let mut warnings = Vec::new();
    let mut errors = Vec::new();
    if let Some(machine) = c.get("machine").filter(|m| !m.is_null()) {
        let extensions = machine
            .get("install")
            .and_then(|i| i.get("extensions"))
            .and_then(Value::as_sequence)
            .is_some_and(|s| !s.is_empty());
        if extensions {
            warnings.push(EXTENSIONS_DEPRECATED.to_string());
        }
        // 1.14 moved the image checks into Validate.
        if !version.at_least_1_14() {
            errors.extend(kubernetes_versions(c, version));
        }
    }
    if errors.is_empty() {
        return Ok(warnings);
    }
    let inner = format!("v1alpha1.Config: {}", multierror(&errors));
    Err(Status::invalid_argument(multierror(&[inner])))
}

/// The image of a component: the configured one, or the release's default,
/// which always passes the check.
fn image<'a>(c: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(c, |v, key| v.get(key))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The errors of the Kubernetes version check: the kubelet image, and on a
/// control plane the images of kube-apiserver, kube-controller-manager and
/// kube-scheduler, each checked against the Kubernetes versions the running
/// release supports. An absent image is the release's default, which
/// passes.
pub(crate) fn kubernetes_versions(c: &Value, version: TalosVersion) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(machine) = c.get("machine").filter(|m| !m.is_null()) else {
        return errors;
    };
    if let Some(image) = image(machine, &["kubelet", "image"])
        && let Err(e) = image_supported(image, version)
    {
        errors.push(format!("kubelet image is not valid: {e}"));
    }
    let control_plane = matches!(
        parse_type(
            machine
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
        ),
        Some("init" | "controlplane")
    );
    let cluster = c.get("cluster").filter(|v| !v.is_null());
    if let (Some(cluster), true) = (cluster, control_plane) {
        for (name, section) in [
            ("kube-apiserver", "apiServer"),
            ("kube-controller-manager", "controllerManager"),
            ("kube-scheduler", "scheduler"),
        ] {
            if let Some(image) = image(cluster, &[section, "image"])
                && let Err(e) = image_supported(image, version)
            {
                errors.push(format!("{name} image is not valid: {e}"));
            }
        }
    }
    errors
}

/// ValidateKubernetesImageTag: the version after the image's last `:v`
/// (up to a digest) must lie in the release's supported range.
fn image_supported(reference: &str, version: TalosVersion) -> Result<(), String> {
    let Some(at) = reference.rfind(":v") else {
        return Err(format!(
            "failed to parse Kubernetes version from image reference {reference:?}: invalid image reference: {reference:?}"
        ));
    };
    let tag = &reference[at + 2..];
    let tag = tag.split('@').next().unwrap_or_default();
    let k8s = SemVer::parse_tolerant(tag).map_err(|e| {
        format!("failed to parse Kubernetes version from image reference {reference:?}: {e}")
    })?;
    // pkg/machinery/compatibility/talos113 and talos114: [minimum, maximum).
    let (min, max) = match version {
        TalosVersion::V1_13_9 => ((1, 31, 0), (1, 36, 99)),
        TalosVersion::V1_14_0 => ((1, 32, 0), (1, 37, 99)),
    };
    let talos = version.tag().trim_start_matches('v');
    let core = (k8s.major, k8s.minor, k8s.patch);
    if core < min {
        return Err(format!(
            "version of Kubernetes {k8s} is too old to be used with Talos {talos}"
        ));
    }
    if core >= max {
        return Err(format!(
            "version of Kubernetes {k8s} is too new to be used with Talos {talos}"
        ));
    }
    Ok(())
}

/// A semantic version as blang/semver v4 parses and prints it.
#[derive(Debug, PartialEq)]
struct SemVer {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<String>,
    build: Vec<String>,
}

impl std::fmt::Display for SemVer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.pre.is_empty() {
            write!(f, "-{}", self.pre.join("."))?;
        }
        if !self.build.is_empty() {
            write!(f, "+{}", self.build.join("."))?;
        }
        Ok(())
    }
}

fn digits(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

/// Go's strconv.ParseUint error text for what passed the digit check.
fn number(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| match s {
        "" => format!("strconv.ParseUint: parsing {s:?}: invalid syntax"),
        _ => format!("strconv.ParseUint: parsing {s:?}: value out of range"),
    })
}

impl SemVer {
    /// ParseTolerant: surrounding space and a leading `v` dropped, leading
    /// zeros dropped, missing minor and patch read as 0.
    fn parse_tolerant(raw: &str) -> Result<SemVer, String> {
        let s = raw.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts: Vec<String> = s
            .splitn(3, '.')
            .map(|p| {
                if p.len() <= 1 {
                    return p.to_string();
                }
                let trimmed = p.trim_start_matches('0');
                if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
                    trimmed.to_string()
                } else {
                    format!("0{trimmed}")
                }
            })
            .collect();
        if parts.len() < 3 {
            if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
                return Err("Short version cannot contain PreRelease/Build meta data".into());
            }
            parts.resize(3, "0".into());
        }
        SemVer::parse(&parts.join("."))
    }

    /// Parse: strict `MAJOR.MINOR.PATCH[-PRE][+BUILD]`.
    fn parse(s: &str) -> Result<SemVer, String> {
        if s.is_empty() {
            return Err("Version string empty".into());
        }
        let parts: Vec<&str> = s.splitn(3, '.').collect();
        if parts.len() != 3 {
            return Err("No Major.Minor.Patch elements found".into());
        }
        let field = |value: &str, name: &str, title: &str| -> Result<u64, String> {
            if !digits(value) {
                return Err(format!(
                    "Invalid character(s) found in {name} number {value:?}"
                ));
            }
            if value.len() > 1 && value.starts_with('0') {
                return Err(format!(
                    "{title} number must not contain leading zeroes {value:?}"
                ));
            }
            number(value)
        };
        let major = field(parts[0], "major", "Major")?;
        let minor = field(parts[1], "minor", "Minor")?;
        let mut rest = parts[2];
        let mut build = Vec::new();
        if let Some((head, meta)) = rest.split_once('+') {
            build = meta.split('.').map(str::to_string).collect();
            rest = head;
        }
        let mut pre = Vec::new();
        if let Some((head, release)) = rest.split_once('-') {
            pre = release.split('.').map(str::to_string).collect();
            rest = head;
        }
        let patch = field(rest, "patch", "Patch")?;
        for p in &pre {
            check_prerelease(p)?;
        }
        for b in &build {
            if b.is_empty() {
                return Err(format!("Build meta data can not be empty {b:?}"));
            }
            if !b.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
                return Err(format!(
                    "Invalid character(s) found in build meta data {b:?}"
                ));
            }
        }
        Ok(SemVer {
            major,
            minor,
            patch,
            pre,
            build,
        })
    }
}

fn check_prerelease(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("Prerelease is empty".into());
    }
    if digits(p) {
        if p.len() > 1 && p.starts_with('0') {
            return Err(format!(
                "Numeric PreRelease version must not contain leading zeroes {p:?}"
            ));
        }
        number(p)?;
        return Ok(());
    }
    if !p.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
        return Err(format!("Invalid character(s) found in prerelease {p:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_blang_semver_does() {
        let v = SemVer::parse_tolerant("v1.35").unwrap();
        assert_eq!(v.to_string(), "1.35.0");
        assert_eq!(
            SemVer::parse_tolerant("1.36.0-alpha.1")
                .unwrap()
                .to_string(),
            "1.36.0-alpha.1"
        );
        assert_eq!(
            SemVer::parse_tolerant("01.035.00").unwrap().to_string(),
            "1.35.0"
        );
        assert_eq!(
            SemVer::parse_tolerant("1.x.0").unwrap_err(),
            "Invalid character(s) found in minor number \"x\""
        );
        assert_eq!(
            SemVer::parse_tolerant("1.3-rc").unwrap_err(),
            "Short version cannot contain PreRelease/Build meta data"
        );
    }

    #[test]
    fn images_are_checked_against_the_release() {
        let v = TalosVersion::V1_13_9;
        assert_eq!(
            image_supported("registry.k8s.io/kube-apiserver:v1.35.0", v),
            Ok(())
        );
        assert_eq!(
            image_supported("registry.k8s.io/kube-apiserver:v1.37.0", v).unwrap_err(),
            "version of Kubernetes 1.37.0 is too new to be used with Talos 1.13.9"
        );
        assert_eq!(
            image_supported("ghcr.io/siderolabs/kubelet:v1.30.2@sha256:ab", v).unwrap_err(),
            "version of Kubernetes 1.30.2 is too old to be used with Talos 1.13.9"
        );
        assert_eq!(
            image_supported("ghcr.io/siderolabs/kubelet:latest", v).unwrap_err(),
            "failed to parse Kubernetes version from image reference \"ghcr.io/siderolabs/kubelet:latest\": invalid image reference: \"ghcr.io/siderolabs/kubelet:latest\""
        );
        assert_eq!(image_supported("k:v1.37.0", TalosVersion::V1_14_0), Ok(()));
    }
}
