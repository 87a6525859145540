"""Freezes: held from the start (inclusive) to the end (exclusive), overlapping, of several sources, meeting
windows; a release whose start, or whose next batch, waits for a freeze to end, and what the user can do
meanwhile (promote, abort, pause)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from greyrelease.api.release import ABORT_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION, BatchState, Phase
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import (
    DeleteCanary,
    EnsureCanary,
    Plan,
    PrepareRouting,
    RemoveAnnotations,
    ScaleStable,
    SetStableImage,
    SetWeight,
)
from greyrelease.planner.governance import SPEC, Hold, Rules, Source
from greyrelease.planner.machine import progressing

from tests.support.builders import T0
from tests.support.governance import OFFICE, POLICY, GovWorld, at, freeze, reasons, rules
from tests.support.world import spec

# --- freezes (pure) ---------------------------------------------------------------------------------

XMAS = freeze("2026-12-20T00:00:00Z", "2026-12-27T00:00:00Z", "christmas")
NEW_YEAR = freeze("2026-12-24T00:00:00Z", "2027-01-02T00:00:00Z", "new year")


def test_inside_a_freeze_holds_until_its_end() -> None:
    hold = rules(freezes=(XMAS,)).hold(at("2026-12-21T10:00:00Z"))
    assert hold == Hold(
        at("2026-12-27T00:00:00Z"), "waiting for the end of freeze 'christmas' (next start 2026-12-27T00:00:00Z)"
    )


def test_freeze_boundaries_from_inclusive_to_exclusive() -> None:
    r = rules(freezes=(XMAS,))
    assert r.hold(at("2026-12-19T23:59:59.999999Z")) is None
    start = r.hold(at("2026-12-20T00:00:00Z"))
    assert start is not None and start.until == at("2026-12-27T00:00:00Z")
    last = r.hold(at("2026-12-26T23:59:59.999999Z"))
    assert last is not None and last.until == at("2026-12-27T00:00:00Z")
    assert r.hold(at("2026-12-27T00:00:00Z")) is None


@pytest.mark.parametrize(
    ("now", "named"),
    [("2026-12-21T00:00:00Z", "christmas"), ("2026-12-25T00:00:00Z", "new year"), ("2026-12-30T00:00:00Z", "new year")],
    ids=["in-the-first-only", "in-both", "in-the-second-only"],
)
def test_overlapping_freezes_hold_until_the_later_end(now: str, named: str) -> None:
    for order in ((XMAS, NEW_YEAR), (NEW_YEAR, XMAS)):
        hold = rules(freezes=order).hold(at(now))
        assert hold is not None and hold.until == at("2027-01-02T00:00:00Z")
        assert f"freeze {named!r}" in hold.message


def test_freezes_of_different_sources_add_up() -> None:
    r = Rules((Source(SPEC, freezes=(XMAS,)), Source(POLICY, freezes=(NEW_YEAR,))))
    hold = r.hold(at("2026-12-25T00:00:00Z"))
    assert hold is not None and hold.until == at("2027-01-02T00:00:00Z")
    assert hold.message == f"waiting for the end of freeze 'new year' of {POLICY} (next start 2027-01-02T00:00:00Z)"


def test_a_freeze_ending_outside_a_window_waits_for_the_next_opening() -> None:
    incident = freeze("2026-12-03T00:00:00Z", "2026-12-04T20:00:00Z", "incident")  # ends Friday 21:00 Berlin
    r = rules(OFFICE, freezes=(incident,))
    hold = r.hold(at("2026-12-03T10:00:00Z"))
    assert hold == Hold(
        at("2026-12-07T08:00:00Z"), "waiting for the end of freeze 'incident' (next start 2026-12-07T09:00:00+01:00)"
    )
    # Just after the freeze: a closed window, named as such.
    after = r.hold(at("2026-12-04T20:00:00Z"))
    assert after == Hold(at("2026-12-07T08:00:00Z"), "waiting for release window (opens 2026-12-07T09:00:00+01:00)")


def test_a_window_opening_into_a_freeze_waits_for_the_freeze() -> None:
    monday = freeze("2026-12-07T07:00:00Z", "2026-12-07T12:00:00Z", "deploy freeze")
    hold = rules(OFFICE, freezes=(monday,)).hold(at("2026-12-05T12:00:00Z"))
    assert hold is not None and hold.until == at("2026-12-07T12:00:00Z")


def test_a_freeze_without_a_reason() -> None:
    hold = rules(freezes=(freeze("2026-12-20T00:00:00Z", "2026-12-21T00:00:00Z"),)).hold(at("2026-12-20T01:00:00Z"))
    assert hold is not None and hold.message == "waiting for the end of a freeze (next start 2026-12-21T00:00:00Z)"


def test_a_freeze_is_read_in_its_own_offset() -> None:
    berlin = freeze("2026-12-20T00:00:00+01:00", "2026-12-21T00:00:00+01:00")
    r = rules(freezes=(berlin,))
    assert r.hold(at("2026-12-19T23:00:00Z")) is not None  # midnight in Berlin
    assert r.hold(at("2026-12-19T22:59:59Z")) is None
    assert r.hold(at("2026-12-20T23:00:00Z")) is None


# --- the planner: waiting for a freeze --------------------------------------------------------------


def changes(plan: Plan) -> list[object]:
    """The actions that change the canary, the stable or the traffic."""
    kinds = (EnsureCanary, ScaleStable, SetStableImage, SetWeight, DeleteCanary, PrepareRouting)
    return [a for a in plan.actions if isinstance(a, kinds)]


def test_a_policy_freeze_holds_the_start_and_names_the_policy() -> None:
    xmas = Rules((Source(POLICY, freezes=(XMAS,)),))
    w = GovWorld(spec(), rules=xmas, now=at("2026-12-21T10:00:00Z"))
    plan = w.step()
    assert plan.status.phase == Phase.WAITING
    assert plan.status.message == (
        f"waiting for the end of freeze 'christmas' of {POLICY} (next start 2026-12-27T00:00:00Z)"
    )
    assert plan.actions == ()
    assert plan.requeue_after == (at("2026-12-27T00:00:00Z") - w.now).total_seconds()


FROZEN_AT = T0 + timedelta(seconds=10)
THAWED_AT = T0 + timedelta(hours=2)


def waiting_between_batches() -> tuple[GovWorld, Plan]:
    """A release whose batch 1 (30 s pause) is live when a policy's freeze begins; stepped until batch 1
    has passed and batch 2 waits for the freeze's end. The world and the plan that made it wait."""
    w = GovWorld(spec(pause="30s"))
    w.step()
    live = w.step()
    assert live.status.batch_state == BatchState.VERIFYING and live.status.canary_weight == 20
    w.rules = Rules((Source(POLICY, freezes=(freeze(FROZEN_AT, THAWED_AT, "incident"),)),))
    # The freeze has begun; the live batch still finishes its pause.
    w.now = FROZEN_AT
    pausing = w.step()
    assert (pausing.status.phase, pausing.status.batch_state) == (Phase.PROGRESSING, BatchState.VERIFYING)
    assert pausing.requeue_after == 20
    w.now = T0 + timedelta(seconds=30)
    return w, w.step()


def test_a_freeze_that_begins_mid_release_holds_the_next_batch_and_keeps_the_canary() -> None:
    w, plan = waiting_between_batches()
    st = plan.status
    assert (st.phase, st.batch_state, st.current_batch, st.batch) == (Phase.WAITING, BatchState.DONE, 1, "1/5")
    assert st.message == (
        f"batch 1/5 passed; batch 2/5 is waiting for the end of freeze 'incident' of {POLICY} "
        "(next start 2026-01-01T14:00:00Z)"
    )
    assert plan.actions == ()
    assert (st.canary_weight, st.canary_replicas, st.stable_replicas) == (20, 2, 8)
    assert w.weight == 20 and w.canary is not None and w.canary.replicas == 2
    assert w.stable is not None and w.stable.replicas == 8
    assert plan.requeue_after == (THAWED_AT - w.now).total_seconds()
    assert R.WAITING in reasons(plan)
    assert st.history[0].result == "passed" and st.history[0].finished_at == w.now
    assert progressing(st)  # it holds its slot meanwhile
    # Nothing moves (and nothing is written) while it waits.
    w.now = T0 + timedelta(hours=1)
    idle = w.step()
    assert idle.status == st and idle.actions == () and idle.events == ()
    w.now = THAWED_AT
    thawed = w.step()
    assert (thawed.status.phase, thawed.status.current_batch) == (Phase.PROGRESSING, 2)
    assert EnsureCanary(replicas=4, image="app:v2", version="v2") in thawed.actions
    assert R.BATCH_PASSED in reasons(thawed)


def test_promote_full_while_waiting_between_batches_is_not_held() -> None:
    w, _ = waiting_between_batches()
    w.annotations[PROMOTE_ANNOTATION] = "full"
    w.now += timedelta(seconds=5)  # still in the freeze
    plan = w.step()
    assert plan.status.phase == Phase.PROMOTING
    assert plan.actions[0] == RemoveAnnotations((PROMOTE_ANNOTATION,))
    assert any(isinstance(a, SetStableImage) and a.image == "app:v2" for a in plan.actions)
    assert R.PROMOTED in reasons(plan)
    w.run(until={Phase.SUCCEEDED}, tick=1.0)
    assert w.now < THAWED_AT and w.stable is not None and w.stable.image == "app:v2"


def test_promote_next_while_waiting_between_batches_respects_the_freeze() -> None:
    w, _ = waiting_between_batches()
    w.annotations[PROMOTE_ANNOTATION] = "next"
    plan = w.step()
    assert plan.actions == (RemoveAnnotations((PROMOTE_ANNOTATION,)),)
    assert (plan.status.phase, plan.status.batch_state, plan.status.current_batch) == (
        Phase.WAITING,
        BatchState.DONE,
        1,
    )
    assert any(e.type == "Warning" and "promote=full" in e.message for e in plan.events)
    assert PROMOTE_ANNOTATION not in w.annotations


def test_abort_while_waiting_between_batches_rolls_back_at_once() -> None:
    w, _ = waiting_between_batches()
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK
    assert plan.actions[0] == SetWeight(0)
    assert plan.status.end_phase == Phase.ABORTED
    w.run(until={Phase.ABORTED})
    assert w.canary is None and w.weight == 0
    assert w.stable is not None and (w.stable.replicas, w.stable.image) == (10, "app:v1")


def test_a_pause_while_waiting_between_batches_resumes_into_the_wait() -> None:
    w, _ = waiting_between_batches()
    w.annotations[PAUSE_ANNOTATION] = "true"
    paused = w.step()
    assert (paused.status.phase, paused.status.batch_state) == (Phase.PAUSED, BatchState.DONE)
    assert changes(paused) == []
    del w.annotations[PAUSE_ANNOTATION]
    w.run(until={Phase.WAITING})
    assert (w.status.batch_state, w.status.current_batch) == (BatchState.DONE, 1)
    w.now = THAWED_AT
    assert w.step().status.current_batch == 2
