"""What is measured, and how: every time is taken by this process from watches, the same probe for both
controllers (where each release stands, which pods a Service sends to, each canary Ingress' weight), and
the controllers' writes are read back from the API server's audit log."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from e2e.harness.controlplane import LocalCluster
from e2e.harness.reliability import audited_writes
from greyrelease.kube.client import KubeClient, Ref

from bench import audit
from bench.compare.cluster import NGINX

if TYPE_CHECKING:
    from bench.compare.contender import Contender


def now() -> datetime:
    return datetime.now(UTC)


# --- watches ----------------------------------------------------------------------------------------


class Watch(threading.Thread):
    """Lists a collection, then watches it, calling ``on_event(type, obj, seen_at)`` for every object
    (the listed ones as ADDED); starts over from a new list when the watch ends or expires."""

    def __init__(
        self, kube: KubeClient, collection: Ref, on_event: Callable[[str, dict[str, Any], float], None]
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


# --- the audit log ---------------------------------------------------------------------------------------


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


def latencies(written: dict[str, float], cut: dict[str, float]) -> list[float]:
    return [cut[name] - t for name, t in written.items() if name in cut]
