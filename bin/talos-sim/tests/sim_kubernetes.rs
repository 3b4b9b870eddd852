//! A real kube-apiserver on each simulated control-plane node (needs the
//! binary: `scripts/kube-apiserver.sh` builds it, about 4 minutes, and the
//! test command runs it). Reached with the admin kubeconfig the simulator
//! serves, through curl (OpenSSL), so the kubeconfig's ECDSA keys are
//! proven loadable by an OpenSSL-based client too.

use talos_test_support as common;

use std::time::Duration;

use base64::Engine as _;
use common::sim::{SimCluster, wait_for};
use talos_client::client::{ApplyMode, ApplyRequest};
use talos_sim::TalosVersion;
use talos_sim::node::Node;

async fn start(nodes: usize) -> SimCluster {
    start_on(nodes, TalosVersion::V1_13_9).await
}

async fn start_on(nodes: usize, version: TalosVersion) -> SimCluster {
    let binary = common::sim::kube_apiserver_binary();
    SimCluster::start_with(nodes, |cfg| {
        cfg.timing = talos_sim::TalosTiming::scaled_down(common::sim::timing_divisor());
        cfg.talos_version = version;
        cfg.kube_apiserver = Some(binary);
    })
    .await
}

/// The admin credentials of the kubeconfig a node serves, as files.
struct Admin {
    dir: tempfile::TempDir,
}

impl Admin {
    async fn of(sim: &SimCluster) -> Admin {
        let yaml = sim.admin().node(sim.ip(1)).kubeconfig().await.unwrap();
        let config: serde_json::Value = serde_norway::from_slice(&yaml).unwrap();
        let decode = |v: &serde_json::Value| {
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        for (name, value) in [
            (
                "ca.crt",
                &config["clusters"][0]["cluster"]["certificate-authority-data"],
            ),
            (
                "admin.crt",
                &config["users"][0]["user"]["client-certificate-data"],
            ),
            ("admin.key", &config["users"][0]["user"]["client-key-data"]),
        ] {
            std::fs::write(dir.path().join(name), decode(value)).unwrap();
        }
        Admin { dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// curl against `ip`'s API server: (HTTP status, body); status 0 when
    /// no connection was made.
    fn curl(
        &self,
        ip: &str,
        method: &str,
        path: &str,
        auth: Auth,
        body: Option<&str>,
    ) -> (u16, String) {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-s", "-m", "10", "-w", "\n%{http_code}", "-X", method])
            .args(["--cacert", &self.file("ca.crt")]);
        match auth {
            Auth::Admin => {
                cmd.args([
                    "--cert",
                    &self.file("admin.crt"),
                    "--key",
                    &self.file("admin.key"),
                ]);
            }
            Auth::Bearer(token) => {
                cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
            }
        }
        if let Some(body) = body {
            cmd.args(["-H", "Content-Type: application/json", "-d", body]);
        }
        let out = cmd
            .arg(format!("https://{ip}:6443{path}"))
            .output()
            .expect("curl runs (scripts/install-deps.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// A service-account token for a new service account `probe`, with the
    /// audiences the API server defaults to (its `api-audiences`).
    fn mint_token(&self, ip: &str) -> String {
        let (code, body) = self.curl(
            ip,
            "POST",
            "/api/v1/namespaces/default/serviceaccounts",
            Auth::Admin,
            Some(r#"{"metadata":{"name":"probe"}}"#),
        );
        assert_eq!(code, 201, "{body}");
        let (code, body) = self.curl(
            ip,
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/probe/token",
            Auth::Admin,
            Some(r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}"#),
        );
        assert_eq!(code, 201, "{body}");
        let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
        reply["status"]["token"].as_str().unwrap().to_string()
    }

    /// The status of a SelfSubjectReview made with `token`.
    fn review(&self, ip: &str, token: &str) -> u16 {
        self.curl(
            ip,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Auth::Bearer(token),
            Some(r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#),
        )
        .0
    }

    async fn wait_ready(&self, ip: &str) {
        wait_for(
            "kube-apiserver /readyz",
            Duration::from_secs(120),
            || async {
                let (code, body) = self.curl(ip, "GET", "/readyz", Auth::Admin, None);
                (code == 200 && body == "ok").then_some(())
            },
        )
        .await;
    }
}

#[derive(Clone, Copy)]
enum Auth<'a> {
    Admin,
    Bearer(&'a str),
}

#[tokio::test]
async fn kubernetes_answers_readyz_on_every_control_plane_node_and_stops_with_the_node() {
    let sim = start(3).await;
    let admin = Admin::of(&sim).await;
    for i in 1..=3 {
        admin.wait_ready(&sim.ip(i)).await;
    }
    // Flags as Talos 1.13.9 derives them: issuer and audiences are the
    // endpoint, etcd is the node's own member.
    let node = sim.cluster.node("cp-2").unwrap();
    let args = node.kube_apiserver_args().unwrap();
    let endpoint = format!("https://{}:6443", sim.ip(1));
    for flag in [
        format!("--service-account-issuer={endpoint}"),
        format!("--api-audiences={endpoint}"),
        format!("--etcd-servers={}", node.etcd_client_url()),
    ] {
        assert!(args.contains(&flag), "{flag} not in {args:?}");
    }

    // A leave stops etcd and leaves the API server running: it still
    // accepts connections, with no etcd behind it (the field reports' surprise).
    sim.wait_etcd_healthy(3).await;
    let pid = node.kube_apiserver_pid().unwrap();
    sim.admin()
        .node(sim.ip(2))
        .etcd_leave_cluster()
        .await
        .unwrap();
    wait_for(
        "cp-2's /readyz to fail",
        Duration::from_secs(60),
        || async {
            let (code, _) = admin.curl(&sim.ip(2), "GET", "/readyz", Auth::Admin, None);
            (code != 200 && code != 0).then_some(())
        },
    )
    .await;
    assert_eq!(
        node.kube_apiserver_pid(),
        Some(pid),
        "still running after the leave"
    );
    let (code, _) = admin.curl(&sim.ip(2), "GET", "/livez", Auth::Admin, None);
    assert_ne!(code, 0, "cp-2's API server still accepts connections");

    // Powered off, it is gone.
    sim.cluster.power_off(&sim.ip(3)).await.unwrap();
    let node3 = sim.cluster.node("cp-3").unwrap();
    assert_eq!(node3.kube_apiserver_pid(), None);
    let (code, _) = admin.curl(&sim.ip(3), "GET", "/readyz", Auth::Admin, None);
    assert_eq!(code, 0, "nothing listens on a powered-off node");
}

/// A service-account token issued before an endpoint change, checked after
/// the change with SelfSubjectReview, through the simulator's own
/// configuration flow (an apply restarts the API server with the flags
/// the new configuration gives, as Talos 1.13.9 does): unpinned, 401; the
/// issuer pinned but not the audiences, 401; both pinned, 201.
#[tokio::test]
async fn kubernetes_tokens_across_an_endpoint_change_on_1_13_9() {
    let sim = start(1).await;
    let admin = Admin::of(&sim).await;
    let ip = sim.ip(1);
    admin.wait_ready(&ip).await;
    let token = admin.mint_token(&ip);
    let review = |admin: &Admin| admin.review(&ip, &token);
    assert_eq!(review(&admin), 201, "the token works before the change");

    let node = sim.cluster.node("cp-1").unwrap();
    let old = format!("https://{ip}:6443");
    let base = node.active_config();
    let changed = base.replace(
        &format!("endpoint: {old}"),
        "endpoint: https://new.example:6443",
    );
    assert_ne!(changed, base);
    let pinned = |extra: &str| {
        changed.replace(
            "  clusterName: talos-sim\n",
            &format!("  clusterName: talos-sim\n  apiServer:\n    extraArgs:\n{extra}"),
        )
    };
    let cases = [
        ("unpinned", changed.clone(), 401),
        (
            "issuer pinned",
            pinned(&format!("      service-account-issuer: {old}\n")),
            401,
        ),
        (
            "issuer and audiences pinned",
            pinned(&format!(
                "      service-account-issuer: {old}\n      api-audiences: {old}\n"
            )),
            201,
        ),
    ];
    for (name, config, expected) in cases {
        let before = node.kube_apiserver_pid();
        sim.admin()
            .apply_configuration(ApplyRequest::new(config, ApplyMode::NoReboot))
            .await
            .unwrap();
        wait_restarted(&node, before, name).await;
        admin.wait_ready(&ip).await;
        assert_eq!(review(&admin), expected, "{name}");
    }

    // 1.13.9 has no KubeServiceAccountConfig: its loader refuses the kind,
    // and the running server is left alone.
    let before = node.kube_apiserver_pid();
    let err = sim
        .admin()
        .apply_configuration(ApplyRequest::new(
            format!(
                "{changed}{}",
                service_account_document(&old, &[], &[], "unused")
            ),
            ApplyMode::NoReboot,
        ))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not registered"), "{err}");
    assert_eq!(node.kube_apiserver_pid(), before);
}

/// The values of every `--FLAG=` in `args`, in order.
fn flag_values(args: &[String], flag: &str) -> Vec<String> {
    let prefix = format!("--{flag}=");
    args.iter()
        .filter_map(|a| a.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// `config` without its KubeServiceAccountConfig document. Documents are
/// split at lines that are exactly `---`: a PEM key's `-----END ...-----`
/// line ends with `---` too.
fn without_service_account(config: &str) -> String {
    let mut documents = vec![String::new()];
    for line in config.split_inclusive('\n') {
        if line.trim_end() == "---" {
            documents.push(String::new());
        }
        documents
            .last_mut()
            .expect("one document at least")
            .push_str(line);
    }
    let count = documents.len();
    let kept: Vec<String> = documents
        .into_iter()
        .filter(|doc| !doc.contains("kind: KubeServiceAccountConfig\n"))
        .collect();
    assert_eq!(kept.len() + 1, count, "{config}");
    kept.concat()
}

/// A KubeServiceAccountConfig document signing with `key` (PEM) as
/// `issuer`, accepting `issuers` and `audiences` (none: left out).
fn service_account_document(
    issuer: &str,
    issuers: &[&str],
    audiences: &[&str],
    key: &str,
) -> String {
    let mut doc = format!(
        "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  issuerURL: {issuer}\n  privateKey: |\n"
    );
    for line in key.lines() {
        doc.push_str(&format!("    {line}\n"));
    }
    if !issuers.is_empty() || !audiences.is_empty() {
        doc.push_str("accepted:\n");
    }
    for (field, values) in [("issuers", issuers), ("audiences", audiences)] {
        if !values.is_empty() {
            doc.push_str(&format!("  {field}:\n"));
            for value in values {
                doc.push_str(&format!("    - {value}\n"));
            }
        }
    }
    doc
}

/// Applies `config` (no reboot), checks the API server restarted and
/// waits until it is ready again.
async fn apply_restarting(
    sim: &SimCluster,
    admin: &Admin,
    node: &Node,
    name: &str,
    config: String,
) {
    let before = node.kube_apiserver_pid();
    sim.admin()
        .apply_configuration(ApplyRequest::new(config, ApplyMode::NoReboot))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    wait_restarted(node, before, name).await;
    admin.wait_ready(&node.ip.to_string()).await;
}

/// Checks that the API server `before` (if one ran) still runs right
/// after the apply (kubelet restarts the static pod at its next poll, not
/// at once), then waits for the new one.
async fn wait_restarted(node: &Node, before: Option<u32>, name: &str) {
    if before.is_some() {
        assert_eq!(
            node.kube_apiserver_pid(),
            before,
            "{name}: restarted before kubelet's next poll"
        );
    }
    wait_for(
        &format!("{name}: the API server restarted with new flags"),
        Duration::from_secs(60),
        || async { (node.kube_apiserver_pid().is_some_and(|p| Some(p) != before)).then_some(()) },
    )
    .await;
}

/// On 1.14 the service account is a KubeServiceAccountConfig document's
/// (Talos 1.14's control_plane_final.go repeats `--service-account-issuer`,
/// the document's issuer URL first and then each accepted issuer, and
/// gives `--api-audiences` the accepted audiences, the issuer URL when
/// none are listed). A token minted under the old endpoint survives an
/// endpoint change when the document keeps the old issuer URL, and is
/// rejected when there is no document (`cluster.serviceAccount`: issuer
/// and audience the new endpoint) or when the old issuer is accepted but
/// the audiences default to the new URL; accepting the old audience too
/// lets it through again.
#[tokio::test]
async fn kubernetes_tokens_across_an_endpoint_change_on_1_14_follow_kube_service_account_config() {
    let sim = start_on(1, TalosVersion::V1_14_0).await;
    let admin = Admin::of(&sim).await;
    let ip = sim.ip(1);
    let node = sim.cluster.node("cp-1").unwrap();
    assert_eq!(node.talos_version(), TalosVersion::V1_14_0);
    // The 1.14 profile's configuration carries the service-account
    // document `talosctl gen config` writes; this test brings its own.
    let base = without_service_account(&node.active_config());

    let key = talos_sim::pki::generate_ec_key_pem().unwrap();
    let old = format!("https://{ip}:6443");
    let new = "https://new.example:6443";
    apply_restarting(
        &sim,
        &admin,
        &node,
        "the document with the endpoint as issuer",
        format!("{base}{}", service_account_document(&old, &[], &[], &key)),
    )
    .await;
    let args = node.kube_apiserver_args().unwrap();
    assert_eq!(flag_values(&args, "service-account-issuer"), [old.as_str()]);
    assert_eq!(flag_values(&args, "api-audiences"), [old.as_str()]);
    let verify = flag_values(&args, "service-account-key-file");
    assert!(
        verify.len() == 1 && verify[0].ends_with("/service-account.pub"),
        "{args:?}"
    );
    let token = admin.mint_token(&ip);
    assert_eq!(
        admin.review(&ip, &token),
        201,
        "the token works before the change"
    );

    let changed = base.replace(&format!("endpoint: {old}"), &format!("endpoint: {new}"));
    assert_ne!(changed, base);
    let legacy = {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD.encode(&key);
        changed.replace(
            "  clusterName: talos-sim\n",
            &format!("  clusterName: talos-sim\n  serviceAccount:\n    key: {key}\n"),
        )
    };
    assert_ne!(legacy, changed);
    let with = |issuer: &str, issuers: &[&str], audiences: &[&str]| {
        format!(
            "{changed}{}",
            service_account_document(issuer, issuers, audiences, &key)
        )
    };
    let old = old.as_str();
    // (name, configuration, issuers, audiences, review status)
    type Case<'a> = (&'a str, String, &'a [&'a str], &'a [&'a str], u16);
    let cases: [Case; 4] = [
        (
            "no document: cluster.serviceAccount, the new endpoint",
            legacy,
            &[new],
            &[new],
            401,
        ),
        (
            "the document keeps the old issuer URL",
            with(old, &[], &[]),
            &[old],
            &[old],
            201,
        ),
        (
            "the new issuer URL, the old one accepted, audiences left out",
            with(new, &[old], &[]),
            &[new, old],
            &[new],
            401,
        ),
        (
            "the new issuer URL, the old one and its audience accepted",
            with(new, &[old], &[new, old]),
            &[new, old],
            &[new, old],
            201,
        ),
    ];
    for (name, config, issuers, audiences, expected) in cases {
        apply_restarting(&sim, &admin, &node, name, config).await;
        let args = node.kube_apiserver_args().unwrap();
        assert_eq!(
            flag_values(&args, "service-account-issuer"),
            issuers,
            "{name}: {args:?}"
        );
        assert_eq!(
            flag_values(&args, "api-audiences"),
            audiences,
            "{name}: {args:?}"
        );
        assert_eq!(admin.review(&ip, &token), expected, "{name}");
    }
}
