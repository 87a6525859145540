"""Driving one controller: what differs between the two (how each runs, its objects, how a release is
started, aborted and read), and GreyRelease's side of it. Argo Rollouts' side is bench/compare/argo.py."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import LocalCluster
from e2e.harness.process import free_port
from e2e.harness.reliability import parse_time
from greyrelease.kube.client import KubeClient, Ref, path

from bench.compare.cluster import APP, ROOT, Shape, ingress, service, template
from bench.compare.probes import Progress, Tracker
from bench.run import wait

PAUSE = 2.0
#: progressDeadlineSeconds for both controllers' releases. Argo Rollouts' default only reports a missed
#: deadline (progressDeadlineAbort: false) where GreyRelease rolls the release back; on this 2-core
#: cluster a run of N = 3,000 kept the pods of hundreds of releases from being ready within the default
#: 600 s (475 promotions and 40 batches, load average 8), so both get a deadline no run reaches, and the
#: runs measure the controllers, not their deadline rules.
DEADLINE = 3600


@dataclass
class Contender:
    """What differs between the two controllers: how they run, their objects, and how a release is
    started, aborted and read."""

    key: str
    title: str
    agents: tuple[str, ...]  # User-Agent prefixes of its API clients
    lease_namespace: str
    command: list[str] = field(default_factory=list)

    def start(self, cluster: LocalCluster, log: Path) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def create_app(self, kube: KubeClient, ns: str, name: str, nginx: bool, shape: Shape = APP) -> None:
        raise NotImplementedError

    def release(
        self, kube: KubeClient, ns: str, name: str, version: str, hold: bool, nginx: bool, shape: Shape = APP
    ) -> None:
        """From the current version to ``version``: 1 pod of ``shape.replicas`` (or that weight), a 2 s pause
        (``hold``: a pause without end), then all pods, then promotion."""
        raise NotImplementedError

    def after_abort(self, kube: KubeClient, ns: str, name: str) -> None:
        """Whatever lets the app be released again once its release was aborted."""

    def cutting_write(self, resource: str, name: str, canary_sets: dict[str, str]) -> str | None:
        """The app whose canary a write of the controller cuts off in replica-ratio mode, if it is one
        (``canary_sets``: the canary pods' ReplicaSets, to their app)."""
        return None

    def abort(self, kube: KubeClient, ns: str, name: str) -> None:
        raise NotImplementedError

    def collection(self, ns: str) -> Ref:
        raise NotImplementedError

    def progress(self, obj: dict[str, Any]) -> Progress | None:
        raise NotImplementedError

    def initial_done(self, tracker: Tracker, names: list[str]) -> bool:
        """The apps at v1 need nothing more from the controller."""
        return True

    def cleanup(self, kube: KubeClient, ns: str) -> None:
        """Whatever would keep the namespace from being deleted once the controller is gone."""

    def own_lags(self, kube: KubeClient, ns: str) -> list[float]:
        """The lag after the pause by the controller's own record, where it keeps one."""
        return []

    def version(self) -> str:
        raise NotImplementedError


def stop_controller(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


class GreyReleaseContender(Contender):
    def __init__(self) -> None:
        super().__init__("greyrelease", "GreyRelease", ("greyrelease", "kopf/"), "greyrelease-system")

    def start(self, cluster: LocalCluster, log: Path) -> subprocess.Popen[bytes]:
        # Every namespace (the default), leader election on (the default: its Lease in greyrelease-system).
        self.command = [sys.executable, "-m", "greyrelease", "run", "--metrics-port", str(free_port())]
        return subprocess.Popen(
            self.command, cwd=ROOT, env=cluster.env, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )

    def create_app(self, kube: KubeClient, ns: str, name: str, nginx: bool, shape: Shape = APP) -> None:
        spec = {
            "replicas": shape.replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template(name, "v1", shape.answering),
        }
        dep = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": spec,
        }
        kube.create(path("apps", "v1", "deployments", ns), dep)
        kube.create(path("", "v1", "services", ns), service(name, {"app": name}, shape.answering))
        if nginx:
            kube.create(path("networking.k8s.io", "v1", "ingresses", ns), ingress(name))

    def release(
        self, kube: KubeClient, ns: str, name: str, version: str, hold: bool, nginx: bool, shape: Shape = APP
    ) -> None:
        first = {"replicas": 1, "pause": "manual" if hold else f"{PAUSE:g}s"}
        batches = [first, {"replicas": shape.replicas}]
        spec = {
            "targetRef": {"name": name},
            "targetVersion": version,
            "batches": batches,
            "progressDeadlineSeconds": DEADLINE,
            "trafficRouting": {"nginx": {"ingress": name, "stableService": name}}
            if nginx
            else {"service": {"name": name}},
        }
        coll = self.collection(ns)
        if kube.get(f"{coll}/{name}") is None:
            kube.create(
                coll,
                {"apiVersion": "greyrelease.io/v1", "kind": "GreyRelease", "metadata": {"name": name}, "spec": spec},
            )
        else:
            kube.patch(f"{coll}/{name}", {"spec": spec})

    def abort(self, kube: KubeClient, ns: str, name: str) -> None:
        kube.patch(f"{self.collection(ns)}/{name}", {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}})

    def cutting_write(self, resource: str, name: str, canary_sets: dict[str, str]) -> str | None:
        return name if resource == "services" else None  # the Service's selector narrowed to the stable

    def after_abort(self, kube: KubeClient, ns: str, name: str) -> None:
        """An aborted GreyRelease stays Aborted: it is deleted (its cleanup removes the canary) and the
        next release is a new one."""
        release = f"{self.collection(ns)}/{name}"
        wait(lambda: ((kube.get(release) or {}).get("status") or {}).get("phase") == "Aborted", 60, "Aborted", 0.5)
        kube.delete(release)
        wait(lambda: kube.get(release) is None, 60, f"GreyRelease {name} deleted", 0.5)

    def collection(self, ns: str) -> Ref:
        return path("greyrelease.io", "v1", "greyreleases", ns)

    def progress(self, obj: dict[str, Any]) -> Progress | None:
        st = obj.get("status") or {}
        version, phase, batch = st.get("targetVersion", ""), st.get("phase", ""), st.get("currentBatch", 0)
        if not version:
            return None
        live = bool((st.get("batchTimes") or {}).get("readyAt"))
        return Progress(
            version=version,
            paused=batch == 1 and live and phase in ("Progressing", "Paused"),
            advanced=batch >= 2 or phase in ("Promoting", "Succeeded"),
            done=phase == "Succeeded",
        )

    def own_lags(self, kube: KubeClient, ns: str) -> list[float]:
        """``history[0]``: finishedAt - readyAt - the pause, the controller's clock at both ends."""
        out = []
        for g in kube.list(self.collection(ns)):
            rec = ((g.get("status") or {}).get("history") or [{}])[0]
            ready, finished = rec.get("readyAt"), rec.get("finishedAt")
            if ready and finished:
                out.append((parse_time(finished) - parse_time(ready)).total_seconds() - PAUSE)
        return out

    def cleanup(self, kube: KubeClient, ns: str) -> None:
        for g in kube.list(self.collection(ns)):
            kube.patch(f"{self.collection(ns)}/{g['metadata']['name']}", {"metadata": {"finalizers": None}})

    def version(self) -> str:
        from greyrelease import __version__

        return __version__
