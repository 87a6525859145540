"""End-to-end: the per-release series on the controller's /metrics follow a release through its batches and
go when it is deleted, and every panel of the Grafana dashboard (config/grafana/greyrelease.json) returns
data from the e2e Prometheus while the release runs.

The release is one a platform team would watch: Deployment `web` behind Service `web-stable`, reached
through Traefik by an HTTPRoute, released to v2 in three batches (10 %, 50 %, 100 % of the traffic) under a
steady load, with two gates on the proxy's own series (the canary's error ratio against the stable's, and
its p90 latency under a bound). Grafana is not installed here: each panel's queries are run as Grafana would
send them, the dashboard's variables filled in (namespace, release `web`, Service `web-stable`, a 10 s rate
window for ``$__rate_interval``: Prometheus scrapes every second), against the same Prometheus that scrapes
Traefik and the controller.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness.controller import ROOT, Controller, apply_release, drop_releases, gr, status, wait_for
from e2e.harness.controlplane import Cluster
from e2e.harness.dataplane import DataPlane, answering_app
from e2e.harness.load import Load
from e2e.harness.process import free_port
from e2e.harness.prometheus import PrometheusStack

pytestmark = pytest.mark.e2e

DASHBOARD = ROOT / "config" / "grafana" / "greyrelease.json"
RATE = 50.0  # requests/s through Traefik: enough for every track's rate over 10 s
STABLE_SERVICE = "web-stable"  # its canary Service is web-stable-canary
# The gates select a track's Service by Traefik's `service` label: `web-(stable-)?stable` matches only
# web-stable, `web-(stable-)?canary` only web-stable-canary (see e2e/test_traffic_gates.py).
TRACK = 'service=~"{{namespace}}-web-(stable-)?{{track}}-http-80@kubernetesgateway"'
ERROR_GATE: dict[str, Any] = {
    "name": "error-ratio",
    "query": (
        f'(sum(rate(traefik_service_requests_total{{{TRACK},code=~"5.."}}[10s])) or vector(0))'
        f" / sum(rate(traefik_service_requests_total{{{TRACK}}}[10s]))"
    ),
    "compare": {"maxIncrease": 1.0, "floor": 0.01},
}
LATENCY_GATE: dict[str, Any] = {
    "name": "latency-p90",
    "query": (
        f"histogram_quantile(0.9, sum by (le) (rate(traefik_service_request_duration_seconds_bucket{{{TRACK}}}[10s])))"
    ),
    "thresholdRange": {"max": 0.5},
}
# Batch 2 holds long enough for every panel to be asked (each at most PANEL_WAIT while it has no data); once
# they are, the test promotes it, as a user would, rather than wait for the rest of its pause.
BATCHES = [
    {"replicas": 1, "weight": 10, "pause": "8s"},
    {"replicas": 2, "weight": 50, "pause": "60s"},
    {"replicas": 4, "weight": 100},
]
PANEL_WAIT = 30.0


# --- reading the controller's /metrics and Prometheus ----------------------------------------------------


def scrape(port: int, namespace: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The series of release `web` on the controller's /metrics, by name: (labels, value) each."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("greyrelease_release_") and (s.labels.get("namespace"), s.labels.get("name")) == (
                namespace,
                "web",
            ):
                found.setdefault(s.name, []).append((dict(s.labels), s.value))
    return found


def one(series: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    values = [v for _, v in series.get(name, [])]
    assert len(values) <= 1, (name, series.get(name))
    return values[0] if values else None


def where(series: dict[str, list[tuple[dict[str, str], float]]]) -> tuple[str | None, float | None, float | None]:
    """(phase, batch, weight) as the series say; exactly one phase series while the release exists."""
    phases = [labels["phase"] for labels, _ in series.get("greyrelease_release_phase", [])]
    assert len(phases) <= 1, phases
    return (
        phases[0] if phases else None,
        one(series, "greyrelease_release_current_batch"),
        one(series, "greyrelease_release_canary_weight"),
    )


def gates_checked(series: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
    """Whether each gate has one value, the verdict Pass and one bound, the max (the compare gate's from
    the stable's last value, the other's from its range)."""

    def of(name: str, gate: str, label: str | None = None) -> list[Any]:
        return [labels[label] if label else value for labels, value in series.get(name, []) if labels["gate"] == gate]

    return all(
        of("greyrelease_release_gate_verdict", gate, "verdict") == ["Pass"]
        and of("greyrelease_release_gate_threshold", gate, "bound") == ["max"]
        and len(of("greyrelease_release_gate_value", gate)) == 1
        for gate in (ERROR_GATE["name"], LATENCY_GATE["name"])
    )


def series_count(prom_url: str, promql: str) -> int:
    """How many series (or a scalar: 1) an instant query returns; an error Prometheus gives fails the test."""
    url = f"{prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as err:
        raise AssertionError(f"Prometheus refused {promql!r}: {err.read().decode(errors='replace')}") from None
    assert body.get("status") == "success", (promql, body)
    data = body["data"]
    return 1 if data["resultType"] == "scalar" else len(data["result"])


def panel_queries(variables: dict[str, str]) -> list[tuple[str, str]]:
    """Every query of every panel of the dashboard, (panel title, PromQL) with the variables filled in."""
    dashboard = json.loads(Path(DASHBOARD).read_text())

    def fill(expr: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables[m.group(1) or m.group(2)], expr)

    return [
        (panel["title"], fill(target["expr"]))
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


# --- the app -----------------------------------------------------------------------------------------------


def deploy(cluster: Cluster, dataplane: DataPlane, namespace: str) -> str:
    """Deployment `web` (4 answering pods of v1), Service `web-stable` and an HTTPRoute `web` to it on the
    Gateway, at a host of its own; the host once Traefik answers there from every pod."""
    app = answering_app("web", 4, "registry.example/app:v1")
    for item in app["items"]:
        if item["kind"] == "Service":
            item["metadata"]["name"] = STABLE_SERVICE
    host = f"web.{namespace}.example"
    app["items"].append(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "web"},
            "spec": {
                "parentRefs": [dataplane.parent_ref],
                "hostnames": [host],
                "rules": [{"backendRefs": [{"name": STABLE_SERVICE, "port": 80}]}],
            },
        }
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(app))
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")

    def all_answer() -> bool:
        with Load(dataplane.gateway_url, 50, host=host, timeout=2) as probe:
            time.sleep(0.5)
        s = probe.summary()
        return s.sent > 0 and not s.failed and len({r.pod for r in probe.records}) == 4

    wait_for(all_answer, 60, f"Traefik answering for {host} from 4 pods", interval=0.2)
    return host


# --- the test ----------------------------------------------------------------------------------------------


def test_the_release_series_follow_a_release_and_every_dashboard_panel_has_data(
    cluster: Cluster,
    crd: Path,
    namespace: str,
    dataplane: DataPlane,
    prometheus: PrometheusStack,
    tmp_path: Path,
) -> None:
    port = free_port()
    ctl = Controller(cluster, namespace, tmp_path / "controller.log", extra_args=["--metrics-port", str(port)])
    target = f"127.0.0.1:{port}"
    load: Load | None = None
    try:
        ctl.start()
        ctl.wait_ready()
        prometheus.add_scrape_target(target, "greyrelease-controller", {"release_ns": namespace})
        host = deploy(cluster, dataplane, namespace)
        assert scrape(port, namespace) == {}  # no release yet: none of its series
        load = Load(dataplane.gateway_url, RATE, host=host).start()
        time.sleep(2)
        apply_release(
            cluster,
            namespace,
            gr(
                "web",
                targetRef={"name": "web"},
                targetVersion="v2",
                trafficRouting={"gatewayAPI": {"httpRoute": "web", "stableService": STABLE_SERVICE}},
                batches=BATCHES,
                analysis={
                    "prometheus": {"address": prometheus.url, "timeout": "2s"},
                    "interval": "1s",
                    "metrics": [ERROR_GATE, LATENCY_GATE],
                },
            ),
        )

        # Through the batches, as /metrics tells it.
        seen: list[tuple[str | None, float | None, float | None]] = []
        panels_checked = False
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            series = scrape(port, namespace)
            now = where(series)
            if now[0] is not None and (not seen or seen[-1] != now):
                seen.append(now)
            if now == ("Progressing", 2, 50) and not panels_checked:
                assert one(series, "greyrelease_release_batches") == 3
                started = one(series, "greyrelease_release_batch_started_timestamp_seconds")
                assert started is not None and 0 <= time.time() - started < 120, started
                check_every_panel(prometheus, namespace)
                wait_for(
                    lambda: gates_checked(scrape(port, namespace)),
                    20,
                    "both gates on /metrics with a value, a Pass and a max bound",
                    interval=0.5,
                )
                panels_checked = True
                cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/promote=next", "--overwrite")
            if now[0] in ("Succeeded", "Failed", "Aborted"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the release did not finish: {seen}; {status(cluster, namespace, 'web')}")
        print(f"\nas /metrics told it: {seen}")
        final = status(cluster, namespace, "web")
        assert seen[-1][0] == "Succeeded", (seen, final, ctl.logs())
        assert panels_checked, f"batch 2 at 50 % never seen on /metrics: {seen}"
        assert ("Progressing", 1, 10) in seen and ("Progressing", 2, 50) in seen, seen
        assert any(batch == 3 for _, batch, _ in seen), seen
        batches = [batch for _, batch, _ in seen if batch]
        assert batches == sorted(batches), seen

        # At rest, the series say what the status says.
        final = status(cluster, namespace, "web")
        series = scrape(port, namespace)
        told = (final.get("phase"), final.get("currentBatch", 0), final.get("canaryWeight", 0))
        assert where(series) == told, (series, final)
        assert one(series, "greyrelease_release_batches") == final.get("totalBatches", 0)

        # Deleted: its series go.
        cluster.kubectl("delete", "gr", "web", "-n", namespace, "--wait=false")
        wait_for(lambda: scrape(port, namespace) == {}, 60, "release web's series gone from /metrics", interval=0.5)
    finally:
        if load is not None:
            load.stop()
        prometheus.remove_scrape_target(target)
        ctl.stop()
        print(f"--- controller log (last lines) ---\n{ctl.logs()}")
        drop_releases(cluster, namespace)


def check_every_panel(prometheus: PrometheusStack, namespace: str) -> None:
    """Each panel query returns at least one series within PANEL_WAIT (the rates need some seconds of
    the canary's traffic); the first that does not fails the test, naming its panel."""
    variables = {"namespace": namespace, "release": "web", "service": STABLE_SERVICE, "__rate_interval": "10s"}
    queries = panel_queries(variables)
    assert queries
    deadline = time.monotonic() + PANEL_WAIT
    for title, expr in queries:
        while series_count(prometheus.url, expr) == 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"panel {title!r}: no data for {expr!r}")
            time.sleep(0.5)
    print(f"every panel has data: {len(queries)} queries")
