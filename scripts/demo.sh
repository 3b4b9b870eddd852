#!/usr/bin/env bash
# The main job on a fresh machine: moving the control plane to new
# machines, on a simulated three-node Talos control plane (real etcd
# members, a real kube-apiserver and KubePrism on each node). Write data,
# take a verified snapshot with
# `ops snapshot`, retire one node with `ops retire` (snapshot, a fresh
# check, forfeit, leave, reset at once, wait until silent; each step and
# the leave-to-reset gap printed) while three leader-elected controllers
# renew their leases through KubePrism, then show the two voters left and
# the renewals the controllers lost (expected: none).
# Then, on a second cluster, the surprises of doing it by hand: the same
# handover typed as `etcd leave`, a pause, `reset` (the controllers lose
# leases), and an endpoint change whose issuer is not pinned, rolled back
# by `ops apply`'s token check although the issuer guard was overridden.
# Everything is written under a temporary directory (or $1), and the
# clusters are stopped at the end. The first run builds kube-apiserver
# (scripts/kube-apiserver.sh, about 4 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

work="${1:-$(mktemp -d -t talos-demo-XXXXXX)}"
mkdir -p "$work"
# An earlier run's files (its clusters' reports among them) would be taken
# for this run's.
if [ -n "$(ls -A "$work")" ]; then
  echo "$work is not empty: give a new or empty directory" >&2
  exit 2
fi

scripts/install-deps.sh
kube="$(scripts/kube-apiserver.sh)"
cargo build --locked --release --workspace --bins

sim="target/release/talos-sim"
ctl="target/release/talosctl-rs"
pids=()
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done' EXIT

# up NAME: a simulated cluster in $work/NAME, reported in $work/NAME.json.
up() {
  "$sim" up --isolated --nodes 3 --kube-apiserver "$kube" --dir "$work/$1" --json >"$work/$1.json" 2>"$work/$1.log" &
  pids+=($!)
  # Wait (up to two minutes) for the cluster to report itself.
  for _ in $(seq 1 240); do
    [ -s "$work/$1.json" ] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.5
  done
  echo "talos-sim did not start" >&2
  cat "$work/$1.log" >&2
  exit 1
}

# ip NAME I: the address of node I (1-based) of cluster NAME.
ip() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][int(sys.argv[2]) - 1]["ip"])' "$work/$1.json" "$2"
}

# controllers NAME: three stand-in controllers renewing leases through node
# 1's KubePrism (renew deadline 3 s), once the API takes them.
controllers() {
  "$sim" controllers "$work/$1" --renew-deadline 3 >"$work/$1-controllers.json" 2>"$work/$1-controllers.log" &
  ctl_pid=$!
  pids+=("$ctl_pid")
  for _ in $(seq 1 600); do
    grep -q renewing "$work/$1-controllers.log" 2>/dev/null && { cat "$work/$1-controllers.log"; return 0; }
    kill -0 "$ctl_pid" 2>/dev/null || break
    sleep 0.5
  done
  cat "$work/$1-controllers.log" >&2
  exit 1
}

# lost NAME: stops the controllers and says what they lost.
lost() {
  kill -TERM "$ctl_pid"
  wait "$ctl_pid" || true
  python3 - "$work/$1-controllers.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("controllers through {}: {} renewals, {} failed (a lease lost each), longest {:.1f} s without one".format(
    r["through"], r["renewed"], r["failed_renewals"], r["longest_gap_ms"] / 1000))
PY
}

up cluster
tc="$work/cluster/talosconfig"
"$sim" fill "$work/cluster" --count 1000 --value-size 512 >/dev/null
echo "== cluster ($tc), 1000 keys written"
"$ctl" --talosconfig "$tc" etcd members
echo
"$ctl" --talosconfig "$tc" -n "$(python3 -c 'import json,sys; print(",".join(n["ip"] for n in json.load(open(sys.argv[1]))["nodes"]))' "$work/cluster.json")" etcd status
echo
ops="$ctl --talosconfig $tc ops --state-dir $work/state"
echo "== ops snapshot: a verified snapshot from a healthy voter, keep the newest 3"
$ops snapshot --dir "$work/snapshots" --keep 3
echo
echo "== leader-elected controllers behind cp-1's KubePrism"
controllers cluster
echo
echo "== ops retire cp-3: the handover, step by step (a lease probe through cp-1's KubePrism)"
$ops --yes retire cp-3 --snapshot-dir "$work/snapshots" \
  --lease-probe "https://$(ip cluster 1):7445" --lease-probe-tls-server-name localhost --lease-probe-deadline 3s
echo
echo "== what the controllers lost to ops retire (expected: nothing)"
lost cluster
echo
echo "== etcd members after the retire: two voters"
"$ctl" --talosconfig "$tc" etcd members
echo
echo "== the journal"
$ops list
echo
echo "== the surprises of doing it by hand, on a second cluster"
up by-hand
tc2="$work/by-hand/talosconfig"
old="$(ip by-hand 3)"
controllers by-hand
echo "\$ talosctl-rs -n $old etcd leave; (5 s to read the output); talosctl-rs -n $old reset ..."
"$ctl" --talosconfig "$tc2" -n "$old" etcd leave
sleep 5
"$ctl" --talosconfig "$tc2" -n "$old" reset --system-labels-to-wipe STATE --system-labels-to-wipe EPHEMERAL \
  --reboot=false --graceful=false --wait=false
echo "== what the controllers lost to the hand-typed handover"
lost by-hand
echo
first="$(ip by-hand 1)"
echo "== ops apply: an endpoint change with the issuer not pinned, the issuer guard overridden"
sed "s#endpoint: https://$first:6443#endpoint: https://k8s.example:6443#" "$work/by-hand/controlplane.yaml" >"$work/endpoint.yaml"
if "$ctl" --talosconfig "$tc2" ops --state-dir "$work/state-by-hand" --yes -n "$first" apply -f "$work/endpoint.yaml" \
  --expect-change cluster.controlPlane.endpoint --allow-issuer-change controlplane --try-timeout 60s; then
  echo "the token check did not catch it" >&2
  exit 1
fi
echo
echo "snapshots in $work/snapshots, journals in $work/state and $work/state-by-hand"
