#!/usr/bin/env python3
"""The off-host backup pipeline side by side, run by bench/backup.sh (which
builds the binaries and starts talos-sim and the S3 server first).

  backup.py fill ETCD_URL MIB PKI_DIR
      puts MIB values of 1 MiB of random bytes into etcd (its JSON gateway),
      so that the snapshot does not compress and the upload is as large as it
  backup.py run CONFIG.json
      the interleaved runs, the checks and the section of bench/RESULTS.md

Each run is one process measured with bench.py's measure() (wait4: wall,
user+sys CPU, peak RSS), beside the S3 server's CPU over the same time."""

import base64
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import ssl
import urllib.request

sys.dont_write_bytecode = True  # no bench/__pycache__ from importing bench.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import measure_beside  # noqa: E402

MIB = 1 << 20


def fill(etcd_url, mib, pki, writers=2):
    """MIB keys /bench/backup/NNNNN, each 1 MiB from os.urandom, through
    etcd's JSON gateway with machined's etcd client certificate from PKI
    (talos-sim's DIR/pki: the members require one, as on Talos)."""
    errors = []
    tls = ssl.create_default_context(cafile=os.path.join(pki, "etcd-ca.crt"))
    tls.load_cert_chain(os.path.join(pki, "etcd-client.crt"), os.path.join(pki, "etcd-client.key"))

    def put(first):
        try:
            for i in range(first, mib, writers):
                body = json.dumps({
                    "key": base64.b64encode(f"/bench/backup/{i:05}".encode()).decode(),
                    "value": base64.b64encode(os.urandom(MIB)).decode(),
                }).encode()
                req = urllib.request.Request(
                    f"{etcd_url}/v3/kv/put", data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60, context=tls) as resp:
                    reply = json.load(resp)
                if "header" not in reply:
                    raise RuntimeError(f"put {i}: {reply}")
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=put, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"fill failed: {errors[0]}")


def empty_bucket(root, bucket):
    """Deletes every object and every leftover of the S3 server's (upload
    parts, metadata), keeping the bucket."""
    for entry in os.listdir(root):
        path = os.path.join(root, entry)
        if entry == bucket:
            for inner in os.listdir(path):
                inner = os.path.join(path, inner)
                if os.path.isdir(inner):
                    shutil.rmtree(inner)
                else:
                    os.remove(inner)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def stored(bucket_dir, prefix):
    """The backup objects under PREFIX (not sidecars), with their sizes."""
    found = []
    for path in glob.glob(os.path.join(bucket_dir, prefix, "**", "*.age"), recursive=True):
        if not path.endswith(".kit.age"):
            found.append((path, os.path.getsize(path)))
    return found


def decrypts_to(obj, key_file, out):
    """`age -d -i KEY OBJ | zstd -d -o OUT`, and OUT's size."""
    age = subprocess.Popen(["age", "-d", "-i", key_file, obj], stdout=subprocess.PIPE)
    subprocess.run(["zstd", "-q", "-d", "-f", "-o", out], stdin=age.stdout, check=True)
    age.stdout.close()
    if age.wait() != 0:
        sys.exit(f"age -d failed on {obj}")
    return os.path.getsize(out)


def snapshot_status(etcdutl, path):
    out = subprocess.run(
        [etcdutl, "snapshot", "status", path, "-w", "json"],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


def run(cfg_path):
    cfg = json.load(open(cfg_path))
    work, runs = cfg["work"], cfg["runs"]
    bucket, s3_root = cfg["bucket"], cfg["s3_root"]
    bucket_dir = os.path.join(s3_root, bucket)
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=cfg["access_key"],
        AWS_SECRET_ACCESS_KEY=cfg["secret_key"],
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=cfg["endpoint"],
    )
    os.environ.update(env)  # measure() runs the tools with this environment

    state_dir = os.path.join(work, "state")
    ours = [
        cfg["talosctl_rs"], "--talosconfig", cfg["talosconfig"], "-n", cfg["node"],
        "ops", "--state-dir", state_dir,
        "snapshot", "--to", f"s3://{bucket}/rs", "--encrypt", cfg["recipient"],
        "--s3-endpoint", cfg["endpoint"], "--s3-addressing", "path",
    ]
    go_key = "go/snapshot.db.zst.age"
    theirs = [
        cfg["benchdriver"], "--talosconfig", cfg["talosconfig"], "--node", cfg["node"],
        "backup", f"s3://{bucket}/{go_key}", cfg["recipient"],
    ]
    tools = [("rs", ours, "rs"), ("go", theirs, "go")]

    reference = cfg["snapshot_bytes"]
    check_file = os.path.join(work, "decrypted.db")
    samples = {name: [] for name, _, _ in tools}
    server_cpu = {name: [] for name, _, _ in tools}
    object_sizes = {name: [] for name, _, _ in tools}
    decrypted = {}
    for i in range(runs):
        for name, cmd, prefix in tools:
            empty_bucket(s3_root, bucket)
            shutil.rmtree(state_dir, ignore_errors=True)
            row, cpu = measure_beside(cmd, cfg["s3_pid"])
            objects = stored(bucket_dir, prefix)
            if len(objects) != 1 or objects[0][1] <= 0:
                sys.exit(f"run {i + 1} of {name}: expected one object under {prefix}/, found {objects}")
            samples[name].append(row)
            server_cpu[name].append(cpu)
            object_sizes[name].append(objects[0][1])
            print(f"run {i + 1} {name}: wall {row[0]:.2f} s, CPU {row[1]:.2f} s, "
                  f"peak RSS {row[2]:.1f} MiB, S3 server CPU {cpu:.2f} s, object {objects[0][1]} bytes",
                  file=sys.stderr)
            if name not in decrypted:
                # The first object of each tool, read back with Debian's age and zstd.
                size = decrypts_to(objects[0][0], cfg["key_file"], check_file)
                status = snapshot_status(cfg["etcdutl"], check_file)
                os.remove(check_file)
                if size != reference:
                    sys.exit(f"{name}: decrypted to {size} bytes, the snapshot has {reference}")
                decrypted[name] = (size, status)
    empty_bucket(s3_root, bucket)

    med = {n: tuple(statistics.median(s[k] for s in rows) for k in range(3)) for n, rows in samples.items()}
    srv = {n: statistics.median(v) for n, v in server_cpu.items()}
    obj = {n: statistics.median(v) for n, v in object_sizes.items()}
    rs, go = med["rs"], med["go"]

    machine = (
        f"{os.cpu_count()} cores, "
        f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB, "
        f"{platform.machine()}, Linux {platform.release()}"
    )
    date = time.strftime("%Y-%m-%d", time.gmtime())
    st = decrypted["rs"][1]
    lines = [
        f"\n## Off-host backup side by side ({date}, {machine})\n",
        f"`bench/backup.sh` ({cfg['versions']}). One simulated node; its etcd "
        f"filled with {cfg['fill_mib']} values of 1 MiB from /dev/urandom, which do not "
        f"compress; the snapshot is {reference} bytes ({reference / MIB:.0f} MiB). "
        f"S3 is s3s-fs 0.14.1 on loopback (SigV4, path-style), emptied before each run. "
        f"Medians of {runs} interleaved runs (talosctl-rs, Go, talosctl-rs, ...), "
        "each tool measured per process (wait4); the S3 server's CPU over the same "
        "time beside it (it shares the 2 cores). Ratio = talosctl-rs / Go.\n",
        "| tool | wall | CPU (user+sys) | peak RSS | S3 server CPU | object |",
        "|------|------|----------------|----------|---------------|--------|",
        f"| talosctl-rs `ops snapshot --to s3:// --encrypt` (snapshot verified: sha256, bbolt, status; "
        f"zstd 3, age, 5 MiB parts, 2 in flight; sidecar; journaled) | {rs[0]:.2f} s | {rs[1]:.2f} s | "
        f"{rs[2]:.1f} MiB | {srv['rs']:.2f} s | {obj['rs'] / MIB:.0f} MiB |",
        f"| Go, as talos-backup does it (machinery client; klauspost zstd default level, then age, "
        f"then minio-go PutObject: 5 MiB parts, 2 in flight; size check only) | {go[0]:.2f} s | {go[1]:.2f} s | "
        f"{go[2]:.1f} MiB | {srv['go']:.2f} s | {obj['go'] / MIB:.0f} MiB |",
        f"\nRatios, talosctl-rs / Go: wall {rs[0] / go[0]:.2f}, CPU {rs[1] / go[1]:.2f}, "
        f"peak RSS {rs[2] / go[2]:.2f}. Object: the median size stored (age over zstd); "
        "the random values do not compress, the snapshot's other pages do, by each "
        "encoder's own measure.\n",
        f"Checks: after every run its object was in the bucket (size > 0); the first "
        f"object of each tool went through `age -d -i KEY | zstd -d` into a file of "
        f"{decrypted['rs'][0]} bytes (talosctl-rs) and {decrypted['go'][0]} bytes (Go), the "
        f"snapshot's size, and `etcdutl snapshot status` (of the same etcd release) read it (talosctl-rs's: hash "
        f"{st['hash']:08x}, revision {st['revision']}, {st['totalKey']} keys).\n",
    ]
    if cfg.get("memtest"):
        lines.append(cfg["memtest"] + "\n")
    lines += [
        "Commands:\n",
        "```",
        "AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:PORT \\",
        f"  talosctl-rs --talosconfig TC -n {cfg['node']} ops --state-dir STATE snapshot --to s3://{bucket}/rs "
        "--encrypt age1... --s3-endpoint http://127.0.0.1:PORT --s3-addressing path",
        "AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:PORT \\",
        f"  benchdriver --talosconfig TC --node {cfg['node']} backup s3://{bucket}/{go_key} age1...",
        "```",
    ]
    text = "\n".join(lines) + "\n"
    with open(cfg["results"], "a") as f:
        f.write(text)
    print(text)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "fill":
        fill(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        sys.exit("usage: backup.py fill ETCD_URL MIB PKI_DIR | backup.py run CONFIG.json")


if __name__ == "__main__":
    main()
