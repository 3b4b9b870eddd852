//! The issuer rules against the field reports' configurations on both
//! versions: one moves the endpoint from https://10.0.0.21:6443 to the VIP
//! https://10.0.0.20:6443 (with a Layer2VIPConfig), the other (moving the
//! control plane to new machines) from the bare IP to a DNS name.

use super::*;
use crate::ops::secret_paths::{changed_secrets, guard_paths};

const OLD_EP: &str = "https://10.0.0.21:6443";
const VIP_EP: &str = "https://10.0.0.20:6443";
const DNS_EP: &str = "https://k8s.example.net:6443";
// base64 of two distinct PEM bodies (not real keys: only compared).
const KEY_1: &str = "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUFBQQotLS0tLUVORCBFQyBQUklWQVRFIEtFWS0tLS0tCg==";
const KEY_2: &str = "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUJCQgotLS0tLUVORCBFQyBQUklWQVRFIEtFWS0tLS0tCg==";
const PEM_1: &str =
    "-----BEGIN EC PRIVATE KEY-----\n      MHcCAQEEIAAA\n      -----END EC PRIVATE KEY-----";
const VIP: &str =
    "---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.0.0.20\nlink: ens18\n";

/// A v1alpha1 document: role, endpoint, `cluster.serviceAccount.key` (or
/// none), and extra API server arguments (YAML lines under extraArgs).
fn v1(role: &str, endpoint: &str, key: Option<&str>, extra: &[&str]) -> String {
    let mut s = format!(
        "version: v1alpha1\nmachine:\n  type: {role}\n  token: mt\ncluster:\n  clusterName: homelab\n  \
         controlPlane:\n    endpoint: {endpoint}\n"
    );
    if let Some(key) = key {
        s.push_str(&format!("  serviceAccount:\n    key: {key}\n"));
    }
    if !extra.is_empty() {
        s.push_str("  apiServer:\n    extraArgs:\n");
        for line in extra {
            s.push_str(&format!("      {line}\n"));
        }
    }
    s
}

/// A `KubeServiceAccountConfig` document (the VIP field report's pin, with the key
/// 1.14 requires).
fn sa_doc(issuer: &str, accepted_issuers: &[&str], audiences: &[&str]) -> String {
    let mut s = format!(
        "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  issuerURL: {issuer}\n  \
         privateKey: |\n    {PEM_1}\n"
    );
    if !accepted_issuers.is_empty() || !audiences.is_empty() {
        s.push_str("accepted:\n");
        if !accepted_issuers.is_empty() {
            s.push_str(&format!("  issuers: [{}]\n", accepted_issuers.join(", ")));
        }
        if !audiences.is_empty() {
            s.push_str(&format!("  audiences: [{}]\n", audiences.join(", ")));
        }
    }
    s
}

fn docs(s: &str) -> Documents {
    Documents::parse(s.as_bytes()).unwrap_or_else(|e| panic!("{e}\n{s}"))
}

fn judge(version: &str, old: &str, new: &str, allowed: &[MachineRole]) -> Result<String, Refusal> {
    let old = docs(old);
    IssuerCheck {
        node: "10.0.0.21",
        version,
        role: MachineRole::of(&old),
        allowed,
    }
    .judge("controlplane.yaml", &old, &docs(new))
    .map(|judged| {
        // Only an allowed change carries what it drops.
        assert_eq!(
            judged.allowed_loss.is_empty(),
            !judged.note.contains("ALLOWED"),
            "{}",
            judged.note
        );
        judged.note
    })
}

const V13: &str = "v1.13.9";
const V14: &str = "v1.14.0";

struct Case {
    name: &'static str,
    version: &'static str,
    old: String,
    new: String,
    allowed: Vec<MachineRole>,
    /// `Ok(text in the note)` or `Err(text in the refusal)`.
    want: Result<&'static str, &'static str>,
}

fn cases() -> Vec<Case> {
    let cp = |ep: &str, extra: &[&str]| v1("controlplane", ep, Some(KEY_1), extra);
    let pin_both = [
        "service-account-issuer: https://10.0.0.21:6443",
        "api-audiences: https://10.0.0.21:6443",
    ];
    let cp14 = |ep: &str| v1("controlplane", ep, None, &[]);
    vec![
        Case {
            name: "1.13.9: endpoint change, issuer and audiences pinned by extraArgs",
            version: V13,
            old: cp(OLD_EP, &[]),
            new: cp(DNS_EP, &pin_both),
            allowed: vec![],
            want: Ok("keeps every issuer, audience and key"),
        },
        Case {
            name: "1.14: endpoint change pinned by KubeServiceAccountConfig",
            version: V14,
            old: cp14(OLD_EP) + &sa_doc(OLD_EP, &[], &[]),
            new: cp14(VIP_EP) + &sa_doc(OLD_EP, &[], &[]) + VIP,
            allowed: vec![],
            want: Ok("signing issuer https://10.0.0.21:6443"),
        },
        Case {
            name: "1.13.9: KubeServiceAccountConfig is not registered",
            version: V13,
            old: cp(OLD_EP, &[]),
            new: cp(VIP_EP, &[]) + &sa_doc(OLD_EP, &[], &[]) + VIP,
            allowed: vec![MachineRole::Controlplane],
            want: Err(
                "runs Talos v1.13.9, which refuses controlplane.yaml: \"KubeServiceAccountConfig\" \"v1alpha1\": not registered",
            ),
        },
        Case {
            name: "1.13.9: issuer pinned without audiences",
            version: V13,
            old: cp(OLD_EP, &[]),
            new: cp(DNS_EP, &pin_both[..1]),
            allowed: vec![],
            want: Err(
                "the API audience(s) https://10.0.0.21:6443 would no longer be accepted (audiences after: https://k8s.example.net:6443)",
            ),
        },
        Case {
            name: "1.13.9: unpinned endpoint change",
            version: V13,
            old: cp(OLD_EP, &[]),
            new: cp(DNS_EP, &[]),
            allowed: vec![],
            want: Err("the issuer(s) https://10.0.0.21:6443 would no longer be accepted"),
        },
        Case {
            name: "1.14: unpinned endpoint change (legacy v1alpha1 service account)",
            version: V14,
            old: cp(OLD_EP, &[]),
            new: cp(VIP_EP, &[]) + VIP,
            allowed: vec![],
            want: Err(
                "10.0.0.21 (Talos v1.14.0, controlplane): the issuer(s) https://10.0.0.21:6443",
            ),
        },
        Case {
            name: "worker with endpoint change: not judged",
            version: V13,
            old: v1("worker", OLD_EP, Some(KEY_1), &[]),
            new: v1("worker", DNS_EP, Some(KEY_1), &[]),
            allowed: vec![],
            want: Ok("runs no API server"),
        },
        Case {
            name: "1.13.9: replaced service-account key",
            version: V13,
            old: cp(OLD_EP, &[]),
            new: v1("controlplane", OLD_EP, Some(KEY_2), &[]),
            allowed: vec![],
            want: Err("the service-account key(s) sha256:"),
        },
        Case {
            name: "1.14: new issuer, old one kept among the accepted issuers and audiences",
            version: V14,
            old: cp14(OLD_EP) + &sa_doc(OLD_EP, &[], &[]),
            new: cp14(VIP_EP) + &sa_doc(VIP_EP, &[OLD_EP], &[VIP_EP, OLD_EP]) + VIP,
            allowed: vec![],
            want: Ok("accepted issuers https://10.0.0.20:6443, https://10.0.0.21:6443"),
        },
        Case {
            name: "1.14: new issuer, old issuer accepted but its audience dropped",
            version: V14,
            old: cp14(OLD_EP) + &sa_doc(OLD_EP, &[], &[]),
            new: cp14(VIP_EP) + &sa_doc(VIP_EP, &[OLD_EP], &[]),
            allowed: vec![],
            want: Err("the API audience(s) https://10.0.0.21:6443 would no longer be accepted"),
        },
        Case {
            name: "allowed for the control plane",
            version: V13,
            old: cp(OLD_EP, &[]),
            new: cp(DNS_EP, &[]),
            allowed: vec![MachineRole::Controlplane],
            want: Ok("ALLOWED for role controlplane"),
        },
        Case {
            name: "allowed for workers only does not cover the control plane",
            version: V13,
            old: cp(OLD_EP, &[]),
            new: cp(DNS_EP, &[]),
            allowed: vec![MachineRole::Worker],
            want: Err("would no longer be accepted"),
        },
        Case {
            name: "1.14: KubeServiceAccountConfig next to cluster.serviceAccount",
            version: V14,
            old: cp(OLD_EP, &[]),
            new: cp(OLD_EP, &[]) + &sa_doc(OLD_EP, &[], &[]),
            allowed: vec![],
            want: Err(
                "service account is already set in v1alpha1 config (.cluster.serviceAccount)",
            ),
        },
    ]
}

#[test]
fn issuer_rules_per_version_and_role() {
    let mut failures = Vec::new();
    for case in cases() {
        let got = judge(case.version, &case.old, &case.new, &case.allowed);
        let ok = match (&got, case.want) {
            (Ok(note), Ok(want)) => note.contains(want),
            (Err(refusal), Err(want)) => refusal.to_string().contains(want),
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{}:\n  want {:?}\n  got  {:?}",
                case.name,
                case.want,
                got.map_err(|e| e.to_string())
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn refusals_name_the_node_the_version_and_the_pin_for_that_version() {
    let old = v1("controlplane", OLD_EP, Some(KEY_1), &[]);
    let new = v1("controlplane", DNS_EP, Some(KEY_1), &[]);
    let on_13 = judge(V13, &old, &new, &[]).unwrap_err().to_string();
    assert!(
        on_13.starts_with("10.0.0.21 (Talos v1.13.9, controlplane): "),
        "{on_13}"
    );
    assert!(
        on_13.contains("both cluster.apiServer.extraArgs.service-account-issuer and api-audiences"),
        "{on_13}"
    );
    let on_14 = judge(V14, &old, &new, &[]).unwrap_err().to_string();
    assert!(
        on_14.contains(
            "KubeServiceAccountConfig document with issuer.issuerURL https://10.0.0.21:6443"
        ),
        "{on_14}"
    );
    // No key material in a message or note.
    let key = judge(
        V13,
        &old,
        &v1("controlplane", OLD_EP, Some(KEY_2), &[]),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(!key.contains(KEY_1) && !key.contains("MHcC"), "{key}");
}

#[test]
fn a_replaced_service_account_key_is_refused_unless_named() {
    let old = docs(&v1("controlplane", OLD_EP, Some(KEY_1), &[]));
    let new = docs(&v1("controlplane", OLD_EP, Some(KEY_2), &[]));
    let paths = old.changed_paths(&new);
    let secrets = changed_secrets(&old, &new);
    let whole: Vec<String> = vec!["cluster".into()];
    let err = guard_paths("10.0.0.21", "f.yaml", &paths, &secrets, &whole).unwrap_err();
    assert!(err.to_string().contains("cluster.serviceAccount"), "{err}");
    let named: Vec<String> = vec!["cluster.serviceAccount.key".into()];
    guard_paths("10.0.0.21", "f.yaml", &paths, &secrets, &named).unwrap();
}

#[test]
fn derivations_follow_argsbuilder_and_kube_apiserver() {
    // A list value is one flag per item: the first signs, all are accepted.
    let list = v1(
        "controlplane",
        DNS_EP,
        Some(KEY_1),
        &["service-account-issuer: [https://k8s.example.net:6443, https://10.0.0.21:6443]"],
    );
    let got = SaValidation::derive(&docs(&list), Derivation::V1_13).unwrap();
    assert_eq!(got.signing_issuer(), Some(DNS_EP));
    assert_eq!(got.issuers, [DNS_EP, OLD_EP]);
    // api-audiences is split on commas.
    let commas = v1("controlplane", DNS_EP, Some(KEY_1), &["api-audiences: a,b"]);
    let got = SaValidation::derive(&docs(&commas), Derivation::V1_13).unwrap();
    assert_eq!(got.audiences, ["a", "b"]);
    // An empty value drops the flag: the audiences are then the issuers.
    let empty = v1("controlplane", DNS_EP, Some(KEY_1), &["api-audiences: ''"]);
    let got = SaValidation::derive(&docs(&empty), Derivation::V1_13).unwrap();
    assert_eq!(got.audiences, [DNS_EP]);
    // 1.13.9 ignores nothing: it refuses the 1.14 kinds before deriving.
    let d = docs(&(v1("controlplane", OLD_EP, Some(KEY_1), &[]) + &sa_doc(OLD_EP, &[], &[])));
    assert!(unregistered(&d, Derivation::V1_13).is_some());
    assert!(unregistered(&d, Derivation::V1_14).is_none());
    assert_eq!(Derivation::of("v1.14.0-rc.1"), Derivation::V1_14);
    assert_eq!(Derivation::of("v1.13.9"), Derivation::V1_13);
}

#[test]
fn allow_issuer_change_reads_roles_and_the_earlier_bool() {
    #[derive(serde::Deserialize)]
    struct O {
        #[serde(deserialize_with = "roles_or_bool")]
        a: Vec<MachineRole>,
    }
    let roles: O = serde_json::from_str(r#"{"a":["controlplane"]}"#).unwrap();
    assert_eq!(roles.a, [MachineRole::Controlplane]);
    let legacy: O = serde_json::from_str(r#"{"a":true}"#).unwrap();
    assert_eq!(legacy.a, [MachineRole::Controlplane, MachineRole::Init]);
    let none: O = serde_json::from_str(r#"{"a":false}"#).unwrap();
    assert!(none.a.is_empty());
}
