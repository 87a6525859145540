"""The status patch of a pass: None when the object holds the status already, as the API server stores it
(no null anywhere, ``endPhase``'s None as ``""``), else the whole status with its nulls. The comparison
serialises the status once, without its nulls; it must decide exactly as a comparison of both sides with
their nulls dropped would. And the reconciler compares an idle release's status once per version of the
object, yet writes every status the plan changes or another hand changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from greyrelease.api.release import BatchTimes, GreyReleaseStatus, Phase, fmt_time
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.reconcile import reconciler as reconciler_module
from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.reconcile.record import status_patch, stored, write_status

from tests.support.builders import NS, T0, cluster, roll_out, status_of

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
RELEASE = path("greyrelease.io", "v1", "greyreleases", "shop", "web")


def release(status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
    }
    if status is not None:
        obj["status"] = status
    return obj


def live(**changes: Any) -> GreyReleaseStatus:
    """A pinned release's batch 2 of 3, live and paused, with a metric and a history."""
    status = GreyReleaseStatus.model_validate(
        {
            "phase": "Progressing",
            "message": "batch 2/3: weight 50%",
            "batch": "2/3",
            "batchState": "Verifying",
            "currentBatch": 2,
            "totalBatches": 3,
            "canaryWeight": 50,
            "restore": {"replicas": 4, "image": "app:v1"},
            "transitions": 3,
            "phaseStartedAt": "2026-01-01T12:00:00.000Z",
            "batchTimes": {
                "startedAt": "2026-01-01T12:01:00.000Z",
                "readyAt": "2026-01-01T12:01:04.000Z",
                "nextCheckAt": "2026-01-01T13:01:04.000Z",
            },
            "conditions": [
                {"type": "Progressing", "status": "True", "reason": "Progressing", "message": "batch 2/3"},
                {"type": "Ready", "status": "False", "reason": "Progressing", "lastTransitionTime": fmt_time(NOW)},
            ],
            "metrics": [{"name": "errors", "value": 0.5, "successes": 2}],
            "history": [{"batch": 1, "startedAt": "2026-01-01T12:00:00.000Z", "result": "passed"}],
        }
    )
    return status.model_copy(update=changes)


def as_stored(status: GreyReleaseStatus) -> dict[str, Any]:
    """What the API server keeps of the status patch written for ``status``."""
    kube = MemoryKube(release(None))
    assert write_status(kube, release(None), status)
    return dict((kube.get(RELEASE) or {})["status"])


def differs_as_stored(old: dict[str, Any], status: GreyReleaseStatus) -> bool:
    """The definition: some field of the status, nulls dropped on both sides at any depth, differs."""
    new = status.model_dump(by_alias=True, mode="json")
    return any(stored(old.get(k)) != stored(v) for k, v in new.items())


def test_a_status_read_back_as_stored_is_not_written_again() -> None:
    status = live()
    held = as_stored(status)
    assert held["endPhase"] == "" and "queuePosition" not in held and "held" not in held
    assert status_patch(release(held), status) is None
    # Read back through the model, as the next pass does, and planned unchanged: still nothing to write.
    assert status_patch(release(held), GreyReleaseStatus.model_validate(held)) is None


def test_a_status_differing_only_in_a_null_field_is_not_written() -> None:
    status = live()
    held = as_stored(status)
    # Nulls the API server would have dropped, at the top and inside: equal as stored.
    with_nulls = {**held, "queuePosition": None, "held": None}
    with_nulls["batchTimes"] = {**held["batchTimes"], "approvalExpiresAt": None}
    with_nulls["history"] = [{**held["history"][0], "finishedAt": None}]
    assert status_patch(release(with_nulls), status) is None


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"message": "batch 2/3: weight 50%, pausing"}, id="a field"),
        pytest.param({"end_phase": Phase.ABORTED}, id="endPhase set"),
        pytest.param({"queue_position": 2}, id="a null field set"),
        pytest.param({"transitions": None}, id="a field set to null"),
        pytest.param({"batch_times": BatchTimes(started_at=NOW)}, id="a nested field set to null"),
    ],
)
def test_a_changed_field_is_written_with_its_nulls(changes: dict[str, Any]) -> None:
    held = as_stored(live())
    status = live(**changes)
    patch = status_patch(release(held), status)
    assert patch == {"status": status.model_dump(by_alias=True, mode="json")}
    # A field the object has and the status no longer does is removed by the null the patch carries.
    after = as_stored(status)
    assert status_patch(release(after), status) is None


def test_a_changed_condition_is_written() -> None:
    status = live()
    held = as_stored(status)
    conditions = list(status.conditions)
    conditions[1] = conditions[1].model_copy(update={"last_transition_time": NOW + timedelta(seconds=1)})
    changed = status.model_copy(update={"conditions": conditions})
    assert status_patch(release(held), changed) is not None
    conditions[1] = conditions[1].model_copy(update={"last_transition_time": NOW, "message": "now ready"})
    assert status_patch(release(held), status.model_copy(update={"conditions": conditions})) is not None


def test_a_stored_status_without_end_phase_is_written() -> None:
    """``endPhase``'s None is stored as ``""``: an object whose status has no endPhase at all (written by
    another hand) does not hold the status yet."""
    held = as_stored(live())
    del held["endPhase"]
    assert status_patch(release(held), live()) is not None


def test_a_stored_field_the_status_does_not_know_is_left_alone() -> None:
    """A key of an earlier controller's status (a timer kept beside batchTimes) writes nothing by itself."""
    held = {**as_stored(live()), "batchReadyAt": "2026-01-01T12:01:04.000Z"}
    assert status_patch(release(held), live()) is None


STORED_VARIANTS: list[tuple[str, Any]] = [
    ("phase", "Paused"),
    ("phase", None),
    ("endPhase", ""),
    ("endPhase", None),
    ("endPhase", "Aborted"),
    ("transitions", None),
    ("transitions", 4),
    ("queuePosition", None),
    ("queuePosition", 1),
    ("conditions", []),
    ("metrics", [{"name": "errors", "value": 0.5, "successes": 2, "stableValue": None}]),
    ("history", None),
    ("restore", {"replicas": 4, "image": "app:v1", "template": None}),
    ("restore", {"replicas": 4}),
]


@pytest.mark.parametrize(("key", "value"), STORED_VARIANTS)
@pytest.mark.parametrize("planned", ["same", "endPhase", "no transitions"])
def test_the_decision_is_the_comparison_with_nulls_dropped(key: str, value: Any, planned: str) -> None:
    status = {
        "same": live(),
        "endPhase": live(phase=Phase.ROLLING_BACK, end_phase=Phase.FAILED),
        "no transitions": live(transitions=None),
    }[planned]
    held = as_stored(live())
    held = {k: v for k, v in held.items() if k != key} if value is None else {**held, key: value}
    patch = status_patch(release(held), status)
    assert (patch is not None) == differs_as_stored(held, status), (key, value, planned, patch)


# --- the reconciler: an idle release's status compared once per version of the object ----------------


HELD = [{"replicas": 1}, {"replicas": 2, "pause": "1h"}, {"replicas": 4}]
STATUS = path("greyrelease.io", "v1", "greyreleases", NS, "web", "status")


def test_an_idle_release_is_compared_once_per_version_of_the_object(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = cluster(batches=HELD)
    reconciler, now = Reconciler(kube), T0
    for _ in range(20):
        reconciler.reconcile(NS, "web", now=now)
        if (status_of(kube).get("batchTimes") or {}).get("readyAt") and status_of(kube)["currentBatch"] == 2:
            break
        roll_out(kube)
        now += timedelta(seconds=10)
    compared: list[bool] = []

    def counted(kube: Any, release: Any, status: GreyReleaseStatus) -> bool:
        compared.append(write_status(kube, release, status))
        return compared[-1]

    monkeypatch.setattr(reconciler_module, "write_status", counted)
    kube.requests.clear()
    for _ in range(3):  # in the pause: the first pass compares (nothing to write), the others need not
        now += timedelta(seconds=1)
        reconciler.reconcile(NS, "web", now=now)
    assert compared == [False] and kube.writes == []

    # Another hand removes a field the status has (endPhase, ""): a new version of the object, compared
    # again, the field written back.
    held = status_of(kube)
    kube.patch(STATUS, {"status": {"endPhase": None}})
    assert "endPhase" not in status_of(kube)
    kube.requests.clear()
    for _ in range(3):
        now += timedelta(seconds=1)
        reconciler.reconcile(NS, "web", now=now)
    assert compared == [False, True, False]  # written back; then the version written found to hold it
    assert kube.writes == [("PATCH", STATUS)] and status_of(kube) == held

    # The pause over: the plan changes the status, written whatever version was found to hold the last.
    reconciler.reconcile(NS, "web", now=now + timedelta(hours=1))
    assert compared[-1] is True and status_of(kube)["currentBatch"] == 3
