"""`make demo`: releases under real traffic, through Traefik, on the local cluster.

A steady load (100 requests/s, e2e/harness/load.py) goes through Traefik's Gateway to pods that answer as themselves
(e2e/harness/responder.py), and one line per second shows what users got: the request rate, and each version's
share of the answers and error ratio, next to the release's phase, batch and weight. Then:

1. a good release (v1 -> v2, weights 10/25/50/100%, gated on the canary's error ratio from Traefik's own
   counters) runs to Succeeded with no failed request;
2. a bad one (v3-err30: 30% of its answers are 500s) is rolled back by the same gate, with no human action;
3. the numbers: failed requests users saw, and the time from the first failed canary answer to the last
   canary answer.

Starts the local cluster, Prometheus and the data plane itself; with `make cluster-up`'s exports
(KUBECONFIG, GREYRELEASE_GATEWAY_URL, GREYRELEASE_GATEWAY, GREYRELEASE_PROMETHEUS_URL) it uses those instead.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.harness.controller import CRD, POLICY_CRD, Controller, gr
from e2e.harness.controlplane import Cluster, LocalCluster, external_cluster
from e2e.harness.dataplane import DataPlane, answering_app
from e2e.harness.load import Load, Record, first, last, summarise
from e2e.harness.process import new_workdir
from e2e.harness.prometheus import PrometheusStack

NS = "greyrelease-demo"
RATE = 100.0
V1 = "registry.example/app:v1"
HOST = "web.demo.example"
# Traefik names a Gateway API backend `<namespace>-<Service>-<port name>-<port>@kubernetesgateway`. The
# stable Service is `web-stable`, so the release's canary Service is `web-stable-canary`, and this pattern
# selects exactly one of them for {{track}} = stable or canary.
SERVICE = 'service=~"{{namespace}}-web-(stable-)?{{track}}-http-80@kubernetesgateway"'
ERROR_RATIO = (
    f'(sum(rate(traefik_service_requests_total{{{SERVICE},code=~"5.."}}[10s])) or vector(0))'
    f" / sum(rate(traefik_service_requests_total{{{SERVICE}}}[10s]))"
)


def say(text: str) -> None:
    print(f"\n\033[1m$ {text}\033[0m", flush=True)


@dataclass
class Stack:
    cluster: Cluster
    gateway_url: str
    gateway: str  # namespace/name
    prometheus_url: str

    @property
    def parent_ref(self) -> dict[str, str]:
        ns, name = self.gateway.split("/", 1)
        return {"namespace": ns, "name": name}


@contextmanager
def stack() -> Iterator[Stack]:
    """The running environment of `make cluster-up`, or one started (and stopped) here."""
    existing = external_cluster()
    if existing is not None:
        env = {
            k: os.environ.get(k, "")
            for k in ("GREYRELEASE_GATEWAY_URL", "GREYRELEASE_GATEWAY", "GREYRELEASE_PROMETHEUS_URL")
        }
        missing = [k for k, v in env.items() if not v]
        if missing:
            raise SystemExit(
                f"demo: KUBECONFIG reaches a cluster but {', '.join(missing)} is not set: run "
                '`eval "$(python -m e2e.cluster up --with-dataplane)"` or unset KUBECONFIG'
            )
        yield Stack(
            existing, env["GREYRELEASE_GATEWAY_URL"], env["GREYRELEASE_GATEWAY"], env["GREYRELEASE_PROMETHEUS_URL"]
        )
        return
    print("starting the local cluster, Prometheus, Traefik and the pod responders...", flush=True)
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="greyrelease-cluster-")))
    cluster.start()
    prometheus: PrometheusStack | None = None
    plane: DataPlane | None = None
    try:
        prometheus = PrometheusStack(new_workdir("greyrelease-prometheus-"))
        prometheus.start()
        plane = DataPlane(cluster, new_workdir("greyrelease-dataplane-"), prometheus)
        plane.start()
        yield Stack(cluster, plane.gateway_url, plane.gateway, prometheus.url)
    finally:
        if plane is not None:
            plane.stop()
        if prometheus is not None:
            prometheus.close()
        cluster.stop()


class TrafficView:
    """One line per second: the release's phase, batch and weight, and what users got in the last second."""

    def __init__(self, st: Stack, load: Load) -> None:
        self.st = st
        self.load = load
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.time()

    def __enter__(self) -> TrafficView:
        print(f"{'time':>5}  {'phase':<12}{'batch':<6}{'weight':>6}  {'rate':>6}        per version: share, errors")
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join()

    def _run(self) -> None:
        tick = time.time()
        while not self.stop_event.wait(max(0.0, tick + 1 - time.time())):
            tick += 1
            release = self.st.cluster.kubectl("get", "gr", "web", "-n", NS, "-o", "json", check=False)
            status = json.loads(release.stdout).get("status", {}) if release.returncode == 0 else {}
            # The second before the last half second: requests still in flight are not in the records yet.
            s = summarise(self.load.records, tick - 1.5, tick - 0.5, asked_rate=self.load.rate)
            print(
                f"{tick - self.started:4.0f}s  {status.get('phase', '-'):<12}{status.get('batch', '-'):<6}"
                f"{status.get('canaryWeight', 0):>5}%  {s.line()}",
                flush=True,
            )


def phase(cluster: Cluster) -> str:
    return cluster.kubectl("get", "gr", "web", "-n", NS, "-o", "jsonpath={.status.phase}", check=False).stdout


def wait_phase(cluster: Cluster, phases: set[str], timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (p := phase(cluster)) in phases:
            return p
        time.sleep(0.3)
    raise SystemExit(f"demo: the release did not reach {phases} in {timeout:g}s (phase {phase(cluster)!r})")


def wait_canary_gone(cluster: Cluster, grace: float) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = cluster.kubectl("get", "pods", "-n", NS, "-l", "greyrelease.io/track=canary", "-o", "name").stdout
        if not pods.strip():
            time.sleep(grace + 1)  # the last canary pod's grace period: it answers until then
            return
        time.sleep(0.5)


def release_spec(st: Stack, version: str, batches: list[dict[str, Any]]) -> dict[str, Any]:
    return gr(
        "web",
        targetRef={"name": "web"},
        targetVersion=version,
        trafficRouting={"gatewayAPI": {"httpRoute": "web", "stableService": "web-stable"}},
        batches=batches,
        analysis={
            "prometheus": {"address": st.prometheus_url, "timeout": "2s"},
            "interval": "1s",
            "metrics": [{"name": "error-ratio", "query": ERROR_RATIO, "compare": {"maxIncrease": 1.0, "floor": 0.01}}],
        },
    )


def run(st: Stack) -> int:
    cluster = st.cluster
    work = Path(tempfile.mkdtemp(prefix="greyrelease-demo-"))
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(POLICY_CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/greyreleases.greyrelease.io", "--timeout=30s")
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
    cluster.kubectl("create", "namespace", NS)
    cluster.wait_for_namespace_ready(NS)

    say(
        "kubectl apply -f app.yaml   # Deployment web (10 pods of app:v1, answering HTTP), Service web-stable, "
        f"HTTPRoute web ({HOST}) on the Gateway {st.gateway}"
    )
    grace = 5
    app = answering_app("web", 10, V1, grace_seconds=grace)
    for item in app["items"]:
        if item["kind"] == "Service":
            item["metadata"]["name"] = "web-stable"
    app["items"].append(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "web"},
            "spec": {
                "parentRefs": [st.parent_ref],
                "hostnames": [HOST],
                "rules": [{"backendRefs": [{"name": "web-stable", "port": 80}]}],
            },
        }
    )
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(app))
    cluster.kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=90s")
    with Load(st.gateway_url, 20, host=HOST, timeout=2) as probe:
        deadline = time.monotonic() + 60
        while not any(r.status == 200 for r in probe.records) and time.monotonic() < deadline:
            time.sleep(0.2)
    controller = Controller(cluster, NS, work / "controller.log")
    say(f"greyrelease run --namespace {NS} &")
    controller.start()
    load = Load(st.gateway_url, RATE, host=HOST)
    say(f"load: {RATE:g} requests/s to {st.gateway_url} (Host: {HOST}), each answer's pod and image recorded")
    load.start()
    ok = True
    try:
        good = release_spec(
            st,
            "v2",
            [
                {"replicas": 1, "weight": 10, "pause": "5s"},
                {"replicas": 3, "weight": 25, "pause": "5s"},
                {"replicas": 5, "weight": 50, "pause": "5s"},
                {"replicas": 10, "weight": 100, "pause": "5s"},
            ],
        )
        say("kubectl apply -f release.yaml   # v2 in 4 batches, gated on its error ratio in Traefik's counters")
        print(json.dumps(good["spec"], indent=1))
        t0 = time.time()
        with TrafficView(st, load):
            cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(good))
            end = wait_phase(cluster, {"Succeeded", "Failed"})
            wait_canary_gone(cluster, grace)
        t1 = time.time()
        s = summarise(load.records, t0, t1, asked_rate=RATE)
        print(
            f"\nrelease v2: {end}. {s.sent} requests during the release ({s.rate:.1f}/s), "
            f"{len(s.failed)} failed; answered by {s.answered_by_image}"
        )
        ok = ok and end == "Succeeded" and not s.failed
        good_line = f"release v2: {end}, {len(s.failed)} failed requests of {s.sent}"

        bad_version = "v3-err30"
        say(
            f'kubectl patch gr web --type merge -p \'{{"spec":{{"targetVersion":"{bad_version}"}}}}\''
            "   # a bad version: 30% of its answers are 500s"
        )
        bad = release_spec(st, bad_version, [{"replicas": 1, "weight": 10, "pause": "300s"}, {"replicas": 10}])
        t2 = time.time()
        with TrafficView(st, load):
            cluster.kubectl("patch", "gr", "web", "-n", NS, "--type", "merge", "-p", json.dumps({"spec": bad["spec"]}))
            end = wait_phase(cluster, {"Failed", "Succeeded"})
            wait_canary_gone(cluster, grace)
        t3 = time.time()
        say("kubectl describe gr web   # the story, in Events")
        described = cluster.kubectl("describe", "gr", "web", "-n", NS).stdout
        print(described[described.find("Events:") :])
    finally:
        records = load.stop()
        # Deleted while the controller runs: its finalizer would otherwise hold the namespace.
        cluster.kubectl("delete", "gr", "--all", "-n", NS, "--timeout=60s", check=False)
        controller.stop()
    image = f"registry.example/app:{bad_version}"
    canary = [r for r in records if t2 <= r.sent < t3 and r.image == image]
    first_failed: Record | None = first(canary, lambda r: r.failed)
    last_answer: Record | None = last(canary, lambda r: True)
    s = summarise(records, t2, t3, asked_rate=RATE)
    say("the numbers")
    print(good_line)
    print(f"release {bad_version}: {end}, with no human action")
    print(f"failed requests users saw: {len(s.failed)} of {s.sent} ({s.rate:.1f} requests/s)")
    if first_failed is not None and last_answer is not None:
        print(
            f"time to cut: {last_answer.sent - first_failed.sent:.2f} s from the first failed canary answer to the "
            f"last canary answer ({len(canary)} canary answers in all)"
        )
    ok = ok and end == "Failed" and first_failed is not None
    if not ok:
        print(f"--- controller log (last lines) ---\n{controller.logs()}")
    cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def main() -> int:
    with stack() as st:
        return run(st)


if __name__ == "__main__":
    sys.exit(main())
