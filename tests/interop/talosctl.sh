#!/usr/bin/env bash
# The official talosctl (v1.13.9, built from upstream source by
# scripts/talosctl.sh) against a simulated three-node cluster: the
# nineteen commands an operator types during a night on the cluster, each
# checked for what a Talos 1.13.9 node prints. One line per command, `ok
# NAME` or `FAIL NAME` with what talosctl printed; exits 1 if any failed.
#
#   tests/interop/talosctl.sh [WORK_DIR]
#
# Needs Go (for the first build of talosctl, a few minutes; cached in
# ~/.cache/talos-client afterwards) and the etcd builds (scripts/etcd.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

work="${1:-$(mktemp -d -t talosctl-interop-XXXXXX)}"
mkdir -p "$work"
talosctl="$(scripts/talosctl.sh)"
scripts/etcd.sh all >/dev/null
cargo build --locked -q -p talos-sim --bin talos-sim
sim="target/debug/talos-sim"

"$sim" up --isolated --nodes 3 --no-kubernetes --dir "$work/cluster" --json >"$work/cluster.json" 2>"$work/cluster.log" &
sim_pid=$!
trap 'kill -TERM "$sim_pid" 2>/dev/null || true; wait "$sim_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
	[ -s "$work/cluster.json" ] && break
	kill -0 "$sim_pid" 2>/dev/null || { cat "$work/cluster.log" >&2; exit 1; }
	sleep 0.5
done
[ -s "$work/cluster.json" ] || { echo "talos-sim did not start" >&2; exit 1; }

ip() {
	python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][int(sys.argv[2]) - 1]["ip"])' "$work/cluster.json" "$1"
}
n1="$(ip 1)"
n3="$(ip 3)"
export TALOSCONFIG="$work/cluster/talosconfig"

failed=0
# check NAME PATTERN... -- ARGS: runs talosctl ARGS (within 60 s) and
# checks that it succeeded and that its output matches every PATTERN
# (extended regular expressions).
check() {
	local name="$1"
	shift
	local patterns=()
	while [ "$1" != -- ]; do
		patterns+=("$1")
		shift
	done
	shift
	local out rc=0
	out="$(timeout 60 "$talosctl" "$@" 2>&1)" || rc=$?
	local missing=""
	for p in "${patterns[@]}"; do
		grep -Eq -- "$p" <<<"$out" || missing+=" [$p]"
	done
	if [ "$rc" -eq 0 ] && [ -z "$missing" ]; then
		echo "ok $name"
	else
		failed=$((failed + 1))
		echo "FAIL $name (exit $rc, missing:${missing:- none})"
		sed 's/^/    /' <<<"$out"
	fi
}

# follow NAME SECONDS PATTERN...: a command that streams until
# interrupted: SIGINT after SECONDS, as Ctrl-C; talosctl then exits 0.
follow() {
	local name="$1" seconds="$2"
	shift 2
	local patterns=()
	while [ "$1" != -- ]; do
		patterns+=("$1")
		shift
	done
	shift
	local out rc=0
	out="$(timeout --preserve-status -s INT "$seconds" "$talosctl" "$@" 2>/dev/null)" || rc=$?
	local missing=""
	for p in "${patterns[@]}"; do
		grep -Eq -- "$p" <<<"$out" || missing+=" [$p]"
	done
	if [ "$rc" -eq 0 ] && [ -z "$missing" ]; then
		echo "ok $name"
	else
		failed=$((failed + 1))
		echo "FAIL $name (exit $rc, missing:${missing:- none})"
		sed 's/^/    /' <<<"$out"
	fi
}

# Talos's health check first: the rest reads a settled cluster.
check health "waiting for etcd to be healthy: OK" "waiting for all nodes to finish boot sequence: OK" -- \
	-n "$n1" health --wait-timeout 2m
check version "Tag: +v1\.13\.9" -- -n "$n1" version
check etcd-members "cp-1" "cp-2" "cp-3" -- -n "$n1" etcd members
check etcd-status "PROTOCOL" " 3\.6\.12 +3\.6\.0" -- -n "$n1" etcd status
check etcd-alarm-list -- -n "$n1" etcd alarm list
check etcd-snapshot "etcd snapshot saved to \"$work/snapshot.db\"" "snapshot info: hash [0-9a-f]{8}, revision" -- \
	-n "$n1" etcd snapshot "$work/snapshot.db"
check service "etcd +Running +OK" "kubelet +Running" -- -n "$n1" service
check service-etcd "STATE +Running" "HEALTH +OK" "\[Running\]: Health check successful" -- -n "$n1" service etcd
check apply-config-dry-run "Dry run summary" -- \
	-n "$n1" apply-config --dry-run -f "$work/cluster/controlplane.yaml"
check kubeconfig -- -n "$n1" kubeconfig "$work/kubeconfig"
grep -q "current-context: admin@talos-sim" "$work/kubeconfig" || { failed=$((failed + 1)); echo "FAIL kubeconfig-file"; }
check get-members "cp-1" "cp-3" -- -n "$n1" get members
check get-machineconfig "MachineConfig" "v1alpha1" -- -n "$n1" get machineconfig
check get-machinestatus "running +true" -- -n "$n1" get machinestatus
check logs-etcd "^$n1: \{\"level\":" -- -n "$n1" logs etcd --tail 2
[ "$(timeout 60 "$talosctl" -n "$n1" logs etcd --tail 2 | wc -l)" -eq 2 ] || { failed=$((failed + 1)); echo "FAIL logs-etcd-tail"; }
follow events 8 "NODE +ID +EVENT +ACTOR +SOURCE +MESSAGE" "MachineStatusEvent" "RUNNING +ready: true" -- \
	-n "$n1" events --tail 3
check dmesg "^$n1: kern: +info: \[" "hostname set to cp-1" -- -n "$n1" dmesg
check containers "system +etcd +registry\.k8s\.io/etcd:v3\.6\.12 +[0-9]+ +RUNNING" -- -n "$n1" containers
check etcd-leave -- -n "$n3" etcd leave
check reset -- -n "$n3" reset --graceful=false --reboot=false --system-labels-to-wipe STATE --system-labels-to-wipe EPHEMERAL --wait=false

echo "talosctl $("$talosctl" version --client --short | tail -1): 19 commands, $failed checks failed"
[ "$failed" -eq 0 ]
