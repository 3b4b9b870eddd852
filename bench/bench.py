#!/usr/bin/env python3
"""Side-by-side benchmarks of talosctl-rs and the Go tooling, run by
bench/run.sh (which builds everything and starts talos-sim first).

Each figure is the median of interleaved runs (tool A, tool B, tool C, then
again), measured per process with wait4(): wall time, CPU (user+sys) and
peak RSS. Results are appended to bench/RESULTS.md with the machine, the
versions and the exact commands."""

import json
import os
import platform
import statistics
import subprocess
import sys
import time


def task_cpu(pid):
    """CPU time of every thread of `pid` so far, in seconds (schedstat's
    nanoseconds, finer than /proc/PID/stat's clock ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass  # the thread ended between listdir and open
    return total / 1e9


def measure(cmd, env=None):
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{stderr}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def measure_beside(cmd, pid):
    """measure(cmd), and the CPU process `pid` used meanwhile, in seconds."""
    before = task_cpu(pid)
    row = measure(cmd)
    return row, task_cpu(pid) - before


def median_rows(samples):
    return {
        name: tuple(statistics.median(s[i] for s in runs) for i in range(3))
        for name, runs in samples.items()
    }


def interleave(tools, runs, before=None):
    samples = {name: [] for name, _ in tools}
    for _ in range(runs):
        for name, cmd in tools:
            if before:
                before(name)
            samples[name].append(measure(cmd))
    return median_rows(samples)


def main():
    cfg = json.load(open(sys.argv[1]))
    work = cfg["work"]
    rs, go, tc = cfg["talosctl_rs"], cfg["benchdriver"], cfg["talosconfig"]
    node = cfg["node"]
    lat_runs, runs = cfg["latency_runs"], cfg["snapshot_runs"]
    lines = []
    machine = (
        f"{os.cpu_count()} cores, "
        f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB, "
        f"{platform.machine()}, Linux {platform.release()}"
    )
    lines.append(f"\n## Side by side ({time.strftime('%Y-%m-%d', time.gmtime())}, {machine})\n")
    lines.append(
        f"`bench/run.sh` ({cfg['versions']}). Medians of interleaved runs; "
        "ratio = talosctl-rs / the Go tool.\n"
    )

    lines.append(f"\n### Command latency against a 3-node talos-sim ({lat_runs} runs each)\n")
    lines.append("| command | talosctl-rs | Go client (benchdriver) | ratio | talosctl-rs peak RSS | Go peak RSS |")
    lines.append("|---------|-------------|-------------------------|-------|----------------------|-------------|")
    for what, rs_args, go_args in [
        ("version", ["version"], ["version"]),
        ("etcd members", ["etcd", "members"], ["members"]),
    ]:
        m = interleave(
            [
                ("rs", [rs, "--talosconfig", tc, "-n", node] + rs_args),
                ("go", [go, "--talosconfig", tc, "--node", node] + go_args),
            ],
            lat_runs,
        )
        lines.append(
            f"| `{what}` | {m['rs'][0]*1000:.1f} ms | {m['go'][0]*1000:.1f} ms | "
            f"{m['rs'][0]/m['go'][0]:.2f} | {m['rs'][2]:.1f} MiB | {m['go'][2]:.1f} MiB |"
        )

    all_nodes = ",".join(cfg["all_nodes"])
    sim_pid, fan_runs = cfg["sim_pid"], cfg["fanout_runs"]
    fan = {"one": [], "all": []}
    sim_cpu = {"one": [], "all": []}
    for _ in range(fan_runs):
        for name, target in (("one", node), ("all", all_nodes)):
            row, sim = measure_beside([rs, "--talosconfig", tc, "-n", target, "version"], sim_pid)
            fan[name].append(row)
            sim_cpu[name].append(sim)
    m = median_rows(fan)
    sim = {name: statistics.median(s) for name, s in sim_cpu.items()}
    count = len(cfg["all_nodes"])
    lines.append(f"\n### Fan-out: `version` to {count} simulated nodes against one ({fan_runs} runs each)\n")
    lines.append("| target | wall | CPU (user+sys) | peak RSS | talos-sim CPU |")
    lines.append("|--------|------|----------------|----------|---------------|")
    lines.append(f"| 1 node | {m['one'][0]*1000:.1f} ms | {m['one'][1]*1000:.1f} ms | {m['one'][2]:.1f} MiB | {sim['one']*1000:.2f} ms |")
    lines.append(f"| {count} nodes | {m['all'][0]*1000:.1f} ms | {m['all'][1]*1000:.1f} ms | {m['all'][2]:.1f} MiB | {sim['all']*1000:.2f} ms |")
    lines.append(
        f"\nRatio {count} nodes / 1 node: wall {m['all'][0]/m['one'][0]:.2f}, "
        f"peak RSS {m['all'][2]/m['one'][2]:.2f} (target: at most 1.5). "
        "talos-sim CPU is the simulator's (every thread, from /proc/PID/task/*/schedstat) during each command: "
        "it serves the same 2 cores.\n"
    )

    snap = os.path.join(work, "snap.db")

    def clean(_name):
        for suffix in ("", ".json", ".part"):
            try:
                os.remove(snap + suffix)
            except FileNotFoundError:
                pass

    pki = cfg["pki"]
    m = interleave(
        [
            ("talosctl-rs etcd snapshot (verified: sha256, bbolt, status)",
             [rs, "--talosconfig", tc, "-n", node, "etcd", "snapshot", snap]),
            ("Go client, as talosctl v1.13.9 does it (stream, fsync, trailer size, etcdutl status)",
             [go, "--talosconfig", tc, "--node", node, "snapshot", snap]),
            ("etcdctl snapshot save, straight from etcd (its client TLS, no Talos API)",
             [cfg["etcdctl"], f"--cacert={pki}/etcd-ca.crt", f"--cert={pki}/etcd-client.crt",
              f"--key={pki}/etcd-client.key", "--endpoints", cfg["etcd_url"], "snapshot", "save", snap]),
        ],
        runs,
        before=clean,
    )
    clean(None)
    lines.append(f"\n### Snapshot of {cfg['snapshot_mib']} MiB through one simulated node ({runs} runs each)\n")
    lines.append("| tool | wall | CPU (user+sys) | peak RSS |")
    lines.append("|------|------|----------------|----------|")
    for name, (wall, cpu, rss) in m.items():
        lines.append(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {rss:.1f} MiB |")
    names = list(m)
    rs_row, go_row, etcd_row = m[names[0]], m[names[1]], m[names[2]]
    lines.append(
        f"\nRatios, talosctl-rs to the Go client: wall {rs_row[0]/go_row[0]:.2f}, CPU {rs_row[1]/go_row[1]:.2f}, "
        f"RSS {rs_row[2]/go_row[2]:.2f}; to etcdctl: wall {rs_row[0]/etcd_row[0]:.2f}, "
        f"CPU {rs_row[1]/etcd_row[1]:.2f}, RSS {rs_row[2]/etcd_row[2]:.2f}.\n"
    )
    lines.append("Commands:\n")
    lines.append("```")
    lines.append(f"talosctl-rs --talosconfig TC -n {node} version | etcd members | etcd snapshot FILE")
    lines.append(f"benchdriver --talosconfig TC --node {node} version | members | snapshot FILE")
    lines.append("etcdctl --cacert PKI/etcd-ca.crt --cert PKI/etcd-client.crt --key PKI/etcd-client.key --endpoints ETCD_URL snapshot save FILE")
    lines.append("```")
    text = "\n".join(lines) + "\n"
    with open(cfg["results"], "a") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
