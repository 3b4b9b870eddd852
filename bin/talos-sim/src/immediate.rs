//! Whether a new configuration can take effect without a reboot, as
//! upstream's `CanApplyImmediate` decides it in v1.13.9
//! (internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go).
//!
//! Only the v1alpha1 document counts: the sections listed below may change
//! in place; a change anywhere else in it needs a reboot. Changes to the
//! other documents are always applied in place.

use serde_norway::Value;

use crate::diff::{self, MachineConfig};

/// `machine` fields that change without a reboot.
const MACHINE_IMMEDIATE: &[&str] = &[
    "ca",
    "acceptedCAs",
    "time",
    "certSANs",
    "install",
    "network",
    "sysfs",
    "sysctls",
    "logging",
    "controlPlane",
    "kubelet",
    "kernel",
    "registries",
    "pods",
    "seccompProfiles",
    "nodeAnnotations",
    "nodeLabels",
    "nodeTaints",
];

/// `machine.features` fields that change without a reboot (only when both
/// configurations have a `features` section).
const FEATURES_IMMEDIATE: &[&str] = &[
    "kubernetesTalosAPIAccess",
    "kubePrism",
    "hostDNS",
    "imageCache",
    "nodeAddressSortAlgorithm",
];

/// Ok when `new` can replace `current` in place; otherwise upstream's
/// error text with the diff of what needs a reboot.
pub(crate) fn check(current: &MachineConfig, new: &MachineConfig) -> Result<(), String> {
    let mut adjusted = new.clone();
    let v1 = &mut adjusted.v1alpha1;
    let cur = &current.v1alpha1;
    // `debug` and the whole `cluster` section apply in place.
    for key in ["debug", "cluster"] {
        copy_field(cur, v1, key);
    }
    if let (Some(cur_machine), Some(new_machine)) = (cur.get("machine"), v1.get_mut("machine"))
        && !cur_machine.is_null()
        && !new_machine.is_null()
    {
        for key in MACHINE_IMMEDIATE {
            copy_field(cur_machine, new_machine, key);
        }
        if let (Some(cur_features), Some(new_features)) =
            (cur_machine.get("features"), new_machine.get_mut("features"))
            && !cur_features.is_null()
            && !new_features.is_null()
        {
            for key in FEATURES_IMMEDIATE {
                copy_field(cur_features, new_features, key);
            }
        }
    }
    // Re-sort: copied fields may have been appended.
    let current_text = current.encode_v1alpha1();
    let adjusted = diff::parse(adjusted.encode_v1alpha1().as_bytes())
        .map(|c| c.encode_v1alpha1())
        .unwrap_or_else(|_| adjusted.encode_v1alpha1());
    if current_text == adjusted {
        return Ok(());
    }
    Err(format!(
        "this config change can't be applied in immediate mode\ndiff:\n{}",
        diff::unified(&current_text, &adjusted)
    ))
}

/// Makes `to[key]` what `from[key]` is (absent when absent).
fn copy_field(from: &Value, to: &mut Value, key: &str) {
    let Value::Mapping(to) = to else { return };
    match from.get(key) {
        Some(value) => {
            to.insert(Value::String(key.into()), value.clone());
        }
        None => {
            to.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "version: v1alpha1\nmachine:\n  type: controlplane\n  token: t\n  \
        features:\n    rbac: true\n    kubePrism:\n      enabled: true\n\
        cluster:\n  controlPlane:\n    endpoint: https://10.0.0.1:6443\n";

    fn parsed(yaml: &str) -> MachineConfig {
        diff::parse(yaml.as_bytes()).unwrap()
    }

    #[test]
    fn cluster_and_allowed_machine_fields_apply_in_place() {
        let new = BASE
            .replace("https://10.0.0.1:6443", "https://vip:6443")
            .replace(
                "  token: t\n",
                "  token: t\n  certSANs: [vip]\n  sysctls:\n    a: \"1\"\n",
            )
            .replace("enabled: true", "enabled: false");
        assert_eq!(check(&parsed(BASE), &parsed(&new)), Ok(()));
    }

    #[test]
    fn other_fields_need_a_reboot() {
        let new = BASE.replace("token: t", "token: u");
        let err = check(&parsed(BASE), &parsed(&new)).unwrap_err();
        assert!(
            err.starts_with(
                "this config change can't be applied in immediate mode\ndiff:\n--- a\n+++ b\n@@ "
            ),
            "{err}"
        );
        assert!(err.contains("-  token: t\n+  token: u\n"), "{err}");
        let new = BASE.replace("rbac: true", "rbac: false");
        assert!(check(&parsed(BASE), &parsed(&new)).is_err());
    }

    #[test]
    fn other_documents_apply_in_place() {
        let new =
            format!("{BASE}---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer: x\n");
        assert_eq!(check(&parsed(BASE), &parsed(&new)), Ok(()));
    }
}
