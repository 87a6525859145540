"""`python -m bench.standing`: a big cluster at rest, then a burst of releases in it.

N two-replica apps (a Deployment and its Service each) over ``--namespaces`` namespaces, each with a
GreyRelease in follow mode (no ``targetVersion``: it follows its Deployment's template, with the admission
webhook holding a new one), all created in bulk through the API (32 threads) before any controller runs.
Then, for each shard count K, on a local cluster of its own: K controller processes started as
bench.shards starts them (one without a Lease, or K run with ``--shards K``), each with its webhook
(``--webhook-port``), and:

1. start: from the controllers' start to every release ``Idle`` (each Deployment enrolled);
2. at rest: once the controllers' CPU has settled, ``--idle-minutes`` with nothing asked of them;
3. a burst: a new image on M of the Deployments at once (held by the webhook, released in batches: batch 1 =
   1 canary pod and a 2 s pause, batch 2 = both pods, then the promotion), ``--aborts`` of them (their
   batch 1 pauses until approved) aborted together once all of those are held at that pause, while the
   others are still under way; until every one of the M has ended (``Succeeded`` or ``Aborted``);
4. at rest again, for ``--rest-minutes``, once the rollouts have settled.

Measured: each replica's resident memory at rest and at its peak (per step), its CPU at rest (per minute)
and in the burst; the controllers' API requests in each step from the API server's audit log, which here
also logs reads (bench/audit.py), by verb (at rest: no write and no GET; a LIST only when a watch had to
list again); the burst's transition lag and abort latency as bench.run defines them; the time to all
``Idle`` at start. Writes ``STANDING.md`` and ``standing.json``.

The cluster is always a local one (the figures need its audit log), sized for the run: a pod network slot
large enough for every pod at the peak (2 N + 3 M: each released app runs its two pods, a canary of two,
and one more while its Deployment rolls), see e2e/harness/podnet.py.

Usage: python -m bench.standing --n 10000 --shards 1 3 [--burst 1000 --aborts 200 --idle-minutes 10]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import urllib3
from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.follow import registered_port
from e2e.harness.process import free_port
from e2e.harness.reliability import CONTROLLER_AGENTS
from greyrelease.api.release import parse_time
from greyrelease.kube.client import JSON_PATCH, KubeClient, path
from greyrelease.kube.workload import canary_name
from greyrelease.runtime.controller import Tuning

from bench import audit
from bench.compare.contender import DEADLINE
from bench.compare.probes import Watch
from bench.run import (
    PAUSE,
    ROOT,
    ProcStats,
    app,
    bench_cluster,
    bucket_bound,
    metric_counter,
    metric_histograms,
    parallel,
    pct,
    reconcile_durations,
    release,
    transition_lags,
    wait,
)
from bench.shards import Replicas, abort_at_once, balanced_namespaces, commit

SYSTEM = "bench-standing-system"
GREYRELEASES = path("greyrelease.io", "v1", "greyreleases")
DEPLOYMENTS = path("apps", "v1", "deployments")
BATCHES: list[dict[str, Any]] = [{"replicas": 1, "pause": f"{PAUSE:g}s"}, {"replicas": 2}]
HELD: list[dict[str, Any]] = [{"replicas": 1, "pause": "manual"}, {"replicas": 2}]
IMAGE_V2 = "registry.example/app:v2"
TERMINAL = {"Succeeded", "Aborted", "Failed"}
#: A replica is settled when it used less than this share of a core over ``SETTLE_EVERY`` seconds.
SETTLED_CORE = 0.1
SETTLE_EVERY = 10.0
#: The controller's counter of resyncs that made no pass (greyrelease.reconcile.metrics.PASSES_SKIPPED).
UNCHANGED = "greyrelease_passes_skipped"
SETTLE_LIMIT = 300.0  # an idle release's resync period: the rest window starts after at most that
WRITERS = 32  # threads creating and patching at once

Key = tuple[str, str]  # (namespace, name): an app's Deployment, Service and GreyRelease


def peak_pods(n: int, burst: int) -> int:
    """The most pods at once: every app's two, and for each released app a canary of two and one more pod
    while its Deployment rolls (maxSurge 25 % of 2)."""
    return 2 * n + 3 * burst


def layout(n: int, namespaces: list[str]) -> list[Key]:
    """The apps, dealt over the namespaces in turn: any first M of them are spread as evenly."""
    return [(namespaces[i % len(namespaces)], f"app-{i:05d}") for i in range(n)]


# --- what the watches keep ---------------------------------------------------------------------------


class Releases:
    """Every GreyRelease's latest status, kept from a watch (bench.compare's ``Watch``): 10,000 releases are
    counted without listing them again and again."""

    def __init__(self) -> None:
        self.status: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, obj: dict[str, Any], _at: float) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            if kind == "DELETED":
                self.status.pop(key, None)
            else:
                self.status[key] = obj.get("status") or {}

    def of(self, key: Key) -> dict[str, Any]:
        with self._lock:
            return self.status.get(key) or {}

    def count(self, keys: list[Key], phases: set[str]) -> int:
        with self._lock:
            return sum(1 for k in keys if (self.status.get(k) or {}).get("phase") in phases)

    def phases(self, keys: list[Key]) -> dict[str, int]:
        with self._lock:
            return dict(Counter(str((self.status.get(k) or {}).get("phase")) for k in keys))


def settled(d: dict[str, Any]) -> bool:
    """A Deployment with nothing moving: all its pods there and ready, and (unless it is paused, holding a
    template its pods do not run) all of them of its template."""
    want = (d.get("spec") or {}).get("replicas", 1)
    st = d.get("status") or {}
    seen = st.get("observedGeneration", 0) >= d["metadata"].get("generation", 0)
    paused = bool((d.get("spec") or {}).get("paused"))
    return (
        seen
        and st.get("replicas", 0) == want
        and st.get("readyReplicas", 0) == want
        and (paused or st.get("updatedReplicas", 0) == want)
    )


class Deployments:
    """Whether each Deployment is settled, and which canaries exist, kept from a watch."""

    def __init__(self) -> None:
        self.settled: dict[Key, bool] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, obj: dict[str, Any], _at: float) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            if kind == "DELETED":
                self.settled.pop(key, None)
            else:
                self.settled[key] = settled(obj)

    def all_settled(self, keys: list[Key]) -> bool:
        with self._lock:
            return all(self.settled.get(k) for k in keys)

    def count_settled(self, keys: list[Key]) -> int:
        with self._lock:
            return sum(1 for k in keys if self.settled.get(k))

    def canaries(self, keys: list[Key]) -> int:
        with self._lock:
            return sum(1 for ns, name in keys if (ns, canary_name(name)) in self.settled)


# --- the figures -------------------------------------------------------------------------------------


def by_verb(counts: Mapping[str, int]) -> dict[str, int]:
    """Requests counted by "verb resource", summed by verb."""
    out: Counter[str] = Counter()
    for what, n in counts.items():
        out[what.rsplit(" ", 1)[0]] += n
    return dict(sorted(out.items()))


def requests_figures(split: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The controllers' requests in a window (bench/audit.py's ``split``: reads and writes by "verb
    resource", Leases apart), with reads by verb and the dry runs (the hold's self-test) apart from both."""
    reads = {k: v for k, v in split.get("reads", {}).items() if not k.startswith("dryrun ")}
    dry = {k: v for k, v in split.get("reads", {}).items() if k.startswith("dryrun ")}
    writes = dict(split.get("writes", {}))
    return {
        "reads_by_verb": by_verb(reads),
        "reads": dict(sorted(reads.items())),
        "writes": sum(writes.values()),
        "writes_by_request": dict(sorted(writes.items())),
        "dry_runs": dict(sorted(dry.items())),
        "lease_reads": sum(split.get("lease_reads", {}).values()),
        "lease_writes": sum(split.get("lease_writes", {}).values()),
    }


@dataclass
class Rest:
    """What was sampled over a window at rest: each replica's CPU seconds at its start and after each
    minute, its resident memory at the end and its peak, the reconcile passes made, the requests."""

    seconds: float
    cpu: list[list[float]]  # per replica: CPU seconds at the start, then after each minute
    rss: list[int]  # per replica, bytes, at the end
    peak_rss: list[int]  # per replica, bytes, the window's peak
    passes: float
    requests: dict[str, Any] = field(default_factory=dict)  # requests_figures()
    unchanged: float = 0.0  # resyncs left without a pass (nothing the release's last pass read had changed)


def mib(b: float) -> float:
    return round(b / 2**20, 1)


def summarise_rest(r: Rest) -> dict[str, Any]:
    """A window at rest in figures: per replica, CPU seconds per minute (mean and the busiest minute) and
    resident memory (at the end, and the peak); passes per minute; the requests, and whether they are what
    rest should cost (no write, no GET)."""
    minutes = r.seconds / 60 if r.seconds > 0 else float("nan")
    per_minute = [[b - a for a, b in pairwise(c)] for c in r.cpu]
    reqs = r.requests
    return {
        "minutes": round(minutes, 2),
        "cpu_s_per_min": [round((c[-1] - c[0]) / minutes, 2) for c in r.cpu],
        "cpu_s_busiest_min": [round(max(m), 2) if m else float("nan") for m in per_minute],
        "rss_mib": [mib(b) for b in r.rss],
        "peak_rss_mib": [mib(b) for b in r.peak_rss],
        "passes_per_min": round(r.passes / minutes, 1),
        "unchanged_per_min": round(r.unchanged / minutes, 1),
        # All the CPU of the window over its passes: an upper bound on a resync pass's cost when they are many.
        "cpu_ms_per_pass": round(1000 * sum(c[-1] - c[0] for c in r.cpu) / r.passes, 2) if r.passes else None,
        # And over every resync, with or without a pass.
        "cpu_ms_per_resync": round(1000 * sum(c[-1] - c[0] for c in r.cpu) / (r.passes + r.unchanged), 3)
        if r.passes + r.unchanged
        else None,
        "requests": reqs,
        "quiet": bool(reqs) and reqs["writes"] == 0 and reqs["reads_by_verb"].get("get", 0) == 0,
    }


def lags_by_window(statuses: list[dict[str, Any]], window: tuple[float, float]) -> tuple[list[float], list[float]]:
    """The transition lags (as :func:`bench.run.transition_lags`) split by when each transition was due (its
    batch seen ready plus its pause): within ``window`` (epoch seconds, the aborts and the hold on routine
    passes after them) and outside it."""
    inside: list[float] = []
    outside: list[float] = []
    for status in statuses:
        for rec, pause in zip(status.get("history") or [], (PAUSE, 0.0), strict=False):
            ready, fin = parse_time(rec.get("readyAt")), parse_time(rec.get("finishedAt"))
            if ready and fin:
                due = ready.timestamp() + pause
                # A transition due before the window but still waiting when it began was held by it too.
                held = due <= window[1] and fin.timestamp() >= window[0]
                (inside if held else outside).append((fin - ready).total_seconds() - pause)
    return inside, outside


def burst_figures(
    statuses: dict[Key, dict[str, Any]],
    aborted: list[Key],
    aborts: list[float],
    started: float,
    abort_window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The burst's outcome from its releases' final statuses: phases; how long from the first image written
    to the last release ended; the transition lag of those that ran their batches (bench.run's: batch 1
    after its 2 s pause, batch 2 without one), and split by ``abort_window`` (while aborts come in, the
    controller holds routine passes back, up to its ``abort_hold_max``); the abort latencies."""
    cut = set(aborted)
    released = [s for k, s in statuses.items() if k not in cut and s.get("phase") == "Succeeded"]
    lags, timed = transition_lags(released, (PAUSE, 0.0))
    ends = [parse_time(s.get("phaseStartedAt")) for s in statuses.values()]
    end = max((e.timestamp() for e in ends if e is not None), default=float("nan"))
    out: dict[str, Any] = {
        "phases": dict(Counter(str(s.get("phase")) for s in statuses.values())),
        "duration_s": round(end - started, 1),
        "lag_p50_s": round(pct(lags, 50), 3),
        "lag_p99_s": round(pct(lags, 99), 3),
        "timed_lag_p99_s": round(pct(timed, 99), 3),
        "abort_n": len(aborts),
        "abort_p50_s": round(pct(aborts, 50), 3),
        "abort_p99_s": round(pct(aborts, 99), 3),
    }
    if abort_window is not None:
        inside, outside = lags_by_window(released, abort_window)
        out |= {
            "abort_window_s": round(abort_window[1] - abort_window[0], 2),
            "lag_in_abort_window_n": len(inside),
            "lag_in_abort_window_p99_s": round(pct(inside, 99), 3),
            "lag_outside_n": len(outside),
            "lag_outside_p99_s": round(pct(outside, 99), 3),
        }
    return out


#: The controller's histograms read before and after the burst (summed over replicas): its pass threads'
#: queue (by kind, urgent or routine) and its passes' durations (that queue included).
WAITS = {"wait": "greyrelease_pass_wait_seconds", "pass": "greyrelease_reconcile_duration_seconds"}

Histograms = dict[str, tuple[dict[float, float], float, float]]  # label -> ({le: count}, sum, count)


def histograms(ports: list[int]) -> Histograms:
    """The :data:`WAITS` histograms of every replica, summed, keyed "<what>" or "<what>:<label>"."""
    out: Histograms = {}
    for port in ports:
        for what, name in WAITS.items():
            for label, (buckets, total, count) in metric_histograms(port, name).items():
                key = f"{what}:{label}" if label else what
                les, s, c = out.get(key, ({}, 0.0, 0.0))
                for le, n in buckets:
                    les[le] = les.get(le, 0.0) + n
                out[key] = (les, s + total, c + count)
    return out


def waits_between(before: Histograms, after: Histograms) -> dict[str, Any]:
    """What the histograms gained between two reads: per key, how many, the mean and the bucket bound under
    which 99 % fall (seconds)."""
    out: dict[str, Any] = {}
    for key, (les, total, count) in after.items():
        les0, total0, count0 = before.get(key, ({}, 0.0, 0.0))
        n = count - count0
        buckets = [(le, c - les0.get(le, 0.0)) for le, c in les.items()]
        out[key] = {
            "n": n,
            "mean_s": round((total - total0) / n, 4) if n else None,
            "p99_le_s": bucket_bound(buckets, n, 0.99) if n else None,
        }
    return out


# --- the run -----------------------------------------------------------------------------------------


@dataclass
class Config:
    n: int
    namespaces: int
    burst: int
    aborts: int
    idle_minutes: float
    rest_minutes: float
    controller_args: list[str] = field(default_factory=list)


def settle(replicas: Replicas, limit: float) -> float:
    """Waits (at most ``limit`` seconds) until every replica used under ``SETTLED_CORE`` of a core over
    ``SETTLE_EVERY`` seconds; the seconds waited."""
    started = time.monotonic()
    before = replicas.cpu()
    while time.monotonic() - started < limit:
        time.sleep(SETTLE_EVERY)
        after = replicas.cpu()
        if all(b - a < SETTLED_CORE * SETTLE_EVERY for a, b in zip(before, after, strict=True)):
            break
        before = after
    return round(time.monotonic() - started, 1)


def at_rest(replicas: Replicas, seconds: float) -> Rest:
    """``seconds`` at rest: CPU sampled every minute, resident memory at the end and the peak, passes."""
    for s in replicas.stats:
        s.window_peak()
    passes0 = sum(reconcile_durations(p)["passes"] for p in replicas.metrics_ports)
    unchanged0 = sum(metric_counter(p, UNCHANGED) for p in replicas.metrics_ports)
    cpu = [[c] for c in replicas.cpu()]
    started = time.monotonic()
    while (left := seconds - (time.monotonic() - started)) > 0:
        time.sleep(min(60.0, left))
        for series, c in zip(cpu, replicas.cpu(), strict=True):
            series.append(c)
    passes = sum(reconcile_durations(p)["passes"] for p in replicas.metrics_ports) - passes0
    unchanged = sum(metric_counter(p, UNCHANGED) for p in replicas.metrics_ports) - unchanged0
    return Rest(
        seconds=time.monotonic() - started,
        cpu=cpu,
        rss=[s.rss() for s in replicas.stats],
        peak_rss=[s.window_peak() for s in replicas.stats],
        passes=passes,
        unchanged=unchanged,
    )


def etcd_db_bytes(cluster: LocalCluster) -> float:
    """etcd's database size (``etcd_mvcc_db_total_size_in_bytes``), which its quota bounds."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib3.request("GET", f"http://127.0.0.1:{cluster.ports['etcd']}/metrics").data.decode()
    for family in text_string_to_metric_families(text):
        if family.name == "etcd_mvcc_db_total_size_in_bytes":
            return float(family.samples[0].value)
    return float("nan")


def make_namespaces(cluster: Cluster, kube: KubeClient, names: list[str]) -> None:
    for ns in names:
        kube.create(path("", "v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    parallel(partial(cluster.wait_for_namespace_ready, timeout=120), names, workers=8)


def run_standing(
    cluster: LocalCluster, kube: KubeClient, cfg: Config, k: int, namespaces: list[str], workdir: Path
) -> dict[str, Any]:
    scale = max(1.0, cfg.n / 1000)
    apps = layout(cfg.n, namespaces)
    burst, aborted = apps[: cfg.burst], apps[: cfg.aborts]
    cut = set(aborted)
    control_plane = {name: ProcStats(pid) for name, pid in cluster.pids().items() if name in ("kube-apiserver", "etcd")}

    t0 = time.time()
    make_namespaces(cluster, kube, [*namespaces, SYSTEM])

    def make_app(key: Key) -> None:
        dep, svc = app(key[1])
        kube.create(path("apps", "v1", "deployments", key[0]), dep)
        kube.create(path("", "v1", "services", key[0]), svc)

    def make_release(key: Key) -> None:
        body = release(key[1], None, HELD if key in cut else BATCHES)
        body["spec"]["progressDeadlineSeconds"] = DEADLINE  # as bench.shards: the cluster is slow at this size
        kube.create(path("greyrelease.io", "v1", "greyreleases", key[0]), body)

    parallel(make_app, apps, workers=WRITERS)
    apps_created = time.time()
    parallel(make_release, apps, workers=WRITERS)
    releases_created = time.time()
    deployments, releases = Deployments(), Releases()
    watches = [Watch(kube, DEPLOYMENTS, deployments), Watch(kube, GREYRELEASES, releases)]
    for w in watches:
        w.start()
        w.listed.wait(300)
    wait(lambda: deployments.all_settled(apps), 900 * scale, "apps ready", 5)
    apps_ready = time.time()
    print(
        f"  {cfg.n} apps created in {apps_created - t0:.0f} s, their releases in {releases_created - apps_created:.0f}"
        f" s, all ready {apps_ready - t0:.0f} s from the start",
        flush=True,
    )

    replicas = Replicas(
        cluster,
        k,
        SYSTEM,
        workdir / f"controller-{k}",
        lambda: ["--webhook-port", str(free_port()), *cfg.controller_args],
    )
    windows: dict[str, tuple[datetime, datetime | None]] = {}
    try:
        started, started_at = time.time(), datetime.now(UTC)
        wait(lambda: releases.count(apps, {"Idle"}) == cfg.n, 600 * scale, f"{cfg.n} releases Idle", 2)
        all_idle, all_idle_at = time.time(), datetime.now(UTC)
        windows["start"] = (started_at, all_idle_at)
        start = {
            "all_idle_s": round(all_idle - started, 1),
            "cpu_s": [round(c, 1) for c in replicas.cpu()],
            "peak_rss_mib": [mib(s.window_peak()) for s in replicas.stats],
        }
        print(f"  all Idle {start['all_idle_s']} s after the start: {json.dumps(start)}", flush=True)
        if registered_port(cluster) is None:
            raise RuntimeError("no controller registered its webhook")

        start["settle_s"] = settle(replicas, SETTLE_LIMIT)
        idle_from = datetime.now(UTC)
        idle = at_rest(replicas, cfg.idle_minutes * 60)
        windows["idle"] = (idle_from, datetime.now(UTC))
        at_rest_now = {k: v for k, v in summarise_rest(idle).items() if k not in ("requests", "quiet")}
        print(f"  at rest: {json.dumps(at_rest_now)}", flush=True)

        # The burst: a new image on M Deployments at once, held by the webhook and released in batches.
        for s in replicas.stats:
            s.window_peak()
        cpu_burst = replicas.cpu()
        waits0 = histograms(replicas.metrics_ports)
        burst_from, burst_started = datetime.now(UTC), time.time()
        image = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": IMAGE_V2}]
        parallel(
            lambda key: kube.patch(path("apps", "v1", "deployments", key[0], key[1]), image, patch_type=JSON_PATCH),
            burst,
            workers=WRITERS,
        )
        patched = time.time() - burst_started

        def held_at_pause() -> bool:
            return all(releases.of(key).get("batchState") == "WaitingForApproval" for key in aborted)

        wait(held_at_pause, 600 * scale, f"{len(aborted)} releases held at their manual pause", 1)
        in_flight = cfg.burst - len(aborted) - releases.count([b for b in burst if b not in cut], TERMINAL)
        aborts_from = time.time()
        aborts = abort_at_once(kube, aborted, timeout=180 * scale) if aborted else []
        # The aborts' window, and the longest the controller then holds routine passes back (its default).
        abort_window = (aborts_from, time.time() + Tuning.abort_hold_max)
        wait(lambda: releases.count(burst, TERMINAL) == cfg.burst, 1800 * scale, f"{cfg.burst} releases ended", 2)
        windows["burst"] = (burst_from, datetime.now(UTC))
        burst_result = {
            "images_written_s": round(patched, 1),
            "in_flight_at_the_aborts": in_flight,
            **burst_figures({key: releases.of(key) for key in burst}, aborted, aborts, burst_started, abort_window),
            "controller_waits": waits_between(waits0, histograms(replicas.metrics_ports)),
            "cpu_s": [round(b - a, 1) for a, b in zip(cpu_burst, replicas.cpu(), strict=True)],
            "peak_rss_mib": [mib(s.window_peak()) for s in replicas.stats],
        }
        print(f"  burst: {json.dumps(burst_result)}", flush=True)

        # At rest again, once the rollouts are done and the canaries gone.
        wait(
            lambda: deployments.all_settled(burst) and deployments.canaries(burst) == 0,
            900 * scale,
            "rollouts settled, canaries removed",
            5,
        )
        rest_settle = settle(replicas, SETTLE_LIMIT)
        rest_from = datetime.now(UTC)
        rest = at_rest(replicas, cfg.rest_minutes * 60)
        windows["rest"] = (rest_from, datetime.now(UTC))

        counted = audit.requests_by_window(cluster.audit_log, CONTROLLER_AGENTS, windows)
        figures = {name: requests_figures(audit.split(c)) for name, c in counted.items()}
        idle.requests, rest.requests = figures["idle"], figures["rest"]
        for name, r in (("idle", idle), ("rest", rest)):
            if r.requests["writes"]:  # none is expected at rest: say which objects and what was sent
                # One reading of the audit log: whole beside the controllers' logs (the cluster's audit log goes
                # with the cluster), the first 20 cut short in the report.
                whole = audit.write_lines(cluster.audit_log, CONTROLLER_AGENTS, *windows[name], limit=200)
                (workdir / f"writes-{name}-{k}.txt").write_text("\n".join(whole) + "\n")
                r.requests["writes_seen"] = [shortened(line) for line in whole[:20]]
        start["requests"] = figures["start"]
        burst_result["requests"] = figures["burst"]
        return {
            "n": cfg.n,
            "shards": k,
            "namespaces": len(namespaces),
            "burst_n": cfg.burst,
            "setup": {
                "apps_created_s": round(apps_created - t0, 1),
                "releases_created_s": round(releases_created - apps_created, 1),
                "apps_ready_s": round(apps_ready - t0, 1),
            },
            "start": start,
            "idle": summarise_rest(idle),
            "burst": burst_result,
            "rest": {**summarise_rest(rest), "settle_s": rest_settle},
            "peak_rss_mib": [mib(s.peak_rss) for s in replicas.stats],
            "cluster": {
                "etcd_db_mib": mib(etcd_db_bytes(cluster)),
                # The audit log and its rotated files: the API server keeps 1 GB of it (--audit-log-maxsize,
                # --audit-log-maxbackup); what rotated out of that is lost to the counts.
                "audit_log_mib": mib(sum(f.stat().st_size for f in cluster.audit_log.parent.glob("audit*.log"))),
                **{f"{name}_peak_rss_mib": mib(s.peak_rss) for name, s in control_plane.items()},
            },
        }
    finally:
        replicas.stop()
        for w in watches:
            w.stop()
        for s in control_plane.values():
            s.stop()


# --- the report --------------------------------------------------------------------------------------


def per_replica(values: list[float], unit: str) -> str:
    return " / ".join(f"{v:g}" for v in values) + f" {unit}"


def listed(counts: Mapping[str, Any]) -> str:
    """``{"patch deployments": 3, ...}`` as "patch deployments 3, ..." ("none" when empty)."""
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def report(results: list[dict[str, Any]], cfg: Config, command: str, out: Path) -> None:
    lines = [
        "# A big cluster at rest",
        "",
        f"Produced by `{command}` at commit `{commit()}` on the local cluster (KWOK nodes), 2 cores shared by the",
        f"control plane, the benchmark and the controllers. {cfg.n:,} two-replica apps over {cfg.namespaces}",
        "namespaces, each with a GreyRelease in follow mode (Service routing); at rest for",
        f"{cfg.idle_minutes:g} min, then a new image on {cfg.burst:,} Deployments at once (batch 1 = 1 canary pod, 2 s",
        f"pause; batch 2 = both pods; then the promotion), {cfg.aborts} of them held at a manual pause and",
        f"aborted together, then at rest again for {cfg.rest_minutes:g} min. Several values in a cell are one per",
        "replica. How each figure is taken: `bench/README.md`, and `bench/standing.py`.",
        "",
        "| shards | to all Idle | at rest: RSS | CPU per min | passes per min | controller writes, GETs, LISTs, "
        "WATCHes | burst: lag p50 / p99 | abort p50 / p99 | CPU | peak RSS | again at rest: RSS, CPU per min, "
        "writes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        idle, b, rest = r["idle"], r["burst"], r["rest"]
        verbs = idle["requests"]["reads_by_verb"]
        lines.append(
            f"| {r['shards']} | {r['start']['all_idle_s']} s | {per_replica(idle['rss_mib'], 'MiB')} | "
            f"{per_replica(idle['cpu_s_per_min'], 's')} | {idle['passes_per_min']} | "
            f"{idle['requests']['writes']}, {verbs.get('get', 0)}, {verbs.get('list', 0)}, {verbs.get('watch', 0)} | "
            f"{b['lag_p50_s']} / {b['lag_p99_s']} s | {b['abort_p50_s']} / {b['abort_p99_s']} s | "
            f"{sum(b['cpu_s']):.1f} s in {b['duration_s']} s | {per_replica(r['peak_rss_mib'], 'MiB')} | "
            f"{per_replica(rest['rss_mib'], 'MiB')}, {per_replica(rest['cpu_s_per_min'], 's')}, "
            f"{rest['requests']['writes']} |"
        )
    for r in results:
        s, idle, b = r["setup"], r["idle"], r["burst"]
        lines += [
            "",
            f"## {r['shards']} shard(s)",
            "",
            "| step | figure |",
            "| --- | --- |",
            f"| setup | apps created in {s['apps_created_s']} s, their releases in {s['releases_created_s']} s, "
            f"all apps ready {s['apps_ready_s']} s from the first |",
            f"| start | every release Idle {r['start']['all_idle_s']} s after the controllers started; CPU "
            f"{per_replica(r['start']['cpu_s'], 's')}; peak RSS {per_replica(r['start']['peak_rss_mib'], 'MiB')}; "
            f"settled {r['start']['settle_s']} s later |",
            f"| start: controller requests | writes: {listed(r['start']['requests']['writes_by_request'])}; reads: "
            f"{listed(r['start']['requests']['reads'])} |",
            *rest_rows("at rest", idle),
            f"| burst | {listed(b['phases'])}; every image written in {b['images_written_s']} s; all ended "
            f"{b['duration_s']} s after the first; {b['in_flight_at_the_aborts']} others still under way when the "
            "aborts began |",
            f"| burst: transition lag p50 / p99 (after the timed pause only, p99) | {b['lag_p50_s']} / "
            f"{b['lag_p99_s']} s ({b['timed_lag_p99_s']} s) |",
            *split_rows(b),
            f"| burst: abort latency ({b['abort_n']} at once) p50 / p99 | {b['abort_p50_s']} / {b['abort_p99_s']} s |",
            f"| burst: CPU; peak RSS | {per_replica(b['cpu_s'], 's')}; {per_replica(b['peak_rss_mib'], 'MiB')} |",
            f"| burst: controller requests | writes: {listed(b['requests']['writes_by_request'])}; reads: "
            f"{listed(b['requests']['reads'])}; dry runs: {listed(b['requests']['dry_runs'])} |",
            *rest_rows("again at rest", r["rest"]),
            f"| peak RSS over the run | {per_replica(r['peak_rss_mib'], 'MiB')} |",
            f"| cluster | etcd database {r['cluster']['etcd_db_mib']} MiB at the end, audit log "
            f"{r['cluster'].get('audit_log_mib')} MiB; peak RSS "
            + ", ".join(f"{k.removesuffix('_peak_rss_mib')} {v} MiB" for k, v in r["cluster"].items() if "rss" in k)
            + " |",
        ]
    lines += ["", "```json", *(json.dumps(r) for r in results), "```", ""]
    out.write_text("\n".join(lines))
    out.with_name("standing.json").write_text(json.dumps(results, indent=2) + "\n")


def split_rows(b: dict[str, Any]) -> list[str]:
    """The burst's lag split by the aborts' window, and the controller's own queue and passes over the burst
    (absent from runs before they were measured)."""
    rows = []
    if "lag_outside_n" in b:
        rows.append(
            f"| burst: transition lag p99 due within the aborts' window ({b['abort_window_s']} s, the hold on "
            f"routine passes included) / outside it | {b['lag_in_abort_window_p99_s']} s "
            f"({b['lag_in_abort_window_n']} transitions) / {b['lag_outside_p99_s']} s ({b['lag_outside_n']}) |"
        )
    waits = b.get("controller_waits") or {}
    if waits:
        cells = [
            f"{key}: {w['n']:.0f}, mean {w['mean_s']} s, p99 under {w['p99_le_s']} s"
            for key, w in sorted(waits.items())
            if w["n"]
        ]
        rows.append(f"| burst: the controller's pass queue (wait:kind) and passes (pass) | {'; '.join(cells)} |")
    return rows


def shortened(line: str, width: int = 400) -> str:
    """A line of :func:`bench.audit.write_lines` with its body cut at ``width`` characters."""
    head, sep, body = line.partition(": ")
    return head + sep + body[:width]


def cell(text: str) -> str:
    """``text`` in a cell of a Markdown table (a pipe would end the cell)."""
    return text.replace("|", "\\|")


def rest_rows(what: str, w: dict[str, Any]) -> list[str]:
    req = w["requests"]
    leases = f"; Leases: {req['lease_reads']} reads, {req['lease_writes']} writes" if req["lease_writes"] else ""
    return [
        f"| {what} ({w['minutes']:g} min) | RSS {per_replica(w['rss_mib'], 'MiB')} (peak "
        f"{per_replica(w['peak_rss_mib'], 'MiB')}); CPU {per_replica(w['cpu_s_per_min'], 's')} a minute (busiest "
        f"minute {per_replica(w['cpu_s_busiest_min'], 's')}); {w['passes_per_min']} passes a minute"
        + (f" ({w['cpu_ms_per_pass']} ms of CPU per pass, all the CPU counted)" if w.get("cpu_ms_per_pass") else "")
        + (
            f", {w['unchanged_per_min']} resyncs a minute without a pass (nothing read had changed; "
            f"{w['cpu_ms_per_resync']} ms of CPU per resync, all the CPU counted)"
            if w.get("unchanged_per_min")
            else ""
        )
        + " |",
        f"| {what}: controller requests | writes: {listed(req['writes_by_request'])}; reads by verb: "
        f"{listed(req['reads_by_verb'])} ({listed(req['reads'])}); dry runs: {listed(req['dry_runs'])}{leases}; "
        f"{'quiet (no write, no GET)' if w['quiet'] else 'NOT quiet'} |",
        *(f"| {what}: a write | `{cell(line)}` |" for line in req.get("writes_seen", [])),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.standing", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=10000, help="standing releases (apps)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1], help="shard counts, one run (and cluster) each")
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--burst", type=int, default=1000, help="releases started at once after the rest")
    parser.add_argument("--aborts", type=int, default=200, help="of those, aborted together")
    parser.add_argument("--idle-minutes", type=float, default=10.0)
    parser.add_argument("--rest-minutes", type=float, default=3.0, help="at rest again after the burst")
    parser.add_argument(
        "--controller-args",
        default="",
        help='more arguments for every replica, e.g. "--resync-seconds 240" for resync passes within the windows',
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "STANDING.md"))
    args = parser.parse_args()
    cfg = Config(
        args.n,
        args.namespaces,
        min(args.burst, args.n),
        args.aborts,
        args.idle_minutes,
        args.rest_minutes,
        shlex.split(args.controller_args),
    )
    cfg.aborts = min(cfg.aborts, cfg.burst)
    command = (
        f"python -m bench.standing --n {cfg.n} --shards {' '.join(map(str, args.shards))} --namespaces "
        f"{cfg.namespaces} --burst {cfg.burst} --aborts {cfg.aborts} --idle-minutes {cfg.idle_minutes:g} "
        f"--rest-minutes {cfg.rest_minutes:g}"
    ) + (f" --controller-args {shlex.quote(args.controller_args)}" if args.controller_args else "")
    namespaces = balanced_namespaces(cfg.namespaces, max(args.shards), prefix="bench-standing")
    workdir = Path(tempfile.mkdtemp(prefix="greyrelease-standing-"))
    results = []
    for k in args.shards:
        print(f"N = {cfg.n}, {k} shard(s) ...", flush=True)
        local = partial(audit.AuditedCluster, pods=peak_pods(cfg.n, cfg.burst))
        with bench_cluster(workdir / f"shards-{k}", local, external=False, timeout=120) as (cluster, kube):
            assert isinstance(cluster, LocalCluster)
            results.append(run_standing(cluster, kube, cfg, k, namespaces, workdir))
        print(json.dumps(results[-1]), flush=True)
        report(results, cfg, command, Path(args.out))
    print(f"wrote {args.out}; controller logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
