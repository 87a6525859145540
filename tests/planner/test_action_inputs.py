"""The routing actions carry what a router needs to carry them out: the pod-template-hash of the stable
ReplicaSet, as the plan records it (a router reads no status). It is recorded in the very pass that
prepares the routing, and a later release of the same Deployment narrows to the ReplicaSet then stable."""

from __future__ import annotations

from typing import Any

import pytest
from greyrelease.api.release import ABORT_ANNOTATION
from greyrelease.planner.actions import Plan, PrepareRouting, SetWeight

from tests.support.world import World, spec

MODES = [
    pytest.param(None, id="replicas"),
    pytest.param({"service": {"name": "web"}}, id="service"),
    pytest.param({"nginx": {"ingress": "web", "stableService": "web"}}, id="nginx"),
    pytest.param({"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}, id="gateway"),
]


def carried(plans: list[Plan]) -> list[tuple[str, str]]:
    """For each routing action: the hash it carries, and the one its plan records."""
    return [
        (a.stable_hash, p.status.stable_pod_template_hash)
        for p in plans
        for a in p.actions
        if isinstance(a, (PrepareRouting, SetWeight))
    ]


@pytest.mark.parametrize("routing", MODES)
def test_the_pass_that_records_the_stable_replica_set_prepares_the_routing_with_it(routing: Any) -> None:
    w = World(spec(trafficRouting=routing))
    assert w.status.stable_pod_template_hash == ""
    plan = w.step()
    assert plan.actions[0] == PrepareRouting()
    assert plan.actions[0].stable_hash == plan.status.stable_pod_template_hash == "stablehash"


@pytest.mark.parametrize("routing", MODES)
def test_every_weight_carries_the_hash_the_plan_records_through_release_and_abort(routing: Any) -> None:
    w = World(spec(trafficRouting=routing, pause="10s"))
    w.run(until={"Succeeded"})
    w.spec = w.spec.model_copy(update={"target_version": "v3"})
    for _ in range(3):
        w.step()
    w.annotations[ABORT_ANNOTATION] = "true"
    w.run(until={"Aborted"})
    pairs = carried(w.plans)
    assert len(pairs) > 3 and all(action == recorded for action, recorded in pairs)
    # The second release narrows to the ReplicaSet the first one promoted.
    assert {action for action, _ in pairs} == {"stablehash", "newhash"}
    aborts = [a for p in w.plans for a in p.actions if isinstance(a, SetWeight) and a.weight == 0]
    assert aborts and all(a.stable_hash == "newhash" for a in aborts[-2:])
