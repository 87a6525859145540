"""A release in follow mode is woken by every change of its Deployment, whatever its phase: a template held,
a revert and an HPA's resize are all changes of it. A pinned release at rest is not."""

from __future__ import annotations

import pytest
from greyrelease.api.release import BatchState, GreyReleaseStatus, Phase
from greyrelease.planner.actions import Plan
from greyrelease.reconcile.reconciler import Outcome
from greyrelease.runtime.controller import waiting


def outcome(phase: Phase, *, follows: bool, state: BatchState | None = None) -> Outcome:
    return Outcome(
        Plan(status=GreyReleaseStatus(phase=phase, batch_state=state)), ("web", "web-canary"), follows=follows
    )


@pytest.mark.parametrize(
    ("phase", "state"),
    [
        (Phase.IDLE, None),
        (Phase.SUCCEEDED, None),
        (Phase.ABORTED, None),
        (Phase.WAITING, None),
        (Phase.PROGRESSING, BatchState.VERIFYING),
        (Phase.PAUSED, BatchState.VERIFYING),
    ],
)
def test_a_followed_deployment_wakes_its_release_in_every_phase(phase: Phase, state: BatchState | None) -> None:
    assert waiting(outcome(phase, follows=True, state=state))


@pytest.mark.parametrize(
    ("phase", "state"), [(Phase.SUCCEEDED, None), (Phase.PROGRESSING, BatchState.VERIFYING), (Phase.ABORTED, None)]
)
def test_a_pinned_release_on_hold_or_at_rest_is_not_woken_by_its_deployment(
    phase: Phase, state: BatchState | None
) -> None:
    assert not waiting(outcome(phase, follows=False, state=state))
