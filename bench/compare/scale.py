"""`make compare`: GreyRelease and Argo Rollouts on the same releases, on one local cluster, one after the other.

For each N and each controller (GreyRelease first, then Argo Rollouts' rollouts-controller), on a fresh
controller process watching every namespace with its leader election on:

1. N apps of 2 replicas with a Service each (replica-ratio mode: the Service selects every pod of the
   app, so a canary pod takes its share of the traffic). GreyRelease: a Deployment + a GreyRelease.
   Argo: a Rollout carrying the same pod template (not a ``workloadRef`` to a Deployment: see
   bench/COMPARISON.md for why).
2. All N released at once from v1 to v2: 1 canary pod of 2 (Argo: ``setWeight: 50``, which is 1 pod of
   2 without a traffic router), a 2 s pause, then all pods, then promotion.
3. The cluster settled, 60 s idle.
4. Up to 200 apps released again (v3) and held at a pause without end, then aborted all at once by 8
   writers (GreyRelease: the ``greyrelease.io/abort`` annotation; Argo: a merge patch of
   ``status.abort: true`` on the status subresource, which is what ``kubectl argo rollouts abort`` sends):
   from the write to the canary pods gone from the ready endpoints of the app's EndpointSlices.
5. The same number of apps behind an nginx canary Ingress (weights on a canary Ingress, no ingress
   controller needed to read them), held at the first pause, aborted: from the write to the canary
   Ingress' ``canary-weight`` being 0.

Before the sizes, the abort cut-off on real requests (``--cutoff-aborts``, 10 by default): the data plane
of the e2e tests (Traefik, pods that answer HTTP on their own addresses) is started for that stage only; one
app of 4 answering pods behind an Ingress of class traefik takes 100 requests/s, is released to 1 canary
pod of 4 and aborted, 10 times per controller: from the abort write (its receipt in the API server's audit
log) to the send time of the last request a canary pod answered (``run_cutoff``).

Every time is taken by this process from watches (the same probe for both controllers): the lag of the
step after the 2 s pause is (advance seen) - (pause seen) - 2 s, completion is the last release seen
done. The controller's CPU and RSS come from /proc, its API requests from the API server's audit log by
User-Agent (bench/audit.py, which also logs reads).

Usage: python -m bench.compare --sizes 100 500 1000 [--cutoff-aborts 10] [--out bench/COMPARISON.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e.harness.controller import CRD, POLICY_CRD
from e2e.harness.controlplane import LocalCluster
from e2e.harness.dataplane import INGRESS_CLASS, DataPlane, serving_gate
from e2e.harness.load import Load
from e2e.harness.process import free_port
from e2e.harness.reliability import audited_writes, parse_time
from greyrelease.kube.client import ApiError, KubeClient, path

from bench import audit
from bench.run import ProcStats, parallel, pct, wait

ROOT = Path(__file__).resolve().parent.parent
PAUSE = 2.0
WRITERS = 8
IDLE_SECONDS = 60
#: progressDeadlineSeconds for both controllers' releases. Argo Rollouts' default only reports a missed
#: deadline (progressDeadlineAbort: false) where GreyRelease rolls the release back; on this 2-core
#: cluster a run of N = 3,000 kept the pods of hundreds of releases from being ready within the default
#: 600 s (475 promotions and 40 batches, load average 8), so both get a deadline no run reaches, and the
#: runs measure the controllers, not their deadline rules.
DEADLINE = 3600
MAX_ABORTS = 200
IMAGE = "registry.example/app:"
ARGO_VERSION = os.environ.get("ARGO_VERSION", "1.10.2")
K8S_VERSION = os.environ.get("K8S_VERSION", "1.37.2")
NGINX = "nginx.ingress.kubernetes.io"
GRACE_SECONDS = 5  # an answering pod's termination grace: how long a deleted one keeps answering


def now() -> datetime:
    return datetime.now(UTC)


# --- watches ----------------------------------------------------------------------------------------


class Watch(threading.Thread):
    """Lists a collection, then watches it, calling ``on_event(type, obj, seen_at)`` for every object
    (the listed ones as ADDED); starts over from a new list when the watch ends or expires."""

    def __init__(
        self, kube: KubeClient, collection: str, on_event: Callable[[str, dict[str, Any], float], None]
    ) -> None:
        super().__init__(daemon=True)
        self.kube = kube
        self.collection = collection
        self.on_event = on_event
        self.listed = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        rv: str | None = None
        while not self.stopped.is_set():
            try:
                if rv is None:
                    listing = self.kube.request("GET", self.collection)
                    t = time.time()
                    for item in listing.get("items") or []:
                        self.on_event("ADDED", item, t)
                    rv = listing["metadata"]["resourceVersion"]
                    self.listed.set()
                for ev in self.kube.watch(self.collection, resource_version=rv, timeout_seconds=240):
                    if self.stopped.is_set():
                        return
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        rv = None  # expired: list again
                        break
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev.get("type") != "BOOKMARK":
                        self.on_event(ev["type"], obj, time.time())
            except Exception as exc:
                if self.stopped.is_set():
                    return
                print(f"watch {self.collection}: {exc!r}; again", file=sys.stderr)
                time.sleep(1)

    def stop(self) -> None:
        self.stopped.set()


@dataclass
class Progress:
    """Where one release stands, read from its object: the version it releases and three milestones."""

    version: str
    paused: bool  # the first step is live and its pause has begun
    advanced: bool  # the step after the pause has begun
    done: bool  # promoted: the new version is the stable one


class Tracker:
    """The first time each (app, version, milestone) was seen on a watch of the controller's objects."""

    def __init__(self, read: Callable[[dict[str, Any]], Progress | None]) -> None:
        self.read = read
        self.seen: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, obj: dict[str, Any], t: float) -> None:
        if kind == "DELETED":
            return
        p = self.read(obj)
        if p is None:
            return
        name = obj["metadata"]["name"]
        with self._lock:
            for milestone in ("paused", "advanced", "done"):
                if getattr(p, milestone):
                    self.seen.setdefault((name, p.version, milestone), t)

    def count(self, names: list[str], version: str, milestone: str) -> int:
        return sum(1 for n in names if (n, version, milestone) in self.seen)

    def at(self, name: str, version: str, milestone: str) -> float | None:
        return self.seen.get((name, version, milestone))


class EndpointProbe:
    """Watches EndpointSlices: which pods are ready endpoints of each Service, and, for Services armed
    with their canary pods, the first time none of those is a ready endpoint any more."""

    def __init__(self) -> None:
        self.slices: dict[str, tuple[str, set[str]]] = {}
        self.canaries: dict[str, set[str]] = {}
        self.armed: set[str] = set()
        self.cut: dict[str, float] = {}
        self._lock = threading.Lock()

    def ready(self, service: str) -> set[str]:
        with self._lock:
            return set().union(*(names for svc, names in self.slices.values() if svc == service))

    def __call__(self, kind: str, obj: dict[str, Any], t: float) -> None:
        meta = obj.get("metadata", {})
        service = (meta.get("labels") or {}).get("kubernetes.io/service-name", "")
        ready = {
            (e.get("targetRef") or {}).get("name", "")
            for e in obj.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready")
        }
        with self._lock:
            if kind == "DELETED":
                self.slices.pop(meta["name"], None)
            else:
                self.slices[meta["name"]] = (service, ready)
            if service in self.armed and service not in self.cut:
                live = set().union(*(names for svc, names in self.slices.values() if svc == service))
                if not live & self.canaries.get(service, set()):
                    self.cut[service] = t

    def arm(self, service: str) -> None:
        with self._lock:
            self.armed.add(service)


class IngressProbe:
    """Watches Ingresses: the canary weight of each app's canary Ingress (found by its canary annotation;
    the app is its backend Service's name without ``-canary``), and for armed apps the first time it is 0."""

    def __init__(self) -> None:
        self.weight: dict[str, str] = {}
        self.armed: set[str] = set()
        self.cut: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, obj: dict[str, Any], t: float) -> None:
        annotations = obj.get("metadata", {}).get("annotations") or {}
        if annotations.get(f"{NGINX}/canary") != "true":
            return
        try:
            backend = obj["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"]
        except (KeyError, IndexError):
            return
        app = backend.removesuffix("-canary")
        weight = "0" if kind == "DELETED" else annotations.get(f"{NGINX}/canary-weight", "0")
        with self._lock:
            self.weight[app] = weight
            if app in self.armed and app not in self.cut and weight == "0":
                self.cut[app] = t

    def arm(self, app: str) -> None:
        with self._lock:
            self.armed.add(app)


# --- the two controllers ------------------------------------------------------------------------------


def service(name: str, selector: dict[str, str], answering: bool = False) -> dict[str, Any]:
    port: dict[str, Any] = {"port": 80, "targetPort": "http", "name": "http"} if answering else {"port": 80}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [port]},
    }


def ingress(name: str) -> dict[str, Any]:
    backend = {"service": {"name": name, "port": {"number": 80}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name},
        "spec": {
            "ingressClassName": "nginx",
            "rules": [
                {
                    "host": f"{name}.example",
                    "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
                }
            ],
        },
    }


def template(name: str, version: str, answering: bool = False) -> dict[str, Any]:
    """The app's pod template; an answering app's pods answer HTTP on port 8080 through the data plane
    (Ready only once they do, and answering for 5 s after their deletion), as e2e/harness/dataplane.py's."""
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": IMAGE + version}]}
    if answering:
        spec["containers"][0]["ports"] = [{"containerPort": 8080, "name": "http"}]
        spec |= {"readinessGates": [serving_gate()], "terminationGracePeriodSeconds": GRACE_SECONDS}
    return {"metadata": {"labels": {"app": name}}, "spec": spec}


@dataclass(frozen=True)
class Shape:
    """An app: its replicas, and whether its pods answer HTTP (the cut-off on real requests)."""

    replicas: int = 2
    answering: bool = False


APP = Shape()


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

    def collection(self, ns: str) -> str:
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

    def collection(self, ns: str) -> str:
        return path("greyrelease.io", "v1", "greyreleases", ns)

    def progress(self, obj: dict[str, Any]) -> Progress | None:
        st = obj.get("status") or {}
        version, phase, batch = st.get("targetVersion", ""), st.get("phase", ""), st.get("currentBatch", 0)
        if not version:
            return None
        return Progress(
            version=version,
            paused=batch == 1 and bool(st.get("batchReadyAt")) and phase in ("Progressing", "Paused"),
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


def argo_steps(hold: bool, replicas: int = 2) -> list[dict[str, Any]]:
    """1 pod of ``replicas`` (without a traffic router Argo splits by replicas), the pause, then all."""
    pause = {} if hold else {"duration": f"{PAUSE:g}s"}
    return [{"setWeight": round(100 / replicas)}, {"pause": pause}, {"setWeight": 100}]


class ArgoContender(Contender):
    def __init__(self, binary: Path) -> None:
        super().__init__(
            "argo", f"Argo Rollouts v{ARGO_VERSION}", ("rollouts-controller", "argo-rollouts"), "argo-rollouts"
        )
        self.binary = binary
        #: (namespace, name) -> the version last seen promoted and its pod-template hash.
        self._promoted: dict[tuple[str, str], tuple[str, str]] = {}

    def start(self, cluster: LocalCluster, log: Path) -> subprocess.Popen[bytes]:
        # Its defaults (every namespace, leader election in argo-rollouts, QPS 40 / burst 80, 10 rollout
        # workers), with its metrics endpoint on; the two ports are chosen free on this shared machine.
        self.command = [
            str(self.binary),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--metricsPort",
            str(free_port()),
            "--healthzPort",
            str(free_port()),
        ]
        return subprocess.Popen(
            self.command, cwd=ROOT, env=cluster.env, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )

    def create_app(self, kube: KubeClient, ns: str, name: str, nginx: bool, shape: Shape = APP) -> None:
        canary: dict[str, Any] = {"steps": argo_steps(False, shape.replicas)}
        if nginx:
            canary.update(
                canaryService=f"{name}-canary", stableService=name, trafficRouting={"nginx": {"stableIngress": name}}
            )
        ro = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": name},
            "spec": {
                "replicas": shape.replicas,
                "selector": {"matchLabels": {"app": name}},
                "progressDeadlineSeconds": DEADLINE,
                "template": template(name, "v1", shape.answering),
                "strategy": {"canary": canary},
            },
        }
        kube.create(path("", "v1", "services", ns), service(name, {"app": name}, shape.answering))
        if nginx:
            kube.create(path("", "v1", "services", ns), service(f"{name}-canary", {"app": name}))
            kube.create(path("networking.k8s.io", "v1", "ingresses", ns), ingress(name))
        kube.create(self.collection(ns), ro)

    def release(
        self, kube: KubeClient, ns: str, name: str, version: str, hold: bool, nginx: bool, shape: Shape = APP
    ) -> None:
        patch = {
            "spec": {
                "template": template(name, version, shape.answering),
                "strategy": {"canary": {"steps": argo_steps(hold, shape.replicas)}},
            }
        }
        kube.patch(f"{self.collection(ns)}/{name}", patch)

    def abort(self, kube: KubeClient, ns: str, name: str) -> None:
        kube.patch(f"{self.collection(ns)}/{name}/status", {"status": {"abort": True}})

    def cutting_write(self, resource: str, name: str, canary_sets: dict[str, str]) -> str | None:
        return canary_sets.get(name) if resource == "replicasets" else None  # the canary scaled to 0

    def collection(self, ns: str) -> str:
        return path("argoproj.io", "v1alpha1", "rollouts", ns)

    def progress(self, obj: dict[str, Any]) -> Progress | None:
        st, spec, meta = obj.get("status") or {}, obj["spec"], obj["metadata"]
        if str(st.get("observedGeneration")) != str(meta.get("generation")):
            return None  # the status is not about this spec yet
        version = spec["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[1]
        key, pod_hash = (meta.get("namespace", ""), meta["name"]), st.get("currentPodHash", "")
        before = self._promoted.get(key)
        if not pod_hash or (before is not None and before[0] != version and before[1] == pod_hash):
            return None  # still the previous template's status
        steps = len(spec["strategy"]["canary"].get("steps") or [])
        index = st.get("currentStepIndex", 0)
        paused = index == 1 and any(c.get("reason") == "CanaryPauseStep" for c in st.get("pauseConditions") or [])
        done = st.get("stableRS") == pod_hash and st.get("phase") == "Healthy" and index == steps
        if done and (before is None or before[0] != version):
            self._promoted[key] = (version, pod_hash)
        return Progress(version=version, paused=paused, advanced=index >= 2, done=done)

    def initial_done(self, tracker: Tracker, names: list[str]) -> bool:
        return tracker.count(names, "v1", "done") == len(names)

    def version(self) -> str:
        out = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout.strip().splitlines() or ["?"])[0]


# --- one controller, one N -------------------------------------------------------------------------------


def pods_settled(kube: KubeClient, ns: str, expected: int | None = None) -> bool:
    """Every pod of the namespace Ready, none on its way out (and ``expected`` of them, when given)."""
    pods = kube.list(path("", "v1", "pods", ns))

    def ready(p: dict[str, Any]) -> bool:
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or []
        )

    return (
        (expected is None or len(pods) == expected)
        and all(ready(p) for p in pods)
        and not any(p["metadata"].get("deletionTimestamp") for p in pods)
    )


def canary_pods(kube: KubeClient, ns: str, version: str) -> dict[str, set[str]]:
    """The pods running ``version``, by app."""
    out: dict[str, set[str]] = {}
    for p in kube.list(path("", "v1", "pods", ns)):
        if p["spec"]["containers"][0]["image"] == IMAGE + version and not p["metadata"].get("deletionTimestamp"):
            out.setdefault(p["metadata"]["labels"]["app"], set()).add(p["metadata"]["name"])
    return out


def new_namespace(cluster: LocalCluster, kube: KubeClient, ns: str) -> None:
    kube.create(path("", "v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.wait_for_namespace_ready(ns, timeout=60)


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


def stop_controller(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def drop_namespace(c: Contender, kube: KubeClient, ns: str) -> None:
    """Deletes the namespace (after whatever would hold it up once the controller is gone); does not wait."""
    try:
        c.cleanup(kube, ns)
        kube.delete(path("", "v1", "namespaces", name=ns))
    except ApiError as exc:
        print(f"cleaning {ns}: {exc}", file=sys.stderr)


def cutting_writes(
    c: Contender,
    cluster: LocalCluster,
    ns: str,
    written: dict[str, float],
    started: float,
    canaries: dict[str, set[str]],
) -> dict[str, float]:
    """For each aborted app, when the API server received the controller's first write that cuts its canary
    off after the abort was written (the audit log). ``canaries``: the canary pods by app."""
    canary_sets = {pod.rsplit("-", 1)[0]: app for app, pods in canaries.items() for pod in pods}
    out: dict[str, float] = {}
    for at, resource, name in audit.writes(cluster, c.agents, ns, datetime.fromtimestamp(started, UTC)):
        app = c.cutting_write(resource, name, canary_sets)
        if app in written and app not in out and at >= written[app] - 0.05:  # the write returns after receipt
            out[app] = at
    return out


def latencies(written: dict[str, float], cut: dict[str, float]) -> list[float]:
    return [cut[name] - t for name, t in written.items() if name in cut]


def run_one(c: Contender, cluster: LocalCluster, kube: KubeClient, n: int, workdir: Path) -> dict[str, Any]:
    ns, ns_nginx = f"cmp-{c.key}-{n}", f"cmp-{c.key}-{n}-nginx"
    names = [f"app-{i:04d}" for i in range(n)]
    m = min(MAX_ABORTS, n)
    held = names[:m]
    # The waits below were sized on N <= 1,000; larger runs get longer in proportion.
    scale = max(1.0, n / 1000)
    for namespace in (ns, ns_nginx):
        new_namespace(cluster, kube, namespace)
    proc = c.start(cluster, workdir / f"{c.key}-{n}.log")
    stats = ProcStats(proc.pid)
    pids = cluster.pids()
    kcm, apiserver = ProcStats(pids["kube-controller-manager"]), ProcStats(pids["kube-apiserver"])
    watches: list[Watch] = []

    def watch(collection: str, on_event: Callable[[str, dict[str, Any], float], None]) -> None:
        w = Watch(kube, collection, on_event)
        w.start()
        w.listed.wait(30)
        watches.append(w)

    try:
        time.sleep(10)  # the controller starts, takes its Lease and syncs its caches on an empty namespace
        rss_base = stats.rss()
        if proc.poll() is not None:
            raise RuntimeError(f"{c.title} exited at start: see {workdir}/{c.key}-{n}.log")
        tracker = Tracker(c.progress)
        watch(c.collection(ns), tracker)
        parallel(lambda name: c.create_app(kube, ns, name, False), names)
        wait(
            lambda: c.initial_done(tracker, names) and pods_settled(kube, ns, 2 * n), 900 * scale, f"{n} apps ready", 2
        )
        time.sleep(5)

        # The releases, all at once.
        since, t0 = now(), time.time()
        cpu0, kcm0, api0 = stats.cpu(), kcm.cpu(), apiserver.cpu()
        parallel(lambda name: c.release(kube, ns, name, "v2", False, False), names)
        wait(lambda: tracker.count(names, "v2", "done") == n, 1800 * scale, f"{n} releases done", 1)
        done = [tracker.at(name, "v2", "done") or t0 for name in names]
        until = now()
        cpu_release, kcm_cpu, api_cpu = stats.cpu() - cpu0, kcm.cpu() - kcm0, apiserver.cpu() - api0
        lags = []
        for name in names:
            paused, advanced = tracker.at(name, "v2", "paused"), tracker.at(name, "v2", "advanced")
            if paused is not None and advanced is not None:
                lags.append(advanced - paused - PAUSE)
        peak_release = stats.peak_rss
        own = c.own_lags(kube, ns)

        # Idle: the cluster settled, nothing left to do.
        wait(lambda: pods_settled(kube, ns, 2 * n), 900 * scale, "cluster settled", 2)
        time.sleep(5)
        idle_from = now()
        time.sleep(IDLE_SECONDS)
        idle = audit.split(audit.requests(cluster, c.agents, idle_from, now()))
        released = audit.split(audit.requests(cluster, c.agents, since, until))

        # Aborts, replica-ratio mode: m apps held at the first step, then aborted at once.
        endpoints = EndpointProbe()
        watch(path("discovery.k8s.io", "v1", "endpointslices", ns), endpoints)
        parallel(lambda name: c.release(kube, ns, name, "v3", True, False), held)
        wait(lambda: tracker.count(held, "v3", "paused") == m, 900, f"{m} releases held", 1)
        wait(lambda: pods_settled(kube, ns, 2 * n), 900 * scale, "held canaries ready", 2)
        canaries = canary_pods(kube, ns, "v3")
        endpoints.canaries = canaries
        wait(
            lambda: all(canaries.get(h) and canaries[h] & endpoints.ready(h) for h in held),
            120,
            "held canaries in the Services' endpoints",
            0.5,
        )
        time.sleep(2)
        cpu_a = stats.cpu()
        written, started = abort_all(c, kube, ns, held, endpoints.arm)
        wait(lambda: len(endpoints.cut) >= m, 300, "every canary out of its Service's endpoints", 0.2)
        abort_wall, abort_cpu = max(endpoints.cut.values()) - started, stats.cpu() - cpu_a
        aborts = latencies(written, endpoints.cut)
        own_cuts = latencies(written, cutting_writes(c, cluster, ns, written, started, canaries))

        # Aborts, nginx canary Ingress mode: m more apps behind an Ingress, held at the first step.
        ingresses = IngressProbe()
        tracker_nginx = Tracker(c.progress)
        watch(c.collection(ns_nginx), tracker_nginx)
        watch(path("networking.k8s.io", "v1", "ingresses", ns_nginx), ingresses)
        parallel(lambda name: c.create_app(kube, ns_nginx, name, True), held)
        wait(
            lambda: c.initial_done(tracker_nginx, held) and pods_settled(kube, ns_nginx, 2 * m),
            900,
            "nginx apps ready",
            2,
        )
        parallel(lambda name: c.release(kube, ns_nginx, name, "v2", True, True), held)
        wait(lambda: tracker_nginx.count(held, "v2", "paused") == m, 900, f"{m} nginx releases held", 1)
        wait(
            lambda: all(ingresses.weight.get(h, "0") != "0" for h in held) and pods_settled(kube, ns_nginx),
            300,
            "canary weights set",
            1,
        )
        time.sleep(2)
        written_nginx, _ = abort_all(c, kube, ns_nginx, held, ingresses.arm)
        wait(lambda: len(ingresses.cut) >= m, 300, "every canary weight 0", 0.2)
        aborts_nginx = latencies(written_nginx, ingresses.cut)
        peak = stats.peak_rss

        def per_transition(counter: Counter[str]) -> float:
            return round(sum(counter.values()) / (2 * n), 2)

        return {
            "n": n,
            "controller": c.key,
            "command": [Path(a).name if a.startswith("/") else a for a in c.command],
            "releases_done": tracker.count(names, "v2", "done"),
            "completion_s": round(max(done) - t0, 1),
            "lag_n": len(lags),
            "lag_p50_s": round(pct(lags, 50), 3),
            "lag_p99_s": round(pct(lags, 99), 3),
            "own_lag_p50_s": round(pct(own, 50), 3) if own else "-",
            "own_lag_p99_s": round(pct(own, 99), 3) if own else "-",
            "abort_n": m,
            "abort_p50_s": round(pct(aborts, 50), 3),
            "abort_p99_s": round(pct(aborts, 99), 3),
            "abort_own_n": len(own_cuts),
            "abort_own_p50_s": round(pct(own_cuts, 50), 3) if own_cuts else "-",
            "abort_own_p99_s": round(pct(own_cuts, 99), 3) if own_cuts else "-",
            "abort_wall_s": round(abort_wall, 2),
            "abort_cpu_s": round(abort_cpu, 2),
            "abort_nginx_p50_s": round(pct(aborts_nginx, 50), 3),
            "abort_nginx_p99_s": round(pct(aborts_nginx, 99), 3),
            "rss_base_mib": round(rss_base / 2**20, 1),
            "peak_rss_release_mib": round(peak_release / 2**20, 1),
            "peak_rss_mib": round(peak / 2**20, 1),
            "rss_per_release_kib": round((peak_release - rss_base) / n / 1024, 1),
            "cpu_s": round(cpu_release, 1),
            "kcm_cpu_s": round(kcm_cpu, 1),
            "apiserver_cpu_s": round(api_cpu, 1),
            "requests_per_transition": per_transition(released["reads"] + released["writes"]),
            "writes_per_transition": per_transition(released["writes"]),
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
    finally:
        for w in watches:
            w.stop()
        for s in (stats, kcm, apiserver):
            s.stop()
        stop_controller(proc)
        for namespace in (ns, ns_nginx):
            drop_namespace(c, kube, namespace)
        for namespace in (ns, ns_nginx):
            gone = path("", "v1", "namespaces", name=namespace)
            wait(lambda: kube.get(gone) is None, 900 * scale, f"namespace {namespace} gone", 2)  # noqa: B023 - called at once


# --- the abort cut-off on real requests ----------------------------------------------------------------------

CUT_RATE = 100.0  # requests/s through Traefik: what e2e/test_traffic.py keeps on this 2-core machine
CUT_ABORTS = 10
CUT_QUIET = 1.5  # seconds without a canary answer after which the cut is taken as done
CUT_SHAPE = Shape(replicas=4, answering=True)


def first_write(
    cluster: LocalCluster, ns: str, t0: float, resources: tuple[str, ...], agents: tuple[str, ...]
) -> float | None:
    """When the API server received the first successful write to one of ``resources`` in ``ns`` by one of
    ``agents`` at or after ``t0`` (its audit log)."""
    since = datetime.fromtimestamp(t0, UTC)
    for w in audited_writes(cluster, namespace=ns, agents=agents, since=since):
        if w.resource in resources and 200 <= w.code < 300:
            return w.at.timestamp()
    return None


def run_cutoff(
    c: Contender, cluster: LocalCluster, kube: KubeClient, dataplane: DataPlane, workdir: Path, aborts: int
) -> dict[str, Any]:
    """One app of 4 answering pods behind an Ingress of class traefik (its Service selects every pod: the
    replica-ratio mode both controllers have), ``CUT_RATE`` requests/s through Traefik; ``aborts`` times:
    release it, hold it at 1 canary pod of 4, wait for canary answers, abort. The cut-off is from the
    abort write (received by the API server, from its audit log) to the send time of the last request a
    canary pod answered, broken down into the controller's first write (a Service for GreyRelease, a
    ReplicaSet for Argo), the canary gone from the EndpointSlices, and the proxy's part."""
    ns, name = f"cut-{c.key}", "web"
    host = f"{name}.{ns}.example"
    new_namespace(cluster, kube, ns)
    proc = c.start(cluster, workdir / f"{c.key}-cutoff.log")
    watches: list[Watch] = []
    cuts: list[float] = []
    parts: list[dict[str, float]] = []
    try:
        tracker = Tracker(c.progress)
        endpoints = EndpointProbe()
        for collection, probe in (
            (c.collection(ns), tracker),
            (path("discovery.k8s.io", "v1", "endpointslices", ns), endpoints),
        ):
            watches.append(Watch(kube, collection, probe))
            watches[-1].start()
            watches[-1].listed.wait(30)
        c.create_app(kube, ns, name, False, CUT_SHAPE)
        front = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": name},
            "spec": {
                "ingressClassName": INGRESS_CLASS,
                "rules": [
                    {
                        "host": host,
                        "http": {
                            "paths": [
                                {
                                    "path": "/",
                                    "pathType": "Prefix",
                                    "backend": {"service": {"name": name, "port": {"number": 80}}},
                                }
                            ]
                        },
                    }
                ],
            },
        }
        kube.create(path("networking.k8s.io", "v1", "ingresses", ns), front)
        wait(
            lambda: c.initial_done(tracker, [name]) and pods_settled(kube, ns, CUT_SHAPE.replicas),
            120,
            "the app ready",
            1,
        )
        with Load(dataplane.gateway_url, CUT_RATE, host=host) as load:
            wait(lambda: any(r.status == 200 for r in load.records), 60, f"{host} answered through Traefik", 0.5)
            for i in range(aborts):
                version = f"v{i + 2}"
                image = IMAGE + version
                c.release(kube, ns, name, version, True, False, CUT_SHAPE)
                wait(lambda v=version: tracker.count([name], v, "paused") == 1, 120, f"{version} held", 0.5)
                seen = time.time()
                wait(
                    lambda s=seen, im=image: sum(1 for r in load.records if r.sent >= s and r.image == im) >= 10,
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
                    lambda im=image: (
                        time.time() - max((r.sent for r in load.records if r.image == im), default=0.0) > CUT_QUIET
                    ),
                    60,
                    "no more canary answers",
                    0.2,
                )
                final = max(r.sent for r in load.records if r.image == image)
                written = first_write(cluster, ns, t0, ("greyreleases", "rollouts"), ("bench-compare",))
                if written is None:
                    raise RuntimeError(f"{c.title}: no abort write in the audit log")
                own = first_write(cluster, ns, written, ("services", "replicasets", "deployments"), c.agents)
                gone = endpoints.cut.get(name)
                cuts.append(final - written)
                part = {
                    "controller write": (own or written) - written,
                    "EndpointSlice update": (gone or final) - (own or written),
                    "proxy": final - (gone or final),
                }
                parts.append(part)
                print(
                    f"{c.title} abort {i + 1}: last canary answer {final - written:.3f} s after the abort write ("
                    + ", ".join(f"{k} {v:.3f} s" for k, v in part.items())
                    + ")",
                    flush=True,
                )
                c.after_abort(kube, ns, name)
                wait(lambda: pods_settled(kube, ns, CUT_SHAPE.replicas), 120, "back to the stable pods", 1)
                time.sleep(1)
            records = load.stop()
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
    finally:
        for w in watches:
            w.stop()
        stop_controller(proc)
        drop_namespace(c, kube, ns)


# --- the report ---------------------------------------------------------------------------------------------

ROWS: list[tuple[str, str, str]] = [
    # (key, label, unit)
    ("completion_s", "completion of all N releases (first release written -> last seen promoted)", "s"),
    ("lag_p50_s", "step after the 2 s pause: lag beyond the pause, p50", "s"),
    ("lag_p99_s", "step after the 2 s pause: lag beyond the pause, p99", "s"),
    ("own_lag_p50_s", "the same by the controller's own record (GreyRelease: history; Argo keeps none), p50", "s"),
    ("own_lag_p99_s", "the same by the controller's own record, p99", "s"),
    ("abort_p50_s", "abort -> canary out of the Service's endpoints (replica ratio), p50", "s"),
    ("abort_p99_s", "abort -> canary out of the Service's endpoints (replica ratio), p99", "s"),
    ("abort_own_p50_s", "of which: abort -> the controller's write that cuts the canary off, p50", "s"),
    ("abort_own_p99_s", "of which: abort -> the controller's write that cuts the canary off, p99", "s"),
    ("abort_cpu_s", "controller CPU while those aborts were cut", "s"),
    ("abort_nginx_p50_s", "abort -> canary weight 0 (nginx canary Ingress), p50", "s"),
    ("abort_nginx_p99_s", "abort -> canary weight 0 (nginx canary Ingress), p99", "s"),
    ("rss_base_mib", "controller RSS at start (empty namespaces)", "MiB"),
    ("peak_rss_mib", "controller peak RSS (whole run)", "MiB"),
    ("rss_per_release_kib", "RSS per release: (peak during the releases - at start) / N", "KiB"),
    ("cpu_s", "controller CPU during the releases", "s"),
    ("kcm_cpu_s", "kube-controller-manager CPU during the releases", "s"),
    ("apiserver_cpu_s", "kube-apiserver CPU during the releases", "s"),
    ("requests_per_transition", "controller API requests per batch transition (reads + writes, Leases apart)", ""),
    ("writes_per_transition", "controller API writes per batch transition (Leases apart)", ""),
    ("idle_writes", f"controller API writes while idle ({IDLE_SECONDS} s, Leases apart)", ""),
    ("idle_requests", f"controller API requests while idle ({IDLE_SECONDS} s, Leases apart)", ""),
    ("idle_lease_writes", f"leader election while idle ({IDLE_SECONDS} s): Lease writes", ""),
    ("idle_lease_reads", f"leader election while idle ({IDLE_SECONDS} s): Lease reads", ""),
]


CUTOFF = "cutoff"  # comparison.json's key of the cut-off on real requests (the other keys are the sizes)
CUT_ROWS: list[tuple[str, str, str]] = [
    ("cut_p50_s", "abort write -> last request answered by a canary pod, p50", "s"),
    ("cut_p99_s", "abort write -> last request answered by a canary pod, p99", "s"),
    ("cut_max_s", "abort write -> last request answered by a canary pod, max", "s"),
    ("controller write_p50_s", "of which: abort write -> the controller's first write (p50)", "s"),
    ("EndpointSlice update_p50_s", "of which: -> the canary out of the EndpointSlices (p50)", "s"),
    ("proxy_p50_s", "of which: -> the last canary answer, Traefik's part (p50)", "s"),
    ("failed", "requests failed (of all sent during the aborts)", ""),
    ("requests", "requests sent", ""),
]


def sizes(runs: dict[str, Any]) -> list[str]:
    return sorted((k for k in runs if k.isdigit()), key=int)


def ratio(a: Any, b: Any) -> str:
    """a / b; none where it means nothing (a figure missing or below 0, such as a pause ended early)."""
    if not isinstance(a, int | float) or not isinstance(b, int | float) or a < 0 or b < 0:
        return "-"
    if b == 0:
        return "-" if a == 0 else "inf"
    return f"{a / b:.2f}"


def table(pair: dict[str, dict[str, Any]], rows: list[tuple[str, str, str]] = ROWS) -> list[str]:
    gr, argo = pair.get("greyrelease", {}), pair.get("argo", {})
    lines = ["| figure | GreyRelease | Argo Rollouts | ratio GR / Argo |", "| --- | --- | --- | --- |"]
    for key, label, unit in rows:
        a, b = gr.get(key, "-"), argo.get(key, "-")
        u = f" {unit}" if unit else ""
        lines.append(f"| {label} | {a}{u if a != '-' else ''} | {b}{u if b != '-' else ''} | {ratio(a, b)} |")
    return lines


EXTRAPOLATE_TO = 10_000
MEMORY_GOAL_MIB = 1024  # GreyRelease's goal: at most 1 GiB at 10,000 releases in one process


def memory_fit(runs: dict[str, Any], who: str) -> tuple[float, float, list[int]] | None:
    """Peak RSS during the releases as a line in N (least squares over the measured sizes of 100 and up,
    where the process' fixed size no longer dominates): (MiB at N = 0, KiB per release, the sizes used)."""
    points = [
        (int(n), runs[n]["results"][who]["peak_rss_release_mib"])
        for n in sizes(runs)
        if int(n) >= 100 and "peak_rss_release_mib" in runs[n]["results"].get(who, {})
    ]
    if len({n for n, _ in points}) < 2:
        return None
    mean_n = sum(n for n, _ in points) / len(points)
    mean_m = sum(m for _, m in points) / len(points)
    slope = sum((n - mean_n) * (m - mean_m) for n, m in points) / sum((n - mean_n) ** 2 for n, _ in points)
    return mean_m - slope * mean_n, slope * 1024, [n for n, _ in points]


def memory_section(runs: dict[str, Any]) -> list[str]:
    fits = {who: memory_fit(runs, who) for who in ("greyrelease", "argo")}
    if not any(fits.values()):
        return []
    lines = [
        f"### Memory at scale: extrapolated to N = {EXTRAPOLATE_TO:,}",
        "",
        "Peak RSS during the releases, fitted as a line in N over the measured sizes of 100 and up (least "
        "squares), then extended. The slope is the memory each release adds; the intercept is the process' "
        f"fixed size. GreyRelease's goal: at most {MEMORY_GOAL_MIB} MiB at {EXTRAPOLATE_TO:,} releases.",
        "",
        "| figure | GreyRelease | Argo Rollouts | ratio GR / Argo |",
        "| --- | --- | --- | --- |",
    ]
    cells: dict[str, tuple[Any, ...]] = {}
    for label, pick in (
        ("sizes fitted", lambda f: " / ".join(map(str, f[2]))),
        ("memory per release (slope)", lambda f: round(f[1], 1)),
        ("fixed size (intercept)", lambda f: round(f[0], 1)),
        (f"peak RSS at N = {EXTRAPOLATE_TO:,}, extrapolated", lambda f: round(f[0] + f[1] * EXTRAPOLATE_TO / 1024)),
    ):
        cells[label] = tuple(pick(fits[w]) if fits[w] else "-" for w in ("greyrelease", "argo"))
    units = {"memory per release (slope)": " KiB", "fixed size (intercept)": " MiB"}
    units[f"peak RSS at N = {EXTRAPOLATE_TO:,}, extrapolated"] = " MiB"
    for label, (a, b) in cells.items():
        u = units.get(label, "")
        r = ratio(a, b) if u else "-"
        lines.append(f"| {label} | {a}{u if a != '-' else ''} | {b}{u if b != '-' else ''} | {r} |")
    gr = fits["greyrelease"]
    if gr:
        at = gr[0] + gr[1] * EXTRAPOLATE_TO / 1024
        verdict = "within" if at <= MEMORY_GOAL_MIB else "over"
        lines += [
            "",
            f"GreyRelease at {EXTRAPOLATE_TO:,} releases, extrapolated: {at:.0f} MiB, {verdict} the "
            f"{MEMORY_GOAL_MIB} MiB goal.",
        ]
    return [*lines, ""]


def cutoff_table(pair: dict[str, dict[str, Any]]) -> list[str]:
    return table(pair, CUT_ROWS)


def write_report(runs: dict[str, Any], out: Path) -> None:
    """Rewrites the measured part of ``out`` (between the markers) and the PNG beside it; the prose
    outside the markers is kept."""
    begin, end = "<!-- measured: begin (bench/compare.py writes this part) -->", "<!-- measured: end -->"
    lines = [begin, ""]
    cut = runs.get(CUTOFF)
    if cut:
        lines += [
            "### The abort cut-off on real requests",
            "",
            f"Measured {cut['date']} at commit `{cut['commit']}`, `{cut['command']}`: one app of 4 answering pods "
            f"behind an Ingress of class traefik, {cut['rate']:g} requests/s through Traefik, released to 1 "
            f"canary pod of 4 and aborted, {cut['aborts']} times per controller.",
            "",
            *cutoff_table(cut["results"]),
            "",
        ]
    for n in sizes(runs):
        run = runs[n]
        lines += [
            f"### N = {n}",
            "",
            f"Measured {run['date']} at commit `{run['commit']}`, `{run['command']}`; {run['abort_n']} aborts at once.",
            "",
            *table(run["results"]),
            "",
            "Controller API requests per batch transition, by verb and resource (audit log):",
            "",
            "| request | GreyRelease | Argo Rollouts |",
            "| --- | --- | --- |",
        ]
        gr, argo = (run["results"].get(k, {}).get("requests_by_kind", {}) for k in ("greyrelease", "argo"))
        for kind in sorted(set(gr) | set(argo)):
            lines.append(f"| {kind} | {gr.get(kind, 0)} | {argo.get(kind, 0)} |")
        lines.append("")
        commands = {k: " ".join(r["command"]) for k, r in run["results"].items()}
        lines += [f"Run as: {', '.join(f'`{v}`' for v in commands.values())}; versions: {run['versions']}.", ""]
    lines += memory_section(runs)
    lines.append(end)
    text = out.read_text() if out.exists() else f"# GreyRelease and Argo Rollouts side by side\n\n{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    out.write_text(head + "\n".join(lines) + tail)
    plot(runs, out.parent / "comparison.png")


def plot(runs: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", file=sys.stderr)
        return
    measured = sizes(runs)
    panels = [
        ("abort_p99_s", "abort p99, replica ratio (s)"),
        ("abort_nginx_p99_s", "abort p99, nginx Ingress (s)"),
        ("lag_p99_s", "lag after the pause, p99 (s)"),
        ("peak_rss_mib", "controller peak RSS (MiB)"),
        ("cpu_s", "controller CPU, releases (s)"),
        ("writes_per_transition", "API writes per transition"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    width = 0.38
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        xs = range(len(measured))
        for i, (who, label) in enumerate((("greyrelease", "GreyRelease"), ("argo", "Argo Rollouts"))):
            vals = [runs[s]["results"].get(who, {}).get(key, float("nan")) for s in measured]
            ax.bar([x + (i - 0.5) * width for x in xs], vals, width, label=label)
        ax.set_xticks(list(xs), [f"N = {s}" for s in measured])
        ax.set_title(title, fontsize=10)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def git_commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    return head + ("+uncommitted changes" if dirty.strip() else "")


def argo_binary() -> Path:
    base = Path(os.environ.get("GREYRELEASE_CACHE", Path.home() / ".cache" / "greyrelease"))
    return Path(os.environ.get("GREYRELEASE_BIN_DIR", base / f"k8s-v{K8S_VERSION}" / "bin")) / "rollouts-controller"


def argo_crds() -> Path:
    base = Path(os.environ.get("GREYRELEASE_CACHE", Path.home() / ".cache" / "greyrelease"))
    return base / f"k8s-v{K8S_VERSION}" / "crd" / f"argo-rollouts-v{ARGO_VERSION}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 500, 1000])
    parser.add_argument(
        "--cutoff-aborts",
        type=int,
        default=CUT_ABORTS,
        help="aborts per controller on real requests, before the sizes (0: none)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "COMPARISON.md"))
    parser.add_argument("--only", choices=("greyrelease", "argo"), help="run one controller (for trying the harness)")
    args = parser.parse_args()
    binary = argo_binary()
    if args.only != "greyrelease" and not (binary.is_file() and (argo_crds() / "kustomization.yaml").is_file()):
        print(f"error: {binary} or its CRDs missing: run `e2e/build/build.sh argo` first", file=sys.stderr)
        return 2
    contenders: list[Contender] = [GreyReleaseContender(), ArgoContender(binary)]
    contenders = [c for c in contenders if args.only in (None, c.key)]
    command = "python -m bench.compare --sizes " + " ".join(map(str, args.sizes))
    command += f" --cutoff-aborts {args.cutoff_aborts}"
    commit = git_commit()  # before this run writes its results
    workdir = Path(tempfile.mkdtemp(prefix="greyrelease-compare-"))
    out = Path(args.out)
    json_path = out.with_name("comparison.json")
    runs: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {}
    cluster = audit.AuditedCluster(workdir / "cluster")
    cluster.start()
    try:
        cluster.kubectl("apply", "-f", str(CRD), "-f", str(POLICY_CRD))
        if args.only != "greyrelease":
            cluster.kubectl("apply", "--server-side", "-k", str(argo_crds()), timeout=120)
        kube = KubeClient.from_environment(str(cluster.kubeconfig))
        kube.user_agent = "bench-compare"  # not a controller's

        def established(crd: str) -> bool:
            got = kube.get(path("apiextensions.k8s.io", "v1", "customresourcedefinitions", name=crd)) or {}
            conditions = (got.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        for crd in ("greyreleases.greyrelease.io", "rollouts.argoproj.io")[: 1 if args.only == "greyrelease" else 2]:
            wait(lambda: established(crd), 60, f"CRD {crd} established", 0.5)  # noqa: B023 - called at once
        for c in contenders:
            new_namespace(cluster, kube, c.lease_namespace)
        versions = ", ".join(f"{c.title}: {c.version()}" for c in contenders)
        versions += f", Kubernetes v{K8S_VERSION} (local control plane, KWOK nodes)"
        if args.cutoff_aborts > 0:
            # Traefik and the pods' responders run for this stage only: the sizes are measured without them.
            dataplane = DataPlane(cluster, workdir / "dataplane")
            dataplane.start()
            try:
                cut: dict[str, Any] = {}
                for c in contenders:
                    print(f"the abort cut-off on real requests, {c.title} ...", flush=True)
                    cut[c.key] = run_cutoff(c, cluster, kube, dataplane, workdir, args.cutoff_aborts)
                    print(json.dumps(cut[c.key]), flush=True)
            finally:
                dataplane.stop()
            runs[CUTOFF] = {
                "date": f"{now():%Y-%m-%d}",
                "commit": commit,
                "command": command,
                "versions": versions,
                "rate": CUT_RATE,
                "aborts": args.cutoff_aborts,
                "results": cut,
            }
            json_path.write_text(json.dumps(runs, indent=2) + "\n")
            write_report(runs, out)
        for n in args.sizes:
            results: dict[str, Any] = {}
            for c in contenders:
                print(f"N = {n}, {c.title} ...", flush=True)
                results[c.key] = run_one(c, cluster, kube, n, workdir)
                print(json.dumps(results[c.key]), flush=True)
                # Written after each controller: a large size takes an hour, and a run stopped half-way
                # keeps what it measured.
                runs[str(n)] = {
                    "date": f"{now():%Y-%m-%d}",
                    "commit": commit,
                    "command": command,
                    "versions": versions,
                    "abort_n": min(MAX_ABORTS, n),
                    "results": results,
                }
                json_path.write_text(json.dumps(runs, indent=2) + "\n")
                write_report(runs, out)
    finally:
        cluster.stop()
    print(f"wrote {out} and {json_path}; controller logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
