//! What a run draws from its seed: the cluster, the operation, the faults
//! and when they strike. The same seed, run number and filters give the
//! same draws, whatever the machine does (`--seed S --run K` replays).

use serde::Serialize;

use crate::TalosVersion;

/// A small deterministic generator (SplitMix64): the campaign needs
/// reproducible draws, not cryptographic ones.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for run `run` of a campaign seeded with `seed`.
    pub fn for_run(seed: u64, run: u64) -> Rng {
        let mut mix = Rng(seed);
        let a = mix.next_u64();
        Rng(a ^ Rng(run.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64())
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A value in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// An operation a run exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// `ops snapshot`.
    Snapshot,
    /// `ops retire` of a control-plane node.
    Retire,
    /// `ops migrate` from a control-plane node to a new machine.
    Migrate,
    /// `ops join` of a new machine.
    Join,
    /// `ops apply` of a change the nodes take in place (certSANs).
    ApplyHarmless,
    /// `ops apply` of an endpoint change that breaks every token
    /// (allowed past the issuer guard: the token check must roll it back).
    ApplyBreaking,
    /// `ops upgrade` of the control plane.
    Upgrade,
    /// `ops defrag --all`.
    Defrag,
    /// `ops restore` of a cluster that lost every member's data.
    Restore,
    /// `ops drill` of a snapshot in a directory.
    Drill,
}

impl OpKind {
    /// Every operation, in the order the campaign names them.
    pub const ALL: [OpKind; 10] = [
        OpKind::Snapshot,
        OpKind::Retire,
        OpKind::Migrate,
        OpKind::Join,
        OpKind::ApplyHarmless,
        OpKind::ApplyBreaking,
        OpKind::Upgrade,
        OpKind::Defrag,
        OpKind::Restore,
        OpKind::Drill,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Snapshot => "snapshot",
            OpKind::Retire => "retire",
            OpKind::Migrate => "migrate",
            OpKind::Join => "join",
            OpKind::ApplyHarmless => "apply",
            OpKind::ApplyBreaking => "apply-breaking",
            OpKind::Upgrade => "upgrade",
            OpKind::Defrag => "defrag",
            OpKind::Restore => "restore",
            OpKind::Drill => "drill",
        }
    }

    /// Whether talos-opsd runs it (the daemon variant).
    pub fn daemon_runs(self) -> bool {
        !matches!(self, OpKind::Restore | OpKind::Drill)
    }
}

/// A fault a run may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of the operation's process (the CLI, or the daemon), then
    /// `ops resume` (or a restart of the daemon, whose recovery resumes).
    Kill,
    /// A control-plane node's etcd frozen for a while.
    Freeze,
    /// A control-plane node's API cut off for a while.
    Partition,
    /// A node powered off for good.
    PowerOff,
    /// The target's next EtcdLeaveCluster lands late.
    DelayLeave,
    /// A node's next upgrade boots its old partition.
    UpgradeBootsOld,
    /// A node's next upgrade never comes back.
    UpgradeNeverBack,
    /// A second admin host (another state directory, another certificate)
    /// starts an operation on the same cluster.
    SecondAdmin,
    /// A new machine takes the address of the node the operation reset.
    FreshNode,
}

impl FaultKind {
    /// Every fault.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Kill,
        FaultKind::Freeze,
        FaultKind::Partition,
        FaultKind::PowerOff,
        FaultKind::DelayLeave,
        FaultKind::UpgradeBootsOld,
        FaultKind::UpgradeNeverBack,
        FaultKind::SecondAdmin,
        FaultKind::FreshNode,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Freeze => "freeze",
            FaultKind::Partition => "partition",
            FaultKind::PowerOff => "power-off",
            FaultKind::DelayLeave => "delay-leave",
            FaultKind::UpgradeBootsOld => "upgrade-boots-old",
            FaultKind::UpgradeNeverBack => "upgrade-never-back",
            FaultKind::SecondAdmin => "second-admin",
            FaultKind::FreshNode => "fresh-node",
        }
    }

    /// Whether it means anything for `op`.
    fn fits(self, op: OpKind) -> bool {
        match self {
            FaultKind::DelayLeave | FaultKind::FreshNode => {
                matches!(op, OpKind::Retire | OpKind::Migrate)
            }
            FaultKind::UpgradeBootsOld | FaultKind::UpgradeNeverBack => op == OpKind::Upgrade,
            _ => true,
        }
    }
}

/// Parses a comma-separated list of names against `all`.
pub fn parse_list<T: Copy>(
    text: &str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<Vec<T>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|word| {
            all.iter()
                .copied()
                .find(|k| name(*k) == word)
                .ok_or_else(|| {
                    let known: Vec<_> = all.iter().map(|k| name(*k)).collect();
                    format!("{word:?} is not one of {}", known.join(", "))
                })
        })
        .collect()
}

/// A fault as drawn: what, when (after the operation starts), where.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedFault {
    /// What.
    pub kind: FaultKind,
    /// When, in milliseconds after the operation's process started.
    pub at_ms: u64,
    /// The control-plane node it hits (its index among them, from 1),
    /// where it hits one.
    pub node: usize,
    /// How long it lasts (a freeze, a partition, a leave's delay), or how
    /// long a resume waits after a kill.
    pub hold_ms: u64,
    /// For a second admin: whether it starts a retire (of `node`) rather
    /// than a snapshot.
    pub retire: bool,
}

/// Everything a run draws.
#[derive(Debug, Clone, Serialize)]
pub struct Draw {
    /// Control-plane nodes.
    pub nodes: usize,
    /// Worker nodes.
    pub workers: usize,
    /// The Talos release the nodes run.
    #[serde(serialize_with = "version_tag")]
    pub version: TalosVersion,
    /// The operation.
    pub op: OpKind,
    /// The node it acts on (retire, migrate's old node, restore's), from 1.
    pub target: usize,
    /// For an apply: the nodes it applies to (from 1).
    pub apply_nodes: Vec<usize>,
    /// Run through talos-opsd instead of the CLI alone.
    pub daemon: bool,
    /// The faults, in the order they strike.
    pub faults: Vec<PlannedFault>,
}

fn version_tag<S: serde::Serializer>(v: &TalosVersion, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.tag())
}

/// How long after its start an operation is still worth hitting, by kind:
/// about as long as it runs on the simulator at a tenth of Talos's timings.
fn horizon_ms(op: OpKind, nodes: usize) -> u64 {
    match op {
        OpKind::Snapshot | OpKind::Drill => 3_000,
        OpKind::Retire => 8_000,
        OpKind::Migrate | OpKind::Join => 15_000,
        OpKind::ApplyHarmless | OpKind::ApplyBreaking => 12_000,
        OpKind::Upgrade => 6_000 * nodes as u64,
        OpKind::Defrag => 4_000,
        OpKind::Restore => 10_000,
    }
}

impl Draw {
    /// Run `run`'s draws for a campaign seeded with `seed`, among `ops` and
    /// `faults` (each not empty).
    pub fn new(seed: u64, run: u64, ops: &[OpKind], faults: &[FaultKind]) -> Draw {
        let mut rng = Rng::for_run(seed, run);
        let op = rng.pick(ops);
        let nodes = if rng.chance(25) { 5 } else { 3 };
        let workers = if rng.chance(20) { 1 } else { 0 };
        let version = if rng.chance(40) {
            TalosVersion::V1_14_0
        } else {
            TalosVersion::V1_13_9
        };
        let target = rng.between(1, nodes as u64) as usize;
        let mut apply_nodes: Vec<usize> = (1..=nodes).filter(|_| rng.chance(50)).collect();
        if apply_nodes.is_empty() {
            apply_nodes.push(target);
        }
        apply_nodes.truncate(2);
        let daemon = op.daemon_runs() && rng.chance(25);
        let fitting: Vec<FaultKind> = faults.iter().copied().filter(|f| f.fits(op)).collect();
        let count = if fitting.is_empty() {
            0
        } else {
            rng.pick(&[0, 1, 1, 2, 2, 3])
        };
        let horizon = horizon_ms(op, nodes);
        let mut planned: Vec<PlannedFault> = (0..count)
            .map(|_| {
                let kind = rng.pick(&fitting);
                PlannedFault {
                    kind,
                    at_ms: match kind {
                        // Armed before anything is sent.
                        FaultKind::DelayLeave
                        | FaultKind::UpgradeBootsOld
                        | FaultKind::UpgradeNeverBack => 0,
                        _ => rng.below(horizon),
                    },
                    node: rng.between(1, nodes as u64) as usize,
                    hold_ms: rng.between(500, 8_000),
                    retire: rng.chance(50),
                }
            })
            .collect();
        planned.sort_by_key(|f| f.at_ms);
        Draw {
            nodes,
            workers,
            version,
            op,
            target,
            apply_nodes,
            daemon,
            faults: planned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_and_run_draw_the_same() {
        let a = Draw::new(7, 3, &OpKind::ALL, &FaultKind::ALL);
        let b = Draw::new(7, 3, &OpKind::ALL, &FaultKind::ALL);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        let ops: std::collections::BTreeSet<_> = (0..200)
            .map(|run| Draw::new(7, run, &OpKind::ALL, &FaultKind::ALL).op)
            .collect();
        assert_eq!(ops.len(), OpKind::ALL.len(), "every operation is drawn");
    }

    #[test]
    fn faults_fit_their_operation() {
        for run in 0..200 {
            let d = Draw::new(1, run, &[OpKind::Snapshot], &FaultKind::ALL);
            assert!(d.faults.iter().all(|f| f.kind.fits(OpKind::Snapshot)));
            assert!(d.faults.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        }
    }

    #[test]
    fn lists_parse_and_name_the_unknown() {
        assert_eq!(
            parse_list("retire,upgrade", &OpKind::ALL, OpKind::name).unwrap(),
            [OpKind::Retire, OpKind::Upgrade]
        );
        let e = parse_list("retire,nope", &OpKind::ALL, OpKind::name).unwrap_err();
        assert!(e.contains("\"nope\""), "{e}");
    }
}
