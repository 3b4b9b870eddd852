//! The kubelet service as machined reports it.
//!
//! Upstream's KubeletServiceController
//! (internal/app/machined/pkg/controllers/k8s/kubelet_service.go) stops and
//! starts the kubelet service whenever the kubelet's spec or its secrets
//! change: its configuration (`machine.kubelet`, the cluster's DNS domain
//! and service subnets, from kubelet_config.go and kubelet_spec.go) or what
//! secrets/kubelet.go takes from the cluster (the control-plane endpoint,
//! the Kubernetes CA, the bootstrap token). A started service's health is
//! unknown until its first check, 2 s after the start
//! (internal/app/machined/pkg/system/services/kubelet.go, HealthSettings),
//! which the simulator passes: no kubelet runs here, so nothing else can
//! fail it.

use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use serde_norway::Value;

/// The kubelet service of one node: when it last started.
pub(crate) struct Kubelet {
    started: Mutex<Option<(Instant, SystemTime)>>,
}

/// What the service looks like at a moment.
pub(crate) struct KubeletState {
    /// Health known (the first check ran) and, the check passing, healthy.
    pub(crate) checked: bool,
    /// When it started, and when its first check passed.
    pub(crate) started: SystemTime,
    pub(crate) first_check: SystemTime,
}

impl Kubelet {
    pub(crate) fn new() -> Kubelet {
        Kubelet {
            started: Mutex::new(None),
        }
    }

    /// The service starts (at boot, or after a change of its inputs).
    pub(crate) fn start(&self) {
        *self.started.lock().expect("kubelet lock") = Some((Instant::now(), SystemTime::now()));
    }

    /// Restarts the service when the kubelet's inputs differ between the
    /// configurations `before` and `after` (machine configuration YAML).
    /// True when it restarted.
    pub(crate) fn restart_on_change(&self, before: &str, after: &str) -> bool {
        if inputs(before) == inputs(after) {
            return false;
        }
        self.start();
        true
    }

    /// The service now, with the first health check `initial_delay` after
    /// its start; `None` before it ever started.
    pub(crate) fn state(&self, initial_delay: std::time::Duration) -> Option<KubeletState> {
        let (at, wall) = (*self.started.lock().expect("kubelet lock"))?;
        Some(KubeletState {
            checked: at.elapsed() >= initial_delay,
            started: wall,
            first_check: wall + initial_delay,
        })
    }
}

/// The parts of a machine configuration the kubelet's spec and secrets are
/// made from, in a comparable form (absent parts are null).
fn inputs(config: &str) -> Vec<Value> {
    let doc: Value = serde_norway::from_str(config).unwrap_or(Value::Null);
    let at = |path: &[&str]| {
        let mut v = &doc;
        for key in path {
            match v.get(*key) {
                Some(next) => v = next,
                None => return Value::Null,
            }
        }
        v.clone()
    };
    vec![
        at(&["machine", "kubelet"]),
        at(&["cluster", "controlPlane", "endpoint"]),
        at(&["cluster", "ca", "crt"]),
        at(&["cluster", "token"]),
        at(&["cluster", "network", "dnsDomain"]),
        at(&["cluster", "network", "serviceSubnets"]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_change_of_the_kubelets_inputs_restarts_it() {
        let k = Kubelet::new();
        let base = "machine:\n  type: controlplane\ncluster:\n  controlPlane:\n    endpoint: https://a:6443\n";
        assert!(!k.restart_on_change(base, &format!("{base}debug: true\n")));
        assert!(k.state(std::time::Duration::ZERO).is_none());
        let extra = base.replace(
            "type: controlplane",
            "type: controlplane\n  kubelet:\n    extraArgs:\n      v: \"2\"",
        );
        assert!(k.restart_on_change(base, &extra));
        let state = k.state(std::time::Duration::from_secs(3600)).unwrap();
        assert!(!state.checked);
        assert!(k.restart_on_change(base, &base.replace("https://a:6443", "https://b:6443")));
        assert!(k.state(std::time::Duration::ZERO).unwrap().checked);
    }
}
