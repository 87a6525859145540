"""The current batch's timers are one sub-object of the status, ``batchTimes``; a status stored by an
earlier controller had them as fields of its own, and reads back with them moved there."""

from __future__ import annotations

from datetime import UTC, datetime

from greyrelease.api.release import BatchState, BatchTimes, GreyReleaseStatus

T = "2026-01-01T12:00:00.000Z"
LATER = "2026-01-01T12:00:30.000Z"
AT, AT_LATER = datetime(2026, 1, 1, 12, 0, tzinfo=UTC), datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)


def test_the_timers_of_an_earlier_controller_move_into_batch_times() -> None:
    old = {
        "phase": "Progressing",
        "batchState": "Verifying",
        "batchStartedAt": T,
        "batchReadyAt": T,
        "nextCheckAt": LATER,
    }
    status = GreyReleaseStatus.model_validate(old)
    assert status.batch_times == BatchTimes(started_at=AT, ready_at=AT, next_check_at=AT_LATER)
    stored = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert stored["batchTimes"] == {"startedAt": T, "readyAt": T, "nextCheckAt": LATER}
    assert not {"batchStartedAt", "batchReadyAt", "nextCheckAt", "approvalExpiresAt"} & stored.keys()


def test_fields_of_the_old_names_left_beside_batch_times_are_ignored() -> None:
    # A merge patch of the new status leaves the old keys where the schema still has them.
    stored = {"phase": "Progressing", "batchState": "Verifying", "batchTimes": {"readyAt": LATER}, "batchReadyAt": T}
    assert GreyReleaseStatus.model_validate(stored).batch_times == BatchTimes(ready_at=AT_LATER)


def test_a_status_without_timers_has_none() -> None:
    assert GreyReleaseStatus.model_validate({}).batch_times == BatchTimes()
    assert GreyReleaseStatus.model_validate({"phase": "Succeeded"}).batch_times == BatchTimes()


def test_the_batch_state_of_a_status_from_before_batch_state_is_read_from_either_form() -> None:
    for times in ({"batchReadyAt": T}, {"batchTimes": {"readyAt": T}}):
        live = GreyReleaseStatus.model_validate({"phase": "Progressing", **times})
        assert live.batch_state == BatchState.VERIFYING
    growing = GreyReleaseStatus.model_validate({"phase": "Progressing", "batchTimes": {"startedAt": T}})
    assert growing.batch_state == BatchState.UPSCALING
