"""The abort cut-off on real requests (``run_cutoff``): one app of 4 answering pods behind an Ingress of
class traefik (its Service selects every pod: the replica-ratio mode both controllers have),
``CUT_RATE`` requests/s through Traefik; ``aborts`` times: release it, hold it at 1 canary pod of 4, wait
for canary answers, abort. The cut-off is from the abort write (received by the API server, from its
audit log) to the send time of the last request a canary pod answered, broken down into the controller's
first write (a Service for GreyRelease, a ReplicaSet for Argo), the canary gone from the EndpointSlices,
and the proxy's part."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import LocalCluster
from e2e.harness.dataplane import DataPlane
from e2e.harness.load import Load, Record
from greyrelease.kube.client import KubeClient, path

from bench.compare.cluster import (
    IMAGE,
    Shape,
    canary_pods,
    drop_namespace,
    new_namespace,
    pods_settled,
    traefik_ingress,
)
from bench.compare.contender import Contender, stop_controller
from bench.compare.probes import EndpointProbe, Tracker, Watch, first_write
from bench.run import pct, wait

CUT_RATE = 100.0  # requests/s through Traefik: what e2e/test_traffic.py keeps on this 2-core machine
CUT_ABORTS = 10
CUT_QUIET = 1.5  # seconds without a canary answer after which the cut is taken as done
CUT_SHAPE = Shape(replicas=4, answering=True)


@dataclass
class CutoffApp:
    """The stage's one app, ``web`` in its own namespace, and the probes of its release and of its
    Service's endpoints."""

    c: Contender
    cluster: LocalCluster
    kube: KubeClient
    ns: str
    name: str = "web"
    tracker: Tracker = field(init=False)
    endpoints: EndpointProbe = field(default_factory=EndpointProbe)
    watches: list[Watch] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tracker = Tracker(self.c.progress)

    @property
    def host(self) -> str:
        return f"{self.name}.{self.ns}.example"

    def watch(self) -> None:
        """Its release and its EndpointSlices watched (listed once before this returns)."""
        for collection, probe in (
            (self.c.collection(self.ns), self.tracker),
            (path("discovery.k8s.io", "v1", "endpointslices", self.ns), self.endpoints),
        ):
            self.watches.append(Watch(self.kube, collection, probe))
            self.watches[-1].start()
            self.watches[-1].listed.wait(30)

    def create(self) -> None:
        """The app at v1 and its Ingress of class traefik, every pod ready."""
        c, kube, ns, name = self.c, self.kube, self.ns, self.name
        c.create_app(kube, ns, name, False, CUT_SHAPE)
        kube.create(path("networking.k8s.io", "v1", "ingresses", ns), traefik_ingress(name, self.host))
        wait(
            lambda: c.initial_done(self.tracker, [name]) and pods_settled(kube, ns, CUT_SHAPE.replicas),
            120,
            "the app ready",
            1,
        )

    def abort_once(self, load: Load, version: str) -> tuple[float, dict[str, float]]:
        """Released to ``version``, held at 1 canary pod of 4 until the canary answers, aborted. The cut-off
        (abort write -> last canary answer's send time), and its parts."""
        c, kube, ns, name, endpoints = self.c, self.kube, self.ns, self.name, self.endpoints
        image = IMAGE + version
        c.release(kube, ns, name, version, True, False, CUT_SHAPE)
        wait(lambda: self.tracker.count([name], version, "paused") == 1, 120, f"{version} held", 0.5)
        seen = time.time()
        wait(
            lambda: sum(1 for r in load.records if r.sent >= seen and r.image == image) >= 10,
            60,
            f"{version}: canary answers",
            0.2,
        )
        endpoints.canaries = canary_pods(kube, ns, version)
        endpoints.cut.pop(name, None)
        endpoints.arm(name)
        t0 = time.time()
        c.abort(kube, ns, name)
        # Until no canary answer for CUT_QUIET s: every request routed before the cut is answered.
        wait(
            lambda: time.time() - max((r.sent for r in load.records if r.image == image), default=0.0) > CUT_QUIET,
            60,
            "no more canary answers",
            0.2,
        )
        final = max(r.sent for r in load.records if r.image == image)
        written = first_write(self.cluster, ns, t0, ("greyreleases", "rollouts"), ("bench-compare",))
        if written is None:
            raise RuntimeError(f"{c.title}: no abort write in the audit log")
        own = first_write(self.cluster, ns, written, ("services", "replicasets", "deployments"), c.agents)
        gone = endpoints.cut.get(name)
        part = {
            "controller write": (own or written) - written,
            "EndpointSlice update": (gone or final) - (own or written),
            "proxy": final - (gone or final),
        }
        return final - written, part

    def back_to_stable(self) -> None:
        """Whatever lets the app be released again, and its stable pods all ready."""
        self.c.after_abort(self.kube, self.ns, self.name)
        wait(lambda: pods_settled(self.kube, self.ns, CUT_SHAPE.replicas), 120, "back to the stable pods", 1)
        time.sleep(1)


def cutoff_figures(
    c: Contender, cuts: list[float], parts: list[dict[str, float]], records: list[Record]
) -> dict[str, Any]:
    """The controller's entry of comparison.json's cut-off: the cut-offs' percentiles, each part's p50, and
    the requests sent and failed."""
    failed = [r for r in records if r.failed]
    out: dict[str, Any] = {
        "controller": c.key,
        "aborts": len(cuts),
        "rate": CUT_RATE,
        "cut_p50_s": round(pct(cuts, 50), 3),
        "cut_p99_s": round(pct(cuts, 99), 3),
        "cut_max_s": round(max(cuts), 3),
        "requests": len(records),
        "failed": len(failed),
    }
    for key in parts[0]:
        out[f"{key}_p50_s"] = round(pct([p[key] for p in parts], 50), 3)
    return out


def run_cutoff(
    c: Contender, cluster: LocalCluster, kube: KubeClient, dataplane: DataPlane, workdir: Path, aborts: int
) -> dict[str, Any]:
    """The cut-off of ``aborts`` aborts under load, on a fresh controller process and namespace."""
    app = CutoffApp(c, cluster, kube, f"cut-{c.key}")
    new_namespace(cluster, kube, app.ns)
    proc = c.start(cluster, workdir / f"{c.key}-cutoff.log")
    cuts: list[float] = []
    parts: list[dict[str, float]] = []
    try:
        app.watch()
        app.create()
        with Load(dataplane.gateway_url, CUT_RATE, host=app.host) as load:
            wait(lambda: any(r.status == 200 for r in load.records), 60, f"{app.host} answered through Traefik", 0.5)
            for i in range(aborts):
                cut, part = app.abort_once(load, f"v{i + 2}")
                cuts.append(cut)
                parts.append(part)
                print(
                    f"{c.title} abort {i + 1}: last canary answer {cut:.3f} s after the abort write ("
                    + ", ".join(f"{k} {v:.3f} s" for k, v in part.items())
                    + ")",
                    flush=True,
                )
                app.back_to_stable()
            records = load.stop()
        return cutoff_figures(c, cuts, parts, records)
    finally:
        for w in app.watches:
            w.stop()
        stop_controller(proc)
        drop_namespace(c, kube, app.ns)
