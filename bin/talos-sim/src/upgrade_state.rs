//! A node's upgrade state, below its API and lifecycle: the images pulled
//! into its containerd, the version installed for the next boot (its other
//! boot partition), and the faults armed for its next upgrade.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::TalosVersion;

/// What goes wrong at the next upgrade's boot (armed through the control
/// socket or [`crate::Cluster::fail_next_upgrade`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum UpgradeFault {
    /// The boot loader falls back to the old partition: the node comes
    /// back, with a new boot id, on the version it ran before.
    BootsOldPartition,
    /// The node never comes back: it stays down after going down.
    NeverComesBack,
}

impl std::str::FromStr for UpgradeFault {
    type Err = String;

    fn from_str(s: &str) -> Result<UpgradeFault, String> {
        match s {
            "boots-old-partition" => Ok(UpgradeFault::BootsOldPartition),
            "never-comes-back" => Ok(UpgradeFault::NeverComesBack),
            other => Err(format!(
                "unknown upgrade fault {other:?} (expected boots-old-partition or never-comes-back)"
            )),
        }
    }
}

/// The version an installer image boots: the one its tag names, when the
/// simulator simulates it (`ghcr.io/siderolabs/installer:v1.14.0`). Any
/// other reference names no image the simulated registry holds.
pub(crate) fn image_version(image: &str) -> Option<TalosVersion> {
    let name = image.rsplit('/').next()?;
    let (_, tag) = name.split_once(':')?;
    let tag = tag.split('@').next()?;
    tag.parse().ok()
}

/// A reference as containerd names it: the registry made explicit
/// (`docker.io/library/` for a bare name, as reference.ParseDockerRef
/// upstream does), and the name without tag or digest.
pub(crate) fn normalized(image: &str) -> (String, String) {
    let first = image.split('/').next().unwrap_or_default();
    let has_registry = image.contains('/') && (first.contains(['.', ':']) || first == "localhost");
    let full = match (has_registry, image.contains('/')) {
        (true, _) => image.to_string(),
        (false, true) => format!("docker.io/{image}"),
        (false, false) => format!("docker.io/library/{image}"),
    };
    let slash = full.rfind('/').map_or(0, |at| at + 1);
    let end = full[slash..]
        .find(['@', ':'])
        .map_or(full.len(), |at| slash + at);
    (full.clone(), full[..end].to_string())
}

/// The node's upgrade state.
#[derive(Debug, Default)]
pub(crate) struct UpgradeState {
    /// Pulled images by the names containerd knows them by, with the
    /// version each boots.
    pulled: Mutex<BTreeMap<String, TalosVersion>>,
    /// The pulled images each containerd namespace lists (namespace as
    /// `common.ContainerdNamespace`, the name pinned to its digest).
    listed: Mutex<std::collections::BTreeSet<(i32, String)>>,
    installed: Mutex<Option<TalosVersion>>,
    fault: Mutex<Option<UpgradeFault>>,
    /// LifecycleService's lock: one install or upgrade at a time.
    pub(crate) lifecycle_lock: tokio::sync::Mutex<()>,
}

impl UpgradeState {
    /// Records an image pulled under `names`, which boots `version`.
    pub(crate) fn note_pulled(&self, names: &[&str], version: TalosVersion) {
        let mut pulled = self.pulled.lock().expect("pulled lock");
        for name in names {
            pulled.insert((*name).to_string(), version);
        }
    }

    /// Records that `pinned` was pulled into `namespace`.
    pub(crate) fn note_listed(&self, namespace: i32, pinned: &str) {
        self.listed
            .lock()
            .expect("listed lock")
            .insert((namespace, pinned.to_string()));
    }

    /// The images pulled into `namespace`, pinned to their digests.
    pub(crate) fn listed(&self, namespace: i32) -> Vec<String> {
        self.listed
            .lock()
            .expect("listed lock")
            .iter()
            .filter(|(ns, _)| *ns == namespace)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// The version a pulled image boots, if `name` was pulled.
    pub(crate) fn pulled(&self, name: &str) -> Option<TalosVersion> {
        self.pulled.lock().expect("pulled lock").get(name).copied()
    }

    /// Installs `version` on the other boot partition: the next boot runs it.
    pub(crate) fn install(&self, version: TalosVersion) {
        *self.installed.lock().expect("installed lock") = Some(version);
    }

    /// The version installed for the next boot, taken (a boot uses it once).
    pub(crate) fn take_installed(&self) -> Option<TalosVersion> {
        self.installed.lock().expect("installed lock").take()
    }

    /// Arms `fault` for the next upgrade's boot.
    pub(crate) fn arm(&self, fault: UpgradeFault) {
        *self.fault.lock().expect("fault lock") = Some(fault);
    }

    /// The fault armed for this upgrade's boot, taken.
    pub(crate) fn take_fault(&self) -> Option<UpgradeFault> {
        self.fault.lock().expect("fault lock").take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_installer_tag_names_the_version_it_boots() {
        let v = |s| image_version(s);
        assert_eq!(
            v("ghcr.io/siderolabs/installer:v1.14.0"),
            Some(TalosVersion::V1_14_0)
        );
        assert_eq!(
            v("localhost:5000/installer:v1.13.9"),
            Some(TalosVersion::V1_13_9)
        );
        assert_eq!(v("localhost:5000/installer"), None);
        assert_eq!(v("ghcr.io/siderolabs/installer:v1.12.0"), None);
        assert_eq!(v("ghcr.io/siderolabs/installer:latest"), None);
    }

    #[test]
    fn references_are_normalized_as_containerd_names_them() {
        assert_eq!(
            normalized("installer:v1.14.0"),
            (
                "docker.io/library/installer:v1.14.0".into(),
                "docker.io/library/installer".into()
            )
        );
        assert_eq!(
            normalized("localhost:5000/siderolabs/installer:v1.14.0").1,
            "localhost:5000/siderolabs/installer"
        );
        assert_eq!(
            normalized("ghcr.io/siderolabs/installer:v1.14.0").1,
            "ghcr.io/siderolabs/installer"
        );
    }
}
