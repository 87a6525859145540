"""`python -m bench.shards`: the same releases driven by one replica and by several (``--shards K``).

N two-replica apps spread over M namespaces chosen so that each shard gets the same number of them (the
shard of a namespace is a hash of its name, see greyrelease/runtime/shards.py), the same for every shard count so
the runs compare. For each K: K controller processes run with ``--shards K`` (K = 1: one process, no
Lease), all watching every namespace, and N releases applied at once (batch 1 = 1 canary pod, 2 s pause;
batch 2 = all pods; then promotion; a progress deadline of 3,600 s as in ``bench.compare``), then up to
200 of them held at a manual pause and aborted at once.
Measured as in ``bench.run``: completion, transition lag after the pause, abort latency (annotation
written -> the Service narrowed, seen on a watch of all Services), the controllers' CPU and each
replica's peak resident memory, and the controllers' writes per batch transition (from the audit log).

Usage: python -m bench.shards --n 3000 --shards 1 3 --namespaces 30 [--out bench/SHARDS.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from e2e.harness.controlplane import Cluster
from e2e.harness.process import free_port
from greyrelease.api.release import parse_time
from greyrelease.kube.client import KubeClient, path
from greyrelease.runtime.shards import shard_of

from bench.compare.contender import DEADLINE
from bench.run import (
    PAUSE,
    ROOT,
    ProcStats,
    app,
    bench_cluster,
    controller_writes,
    parallel,
    pct,
    release,
    transition_lags,
    wait,
)

SYSTEM = "bench-shards-system"
GREYRELEASES = path("greyrelease.io", "v1", "greyreleases")


def balanced_namespaces(count: int, shards: int, prefix: str = "bench-shards") -> list[str]:
    """``count`` namespace names (``<prefix>-<i>``), as many in each of ``shards`` shards as ``count`` allows."""
    per = -(-count // shards)
    picked: dict[int, list[str]] = {k: [] for k in range(shards)}
    i = 0
    while sum(len(v) for v in picked.values()) < count:
        name = f"{prefix}-{i}"
        k = shard_of(name, shards)
        if len(picked[k]) < per:
            picked[k].append(name)
        i += 1
    return sorted(ns for names in picked.values() for ns in names)


class Narrowings(threading.Thread):
    """Watches every Service; records when each (namespace, name) is first narrowed to a ReplicaSet."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(daemon=True)
        self.kube = kube
        self.narrowed: dict[tuple[str, str], float] = {}
        self.started = threading.Event()
        self._resp: Any = None

    def run(self) -> None:
        rv = self.kube.request("GET", path("", "v1", "services"))["metadata"]["resourceVersion"]
        self._resp = self.kube._pool.request(
            "GET",
            self.kube.host + path("", "v1", "services").path + f"?watch=1&resourceVersion={rv}",
            headers=self.kube._headers(),
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=900),
        )
        self.started.set()
        buf = b""
        try:
            for chunk in self._resp.stream(4096):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    obj = json.loads(line).get("object", {})
                    meta = obj.get("metadata", {})
                    key = (meta.get("namespace", ""), meta.get("name", ""))
                    if "pod-template-hash" in (obj.get("spec", {}).get("selector") or {}) and key not in self.narrowed:
                        self.narrowed[key] = time.time()
        except Exception:  # the watch ends when the benchmark closes it
            return

    def close(self) -> None:
        """End the watch: its socket is shut down (the reading thread returns) and the connection dropped,
        never handed back to the client's pool while the thread may still read from it."""
        if self._resp is not None:
            self._resp.shutdown()
            self._resp.close()


class Replicas:
    """``k`` controller processes (``greyrelease run``) watching every namespace: one without a Lease when
    ``k`` is 1, else ``k`` run with ``--shards k`` and their Leases in namespace ``system``; each with its
    /metrics port, its log ``<log>-<i>.log`` and its CPU and memory sampled (:class:`~bench.run.ProcStats`)."""

    def __init__(
        self, cluster: Cluster, k: int, system: str, log: Path, extra_args: Callable[[], list[str]] = list
    ) -> None:
        args = ["--shards", str(k), "--leader-election-namespace", system] if k > 1 else ["--no-leader-elect"]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stats: list[ProcStats] = []
        self.metrics_ports: list[int] = []
        for i in range(k):
            self.metrics_ports.append(free_port())
            out = log.with_name(f"{log.name}-{i}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "greyrelease",
                        "run",
                        "--metrics-port",
                        str(self.metrics_ports[-1]),
                        *args,
                        *extra_args(),
                    ],
                    cwd=ROOT,
                    env=cluster.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
            self.stats.append(ProcStats(self.procs[-1].pid))

    def cpu(self) -> list[float]:
        """Each replica's CPU seconds so far."""
        return [s.cpu() for s in self.stats]

    def stop(self) -> None:
        for s in self.stats:
            s.stop()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def abort_at_once(kube: KubeClient, held: list[tuple[str, str]], timeout: float = 180) -> list[float]:
    """Aborts the releases ``held`` (namespace, name) at once, 8 writers, each as bench.run does (the
    annotation ``greyrelease.io/abort=true``); for each, from its write returning to its Service narrowed to
    a ReplicaSet, seen on a watch of every Service (seconds, in the order of ``held``)."""
    watch = Narrowings(kube)
    watch.start()
    watch.started.wait(10)
    time.sleep(0.5)
    written: dict[tuple[str, str], float] = {}

    def abort(item: tuple[str, str]) -> None:
        kube.patch(
            path("greyrelease.io", "v1", "greyreleases", item[0], item[1]),
            {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}},
        )
        written[item] = time.time()

    try:
        parallel(abort, held, workers=8)
        keys = set(held)
        wait(lambda: len(keys & set(watch.narrowed)) >= len(keys), timeout, "all aborts narrowed", 0.2)
    finally:
        watch.close()
    return [watch.narrowed[h] - written[h] for h in held]


def run_shards(
    cluster: Cluster, kube: KubeClient, n: int, k: int, namespaces: list[str], workdir: Path
) -> dict[str, Any]:
    apps = [(namespaces[i % len(namespaces)], f"app-{i:04d}") for i in range(n)]
    for ns in [*namespaces, SYSTEM]:
        kube.create(path("", "v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for ns in namespaces:
        cluster.wait_for_namespace_ready(ns, timeout=60)

    def make(item: tuple[str, str]) -> None:
        ns, name = item
        dep, svc = app(name)
        kube.create(path("apps", "v1", "deployments", ns), dep)
        kube.create(path("", "v1", "services", ns), svc)

    parallel(make, apps)
    ours = set(namespaces)

    def releases() -> list[dict[str, Any]]:
        return [g for g in kube.list(GREYRELEASES) if g["metadata"]["namespace"] in ours]

    def ready_apps() -> int:
        items = [d for d in kube.list(path("apps", "v1", "deployments")) if d["metadata"]["namespace"] in ours]
        return sum(1 for d in items if (d.get("status") or {}).get("readyReplicas") == 2)

    wait(lambda: ready_apps() == n, 600 * max(1.0, n / 1000), "apps ready", 2)
    replicas = Replicas(cluster, k, SYSTEM, workdir / f"controller-{n}-{k}")
    try:
        time.sleep(10 if k > 1 else 5)  # the replicas share the shards, list and watch before the clock starts
        cpu0 = sum(replicas.cpu())
        started = datetime.now(UTC)
        t0 = time.time()
        batches: list[dict[str, Any]] = [{"replicas": 1, "pause": f"{PAUSE:g}s"}, {"replicas": 2}]

        def create(item: tuple[str, str]) -> None:
            body = release(item[1], "v2", batches)
            # As in bench.compare: past N = 1,000 the 2-core cluster keeps some pods from being ready within
            # the default 600 s, and the run would measure the deadline rule instead of the controllers.
            body["spec"]["progressDeadlineSeconds"] = DEADLINE
            kube.create(path("greyrelease.io", "v1", "greyreleases", item[0]), body)

        parallel(create, apps)
        done = ("Succeeded", "Failed", "Aborted")
        wait(
            lambda: sum(1 for g in releases() if (g.get("status") or {}).get("phase") in done) == n,
            1800 * max(1.0, n / 1000),
            f"{n} releases finished",
            2,
        )
        items = releases()
        done_at = max(parse_time(g["status"].get("phaseStartedAt")) or started for g in items)
        phases = Counter(g["status"]["phase"] for g in items)
        lags, _ = transition_lags((g["status"] for g in items), (PAUSE,))
        cpu_release = sum(replicas.cpu()) - cpu0
        writes: Counter[str] = Counter()
        for ns in namespaces:
            writes += controller_writes(cluster, ns, started)

        # Aborts: up to 200 releases, spread over the namespaces, held at a manual pause, then aborted at once.
        m = min(n, 200)
        held = apps[:m]
        hold = [{"replicas": 1, "pause": "manual"}, {"replicas": 2}]
        parallel(
            lambda item: kube.patch(
                path("greyrelease.io", "v1", "greyreleases", item[0], item[1]),
                {"spec": {"targetVersion": "v3", "batches": hold}},
            ),
            held,
        )
        keys = set(held)

        def live() -> bool:
            got = {(g["metadata"]["namespace"], g["metadata"]["name"]): g.get("status") or {} for g in releases()}
            return all(
                (got[h].get("batchTimes") or {}).get("readyAt") and got[h].get("targetVersion") == "v3" for h in keys
            )

        wait(live, 900 * max(1.0, n / 1000), "held releases live", 2)
        time.sleep(10)  # the held canaries' pods settle
        aborts = abort_at_once(kube, held)
        return {
            "n": n,
            "shards": k,
            "namespaces": len(namespaces),
            "phases": dict(phases),
            "completion_s": round(done_at.timestamp() - t0, 1),
            "lag_p50_s": round(pct(lags, 50), 3),
            "lag_p99_s": round(pct(lags, 99), 3),
            "abort_n": m,
            "abort_p50_s": round(pct(aborts, 50), 3),
            "abort_p99_s": round(pct(aborts, 99), 3),
            "cpu_s": round(cpu_release, 1),
            "peak_rss_mib": [round(s.peak_rss / 2**20, 1) for s in replicas.stats],
            "writes_per_transition": round(sum(writes.values()) / (2 * n), 2),
        }
    finally:
        replicas.stop()
        for g in releases():
            kube.patch(
                path("greyrelease.io", "v1", "greyreleases", g["metadata"]["namespace"], g["metadata"]["name"]),
                {"metadata": {"finalizers": None}},
            )
        for ns in [*namespaces, SYSTEM]:
            kube.delete(path("", "v1", "namespaces", name=ns))
        # The next run creates the same namespaces: wait until these are gone.
        wait(
            lambda: not any(n["metadata"]["name"] in ours | {SYSTEM} for n in kube.list(path("", "v1", "namespaces"))),
            600,
            "namespaces deleted",
            2,
        )


def commit() -> str:
    """The commit measured (with "+changes" when the work tree differs from it)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty.stdout.strip() else "")


def report(results: list[dict[str, Any]], out: Path, command: str) -> None:
    lines = [
        "# One replica and several: shards",
        "",
        f"Produced by `{command}` at commit `{commit()}` on the local cluster (KWOK nodes), 2 cores shared by the",
        "control plane and every replica. Each release: a 2-replica Deployment and its Service; batch 1 = 1",
        "canary pod with a 2 s",
        "pause, batch 2 = all pods, then promotion. The releases are spread evenly over the namespaces, and the",
        "namespaces evenly over the shards.",
        "",
        "| N | shards | namespaces | completion | lag p50 / p99 | abort p50 / p99 | CPU (all replicas) "
        "| peak RSS per replica | writes per transition |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        rss = " / ".join(f"{v:.0f}" for v in r["peak_rss_mib"])
        lines.append(
            f"| {r['n']} | {r['shards']} | {r['namespaces']} | {r['completion_s']} s | {r['lag_p50_s']} / "
            f"{r['lag_p99_s']} s | {r['abort_p50_s']} / {r['abort_p99_s']} s | {r['cpu_s']} s | {rss} MiB | "
            f"{r['writes_per_transition']} |"
        )
    lines += ["", "```json", *(json.dumps(r) for r in results), "```", ""]
    out.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--namespaces", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "bench" / "SHARDS.md"))
    args = parser.parse_args()
    command = (
        f"python -m bench.shards --n {args.n} --shards {' '.join(map(str, args.shards))} --namespaces {args.namespaces}"
    )
    workdir = Path(tempfile.mkdtemp(prefix="greyrelease-shards-"))
    with bench_cluster(workdir) as (cluster, kube):
        namespaces = balanced_namespaces(args.namespaces, max(args.shards))
        results = []
        for k in args.shards:
            print(f"N = {args.n}, {k} shard(s) ...", flush=True)
            results.append(run_shards(cluster, kube, args.n, k, namespaces, workdir))
            print(json.dumps(results[-1]), flush=True)
            report(results, Path(args.out), command)
    print(f"wrote {args.out}; controller logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
