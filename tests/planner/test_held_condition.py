"""The Held condition, as the planner builds it from the hold's self-test: in follow mode only, copied when
nothing changed, its lastTransitionTime moved only when its status does, and kept as recorded while the
process has not tested yet."""

from __future__ import annotations

from datetime import timedelta

from greyrelease.api.release import GreyReleaseStatus, Phase
from greyrelease.planner.observed import UNTESTED, HeldCheck
from greyrelease.planner.passes import _conditions

from tests.support.builders import T0

HELD = HeldCheck("True", "DryRunHeld", "a dry-run change of the pod template of Deployment shop/web came back held")
REFUSED = HeldCheck("False", "WebhookRefused", "the API server refuses a template change of Deployment shop/web: x")


def held_of(status: GreyReleaseStatus) -> list[tuple[str, str]]:
    return [(c.status, c.reason) for c in status.conditions if c.type == "Held"]


def test_the_held_condition_follows_the_self_test_and_changes_only_with_it() -> None:
    idle = GreyReleaseStatus(phase=Phase.IDLE)
    assert held_of(idle.model_copy(update={"conditions": _conditions(idle, T0)})) == []  # no self-test: none
    first = idle.model_copy(update={"conditions": _conditions(idle, T0, HELD)})
    assert held_of(first) == [("True", "DryRunHeld")]
    later = T0 + timedelta(minutes=5)
    again = _conditions(first, later, HELD)
    assert all(a is b for a, b in zip(again, first.conditions, strict=True))  # nothing copied, nothing to write
    # Not tested yet (a controller started again): the recorded condition stays, the same object.
    assert all(a is b for a, b in zip(_conditions(first, later, UNTESTED), first.conditions, strict=True))
    refused = first.model_copy(update={"conditions": _conditions(first, later, REFUSED)})
    (before,) = (c for c in first.conditions if c.type == "Held")
    (after,) = (c for c in refused.conditions if c.type == "Held")
    assert (after.status, after.reason, after.message) == ("False", "WebhookRefused", REFUSED.message)
    assert before.last_transition_time == T0 and after.last_transition_time == later
    # Without a self-test (pinned mode), a Held condition recorded goes.
    assert held_of(refused.model_copy(update={"conditions": _conditions(refused, later)})) == []
