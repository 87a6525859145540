"""Statuses written by an earlier controller keep working: the same decisions, the same stored form.

``fixtures/decisions_before_batch_state.jsonl`` holds 128 calls of ``decide`` recorded from the controller
as it was before the status had a ``batchState`` (releases driven through ``tests/support/world.py``: timed and
manual pauses, analysis, abort, retry, deadlines, a lost canary, a deleted target, a restart, deletion,
invalid specs). Each line is one call: the spec, the status as the API server stored it (no null
field), what was observed, the time, and the plan that came out. A line without ``status`` was planned
from the status the line before it produced.

Replayed on the code of today, every call must give the same actions, Events, wake-up and status, apart
from the fields added since (listed in ``NEW_FIELDS``, ``NEW_CONDITIONS`` and ``NEW_ACTION_FIELDS``) and the
batch's timers, which have moved into ``batchTimes`` since (compared there: :func:`_upgraded`).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from greyrelease.analysis.verdicts import Check, Sample
from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus
from greyrelease.planner.actions import Action, PrepareRouting, SetWeight
from greyrelease.planner.machine import Observed, Workload, decide

from tests.support.recorded import poll_as_recorded

FIXTURE = Path(__file__).parent / "fixtures" / "decisions_before_batch_state.jsonl"
#: Status fields the earlier controller did not write.
NEW_FIELDS: frozenset[str] = frozenset(
    {"batchState", "lastRelease", "held", "stable", "requests", "approvals", "webhooks", "awaitingConfirmation"}
)
#: Conditions it did not write (kstatus's, added with follow mode).
NEW_CONDITIONS: frozenset[str] = frozenset({"Ready", "Reconciling", "Stalled"})
#: Fields of actions it did not have, at the value they have when not set.
NEW_ACTION_FIELDS: dict[str, object] = {"template": ""}

#: The timers an earlier controller stored as fields of the status, and their names in ``batchTimes``.
FLAT_TIMERS = {
    "batchStartedAt": "startedAt",
    "batchReadyAt": "readyAt",
    "nextCheckAt": "nextCheckAt",
    "approvalExpiresAt": "approvalExpiresAt",
}


def _upgraded(stored: dict[str, Any]) -> dict[str, Any]:
    """A status as that controller stored it, as it is stored now: the timers in ``batchTimes``."""
    times = {new: stored[old] for old, new in FLAT_TIMERS.items() if old in stored}
    return {**{k: v for k, v in stored.items() if k not in FLAT_TIMERS}, "batchTimes": times}


def _stored(value: Any) -> Any:
    """``value`` without its null fields, at any depth (how the API server stores a status)."""
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_stored(v) for v in value]
    return value


def _cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    previous: dict[str, Any] = {}
    for line in FIXTURE.read_text().splitlines():
        case = json.loads(line)
        if "status" not in case:
            case["status"] = previous[case["scenario"]]
        previous[case["scenario"]] = case["plan"]["status"]
        out.append(case)
    return out


CASES = _cases()


def _workload(d: dict[str, Any] | None) -> Workload | None:
    return None if d is None else Workload(**{**d, "containers": tuple(d["containers"])})


def _observed(d: dict[str, Any]) -> Observed:
    def sample(s: dict[str, Any] | None) -> Sample | None:
        return None if s is None else Sample(**s)

    return Observed(
        candidates=tuple(w for w in map(_workload, d["candidates"]) if w is not None),
        canary=_workload(d["canary"]),
        annotations=d["annotations"],
        generation=d["generation"],
        uid=d["uid"],
        deleting=d["deleting"],
        deletion_started=datetime.fromisoformat(d["deletionStarted"]) if d["deletionStarted"] else None,
        routing_error=d["routingError"],
        checks=tuple(Check(c["metric"], Sample(**c["canary"]), sample(c["stable"])) for c in d["checks"]),
    )


def _as_recorded(action: Action, status: GreyReleaseStatus) -> dict[str, Any]:
    """An action as the fixture has it. What the routing actions carry since (the stable ReplicaSet's hash,
    which the routers read then from the status the plan records) is checked against that status."""
    fields = dataclasses.asdict(action)
    if isinstance(action, (PrepareRouting, SetWeight)):
        assert fields.pop("stable_hash") == status.stable_pod_template_hash
    fields = {k: v for k, v in fields.items() if k not in NEW_ACTION_FIELDS or v != NEW_ACTION_FIELDS[k]}
    return {"type": type(action).__name__, **fields}


def _dump(status: GreyReleaseStatus) -> dict[str, Any]:
    out: dict[str, Any] = _stored(status.model_dump(by_alias=True, mode="json"))
    out["conditions"] = [c for c in out.get("conditions", []) if c["type"] not in NEW_CONDITIONS]
    return {k: v for k, v in out.items() if k not in NEW_FIELDS}


def test_the_fixture_covers_every_phase_and_both_sides_of_a_batch() -> None:
    seen = {(c["status"].get("phase"), bool(c["status"].get("batchReadyAt"))) for c in CASES}
    for phase in ("Progressing", "Paused"):
        assert (phase, True) in seen and (phase, False) in seen, phase
    phases = {p for p, _ in seen}
    assert phases >= {None, "Initializing", "Promoting", "RollingBack", "Succeeded", "Aborted", "Failed", "InvalidSpec"}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_an_old_status_reads_back_as_it_was_stored(case: dict[str, Any]) -> None:
    assert _dump(GreyReleaseStatus.model_validate(case["status"])) == _upgraded(case["status"])


@pytest.fixture(autouse=True)
def _poll_as_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    poll_as_recorded(monkeypatch)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_an_old_status_is_planned_on_as_before(case: dict[str, Any]) -> None:
    spec = GreyReleaseSpec.model_validate(case["spec"])
    status = GreyReleaseStatus.model_validate(case["status"])
    now = datetime.fromisoformat(case["now"])
    plan = decide(spec, status, _observed(case["observed"]), now)
    want = case["plan"]
    actions = [_as_recorded(a, plan.status) for a in plan.actions]
    assert json.loads(json.dumps(actions)) == want["actions"]
    # Recorded before an Event could be about another object than the release (Event.about): none is here.
    assert [dataclasses.asdict(e) for e in plan.events] == [{**e, "about": None} for e in want["events"]]
    assert (plan.requeue_after, plan.done) == (want["requeueAfter"], want["done"])
    assert _dump(plan.status) == _upgraded(want["status"])
    # The batch state read from the old controller's status is the one the planner of today records.
    assert GreyReleaseStatus.model_validate(want["status"]).batch_state == plan.status.batch_state
