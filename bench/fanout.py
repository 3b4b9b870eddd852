#!/usr/bin/env python3
"""Fan-out, build against build: `version` to 50 simulated nodes against one,
with talos-sim binaries side by side.

    bench/fanout.py [--runs N] [--talosctl-rs PATH] LABEL=TALOS_SIM [LABEL=TALOS_SIM ...]

Starts one 3 + 47 node simulator per binary (all at once, so they share the
machine's state), then runs talosctl-rs against them in turn: for each
round, every simulator gets one `-n <first node> version` and one
`-n <all 50> version`. Prints a Markdown table of medians: wall time of each
command, their ratio, the client's CPU and the simulator's CPU per command
(every thread's, from /proc/PID/task/*/schedstat).
Used to record before/after figures in bench/RESULTS.md; bench/run.sh
gives the side-by-side figures of a single build."""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import measure_beside  # noqa: E402


def start(binary, work):
    out = open(os.path.join(work, "sim.json"), "w")
    log = open(os.path.join(work, "sim.log"), "w")
    proc = subprocess.Popen(
        [binary, "up", "--isolated", "--nodes", "3", "--workers", "47",
         "--dir", os.path.join(work, "cluster"), "--json"],
        stdout=out, stderr=log,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{binary} exited: see {work}/sim.log")
        if os.path.getsize(os.path.join(work, "sim.json")) > 0:
            try:
                return proc, json.load(open(os.path.join(work, "sim.json")))
            except json.JSONDecodeError:
                pass  # still being written
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{binary} did not start within 120 s")


def run(cmd, pid):
    (wall, cpu, _), sim = measure_beside(cmd, pid)
    return wall, cpu, sim


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--talosctl-rs", default="target/release/talosctl-rs")
    parser.add_argument("sims", nargs="+", metavar="LABEL=TALOS_SIM")
    args = parser.parse_args()

    sims = {}
    with tempfile.TemporaryDirectory(prefix="talos-fanout-") as root:
        try:
            for spec in args.sims:
                label, _, binary = spec.partition("=")
                if not binary:
                    sys.exit(f"expected LABEL=TALOS_SIM, got {spec!r}")
                work = os.path.join(root, label)
                os.mkdir(work)
                proc, info = start(binary, work)
                nodes = [str(n["ip"]) for n in info["nodes"]]
                sims[label] = (proc, info["talosconfig"], nodes)

            samples = {label: {"one": [], "all": []} for label in sims}
            for _ in range(args.runs):
                for label, (proc, talosconfig, nodes) in sims.items():
                    for target, node_arg in (("one", nodes[0]), ("all", ",".join(nodes))):
                        cmd = [args.talosctl_rs, "--talosconfig", talosconfig, "-n", node_arg, "version"]
                        samples[label][target].append(run(cmd, proc.pid))
        finally:
            for proc, _, _ in sims.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _, _ in sims.values():
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()

    count = len(next(iter(sims.values()))[2])
    print(f"| build | 1 node: wall | {count} nodes: wall | ratio | client CPU, 1 / {count} | simulator CPU, 1 / {count} |")
    print("|-------|--------------|----------------|-------|--------------------|----------------------|")
    for label, by_target in samples.items():
        med = {t: [statistics.median(s[i] for s in runs) for i in range(3)] for t, runs in by_target.items()}
        one, every = med["one"], med["all"]
        print(
            f"| {label} | {one[0]*1000:.2f} ms | {every[0]*1000:.2f} ms | {every[0]/one[0]:.2f} | "
            f"{one[1]*1000:.1f} / {every[1]*1000:.1f} ms | {one[2]*1000:.2f} / {every[2]*1000:.2f} ms |"
        )
    print(f"\nMedians of {args.runs} interleaved runs per command and build.")


if __name__ == "__main__":
    main()
