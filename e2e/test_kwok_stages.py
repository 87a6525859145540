"""The KWOK stage files are consistent (no cluster needed)."""

from __future__ import annotations

from typing import Any

import yaml

from e2e.harness.controlplane import KWOK_STAGES

START_STAGES = {
    "pod-ready": "normal",
    "pod-never-ready": "never-ready",
    "pod-fail-crashloop": "fail",
    "pod-fail-terminated": "fail",
}


def load_stages() -> dict[str, dict[str, Any]]:
    stages: dict[str, dict[str, Any]] = {}
    for path in KWOK_STAGES:
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] == "Stage"
            stages[doc["metadata"]["name"]] = doc
    return stages


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
