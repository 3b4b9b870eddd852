#!/usr/bin/env bash
# The main job on a fresh machine: the seeds' night on a simulated
# three-node Talos control plane (real etcd members). Write data, take a
# verified snapshot with `ops snapshot`, retire one node with `ops retire`
# (snapshot, a fresh check, forfeit, leave, reset at once, wait until silent; each step and
# the leave-to-reset gap printed), then show the two voters left.
# Everything is written under a temporary directory (or $1), and the cluster
# is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo build --locked --release --workspace --bins

work="${1:-$(mktemp -d -t talos-demo-XXXXXX)}"
mkdir -p "$work"
sim="target/release/talos-sim"
ctl="target/release/talosctl-rs"

"$sim" up --isolated --nodes 3 --dir "$work/cluster" --json >"$work/sim.json" 2>"$work/sim.log" &
sim_pid=$!
trap 'kill -TERM $sim_pid 2>/dev/null; wait $sim_pid 2>/dev/null || true' EXIT

# Wait (up to two minutes) for the cluster to report itself.
for _ in $(seq 1 240); do
  [ -s "$work/sim.json" ] && break
  kill -0 "$sim_pid" 2>/dev/null || { cat "$work/sim.log" >&2; exit 1; }
  sleep 0.5
done
[ -s "$work/sim.json" ] || { echo "talos-sim did not start" >&2; cat "$work/sim.log" >&2; exit 1; }

tc="$work/cluster/talosconfig"
"$sim" fill "$work/cluster" --count 1000 --value-size 512 >/dev/null
echo "== cluster ($tc), 1000 keys written"
"$ctl" --talosconfig "$tc" etcd members
echo
"$ctl" --talosconfig "$tc" -n "$(python3 -c 'import json,sys; print(",".join(n["ip"] for n in json.load(open(sys.argv[1]))["nodes"]))' "$work/sim.json")" etcd status
echo
ops="$ctl --talosconfig $tc ops --state-dir $work/state"
echo "== ops snapshot: a verified snapshot from a healthy voter, keep the newest 3"
$ops snapshot --dir "$work/snapshots" --keep 3
echo
echo "== ops retire cp-3: the handover, step by step"
$ops --yes retire cp-3 --snapshot-dir "$work/snapshots"
echo
echo "== etcd members after the retire: two voters"
"$ctl" --talosconfig "$tc" etcd members
echo
echo "== the journal"
$ops list
echo
echo "snapshots in $work/snapshots, journal in $work/state"
