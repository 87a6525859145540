"""What replaying decisions recorded from an earlier controller needs to be told about the controller of
then."""

from __future__ import annotations

import pytest
from greyrelease.planner import batch_states, promotion, rollback

#: The poll under lost wake-ups when the fixtures were recorded (CONVERGE_POLL is 30 s since:
#: bench/README.md, "The net under lost wake-ups").
POLL_RECORDED = 10.0


def poll_as_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner waits on converging Deployments with the poll of the recording."""
    for module in (batch_states, promotion, rollback):
        monkeypatch.setattr(module, "CONVERGE_POLL", POLL_RECORDED)
