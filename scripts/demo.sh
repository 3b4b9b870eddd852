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
# The retire holds the cluster lock (the Lease
# kube-system/talos-client-operation, which every admin host sees) from its
# plan to its end, and confirms it before each destructive step.
# Then, on a second cluster, the surprises of moving the control plane by
# hand: the same handover typed as `etcd leave`, a pause, `reset` (the
# controllers lose leases), and an endpoint change whose issuer is not
# pinned, rolled back by `ops apply`'s token check although the issuer
# guard was overridden (the expected refusal is kept in a file, not
# printed as an error). It ends on a summary: what ops retire did, the
# leases lost each way, the rollback the token check made.
# Everything is written under a temporary directory (or $1), and the
# clusters are stopped at the end. The first run builds kube-apiserver
# (scripts/kube-apiserver.sh, about 4 minutes on 2 cores) and the etcd
# releases the nodes run (scripts/etcd.sh, about a minute a binary).
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
etcd_cache="$(dirname "$(dirname "$(scripts/etcd.sh all | sed -n 1p)")")"
cargo build --locked --release --workspace --bins

sim="target/release/talos-sim"
ctl="target/release/talosctl-rs"
pids=()
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done' EXIT

# up NAME: a simulated cluster in $work/NAME, reported in $work/NAME.json.
up() {
  "$sim" up --isolated --nodes 3 --kube-apiserver "$kube" --etcd-cache "$etcd_cache" --dir "$work/$1" --json >"$work/$1.json" 2>"$work/$1.log" &
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

# newest STATE_DIR TALOSCONFIG: the id of the newest operation there.
newest() {
  "$ctl" --talosconfig "$2" -o json ops --state-dir "$1" list |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])'
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
retire_id="$(newest "$work/state" "$tc")"
echo "== the retire's journal record: the cluster lock it held, each destructive step fenced"
$ops show "$retire_id"
"$ctl" --talosconfig "$tc" -o json ops --state-dir "$work/state" show "$retire_id" >"$work/retire.json"
echo
echo "== what the controllers lost to ops retire (expected: nothing)"
lost cluster | tee "$work/lost-retire.txt"
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
lost by-hand | tee "$work/lost-by-hand.txt"
echo
first="$(ip by-hand 1)"
echo "== ops apply: an endpoint change with the issuer not pinned, the issuer guard overridden"
echo "   (expected: the token check rolls it back; its refusal goes to $work/apply.err)"
sed "s#endpoint: https://$first:6443#endpoint: https://k8s.example:6443#" "$work/by-hand/controlplane.yaml" >"$work/endpoint.yaml"
if "$ctl" --talosconfig "$tc2" ops --state-dir "$work/state-by-hand" --yes -n "$first" apply -f "$work/endpoint.yaml" \
  --expect-change cluster.controlPlane.endpoint --allow-issuer-change controlplane --try-timeout 20s \
  2>"$work/apply.err"; then
  echo "the token check did not catch it" >&2
  exit 1
fi
apply_id="$(newest "$work/state-by-hand" "$tc2")"
"$ctl" --talosconfig "$tc2" -o json ops --state-dir "$work/state-by-hand" show "$apply_id" >"$work/apply.json"
echo
echo "== summary"
python3 - "$work/retire.json" "$work/lost-retire.txt" "$work/lost-by-hand.txt" "$work/apply.json" <<'PY'
import json, sys
retire = json.load(open(sys.argv[1]))
lost_retire = open(sys.argv[2]).read().strip()
lost_by_hand = open(sys.argv[3]).read().strip()
apply = json.load(open(sys.argv[4]))
steps = ", ".join("{} {}".format(s["name"], s["state"]) for s in retire["steps"])
fenced = sum(1 for s in retire["steps"] if s.get("fence"))
lock = retire.get("cluster_lock", {})
print("ops retire {} ({}): {}".format(retire["id"], retire["state"], steps))
print("  leave to reset: {:.1f} ms".format(retire["facts"].get("leave_to_reset_gap_ms", 0)))
print("  cluster lock: Lease {} held by {} (transition {}); {} destructive steps fenced".format(
    lock.get("lease"), lock.get("holder"), lock.get("transitions"), fenced))
print("leases, through ops retire:    " + lost_retire)
print("leases, through the hand-typed handover: " + lost_by_hand)
gate = next(s for s in apply["steps"] if s["name"] == "gate")
detail = gate["detail"] or ""
print("ops apply {} ({}): the token check rolled the unpinned endpoint change back".format(apply["id"], apply["state"]))
for part in ["rejects the service-account token minted before the change (401 Unauthorized)",
             "the gate ends at once", "rolled back to its previous configuration (verified)"]:
    print("  {}: {}".format(part, "yes" if part in detail else "NO"))
PY
echo
echo "snapshots in $work/snapshots, journals in $work/state and $work/state-by-hand"
