"""Approvals: a manual pause with a timeout, the deadline recorded when the batch goes live, and what
happens on it (abort, or promote); an approval in time clears it, and it survives a restart."""

from __future__ import annotations

from datetime import timedelta

import pytest
from greyrelease.api.release import PROMOTE_ANNOTATION, BatchState, GreyReleaseSpec, GreyReleaseStatus, Phase
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import EnsureCanary, Plan, SetWeight
from greyrelease.planner.batches import MANUAL, Approval, expand

from tests.support.builders import T0
from tests.support.governance import GovWorld, reasons
from tests.support.world import spec


def manual(timeout: str = "4h", on_timeout: str = "abort") -> GreyReleaseSpec:
    """Batch 1 waits for an approval at most ``timeout``; batch 2 pauses 30 s."""
    first = {"replicas": 2, "pause": "manual", "approval": {"timeout": timeout, "onTimeout": on_timeout}}
    return spec(batchSize=None, canaryWeight=None, batches=[first, {"replicas": 5, "pause": "30s"}, {"replicas": 10}])


DEADLINE = T0 + timedelta(hours=4)


def live_waiting_for_approval(s: GreyReleaseSpec) -> tuple[GovWorld, Plan]:
    w = GovWorld(s)
    w.step()
    live = w.step()
    assert live.status.batch_state == BatchState.WAITING_FOR_APPROVAL
    return w, live


def test_the_steps_carry_the_approval_timeout() -> None:
    steps = expand(manual("4h", "promote"), 10)
    assert steps[0].pause == MANUAL and steps[0].approval == Approval(4 * 3600.0, "promote")
    assert steps[1].approval is None
    plain = expand(
        spec(batchSize=None, canaryWeight=None, batches=[{"replicas": 2, "pause": "manual"}, {"replicas": 10}]), 10
    )
    assert plain[0].pause == MANUAL and plain[0].approval is None
    # The release's approval holds every batch waiting for one, unless the batch sets its own; a batch
    # that does not wait for an approval has none.
    every = spec(
        batchSize=None,
        canaryWeight=None,
        approval={"timeout": "1h"},
        batches=[
            {"replicas": 2, "pause": "manual"},
            {"replicas": 4, "pause": "manual", "approval": {"timeout": "30m", "onTimeout": "promote"}},
            {"replicas": 6, "pause": "30s"},
            {"replicas": 10},
        ],
    )
    assert [s.approval for s in expand(every, 10)] == [
        Approval(3600.0, "abort"),
        Approval(1800.0, "promote"),
        None,
        None,
    ]
    # The shorthand: every batch but the last waits, each at most so long.
    short = expand(spec(pause="manual", approval={"timeout": "2h", "onTimeout": "promote"}), 10)
    assert [s.approval for s in short] == [Approval(7200.0, "promote")] * 4 + [None]


def test_an_approval_deadline_is_recorded_when_the_batch_goes_live() -> None:
    _, live = live_waiting_for_approval(manual())
    st = live.status
    assert st.batch_times.approval_expires_at == DEADLINE and st.batch_times.ready_at == T0
    assert "until 2026-01-01T16:00:00.000Z, then abort" in st.message
    assert live.requeue_after == 4 * 3600
    assert st.model_dump(mode="json", by_alias=True)["batchTimes"]["approvalExpiresAt"] == "2026-01-01T16:00:00.000Z"


def test_one_millisecond_before_the_deadline_it_still_waits() -> None:
    w, live = live_waiting_for_approval(manual())
    w.now = DEADLINE - timedelta(milliseconds=1)
    plan = w.step()
    assert plan.status == live.status
    assert plan.actions == () and plan.events == ()
    assert plan.requeue_after == pytest.approx(0.001)


def test_exactly_at_the_deadline_an_unapproved_batch_aborts() -> None:
    w, _ = live_waiting_for_approval(manual())
    w.now = DEADLINE
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.status.end_phase == Phase.ABORTED
    assert plan.actions == (SetWeight(0),)
    expired = [e for e in plan.events if e.reason == R.APPROVAL_EXPIRED]
    assert len(expired) == 1 and expired[0].type == "Warning"
    assert "no approval within 14400s" in expired[0].message
    assert "(approval.timeout)" in expired[0].message  # the field that set it
    w.run(until={Phase.ABORTED})
    assert w.status.batch_times.approval_expires_at is None
    assert w.canary is None and w.weight == 0
    assert w.stable is not None and (w.stable.replicas, w.stable.image) == (10, "app:v1")


def test_on_timeout_promote_goes_on_to_the_next_batch() -> None:
    w, _ = live_waiting_for_approval(manual(on_timeout="promote"))
    w.now = DEADLINE
    plan = w.step()
    st = plan.status
    assert (st.phase, st.batch_state, st.current_batch) == (Phase.PROGRESSING, BatchState.UPSCALING, 2)
    assert st.batch_times.approval_expires_at is None
    assert EnsureCanary(replicas=5, image="app:v2", version="v2") in plan.actions
    expired = [e for e in plan.events if e.reason == R.APPROVAL_EXPIRED]
    assert len(expired) == 1 and "onTimeout: promote" in expired[0].message
    assert st.history[0].result == "approval expired, promoted"


def test_an_approval_before_the_deadline_clears_it() -> None:
    w, _ = live_waiting_for_approval(manual())
    w.now = T0 + timedelta(hours=1)
    w.annotations[PROMOTE_ANNOTATION] = "next"
    plan = w.step()
    assert (plan.status.current_batch, plan.status.batch_times.approval_expires_at) == (2, None)
    assert R.APPROVAL_EXPIRED not in reasons(plan)
    w.step()  # batch 2 live, with its timed pause
    w.now = DEADLINE
    assert w.step().status.phase != Phase.ROLLING_BACK


@pytest.mark.parametrize(
    "s",
    [
        spec(batchSize=None, canaryWeight=None, batches=[{"replicas": 2, "pause": "manual"}, {"replicas": 10}]),
        spec(pause="manual"),
    ],
    ids=["batch-pause-manual", "shorthand-pause-manual"],
)
def test_a_manual_pause_without_a_timeout_never_expires(s: GreyReleaseSpec) -> None:
    w, live = live_waiting_for_approval(s)
    assert live.status.batch_times.approval_expires_at is None
    assert live.requeue_after is None
    w.now = T0 + timedelta(days=400)
    plan = w.step()
    assert plan.status == live.status and plan.actions == ()


def test_the_deadline_survives_a_controller_restart() -> None:
    w, live = live_waiting_for_approval(manual())
    # A new controller knows only what the status stores.
    stored = GreyReleaseStatus.model_validate(live.status.model_dump(mode="json", by_alias=True))
    assert stored.batch_times.approval_expires_at == DEADLINE
    for now, phase in ((DEADLINE - timedelta(milliseconds=1), Phase.PROGRESSING), (DEADLINE, Phase.ROLLING_BACK)):
        restarted = GovWorld(manual(), stable=w.stable, canary=w.canary, status=stored, now=now, weight=w.weight)
        plan = restarted.step()
        assert plan.status.phase == phase
    assert R.APPROVAL_EXPIRED in reasons(plan)
