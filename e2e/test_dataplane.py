"""End-to-end: requests through Traefik reach pods that answer, as the Gateway API and Ingress say.

The smoke tests of the data plane (e2e/harness/dataplane.py): weighted backendRefs of an HTTPRoute split
real requests, an Ingress of class `traefik` is served at the same entry point, a deleted pod answers through
its grace period and then stops, and Traefik's per-service counters reach Prometheus. The pod that answered
is read from the responder's JSON body.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from e2e.harness.controller import wait_for
from e2e.harness.controlplane import Cluster
from e2e.harness.dataplane import DataPlane, answering_app, serving_gate
from e2e.harness.prometheus import PrometheusStack

pytestmark = pytest.mark.e2e


class Answer:
    def __init__(self, status: int, body: dict[str, Any] | None, error: str | None = None) -> None:
        self.status = status
        self.body = body or {}
        self.error = error

    @property
    def image(self) -> str | None:
        return self.body.get("image")


def request(url: str, host: str, conn: http.client.HTTPConnection | None = None, timeout: float = 5.0) -> Answer:
    """GET / with the Host header; a connection error is an Answer with status 0."""
    parts = urllib.parse.urlsplit(url)
    own = conn is None
    conn = conn or http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request("GET", "/", headers={"Host": host})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return Answer(resp.status, body if isinstance(body, dict) else None)
    except (OSError, http.client.HTTPException) as exc:
        conn.close()  # the next request opens a new connection
        return Answer(0, None, f"{type(exc).__name__}: {exc}")
    finally:
        if own:
            conn.close()


def many(url: str, host: str, n: int, threads: int = 4) -> list[Answer]:
    """`n` requests on `threads` kept-alive connections."""
    parts = urllib.parse.urlsplit(url)
    local = threading.local()

    def one(_: int) -> Answer:
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
        return request(url, host, local.conn)

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(n)))


def apply(cluster: Cluster, namespace: str, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def rollout(cluster: Cluster, namespace: str, *names: str) -> None:
    for name in names:
        cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=60s")


def until_answered(url: str, host: str, what: str, ok: Callable[[Answer], bool] | None = None) -> Answer:
    """Waits until the proxy has the route (it answers 404 until then)."""
    check = ok or (lambda a: a.status == 200)
    return wait_for(lambda: (lambda a: a if check(a) else None)(request(url, host)), 30, what, interval=0.1)


def until_every_pod_answers(cluster: Cluster, namespace: str, url: str, host: str, selector: str) -> None:
    """Waits until the proxy sends to every pod of ``selector`` (a Deployment's rollout is done before the
    EndpointSlice controller has listed its last pod and the proxy has reloaded: a first answer only says
    the route is there)."""
    pods = set(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "name").stdout.split())

    def all_answer() -> bool:
        return {f"pod/{a.body.get('pod')}" for a in many(url, host, 40)} >= pods

    wait_for(all_answer, 30, f"every pod of {selector} answering through Traefik", interval=0.2)


def route(namespace: str, dataplane: DataPlane, host: str, backends: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "parentRefs": [dataplane.parent_ref],
            "hostnames": [host],
            "rules": [{"backendRefs": [{"name": n, "port": 80, "weight": w} for n, w in backends.items()]}],
        },
    }


def route_accepted(cluster: Cluster, namespace: str) -> bool:
    obj = cluster.kubectl_json("get", "httproute", "web", "-n", namespace)
    parents = obj.get("status", {}).get("parents") or []
    return any(c["type"] == "Accepted" and c["status"] == "True" for p in parents for c in p.get("conditions") or [])


def test_httproute_weights_split_real_requests(cluster: Cluster, namespace: str, dataplane: DataPlane) -> None:
    apply(cluster, namespace, answering_app("web", 3, "registry.example/app:v1"))
    apply(cluster, namespace, answering_app("web-canary", 1, "registry.example/app:v2"))
    rollout(cluster, namespace, "web", "web-canary")
    host = f"web.{namespace}.example"
    apply(cluster, namespace, route(namespace, dataplane, host, {"web": 80, "web-canary": 20}))
    wait_for(lambda: route_accepted(cluster, namespace), 30, "HTTPRoute web Accepted by the Gateway")
    until_answered(dataplane.gateway_url, host, "the route in Traefik")
    until_every_pod_answers(cluster, namespace, dataplane.gateway_url, host, "app in (web, web-canary)")

    n = 1000
    started = time.monotonic()
    answers = many(dataplane.gateway_url, host, n)
    elapsed = time.monotonic() - started
    failed = [a for a in answers if a.status != 200]
    images = Counter(a.image for a in answers)
    pods = Counter(a.body.get("pod") for a in answers)
    share = 100 * images["registry.example/app:v2"] / n
    print(
        f"\n{n} requests in {elapsed:.1f}s ({n / elapsed:.0f}/s): canary share {share:.1f}% (weight 20), "
        f"{len(failed)} failed, by pod {dict(pods)}"
    )
    assert not failed, [(a.status, a.error) for a in failed[:5]]
    assert set(images) == {"registry.example/app:v1", "registry.example/app:v2"}, images
    assert abs(share - 20) <= 5, f"canary share {share:.1f}% for weight 20"
    assert {a.body.get("namespace") for a in answers} == {namespace}
    assert len(pods) == 4, pods  # every Ready pod answered: 3 stable, 1 canary


def test_an_ingress_of_class_traefik_is_served_at_the_same_url(
    cluster: Cluster, namespace: str, dataplane: DataPlane
) -> None:
    apply(cluster, namespace, answering_app("shop", 3, "registry.example/shop:v7"))
    rollout(cluster, namespace, "shop")
    host = f"shop.{namespace}.example"
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": "shop"},
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
                                    "backend": {"service": {"name": "shop", "port": {"number": 80}}},
                                }
                            ]
                        },
                    }
                ],
            },
        },
    )
    until_answered(dataplane.gateway_url, host, "the Ingress in Traefik")
    until_every_pod_answers(cluster, namespace, dataplane.gateway_url, host, "app=shop")
    answers = many(dataplane.gateway_url, host, 300)
    assert [a for a in answers if a.status != 200] == []
    pods = Counter(a.body.get("pod") for a in answers)
    ready = cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=shop", "-o", "name").stdout.split()
    print(f"\nIngress: 300 requests answered by {dict(pods)}")
    assert {f"pod/{p}" for p in pods} == set(ready)
    assert {a.image for a in answers} == {"registry.example/shop:v7"}
    # A host no route or Ingress names gets Traefik's 404, not a pod.
    assert request(dataplane.gateway_url, f"nobody.{namespace}.example").status == 404


def test_a_deleted_pod_answers_through_its_grace_period_then_stops(
    cluster: Cluster, namespace: str, dataplane: DataPlane
) -> None:
    grace = 3
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "solo", "labels": {"app": "solo"}},
            "spec": {
                "containers": [
                    {"name": "app", "image": "registry.example/solo:v1", "ports": [{"containerPort": 9000}]}
                ],
                "readinessGates": [serving_gate()],
                "terminationGracePeriodSeconds": grace,
            },
        },
    )
    cluster.kubectl("wait", "--for=condition=Ready", "pod/solo", "-n", namespace, "--timeout=60s")
    ip = cluster.kubectl("get", "pod", "solo", "-n", namespace, "-o", "jsonpath={.status.podIP}").stdout
    url = f"http://{ip}:9000"  # the pod itself, through the pod network (the proxy would drop it at once)
    first = request(url, "solo")
    assert first.status == 200 and first.body.get("pod") == "solo", (first.status, first.body, first.error)

    cluster.kubectl("delete", "pod", "solo", "-n", namespace, "--wait=false")
    deleted = time.monotonic()
    during = request(url, "solo")
    assert during.status == 200 and during.body.get("pod") == "solo", (during.status, during.error)
    assert time.monotonic() - deleted < grace, "too slow to ask within the grace period"
    refused_at = wait_for(
        lambda: time.monotonic() if request(url, "solo", timeout=1).status == 0 else None,
        grace + 10,
        "the deleted pod to stop answering",
        interval=0.1,
    )
    stopped_after = refused_at - deleted
    print(f"\ndeleted pod answered until {stopped_after:.2f}s after the delete (grace period {grace}s)")
    assert grace - 0.5 <= stopped_after <= grace + 3, stopped_after


def test_traefik_per_service_counters_reach_prometheus(
    cluster: Cluster, namespace: str, dataplane: DataPlane, prometheus: PrometheusStack
) -> None:
    apply(cluster, namespace, answering_app("api", 1, "registry.example/api:v1"))
    rollout(cluster, namespace, "api")
    host = f"api.{namespace}.example"
    apply(cluster, namespace, route(namespace, dataplane, host, {"api": 1}))
    until_answered(dataplane.gateway_url, host, "the route in Traefik")
    answers = many(dataplane.gateway_url, host, 200, threads=2)
    assert all(a.status == 200 for a in answers)
    # Traefik names a Gateway API backend <namespace>-<service>-http-<port>@kubernetesgateway; the answers
    # while waiting for the route came first, so at least 200.
    service = f"{namespace}-api-http-80@kubernetesgateway"
    promql = f'sum(traefik_service_requests_total{{service="{service}",code="200"}})'
    try:
        seen = prometheus.wait_for_query(promql, lambda v: v is not None and v >= 200, timeout=30)
    except TimeoutError as exc:
        with urllib.request.urlopen(dataplane.metrics_url, timeout=5) as resp:
            series = [line for line in resp.read().decode().splitlines() if line.startswith("traefik_service_requests")]
        up = prometheus.query('sum(up{job="traefik"})')
        raise AssertionError(f"{exc}\nup{{job=traefik}} = {up}; Traefik's own series:\n" + "\n".join(series)) from None
    print(f"\n{promql} = {seen}")
    buckets = prometheus.query(f'sum(traefik_service_request_duration_seconds_bucket{{service="{service}",le="0.3"}})')
    assert buckets is not None and buckets >= 200
