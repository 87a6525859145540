"""`make bench`: many releases at once on the local cluster, measured from the outside.

For each N: N two-replica Deployments with a Service each, one controller process watching their
namespace, and N GreyReleases applied at once (batch 1: 1 canary pod, 2 s pause; batch 2: all pods; then
promotion). Measured:

- completion time, and the lag of each batch transition beyond its planned pause (``history[].readyAt``
  to ``finishedAt``, minus the pause), p50/p99;
- abort latency: from the abort annotation being written to the Service selector narrowing (weight 0)
  being seen on a watch of the Services, for up to 200 releases held at a manual pause, p50/p99;
- the controller's CPU seconds and peak resident memory (from /proc);
- API requests per release by verb, from the API server's own ``apiserver_request_total`` (resources the
  controller uses; the API server's metrics are per resource, not per client, so the setup's own writes
  are subtracted and the rest of the control plane does not write those resources);
- API writes while idle, over 60 s after every release finished;
- what the per-release series on /metrics hold in memory at N = 1,000 (:mod:`bench.series`, in this
  process: no cluster needed).

Usage: python -m bench.run --sizes 100 500 1000 [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from e2e.harness.controller import CRD, POLICY_CRD
from e2e.harness.controlplane import Cluster, LocalCluster, external_cluster
from e2e.harness.process import free_port
from greyrelease.api.release import parse_time
from greyrelease.kube.client import KubeClient, path

from bench import series as bench_series

ROOT = Path(__file__).resolve().parent.parent
PROFILE = os.environ.get("GREYRELEASE_BENCH_PROFILE") == "1"
RESOURCES = {"greyreleases", "deployments", "replicasets", "services", "events"}
# Resources only the controller writes (the Deployment controller writes Deployments' status, which is
# not counted; ReplicaSets and Events are written by the rest of the control plane too).
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
PAUSE = 2.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int = 16) -> list[Any]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


class ProcStats:
    """CPU seconds and peak RSS of one process, sampled from /proc (and the peak of the current window, see
    :meth:`window_peak`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = 0
        self._window_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def window_peak(self) -> int:
        """The peak RSS since the last call (since the start, the first time); a new window begins."""
        peak, self._window_rss = self._window_rss, 0
        return peak

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.rss()
            except OSError:
                return
            self.peak_rss = max(self.peak_rss, rss)
            self._window_rss = max(self._window_rss, rss)
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()


#: A per-request series of the API server by (verb, resource): counts of requests, or sums of seconds.
Totals = dict[tuple[str, str], float]


def grown(after: Totals, before: Totals) -> Totals:
    """What each total grew by between two readings (a total absent before had grown from 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def api_counts(kube: KubeClient, family_name: str = "apiserver_request", suffix: str = "_total") -> Totals:
    """apiserver_request_total by (verb, resource), for the resources the controller uses (or another
    per-request series of the API server, e.g. the sum of apiserver_request_duration_seconds)."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = kube._pool.request("GET", kube.host + "/metrics", headers=kube._headers())
    counts: Totals = {}
    for family in text_string_to_metric_families(resp.data.decode()):
        if family.name != family_name:
            continue
        for s in family.samples:
            labels = s.labels
            if not s.name.endswith(suffix) or labels.get("resource") not in RESOURCES:
                continue
            if labels.get("subresource") not in ("", None, "status") or labels.get("verb") == "WATCH":
                continue
            if labels["resource"] == "deployments" and labels.get("subresource") == "status":
                continue  # the Deployment controller's status updates
            resource = labels["resource"] + ("/status" if labels.get("subresource") == "status" else "")
            key = (labels["verb"], resource)
            counts[key] = counts.get(key, 0.0) + s.value
    return counts


class ServiceWatch(threading.Thread):
    """Watches the Services of a namespace; records when each one's selector is first narrowed."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        super().__init__(daemon=True)
        self.kube = kube
        self.namespace = namespace
        self.narrowed: dict[str, float] = {}
        self.started = threading.Event()
        self._resp: Any = None

    def run(self) -> None:
        listing = self.kube.request("GET", path("", "v1", "services", self.namespace))
        rv = listing["metadata"]["resourceVersion"]
        url = self.kube.host + path("", "v1", "services", self.namespace).path + f"?watch=1&resourceVersion={rv}"
        self._resp = self.kube._pool.request(
            "GET",
            url,
            headers=self.kube._headers(),
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=600),
        )
        self.started.set()
        buf = b""
        try:
            for chunk in self._resp.stream(4096):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    event = json.loads(line)
                    obj = event.get("object", {})
                    name = obj.get("metadata", {}).get("name", "")
                    if "pod-template-hash" in (obj.get("spec", {}).get("selector") or {}) and name not in self.narrowed:
                        self.narrowed[name] = time.time()
        except Exception:  # the watch ends when the benchmark closes it
            return

    def close(self) -> None:
        if self._resp is not None:
            self._resp.release_conn()


def api_latency(kube: KubeClient) -> tuple[Totals, Totals]:
    """The API server's own request durations: (sum of seconds, count) by (verb, resource)."""
    name = "apiserver_request_duration_seconds"
    return api_counts(kube, name, "_sum"), api_counts(kube, name, "_count")


def metric_histograms(port: int, name: str) -> dict[str, tuple[list[tuple[float, float]], float, float]]:
    """One histogram of the controller's /metrics, by its label values: (buckets (le, count), sum, count)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib3.request("GET", f"http://127.0.0.1:{port}/metrics").data.decode()
    out: dict[str, tuple[list[tuple[float, float]], float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            key = ",".join(v for k, v in sorted(sample.labels.items()) if k != "le")
            buckets, total, count = out.get(key, ([], 0.0, 0.0))
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                total = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
            out[key] = (buckets, total, count)
    return out


def metric_counter(port: int, name: str) -> float:
    """A counter of the controller's /metrics without labels (``name`` without ``_total``); 0 when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib3.request("GET", f"http://127.0.0.1:{port}/metrics").data.decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name == f"{name}_total")
    return 0.0


def bucket_bound(buckets: list[tuple[float, float]], count: float, share: float) -> float:
    """The bucket bound under which ``share`` of the observations fall."""
    return next((le for le, n in sorted(buckets) if count and n >= share * count), float("nan"))


def reconcile_durations(port: int) -> dict[str, float]:
    """The controller's reconcile pass durations (its /metrics histogram, queueing for a thread included):
    the mean and the bucket bound under which 99% fall."""
    buckets, total, count = metric_histograms(port, "greyrelease_reconcile_duration_seconds").get("", ([], 0.0, 0.0))
    p99 = bucket_bound(buckets, count, 0.99)
    return {"passes": count, "mean_s": round(total / count, 4) if count else float("nan"), "p99_le_s": p99}


def gc_pauses(port: int) -> dict[str, float]:
    """The controller's garbage collections by generation (2, the oldest, walks every object; every
    thread waits for each): how many, their total, and the bucket bound of the longest; and the total."""
    by_generation = metric_histograms(port, "greyrelease_gc_pause_seconds")
    out: dict[str, float] = {}
    for g in ("0", "1", "2"):
        buckets, total, count = by_generation.get(g, ([], 0.0, 0.0))
        out |= {f"gen{g}_n": count, f"gen{g}_s": round(total, 3), f"gen{g}_max_le_s": bucket_bound(buckets, count, 1.0)}
    out["all_s"] = round(sum(t for _, t, _ in by_generation.values()), 3)
    return out


def controller_writes(cluster: Cluster, namespace: str, since: datetime) -> Counter[str]:
    """Writes by the controller (its User-Agents) in ``namespace`` since ``since``, by resource, from the
    API server's audit log (which, unlike its metrics, knows the client)."""
    from e2e.harness.reliability import audited_writes

    if not isinstance(cluster, LocalCluster):
        return Counter()
    return Counter(
        w.resource + (f"/{w.subresource}" if w.subresource else "")
        for w in audited_writes(cluster, namespace=namespace, since=since)
    )


def settled(kube: KubeClient, ns: str, deployments: int) -> bool:
    """Nothing left moving in the namespace: that many Deployments, each rolled out (all its replicas
    updated and ready, and no others), and no pod on its way out."""
    items = kube.list(path("apps", "v1", "deployments", ns))
    pods = kube.list(path("", "v1", "pods", ns))

    def rolled_out(d: dict[str, Any]) -> bool:
        want: int = d["spec"].get("replicas", 1)
        st = d.get("status") or {}
        counts: tuple[int, int, int] = (st.get("readyReplicas", 0), st.get("updatedReplicas", 0), st.get("replicas", 0))
        return counts == (want, want, want)

    return (
        len(items) == deployments
        and all(rolled_out(d) for d in items)
        and len(pods) == sum(d["spec"].get("replicas", 1) for d in items)
        and not any(p["metadata"].get("deletionTimestamp") for p in pods)
    )


def app(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    labels = {"app": name}
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:v1"}]},
            },
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": labels, "ports": [{"port": 80}]},
    }
    return dep, svc


def release(name: str, version: str | None, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """GreyRelease ``name`` of Deployment ``name`` in Service mode, to ``version``; without one (None), in
    follow mode."""
    spec: dict[str, Any] = {"targetRef": {"name": name}}
    if version is not None:
        spec["targetVersion"] = version
    spec |= {"batches": batches, "trafficRouting": {"service": {"name": name}}}
    return {"apiVersion": "greyrelease.io/v1", "kind": "GreyRelease", "metadata": {"name": name}, "spec": spec}


def transition_lags(statuses: Iterable[dict[str, Any]], pauses: tuple[float, ...]) -> tuple[list[float], list[float]]:
    """How late each batch transition came beyond its planned pause (``history[].finishedAt - readyAt``,
    minus the pause of that batch, ``pauses[i]`` for batch i + 1): all of them, and those after a timed
    pause only (a pause of 0 is none)."""
    lags: list[float] = []
    timed: list[float] = []
    for status in statuses:
        for rec, pause in zip(status.get("history") or [], pauses, strict=False):
            ready, fin = parse_time(rec.get("readyAt")), parse_time(rec.get("finishedAt"))
            if ready and fin:
                lags.append((fin - ready).total_seconds() - pause)
                if pause:
                    timed.append(lags[-1])
    return lags, timed


def wait(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(what)


@contextlib.contextmanager
def bench_cluster(
    workdir: Path,
    local_cluster: Callable[[Path], LocalCluster] = LocalCluster,
    *,
    external: bool = True,
    timeout: float = 15.0,
) -> Iterator[tuple[Cluster, KubeClient]]:
    """The cluster KUBECONFIG points at (unless not ``external``), else a local one made by ``local_cluster``
    and started in ``workdir`` (stopped at the end), with the CRDs applied; and a client (giving up on a
    request after ``timeout`` seconds) whose own writes are not counted as the controller's."""
    cluster = external_cluster() if external else None
    local = None
    if cluster is None:
        local = local_cluster(workdir / "cluster")
        local.start()
        cluster = local
    try:
        cluster.kubectl("apply", "-f", str(CRD), "-f", str(POLICY_CRD))
        cluster.kubectl("wait", "--for=condition=Established", "crd/greyreleases.greyrelease.io", "--timeout=30s")
        kube = KubeClient.from_environment(str(cluster.kubeconfig), timeout=timeout)
        kube.user_agent = "bench"
        yield cluster, kube
    finally:
        if local is not None:
            local.stop()


def namespace_of_apps(cluster: Cluster, kube: KubeClient, ns: str, n: int) -> list[str]:
    """The namespace ``ns`` with ``n`` ready apps (a 2-replica Deployment and its Service each); their names."""
    kube.create(path("", "v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.wait_for_namespace_ready(ns, timeout=60)
    names = [f"app-{i:04d}" for i in range(n)]

    def make(name: str) -> None:
        dep, svc = app(name)
        kube.create(path("apps", "v1", "deployments", ns), dep)
        kube.create(path("", "v1", "services", ns), svc)

    parallel(make, names)

    def all_ready() -> bool:
        items = kube.list(path("apps", "v1", "deployments", ns))
        return sum(1 for d in items if d.get("status", {}).get("readyReplicas") == 2) == n

    wait(all_ready, 600, "apps ready", 2)
    return names


def run_size(cluster: Cluster, kube: KubeClient, n: int, workdir: Path) -> dict[str, Any]:
    ns = f"bench-{n}"
    gr_path = path("greyrelease.io", "v1", "greyreleases", ns)
    names = namespace_of_apps(cluster, kube, ns, n)

    log = (workdir / f"controller-{n}.log").open("wb")
    metrics_port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "greyrelease",
            "run",
            "--namespace",
            ns,
            "--no-leader-elect",
            "--metrics-port",
            str(metrics_port),
        ],
        cwd=ROOT,
        env=cluster.env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    stats = ProcStats(proc.pid)
    spy = None
    if PROFILE:
        # Sampled from outside the process: what the controller spends its CPU on (collapsed stacks).
        # --nonblocking: py-spy reads the process without pausing it (pausing it 50 times a second put the
        # lag p99 at N = 500 at 3.5-29.6 s, which measured the profiler). --gil: only the thread holding
        # the GIL is sampled, the one running Python; without it the pool's waiting threads took 67-81 % of
        # the samples although py-spy leaves idle threads out by default.
        spy = subprocess.Popen(
            [
                "py-spy",
                "record",
                "--nonblocking",
                "--gil",
                "--pid",
                str(proc.pid),
                "--format",
                "raw",
                "--rate",
                "50",
                "--output",
                str(workdir / f"profile-{n}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        time.sleep(5)  # the controller lists and watches before the clock starts
        cpu0 = stats.cpu()
        counts0 = api_counts(kube)
        latency0 = api_latency(kube)
        started = datetime.now(UTC)
        t0 = time.time()
        batches: list[dict[str, Any]] = [{"replicas": 1, "pause": f"{PAUSE:g}s"}, {"replicas": 2}]
        parallel(lambda name: kube.create(gr_path, release(name, "v2", batches)), names)

        def finished() -> bool:
            items = kube.list(gr_path)
            done = ("Succeeded", "Failed", "Aborted")
            return sum(1 for g in items if (g.get("status") or {}).get("phase") in done) == n

        wait(finished, 1800, f"{n} releases finished", 1)
        items = kube.list(gr_path)
        done_at = max(
            parse_time(g["status"].get("phaseStartedAt")) or datetime.fromtimestamp(t0).astimezone() for g in items
        )
        phases = Counter(g["status"]["phase"] for g in items)
        # timed: the transitions after a timed pause only (batch 1)
        lags, timed = transition_lags((g["status"] for g in items), (PAUSE, 0.0))
        cpu_release = stats.cpu() - cpu0
        counts1 = api_counts(kube)
        latency1 = api_latency(kube)
        passes = reconcile_durations(metrics_port)
        collections = gc_pauses(metrics_port)
        release_writes = controller_writes(cluster, ns, started)

        # Idle: every release finished and the cluster has settled (the promoted canaries' pods are
        # gone); nothing should be written by the controller, which is only asked to look every 5 min.
        wait(lambda: settled(kube, ns, n), 900, "cluster settled", 2)
        idle_from = datetime.now(UTC)
        time.sleep(60)
        idle_writes = controller_writes(cluster, ns, idle_from)

        # Abort latency: hold up to 200 releases at a manual pause, then abort them all.
        m = min(n, 200)
        held = names[:m]
        hold = [{"replicas": 1, "pause": "manual"}, {"replicas": 2}]
        parallel(lambda name: kube.patch(f"{gr_path}/{name}", {"spec": {"targetVersion": "v3", "batches": hold}}), held)

        def live() -> bool:
            got = {g["metadata"]["name"]: g.get("status") or {} for g in kube.list(gr_path)}
            return all(
                (got[h].get("batchTimes") or {}).get("readyAt") and got[h].get("targetVersion") == "v3" for h in held
            )

        wait(live, 900, "held releases live", 1)
        wait(lambda: settled(kube, ns, n + m), 900, "held canaries ready, nothing else moving", 2)
        watch = ServiceWatch(kube, ns)
        watch.start()
        watch.started.wait(10)
        time.sleep(0.5)
        written: dict[str, float] = {}

        def abort(name: str) -> None:
            kube.patch(f"{gr_path}/{name}", {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}})
            written[name] = time.time()

        cpu_abort = stats.cpu()
        abort_started = time.time()
        parallel(abort, held, workers=8)
        wait(lambda: len(watch.narrowed) >= m, 120, "all aborts narrowed", 0.2)
        abort_wall, cpu_abort = time.time() - abort_started, stats.cpu() - cpu_abort
        watch.close()
        aborts = [watch.narrowed[h] - written[h] for h in held]
        wait(lambda: sum(1 for g in kube.list(gr_path) if g["status"]["phase"] == "Aborted") == m, 900, "aborted", 2)

        delta = grown(counts1, counts0)
        delta[("POST", "greyreleases")] = delta.get(("POST", "greyreleases"), 0.0) - n  # the benchmark's own creates
        per_release = {f"{verb} {res}": round(v / n, 2) for (verb, res), v in sorted(delta.items()) if v > 0}
        seconds, calls = grown(latency1[0], latency0[0]), grown(latency1[1], latency0[1])
        api_ms = {}
        for (verb, res), count in sorted(calls.items()):
            if count >= n and verb in WRITES | {"GET"}:
                api_ms[f"{verb} {res}"] = round(1000 * seconds.get((verb, res), 0.0) / count, 1)
        return {
            "n": n,
            "phases": dict(phases),
            "completion_s": round((done_at.timestamp() - t0), 1),
            "lag_p50_s": round(pct(lags, 50), 3),
            "lag_p99_s": round(pct(lags, 99), 3),
            "timed_lag_p50_s": round(pct(timed, 50), 3),
            "timed_lag_p99_s": round(pct(timed, 99), 3),
            "abort_n": m,
            "abort_p50_s": round(pct(aborts, 50), 3),
            "abort_p99_s": round(pct(aborts, 99), 3),
            "cpu_s": round(cpu_release, 1),
            "abort_cpu_s": round(cpu_abort, 2),
            "abort_wall_s": round(abort_wall, 2),
            "peak_rss_mib": round(stats.peak_rss / 2**20, 1),
            "requests_per_release": per_release,
            "api_latency_ms": api_ms,
            "reconcile": passes,
            "gc": collections,
            "writes_per_transition": round(sum(release_writes.values()) / (2 * n), 2),
            "writes_per_transition_by_resource": {k: round(v / (2 * n), 2) for k, v in sorted(release_writes.items())},
            "idle_writes_60s": sum(idle_writes.values()),
        }
    finally:
        stats.stop()
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
            print(top_functions(workdir / f"profile-{n}.txt"))
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        for g in kube.list(gr_path):
            kube.patch(f"{gr_path}/{g['metadata']['name']}", {"metadata": {"finalizers": None}})
        kube.delete(path("", "v1", "namespaces", name=ns))


def top_functions(collapsed: Path, limit: int = 15) -> str:
    """The functions where the controller spent most samples (inclusive), from py-spy's raw output."""
    totals: Counter[str] = Counter()
    samples = 0
    if not collapsed.exists():
        return "no profile"
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        samples += n
        for frame in set(stack.split(";")):
            if any(lib in frame for lib in ("greyrelease", "kopf", "json", "pydantic", "urllib3")):
                totals[frame] += n
    rows = [f"{100 * v / max(samples, 1):5.1f}%  {k}" for k, v in totals.most_common(limit)]
    return f"{samples} samples\n" + "\n".join(rows)


#: Controller writes per batch transition (all resources, Events included) for the release shape here.
WRITES_BOUND = 15


def goals(results: list[dict[str, Any]]) -> list[str]:
    """The issue's goals, each against the run that decides it (met / missed / not run)."""
    by_n = {r["n"]: r for r in results}

    def row(what: str, n: int, value: Any, ok: Callable[[Any], bool], unit: str = "") -> str:
        r = by_n.get(n)
        if r is None:
            return f"| {what} | N = {n} not run | - |"
        v = value(r)
        return f"| {what} | {v}{unit} at N = {n} | {'met' if ok(v) else 'missed'} |"

    worst = max(results, key=lambda r: r["writes_per_transition"])
    return [
        "## Goals",
        "",
        "| goal | measured | |",
        "| --- | --- | --- |",
        row("abort p99 <= 1 s", 500, lambda r: r["abort_p99_s"], lambda v: v <= 1.0, " s"),
        row("transition lag p99 <= 1 s", 500, lambda r: r["lag_p99_s"], lambda v: v <= 1.0, " s"),
        row("the same, timed pauses only", 500, lambda r: r["timed_lag_p99_s"], lambda v: v <= 1.0, " s"),
        row("peak resident memory <= 300 MiB", 1000, lambda r: r["peak_rss_mib"], lambda v: v <= 300, " MiB"),
        row(
            f"writes per batch transition <= {WRITES_BOUND}",
            worst["n"],
            lambda r: r["writes_per_transition"],
            lambda v: v <= WRITES_BOUND,
        ),
        row("API writes while idle = 0", max(by_n), lambda r: r["idle_writes_60s"], lambda v: v == 0),
        "",
    ]


def report(results: list[dict[str, Any]], command: str, out: Path, series: dict[str, Any] | None = None) -> None:
    lines = [
        "# Benchmark results",
        "",
        f"Produced by `{command}` on the local cluster (KWOK nodes), 2 cores. Each release: a 2-replica",
        "Deployment and its Service; batch 1 = 1 canary pod with a 2 s pause, batch 2 = all pods, then",
        "promotion. Abort latency: annotation written -> Service narrowed to the stable ReplicaSet, seen on a watch.",
        "What the figures mean, the goals and the profile: `bench/README.md`.",
        "",
        *goals(results),
        *(bench_series.lines(series) if series is not None else []),
    ]
    for r in results:
        lines += [
            f"## N = {r['n']}",
            "",
            "| metric | value |",
            "| --- | --- |",
            f"| phases | {r['phases']} |",
            f"| completion (apply -> last Succeeded) | {r['completion_s']} s |",
            f"| transition lag beyond the pause, p50 / p99 | {r['lag_p50_s']} s / {r['lag_p99_s']} s |",
            f"| the same, after the timed pauses only (batch 1), p50 / p99 "
            f"| {r['timed_lag_p50_s']} s / {r['timed_lag_p99_s']} s |",
            f"| abort latency ({r['abort_n']} releases at once), p50 / p99 "
            f"| {r['abort_p50_s']} s / {r['abort_p99_s']} s |",
            f"| controller CPU while the aborts were cut (first written -> last narrowed) "
            f"| {r['abort_cpu_s']} s in {r['abort_wall_s']} s |",
            f"| controller CPU during the releases | {r['cpu_s']} s |",
            f"| controller peak resident memory | {r['peak_rss_mib']} MiB |",
            f"| controller API writes per batch transition (audit log, all resources) | {r['writes_per_transition']} "
            f"({', '.join(f'{k} {v}' for k, v in r['writes_per_transition_by_resource'].items())}) |",
            f"| controller API writes while idle (60 s, after the cluster settled) | {r['idle_writes_60s']:g} |",
            f"| reconcile passes per release; mean pass; 99% of passes under "
            f"| {r['reconcile']['passes'] / r['n']:.1f}; "
            f"{1000 * r['reconcile']['mean_s']:.1f} ms; {r['reconcile']['p99_le_s']:g} s |",
            *(
                [
                    "| garbage collections (every thread waits), generations 0 / 1 / 2: count; total; longest "
                    "under | "
                    + " / ".join(
                        f"{r['gc'][f'gen{g}_n']:g}; {r['gc'][f'gen{g}_s']} s; {r['gc'][f'gen{g}_max_le_s']:g} s"
                        for g in range(3)
                    )
                    + " |"
                ]
                if "gc" in r
                else []
            ),
            "",
            "Mean API server time per request during the releases (its own `apiserver_request_duration_seconds`,",
            "all clients), for requests made at least N times:",
            "",
            "| request | mean |",
            "| --- | --- |",
            *[f"| {k} | {v} ms |" for k, v in r["api_latency_ms"].items()],
            "",
            "API requests per release, by verb and resource (ReplicaSet writes and most Events come from the",
            "Deployment and ReplicaSet controllers, not from GreyRelease):",
            "",
            "| request | per release |",
            "| --- | --- |",
            *[f"| {k} | {v} |" for k, v in r["requests_per_release"].items()],
            "",
        ]
    out.write_text("\n".join(lines) + "\n")
    (out.parent / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ns = [r["n"] for r in results]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(ns, [r["abort_p99_s"] for r in results], "o-", label="abort p99")
    ax1.plot(ns, [r["abort_p50_s"] for r in results], "o--", label="abort p50")
    ax1.plot(ns, [r["lag_p99_s"] for r in results], "s-", label="transition lag p99")
    ax1.plot(ns, [r["lag_p50_s"] for r in results], "s--", label="transition lag p50")
    ax1.set_xlabel("concurrent releases")
    ax1.set_ylabel("seconds")
    ax1.legend()
    ax2.plot(ns, [r["peak_rss_mib"] for r in results], "o-", color="tab:red")
    ax2.set_xlabel("concurrent releases")
    ax2.set_ylabel("controller peak RSS (MiB)")
    fig.tight_layout()
    fig.savefig(out.parent / "results.png", dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    command = "python -m bench.run --sizes " + " ".join(map(str, args.sizes))
    # The per-release series' memory, in this process before the cluster starts (no controller needed).
    series = bench_series.measure(1000)
    print(json.dumps({"series": series}), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="greyrelease-bench-"))
    with bench_cluster(workdir) as (cluster, kube):
        results = []
        for n in args.sizes:
            print(f"N = {n} ...", flush=True)
            result = run_size(cluster, kube, n, workdir)
            print(json.dumps(result), flush=True)
            results.append(result)
            report(results, command, Path(args.out), series)
    print(f"wrote {args.out}; controller logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
