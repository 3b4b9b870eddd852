#!/usr/bin/env bash
# Lease renewals lost to a control-plane handover (the surprise of moving the control plane to new machines by hand): an
# API server whose etcd left keeps accepting connections, and controllers
# behind KubePrism that renew through it lose their leases until it stops.
# Interleaved runs, each on a fresh simulated 3-node cluster with a real
# kube-apiserver and KubePrism on every node, three stand-in controllers
# (`talos-sim controllers`, renew deadline 3 s, retry 0.6 s) renewing
# through cp-1's KubePrism while cp-3 is retired:
#   - by `talosctl-rs ops retire cp-3` (the reset follows the leave within
#     milliseconds);
#   - by hand, as the field report typed it: `etcd leave`, a pause of PAUSE seconds
#     (default 5) to read the output, then `reset`.
# Appends the failed renewals and the longest time without a renewal, as
# medians and their ratio, to bench/RESULTS.md. RUNS (default 5) sets the
# run count.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${RUNS:-5}"
pause="${PAUSE:-5}"
scripts/install-deps.sh
kube="$(scripts/kube-apiserver.sh)"
cargo build --locked --release --workspace --bins
sim=target/release/talos-sim
ctl=target/release/talosctl-rs
work="$(mktemp -d -t talos-lease-XXXXXX)"
sim_pid=""
ctl_pid=""
stop() {
  for p in $ctl_pid $sim_pid; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  sim_pid=""
  ctl_pid=""
}
trap 'stop; rm -rf "$work"' EXIT

start() {
  rm -rf "$work/c" "$work/sim.json" "$work/controllers.json" "$work/controllers.log"
  "$sim" up --isolated --nodes 3 --kube-apiserver "$kube" --dir "$work/c" --json >"$work/sim.json" 2>"$work/sim.log" &
  sim_pid=$!
  for _ in $(seq 1 240); do
    [ -s "$work/sim.json" ] && break
    kill -0 "$sim_pid" 2>/dev/null || { cat "$work/sim.log" >&2; exit 1; }
    sleep 0.25
  done
  "$sim" controllers "$work/c" --renew-deadline 3 >"$work/controllers.json" 2>"$work/controllers.log" &
  ctl_pid=$!
  for _ in $(seq 1 1200); do
    grep -q renewing "$work/controllers.log" 2>/dev/null && return 0
    kill -0 "$ctl_pid" 2>/dev/null || break
    sleep 0.25
  done
  cat "$work/controllers.log" >&2
  exit 1
}

# Stops the controllers (in this shell: they are its child) and sets
# $failed and $gap from what they printed.
result() {
  kill -TERM "$ctl_pid"
  wait "$ctl_pid" || true
  ctl_pid=""
  read -r failed gap < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["failed_renewals"], round(r["longest_gap_ms"] / 1000, 2))' "$work/controllers.json")
}

ops_failed=()
ops_gap=()
hand_failed=()
hand_gap=()
for i in $(seq 1 "$runs"); do
  start
  "$ctl" --talosconfig "$work/c/talosconfig" ops --state-dir "$work/state-$i" --yes retire cp-3 >/dev/null
  result
  ops_failed+=("$failed")
  ops_gap+=("$gap")
  stop

  start
  node=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][2]["ip"])' "$work/sim.json")
  "$ctl" --talosconfig "$work/c/talosconfig" -n "$node" etcd leave >/dev/null
  sleep "$pause"
  "$ctl" --talosconfig "$work/c/talosconfig" -n "$node" reset --graceful=false --reboot=false \
    --system-labels-to-wipe STATE --system-labels-to-wipe EPHEMERAL --wait=false >/dev/null 2>&1
  result
  hand_failed+=("$failed")
  hand_gap+=("$gap")
  stop
  echo "run $i: ops retire ${ops_failed[-1]} failed, longest ${ops_gap[-1]} s; by hand ${hand_failed[-1]} failed, longest ${hand_gap[-1]} s" >&2
done

read -r mof mhf mog mhg ratio < <(python3 - "${ops_failed[*]}" "${hand_failed[*]}" "${ops_gap[*]}" "${hand_gap[*]}" <<'PY'
import statistics, sys
of, hf, og, hg = ([float(x) for x in a.split()] for a in sys.argv[1:5])
mog, mhg = statistics.median(og), statistics.median(hg)
print(f"{statistics.median(of):g} {statistics.median(hf):g} {mog:.2f} {mhg:.2f} {mog / mhg:.2f}")
PY
)
echo "median failed renewals: ops retire $mof, by hand $mhf; longest without a renewal: $mog s vs $mhg s (ratio $ratio)"
{
  echo
  echo "## Lease renewals lost to a handover ($(date -u +%Y-%m-%d), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $runs interleaved runs)"
  echo
  echo "\`RUNS=$runs bench/lease-renewals.sh\`: each run a fresh simulated 3-node cluster with kube-apiserver and KubePrism;"
  echo "three controllers (renew deadline 3 s, retry 0.6 s) renew through cp-1's KubePrism while cp-3 is retired."
  echo "A failed renewal is a lease lost. Target: 0 for \`ops retire\`."
  echo
  echo "| how | median failed renewals | runs | median longest gap | runs (s) |"
  echo "|-----|------------------------|------|--------------------|----------|"
  echo "| \`talosctl-rs ops retire cp-3\` | $mof | ${ops_failed[*]} | $mog s | ${ops_gap[*]} |"
  echo "| \`etcd leave\`, ${pause} s pause, \`reset\` (by hand) | $mhf | ${hand_failed[*]} | $mhg s | ${hand_gap[*]} |"
  echo "| ratio (longest gap) | | | $ratio | |"
} >>bench/RESULTS.md
