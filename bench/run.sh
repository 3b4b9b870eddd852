#!/usr/bin/env bash
# Side-by-side benchmarks, talosctl-rs against the Go tooling: command
# latency (`version`, `etcd members`) against a 3-node talos-sim, fan-out
# (`version` to 50 simulated nodes, 47 of them workers, against one), and a
# snapshot of about SIZE_MIB MiB (default 1024) beside the official Go
# client (tests/interop/cmd/benchdriver) and etcdctl. Medians of interleaved
# runs (LATENCY_RUNS, default 20; FANOUT_RUNS, default 100; SNAPSHOT_RUNS,
# default 5) are appended to
# bench/RESULTS.md. Needs Go and its module proxy for the Go client.
set -euo pipefail
cd "$(dirname "$0")/.."

size_mib="${SIZE_MIB:-1024}"
scripts/install-deps.sh
# The etcd the simulated nodes run (Talos 1.13.9's), with its etcdctl.
etcd_tools="$(dirname "$(scripts/etcd.sh v3.6.12)")"
cargo build --locked --release --workspace --bins
work="$(mktemp -d -t talos-bench-XXXXXX)"
sim_pid=""
cleanup() {
  if [ -n "$sim_pid" ]; then kill -TERM "$sim_pid" 2>/dev/null; wait "$sim_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

(cd tests/interop && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go build -o "$work/benchdriver" ./cmd/benchdriver)

target/release/talos-sim up --etcd-cache "$(dirname "$etcd_tools")" --isolated --nodes 3 --workers 47 --dir "$work/cluster" --json >"$work/sim.json" 2>"$work/sim.log" &
sim_pid=$!
for _ in $(seq 1 240); do
  [ -s "$work/sim.json" ] && break
  kill -0 "$sim_pid" 2>/dev/null || { cat "$work/sim.log" >&2; exit 1; }
  sleep 0.5
done
[ -s "$work/sim.json" ] || { echo "talos-sim did not start" >&2; exit 1; }
echo "filling etcd with ${size_mib} MiB..." >&2
target/release/talos-sim fill "$work/cluster" --count "$size_mib" --value-size 1048576 >&2

python3 - "$work" "$size_mib" "$etcd_tools/etcdctl" >"$work/bench.json" <<'PY'
import json, sys, subprocess
work, size, etcdctl = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sim = json.load(open(f"{work}/sim.json"))
node = sim["nodes"][0]
versions = "; ".join([
    subprocess.run(["target/release/talosctl-rs", "version", "--client", "--short"], capture_output=True, text=True).stdout.strip().splitlines()[-1].strip(),
    "official Go client " + open("tests/interop/go.mod").read().split("siderolabs/talos/pkg/machinery ")[1].split()[0],
    subprocess.run(["go", "version"], capture_output=True, text=True).stdout.strip(),
    subprocess.run([etcdctl, "version"], capture_output=True, text=True).stdout.strip().splitlines()[0],
])
json.dump({
    "work": work, "talosctl_rs": "target/release/talosctl-rs", "benchdriver": f"{work}/benchdriver",
    "talosconfig": f"{work}/cluster/talosconfig", "node": str(node["ip"]), "etcd_url": node["etcd_client_url"],
    "etcdctl": etcdctl, "pki": f"{work}/cluster/pki",
    "all_nodes": [str(n["ip"]) for n in sim["nodes"]],
    "latency_runs": 20, "snapshot_runs": 5, "snapshot_mib": size, "results": "bench/RESULTS.md",
    "versions": versions,
}, sys.stdout)
PY
SIM_PID="$sim_pid" python3 - "$work/bench.json" <<PY
import json, os, sys
cfg = json.load(open(sys.argv[1]))
cfg["latency_runs"] = int(os.environ.get("LATENCY_RUNS", "20"))
cfg["snapshot_runs"] = int(os.environ.get("SNAPSHOT_RUNS", "5"))
cfg["fanout_runs"] = int(os.environ.get("FANOUT_RUNS", "100"))
cfg["sim_pid"] = int(os.environ["SIM_PID"])
json.dump(cfg, open(sys.argv[1], "w"))
PY
python3 bench/bench.py "$work/bench.json"
