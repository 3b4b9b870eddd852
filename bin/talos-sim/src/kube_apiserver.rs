//! A real kube-apiserver on each simulated control-plane node, run as Talos
//! runs its static pod, when the simulator is given the binary
//! ([`crate::SimConfig::kube_apiserver`]).
//!
//! Its flags come from the node's running configuration as Talos 1.13.9
//! derives them (internal/app/machined/pkg/controllers/k8s/
//! control_plane_static_pod.go, manageAPIServer): `service-account-issuer`
//! and `api-audiences` both the control-plane endpoint, the service-account
//! key from `cluster.serviceAccount`, client certificates checked against
//! the Kubernetes CA `cluster.ca`, a serving certificate issued by it, and
//! `cluster.apiServer.extraArgs` merged by argsbuilder's policies (most
//! flags replaced, a few appended to, the file and etcd flags never
//! overridden). Its etcd is the node's own member, as Talos points it at
//! the local etcd. It listens on the node's address, port 6443.
//!
//! It starts when the node has booted as a configured control plane,
//! restarts with new flags when an applied configuration changes them,
//! and stops when the node goes down (reboot, reset, power off). A leave
//! stops etcd and leaves it running, answering without etcd behind it.
//!
//! Not simulated: 1.14's `KubeServiceAccountConfig`, the aggregator and
//! kubelet-client certificates, audit and admission configuration files,
//! and encryption at rest.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use base64::Engine as _;
use serde_norway::Value;

use crate::node::{Node, Power};
use crate::pki::{Ca, LeafSpec};

/// The port Talos's API server listens on (`cluster.apiServer` LocalPort).
pub const PORT: u16 = 6443;

/// The flags whose extraArgs are appended to the defaults.
const ADDITIVE: [&str; 4] = [
    "enable-admission-plugins",
    "feature-gates",
    "authorization-mode",
    "tls-cipher-suites",
];

/// The flags extraArgs may not set (argsbuilder.MergeDenied upstream).
const DENIED: [&str; 16] = [
    "etcd-servers",
    "client-ca-file",
    "requestheader-client-ca-file",
    "proxy-client-cert-file",
    "proxy-client-key-file",
    "encryption-provider-config",
    "etcd-cafile",
    "etcd-certfile",
    "etcd-keyfile",
    "kubelet-client-certificate",
    "kubelet-client-key",
    "service-account-key-file",
    "service-account-signing-key-file",
    "tls-cert-file",
    "tls-private-key-file",
    "authorization-config",
];

/// The kube-apiserver of one node.
pub(crate) struct KubeApiServer {
    binary: Option<PathBuf>,
    running: Mutex<Option<Running>>,
}

struct Running {
    args: Vec<String>,
    child: Child,
}

impl KubeApiServer {
    pub(crate) fn new(binary: Option<PathBuf>) -> KubeApiServer {
        KubeApiServer {
            binary,
            running: Mutex::new(None),
        }
    }

    /// Stops it, if it runs (the node went down).
    pub(crate) fn stop(&self) {
        if let Some(mut running) = self.running.lock().expect("kube lock").take() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }

    /// The process id while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        let mut slot = self.running.lock().expect("kube lock");
        let running = slot.as_mut()?;
        matches!(running.child.try_wait(), Ok(None)).then(|| running.child.id())
    }

    /// The flags it runs with.
    pub(crate) fn args(&self) -> Option<Vec<String>> {
        self.running
            .lock()
            .expect("kube lock")
            .as_ref()
            .map(|r| r.args.clone())
    }
}

/// Brings `node`'s kube-apiserver in line with the node: running with the
/// flags its configuration gives when it is a powered, configured control
/// plane (started, or restarted when the flags changed or it died), and
/// stopped otherwise.
pub(crate) fn reconcile(node: &Node) {
    let kube = &node.kube_apiserver;
    let Some(binary) = &kube.binary else {
        return;
    };
    if node.power() != Power::On || !node.is_control_plane() || !node.is_configured() {
        kube.stop();
        return;
    }
    let dir = node.dir().join("kubernetes");
    let (args, secrets) = match prepare(node, &dir) {
        Ok(prepared) => prepared,
        Err(e) => {
            tracing::warn!(node = %node.name, error = %e, "kube-apiserver not started");
            kube.stop();
            return;
        }
    };
    let mut slot = kube.running.lock().expect("kube lock");
    if let Some(running) = slot.as_mut()
        && running.args == args
        && matches!(running.child.try_wait(), Ok(None))
    {
        return;
    }
    if let Some(mut old) = slot.take() {
        let _ = old.child.kill();
        let _ = old.child.wait();
    }
    // The secrets are written (and the serving certificate issued) only for
    // a start, never under a server that keeps running.
    if let Err(e) = secrets.write(&dir) {
        tracing::warn!(node = %node.name, error = %e, "kube-apiserver not started");
        return;
    }
    match spawn(binary, &args, &dir) {
        Ok(child) => {
            tracing::info!(node = %node.name, pid = child.id(), "kube-apiserver started");
            *slot = Some(Running { args, child });
        }
        Err(e) => {
            tracing::warn!(node = %node.name, binary = %binary.display(), error = %e, "kube-apiserver did not start")
        }
    }
}

fn spawn(binary: &Path, args: &[String], dir: &Path) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt as _;
    let log = std::fs::File::create(dir.join("kube-apiserver.log"))?;
    let mut command = Command::new(binary);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    // SAFETY: prctl is async-signal-safe and only affects the child.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// What a start writes into the node's Kubernetes directory: the CA, a
/// serving certificate issued by it, and the service-account key.
struct Secrets {
    ca: Ca,
    ca_crt: String,
    sa_key: String,
    ips: Vec<IpAddr>,
    names: Vec<String>,
}

const CA_FILE: &str = "ca.crt";
const CRT_FILE: &str = "apiserver.crt";
const KEY_FILE: &str = "apiserver.key";
const SA_FILE: &str = "service-account.key";

impl Secrets {
    fn write(&self, dir: &Path) -> Result<(), String> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let serving = self
            .ca
            .issue(&LeafSpec::server(&self.ips, &names))
            .map_err(|e| format!("serving certificate: {e}"))?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (name, body) in [
            (CA_FILE, &self.ca_crt),
            (CRT_FILE, &serving.cert_pem),
            (KEY_FILE, &serving.key_pem),
            (SA_FILE, &self.sa_key),
        ] {
            let path = dir.join(name);
            talos_client::write_private_file(&path, body.as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    }
}

/// The flags the node's configuration gives, and the secrets a start
/// writes into `dir` (nothing is written here).
fn prepare(node: &Node, dir: &Path) -> Result<(Vec<String>, Secrets), String> {
    let config = node.active_config();
    let doc: Value = serde_norway::from_str(&config).map_err(|e| format!("machine config: {e}"))?;
    let text = |path: &[&str]| -> Option<String> {
        let mut v = &doc;
        for key in path {
            v = v.get(*key)?;
        }
        v.as_str().map(str::to_string)
    };
    let pem = |path: &[&str]| -> Result<String, String> {
        let encoded = text(path).ok_or_else(|| format!("no .{}", path.join(".")))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|e| format!(".{}: {e}", path.join(".")))?;
        String::from_utf8(bytes).map_err(|_| format!(".{} is not PEM", path.join(".")))
    };
    let endpoint = text(&["cluster", "controlPlane", "endpoint"])
        .ok_or("no .cluster.controlPlane.endpoint")?;
    let ca_crt = pem(&["cluster", "ca", "crt"])?;
    let ca = Ca::load(&ca_crt, &pem(&["cluster", "ca", "key"])?)
        .map_err(|e| format!(".cluster.ca: {e}"))?;
    let sa_key = pem(&["cluster", "serviceAccount", "key"])?;

    let mut ips: Vec<IpAddr> = vec![IpAddr::V4(node.ip), IpAddr::from([127, 0, 0, 1])];
    let mut names: Vec<String> = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "localhost",
    ]
    .map(String::from)
    .to_vec();
    let host = endpoint_host(&endpoint);
    match host.parse::<IpAddr>() {
        Ok(ip) => ips.push(ip),
        Err(_) if !host.is_empty() => names.push(host.to_string()),
        Err(_) => {}
    }
    let path = |name: &str| dir.join(name).display().to_string();
    let (ca_file, crt_file, key_file, sa_file) =
        (path(CA_FILE), path(CRT_FILE), path(KEY_FILE), path(SA_FILE));

    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        flags.insert(k.to_string(), v);
    };
    set("allow-privileged", "true".into());
    set("anonymous-auth", "false".into());
    set("api-audiences", endpoint.clone());
    set("advertise-address", node.ip.to_string());
    // Upstream binds 0.0.0.0; every simulated node shares the host.
    set("bind-address", node.ip.to_string());
    set("client-ca-file", ca_file);
    set("enable-admission-plugins", "NodeRestriction".into());
    set("enable-bootstrap-token-auth", "true".into());
    set("authorization-mode", "Node,RBAC".into());
    set("tls-min-version", "VersionTLS12".into());
    set("profiling", "false".into());
    set("etcd-servers", node.etcd_client_url());
    set("secure-port", PORT.to_string());
    set("service-account-issuer", endpoint);
    set("service-account-key-file", sa_file.clone());
    set("service-account-signing-key-file", sa_file);
    set("service-cluster-ip-range", "10.96.0.0/12".into());
    set("tls-cert-file", crt_file);
    set("tls-private-key-file", key_file);
    set(
        "kubelet-preferred-address-types",
        "InternalIP,ExternalIP,Hostname".into(),
    );
    set("cert-dir", dir.join("certs").display().to_string());

    if let Some(extra) = doc
        .get("cluster")
        .and_then(|c| c.get("apiServer"))
        .and_then(|a| a.get("extraArgs"))
        .and_then(Value::as_mapping)
    {
        for (key, value) in extra {
            let (Some(key), Some(value)) = (key.as_str(), scalar(value)) else {
                continue;
            };
            if DENIED.contains(&key) {
                return Err(format!("extra arg {key:?} is not allowed to be overridden"));
            }
            match flags.get_mut(key) {
                Some(current) if ADDITIVE.contains(&key) => {
                    current.push(',');
                    current.push_str(&value);
                }
                _ => {
                    flags.insert(key.to_string(), value);
                }
            }
        }
    }
    let args = flags
        .into_iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect();
    let secrets = Secrets {
        ca,
        ca_crt,
        sa_key,
        ips,
        names,
    };
    Ok((args, secrets))
}

/// A YAML scalar as the string an argument takes.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The host of an `https://HOST:PORT` endpoint (brackets of an IPv6
/// address removed).
fn endpoint_host(endpoint: &str) -> &str {
    let rest = endpoint.split("://").nth(1).unwrap_or(endpoint);
    let authority = rest.split('/').next().unwrap_or(rest);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_hosts() {
        assert_eq!(endpoint_host("https://10.0.0.1:6443"), "10.0.0.1");
        assert_eq!(endpoint_host("https://k8s.example:6443/"), "k8s.example");
        assert_eq!(endpoint_host("https://[fd00::1]:6443"), "fd00::1");
        assert_eq!(endpoint_host("https://k8s.example"), "k8s.example");
    }
}
