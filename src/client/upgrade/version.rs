//! Talos release tags as semantic versions, and the choice talosctl 1.13.9
//! makes between the two upgrade paths (cmd/talosctl/cmd/talos/upgrade.go
//! and cmd/talosctl/pkg/talos/helpers/checks.go upstream): the new one
//! when every node runs a version in `>1.13.0-alpha.2 <2.0.0`, the legacy
//! call when any node runs a version outside it.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::client::{Error, Failure};

/// A Talos release as a semantic version (`v1.13.9`, `1.14.0-beta.1`),
/// parsed leniently as talosctl parses server versions: a leading `v`,
/// surrounding blanks, leading zeros and missing minor or patch numbers
/// are accepted. Build metadata is kept out of comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TalosVersion {
    /// Major number.
    pub major: u64,
    /// Minor number.
    pub minor: u64,
    /// Patch number.
    pub patch: u64,
    /// Pre-release identifiers (`alpha`, `2`), empty for a release.
    pub pre: Vec<String>,
}

/// A version string that is not a semantic version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a semantic version: {reason}")]
pub struct VersionParseError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for TalosVersion {
    type Err = VersionParseError;

    fn from_str(text: &str) -> Result<TalosVersion, VersionParseError> {
        let fail = |reason| VersionParseError {
            text: text.to_string(),
            reason,
        };
        let s = text.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts: Vec<String> = s.splitn(3, '.').map(strip_zeros).collect();
        if parts.len() < 3 {
            if parts.last().is_some_and(|p| p.contains(['-', '+'])) {
                return Err(fail("a short version cannot carry a pre-release or build"));
            }
            parts.resize(3, "0".to_string());
        }
        let (patch_text, rest) = match parts[2].find(['-', '+']) {
            Some(at) => parts[2].split_at(at),
            None => (parts[2].as_str(), ""),
        };
        let number = |p: &str| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(fail("major, minor and patch must be numbers"));
            }
            if p.len() > 1 && p.starts_with('0') {
                return Err(fail("numbers must not have leading zeros"));
            }
            p.parse::<u64>().map_err(|_| fail("a number is too large"))
        };
        let (major, minor, patch) = (number(&parts[0])?, number(&parts[1])?, number(patch_text)?);
        let pre_text = rest
            .strip_prefix('-')
            .map(|r| r.split('+').next().unwrap_or(""));
        let pre = match pre_text {
            None => Vec::new(),
            Some(p) => {
                let ids: Vec<String> = p.split('.').map(str::to_string).collect();
                for id in &ids {
                    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    {
                        return Err(fail("a pre-release identifier is empty or invalid"));
                    }
                    if id.len() > 1 && id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit())
                    {
                        return Err(fail("a numeric pre-release identifier has leading zeros"));
                    }
                }
                ids
            }
        };
        Ok(TalosVersion {
            major,
            minor,
            patch,
            pre,
        })
    }
}

/// Drops leading zeros of a dotted part as the lenient parse does ("01"
/// becomes "1", "00" becomes "0").
fn strip_zeros(part: &str) -> String {
    if part.len() <= 1 {
        return part.to_string();
    }
    let trimmed = part.trim_start_matches('0');
    if trimmed.is_empty() || !trimmed.starts_with(|c: char| c.is_ascii_digit()) {
        format!("0{trimmed}")
    } else {
        trimmed.to_string()
    }
}

impl fmt::Display for TalosVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.pre.is_empty() {
            write!(f, "-{}", self.pre.join("."))?;
        }
        Ok(())
    }
}

impl Ord for TalosVersion {
    fn cmp(&self, other: &TalosVersion) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                // A pre-release comes before its release.
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => compare_pre(&self.pre, &other.pre),
            })
    }
}

impl PartialOrd for TalosVersion {
    fn partial_cmp(&self, other: &TalosVersion) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

fn compare_pre(a: &[String], b: &[String]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let order = match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            // Numeric identifiers sort before alphanumeric ones.
            (Ok(_), Err(_)) => Ordering::Less,
            (Err(_), Ok(_)) => Ordering::Greater,
            (Err(_), Err(_)) => x.cmp(y),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

/// How a node is upgraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradePath {
    /// `ImageService.Pull`, then `LifecycleService.Upgrade`, then a reboot.
    Lifecycle,
    /// `MachineService.Upgrade`, which reboots by itself.
    Legacy,
}

impl UpgradePath {
    /// Whether a node running `version` serves the new path, by talosctl
    /// 1.13.9's range `>1.13.0-alpha.2 <2.0.0`.
    pub fn serves_lifecycle(version: &TalosVersion) -> bool {
        let low = TalosVersion {
            major: 1,
            minor: 13,
            patch: 0,
            pre: vec!["alpha".into(), "2".into()],
        };
        let high = TalosVersion {
            major: 2,
            minor: 0,
            patch: 0,
            pre: Vec::new(),
        };
        *version > low && *version < high
    }
}

/// The path talosctl 1.13.9 takes for nodes reporting these versions
/// (`(node, tag)` as Version answered): the new one when all of them are
/// in range, the legacy call when any is not. A tag that does not parse
/// fails naming its node, as talosctl fails.
pub fn upgrade_path<'a>(
    versions: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<UpgradePath, Error> {
    let mut path = UpgradePath::Lifecycle;
    for (node, tag) in versions {
        let version: TalosVersion = tag.parse().map_err(|e: VersionParseError| {
            Error::Protocol(Failure {
                node: (!node.is_empty()).then(|| node.to_string()),
                message: format!("error parsing server version: {e}"),
            })
        })?;
        if !UpgradePath::serves_lifecycle(&version) {
            path = UpgradePath::Legacy;
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> TalosVersion {
        s.parse().unwrap()
    }

    #[test]
    fn parses_talos_tags_leniently() {
        assert_eq!(v("v1.13.9").to_string(), "1.13.9");
        assert_eq!(v(" v1.14.0-beta.1 ").pre, ["beta", "1"]);
        assert_eq!(v("1.13").to_string(), "1.13.0");
        assert_eq!(v("v1.013.09").to_string(), "1.13.9");
        assert_eq!(v("v1.14.0-alpha.2+dirty").to_string(), "1.14.0-alpha.2");
        assert!("v1.13-alpha.1".parse::<TalosVersion>().is_err());
        assert!("latest".parse::<TalosVersion>().is_err());
        assert!("v1.13.x".parse::<TalosVersion>().is_err());
    }

    #[test]
    fn orders_pre_releases_as_semver() {
        assert!(v("1.13.0-alpha.2") < v("1.13.0-alpha.10"));
        assert!(v("1.13.0-alpha.10") < v("1.13.0-beta.0"));
        assert!(v("1.13.0-rc.0") < v("1.13.0"));
        assert!(v("1.13.0-1") < v("1.13.0-alpha"));
        assert!(v("1.13.0-alpha") < v("1.13.0-alpha.1"));
    }

    #[test]
    fn the_new_path_starts_after_1_13_0_alpha_2() {
        let path = |tag| upgrade_path([("n1", tag)]).unwrap();
        // Below or at the bound: the legacy call.
        assert_eq!(path("v1.12.6"), UpgradePath::Legacy);
        assert_eq!(path("v1.13.0-alpha.1"), UpgradePath::Legacy);
        assert_eq!(path("v1.13.0-alpha.2"), UpgradePath::Legacy);
        // Above it: the new one.
        assert_eq!(path("v1.13.0-alpha.3"), UpgradePath::Lifecycle);
        assert_eq!(path("v1.13.0-beta.0"), UpgradePath::Lifecycle);
        assert_eq!(path("v1.13.0"), UpgradePath::Lifecycle);
        assert_eq!(path("v1.13.9"), UpgradePath::Lifecycle);
        assert_eq!(path("v1.14.0"), UpgradePath::Lifecycle);
        assert_eq!(path("v2.0.0-alpha.0"), UpgradePath::Lifecycle);
        // The range ends before 2.0.0.
        assert_eq!(path("v2.0.0"), UpgradePath::Legacy);
    }

    #[test]
    fn one_old_node_sends_every_node_down_the_legacy_path() {
        let nodes = [("a", "v1.13.9"), ("b", "v1.12.0"), ("c", "v1.14.0")];
        assert_eq!(upgrade_path(nodes).unwrap(), UpgradePath::Legacy);
    }

    #[test]
    fn an_unparsable_tag_names_its_node() {
        let err = upgrade_path([("a", "v1.13.9"), ("10.5.0.3", "nightly")]).unwrap_err();
        assert!(err.to_string().contains("10.5.0.3"), "{err}");
        assert!(err.to_string().contains("nightly"), "{err}");
    }
}
