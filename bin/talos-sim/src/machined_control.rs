//! The maintenance calls an operator types during a night on the cluster:
//! the node's containers, service control and etcd's downgrade, answered
//! as machined answers them (internal/app/machined/internal/server/
//! v1alpha1/v1alpha1_server.go: Containers, ServiceStart, ServiceStop,
//! ServiceRestart, EtcdDowngradeValidate/Enable/Cancel;
//! internal/app/machined/pkg/system/system.go: APIStart, APIStop,
//! APIRestart; internal/pkg/containers for what a container shows).

use sha2::{Digest as _, Sha256};
use tonic::Status;

use super::go_errors::etcd_wrapped;
use super::node::Node;
use crate::api::common::ContainerDriver;
use crate::api::etcdserverpb::downgrade_request::DowngradeAction;
use crate::api::machine;

/// containerd's namespace of Talos's own services.
pub(crate) const SYSTEM_NAMESPACE: &str = "system";
/// containerd's namespace of the CRI (Kubernetes pods).
pub(crate) const K8S_NAMESPACE: &str = "k8s.io";

/// The image a Talos release runs etcd from (`EtcdImage` and
/// `DefaultEtcdVersion`, pkg/machinery/constants; v1alpha1_etcdconfig.go).
pub(crate) fn etcd_image(node: &Node) -> String {
    let release = node.talos_version().etcd_release();
    if node.talos_version().at_least_1_14() {
        format!("registry.k8s.io/etcd:{}", release.version())
    } else {
        format!("registry.k8s.io/etcd:{}", release.tag())
    }
}

/// The kubelet image of a release (`KubeletImage`, `DefaultKubernetesVersion`).
pub(crate) fn kubelet_image(node: &Node) -> String {
    format!("ghcr.io/siderolabs/kubelet:{}", kube_version(node))
}

/// One container as the inspectors describe it.
pub(crate) struct SimContainer {
    pub info: machine::ContainerInfo,
    /// Where its log is, if the simulator keeps one.
    pub log: Option<std::path::PathBuf>,
}

fn hex_id(seed: &str) -> String {
    Sha256::digest(seed.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Talos's services in the system namespace (containerd inspector: the id
/// is the display name and the pod, the image resolved to its name, none
/// for apid and trustd, which run from the root filesystem).
async fn system_containers(node: &Node) -> Vec<SimContainer> {
    let mut out = Vec::new();
    let mut add = |id: &str, image: String, pid: u32, log| {
        out.push(SimContainer {
            info: machine::ContainerInfo {
                namespace: SYSTEM_NAMESPACE.into(),
                id: id.into(),
                uid: String::new(),
                internal_id: id.into(),
                image,
                pid,
                status: "RUNNING".into(),
                pod_id: id.into(),
                name: id.into(),
                network_namespace: String::new(),
            },
            log,
        })
    };
    // The simulator is apid and machined: its own process stands in.
    let own = std::process::id();
    add("apid", String::new(), own, None);
    if node.is_control_plane()
        && let Some(pid) = node.etcd_pid().await
    {
        add("etcd", etcd_image(node), pid, Some(node.etcd_log()));
    }
    add("kubelet", kubelet_image(node), own, None);
    if node.is_control_plane() {
        add("trustd", String::new(), own, None);
    }
    out
}

/// The pods of the CRI namespace: the kube-apiserver static pod, while it
/// runs (CRI inspector: the sandbox as `NAMESPACE/POD`, its containers as
/// `NAMESPACE/POD:NAME:ID12`).
fn k8s_containers(node: &Node) -> Vec<SimContainer> {
    let Some(pid) = node.kube_apiserver_pid() else {
        return Vec::new();
    };
    let pod = format!("kube-system/kube-apiserver-{}", node.name);
    let sandbox_id = hex_id(&format!("sandbox {pod} {pid}"));
    let container_id = hex_id(&format!("container {pod} {pid}"));
    let uid = hex_id(&pod)[..32].to_string();
    let sandbox = machine::ContainerInfo {
        namespace: K8S_NAMESPACE.into(),
        id: pod.clone(),
        uid: uid.clone(),
        internal_id: sandbox_id,
        image: "registry.k8s.io/pause:3.10".into(),
        pid,
        status: "SANDBOX_READY".into(),
        pod_id: pod.clone(),
        name: pod.clone(),
        network_namespace: String::new(),
    };
    let container = machine::ContainerInfo {
        namespace: K8S_NAMESPACE.into(),
        id: format!("{pod}:kube-apiserver:{}", &container_id[..12]),
        uid,
        internal_id: container_id,
        image: format!("sha256:{}", hex_id("registry.k8s.io/kube-apiserver")),
        pid,
        status: "CONTAINER_RUNNING".into(),
        pod_id: pod,
        name: "kube-apiserver".into(),
        network_namespace: String::new(),
    };
    vec![
        SimContainer {
            info: sandbox,
            log: None,
        },
        SimContainer {
            info: container,
            log: Some(node.dir().join("kubernetes/kube-apiserver.log")),
        },
    ]
}

/// The containers of `namespace` through `driver`, as getContainerInspector
/// refuses or lists them.
pub(crate) async fn containers(
    node: &Node,
    namespace: &str,
    driver: i32,
) -> Result<Vec<SimContainer>, Status> {
    if namespace.is_empty() {
        return Err(Status::invalid_argument("namespace can't be empty"));
    }
    match ContainerDriver::try_from(driver) {
        Ok(ContainerDriver::Cri) if namespace != K8S_NAMESPACE => Err(Status::unknown(
            "CRI inspector is supported only for K8s namespace",
        )),
        Ok(ContainerDriver::Cri) => Ok(k8s_containers(node)),
        Ok(ContainerDriver::Containerd) => Ok(match namespace {
            SYSTEM_NAMESPACE => system_containers(node).await,
            K8S_NAMESPACE => k8s_containers(node),
            _ => Vec::new(),
        }),
        Err(_) => Err(Status::invalid_argument(format!(
            "unsupported driver \"{driver}\""
        ))),
    }
}

/// Which API actions a service allows (APIStartableService and friends:
/// only kubelet and extensions take any; etcd, apid and the others none).
fn allowed(id: &str, action: &str) -> bool {
    id == "kubelet" && matches!(action, "start" | "restart")
}

/// The services a node defines (system.go's state; etcd and trustd on
/// control-plane nodes only).
fn defined(node: &Node, id: &str) -> bool {
    match id {
        "apid" | "containerd" | "cri" | "kubelet" | "machined" | "udevd" => true,
        "etcd" | "trustd" => node.is_control_plane(),
        _ => false,
    }
}

/// ServiceStart, ServiceStop, ServiceRestart (`action`): the reply's text,
/// or the error system.go gives.
pub(crate) async fn service_action(node: &Node, id: &str, action: &str) -> Result<String, Status> {
    if !defined(node, id) {
        return Err(Status::unknown(format!("service \"{id}\" not defined")));
    }
    let running = match id {
        "etcd" => node.etcd_running().await,
        _ => true,
    };
    let done = match action {
        "start" => "started",
        "stop" => "stopped",
        _ => "restarted",
    };
    let reply = format!("Service \"{id}\" {done}");
    // Starting what runs and stopping what does not are no-ops; a restart
    // of a stopped service is a start.
    let effective = match (action, running) {
        ("start", true) | ("stop", false) => return Ok(reply),
        ("restart", false) => "start",
        (other, _) => other,
    };
    if !allowed(id, effective) {
        return Err(Status::unknown(format!(
            "service \"{id}\" doesn't support {effective} operation via API"
        )));
    }
    node.kubelet.start();
    Ok(reply)
}

/// etcd's downgrade calls: the version checked as upstream's
/// validateDowngrade does, then the local member asked.
pub(crate) async fn downgrade(
    node: &Node,
    action: DowngradeAction,
    version: &str,
) -> Result<String, Status> {
    let api = match action {
        DowngradeAction::Validate => "etcd downgrade validate",
        DowngradeAction::Enable => "etcd downgrade enable",
        DowngradeAction::Cancel => "etcd downgrade cancel",
    };
    node.check_controlplane(api)?;
    if action != DowngradeAction::Cancel {
        validate_downgrade(version)?;
    }
    let (client, url) = node.local_etcd(api).await?;
    client
        .downgrade(&url, action, version)
        .await
        .map_err(etcd_wrapped("failed to query etcd status"))
}

/// A `MAJOR.MINOR` of 3.5 or later.
fn validate_downgrade(version: &str) -> Result<(), Status> {
    if version.is_empty() {
        return Err(Status::invalid_argument(
            "version is required for etcd downgrade",
        ));
    }
    let parts: Vec<&str> = version.split('.').collect();
    let [major, minor] = parts[..] else {
        return Err(Status::invalid_argument(
            "version should be in MAJOR.MINOR format",
        ));
    };
    let major: i64 = major
        .parse()
        .map_err(|_| Status::invalid_argument("major version should be a number"))?;
    let minor: i64 = minor
        .parse()
        .map_err(|_| Status::invalid_argument("minor version should be a number"))?;
    if (major, minor) < (3, 5) {
        return Err(Status::invalid_argument(
            "etcd downgrade is only supported to 3.5 and later versions",
        ));
    }
    Ok(())
}

/// ImageService.List: the images of a containerd namespace, sorted by
/// name: Talos's own (etcd, kubelet) in `system`, the API server's in the
/// CRI one when Kubernetes runs, and whatever was pulled into it.
/// `digest` is the simulated registry's digest of a reference.
pub(crate) fn images(
    node: &Node,
    namespace: i32,
    digest: fn(&str) -> String,
) -> Result<Vec<machine::ImageServiceListResponse>, Status> {
    use crate::api::common::ContainerdNamespace as Ns;
    let mut names: Vec<String> = match Ns::try_from(namespace) {
        Ok(Ns::NsSystem) => vec![etcd_image(node), kubelet_image(node)],
        Ok(Ns::NsCri) => {
            let mut names = vec!["registry.k8s.io/pause:3.10".to_string()];
            if node.kube_apiserver_pid().is_some() {
                names.push(format!(
                    "registry.k8s.io/kube-apiserver:{}",
                    kube_version(node)
                ));
            }
            names
        }
        _ => {
            return Err(Status::invalid_argument(format!(
                "unsupported namespace {namespace}"
            )));
        }
    };
    names.extend(node.upgrade.listed(namespace));
    names.sort();
    names.dedup();
    let created = node.boot_time();
    Ok(names
        .into_iter()
        .map(|name| {
            let hash = hex_id(&name);
            machine::ImageServiceListResponse {
                digest: name
                    .split_once('@')
                    .map(|(_, d)| d.to_string())
                    .unwrap_or_else(|| digest(&name)),
                // A stable size per image, 10 to 100 MB.
                size: 10_000_000
                    + (u32::from_str_radix(&hash[..6], 16).unwrap_or(0) as i64 % 90_000_000),
                created_at: Some(created),
                labels: Default::default(),
                name,
            }
        })
        .collect())
}

/// The Kubernetes version of a release (`DefaultKubernetesVersion`).
fn kube_version(node: &Node) -> &'static str {
    if node.talos_version().at_least_1_14() {
        "v1.37.0-rc.0"
    } else {
        "v1.36.3"
    }
}

#[cfg(test)]
mod tests {
    use super::validate_downgrade;

    #[test]
    fn downgrade_versions_are_checked_as_upstream_does() {
        assert!(validate_downgrade("3.5").is_ok());
        assert!(validate_downgrade("3.6").is_ok());
        for (bad, message) in [
            ("", "version is required for etcd downgrade"),
            ("3.5.0", "version should be in MAJOR.MINOR format"),
            ("x.5", "major version should be a number"),
            ("3.y", "minor version should be a number"),
            (
                "3.4",
                "etcd downgrade is only supported to 3.5 and later versions",
            ),
        ] {
            let status = validate_downgrade(bad).unwrap_err();
            assert_eq!(status.message(), message, "{bad:?}");
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
        }
    }
}
