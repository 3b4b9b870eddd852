//! A real kube-apiserver on each simulated control-plane node, run as Talos
//! runs its static pod, when the simulator is given the binary
//! ([`crate::SimConfig::kube_apiserver`]).
//!
//! Its flags come from the node's running configuration as the Talos
//! release the node runs derives them. On 1.13.9
//! (internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go,
//! manageAPIServer): `service-account-issuer` and `api-audiences` both the
//! control-plane endpoint, the service-account key from
//! `cluster.serviceAccount`. On 1.14 (internal/app/machined/pkg/controllers/
//! k8s/control_plane_final.go, fed by secrets/root.go's KubernetesRoot):
//! the service account comes from a `KubeServiceAccountConfig` document
//! when there is one (pkg/machinery/config/types/k8s/service_account.go),
//! else from `cluster.serviceAccount` with the endpoint as issuer and
//! audience (the v1alpha1 bridge, types/v1alpha1/v1alpha1_k8s_bridge.go);
//! `service-account-issuer` is repeated, the issuer URL first and then
//! every accepted issuer, `api-audiences` lists the accepted audiences (the
//! issuer URL when none are given), and tokens are verified with the
//! issuing key and every accepted public key. Both: client certificates
//! checked against the Kubernetes CA `cluster.ca`, a serving certificate
//! issued by it, and `cluster.apiServer.extraArgs` merged by argsbuilder's
//! policies (most flags replaced, a few appended to, the file and etcd
//! flags never overridden). Its etcd is the node's own member, as Talos
//! points it at the local etcd. It listens on the node's address, port
//! 6443.
//!
//! It starts when the node has booted as a configured control plane,
//! restarts when an applied configuration changes its flags or its
//! service-account keys (at kubelet's next poll of the static pods,
//! [`crate::TalosTiming::static_pod_poll`] later: the old API server keeps
//! answering until then), and stops when the node goes down (reboot, reset,
//! power off). A leave stops etcd and leaves it running, answering without
//! etcd behind it.
//!
//! Not simulated: the aggregator and kubelet-client certificates, audit and
//! admission configuration files, encryption at rest, and 1.14's other
//! flag changes (TLS 1.3 minimum, structured authentication config).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_norway::Value;

use crate::diff::MachineConfig;
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
    /// A restart waits for kubelet's next poll.
    restart_pending: std::sync::atomic::AtomicBool,
}

struct Running {
    args: Vec<String>,
    /// The service-account keys it was started with.
    keys: String,
    child: Child,
}

impl KubeApiServer {
    pub(crate) fn new(binary: Option<PathBuf>) -> KubeApiServer {
        KubeApiServer {
            binary,
            running: Mutex::new(None),
            restart_pending: std::sync::atomic::AtomicBool::new(false),
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
/// plane (started, or restarted when it died; when its flags or keys
/// changed, restarted at kubelet's next poll), and stopped otherwise.
pub(crate) fn reconcile(node: &Arc<Node>) {
    reconcile_now(node, false);
}

fn reconcile_now(node: &Arc<Node>, polled: bool) {
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
        && matches!(running.child.try_wait(), Ok(None))
    {
        if running.args == args && running.keys == secrets.keys() {
            return;
        }
        if !polled {
            // kubelet sees the new static pod at its next poll; until then
            // the old API server answers with the old flags. The poll
            // derives the flags again (a rollback may have undone them).
            if !kube.restart_pending.swap(true, Ordering::SeqCst) {
                let node = node.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(node.timing.static_pod_poll).await;
                    node.kube_apiserver
                        .restart_pending
                        .store(false, Ordering::SeqCst);
                    reconcile_now(&node, true);
                });
            }
            return;
        }
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
            crate::kube_controllers::create_default_accounts(node);
            let keys = secrets.keys();
            *slot = Some(Running { args, keys, child });
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
/// serving certificate issued by it, the service-account signing key and
/// (1.14) the keys tokens are verified with.
struct Secrets {
    ca: Ca,
    /// The etcd CA, which issues the API server's etcd client certificate.
    etcd: std::sync::Arc<crate::etcd_tls::EtcdPki>,
    ca_crt: String,
    sa_key: String,
    sa_pub: Option<String>,
    ips: Vec<IpAddr>,
    names: Vec<String>,
}

const CA_FILE: &str = "ca.crt";
const CRT_FILE: &str = "apiserver.crt";
const KEY_FILE: &str = "apiserver.key";
const SA_FILE: &str = "service-account.key";
const SA_PUB_FILE: &str = "service-account.pub";
const ETCD_CA_FILE: &str = "etcd-client-ca.crt";
/// `etcd-client.crt` and `etcd-client.key`.
const ETCD_CLIENT: &str = "etcd-client";

impl Secrets {
    fn write(&self, dir: &Path) -> Result<(), String> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let serving = self
            .ca
            .issue(&LeafSpec::server(&self.ips, &names))
            .map_err(|e| format!("serving certificate: {e}"))?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut files = vec![
            (CA_FILE, &self.ca_crt),
            (CRT_FILE, &serving.cert_pem),
            (KEY_FILE, &serving.key_pem),
            (SA_FILE, &self.sa_key),
        ];
        if let Some(public) = &self.sa_pub {
            files.push((SA_PUB_FILE, public));
        }
        let etcd_ca = self.etcd.ca_pem().to_string();
        files.push((ETCD_CA_FILE, &etcd_ca));
        for (name, body) in files {
            let path = dir.join(name);
            talos_client::write_private_file(&path, body.as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        self.etcd
            .write_client(dir, ETCD_CLIENT, "kube-apiserver")
            .map_err(|e| format!("etcd client certificate: {e}"))?;
        Ok(())
    }

    /// The service-account keys, which a running server keeps until it
    /// restarts (upstream restarts the static pod when its secrets change).
    fn keys(&self) -> String {
        format!(
            "{}\n{}",
            self.sa_key,
            self.sa_pub.as_deref().unwrap_or_default()
        )
    }
}

/// The service account the API server signs and verifies tokens for.
struct ServiceAccount {
    /// The signing key (PEM).
    signing_key: String,
    /// 1.14: the keys tokens are verified with (PEM, concatenated); 1.13.9
    /// verifies with the signing key.
    verifying_keys: Option<String>,
    /// `service-account-issuer`: the issuer tokens are signed as, then the
    /// other issuers accepted.
    issuers: Vec<String>,
    /// `api-audiences`.
    audiences: Vec<String>,
}

/// The kind of the 1.14 service-account document.
const SERVICE_ACCOUNT_KIND: &str = "KubeServiceAccountConfig";

/// 1.14's service account, as the container answers for it
/// (pkg/machinery/config/container/container.go, K8sServiceAccountConfig):
/// the first `KubeServiceAccountConfig` document (types/k8s/
/// service_account.go), else `cluster.serviceAccount` as the v1alpha1
/// bridge presents it (types/v1alpha1/v1alpha1_k8s_bridge.go), else none,
/// and then there is no KubernetesRoot and no API server
/// (internal/app/machined/pkg/controllers/secrets/root.go).
fn service_account_1_14(config: &MachineConfig, endpoint: &str) -> Result<ServiceAccount, String> {
    let Some(doc) = config
        .documents
        .iter()
        .find(|d| text(d, &["kind"]).as_deref() == Some(SERVICE_ACCOUNT_KIND))
    else {
        let key = pem(&config.v1alpha1, &["cluster", "serviceAccount", "key"])
            .map_err(|e| format!("{e}, and no {SERVICE_ACCOUNT_KIND} document"))?;
        return Ok(ServiceAccount {
            verifying_keys: Some(public_half(&key)),
            signing_key: key,
            issuers: vec![endpoint.to_string()],
            audiences: vec![endpoint.to_string()],
        });
    };
    let field = |path: &[&str]| {
        text(doc, path).ok_or_else(|| format!("no {SERVICE_ACCOUNT_KIND} .{}", path.join(".")))
    };
    let signing_key = field(&["issuer", "privateKey"])?;
    let issuer = field(&["issuer", "issuerURL"])?;
    let accepted = |key: &str| texts(doc, &["accepted", key]);
    // The issuer's own public key first, then the accepted ones.
    let mut verifying = public_half(&signing_key);
    for key in accepted("publicKeys") {
        if !verifying.ends_with('\n') {
            verifying.push('\n');
        }
        verifying.push_str(&key);
    }
    let mut issuers = vec![issuer.clone()];
    issuers.extend(accepted("issuers"));
    let mut audiences = accepted("audiences");
    if audiences.is_empty() {
        audiences.push(issuer);
    }
    Ok(ServiceAccount {
        signing_key,
        verifying_keys: Some(verifying),
        issuers,
        audiences,
    })
}

/// A block for `service-account-key-file` that verifies what `private_pem`
/// signs: its public key where rcgen reads the key (PKCS#8), else the
/// private key itself, whose public half kube-apiserver takes (client-go
/// keyutil reads SEC 1 EC and PKCS#1 RSA private keys as public keys).
fn public_half(private_pem: &str) -> String {
    if private_pem.contains("-----BEGIN PRIVATE KEY-----")
        && let Ok(key) = rcgen::KeyPair::from_pem(private_pem)
    {
        return key.public_key_pem();
    }
    private_pem.to_string()
}

/// The string at `path` in `doc`.
fn text(doc: &Value, path: &[&str]) -> Option<String> {
    let mut v = doc;
    for key in path {
        v = v.get(*key)?;
    }
    v.as_str().map(str::to_string)
}

/// The strings of the list at `path` in `doc` (none when absent).
fn texts(doc: &Value, path: &[&str]) -> Vec<String> {
    path.iter()
        .try_fold(doc, |v, key| v.get(*key))
        .and_then(Value::as_sequence)
        .map(|items| items.iter().filter_map(scalar).collect())
        .unwrap_or_default()
}

/// The PEM base64-encoded at `path` in the v1alpha1 document.
fn pem(doc: &Value, path: &[&str]) -> Result<String, String> {
    let encoded = text(doc, path).ok_or_else(|| format!("no .{}", path.join(".")))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|e| format!(".{}: {e}", path.join(".")))?;
    String::from_utf8(bytes).map_err(|_| format!(".{} is not PEM", path.join(".")))
}

/// The flags the node's configuration gives, and the secrets a start
/// writes into `dir` (nothing is written here).
fn prepare(node: &Node, dir: &Path) -> Result<(Vec<String>, Secrets), String> {
    let config = crate::diff::parse(node.active_config().as_bytes())
        .map_err(|e| format!("machine config: {}", e.message()))?;
    let doc = &config.v1alpha1;
    let endpoint = text(doc, &["cluster", "controlPlane", "endpoint"])
        .ok_or("no .cluster.controlPlane.endpoint")?;
    let ca_crt = pem(doc, &["cluster", "ca", "crt"])?;
    let ca = Ca::load(&ca_crt, &pem(doc, &["cluster", "ca", "key"])?)
        .map_err(|e| format!(".cluster.ca: {e}"))?;
    let sa = if node.talos_version().at_least_1_14() {
        service_account_1_14(&config, &endpoint)?
    } else {
        ServiceAccount {
            signing_key: pem(doc, &["cluster", "serviceAccount", "key"])?,
            verifying_keys: None,
            issuers: vec![endpoint.clone()],
            audiences: vec![endpoint.clone()],
        }
    };

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
    let sa_verify_file = match sa.verifying_keys {
        Some(_) => path(SA_PUB_FILE),
        None => sa_file.clone(),
    };

    // Each flag's values, one `--flag=value` apiece (argsbuilder's Args).
    let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        flags.insert(k.to_string(), vec![v]);
    };
    set("allow-privileged", "true".into());
    set("anonymous-auth", "false".into());
    set("advertise-address", node.ip.to_string());
    // Upstream binds 0.0.0.0; every simulated node shares the host.
    set("bind-address", node.ip.to_string());
    set("client-ca-file", ca_file);
    set("enable-admission-plugins", "NodeRestriction".into());
    set("enable-bootstrap-token-auth", "true".into());
    set("authorization-mode", "Node,RBAC".into());
    // 1.14 asks for TLS 1.3 and lets no extraArgs change it
    // (control_plane_final.go); 1.13.9 for TLS 1.2.
    let tls13 = node.talos_version().at_least_1_14();
    set(
        "tls-min-version",
        if tls13 {
            "VersionTLS13"
        } else {
            "VersionTLS12"
        }
        .into(),
    );
    set("profiling", "false".into());
    set("etcd-servers", node.etcd_client_url());
    set("etcd-cafile", path(ETCD_CA_FILE));
    set("etcd-certfile", path(&format!("{ETCD_CLIENT}.crt")));
    set("etcd-keyfile", path(&format!("{ETCD_CLIENT}.key")));
    set("secure-port", PORT.to_string());
    set("service-account-key-file", sa_verify_file);
    set("service-account-signing-key-file", sa_file);
    set("service-cluster-ip-range", "10.96.0.0/12".into());
    set("tls-cert-file", crt_file);
    set("tls-private-key-file", key_file);
    set(
        "kubelet-preferred-address-types",
        "InternalIP,ExternalIP,Hostname".into(),
    );
    set("cert-dir", dir.join("certs").display().to_string());
    flags.insert("api-audiences".into(), sa.audiences);
    flags.insert("service-account-issuer".into(), sa.issuers);

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
            if DENIED.contains(&key) || (tls13 && key == "tls-min-version") {
                return Err(format!("extra arg {key:?} is not allowed to be overridden"));
            }
            match flags.get_mut(key) {
                Some(current) if ADDITIVE.contains(&key) => {
                    let joined = format!("{},{value}", current.join(","));
                    *current = vec![joined];
                }
                // Replaced, every value of a repeated flag included.
                _ => {
                    flags.insert(key.to_string(), vec![value]);
                }
            }
        }
    }
    let args = flags
        .into_iter()
        .flat_map(|(k, values)| values.into_iter().map(move |v| format!("--{k}={v}")))
        .collect();
    let secrets = Secrets {
        ca,
        etcd: node.etcd_pki.clone(),
        ca_crt,
        sa_key: sa.signing_key,
        sa_pub: sa.verifying_keys,
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
pub(crate) fn endpoint_host(endpoint: &str) -> &str {
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

    const ENDPOINT: &str = "https://new.example:6443";

    fn config(service_account: Option<&str>, document: Option<&str>) -> MachineConfig {
        use base64::Engine as _;
        let mut yaml = format!(
            "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  controlPlane:\n    endpoint: {ENDPOINT}\n"
        );
        if let Some(key) = service_account {
            let key = base64::engine::general_purpose::STANDARD.encode(key);
            yaml.push_str(&format!("  serviceAccount:\n    key: {key}\n"));
        }
        if let Some(document) = document {
            yaml.push_str("---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\n");
            yaml.push_str(document);
        }
        crate::diff::parse(yaml.as_bytes()).unwrap()
    }

    fn indented(pem: &str) -> String {
        pem.lines().map(|l| format!("    {l}\n")).collect()
    }

    #[test]
    fn the_1_14_document_gives_the_issuers_in_order_and_its_audiences() {
        let key = crate::pki::generate_ec_key_pem().unwrap();
        let accepted = rcgen::KeyPair::generate().unwrap().public_key_pem();
        let document = format!(
            "issuer:\n  issuerURL: {ENDPOINT}\n  privateKey: |\n{}accepted:\n  \
             publicKeys:\n    - |\n{}  issuers:\n    - https://old.example:6443\n    - https://older.example:6443\n  \
             audiences:\n    - {ENDPOINT}\n    - https://old.example:6443\n",
            indented(&key),
            indented(&accepted).replace("    ", "      "),
        );
        let sa = service_account_1_14(&config(None, Some(&document)), ENDPOINT).unwrap();
        assert_eq!(
            sa.issuers,
            [
                ENDPOINT,
                "https://old.example:6443",
                "https://older.example:6443"
            ]
        );
        assert_eq!(sa.audiences, [ENDPOINT, "https://old.example:6443"]);
        assert_eq!(sa.signing_key, key);
        assert_eq!(sa.verifying_keys.unwrap(), format!("{key}{accepted}"));
    }

    #[test]
    fn the_1_14_document_without_audiences_accepts_its_issuer_url() {
        let key = crate::pki::generate_ec_key_pem().unwrap();
        let old = "https://old.example:6443";
        let document = format!(
            "issuer:\n  issuerURL: {old}\n  privateKey: |\n{}",
            indented(&key)
        );
        let sa = service_account_1_14(&config(None, Some(&document)), ENDPOINT).unwrap();
        assert_eq!(sa.issuers, [old]);
        assert_eq!(sa.audiences, [old]);
    }

    #[test]
    fn without_the_document_1_14_takes_cluster_service_account_and_the_endpoint() {
        let key = crate::pki::generate_ec_key_pem().unwrap();
        let sa = service_account_1_14(&config(Some(&key), None), ENDPOINT).unwrap();
        assert_eq!(sa.issuers, [ENDPOINT]);
        assert_eq!(sa.audiences, [ENDPOINT]);
        assert_eq!(sa.verifying_keys.as_deref(), Some(key.as_str()));
        let err = service_account_1_14(&config(None, None), ENDPOINT).err();
        assert_eq!(
            err.as_deref(),
            Some("no .cluster.serviceAccount.key, and no KubeServiceAccountConfig document")
        );
    }

    #[test]
    fn a_pkcs8_signing_key_is_verified_with_its_public_key() {
        let pkcs8 = rcgen::KeyPair::generate().unwrap();
        assert_eq!(public_half(&pkcs8.serialize_pem()), pkcs8.public_key_pem());
        let sec1 = crate::pki::generate_ec_key_pem().unwrap();
        assert_eq!(public_half(&sec1), sec1);
    }
}
