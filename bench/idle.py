"""Where two commits' controllers differ in memory: the same small release run by each, then measured at rest.

For each tree given (a checkout of the commit, its package run from there with this venv), in turn on one
local cluster: N apps in a namespace of their own, one controller started for it, N releases applied and
driven to Succeeded, 20 s of rest, then the controller's resident memory split as the kernel accounts it
(``/proc/<pid>/smaps_rollup`` and ``status``: anonymous, file-backed, threads, and ``VmHWM``, the peak), then
the census of that controller's objects (``GREYRELEASE_TRACEMALLOC_FRAMES=0`` and SIGUSR1, see
:mod:`greyrelease.runtime.memprofile`: nothing traced, so the figures above are a plain run's), the size of
the releases' JSON as the API server serves them and the sockets the controller holds, then what the
allocators hold (pymalloc's arenas and blocks, glibc's heap in use and free) and the resident memory once glibc
has handed its free memory back (``malloc_trim``): memory in use told from memory kept free. With ``--traced``
a second controller per tree runs under
tracemalloc (one frame) and writes its Python allocations by file and by line: what a difference in
anonymous memory is made of, or that Python does not hold it.

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

# Runs the controller's own entry point untraced; SIGUSR2 writes what the allocators hold to argv[1] (CPython's
# small-object allocator as sys._debugmallocstats prints it, then glibc's mallinfo2 over its arenas, in bytes)
# and then hands glibc's free memory back to the system (malloc_trim): what the resident memory was made of.
PLAIN = """
import ctypes, os, runpy, signal, sys
out = sys.argv.pop(1)
class Mallinfo2(ctypes.Structure):
    _fields_ = [(k, ctypes.c_size_t) for k in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
def dump(_s, _f):
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Mallinfo2
    with open(out, "w") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        info = libc.mallinfo2()
        f.write("mallinfo2 " + " ".join(f"{k}={getattr(info, k)}" for k, _ in info._fields_) + "\\n")
    libc.malloc_trim(0)
signal.signal(signal.SIGUSR2, dump)
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


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:
        return ""


def allocator_figures(text: str) -> dict[str, float]:
    """The figures of the allocators' report that say what is held and what is free, in MiB."""
    figures: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        key, value = key.strip().lstrip("#").strip(), value.strip().replace(",", "")
        if key == "Total" and value.isdigit():  # the first Total is that of pymalloc's arenas
            figures.setdefault("pymalloc arenas, total", round(int(value) / 2**20, 2))
        elif key in ("bytes in allocated blocks", "bytes in available blocks") and value.isdigit():
            figures["pymalloc " + key] = round(int(value) / 2**20, 2)
        elif key.startswith("arenas allocated current") and value.isdigit():
            figures["pymalloc arenas"] = int(value)
        elif line.startswith("mallinfo2 "):
            for pair in line.split()[1:]:
                k, _, v = pair.partition("=")
                if k in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost"):
                    figures["glibc " + k] = round(int(v) / 2**20, 2)
    return figures


def one(cluster: Any, kube: Any, tree: Path, label: str, n: int, traced: bool, workdir: Path) -> dict[str, Any]:
    ns = f"idle-{label}-{'traced' if traced else 'plain'}"
    names = namespace_of_apps(cluster, kube, ns, n)
    args = ["run", "--namespace", ns, "--no-leader-elect", "--metrics-port", str(free_port())]
    report = workdir / f"{ns}.txt"
    env = dict(cluster.env)
    if traced:
        cmd = [sys.executable, "-c", TRACED, str(report), *args]
    else:
        # The census alone: nothing traced, the resident memory that of a plain run.
        cmd = [sys.executable, "-c", PLAIN, str(workdir / f"{ns}.allocators"), *args]
        env.update({"GREYRELEASE_TRACEMALLOC": str(report), "GREYRELEASE_TRACEMALLOC_FRAMES": "0"})
    log = (workdir / f"{ns}.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
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
        items = kube.list(gr)
        result["release JSON, B"] = {
            "whole": round(sum(len(json.dumps(g)) for g in items) / n),
            "status": round(sum(len(json.dumps(g.get("status") or {})) for g in items) / n),
        }
        result["sockets"] = sum(1 for fd in Path(f"/proc/{proc.pid}/fd").iterdir() if "socket" in _link(fd))
        proc.send_signal(signal.SIGUSR1)
        wait(report.exists, 60, "allocation report" if traced else "census")
        time.sleep(2)
        result["report"] = str(report)
        if not traced:
            allocators = workdir / f"{ns}.allocators"
            proc.send_signal(signal.SIGUSR2)
            wait(allocators.exists, 60, "allocator statistics")
            time.sleep(2)
            result["trimmed"] = memory(proc.pid)
            result["allocators"] = allocator_figures(allocators.read_text())
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
