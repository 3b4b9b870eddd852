#!/usr/bin/env bash
# Off-host backup, side by side: `talosctl-rs ops snapshot --to s3://...
# --encrypt age1...` against the same pipeline in Go as talos-backup builds
# it (the official machinery client's etcd snapshot through klauspost's zstd,
# then filippo.io/age, then a minio-go multipart upload:
# tests/interop/cmd/benchdriver's `backup`), on one simulated node whose etcd
# holds about SIZE_MIB MiB (default 1024) of random 1 MiB values, uploading
# to s3s-fs (a real S3 server, installed with cargo into target/bench-tools)
# on loopback. Medians of RUNS (default 3) interleaved runs of each, per
# process (wall, CPU, peak RSS, and the S3 server's CPU meanwhile); every
# run's object is checked in the bucket and one of each tool is decrypted
# with age and zstd. With MEMTEST=1 (the default) the library's
# backup_memory test runs first at the same size and its peak RSS goes into
# the same section of bench/RESULTS.md. Needs Go and its module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."

size_mib="${SIZE_MIB:-1024}"
runs="${RUNS:-3}"
memtest="${MEMTEST:-1}"
# RESULTS names another file for the section (default bench/RESULTS.md).

scripts/install-deps.sh
# The etcd the simulated node runs (Talos 1.13.9's), with its etcdutl.
etcd_tools="$(dirname "$(scripts/etcd.sh v3.6.12)")"
cargo build --locked --release -p talosctl-rs -p talos-sim
tools="$PWD/target/bench-tools"
if [ ! -x "$tools/bin/s3s-fs" ]; then
  cargo install --locked --quiet s3s-fs --version 0.14.1 --features binary --root "$tools"
fi

work="$(mktemp -d -t talos-backup-bench-XXXXXX)"
sim_pid=""
s3_pid=""
cleanup() {
  for pid in "$s3_pid" "$sim_pid"; do
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

(cd tests/interop && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go build -o "$work/benchdriver" ./cmd/benchdriver)

memtest_line=""
if [ "$memtest" = 1 ]; then
  echo "backup_memory test with ${size_mib} MiB..." >&2
  BACKUP_MEMTEST_MIB="$size_mib" cargo test --locked --release -p talos-client --features backup \
    --test backup_memory -- --nocapture 2>&1 | tee "$work/memtest.log" >&2
  peak_kib="$(sed -n 's/.*: peak RSS \([0-9]*\) KiB.*/\1/p' "$work/memtest.log")"
  [ -n "$peak_kib" ] || { echo "backup_memory printed no peak RSS" >&2; exit 1; }
  memtest_line="$(python3 -c 'import sys; print(f"`BACKUP_MEMTEST_MIB={sys.argv[1]} cargo test --locked --release -p talos-client --features backup --test backup_memory -- --nocapture`: the library pipeline (spool, checks, zstd, age, upload) with s3s-fs in the same process, {sys.argv[2].strip()}, peak RSS {int(sys.argv[3]) / 1024:.1f} MiB for the whole process (target: under 48 MiB).")' \
    "$size_mib" "$(grep -o 'backup of [0-9]* MiB ([0-9]* MiB stored) in [^:]*' "$work/memtest.log")" "$peak_kib")"
fi

target/release/talos-sim up --etcd-cache "$(dirname "$etcd_tools")" --isolated --nodes 1 --dir "$work/cluster" --json >"$work/sim.json" 2>"$work/sim.log" &
sim_pid=$!
for _ in $(seq 1 240); do
  [ -s "$work/sim.json" ] && break
  kill -0 "$sim_pid" 2>/dev/null || { cat "$work/sim.log" >&2; exit 1; }
  sleep 0.5
done
[ -s "$work/sim.json" ] || { echo "talos-sim did not start" >&2; exit 1; }
read -r node etcd_url < <(python3 -c 'import json,sys; n=json.load(open(sys.argv[1]))["nodes"][0]; print(n["ip"], n["etcd_client_url"])' "$work/sim.json")

echo "filling etcd with ${size_mib} MiB of random values..." >&2
python3 bench/backup.py fill "$etcd_url" "$size_mib" "$work/cluster/pki"
# The snapshot's size, for the decryption check.
target/release/talosctl-rs --talosconfig "$work/cluster/talosconfig" -n "$node" etcd snapshot "$work/reference.db" >&2
snapshot_bytes="$(stat -c %s "$work/reference.db")"
rm -f "$work/reference.db" "$work/reference.db.json"

age-keygen -o "$work/key.txt" 2>/dev/null
recipient="$(age-keygen -y "$work/key.txt")"

access_key="bench-access-key"
secret_key="bench-secret-key-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$work/s3/bench"
"$tools/bin/s3s-fs" --host 127.0.0.1 --port "$port" --access-key "$access_key" --secret-key "$secret_key" \
  "$work/s3" >"$work/s3.log" 2>&1 &
s3_pid=$!
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 "$s3_pid" 2>/dev/null || { cat "$work/s3.log" >&2; exit 1; }
  sleep 0.1
done

versions="$(target/release/talosctl-rs version --client --short | tail -n1 | xargs)"
for module in siderolabs/talos/pkg/machinery klauspost/compress filippo.io/age minio/minio-go/v7; do
  versions+="; $(sed -n "s#^\t\(\(github.com/\)\?$module\) \(v[^ ]*\).*#\1 \3#p" tests/interop/go.mod | sed 's#^github.com/##')"
done
versions+="; $(go version | cut -d' ' -f3)"

WORK="$work" RUNS="$runs" SIZE_MIB="$size_mib" NODE="$node" PORT="$port" ACCESS_KEY="$access_key" \
  SECRET_KEY="$secret_key" S3_PID="$s3_pid" RECIPIENT="$recipient" SNAPSHOT_BYTES="$snapshot_bytes" \
  VERSIONS="$versions" MEMTEST_LINE="$memtest_line" ETCDUTL="$etcd_tools/etcdutl" python3 - "$work/bench.json" <<'PY'
import json, os, sys
e = os.environ
json.dump({
    "work": e["WORK"], "runs": int(e["RUNS"]), "fill_mib": int(e["SIZE_MIB"]),
    "talosctl_rs": "target/release/talosctl-rs", "benchdriver": f"{e['WORK']}/benchdriver",
    "talosconfig": f"{e['WORK']}/cluster/talosconfig", "node": e["NODE"],
    "endpoint": f"http://127.0.0.1:{e['PORT']}", "access_key": e["ACCESS_KEY"], "secret_key": e["SECRET_KEY"],
    "bucket": "bench", "s3_root": f"{e['WORK']}/s3", "s3_pid": int(e["S3_PID"]),
    "key_file": f"{e['WORK']}/key.txt", "recipient": e["RECIPIENT"],
    "snapshot_bytes": int(e["SNAPSHOT_BYTES"]), "versions": e["VERSIONS"],
    "memtest": e["MEMTEST_LINE"], "results": e.get("RESULTS", "bench/RESULTS.md"),
    "etcdutl": e["ETCDUTL"],
}, open(sys.argv[1], "w"))
PY
python3 bench/backup.py run "$work/bench.json"
