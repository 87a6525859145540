"""The KWOK configuration files are consistent (no cluster needed): the stages, and the resource metrics that
metrics-server scrapes (e2e/kwok/metrics.yaml)."""

from __future__ import annotations

from typing import Any

import yaml

from e2e.harness.controlplane import KWOK_STAGES
from e2e.harness.metrics_server import CPU_ANNOTATION

START_STAGES = {
    "pod-ready": "normal",
    "pod-never-ready": "never-ready",
    "pod-fail-crashloop": "fail",
    "pod-fail-terminated": "fail",
}


#: What the files passed with ``kwok -c`` hold.
KINDS = {"Stage", "Metric", "ClusterResourceUsage"}


def load(kind: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in KWOK_STAGES:
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and doc["kind"] in KINDS, (path, doc["kind"])
            if doc["kind"] == kind:
                found[doc["metadata"]["name"]] = doc
    return found


def load_stages() -> dict[str, dict[str, Any]]:
    return load("Stage")


def test_pod_start_stages_share_one_behaviour_expression() -> None:
    stages = load_stages()
    assert set(START_STAGES) <= set(stages)
    firsts = [stages[name]["spec"]["selector"]["matchExpressions"][0] for name in START_STAGES]
    # Identical expressions with distinct values make the start stages mutually exclusive.
    assert len({e["key"] for e in firsts}) == 1
    assert [(e["operator"], e["values"]) for e in firsts] == [("In", [v]) for v in START_STAGES.values()]


def test_node_heartbeat_beats_inside_the_node_monitor_grace_period() -> None:
    delay = load_stages()["node-heartbeat"]["spec"]["delay"]
    assert max(delay["durationMilliseconds"], delay["jitterDurationMilliseconds"]) < 40_000


def test_the_resource_metrics_are_the_series_metrics_server_reads_at_the_path_the_nodes_name() -> None:
    (metric,) = load("Metric").values()
    assert metric["spec"]["path"] == "/metrics/nodes/{nodeName}/metrics/resource"  # see _create_nodes()
    names = {m["name"] for m in metric["spec"]["metrics"]}
    assert names == {
        "node_cpu_usage_seconds_total",
        "node_memory_working_set_bytes",
        "container_start_time_seconds",
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
    }
    (usage,) = load("ClusterResourceUsage").values()
    assert CPU_ANNOTATION in usage["spec"]["usages"][0]["usage"]["cpu"]["expression"]
