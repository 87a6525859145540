"""Helpers for the reliability tests (e2e/test_reliability.py): the API server's audit log read back, a
Prometheus that answers too late, a controller killed at random moments, and the checks that a finished
release left nothing behind."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from greyrelease.api.release import TRACK_LABEL

from e2e.harness.controller import Controller, app_manifest, wait_for
from e2e.harness.controlplane import Cluster, LocalCluster

#: User agents of the controller's two API clients: its own (greyrelease.kube.client) and kopf's.
CONTROLLER_AGENTS = ("greyrelease", "kopf/")
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


# --- the API server's audit log ----------------------------------------------------------------------


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Write:
    """One write the API server audited."""

    at: datetime
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    agent: str
    code: int
    body: Any

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return (
            f"{self.at:%H:%M:%S.%f} {self.agent.split(' ')[0]:<14} {self.verb:<6} "
            f"{self.resource}{sub}/{self.name} {self.code}"
        )


def dry_run(ev: dict[str, Any]) -> bool:
    """An audited request sent with ``dryRun`` (the controller's self-test of the hold, a GitOps tool's
    diff): admitted and answered, stored nowhere, so not a write."""
    return "dryRun" in parse_qs(urlsplit(ev.get("requestURI", "")).query)


def audited_writes(
    cluster: LocalCluster,
    *,
    namespace: str | None = None,
    agents: Iterable[str] = CONTROLLER_AGENTS,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Write]:
    """Writes in the local API server's audit log, by clients whose User-Agent starts with one of
    `agents` (all clients when empty), in `namespace`, received in [since, until); dry runs are none."""
    agents = tuple(agents)
    found: list[Write] = []
    for ev in audit_events(cluster.audit_log):
        if ev.get("verb") not in WRITE_VERBS or dry_run(ev):
            continue
        agent = ev.get("userAgent") or ""
        if agents and not agent.startswith(agents):
            continue
        ref = ev.get("objectRef") or {}
        if namespace is not None and ref.get("namespace") != namespace:
            continue
        at = parse_time(ev["requestReceivedTimestamp"])
        if (since is not None and at < since) or (until is not None and at >= until):
            continue
        found.append(
            Write(
                at=at,
                verb=ev["verb"],
                resource=ref.get("resource", ""),
                subresource=ref.get("subresource", ""),
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                agent=agent,
                code=int((ev.get("responseStatus") or {}).get("code") or 0),
                body=ev.get("requestObject"),
            )
        )
    return found


def audit_events(log: Path) -> Iterator[dict[str, Any]]:
    """Every event of the API server's audit log `log` and of the backups it rotated out of it
    (`audit-<time>.log` beside it, see --audit-log-maxsize), oldest file first. Reading only `log` lost
    the writes of a long run's first part (bench.shards at N = 3,000 counted 3.07 writes per transition
    instead of 9.5)."""
    backups = sorted(log.parent.glob(f"{log.stem}-*{log.suffix}"))  # the names sort by rotation time
    for f in [*backups, log]:
        if not f.exists():
            continue
        with f.open(errors="replace") as lines:
            for line in lines:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a line being written


# --- a Prometheus that answers too late ------------------------------------------------------------------


class SlowPrometheus:
    """A loopback HTTP server that answers Prometheus' instant-query API (one series, `value`) only after
    `delay` seconds. Every request sleeps at most `delay` (and not at all once close() was called)."""

    def __init__(self, delay: float, value: float = 0.01) -> None:
        self.delay = delay
        self.value = value
        self.requests = 0
        self._closing = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                with outer._lock:
                    outer.requests += 1
                outer._closing.wait(outer.delay)
                body = json.dumps(
                    {
                        "status": "success",
                        "data": {
                            "resultType": "vector",
                            "result": [{"metric": {}, "value": [time.time(), str(outer.value)]}],
                        },
                    }
                ).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up waiting: that is the point

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SlowPrometheus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()


# --- a controller killed at random moments ------------------------------------------------------------


@dataclass
class Chaos:
    """Kills `controller` with SIGKILL `up` seconds after each (re)start has made it ready (/readyz: its
    watches listed, passes running; drawn from `rng`), and starts it again after `down` seconds, until
    stop(). Counted from readiness, not from the spawn: on a loaded machine the import alone can take
    longer than `up`, and a controller killed before it runs a pass tests nothing."""

    controller: Controller
    rng: random.Random
    up: tuple[float, float] = (0.5, 4.0)
    down: tuple[float, float] = (0.0, 0.5)
    kills: int = 0
    schedule: list[tuple[float, float]] = field(default_factory=list)
    #: Seconds from each (re)start to /readyz.
    startups: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            up, down = self.rng.uniform(*self.up), self.rng.uniform(*self.down)
            self.startups.append(round(self.controller.wait_ready(120), 2))
            if self._stop.wait(up):
                return
            self.controller.kill()
            self.kills += 1
            self.schedule.append((round(up, 2), round(down, 2)))
            time.sleep(down)
            self.controller.start()

    def stop(self) -> None:
        """Stops killing; the controller is left running."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.controller.proc is None or self.controller.proc.poll() is not None:
            self.controller.start()


# --- apps and what a release leaves behind -------------------------------------------------------------


def deploy_apps(
    cluster: Cluster,
    namespace: str,
    apps: dict[str, int],
    image: str = "registry.example/app:v1",
    timeout: float = 90.0,
) -> None:
    """Deployments (with a Service each) named and sized by `apps`, all applied at once; waits until all
    are ready."""
    manifest = "\n---\n".join(app_manifest(name, replicas, image) for name, replicas in apps.items())
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def ready() -> bool:
        items = cluster.kubectl_json("get", "deployments", "-n", namespace)["items"]
        have = {d["metadata"]["name"]: (d.get("status") or {}).get("readyReplicas") or 0 for d in items}
        return all(have.get(name) == n for name, n in apps.items())

    wait_for(ready, timeout, f"{len(apps)} apps ready", 0.5)


def leftovers(cluster: Cluster, namespace: str) -> list[str]:
    """Canary objects (Deployments, ReplicaSets, pods with the track label) and narrowed Services."""
    found = []
    for kind in ("deployments", "replicasets", "pods"):
        items = cluster.kubectl_json("get", kind, "-n", namespace, "-l", TRACK_LABEL)["items"]
        found += [f"{kind}/{i['metadata']['name']}" for i in items if not i["metadata"].get("deletionTimestamp")]
    for svc in cluster.kubectl_json("get", "services", "-n", namespace)["items"]:
        meta = svc["metadata"]
        if any(k.startswith("greyrelease.io/") for k in meta.get("annotations") or {}):
            found.append(f"services/{meta['name']} (annotated)")
        if "pod-template-hash" in (svc["spec"].get("selector") or {}):
            found.append(f"services/{meta['name']} (narrowed)")
    return found


def wait_no_leftovers(cluster: Cluster, namespace: str, timeout: float = 60.0) -> list[str]:
    """Waits for the garbage collector; returns what is still left after `timeout` (nothing, hopefully)."""
    left: list[str] = []

    def clean() -> bool:
        nonlocal left
        left = leftovers(cluster, namespace)
        return not left

    with contextlib.suppress(AssertionError):
        wait_for(clean, timeout, "no canary objects left", 1.0)
    return left


def release_events(cluster: Cluster, namespace: str) -> dict[str, Counter[tuple[str, str]]]:
    """Per GreyRelease, how many times each (reason, message) Event was posted (counting `count`)."""
    items = cluster.kubectl_json(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.kind=GreyRelease"
    )["items"]
    out: dict[str, Counter[tuple[str, str]]] = {}
    for ev in items:
        name = ev["involvedObject"]["name"]
        out.setdefault(name, Counter())[(ev.get("reason") or "", ev.get("message") or "")] += int(ev.get("count") or 1)
    return out


def batch_ready_counts(evs: dict[tuple[str, str], int]) -> dict[int, int]:
    """BatchReady Events per batch number, from (reason, message) counts."""
    out: dict[int, int] = {}
    for (reason, message), n in evs.items():
        if reason == "BatchReady":
            k = int(message.split("/")[0].split()[-1])
            out[k] = out.get(k, 0) + n
    return out
