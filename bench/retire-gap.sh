#!/usr/bin/env bash
# Leave-to-reset gap: how long a retired control-plane node keeps running
# with no etcd behind its API server. Interleaved runs, each on a fresh
# simulated 3-node cluster: `talosctl-rs ops retire` (the gap it reports:
# from the leave's answer to the reset being accepted), and the same two
# steps scripted as two CLI commands (`etcd leave`, then `reset`; the gap
# from the first command's exit to the second's). Appends the medians and
# their ratio to bench/RESULTS.md. RUNS (default 5) sets the run count.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${RUNS:-5}"
scripts/install-deps.sh
cargo build --locked --release --workspace --bins
sim=target/release/talos-sim
ctl=target/release/talosctl-rs
work="$(mktemp -d -t talos-gap-XXXXXX)"
sim_pid=""
stop() {
  if [ -n "$sim_pid" ]; then kill -TERM "$sim_pid" 2>/dev/null; wait "$sim_pid" 2>/dev/null || true; fi
  sim_pid=""
}
trap 'stop; rm -rf "$work"' EXIT

start() {
  rm -rf "$work/c" "$work/sim.json"
  "$sim" up --isolated --nodes 3 --dir "$work/c" --json >"$work/sim.json" 2>"$work/sim.log" &
  sim_pid=$!
  for _ in $(seq 1 240); do
    [ -s "$work/sim.json" ] && return 0
    kill -0 "$sim_pid" 2>/dev/null || break
    sleep 0.25
  done
  cat "$work/sim.log" >&2
  exit 1
}

ops=()
scripted=()
for i in $(seq 1 "$runs"); do
  start
  gap=$("$ctl" --talosconfig "$work/c/talosconfig" -o json ops --state-dir "$work/state-$i" --yes retire cp-3 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["facts"]["leave_to_reset_gap_ms"])')
  ops+=("$(printf '%.1f' "$gap")")
  stop

  start
  node=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][2]["ip"])' "$work/sim.json")
  "$ctl" --talosconfig "$work/c/talosconfig" -n "$node" etcd leave >/dev/null
  t0=$(date +%s%N)
  "$ctl" --talosconfig "$work/c/talosconfig" -n "$node" reset --graceful=false --reboot=false \
    --system-labels-to-wipe STATE --system-labels-to-wipe EPHEMERAL --wait=false >/dev/null 2>&1
  t1=$(date +%s%N)
  scripted+=("$(python3 -c "print(f'{($t1 - $t0) / 1e6:.1f}')")")
  stop
  echo "run $i: ops retire ${ops[-1]} ms, two commands ${scripted[-1]} ms" >&2
done

read -r med_ops med_scripted ratio < <(python3 - "${ops[*]}" "${scripted[*]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{ma:.1f} {mb:.1f} {ma / mb:.2f}")
PY
)
echo "median gap: ops retire $med_ops ms, two commands $med_scripted ms (ratio $ratio)"
{
  echo
  echo "## Leave-to-reset gap ($(date -u +%Y-%m-%d), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $runs interleaved runs)"
  echo
  echo "\`RUNS=$runs bench/retire-gap.sh\`: each run a fresh simulated 3-node cluster; the retired node is cp-3."
  echo "Target: median at most 20 ms for \`ops retire\`."
  echo
  echo "| how | median gap | runs (ms) |"
  echo "|-----|------------|-----------|"
  echo "| \`talosctl-rs ops retire\` | $med_ops ms | ${ops[*]} |"
  echo "| \`etcd leave\`, then \`reset\` (two commands) | $med_scripted ms | ${scripted[*]} |"
  echo "| ratio | $ratio | |"
} >>bench/RESULTS.md
