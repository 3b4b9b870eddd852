//! A simulated cluster with a state directory, and `talosctl-rs ops` run
//! against it, for the operation tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use talos_test_support::cli::{Run, command};
use talos_test_support::sim::SimCluster;

pub struct Fixture {
    pub sim: SimCluster,
    pub state: tempfile::TempDir,
}

impl Fixture {
    pub async fn start(nodes: usize) -> Fixture {
        Fixture {
            sim: SimCluster::start(nodes).await,
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// A fixture whose simulator configuration `adjust` may change first.
    pub async fn start_with(
        nodes: usize,
        adjust: impl FnOnce(&mut talos_sim::SimConfig),
    ) -> Fixture {
        Fixture {
            sim: SimCluster::start_with(nodes, adjust).await,
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// A fixture whose control-plane nodes run a real kube-apiserver,
    /// ready on each of the `nodes`.
    pub async fn with_kubernetes(nodes: usize) -> Fixture {
        Fixture::with_kubernetes_and(nodes, |_| {}).await
    }

    /// As [`Fixture::with_kubernetes`], the simulator's configuration
    /// changed by `tweak` first.
    pub async fn with_kubernetes_and(
        nodes: usize,
        tweak: impl FnOnce(&mut talos_sim::SimConfig),
    ) -> Fixture {
        let f = Fixture {
            sim: SimCluster::start_with_kubernetes_and(nodes, tweak).await,
            state: tempfile::tempdir().unwrap(),
        };
        f.sim.wait_kubernetes_ready(nodes).await;
        f
    }

    /// The simulator's machine configuration with each `(from, to)`
    /// replaced, written to `name` in the state directory.
    pub fn config_with(&self, name: &str, edits: &[(&str, &str)]) -> PathBuf {
        let mut config =
            std::fs::read_to_string(self.sim.dir.path().join("controlplane.yaml")).unwrap();
        for (from, to) in edits {
            assert!(config.contains(from), "{from:?} not in the config");
            config = config.replace(from, to);
        }
        let path = self.state.path().join(name);
        std::fs::write(&path, config).unwrap();
        path
    }

    pub fn talosconfig(&self) -> PathBuf {
        self.sim.dir.path().join("talosconfig")
    }

    pub async fn ops(&self, args: &[&str]) -> Run {
        self.ops_with(&self.talosconfig(), args, None).await
    }

    /// `ops ARGS` with `--without-cluster-lock`: most of the simulated
    /// clusters run no Kubernetes to hold the cluster lock (where one does,
    /// the lock is taken all the same).
    pub async fn ops_with(&self, tc: &Path, args: &[&str], crash: Option<&str>) -> Run {
        let mut all = vec!["--without-cluster-lock"];
        all.extend_from_slice(args);
        self.ops_locked(tc, &all, crash).await
    }

    /// `ops ARGS` as given: the cluster lock is required unless ARGS say.
    pub async fn ops_locked(&self, tc: &Path, args: &[&str], crash: Option<&str>) -> Run {
        let mut cmd = command(tc);
        cmd.args(["-o", "json", "ops"])
            .arg("--state-dir")
            .arg(self.state.path())
            .args(args);
        if let Some(point) = crash {
            if !cfg!(feature = "test-hooks") {
                panic!(
                    "a crash test needs the CLI's test-only crash hook: \
                     run it with `--features test-hooks` (the test command does)"
                );
            }
            cmd.env("TALOSCTL_RS_TEST_CRASH", point);
        }
        let output = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The operations layer on the cluster and the state directory, as a
    /// library user opens it.
    pub fn open_ops(&self) -> talos_client::ops::Ops {
        use talos_client::config::{Overrides, TalosConfig};
        let path = self.talosconfig();
        let config = TalosConfig::read(&path).unwrap();
        let context = config.resolve(&Overrides::default(), &path).unwrap();
        let client = talos_client::Client::from_context(&context).unwrap();
        let mut ops = talos_client::ops::Ops::open(&context, client, self.state.path()).unwrap();
        ops.set_cluster_lock_policy(talos_client::ops::ClusterLockPolicy::AllowWithout);
        ops
    }

    /// A retire of node 2 planned (the cluster's lock held by the plan),
    /// and the survivor that is neither the target nor the snapshot's
    /// source: the one a fault can hit without touching either.
    pub async fn plan_retire_with_bystander(
        &self,
    ) -> (talos_client::ops::Ops, talos_client::ops::Plan, String) {
        use talos_client::ops::{Facts, OpSpec, RetireOptions};
        let target = self.sim.ip(2);
        let ops = self.open_ops();
        let plan = ops
            .plan(&OpSpec::Retire(RetireOptions::new(target.clone())))
            .await
            .unwrap();
        let Facts::Retire(facts) = &plan.facts else {
            panic!("retire facts")
        };
        let source = facts.source.as_ref().unwrap().address.clone();
        let bystander = (1..=3)
            .map(|i| self.sim.ip(i))
            .find(|ip| *ip != target && *ip != source)
            .unwrap();
        (ops, plan, bystander)
    }

    /// Voter names, sorted, as node `from` sees them.
    pub async fn voters(&self, from: usize) -> Vec<String> {
        let mut names: Vec<String> = self
            .sim
            .admin()
            .node(self.sim.ip(from))
            .etcd_member_list(false)
            .await
            .unwrap()
            .into_iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.hostname)
            .collect();
        names.sort();
        names
    }

    /// Member names and learner flags, as node 1 sees them.
    pub async fn members(&self) -> Vec<(String, bool)> {
        let mut members: Vec<_> = self
            .sim
            .admin()
            .node(self.sim.ip(1))
            .etcd_member_list(false)
            .await
            .unwrap()
            .into_iter()
            .map(|m| (m.hostname, m.is_learner))
            .collect();
        members.sort();
        members
    }
}

/// The operation id of the newest operation in the journal.
/// Starts `retire TARGET` and kills it right after the leave answered,
/// before the reset: the state a SIGKILL there leaves. Returns the
/// operation's id.
pub async fn retire_killed_after_leave(f: &Fixture, target: &str) -> String {
    let crashed = f
        .ops_with(
            &f.talosconfig(),
            &["--yes", "retire", target],
            Some("answered:leave"),
        )
        .await;
    assert_ne!(crashed.code, 0, "{}", crashed.stderr);
    newest(f).await["id"].as_str().unwrap().to_string()
}

pub async fn newest(f: &Fixture) -> serde_json::Value {
    let list = f.ops(&["list"]).await.ok().json();
    list[0].clone()
}
