"""Follow mode's requests in the pure planner, with the annotations left on the object as a GitOps sync with
selfHeal leaves (and puts back) what Git declares: each value honoured once, for the release it was first seen
with; an approval naming its batch (and waiting for it); an abort left from an earlier release doing nothing
to the next; and no annotation ever removed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from greyrelease.api.release import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    BatchState,
    Phase,
)
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import RemoveAnnotations, SetWeight
from greyrelease.planner.machine import aborting

from tests.support.follow import FollowWorld, follow_spec

SERVICE = {"service": {"name": "web"}}
#: Two batches that wait for an approval, then 100 %.
MANUAL = [{"replicas": "25%", "pause": "manual"}, {"replicas": "50%", "pause": "manual"}, {"replicas": "100%"}]
#: A timed first batch, then one that waits for an approval, then 100 %.
TIMED_THEN_MANUAL = [{"replicas": "25%", "pause": "1m"}, {"replicas": "50%", "pause": "manual"}, {"replicas": "100%"}]


def world(batches: list[dict[str, Any]]) -> FollowWorld:
    w = FollowWorld(follow_spec(batches=batches, trafficRouting=SERVICE))
    w.step()
    assert w.status.phase == Phase.IDLE
    return w


def passes(w: FollowWorld, n: int, seconds: float = 5.0) -> None:
    """``n`` passes, ``seconds`` apart, the annotations as they are (a sync re-applying them every time)."""
    for _ in range(n):
        w.step()
        w.now += timedelta(seconds=seconds)


def waiting_at(w: FollowWorld, batch: int) -> bool:
    st = w.status
    return (st.phase, st.batch_state, st.current_batch) == (Phase.PROGRESSING, BatchState.WAITING_FOR_APPROVAL, batch)


def no_annotation_removed(w: FollowWorld) -> None:
    assert not [a for a in w.applied if isinstance(a, RemoveAnnotations)]


def test_an_approval_reapplied_every_pass_approves_its_batch_and_nothing_more() -> None:
    w = world(MANUAL)
    v2 = w.commit("app:v2")
    w.live(1)
    assert waiting_at(w, 1)
    assert 'annotate greyrelease.io/promote="1"' in w.status.message
    w.annotations[PROMOTE_ANNOTATION] = "1"
    passes(w, 30)
    assert waiting_at(w, 2), w.status
    assert [(a.batch, a.template, a.request) for a in w.status.approvals] == [(1, v2, "1")]
    (record,) = w.status.requests
    assert (record.value, record.template, record.batch, record.result) == ("1", v2, 1, "approved batch 1/3")
    assert w.annotations[PROMOTE_ANNOTATION] == "1"
    assert [e.reason for e in w.plans[-1].events] == []  # the later passes: quiet
    assert w.reasons().count(R.PROMOTED) == 1
    no_annotation_removed(w)


def test_promote_next_reapplied_every_pass_approves_only_the_batch_it_was_first_seen_at() -> None:
    w = world(MANUAL)
    w.commit("app:v2")
    w.live(1)
    w.annotations[PROMOTE_ANNOTATION] = "next"
    passes(w, 30)
    assert waiting_at(w, 2)
    assert [(a.batch, a.request) for a in w.status.approvals] == [(1, "next")]
    # The next value (kubectl gr promote writes the batch and a time) approves batch 2, and only that.
    w.annotations[PROMOTE_ANNOTATION] = "2@2026-01-01T12:05:00Z"
    w.run(until={"Succeeded"})
    assert [a.batch for a in w.status.approvals] == [1, 2]
    no_annotation_removed(w)


def test_an_approval_of_a_batch_not_reached_yet_waits_for_it() -> None:
    w = world(TIMED_THEN_MANUAL)
    v2 = w.commit("app:v2")
    w.live(1)
    w.annotations[PROMOTE_ANNOTATION] = "2"
    plan = w.step()
    (record,) = plan.status.requests
    assert (record.batch, record.done_at, record.template) == (2, None, v2)
    assert record.result == "waits for batch 2 to be live"
    assert plan.status.current_batch == 1 and plan.status.approvals == []  # batch 1's own pause still runs
    assert plan.events == ()
    w.run(until={"Succeeded"})
    assert [(a.batch, a.request) for a in w.status.approvals] == [(2, "2")]
    history = {r.batch: r.result for r in w.status.history}
    assert history == {1: "passed", 2: "promoted", 3: "passed"}


def test_an_approval_of_a_batch_passed_already_or_beyond_the_last_is_refused_with_a_warning() -> None:
    cases = (("1@later", "batch 1 passed already"), ("9", "there is no batch 9"), ("soon", "use the batch"))
    for value, why in cases:
        w = world(MANUAL)
        w.commit("app:v2")
        w.live(1)
        w.annotations[PROMOTE_ANNOTATION] = "1"
        w.live(2)
        w.annotations[PROMOTE_ANNOTATION] = value
        plan = w.step()
        assert [(e.type, e.reason) for e in plan.events] == [("Warning", R.INVALID_SPEC)], value
        assert why in plan.events[0].message and why in plan.status.requests[0].result, value
        assert plan.status.requests[0].done_at is not None
        passes(w, 5)
        assert waiting_at(w, 2) and w.reasons().count(R.INVALID_SPEC) == 1, value


def test_an_approval_of_batch_two_of_a_template_does_not_approve_batch_two_of_the_one_superseding_it() -> None:
    w = world(TIMED_THEN_MANUAL)
    v2 = w.commit("app:v2")
    w.live(1)
    w.annotations[PROMOTE_ANNOTATION] = "2"  # for v2's batch 2, not live yet: waits
    w.step()
    v3 = w.commit("app:v3")
    w.run(until={"Initializing"})
    assert w.status.last_release is not None and w.status.last_release.digest == v2
    for _ in range(40):
        w.step()
        w.now += timedelta(seconds=5)
    assert waiting_at(w, 2) and w.status.restore.template == v3, w.status
    assert w.status.approvals == []
    (record,) = w.status.requests
    assert record.template == v2 and record.result.startswith("dropped: ")
    # v3's batch 2 takes an approval of its own.
    w.annotations[PROMOTE_ANNOTATION] = "2@again"
    w.run(until={"Succeeded"})
    assert [(a.batch, a.template) for a in w.status.approvals] == [(2, v3)]


def test_an_approval_honoured_for_one_template_does_not_carry_over_to_the_next_release() -> None:
    w = world(MANUAL)
    w.commit("app:v2")
    w.live(1)
    w.annotations[PROMOTE_ANNOTATION] = "full"
    w.run(until={"Succeeded"})
    v3 = w.commit("app:v3")
    w.live(1)
    passes(w, 20)
    assert waiting_at(w, 1) and w.status.restore.template == v3
    assert w.status.approvals == []


def test_an_abort_left_from_an_aborted_release_does_not_abort_the_next_and_a_new_one_cuts_at_once() -> None:
    w = world(MANUAL)
    v2 = w.commit("app:v2")
    w.live(1)
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.actions == (SetWeight(0),)
    w.run(until={"Aborted"})
    v3 = w.commit("app:v3")
    w.live(1)
    passes(w, 10)
    assert waiting_at(w, 1) and w.status.restore.template == v3
    assert w.status.requests[0].template == v2
    seen = {r.annotation: r.value for r in w.status.requests}
    assert not aborting(w.annotations, w.status.phase, seen)  # the controller's fast path agrees
    # A new value (kubectl gr abort writes one) is an abort of the release under way: cut in that pass.
    w.annotations[ABORT_ANNOTATION] = "true@2026-01-01T13:00:00Z"
    assert aborting(w.annotations, w.status.phase, seen)
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.actions == (SetWeight(0),)
    assert plan.status.requests[0].template == v3 and plan.status.requests[0].result == "aborted at batch 1"
    assert w.weight == 0
    w.run(until={"Aborted"})
    no_annotation_removed(w)


def test_a_retry_is_honoured_once_and_drops_an_approval_that_waited_for_the_attempt_before() -> None:
    w = world(TIMED_THEN_MANUAL)
    v2 = w.commit("app:v2")
    w.live(1)
    w.annotations[PROMOTE_ANNOTATION] = "2"  # waits for batch 2
    w.step()
    w.annotations[ABORT_ANNOTATION] = "true"
    w.run(until={"Aborted"})
    assert {r.annotation: r.result for r in w.status.requests}[PROMOTE_ANNOTATION] == (
        "dropped: the release rolled back"
    )
    w.annotations[RETRY_ANNOTATION] = "2026-01-01T12:10:00Z"
    plan = w.step()
    assert plan.status.phase == Phase.PROGRESSING and plan.status.restore.template == v2
    assert R.RETRIED in [e.reason for e in plan.events]
    w.run(until={"WaitingForApproval", "Progressing"})
    for _ in range(40):
        w.step()
        w.now += timedelta(seconds=5)
    assert waiting_at(w, 2) and w.status.approvals == []  # the old "2" approves nothing in the new attempt
    w.annotations[ABORT_ANNOTATION] = "true@second"
    w.run(until={"Aborted"})
    passes(w, 10)
    assert w.status.phase == Phase.ABORTED  # the retry left on the object is spent
    assert w.reasons().count(R.RETRIED) == 1
    no_annotation_removed(w)


def test_promote_full_after_an_abort_is_honoured_once() -> None:
    w = world(MANUAL)
    v2 = w.commit("app:v2")
    w.live(1)
    w.annotations[ABORT_ANNOTATION] = "true"
    w.run(until={"Aborted"})
    w.annotations[PROMOTE_ANNOTATION] = "full"
    w.run(until={"Succeeded"})
    assert w.deployment.current == v2
    v3 = w.commit("app:v3")
    w.live(1)
    passes(w, 10)
    assert waiting_at(w, 1) and w.status.restore.template == v3  # "full" was v2's
    no_annotation_removed(w)


def test_a_pass_whose_status_was_not_recorded_is_planned_again_the_same() -> None:
    w = world(MANUAL)
    w.commit("app:v2")
    w.live(1)
    w.annotations[PROMOTE_ANNOTATION] = "1"
    w.annotations[ABORT_ANNOTATION] = "no"
    from greyrelease.planner.machine import decide

    first = decide(w.spec, w.status, w.observed(), w.now)
    again = decide(w.spec, w.status, w.observed(), w.now)  # the status of ``first`` never written
    assert first == again
    assert [a.batch for a in first.status.approvals] == [1]
    assert {r.annotation: r.result for r in first.status.requests} == {
        ABORT_ANNOTATION: "nothing asked (not true)",
        PROMOTE_ANNOTATION: "approved batch 1/3",
    }
