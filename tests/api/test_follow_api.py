"""Follow mode in the API: a GreyRelease without ``targetVersion`` is accepted (by the models, the CRD and
``greyrelease plan``), its batches keep the stable's replicas, and the status has what a user needs to know
of the held template, the stable ReplicaSet and the last release."""

from __future__ import annotations

import io
from typing import Any

import pytest
import yaml
from greyrelease.api.crd import render
from greyrelease.api.release import (
    TERMINAL_PHASES,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Outcome,
    Phase,
)
from greyrelease.cli.main import print_plan
from greyrelease.planner.batches import expand

FOLLOW: dict[str, Any] = {"targetRef": {"name": "web"}}


def test_a_spec_without_target_version_follows_its_deployment() -> None:
    spec = GreyReleaseSpec.model_validate({**FOLLOW, "batchSize": 1, "canaryWeight": 50})
    assert spec.follows and spec.target_version is None
    pinned = GreyReleaseSpec.model_validate({**FOLLOW, "targetVersion": "v2", "batchSize": 1, "canaryWeight": 50})
    assert not pinned.follows


def test_the_crd_does_not_require_target_version_and_says_what_its_absence_means() -> None:
    crd = yaml.safe_load(render())
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "targetVersion" not in spec.get("required", [])
    assert "follow mode" in spec["properties"]["targetVersion"]["description"]
    assert "Ignored in follow mode" in spec["properties"]["container"]["description"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"held", "stable", "lastRelease"} <= set(status)
    assert status["lastRelease"]["properties"]["outcome"]["enum"] == [o.value for o in Outcome]
    assert "Idle" in status["phase"]["enum"]
    columns = version["additionalPrinterColumns"]
    # Short values people read: images, not digests.
    assert {"name": "Held", "type": "string", "jsonPath": ".status.held.images[0].image", "priority": 1} in columns
    assert {"name": "Runs", "type": "string", "jsonPath": ".status.stable.images[0].image", "priority": 1} in columns


@pytest.mark.parametrize(
    ("fields", "replicas", "table"),
    [
        # Service mode (and no routing): the stable keeps its replicas; the canary's share is C / (S + C).
        (
            {"batches": [{"replicas": "25%"}, {"replicas": "50%"}, {"replicas": "100%"}]},
            8,
            [(2, 8, 20), (4, 8, 33), (8, 8, 50)],
        ),
        ({"batchSize": 3, "canaryWeight": 25}, 6, [(3, 6, 33), (6, 6, 50)]),
        # Weighted modes: the weights as written, the stable at its size.
        (
            {
                "batches": [{"replicas": "20%", "weight": 5}, {"replicas": 3, "weight": 40}, {"replicas": 1}],
                "trafficRouting": {"gatewayAPI": {"httpRoute": "r", "stableService": "s"}},
            },
            10,
            [(2, 10, 5), (3, 10, 40), (10, 10, 100)],
        ),
        # Shares are of the stable's size now: an HPA's 3 or 12 give other canaries.
        ({"batches": [{"replicas": "50%"}, {"replicas": "100%"}]}, 3, [(2, 3, 40), (3, 3, 50)]),
        ({"batches": [{"replicas": "50%"}, {"replicas": "100%"}]}, 12, [(6, 12, 33), (12, 12, 50)]),
    ],
    ids=["service-percent", "service-shorthand", "gateway-weights", "hpa-3", "hpa-12"],
)
def test_follow_mode_batch_tables(fields: dict[str, Any], replicas: int, table: list[tuple[int, int, int]]) -> None:
    steps = expand(GreyReleaseSpec.model_validate({**FOLLOW, **fields}), replicas)
    assert [(s.canary_replicas, s.stable_replicas, s.weight) for s in steps] == table


def test_plan_prints_a_follow_mode_release() -> None:
    doc = {
        "kind": "GreyRelease",
        "metadata": {"name": "web"},
        "spec": {**FOLLOW, "batches": [{"replicas": "50%", "pause": "10s"}, {"replicas": "100%"}]},
    }
    out = io.StringIO()
    assert print_plan(doc, 4, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "GreyRelease web: every new pod template of its Deployment (follow mode) over 4 replicas, "
        "traffic by replica ratio"
    )
    assert "canary / (stable + canary)" in lines[1]
    assert lines[3].split() == ["1", "2", "4", "33%", "10s", "-"]
    assert lines[4].split() == ["2", "4", "4", "50%", "-", "-"]


def test_the_follow_mode_status_reads_back_as_stored() -> None:
    stored = {
        "phase": "Aborted",
        "held": {
            "digest": "7c9f5d0011223344",
            "images": [{"name": "app", "image": "app:v2"}],
            "heldSince": "2026-01-01T12:00:00.000Z",
        },
        "stable": {
            "name": "web-5d8f6c",
            "revision": "3",
            "digest": "aaaabbbbccccdddd",
            "images": [{"name": "app", "image": "app:v1"}],
        },
        "lastRelease": {
            "outcome": "Aborted",
            "digest": "7c9f5d0011223344",
            "images": [{"name": "app", "image": "app:v2"}],
            "endedAt": "2026-01-01T12:05:00.000Z",
            "message": "aborted by annotation",
        },
        "restore": {"template": "7c9f5d0011223344"},
    }
    status = GreyReleaseStatus.model_validate(stored)
    assert status.held is not None and status.held.images[0].image == "app:v2"
    assert status.stable is not None and status.stable.name == "web-5d8f6c"
    assert status.last_release is not None and status.last_release.outcome == Outcome.ABORTED
    dumped = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    for key in ("held", "stable", "lastRelease"):
        assert dumped[key] == stored[key]
    assert dumped["restore"] == {"template": "7c9f5d0011223344"}


def test_idle_is_a_phase_a_release_rests_in() -> None:
    assert Phase.IDLE in TERMINAL_PHASES
