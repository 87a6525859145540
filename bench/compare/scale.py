"""One controller at one N (``run_one``), in the order of its steps: the controller started on empty
namespaces, N apps created, all N released at once, the cluster idle, then up to ``MAX_ABORTS`` releases
held and aborted at once, in replica-ratio mode and behind nginx canary Ingresses. Its figures are one
entry of comparison.json."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import LocalCluster
from greyrelease.kube.client import KubeClient, Ref, path

from bench import audit
from bench.compare.cluster import canary_pods, drop_namespace, new_namespace, pods_settled
from bench.compare.contender import PAUSE, Contender, stop_controller
from bench.compare.probes import EndpointProbe, IngressProbe, Tracker, Watch, cutting_writes, latencies, now
from bench.run import ProcStats, parallel, pct, wait

WRITERS = 8
IDLE_SECONDS = 60
MAX_ABORTS = 200

Requests = dict[str, Counter[str]]  # audit.split: reads and writes by "verb resource", Leases apart


@dataclass
class Releases:
    """The N releases from v1 to v2, all at once: when each was seen done, the lag after its pause, and
    what the controller and the control plane spent meanwhile."""

    since: datetime  # the first release written
    until: datetime  # the last seen done
    t0: float
    done: list[float]  # when each release was seen done
    lags: list[float]  # (advance seen) - (pause seen) - the pause, where both were seen
    own_lags: list[float]  # the same by the controller's own record, where it keeps one
    cpu: float
    kcm_cpu: float
    apiserver_cpu: float
    peak_rss: int


@dataclass
class Aborts:
    """Held releases aborted at once: from each abort write to its canary cut off (out of its Service's
    endpoints), and to the controller's own write that cuts it off."""

    latencies: list[float]
    own_cuts: list[float]
    wall: float  # the first abort written -> the last canary cut off
    cpu: float  # the controller's, meanwhile


def abort_all(
    c: Contender, kube: KubeClient, ns: str, held: list[str], arm: Callable[[str], None]
) -> tuple[dict[str, float], float]:
    """Aborts every held release, ``WRITERS`` at a time; returns when each write returned, and the start."""
    written: dict[str, float] = {}

    def one(name: str) -> None:
        arm(name)
        c.abort(kube, ns, name)
        written[name] = time.time()

    started = time.time()
    parallel(one, held, workers=WRITERS)
    return written, started


def namespaces(c: Contender, n: int) -> tuple[str, str]:
    """The run's two namespaces: replica-ratio mode, nginx canary Ingress mode."""
    return f"cmp-{c.key}-{n}", f"cmp-{c.key}-{n}-nginx"


def per_transition(counter: Counter[str], n: int) -> float:
    return round(sum(counter.values()) / (2 * n), 2)


@dataclass
class SizeRun:
    """One controller at one N: its namespaces and apps, its process and the control plane's (CPU and
    memory sampled from /proc), and the watches that time each step."""

    c: Contender
    cluster: LocalCluster
    kube: KubeClient
    n: int
    workdir: Path
    proc: subprocess.Popen[bytes]
    stats: ProcStats  # the controller's
    kcm: ProcStats
    apiserver: ProcStats
    watches: list[Watch] = field(default_factory=list)
    ns: str = field(init=False)
    ns_nginx: str = field(init=False)
    names: list[str] = field(init=False)
    held: list[str] = field(init=False)
    scale: float = field(init=False)

    @classmethod
    def start(cls, c: Contender, cluster: LocalCluster, kube: KubeClient, n: int, workdir: Path) -> SizeRun:
        """The namespaces created (empty), the controller started."""
        for namespace in namespaces(c, n):
            new_namespace(cluster, kube, namespace)
        proc = c.start(cluster, workdir / f"{c.key}-{n}.log")
        stats = ProcStats(proc.pid)
        pids = cluster.pids()
        kcm, apiserver = ProcStats(pids["kube-controller-manager"]), ProcStats(pids["kube-apiserver"])
        return cls(c, cluster, kube, n, workdir, proc, stats, kcm, apiserver)

    def __post_init__(self) -> None:
        self.ns, self.ns_nginx = namespaces(self.c, self.n)
        self.names = [f"app-{i:04d}" for i in range(self.n)]
        self.held = self.names[: min(MAX_ABORTS, self.n)]  # the apps whose releases are held and aborted
        # The waits below were sized on N <= 1,000; larger runs get longer in proportion.
        self.scale = max(1.0, self.n / 1000)

    def watch(self, collection: Ref, on_event: Callable[[str, dict[str, Any], float], None]) -> None:
        w = Watch(self.kube, collection, on_event)
        w.start()
        w.listed.wait(30)
        self.watches.append(w)

    # --- the steps, in order ------------------------------------------------------------------------------

    def controller_up(self) -> int:
        """The controller starts, takes its Lease and syncs its caches on an empty namespace; its RSS then."""
        time.sleep(10)
        rss_base = self.stats.rss()
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.c.title} exited at start: see {self.workdir}/{self.c.key}-{self.n}.log")
        return rss_base

    def apps_ready(self) -> Tracker:
        """N apps at v1, every pod ready; the tracker of their releases."""
        c, kube, ns, n, names = self.c, self.kube, self.ns, self.n, self.names
        tracker = Tracker(c.progress)
        self.watch(c.collection(ns), tracker)
        parallel(lambda name: c.create_app(kube, ns, name, False), names)
        wait(
            lambda: c.initial_done(tracker, names) and pods_settled(kube, ns, 2 * n),
            900 * self.scale,
            f"{n} apps ready",
            2,
        )
        time.sleep(5)
        return tracker

    def release_all(self, tracker: Tracker) -> Releases:
        """All N released at once, from v1 to v2, until each is seen done."""
        c, kube, ns, n, names = self.c, self.kube, self.ns, self.n, self.names
        since, t0 = now(), time.time()
        cpu0, kcm0, api0 = self.stats.cpu(), self.kcm.cpu(), self.apiserver.cpu()
        parallel(lambda name: c.release(kube, ns, name, "v2", False, False), names)
        wait(lambda: tracker.count(names, "v2", "done") == n, 1800 * self.scale, f"{n} releases done", 1)
        done = [tracker.at(name, "v2", "done") or t0 for name in names]
        until = now()
        cpu, kcm_cpu, api_cpu = self.stats.cpu() - cpu0, self.kcm.cpu() - kcm0, self.apiserver.cpu() - api0
        lags = []
        for name in names:
            paused, advanced = tracker.at(name, "v2", "paused"), tracker.at(name, "v2", "advanced")
            if paused is not None and advanced is not None:
                lags.append(advanced - paused - PAUSE)
        peak_rss = self.stats.peak_rss
        own = c.own_lags(kube, ns)
        return Releases(since, until, t0, done, lags, own, cpu, kcm_cpu, api_cpu, peak_rss)

    def idle(self) -> Requests:
        """The cluster settled, nothing left to do: the controller's requests over ``IDLE_SECONDS``."""
        wait(lambda: pods_settled(self.kube, self.ns, 2 * self.n), 900 * self.scale, "cluster settled", 2)
        time.sleep(5)
        idle_from = now()
        time.sleep(IDLE_SECONDS)
        return audit.split(audit.requests(self.cluster, self.c.agents, idle_from, now()))

    def requests(self, releases: Releases) -> Requests:
        """The controller's requests during the releases."""
        return audit.split(audit.requests(self.cluster, self.c.agents, releases.since, releases.until))

    def hold(self, tracker: Tracker) -> tuple[EndpointProbe, dict[str, set[str]]]:
        """Replica-ratio mode: the held apps released again (v3) and held at the first step, their canary
        pods ready endpoints of their Services. The probe of those endpoints, and the canary pods by app."""
        c, kube, ns, n, held = self.c, self.kube, self.ns, self.n, self.held
        endpoints = EndpointProbe()
        self.watch(path("discovery.k8s.io", "v1", "endpointslices", ns), endpoints)
        parallel(lambda name: c.release(kube, ns, name, "v3", True, False), held)
        wait(lambda: tracker.count(held, "v3", "paused") == len(held), 900, f"{len(held)} releases held", 1)
        wait(lambda: pods_settled(kube, ns, 2 * n), 900 * self.scale, "held canaries ready", 2)
        canaries = canary_pods(kube, ns, "v3")
        endpoints.canaries = canaries
        wait(
            lambda: all(canaries.get(h) and canaries[h] & endpoints.ready(h) for h in held),
            120,
            "held canaries in the Services' endpoints",
            0.5,
        )
        return endpoints, canaries

    def abort_held(self, endpoints: EndpointProbe, canaries: dict[str, set[str]]) -> Aborts:
        """The held releases aborted at once, until every canary is out of its Service's endpoints."""
        time.sleep(2)
        cpu_a = self.stats.cpu()
        written, started = abort_all(self.c, self.kube, self.ns, self.held, endpoints.arm)
        wait(lambda: len(endpoints.cut) >= len(self.held), 300, "every canary out of its Service's endpoints", 0.2)
        wall, cpu = max(endpoints.cut.values()) - started, self.stats.cpu() - cpu_a
        aborts = latencies(written, endpoints.cut)
        own_cuts = latencies(written, cutting_writes(self.c, self.cluster, self.ns, written, started, canaries))
        return Aborts(aborts, own_cuts, wall, cpu)

    def hold_nginx(self) -> IngressProbe:
        """Nginx canary Ingress mode: as many apps again behind an Ingress each, released and held at the
        first step with their canary weight set. The probe of those weights."""
        c, kube, ns, held = self.c, self.kube, self.ns_nginx, self.held
        m = len(held)
        ingresses = IngressProbe()
        tracker = Tracker(c.progress)
        self.watch(c.collection(ns), tracker)
        self.watch(path("networking.k8s.io", "v1", "ingresses", ns), ingresses)
        parallel(lambda name: c.create_app(kube, ns, name, True), held)
        wait(
            lambda: c.initial_done(tracker, held) and pods_settled(kube, ns, 2 * m),
            900,
            "nginx apps ready",
            2,
        )
        parallel(lambda name: c.release(kube, ns, name, "v2", True, True), held)
        wait(lambda: tracker.count(held, "v2", "paused") == m, 900, f"{m} nginx releases held", 1)
        wait(
            lambda: all(ingresses.weight.get(h, "0") != "0" for h in held) and pods_settled(kube, ns),
            300,
            "canary weights set",
            1,
        )
        return ingresses

    def abort_held_nginx(self, ingresses: IngressProbe) -> list[float]:
        """Those aborted at once, until every canary weight is 0: the latencies."""
        time.sleep(2)
        written, _ = abort_all(self.c, self.kube, self.ns_nginx, self.held, ingresses.arm)
        wait(lambda: len(ingresses.cut) >= len(self.held), 300, "every canary weight 0", 0.2)
        return latencies(written, ingresses.cut)

    def stop(self) -> None:
        """The watches and samplers stopped, the controller stopped, both namespaces deleted and gone."""
        for w in self.watches:
            w.stop()
        for s in (self.stats, self.kcm, self.apiserver):
            s.stop()
        stop_controller(self.proc)
        for namespace in (self.ns, self.ns_nginx):
            drop_namespace(self.c, self.kube, namespace)
        for namespace in (self.ns, self.ns_nginx):
            gone = path("", "v1", "namespaces", name=namespace)
            wait(lambda: self.kube.get(gone) is None, 900 * self.scale, f"namespace {namespace} gone", 2)  # noqa: B023 - called at once


def figures(
    run: SizeRun,
    tracker: Tracker,
    rss_base: int,
    releases: Releases,
    released: Requests,
    idle: Requests,
    aborts: Aborts,
    aborts_nginx: list[float],
) -> dict[str, Any]:
    """The run's entry of comparison.json (its keys and their order are the report's)."""
    c, n, own, own_cuts = run.c, run.n, releases.own_lags, aborts.own_cuts
    peak = run.stats.peak_rss
    return {
        "n": n,
        "controller": c.key,
        "command": [Path(a).name if a.startswith("/") else a for a in c.command],
        "releases_done": tracker.count(run.names, "v2", "done"),
        "completion_s": round(max(releases.done) - releases.t0, 1),
        "lag_n": len(releases.lags),
        "lag_p50_s": round(pct(releases.lags, 50), 3),
        "lag_p99_s": round(pct(releases.lags, 99), 3),
        "own_lag_p50_s": round(pct(own, 50), 3) if own else "-",
        "own_lag_p99_s": round(pct(own, 99), 3) if own else "-",
        "abort_n": len(run.held),
        "abort_p50_s": round(pct(aborts.latencies, 50), 3),
        "abort_p99_s": round(pct(aborts.latencies, 99), 3),
        "abort_own_n": len(own_cuts),
        "abort_own_p50_s": round(pct(own_cuts, 50), 3) if own_cuts else "-",
        "abort_own_p99_s": round(pct(own_cuts, 99), 3) if own_cuts else "-",
        "abort_wall_s": round(aborts.wall, 2),
        "abort_cpu_s": round(aborts.cpu, 2),
        "abort_nginx_p50_s": round(pct(aborts_nginx, 50), 3),
        "abort_nginx_p99_s": round(pct(aborts_nginx, 99), 3),
        "rss_base_mib": round(rss_base / 2**20, 1),
        "peak_rss_release_mib": round(releases.peak_rss / 2**20, 1),
        "peak_rss_mib": round(peak / 2**20, 1),
        "rss_per_release_kib": round((releases.peak_rss - rss_base) / n / 1024, 1),
        "cpu_s": round(releases.cpu, 1),
        "kcm_cpu_s": round(releases.kcm_cpu, 1),
        "apiserver_cpu_s": round(releases.apiserver_cpu, 1),
        "requests_per_transition": per_transition(released["reads"] + released["writes"], n),
        "writes_per_transition": per_transition(released["writes"], n),
        "requests_by_kind": {
            k: round(v / (2 * n), 2) for k, v in sorted((released["reads"] + released["writes"]).items())
        },
        "lease_writes_release": sum(released["lease_writes"].values()),
        "idle_writes": sum(idle["writes"].values()),
        "idle_requests": sum(idle["reads"].values()) + sum(idle["writes"].values()),
        "idle_lease_writes": sum(idle["lease_writes"].values()),
        "idle_lease_reads": sum(idle["lease_reads"].values()),
        "idle_by_kind": dict(sorted((idle["reads"] + idle["writes"]).items())),
    }


def run_one(c: Contender, cluster: LocalCluster, kube: KubeClient, n: int, workdir: Path) -> dict[str, Any]:
    """One controller at one N, on a fresh controller process and fresh namespaces (deleted at the end)."""
    run = SizeRun.start(c, cluster, kube, n, workdir)
    try:
        rss_base = run.controller_up()
        tracker = run.apps_ready()
        releases = run.release_all(tracker)
        idle = run.idle()
        released = run.requests(releases)
        endpoints, canaries = run.hold(tracker)
        aborts = run.abort_held(endpoints, canaries)
        ingresses = run.hold_nginx()
        aborts_nginx = run.abort_held_nginx(ingresses)
        return figures(run, tracker, rss_base, releases, released, idle, aborts, aborts_nginx)
    finally:
        run.stop()
