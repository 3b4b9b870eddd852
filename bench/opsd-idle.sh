#!/usr/bin/env bash
# talos-opsd at rest and its API latency: the daemon with two simulated
# clusters configured (no schedule ticking during the window), its RSS and
# CPU seconds over DURATION seconds (default 60) of idleness, then the wall
# time of `talosctl-rs ops list` through the socket against `--local` on the
# same journal (median of RUNS calls, default 20; process start included in
# both). Appends a line to RESULTS (default bench/RESULTS.md). PROFILE picks
# the build (default release).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

duration="${DURATION:-60}"
runs="${RUNS:-20}"
profile="${PROFILE:-release}"
results="${RESULTS:-bench/RESULTS.md}"
scripts/install-deps.sh
if [ "$profile" = release ]; then
  cargo build --locked --release -p talos-sim -p talos-opsd -p talosctl-rs
else
  cargo build --locked -p talos-sim -p talos-opsd -p talosctl-rs
fi
bin="target/$profile"
work="$(mktemp -d -t talos-opsd-bench-XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

for c in a b; do
  "$bin/talos-sim" up --isolated --nodes 1 --dir "$work/$c" --json >"$work/$c.json" 2>"$work/$c.log" &
  pids+=($!)
done
for c in a b; do
  for _ in $(seq 1 240); do [ -s "$work/$c.json" ] && break; sleep 0.25; done
  [ -s "$work/$c.json" ] || { cat "$work/$c.log" >&2; exit 1; }
done

cat >"$work/opsd.toml" <<TOML
state_dir = "$work/state"
socket = "$work/opsd.sock"
[[cluster]]
# Both simulated talosconfigs call their context "sim": the CLI finds a
# cluster by its context's name, so this one carries that name.
name = "sim"
talosconfig = "$work/a/talosconfig"
[cluster.snapshots]
interval = "1d"
[[cluster]]
name = "b"
talosconfig = "$work/b/talosconfig"
[cluster.snapshots]
interval = "1d"
TOML
"$bin/talos-opsd" --config "$work/opsd.toml" 2>"$work/opsd.log" &
opsd=$!
pids+=("$opsd")
for _ in $(seq 1 120); do [ -S "$work/opsd.sock" ] && break; sleep 0.25; done
[ -S "$work/opsd.sock" ] || { cat "$work/opsd.log" >&2; exit 1; }

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$opsd/stat"; }
before=$(cpu)
sleep "$duration"
after=$(cpu)
rss_kib=$(awk '/^VmRSS/ {print $2}' "/proc/$opsd/status")
cpu_s=$(python3 -c "print(f'{($after - $before) / $ticks:.2f}')")

median_ms() {
  local samples=()
  for _ in $(seq 1 "$runs"); do
    t0=$(date +%s%N)
    "$@" >/dev/null
    t1=$(date +%s%N)
    samples+=("$(( (t1 - t0) / 1000 ))")
  done
  python3 -c 'import statistics,sys; print(f"{statistics.median(map(int, sys.argv[1:])) / 1000:.1f}")' "${samples[@]}"
}
ctl=("$bin/talosctl-rs" --talosconfig "$work/a/talosconfig" ops)
daemon_ms=$(median_ms "${ctl[@]}" --socket "$work/opsd.sock" list)
local_ms=$(median_ms "${ctl[@]}" --local --state-dir "$work/state" list)

line="| $(date -u +%Y-%m-%d) | 2 clusters, $profile build | RSS $((rss_kib / 1024)) MiB, CPU ${cpu_s} s over ${duration} s | \`ops list\` via socket ${daemon_ms} ms, --local ${local_ms} ms (median of ${runs}) |"
echo "$line"
echo "$line" >>"$results"
