"""Follow mode in the pure planner: a GreyRelease without targetVersion releases every new pod template of
its Deployment, held at admission, in its batches; the canary is built from the held template and sized from
the stable's replicas now; the promotion is the hold released; an abort leaves the template held; a new
template supersedes, a revert ends the release; a deletion hands the Deployment back. And, throughout, no
action writes the Deployment's replicas or template."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from greyrelease.api.release import (
    ABORT_ANNOTATION,
    PAUSE_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    GreyReleaseSpec,
    Outcome,
    Phase,
)
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import (
    WRITES_STABLE_SPEC,
    DeleteCanary,
    Enrol,
    EnsureCanary,
    Event,
    PrepareRouting,
    Regarding,
    ReleaseHold,
    RemoveAnnotations,
    ResetRouting,
    RestoreStableSelector,
    SetWeight,
    Unenrol,
)
from greyrelease.planner.machine import decide

from tests.support.follow import FollowWorld, digest_of, follow_spec

SERVICE = {"service": {"name": "web"}}
GATEWAY = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}
V1 = digest_of((("app", "app:v1"),))


def conditions(world: FollowWorld) -> dict[str, str]:
    return {c.type: c.status for c in world.status.conditions}


def kstatus(world: FollowWorld) -> tuple[str, str, str]:
    c = conditions(world)
    return c[R.COND_READY], c[R.COND_RECONCILING], c[R.COND_STALLED]


def enrolled(**fields: Any) -> FollowWorld:
    """A followed Deployment at rest: enrolled, Idle."""
    w = FollowWorld(follow_spec(**fields))
    w.step()
    assert w.status.phase == Phase.IDLE
    return w


def no_stable_writes(world: FollowWorld) -> None:
    written = [a for a in world.applied if isinstance(a, WRITES_STABLE_SPEC)]
    assert written == [], f"follow mode wrote the stable's replicas or template: {written}"


# --- enrolment and rest -----------------------------------------------------------------------------


def test_a_new_followed_deployment_is_enrolled_and_idle_and_then_quiet() -> None:
    w = FollowWorld(follow_spec())
    plan = w.step()
    assert plan.actions == (Enrol("web"),)
    assert plan.status.phase == Phase.IDLE
    assert (
        plan.status.message == "following Deployment web: it runs ReplicaSet web-" + V1[:6] + " (app:v1); nothing held"
    )
    assert [e.reason for e in plan.events] == [R.ENROLLED]
    assert plan.status.stable is not None and plan.status.stable.digest == V1
    assert plan.status.stable.images[0].image == "app:v1" and plan.status.held is None
    assert kstatus(w) == ("True", "False", "False")
    again = w.step()
    assert (again.actions, again.events, again.status) == ((), (), plan.status)  # nothing to write at rest


def test_a_label_removed_at_rest_is_put_back() -> None:
    w = enrolled()
    w.deployment.enrolled = ""
    assert w.step().actions == (Enrol("web"),)


def test_a_deployment_followed_by_another_release_is_refused() -> None:
    w = FollowWorld(follow_spec())
    w.enrolled_elsewhere = "other"
    plan = w.step()
    assert plan.status.phase == Phase.INVALID_SPEC and "followed by GreyRelease 'other'" in plan.status.message
    assert plan.actions == ()


def test_a_pinned_release_refuses_a_followed_deployment() -> None:
    w = enrolled()
    pinned = GreyReleaseSpec.model_validate(
        {"targetRef": {"name": "web"}, "targetVersion": "v2", "batchSize": 1, "canaryWeight": 50}
    )
    plan = decide(pinned, w.status.model_copy(update={"phase": None}), w.observed(), w.now)
    assert plan.status.phase == Phase.INVALID_SPEC and plan.status.message.startswith("spec.targetVersion:")
    assert plan.actions == ()


def test_a_hold_of_the_very_template_that_runs_is_released_at_rest() -> None:
    w = enrolled()
    w.deployment.paused, w.deployment.held = True, V1  # e.g. a change held, then reverted before any pass
    plan = w.step()
    assert plan.actions == (ReleaseHold(V1),)
    assert plan.status.phase == Phase.IDLE and R.HOLD_RELEASED in [e.reason for e in plan.events]


# --- a release --------------------------------------------------------------------------------------


def test_a_held_template_starts_batch_one_with_a_canary_built_from_it() -> None:
    w = enrolled(trafficRouting=SERVICE)
    digest = w.commit("app:v2")
    plan = w.step()
    st = plan.status
    assert (st.phase, st.batch_state, st.current_batch, st.total_batches) == ("Progressing", "Upscaling", 1, 3)
    assert plan.actions == (PrepareRouting(), EnsureCanary(replicas=1, template=digest))
    assert st.restore.template == digest and st.restore.replicas is None
    assert st.held is not None and st.held.digest == digest and st.held.images[0].image == "app:v2"
    assert st.held.held_since == w.now
    assert st.stable_pod_template_hash == V1[:10] and st.stable_replicas == 4
    assert [e.reason for e in plan.events] == [R.HELD, R.RELEASE_STARTED]
    assert kstatus(w) == ("False", "True", "False")


@pytest.mark.parametrize(
    ("routing", "weights"),
    # A batch without a weight gets canary / (stable + canary), a canary pod's share of the pods, in the
    # weighted modes too (the stable keeps its size); their last batch has all the traffic.
    [(SERVICE, [20, 33, 50]), (None, [20, 33, 50]), (GATEWAY, [20, 33, 100])],
    ids=["service", "replicas", "gateway"],
)
def test_a_whole_release_the_promotion_being_the_hold_released(routing: Any, weights: list[int]) -> None:
    w = enrolled(trafficRouting=routing)
    digest = w.commit("app:v2")
    w.run(until={"Succeeded"})
    d = w.deployment
    assert (d.paused, d.held, d.digest, d.current, d.replicas) == (False, "", digest, digest, 4)
    assert w.canary is None and not w.narrowed
    assert [h.weight for h in w.status.history] == weights
    assert [a for a in w.applied if isinstance(a, ReleaseHold)] == [ReleaseHold(digest)]
    # The narrowing of the stable Service goes before the hold is released, which goes before the canary.
    order = [type(a) for a in w.applied if isinstance(a, (RestoreStableSelector, ReleaseHold, DeleteCanary))]
    assert order[:2] == [RestoreStableSelector, ReleaseHold] and order[-1] == DeleteCanary
    st = w.status
    assert st.last_release is not None and (st.last_release.outcome, st.last_release.digest) == (
        Outcome.SUCCEEDED,
        digest,
    )
    assert st.held is None and st.restore.template is None
    assert st.stable is not None and st.stable.digest == digest and st.stable.images[0].image == "app:v2"
    assert kstatus(w) == ("True", "False", "False")
    no_stable_writes(w)


def test_the_canary_keeps_its_traffic_until_the_native_rollout_is_done() -> None:
    w = enrolled(trafficRouting=GATEWAY)
    digest = w.commit("app:v2")
    w.rolls_at_once = False
    w.run(until={"Promoting"})
    for _ in range(3):  # the Deployment controller still rolling: nothing moves
        w.now += timedelta(seconds=10)
        plan = w.step()
        assert plan.status.phase == "Promoting" and plan.actions == ()
        assert (
            plan.status.message
            == f"promoting: waiting for Deployment web to roll app:v2 (template {digest[:8]}) to all its pods"
        )
    assert w.canary is not None and w.weight == 100
    w.finish_rollout()
    plan = w.step()
    assert plan.actions == (SetWeight(0), DeleteCanary())  # traffic to the new stable, then the canary goes
    w.run(until={"Succeeded"})
    assert w.deployment.current == digest


# --- a rollout that does not complete -----------------------------------------------------------------

STALLED = 'ReplicaSet "web-677ca9" has timed out progressing.'


def promoting(routing: Any = GATEWAY, deadline: int = 600, **fields: Any) -> tuple[FollowWorld, str]:
    """Promoting, the hold released, the Deployment controller rolling (and not done)."""
    w = enrolled(trafficRouting=routing, **fields)
    w.deployment.progress_deadline = deadline
    digest = w.commit("app:v2")
    w.rolls_at_once = False
    w.run(until={"Promoting"})
    w.step()
    assert w.deployment.rolling and not w.deployment.paused and w.canary is not None
    return w, digest


def test_a_rollout_the_deployment_controller_gives_up_on_fails_the_release_and_removes_the_canary() -> None:
    w, digest = promoting()
    assert w.weight == 100  # the last batch: the canary has all the traffic
    w.stall(STALLED)
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.actions == (SetWeight(0),)  # the cut, alone
    assert plan.status.message == (
        f"promotion: Deployment web did not roll app:v2 (template {digest[:8]}) to all its pods: {STALLED} "
        "(ProgressDeadlineExceeded after its progressDeadlineSeconds, 600s; 0/4 pods updated)"
    )
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", R.PROGRESS_DEADLINE)]
    w.run(until={"Failed"})
    st = w.status
    assert w.canary is None and not w.prepared and w.weight == 0
    d = w.deployment
    assert not d.paused and d.rolling and d.digest == digest  # nothing of the Deployment put back
    assert kstatus(w) == ("False", "False", "True")
    assert st.last_release is not None and (st.last_release.outcome, st.last_release.digest) == (
        Outcome.FAILED,
        digest,
    )
    assert "the traffic is on Deployment web's own pods (those of both templates that are ready)" in st.message
    assert "the Deployment controller goes on rolling app:v2" in st.message
    (told,) = about_the_deployment(w)
    assert told.reason == R.RELEASE_FAILED and "Its canary is removed and the traffic is on" in told.message
    for _ in range(3):  # still rolling: it stays Failed, and says nothing more
        w.now += timedelta(minutes=5)
        quiet = w.step()
        assert (quiet.actions, quiet.events, quiet.status.phase) == ((), (), Phase.FAILED)
    w.finish_rollout()  # the Deployment controller got there after all
    plan = w.step()
    assert plan.status.phase == Phase.IDLE and plan.actions == ()
    assert plan.status.stable is not None and plan.status.stable.digest == digest
    no_stable_writes(w)


def test_a_stalled_rollout_in_service_mode_does_not_narrow_the_service_to_the_old_replicaset() -> None:
    w, _ = promoting(SERVICE)
    w.stall(STALLED)
    w.run(until={"Failed"})
    cuts = [a for a in w.applied if isinstance(a, SetWeight) and a.weight == 0]
    assert cuts and {a.stable_hash for a in cuts} == {""}  # the old ReplicaSet is being scaled away
    assert w.canary is None


def test_a_deployment_without_a_deadline_it_reports_is_bounded_by_the_releases() -> None:
    w, digest = promoting(deadline=0, progressDeadlineSeconds=120)
    started = w.status.phase_started_at
    assert started is not None
    w.now = started + timedelta(seconds=119)
    plan = w.step()
    assert plan.status.phase == Phase.PROMOTING and plan.requeue_after == 1.0  # woken at the deadline
    w.now = started + timedelta(seconds=120)
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK
    assert plan.status.message == (
        f"promotion: Deployment web did not roll app:v2 (template {digest[:8]}) to all its pods within the "
        "release's progressDeadlineSeconds, 120s (0/4 pods updated)"
    )


def test_a_deployment_that_reports_timeouts_is_waited_for_past_the_releases_deadline() -> None:
    w, _ = promoting(deadline=3600, progressDeadlineSeconds=60)
    w.now += timedelta(minutes=30)  # slow, but the Deployment controller still sees progress
    plan = w.step()
    assert plan.status.phase == Phase.PROMOTING and plan.actions == ()
    w.finish_rollout()
    w.run(until={"Succeeded"})


def test_a_release_waits_for_its_window_with_the_template_held() -> None:
    closed = [{"days": ["Mon-Sun"], "start": "00:00", "end": "00:01"}]  # T0 is 12:00
    w = enrolled(windows=closed)
    digest = w.commit("app:v2")
    plan = w.step()
    assert plan.status.phase == Phase.WAITING and plan.actions == ()
    assert plan.status.message.startswith(f"app:v2 (template {digest[:8]}) held; ")
    assert plan.status.held is not None and plan.status.held.digest == digest
    assert w.deployment.paused and w.deployment.held == digest
    assert kstatus(w) == ("False", "True", "False")
    w.now += timedelta(hours=12)  # the window opens
    assert w.step().status.phase == Phase.PROGRESSING


# --- the HPA ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "canary", "weight"),
    [(8, 4, 33), (12, 6, 33), (2, 1, 33), (1, 1, 50)],
    ids=["up-to-8", "up-to-12", "down-to-2", "down-to-1"],
)
def test_the_canary_follows_the_hpa_up_and_down_mid_batch(replicas: int, canary: int, weight: int) -> None:
    w = enrolled(trafficRouting=SERVICE, batches=[{"replicas": "50%", "pause": "1h"}, {"replicas": "100%"}])
    digest = w.commit("app:v2")
    w.live(1)
    assert w.canary is not None and (w.canary.replicas, w.status.canary_weight) == (2, 33)
    w.scale(replicas)
    plan = w.step()
    assert plan.actions == (EnsureCanary(replicas=canary, template=digest),)
    st = plan.status
    assert (st.phase, st.batch_state) == ("Progressing", "Verifying")  # still live
    assert (st.canary_replicas, st.stable_replicas, st.canary_weight) == (canary, replicas, weight)
    assert w.deployment.replicas == replicas  # the HPA's, untouched
    assert w.step().actions == ()  # followed once
    no_stable_writes(w)


def test_the_canary_follows_the_hpa_while_paused_and_while_waiting_for_the_next_window() -> None:
    w = enrolled(batches=[{"replicas": "50%", "pause": "manual"}, {"replicas": "100%"}])
    digest = w.commit("app:v2")
    w.live(1)
    w.annotations[PAUSE_ANNOTATION] = "true"
    assert w.step().status.phase == Phase.PAUSED
    w.scale(10)
    plan = w.step()
    assert plan.status.phase == Phase.PAUSED and plan.actions == (EnsureCanary(replicas=5, template=digest),)
    no_stable_writes(w)


@pytest.mark.parametrize(("replicas", "canary"), [(8, 8), (2, 2)], ids=["up", "down"])
def test_the_canary_follows_the_hpa_while_the_native_rollout_runs(replicas: int, canary: int) -> None:
    w = enrolled(trafficRouting=GATEWAY)
    digest = w.commit("app:v2")
    w.rolls_at_once = False
    w.run(until={"Promoting"})
    assert w.canary is not None and (w.canary.replicas, w.weight) == (4, 100)  # all the traffic, on 4 pods
    w.scale(replicas)
    plan = w.step()
    assert plan.actions == (EnsureCanary(replicas=canary, template=digest),)
    st = plan.status
    assert (st.phase, st.canary_replicas, st.stable_replicas, st.canary_weight) == ("Promoting", canary, replicas, 100)
    assert w.step().actions == ()  # followed once
    w.finish_rollout()
    assert w.step().actions == (SetWeight(0), DeleteCanary())
    w.run(until={"Succeeded"})
    assert w.deployment.replicas == replicas and w.canary is None
    no_stable_writes(w)


def test_after_promote_full_mid_release_the_canary_keeps_the_share_of_its_batch() -> None:
    w = enrolled(trafficRouting=SERVICE, batches=[{"replicas": "25%", "pause": "manual"}, {"replicas": "100%"}])
    digest = w.commit("app:v2")
    w.rolls_at_once = False
    w.live(1)
    w.annotations[PROMOTE_ANNOTATION] = "full"
    assert w.step().status.phase == Phase.PROMOTING
    w.scale(12)
    plan = w.step()
    assert plan.actions == (EnsureCanary(replicas=3, template=digest),)  # 25 % of 12
    assert (plan.status.canary_replicas, plan.status.stable_replicas) == (3, 12)


# --- abort, and the ways out --------------------------------------------------------------------------


def aborted(**fields: Any) -> tuple[FollowWorld, str]:
    w = enrolled(trafficRouting=SERVICE, **fields)
    digest = w.commit("app:v2")
    w.live(1)
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.actions == (SetWeight(0),)  # the cut, alone
    w.run(until={"Aborted"})
    return w, digest


def test_an_abort_cuts_removes_the_canary_and_leaves_the_template_held() -> None:
    w, digest = aborted()
    st = w.status
    assert w.canary is None and not w.prepared
    assert w.deployment.paused and w.deployment.held == digest and w.deployment.current == V1
    assert [a for a in w.applied if isinstance(a, ReleaseHold)] == []
    assert st.message.startswith(f"aborted by annotation. Deployment web holds app:v2 (template {digest[:8]})")
    assert f"but runs ReplicaSet web-{V1[:6]} (app:v1)" in st.message
    for way in ("a new template", "a revert", "greyrelease.io/retry", "greyrelease.io/promote=full"):
        assert way in st.message
    assert st.last_release is not None and st.last_release.outcome == Outcome.ABORTED
    assert st.held is not None and st.held.digest == digest
    assert kstatus(w) == ("False", "False", "True")
    assert {c.type: c.message for c in st.conditions}[R.COND_STALLED] == st.message
    quiet = w.step()
    assert (quiet.actions, quiet.events, quiet.status.phase) == ((), (), Phase.ABORTED)  # stays held
    no_stable_writes(w)


def about_the_deployment(world: FollowWorld) -> list[Event]:
    return [e for plan in world.plans for e in plan.events if e.about is not None]


def test_an_abort_tells_the_deployment_why_it_stays_paused_once() -> None:
    w, digest = aborted()
    (told,) = about_the_deployment(w)
    assert told.about == Regarding("web", "web-uid") and (told.type, told.reason) == ("Warning", R.RELEASE_ABORTED)
    assert told.message.startswith(
        f"paused by GreyRelease web, whose release of app:v2 (template {digest[:8]}) ended Aborted: aborted by "
        f"annotation. The spec holds that template; the pods run ReplicaSet web-{V1[:6]} (app:v1)."
    )
    for way in ("a new commit", "a revert", "greyrelease.io/retry", "greyrelease.io/promote=full"):
        assert way in told.message
    # Posted in the pass that ends the release, beside the release's own Event of it.
    (ending,) = [plan for plan in w.plans if told in plan.events]
    assert ending.status.phase == Phase.ABORTED and R.ROLLED_BACK in [e.reason for e in ending.events]
    w.step()
    w.now += timedelta(hours=1)
    w.step()
    assert len(about_the_deployment(w)) == 1  # at rest, held: nothing more


def test_an_abort_before_the_release_started_tells_the_deployment_too() -> None:
    w = enrolled(windows=[{"days": ["Mon-Sun"], "start": "00:00", "end": "00:01"}])
    digest = w.commit("app:v2")
    assert w.step().status.phase == Phase.WAITING
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ABORTED
    told = [e for e in plan.events if e.about is not None]
    assert [(e.reason, e.about) for e in told] == [(R.RELEASE_ABORTED, Regarding("web", "web-uid"))]
    assert f"app:v2 (template {digest[:8]}) ended Aborted: aborted before it started" in told[0].message


def test_a_failed_gate_tells_the_deployment_and_a_revert_does_not() -> None:
    w = enrolled(progressDeadlineSeconds=30)
    w.commit("app:v2")
    w.pods_get_ready = False
    w.run(until={"Failed"})
    assert [e.reason for e in about_the_deployment(w)] == [R.RELEASE_FAILED]
    assert "ended Failed: batch 1/3: 0/1 canary pods ready after 30s" in about_the_deployment(w)[0].message
    w.commit("app:v1")
    w.run(until={"Idle"})
    reverted = enrolled(trafficRouting=SERVICE)
    reverted.commit("app:v2")
    reverted.live(1)
    reverted.commit("app:v1")
    reverted.run(until={"Idle"})
    assert about_the_deployment(w)[1:] == [] and about_the_deployment(reverted) == []


def test_a_failed_deadline_leaves_the_template_held_too() -> None:
    w = enrolled(progressDeadlineSeconds=30)
    digest = w.commit("app:v2")
    w.pods_get_ready = False
    w.run(until={"Failed"})
    assert w.deployment.paused and w.deployment.held == digest
    assert w.status.last_release is not None and w.status.last_release.outcome == Outcome.FAILED
    assert "ProgressDeadline" not in w.status.message and "progressDeadlineSeconds" in w.status.message
    assert kstatus(w) == ("False", "False", "True")


def test_retry_after_an_abort_starts_batch_one_of_the_held_template_again() -> None:
    w, digest = aborted()
    w.annotations[RETRY_ANNOTATION] = "1"
    plan = w.step()
    assert not any(isinstance(a, RemoveAnnotations) for a in plan.actions)  # the annotations stay
    assert EnsureCanary(replicas=1, template=digest) in plan.actions
    assert (plan.status.phase, plan.status.current_batch) == ("Progressing", 1)
    (retried,) = [e.message for e in plan.events if e.reason == R.RETRIED]
    assert retried == f"retrying the release of app:v2 (template {digest[:8]})"  # named by its images
    w.run(until={"Succeeded"})
    assert w.deployment.current == digest


def test_promote_full_after_an_abort_accepts_the_template_without_a_canary() -> None:
    w, digest = aborted()
    w.annotations[PROMOTE_ANNOTATION] = "full"
    plan = w.step()
    assert not any(isinstance(a, RemoveAnnotations) for a in plan.actions)
    assert ReleaseHold(digest) in plan.actions and not any(isinstance(a, EnsureCanary) for a in plan.actions)
    (promoted,) = [e.message for e in plan.events if e.reason == R.PROMOTED]
    assert promoted == f"promote=full after Aborted: app:v2 (template {digest[:8]}) released without a canary"
    w.run(until={"Succeeded"})
    assert w.deployment.current == digest and w.canary is None
    assert w.status.last_release is not None and w.status.last_release.outcome == Outcome.SUCCEEDED


def test_a_new_template_after_an_abort_is_a_new_release_that_the_abort_left_on_the_object_does_not_abort() -> None:
    w, v2 = aborted()
    v3 = w.commit("app:v3")
    before = len(w.plans)
    plan = w.step()
    assert not any(isinstance(a, RemoveAnnotations) for a in plan.actions)
    assert EnsureCanary(replicas=1, template=v3) in plan.actions
    assert plan.status.restore.template == v3 and plan.status.phase == Phase.PROGRESSING
    assert w.annotations[ABORT_ANNOTATION] == "true"  # still there, as Git may declare it
    (record,) = plan.status.requests
    assert (record.value, record.template) == ("true", v2)  # the abort was v2's
    w.run(until={"Succeeded"})
    assert w.deployment.current == v3
    assert all(q.status.phase not in (Phase.ROLLING_BACK, Phase.ABORTED) for q in w.plans[before:])


def test_a_revert_after_an_abort_releases_the_hold_and_restarts_no_pod() -> None:
    w, _ = aborted()
    assert w.commit("app:v1") == V1
    plan = w.step()
    assert plan.actions == (ReleaseHold(V1),)
    assert plan.status.phase == Phase.IDLE
    assert plan.status.last_release is not None and plan.status.last_release.outcome == Outcome.REVERTED
    assert w.deployment.current == V1 and not w.deployment.paused  # the same ReplicaSet: no pod restarted
    assert kstatus(w) == ("True", "False", "False")


def test_an_abort_once_the_hold_is_released_is_too_late_and_says_so() -> None:
    w = enrolled(trafficRouting=GATEWAY)
    v2 = w.commit("app:v2")
    w.rolls_at_once = False
    w.run(until={"Promoting"})
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.actions == ()
    assert plan.status.phase == Phase.PROMOTING
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", R.ABORTED)]
    assert "revert the template" in plan.events[0].message
    assert plan.events[0].message.startswith(f"abort ignored: the hold of app:v2 (template {v2[:8]}) is released")
    assert plan.status.requests[0].result.startswith("refused: ")
    again = w.step()  # the same value, seen again: refused once, not again
    assert again.events == () and again.status.phase == Phase.PROMOTING


# --- superseded, reverted -----------------------------------------------------------------------------


def test_a_new_template_mid_release_supersedes_it_and_starts_at_batch_one() -> None:
    w = enrolled(trafficRouting=SERVICE)
    v2 = w.commit("app:v2")
    w.live(2)
    v3 = w.commit("app:v3")
    plan = w.step()
    assert plan.actions == (SetWeight(0),)
    assert plan.status.phase == Phase.INITIALIZING
    assert [e.message for e in plan.events] == [
        f"app:v3 (template {v3[:8]}) superseded app:v2 (template {v2[:8]}): restarting at batch 1"
    ]
    assert plan.status.message == f"restarting for app:v3 (template {v3[:8]})"
    last = plan.status.last_release
    assert last is not None and (last.outcome, last.digest) == (Outcome.SUPERSEDED, v2)
    plan = w.step()
    assert EnsureCanary(replicas=1, template=v3) in plan.actions
    assert (plan.status.current_batch, plan.status.restore.template) == (1, v3)
    w.run(until={"Succeeded"})
    assert w.deployment.current == v3
    no_stable_writes(w)


def test_a_revert_mid_release_ends_it_reverted_without_restarting_a_pod() -> None:
    w = enrolled(trafficRouting=SERVICE)
    w.commit("app:v2")
    w.live(2)
    w.commit("app:v1")
    plan = w.step()
    assert plan.actions == (SetWeight(0),) and plan.status.phase == Phase.ROLLING_BACK
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", R.REVERTED)]
    w.run(until={"Idle"})
    assert w.canary is None and not w.prepared
    assert ReleaseHold(V1) in w.applied
    assert not w.deployment.paused and w.deployment.current == V1 and w.deployment.revision == 1
    last = w.status.last_release
    assert last is not None and last.outcome == Outcome.REVERTED
    assert w.status.held is None and w.status.restore.template is None
    no_stable_writes(w)


def test_a_revert_while_waiting_for_a_window_releases_the_hold() -> None:
    w = enrolled(windows=[{"days": ["Mon-Sun"], "start": "00:00", "end": "00:01"}])
    w.commit("app:v2")
    assert w.step().status.phase == Phase.WAITING
    w.commit("app:v1")
    plan = w.step()
    assert plan.actions == (ReleaseHold(V1),) and plan.status.phase == Phase.IDLE
    assert plan.status.last_release is not None and plan.status.last_release.outcome == Outcome.REVERTED


# --- deletion -----------------------------------------------------------------------------------------


def test_deleting_mid_release_hands_the_deployment_back() -> None:
    w = enrolled(trafficRouting=SERVICE)
    digest = w.commit("app:v2")
    w.live(1)
    w.deleting = True
    plan = w.step()
    assert plan.actions == (SetWeight(0), DeleteCanary()) and not plan.done
    plan = w.step()
    assert plan.actions == (ResetRouting(), ReleaseHold(digest), Unenrol("web"))
    assert plan.done
    assert [(e.type, e.reason, e.about) for e in plan.events] == [
        ("Warning", R.HANDED_BACK, None),
        ("Warning", R.HANDED_BACK, Regarding("web", "web-uid")),  # the same on the Deployment
    ]
    assert "rolls now, without a canary" in plan.events[0].message
    assert plan.events[1].message == (
        "GreyRelease web was deleted: this Deployment is no longer followed (label greyrelease.io/release "
        f"removed), its new templates roll without a canary; hold of app:v2 (template {digest[:8]}) released: it "
        "rolls now, without a canary"
    )
    d = w.deployment
    assert (d.paused, d.held, d.enrolled, d.current) == (False, "", "", digest)
    no_stable_writes(w)


def test_deleting_a_release_refused_for_a_deployment_another_follows_touches_nothing() -> None:
    w = FollowWorld(follow_spec())
    w.enrolled_elsewhere = "other"
    w.commit("app:v2")  # held for the other release
    assert w.step().status.phase == Phase.INVALID_SPEC
    w.deleting = True
    plan = w.step()
    assert plan.actions == () and plan.done and w.deployment.paused


def test_deleting_at_rest_removes_only_the_label() -> None:
    w = enrolled()
    w.deleting = True
    plan = w.step()
    assert plan.actions == (Unenrol("web"),) and plan.done
    assert "nothing was held" in plan.events[0].message
    assert [e.about for e in plan.events] == [None, Regarding("web", "web-uid")]
    assert plan.events[1].message.endswith("; nothing was held")


# --- the audit, and the conditions --------------------------------------------------------------------


def _scenarios() -> list[FollowWorld]:
    out = []
    for routing in (None, SERVICE, GATEWAY):
        w = enrolled(trafficRouting=routing)
        w.commit("app:v2")
        w.live(1)
        w.scale(9)
        w.step()
        w.scale(2)
        w.commit("app:v3")
        w.run(until={"Succeeded"})
        out.append(w)
        a, _ = aborted()
        a.annotations[PROMOTE_ANNOTATION] = "full"
        a.run(until={"Succeeded"})
        out.append(a)
    return out


def test_no_action_of_any_follow_mode_release_writes_the_stables_replicas_or_template() -> None:
    for w in _scenarios():
        no_stable_writes(w)
        assert {type(a) for a in w.applied} <= {
            Enrol,
            Unenrol,
            ReleaseHold,
            EnsureCanary,
            DeleteCanary,
            PrepareRouting,
            SetWeight,
            RestoreStableSelector,
            ResetRouting,
            RemoveAnnotations,
        }
        assert all(a.template and not a.image for a in w.applied if isinstance(a, EnsureCanary))


@pytest.mark.parametrize(
    ("phase", "ready", "reconciling", "stalled"),
    [
        (Phase.IDLE, "True", "False", "False"),
        (Phase.SUCCEEDED, "True", "False", "False"),
        (Phase.WAITING, "False", "True", "False"),
        (Phase.QUEUED, "False", "True", "False"),
        (Phase.INITIALIZING, "False", "True", "False"),
        (Phase.PROGRESSING, "False", "True", "False"),
        (Phase.PAUSED, "False", "True", "False"),
        (Phase.PROMOTING, "False", "True", "False"),
        (Phase.ROLLING_BACK, "False", "True", "False"),
        (Phase.ABORTED, "False", "False", "True"),
        (Phase.FAILED, "False", "False", "True"),
        (Phase.INVALID_SPEC, "False", "False", "True"),
    ],
)
def test_kstatus_conditions_of_each_phase(phase: Phase, ready: str, reconciling: str, stalled: str) -> None:
    from greyrelease.planner.passes import _conditions

    status = FollowWorld().status.model_copy(update={"phase": phase, "message": "m"})
    found = {c.type: (c.status, c.reason) for c in _conditions(status, FollowWorld().now)}
    assert (found["Ready"][0], found["Reconciling"][0], found["Stalled"][0]) == (ready, reconciling, stalled)
    assert found["Ready"][1] == phase.value


# --- switching modes mid-release ----------------------------------------------------------------------


def test_targetversion_removed_mid_release_rolls_the_pinned_release_back_first() -> None:
    from tests.support.world import World, spec

    w = World(spec(trafficRouting=SERVICE, pause="1m"))
    w.step()
    w.step()
    assert w.status.phase == Phase.PROGRESSING and w.stable is not None and w.stable.replicas == 8
    w.spec = follow_spec(trafficRouting=SERVICE)
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.actions == (SetWeight(0),)
    w.run(until={"Aborted"})
    assert w.stable.replicas == 10 and w.stable.image == "app:v1" and w.canary is None  # put back as it was


def test_targetversion_set_mid_follow_release_rolls_it_back_and_leaves_the_hold() -> None:
    w = enrolled(trafficRouting=SERVICE)
    digest = w.commit("app:v2")
    w.live(1)
    w.spec = GreyReleaseSpec.model_validate(
        {"targetRef": {"name": "web"}, "targetVersion": "v3", "batchSize": 1, "canaryWeight": 50}
    )
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.actions == (SetWeight(0),)
    w.run(until={"Aborted"})
    assert w.canary is None and w.deployment.held == digest
    no_stable_writes(w)
