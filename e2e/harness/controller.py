"""Helpers for end-to-end tests of the controller: the CRD as shipped, the controller as its own process
(``greyrelease run``), and small apps to release. The `crd` and `controller` fixtures built on them live in
e2e/conftest.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from e2e.harness.controlplane import Cluster
from e2e.harness.process import free_port

ROOT = Path(__file__).resolve().parents[2]  # the repository
CRD = ROOT / "crds" / "greyrelease.io_greyreleases.yaml"
POLICY_CRD = ROOT / "crds" / "greyrelease.io_greyreleasepolicies.yaml"

T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """The first true value ``predicate`` returns, asked every ``interval`` seconds for ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Controller:
    """``greyrelease run`` in a subprocess, watching one namespace (or several, given a list)."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str | list[str],
        log: Path,
        extra_env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespaces = [namespace] if isinstance(namespace, str) else list(namespace)
        self.namespace = self.namespaces[0]
        self.log = log
        self.env = {**cluster.env, **(extra_env or {})}
        self.args = extra_args or []
        if not any(a.startswith("--health-port") for a in self.args):
            self.args = [*self.args, "--health-port", str(free_port())]
        self.health_port = int(
            next(
                a.split("=", 1)[1] if "=" in a else self.args[i + 1]
                for i, a in enumerate(self.args)
                if a.startswith("--health-port")
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "greyrelease",
                "run",
                *(a for ns in self.namespaces for a in ("--namespace", ns)),
                *self.args,
            ],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ready(self) -> bool:
        """Whether the controller answers /readyz: started, its watches listed, passes running."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until :meth:`ready`; the seconds it took."""
        started = time.monotonic()
        wait_for(self.ready, timeout, "the controller's /readyz", 0.05)
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as a crashed node would do it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` (e.g. SIGSTOP and SIGCONT: a process cut off from everything, then back)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no log: never started)"


def drop_releases(cluster: Cluster, namespace: str) -> None:
    """Delete the namespace's GreyReleases without a controller: their finalizer would hold the namespace."""
    cluster.kubectl("delete", "gr", "--all", "-n", namespace, "--wait=false", check=False)
    for name in cluster.kubectl("get", "gr", "-n", namespace, "-o", "name", check=False).stdout.split():
        cluster.kubectl(
            "patch", name, "-n", namespace, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
        )


def app_manifest(name: str = "web", replicas: int = 10, image: str = "registry.example/app:v1") -> str:
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: app, image: "{image}"}}]
---
apiVersion: v1
kind: Service
metadata: {{name: {name}}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: 80}}]
"""


def deploy_app(cluster: Cluster, namespace: str, name: str = "web", replicas: int = 10) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=app_manifest(name, replicas))
    cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=60s")


def apply_release(cluster: Cluster, namespace: str, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def release(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.kubectl_json("get", "gr", name, "-n", namespace)


def status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    st: dict[str, Any] = release(cluster, namespace, name).get("status") or {}
    return st


def wait_phase(cluster: Cluster, namespace: str, name: str, phases: set[str], timeout: float = 60.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        st = status(cluster, namespace, name)
        return st if st.get("phase") in phases else None

    return wait_for(check, timeout, f"GreyRelease {name} in {phases}")


def endpoint_pods(cluster: Cluster, namespace: str, service: str) -> list[str]:
    """Names of the ready pods behind a Service, from its EndpointSlices."""
    slices = cluster.kubectl_json(
        "get", "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}"
    )
    return [
        ep["targetRef"]["name"]
        for s in slices["items"]
        for ep in s.get("endpoints") or []
        if ep.get("conditions", {}).get("ready") and ep.get("targetRef")
    ]


def deployment(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "deployment", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name},involvedObject.kind=GreyRelease"
    items = cluster.kubectl_json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def gr(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "greyrelease.io/v1", "kind": "GreyRelease", "metadata": {"name": name}, "spec": spec}
