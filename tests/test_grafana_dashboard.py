"""The Grafana dashboard (config/grafana/greyrelease.json): every panel queries Prometheus, with metric names
the controller exports or Traefik's, and variables the dashboard defines. (Whether each query returns data
is e2e/test_release_metrics.py's question, on the e2e Prometheus during a release.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from greyrelease.reconcile import metrics, release_metrics  # noqa: F401 - their series register on import
from prometheus_client import REGISTRY

DASHBOARD = Path(__file__).resolve().parents[1] / "config" / "grafana" / "greyrelease.json"

#: Traefik's series the dashboard may use: per service, as Traefik exports them with
#: ``--metrics.prometheus.addServicesLabels`` (e2e/harness/dataplane.py starts it so).
TRAEFIK = {
    "traefik_service_requests_total",
    "traefik_service_request_duration_seconds_bucket",
    "traefik_service_request_duration_seconds_sum",
    "traefik_service_request_duration_seconds_count",
}
#: Grafana's own variables a query may use.
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range"}
#: Words of PromQL that are neither metrics nor functions.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def controller_names() -> set[str]:
    """The names of every series the controller's registry can serve, whether it holds samples now or not."""
    names = set()
    for family in REGISTRY.collect():
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once the strings, label matchers, ranges,
    label lists of by/without/on/ignoring and the function names are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    found = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group(0) in KEYWORDS:
            continue  # a function, an aggregation or an operator
        found.add(match.group(0))
    return found


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def data_panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_the_name_finder_keeps_metrics_and_drops_functions_labels_and_strings() -> None:
    expr = (
        "histogram_quantile(0.9, sum by (le, kind) "
        '(rate(a_bucket{service=~"x-$service-.+", code="5"}[$__rate_interval])))'
        " / on (job) group_left (instance) (b_total or vector(0)) and c"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_every_panel_queries_prometheus_with_known_metric_names_only() -> None:
    known = controller_names() | TRAEFIK
    panels = data_panels()
    assert len(panels) >= 10
    for panel in panels:
        targets = panel.get("targets") or []
        assert targets, f"panel {panel['title']!r} has no query"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            expr = target.get("expr") or ""
            names = metric_names(expr)
            assert names, f"panel {panel['title']!r}: {expr!r} selects no metric"
            assert names <= known, f"panel {panel['title']!r}: unknown {sorted(names - known)} in {expr!r}"
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def test_the_queries_use_only_the_dashboards_variables() -> None:
    defined = {v["name"] for v in dashboard()["templating"]["list"]}
    assert {"datasource", "namespace", "release", "service"} <= defined
    for panel in data_panels():
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= defined | GRAFANA_VARIABLES, (panel["title"], used - defined)


@pytest.mark.parametrize(
    "family", [name for name, _, _ in release_metrics.FAMILIES], ids=[name for name, _, _ in release_metrics.FAMILIES]
)
def test_every_per_release_series_is_on_the_dashboard(family: str) -> None:
    used = {name for panel in data_panels() for t in panel["targets"] for name in metric_names(t["expr"])}
    assert family in used


def test_the_traffic_panels_set_the_canary_against_the_stable() -> None:
    traffic = [p for p in data_panels() if any("traefik_" in t["expr"] for t in p["targets"])]
    assert len(traffic) == 3  # requests, errors, latency
    for panel in traffic:
        assert sorted(t["legendFormat"] for t in panel["targets"]) == ["canary", "stable"], panel["title"]


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
