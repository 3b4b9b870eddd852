#!/usr/bin/env bash
# Snapshot benchmark: fills a simulated node's etcd with about SIZE_MIB MiB
# (default 1024), takes a verified snapshot with talosctl-rs under
# /usr/bin/time -v, and appends wall time, CPU seconds and peak RSS to
# bench/RESULTS.md. etcdctl's own `snapshot save` of the same database is
# recorded beside it for reference. Fails if talosctl-rs's peak RSS reaches
# 24 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

size_mib="${SIZE_MIB:-1024}"
limit_kib=$((24 * 1024))

scripts/install-deps.sh
# The etcd the simulated node runs (Talos 1.13.9's), with its etcdctl.
etcd_tools="$(dirname "$(scripts/etcd.sh v3.6.12)")"
cargo build --locked --release --workspace --bins

work="$(mktemp -d -t talos-bench-XXXXXX)"
sim_pid=""
cleanup() {
  if [ -n "$sim_pid" ]; then kill -TERM "$sim_pid" 2>/dev/null; wait "$sim_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

target/release/talos-sim up --etcd-cache "$(dirname "$etcd_tools")" --isolated --nodes 1 --dir "$work/cluster" --json >"$work/sim.json" 2>"$work/sim.log" &
sim_pid=$!
for _ in $(seq 1 240); do
  [ -s "$work/sim.json" ] && break
  kill -0 "$sim_pid" 2>/dev/null || { cat "$work/sim.log" >&2; exit 1; }
  sleep 0.5
done
[ -s "$work/sim.json" ] || { echo "talos-sim did not start" >&2; exit 1; }
etcd_url="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0]["etcd_client_url"])' "$work/sim.json")"

echo "filling etcd with ${size_mib} MiB..." >&2
target/release/talos-sim fill "$work/cluster" --count "$size_mib" --value-size 1048576 >&2

measure() { # label, output file, command...
  local label="$1" out="$2"; shift 2
  /usr/bin/time -v "$@" >"$out.stdout" 2>"$out.time"
  local wall user sys rss
  wall="$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$out.time")"
  user="$(sed -n 's/.*User time (seconds): //p' "$out.time")"
  sys="$(sed -n 's/.*System time (seconds): //p' "$out.time")"
  rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$out.time")"
  echo "$label|$wall|$(python3 -c "print(round($user + $sys, 2))")|$rss"
}

ours="$(measure talosctl-rs "$work/ours" target/release/talosctl-rs --talosconfig "$work/cluster/talosconfig" etcd snapshot "$work/ours.db")"
cat "$work/ours.stdout" >&2
# Straight from etcd, with machined's etcd client certificate (the members
# require one, as on Talos).
pki="$work/cluster/pki"
ref="$(measure "etcdctl snapshot save" "$work/ref" "$etcd_tools/etcdctl" --cacert "$pki/etcd-ca.crt" \
  --cert "$pki/etcd-client.crt" --key "$pki/etcd-client.key" --endpoints "$etcd_url" snapshot save "$work/ref.db")"
bytes="$(stat -c %s "$work/ours.db")"

row() { # "label|wall|cpu|rss"
  IFS='|' read -r label wall cpu rss <<<"$1"
  printf '| %s | %s | %s | %s MiB | %s | %s s | %s MiB |\n' \
    "$(date -u +%Y-%m-%d)" "$label" "$(nproc) cores" "$((bytes / 1048576))" "$wall" "$cpu" "$(python3 -c "print(round($rss / 1024, 1))")"
}
{
  row "$ours"
  row "$ref"
} | tee -a bench/RESULTS.md

rss_kib="$(cut -d'|' -f4 <<<"$ours")"
if [ "$rss_kib" -ge "$limit_kib" ]; then
  echo "FAIL: talosctl-rs peak RSS ${rss_kib} KiB reaches the 24 MiB limit" >&2
  exit 1
fi
echo "OK: talosctl-rs peak RSS $((rss_kib / 1024)) MiB for a $((bytes / 1048576)) MiB snapshot" >&2
