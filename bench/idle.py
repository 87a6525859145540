"""Where two commits' controllers differ in memory: the same small release run by each, then measured at rest.

For each tree given (a checkout of the commit, its package run from there with this venv), in turn on one
local cluster: N apps in a namespace of their own, one controller started for it, N releases applied and
driven to Succeeded, 20 s of rest, then the controller's resident memory split as the kernel accounts it
(``/proc/<pid>/smaps_rollup`` and ``status``: anonymous, file-backed, threads). With ``--traced`` a second
controller per tree runs under tracemalloc (one frame) and writes its Python allocations by file and by
line: what a difference in anonymous memory is made of, or that Python does not hold it.

Usage: python -m bench.idle --n 100 --tree before=/path/to/checkout --tree after=. [--traced]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e.harness.process import free_port
from greyrelease.kube.client import path

from bench.run import bench_cluster, namespace_of_apps, parallel, release, wait

# Runs the controller's own entry point under tracemalloc; SIGUSR1 writes the allocations to argv[1].
TRACED = """
import runpy, signal, sys, tracemalloc
out = sys.argv.pop(1)
tracemalloc.start(1)
def dump(_s, _f):
    snap = tracemalloc.take_snapshot()
    by_file = snap.statistics("filename")
    lines = [f"traced {sum(s.size for s in by_file) / 2**20:.2f} MiB", "", "by file:"]
    lines += [f"{s.size / 2**20:8.2f} MiB {s.count:8d}  {s.traceback[0].filename}" for s in by_file[:40]]
    lines += ["", "by line:"]
    lines += [f"{s.size / 2**20:8.2f} MiB {s.count:8d}  {s.traceback[0]}" for s in snap.statistics("lineno")[:60]]
    open(out, "w").write("\\n".join(lines) + "\\n")
signal.signal(signal.SIGUSR1, dump)
runpy.run_module("greyrelease", run_name="__main__", alter_sys=True)
"""


def memory(pid: int) -> dict[str, Any]:
    """The kernel's split of a process's resident memory, in MiB, and its thread count."""
    kib: dict[str, Any] = {}
    for name in ("smaps_rollup", "status"):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if len(fields) == 2 and fields[1] == "kB":
                kib[key] = int(fields[0])
            elif key == "Threads":
                kib["threads"] = int(fields[0])
    keep = ("Rss", "Anonymous", "Shared_Clean", "Private_Clean", "Private_Dirty", "RssFile", "VmHWM")
    return {**{k: round(kib[k] / 1024, 1) for k in keep if k in kib}, "threads": kib.get("threads")}


def one(cluster: Any, kube: Any, tree: Path, label: str, n: int, traced: bool, workdir: Path) -> dict[str, Any]:
    ns = f"idle-{label}-{'traced' if traced else 'plain'}"
    names = namespace_of_apps(cluster, kube, ns, n)
    args = ["run", "--namespace", ns, "--no-leader-elect", "--metrics-port", str(free_port())]
    report = workdir / f"{ns}.txt"
    cmd = [sys.executable, "-c", TRACED, str(report), *args] if traced else [sys.executable, "-m", "greyrelease", *args]
    log = (workdir / f"{ns}.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=tree, env=cluster.env, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(5)
        started = memory(proc.pid)
        gr = path("greyrelease.io", "v1", "greyreleases", ns)
        batches: list[dict[str, Any]] = [{"replicas": 1, "pause": "2s"}, {"replicas": 2}]
        parallel(lambda name: kube.create(gr, release(name, "v2", batches)), names)

        def done() -> bool:
            items = kube.list(gr)
            return sum(1 for g in items if (g.get("status") or {}).get("phase") == "Succeeded") == n

        wait(done, 900, f"{ns} releases succeeded", 2)
        time.sleep(20)
        result = {"tree": label, "traced": traced, "at start": started, "at rest": memory(proc.pid)}
        if traced:
            proc.send_signal(signal.SIGUSR1)
            wait(report.exists, 60, "allocation report")
            time.sleep(2)
            result["report"] = str(report)
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        kube.delete(path("", "v1", "namespaces", name=ns))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--tree", action="append", required=True, help="label=path of a checkout")
    parser.add_argument("--traced", action="store_true")
    args = parser.parse_args()
    trees = [(label, Path(p).resolve()) for label, p in (t.split("=", 1) for t in args.tree)]
    workdir = Path(tempfile.mkdtemp(prefix="greyrelease-idle-"))
    with bench_cluster(workdir) as (cluster, kube):
        for traced in [False, True] if args.traced else [False]:
            for label, tree in trees:
                print(json.dumps(one(cluster, kube, tree, label, args.n, traced, workdir)), flush=True)
    print(f"logs and reports in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
