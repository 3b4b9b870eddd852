//! `ops apply`'s Kubernetes check where Kubernetes is there but cannot be
//! checked, against the simulator's real kube-apiserver: a node that
//! serves no kubeconfig (machined failing to generate it) refuses the apply
//! before anything is sent, and `--skip-kube-check` applies without the
//! check, journaled as such.

mod ops_fixture;

use ops_fixture::Fixture;

#[tokio::test]
async fn kubernetes_an_unfetchable_kubeconfig_refuses_the_apply_unless_skipped() {
    let f = Fixture::with_kubernetes(1).await;
    let ip = f.sim.ip(1);
    let node = f.sim.cluster.node("cp-1").unwrap();
    let before = node.active_config();
    let file = f.config_with("sans.yaml", &[("certSANs: []", "certSANs: [vip.example]")]);
    let file = file.to_str().unwrap();
    node.withhold_kubeconfig(true);

    let apply = |extra: &'static [&'static str]| {
        let mut args = vec![
            "--yes",
            "-n",
            ip.as_str(),
            "apply",
            "-f",
            file,
            "--expect-change",
            "machine.certSANs",
            "--try-timeout",
            "15s",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let args = apply(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = f.ops(&args).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    for expected in [
        "serves no kubeconfig",
        "while Kubernetes is there",
        "nothing was sent (--skip-kube-check applies without the Kubernetes check)",
    ] {
        assert!(
            run.stderr.contains(expected),
            "{expected:?} not in:\n{}",
            run.stderr
        );
    }
    assert_eq!(node.active_config(), before, "nothing was applied");
    assert!(!node.rollback_pending());

    // Told to, it applies without the check, and says so in the plan, the
    // journaled options and the try step.
    let args = apply(&["--skip-kube-check"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let record = f.ops(&args).await.ok().json();
    assert_eq!(record["state"], "succeeded", "{record}");
    let params: serde_json::Value = record["params"].clone();
    assert_eq!(params["kube_check"], false, "{params}");
    let try_detail = record["steps"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        try_detail.contains("the Kubernetes check was skipped (--skip-kube-check)"),
        "{try_detail}"
    );
    assert!(node.active_config().contains("vip.example"));
}
