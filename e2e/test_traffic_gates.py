"""End-to-end, on real HTTP through Traefik: a good release loses no request from its first batch to the
canary's removal, and a bad canary is rolled back by a gate on the proxy's own numbers.

Every request of an open-loop load (e2e/harness/load.py, RATE requests/s with a Host header) is recorded with the
pod and image that answered (e2e/harness/responder.py). The gates query Traefik's per-service series in the local
Prometheus (scraped every second): `traefik_service_requests_total{code, method, protocol, service}` and the
histogram `traefik_service_request_duration_seconds`, where a Gateway API backend's `service` label is
`<namespace>-<Service>-<port name>-<port>@kubernetesgateway` (here `...-web-stable-http-80@kubernetesgateway`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from e2e.harness.controller import (
    Controller,
    apply_release,
    deployment,
    gr,
    status,
    wait_for,
)
from e2e.harness.controlplane import Cluster
from e2e.harness.dataplane import DataPlane, answering_app
from e2e.harness.load import Load, Record, first, last, summarise
from e2e.harness.prometheus import PrometheusStack

pytestmark = pytest.mark.e2e

RATE = 100.0  # requests/s: what this 2-core machine keeps with the control plane, Traefik and the pods on it
V1 = "registry.example/app:v1"
GRACE_SECONDS = 5  # the pods' terminationGracePeriodSeconds: how long a deleted pod keeps answering
TERMINAL = {"Succeeded", "Failed", "Aborted", "InvalidSpec"}

# The gates select a track's Service by the `service` label. The stable Service is named `web-stable`, so
# the canary Service the release adds is `web-stable-canary`, and one pattern yields either from
# {{track}}: `web-(stable-)?stable` matches only web-stable, `web-(stable-)?canary` only web-stable-canary.
SERVICE = 'service=~"{{namespace}}-web-(stable-)?{{track}}-http-80@kubernetesgateway"'
ERROR_RATIO = (
    f'(sum(rate(traefik_service_requests_total{{{SERVICE},code=~"5.."}}[10s])) or vector(0))'
    f" / sum(rate(traefik_service_requests_total{{{SERVICE}}}[10s]))"
)
LATENCY_P90 = (
    f"histogram_quantile(0.9, sum by (le) (rate(traefik_service_request_duration_seconds_bucket{{{SERVICE}}}[10s])))"
)


# --- the app, its route, the load -------------------------------------------------------------------------


def deploy(cluster: Cluster, dataplane: DataPlane, namespace: str, mode: str, *, replicas: int, service: str) -> str:
    """Deployment `web` (answering pods of V1) and Service `service`, reached through Traefik at a host of
    its own: by an HTTPRoute `web` on the Gateway (mode "gateway"), or an Ingress of class traefik ("service").
    Returns the host once Traefik answers there."""
    app = answering_app("web", replicas, V1, grace_seconds=GRACE_SECONDS)
    for item in app["items"]:
        if item["kind"] == "Service":
            item["metadata"]["name"] = service
    host = f"web.{namespace}.example"
    backend = {"name": service, "port": 80}
    if mode == "gateway":
        app["items"].append(
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "HTTPRoute",
                "metadata": {"name": "web"},
                "spec": {
                    "parentRefs": [dataplane.parent_ref],
                    "hostnames": [host],
                    "rules": [{"backendRefs": [backend]}],
                },
            }
        )
    else:
        app["items"].append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "Ingress",
                "metadata": {"name": "web"},
                "spec": {
                    "ingressClassName": "traefik",
                    "rules": [
                        {
                            "host": host,
                            "http": {
                                "paths": [
                                    {
                                        "path": "/",
                                        "pathType": "Prefix",
                                        "backend": {"service": {"name": service, "port": {"number": 80}}},
                                    }
                                ]
                            },
                        }
                    ],
                },
            }
        )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(app))
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")

    def all_answer() -> bool:  # the route is in Traefik and every stable pod is among its servers
        with Load(dataplane.gateway_url, 50, host=host, timeout=2) as probe:
            time.sleep(0.5)
        s = probe.summary()
        return s.sent > 0 and not s.failed and len({r.pod for r in probe.records}) == replicas

    wait_for(all_answer, 60, f"Traefik answering for {host} from {replicas} pods", interval=0.2)
    return host


@dataclass
class Run:
    """A release under load: the records, and the release's transitions as polled (wall-clock times)."""

    records: list[Record]
    applied: float
    phases: list[tuple[float, Any, Any, Any]] = field(default_factory=list)  # (time, phase, batch, weight)
    final: dict[str, Any] = field(default_factory=dict)

    def at(self, phase: str) -> float | None:
        """When the phase was first seen."""
        return next((t for t, p, _, _ in self.phases if p == phase), None)

    def print_timeline(self) -> None:
        for t, phase, batch, weight in self.phases:
            print(f"  {t - self.applied:6.2f}s  {phase or '-':<12} batch {batch} weight {weight}")


def run_release(
    cluster: Cluster, dataplane: DataPlane, namespace: str, host: str, body: dict[str, Any], *, timeout: float = 180
) -> Run:
    """Steady load from 2 s before the release until its canary pods are gone and their grace period is over."""
    load = Load(dataplane.gateway_url, RATE, host=host).start()
    try:
        time.sleep(2)
        applied = time.time()
        apply_release(cluster, namespace, body)
        run = Run(records=[], applied=applied)
        seen: tuple[Any, ...] = ()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = status(cluster, namespace, "web")
            now_seen = (st.get("phase"), st.get("currentBatch"), st.get("canaryWeight"))
            if now_seen != seen:
                run.phases.append((time.time(), *now_seen))
                seen = now_seen
            if st.get("phase") in TERMINAL:
                run.final = st
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the release did not finish in {timeout}s: {seen}; metrics: {st.get('metrics')}")
        wait_for(lambda: deployment(cluster, namespace, "web-canary") is None, 60, "the canary Deployment deleted")
        wait_for(
            lambda: (
                not cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "greyrelease.io/track=canary")["items"]
            ),
            60,
            "no canary pod left",
        )
        time.sleep(GRACE_SECONDS + 2)  # the last canary pod has stopped answering; the stable alone serves
    finally:
        run_records = load.stop()
    run.records = run_records
    return run


def describe_failures(run: Run, failed: list[Record]) -> str:
    lines = [
        f"{r.sent - run.applied:7.3f}s status {r.status} pod {r.pod} image {r.image} error {r.error}"
        for r in failed[:15]
    ]
    return "\n".join(lines)


def print_load(run: Run, end: float) -> None:
    s = summarise(run.records, run.applied - 2, end, asked_rate=RATE)
    lags = sorted(r.lag for r in run.records)
    print(
        f"load: {s.sent} requests at {s.rate:.1f}/s (asked {RATE:g}), max send lag {s.max_lag * 1000:.0f} ms, "
        f"p99 {lags[int(0.99 * (len(lags) - 1))] * 1000:.0f} ms; latency p50 {s.latency_p50 * 1000:.1f} ms, "
        f"p99 {s.latency_p99 * 1000:.1f} ms"
    )
    assert s.rate_kept(0.05), f"the load generator did not keep {RATE}/s: {s.rate:.1f}/s"


# --- zero failed requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["gateway", "service"])
def test_a_good_release_loses_no_request(
    cluster: Cluster,
    dataplane: DataPlane,
    namespace: str,
    mode: str,
    controller: Controller,
) -> None:
    host = deploy(cluster, dataplane, namespace, mode, replicas=4, service="web")
    if mode == "gateway":
        routing = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}
        batches = [
            {"replicas": 1, "weight": 10, "pause": "3s"},
            {"replicas": 2, "weight": 50, "pause": "3s"},
            {"replicas": 4, "weight": 100, "pause": "3s"},
        ]
    else:
        routing = {"service": {"name": "web"}}
        batches = [{"replicas": 1, "pause": "3s"}, {"replicas": 2, "pause": "3s"}, {"replicas": 4, "pause": "3s"}]
    body = gr("web", targetRef={"name": "web"}, targetVersion="v2", trafficRouting=routing, batches=batches)
    run = run_release(cluster, dataplane, namespace, host, body)
    v2 = "registry.example/app:v2"
    end = run.records[-1].sent
    s = summarise(run.records, run.applied - 2, end, asked_rate=RATE)
    took = (run.at(str(run.final.get("phase"))) or end) - run.applied
    print(
        f"\n{mode} mode: release {run.final.get('phase')} after {took:.1f} s; {s.sent} requests, "
        f"{len(s.failed)} failed; answered by {s.answered_by_image}"
    )
    run.print_timeline()
    print_load(run, end)
    assert run.final.get("phase") == "Succeeded", (run.final, controller.logs())
    assert s.failed == [], f"{len(s.failed)} failed requests:\n{describe_failures(run, s.failed)}"
    assert s.answered_by_image.get(v2, 0) > 0 and s.answered_by_image.get(V1, 0) > 0
    tail = summarise(run.records, end - 2, end + 0.001)
    assert tail.answered_by_image == {v2: tail.sent}, tail.answered_by_image  # the stable, promoted, serves alone
    st = deployment(cluster, namespace, "web")
    assert st is not None and st["spec"]["template"]["spec"]["containers"][0]["image"] == v2


# --- bad canaries rolled back by the proxy's numbers -------------------------------------------------------


@dataclass(frozen=True)
class BadCase:
    tag: str
    metric: dict[str, Any]
    bad: str  # what a user saw of the bad version

    def is_bad(self, r: Record) -> bool:
        if self.bad == "error":
            return r.failed
        return r.latency is not None and r.latency >= 0.3


# Judged against the stable only (no absolute bound): the canary fails when it is more than twice as bad as
# the stable, stable values under the floor counting as the floor.
ERROR_GATE = {"name": "canary-error-ratio", "query": ERROR_RATIO, "compare": {"maxIncrease": 1.0, "floor": 0.01}}
LATENCY_GATE = {"name": "canary-latency-p90", "query": LATENCY_P90, "compare": {"maxIncrease": 1.0, "floor": 0.05}}
CASES = [BadCase("v2-err30", ERROR_GATE, "error"), BadCase("v2-slow300ms", LATENCY_GATE, "slow")]


@pytest.mark.parametrize("case", CASES, ids=[c.tag for c in CASES])
def test_a_bad_canary_is_rolled_back_by_the_proxys_numbers(
    cluster: Cluster,
    dataplane: DataPlane,
    namespace: str,
    prometheus: PrometheusStack,
    case: BadCase,
    controller: Controller,
) -> None:
    host = deploy(cluster, dataplane, namespace, "gateway", replicas=4, service="web-stable")
    body = gr(
        "web",
        targetRef={"name": "web"},
        targetVersion=case.tag,
        trafficRouting={"gatewayAPI": {"httpRoute": "web", "stableService": "web-stable"}},
        # The first batch holds far longer than the gate needs: only the gate can end it.
        batches=[{"replicas": 1, "weight": 10, "pause": "300s"}, {"replicas": 4, "weight": 100}],
        analysis={
            "prometheus": {"address": prometheus.url, "timeout": "2s"},
            "interval": "1s",
            "metrics": [case.metric],
        },
    )
    run = run_release(cluster, dataplane, namespace, host, body)
    canary_image = f"registry.example/app:{case.tag}"
    end = run.records[-1].sent
    s = summarise(run.records, run.applied - 2, end, asked_rate=RATE)
    canary = [r for r in run.records if r.image == canary_image]
    first_bad = first(canary, case.is_bad)
    last_canary = last(canary, lambda r: True)
    failed_at = run.at("Failed")
    metrics = run.final.get("metrics") or []
    print(f"\n{case.tag}: release {run.final.get('phase')}: {run.final.get('message')}")
    print(f"  gate: {[(m.get('name'), m.get('value'), m.get('stableValue'), m.get('verdict')) for m in metrics]}")
    run.print_timeline()
    print_load(run, end)
    assert run.final.get("phase") == "Failed", (run.final, controller.logs())
    assert case.metric["name"] in (run.final.get("message") or ""), run.final.get("message")
    assert failed_at is not None  # the final phase, Failed, was seen on the way
    assert first_bad is not None and last_canary is not None, s.answered_by_image
    cut = last_canary.sent - first_bad.sent
    bad_seen = [r for r in canary if case.is_bad(r)]
    print(
        f"  users saw {len(s.failed)} failed requests ({len(bad_seen)} bad canary answers of {len(canary)}, "
        f"{s.sent} requests in all); first bad canary answer -> last canary answer {cut:.2f} s; "
        f"last canary answer {last_canary.sent - failed_at:+.2f} s from phase Failed seen"
    )
    # Every failure users saw came from the bad canary: the rollback itself failed no request.
    assert all(r.image == canary_image and r.status == 500 for r in s.failed), describe_failures(
        run, [r for r in s.failed if r.image != canary_image or r.status != 500]
    )
    assert cut <= 30, f"the canary answered for {cut:.1f} s after its first bad answer"
    share = len(canary) / max(s.answered, 1)
    assert share < 0.2, f"the canary answered {share:.0%} of the requests at a 10% weight"
    stable = deployment(cluster, namespace, "web")
    assert stable is not None and stable["spec"]["template"]["spec"]["containers"][0]["image"] == V1
