"""Table tests of the pure release state machine (no cluster)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from greyrelease.analysis.verdicts import Check, Sample
from greyrelease.api.release import (
    ABORT_ANNOTATION,
    BATCH_PHASES,
    PAUSE_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    STATES_OF,
    BatchState,
    Phase,
    fmt_time,
)
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import (
    DeleteCanary,
    EnsureCanary,
    Plan,
    PrepareRouting,
    RemoveAnnotations,
    ResetRouting,
    RestoreStableSelector,
    ScaleStable,
    SetStableImage,
    SetWeight,
)
from greyrelease.planner.machine import ENDPOINTS_POLL, HANDLERS, Workload, decide, project

from tests.support.builders import T0, UID
from tests.support.world import World, spec, workload

SERVICE = {"service": {"name": "web"}}
NGINX = {"nginx": {"ingress": "web", "stableService": "web"}}


def started(world: World) -> World:
    """Step the world into batch 1 (Initializing -> Progressing)."""
    world.step()
    assert world.status.phase == "Progressing"
    return world


def hold(world: World) -> Plan:
    """Step until the current batch is live (canary ready, weight set); the plan that made it so."""
    for _ in range(5):
        plan = world.step()
        if plan.status.batch_times.ready_at is not None:
            return plan
    raise AssertionError(f"batch never became ready: {world.status.message}")


def reasons(world: World) -> list[str]:
    return [e.reason for p in world.plans for e in p.events]


# --- starting ---------------------------------------------------------------------------------------


def test_start_records_what_it_will_restore_and_prepares_routing_before_the_canary() -> None:
    w = World(spec(trafficRouting=SERVICE))
    plan = w.step()
    st = plan.status
    assert (st.phase, st.current_batch, st.total_batches, st.batch) == ("Progressing", 1, 5, "1/5")
    assert st.restore.replicas == 10 and st.restore.image == "app:v1"
    assert st.stable_version == "v1" and st.target_version == "v2"
    assert st.stable_pod_template_hash == "stablehash"
    # The same pass grows batch 1, after the routing is in place.
    assert plan.actions == (PrepareRouting(), EnsureCanary(replicas=2, image="app:v2", version="v2"))
    assert plan.requeue_after is not None and plan.requeue_after > 0  # woken by the canary, or polls
    assert R.RELEASE_STARTED in reasons(w)


@pytest.mark.parametrize(
    ("candidates", "field_text"),
    [
        ((), "spec.appName: no Deployment is labelled app=web"),
        ((workload("web"), workload("web-2")), "spec.appName: 2 Deployments are labelled app=web (web, web-2)"),
    ],
    ids=["appName-matches-none", "appName-matches-two"],
)
def test_target_missing_or_ambiguous_is_invalid_and_touches_nothing(
    candidates: tuple[Workload, ...], field_text: str
) -> None:
    w = World(spec(targetRef=None, appName="web"), stable=None, extra_candidates=candidates)
    plan = w.step()
    assert plan.status.phase == "InvalidSpec"
    assert plan.status.message.startswith(field_text)
    assert plan.actions == ()
    assert plan.requeue_after and plan.requeue_after > 0
    assert any(e.type == "Warning" and e.reason == R.INVALID_SPEC for e in plan.events)
    assert {c.type: c.status for c in plan.status.conditions}[R.COND_INVALID_SPEC] == "True"


def test_invalid_release_starts_once_the_deployment_appears() -> None:
    w = World(spec(), stable=None)
    assert w.step().status.phase == "InvalidSpec"
    w.stable = workload()
    assert w.step().status.phase == "Progressing"


def test_missing_container_is_invalid() -> None:
    plan = World(spec(container="sidecar")).step()
    assert plan.status.phase == "InvalidSpec"
    assert "spec.container" in plan.status.message


def test_canary_name_taken_by_someone_else_is_refused() -> None:
    foreign = workload("web-canary", replicas=1, owner_uid="someone-else")
    plan = World(spec(), canary=foreign).step()
    assert plan.status.phase == "InvalidSpec"
    assert "not owned by this release" in plan.status.message
    assert plan.actions == ()


def test_decreasing_batches_are_invalid_with_the_field_named() -> None:
    s = spec(batchSize=None, canaryWeight=None, batches=[{"replicas": "50%"}, {"replicas": 2}, {"replicas": 10}])
    plan = World(s).step()
    assert plan.status.phase == "InvalidSpec"
    assert plan.status.message.startswith("spec.batches[1].replicas")


def test_already_at_target_succeeds_without_touching_anything() -> None:
    plan = World(spec(targetVersion="v1")).step()
    assert plan.status.phase == "Succeeded"
    assert plan.actions == ()


# --- batches ----------------------------------------------------------------------------------------


def test_batch_grows_canary_before_shrinking_stable_then_moves_traffic() -> None:
    w = World(spec(trafficRouting=SERVICE, pause="30s"), pods_get_ready=False)
    plan = w.step()
    # Canary first; the stable keeps all its replicas while the canary is not ready.
    assert plan.actions == (PrepareRouting(), EnsureCanary(replicas=2, image="app:v2", version="v2"))
    assert plan.status.batch_times.ready_at is None
    assert "waiting for 2 canary pods to be ready" in plan.status.message
    assert w.canary is not None
    w.canary = replace(w.canary, ready=2, updated=2, available=2, total=2)
    plan = w.step()
    assert plan.actions == (ScaleStable(8), SetWeight(20, None))
    st = plan.status
    assert (st.canary_replicas, st.stable_replicas, st.canary_weight) == (2, 8, 20)
    assert st.batch_times.ready_at is not None


def test_full_release_in_service_mode_ends_with_stable_on_target_and_no_canary() -> None:
    w = World(spec(trafficRouting=SERVICE, pause="30s"))
    phases = w.run(until={"Succeeded"})
    assert "Promoting" in phases
    assert w.stable is not None and w.stable.image == "app:v2" and w.stable.replicas == 10
    assert w.canary is None and not w.narrowed
    assert w.status.stable_version == "v2" and w.status.restore.replicas is None
    batches = [r.batch for r in w.status.history]
    assert batches == [1, 2, 3, 4, 5]
    assert all(r.result == "passed" for r in w.status.history)
    # Each timed pause took its 30 s: 4 pauses (the last batch has none), never shortened.
    assert w.now - T0 >= timedelta(seconds=120)


def test_router_mode_keeps_stable_at_full_size_and_sets_explicit_weights() -> None:
    w = World(spec(trafficRouting=NGINX, batchSize=5, canaryWeight=10))
    weights = []
    for _ in range(100):
        plan = w.step()
        weights += [a.weight for a in plan.actions if isinstance(a, SetWeight)]
        assert w.stable is not None and w.stable.replicas == 10
        if plan.status.phase == "Succeeded":
            break
        w.advance(max(plan.requeue_after or 1, 0))
    assert w.status.phase == "Succeeded"
    assert weights[:10] == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert weights[-1] == 0  # weight back to the promoted stable before the canary goes


def test_a_batch_without_pause_moves_on_in_the_pass_that_finds_it_ready() -> None:
    batches = [{"replicas": 2}, {"replicas": 4, "pause": "30s"}, {"replicas": 10}]
    w = World(spec(trafficRouting=SERVICE, batches=batches, batchSize=None, canaryWeight=None))
    w.step()  # routing, and batch 1's canary (ready at once in this world)
    plan = w.step()
    # Ready, traffic moved, passed, and batch 2's canary asked for: one pass, one status.
    assert [type(a) for a in plan.actions] == [ScaleStable, SetWeight, EnsureCanary]
    assert plan.actions[-1] == EnsureCanary(replicas=4, image="app:v2", version="v2")
    assert [e.reason for e in plan.events] == [R.BATCH_READY, R.BATCH_PASSED]
    first = plan.status.history[0]
    assert first.ready_at == first.finished_at and first.result == "passed"
    assert plan.status.current_batch == 2 and plan.status.batch_times.ready_at is None
    assert plan.requeue_after is not None and plan.requeue_after > 0  # the new canary wakes it
    # Batch 2 has a pause: it is held when ready, and its timer is the pause.
    plan = w.step()
    assert plan.status.current_batch == 2 and plan.status.batch_times.ready_at is not None
    assert plan.requeue_after == 30


def test_a_pass_finishes_at_most_one_batch() -> None:
    # Steps that only move the weight: the next batch's canary is ready the moment the last one passes.
    batches = [
        {"replicas": 2, "weight": 10},
        {"replicas": 2, "weight": 30},
        {"replicas": 2, "weight": 60},
        {"replicas": 10},
    ]
    w = World(spec(trafficRouting=NGINX, batches=batches, batchSize=None, canaryWeight=None))
    w.run(until={"Succeeded"})
    passed = [sum(e.reason == R.BATCH_PASSED for e in p.events) for p in w.plans]
    assert max(passed) == 1 and sum(passed) == 3
    weights = [a.weight for p in w.plans for a in p.actions if isinstance(a, SetWeight)]
    assert weights == [10, 30, 60, 100, 0]
    assert [r.result for r in w.status.history] == ["passed"] * 4


def test_the_weight_waits_until_the_canary_service_lists_the_ready_canary_pods() -> None:
    batches = [{"replicas": 2, "weight": 10}, {"replicas": 10}]
    w = World(spec(trafficRouting=NGINX, batches=batches, batchSize=None, canaryWeight=None), canary_endpoints=0)
    w.step()  # batch 1: the canary grows (its pods are ready at the next look)
    for listed in (0, 1):
        w.canary_endpoints = listed
        plan = w.step()
        assert [a for a in plan.actions if isinstance(a, SetWeight)] == []
        assert plan.status.batch_state == "Upscaling"
        assert plan.status.message == "batch 1/2: waiting for the canary Service to list 2 ready pods"
        assert plan.requeue_after == ENDPOINTS_POLL
        w.advance(ENDPOINTS_POLL)
    w.canary_endpoints = 2
    plan = w.step()  # no pause: batch 1 is live and passed in one pass, and batch 2's canary grows
    assert plan.actions[0] == SetWeight(10, None)
    assert w.step().status.message == "batch 2/2: waiting for the canary Service to list 10 ready pods"
    w.canary_endpoints = 10
    assert SetWeight(100, None) in w.step().actions


def test_a_canary_service_that_never_lists_the_pods_fails_the_release_at_the_deadline() -> None:
    batches = [{"replicas": 2, "weight": 10}, {"replicas": 10}]
    w = World(spec(trafficRouting=NGINX, batches=batches, batchSize=None, canaryWeight=None), canary_endpoints=1)
    w.step()
    assert w.step().status.phase == "Progressing"
    w.advance(w.spec.progress_deadline_seconds)
    plan = w.step()
    assert plan.status.phase in ("RollingBack", "Failed")
    assert "batch 1/2: the canary Service lists 1/2 pods after" in plan.status.message
    assert plan.actions[0] == SetWeight(0)


def test_promotion_gives_the_stable_its_new_image_only_once_the_last_batch_scaled_it_down() -> None:
    w = World(spec(trafficRouting=SERVICE, batchSize=10, canaryWeight=100))
    w.step()
    plan = w.step()
    # The one batch is ready: all traffic on the canary and the stable scaled to nothing, then promotion
    # starts in the same pass but waits for that scale-down to land.
    assert plan.status.phase == "Promoting"
    assert plan.actions == (ScaleStable(0), SetWeight(100, None))
    assert [e.reason for e in plan.events] == [R.BATCH_READY, R.PROMOTING]
    assert plan.status.message == "promoting: waiting for 10 stable pods ready on v2"
    assert w.stable is not None
    w.stable = replace(w.stable, total=1)  # an old pod still counted
    assert w.step().actions == ()
    w.stable = replace(w.stable, total=0)
    assert w.step().actions == (RestoreStableSelector(), SetStableImage("app:v2", 10))


def test_each_step_of_a_release_costs_one_pass() -> None:
    # Two batches (a timed pause, then none) and promotion: start + batch 1, batch 1 ready, pause over +
    # batch 2, batch 2 ready (the stable scaled to nothing) + promotion started, the stable's new image,
    # canary removed, done.
    batches = [{"replicas": 1, "pause": "2s"}, {"replicas": 2}]
    s = spec(trafficRouting=SERVICE, batches=batches, batchSize=None, canaryWeight=None)
    w = World(s, stable=workload(replicas=2))
    w.run(until={"Succeeded"})
    assert len(w.plans) == 7, [p.status.message for p in w.plans]


def test_timed_pause_waits_exactly_and_requeues_for_the_rest() -> None:
    w = started(World(spec(pause="30s")))
    plan = hold(w)
    assert plan.requeue_after == 30
    w.advance(10)
    plan = w.step()
    assert plan.status.current_batch == 1 and plan.requeue_after == pytest.approx(20)
    w.advance(20)
    plan = w.step()
    assert plan.status.current_batch == 2
    assert plan.status.history[0].result == "passed"


def test_pinned_mode_takes_the_batch_number_kubectl_gr_writes_and_consumes_it() -> None:
    w = started(World(spec(pause="manual")))
    hold(w)
    w.annotations[PROMOTE_ANNOTATION] = "1@2026-01-01T12:00:00Z"
    plan = w.step()
    assert plan.actions[0] == RemoveAnnotations((PROMOTE_ANNOTATION,))
    assert plan.status.current_batch == 2 and plan.status.last_promotion.startswith("1 at batch 1/")
    assert plan.status.requests == [] and plan.status.approvals == []  # pinned mode records none
    hold(w)
    w.annotations[PROMOTE_ANNOTATION] = "3"  # not the batch it is at: refused, and consumed
    plan = w.step()
    assert plan.actions == (RemoveAnnotations((PROMOTE_ANNOTATION,)),) and plan.status.current_batch == 2
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", R.INVALID_SPEC)]
    assert "the release is at batch 2/" in plan.events[0].message


def test_a_pass_in_a_pause_plans_the_status_as_it_read_it() -> None:
    """Nothing changes in a pause: the plan's status is the one read (not a copy), so the reconciler can
    tell an idle pass without comparing; a new generation or a new message is recorded."""
    w = started(World(spec(pause="30s")))
    hold(w)
    w.advance(10)
    read = w.status
    plan = w.step()
    assert plan.status is read and plan.requeue_after == pytest.approx(20)
    again = decide(w.spec, read, replace(w.observed(), generation=2), w.now)
    assert again.status.observed_generation == 2 and again.status.conditions == read.conditions
    edited = read.model_copy(update={"message": "edited"})
    plan = decide(w.spec, edited, w.observed(), w.now)
    assert plan.status.message == "edited"
    for now, then in zip(plan.status.conditions, read.conditions, strict=True):
        # The conditions that hold carry the message; the others are the ones read.
        assert now.message == "edited" if now.status == "True" else now is then


def test_manual_pause_waits_for_promote_next_and_consumes_it() -> None:
    w = started(World(spec(pause="manual")))
    plan = hold(w)
    assert R.WAITING_FOR_APPROVAL in [e.reason for e in plan.events]
    assert plan.requeue_after is None
    w.advance(3600)
    plan = w.step()
    assert plan.status.current_batch == 1 and "waiting for approval" in plan.status.message
    assert {c.type: c.status for c in plan.status.conditions}[R.COND_PAUSED] == "True"
    w.annotations[PROMOTE_ANNOTATION] = "next"
    plan = w.step()
    assert plan.actions[0] == RemoveAnnotations((PROMOTE_ANNOTATION,))
    assert plan.status.current_batch == 2 and PROMOTE_ANNOTATION not in w.annotations
    # The same plan replayed (a repeated event) does not promote batch 2.
    w.step()
    plan = w.step()
    assert plan.status.current_batch == 2 and plan.status.batch_times.ready_at is not None


def test_promote_full_skips_to_promotion() -> None:
    w = started(World(spec(pause="manual")))
    hold(w)
    w.annotations[PROMOTE_ANNOTATION] = "full"
    plan = w.step()
    assert plan.status.phase == "Promoting"
    assert w.run(until={"Succeeded"})[-1] == "Succeeded"
    assert w.stable is not None and w.stable.image == "app:v2" and w.stable.replicas == 10


def test_unknown_promote_value_is_removed_and_reported() -> None:
    w = started(World(spec(pause="manual")))
    hold(w)
    w.annotations[PROMOTE_ANNOTATION] = "sideways"
    plan = w.step()
    assert plan.status.current_batch == 1
    assert PROMOTE_ANNOTATION not in w.annotations
    assert any(e.type == "Warning" for e in plan.events)


@pytest.mark.parametrize("how", ["annotation", "spec"], ids=["pause-annotation", "spec-paused"])
def test_pause_holds_and_resume_continues(how: str) -> None:
    w = started(World(spec(pause="10s")))
    hold(w)
    if how == "annotation":
        w.annotations[PAUSE_ANNOTATION] = "true"
    else:
        w.spec = w.spec.model_copy(update={"paused": True})
    plan = w.step()
    assert plan.status.phase == "Paused" and R.PAUSED in [e.reason for e in plan.events]
    w.advance(600)
    plan = w.step()
    assert plan.status.phase == "Paused" and plan.status.current_batch == 1 and plan.actions == ()
    if how == "annotation":
        del w.annotations[PAUSE_ANNOTATION]
    else:
        w.spec = w.spec.model_copy(update={"paused": False})
    plan = w.step()
    assert plan.status.phase == "Progressing" and R.RESUMED in [e.reason for e in plan.events]
    w.advance(10)
    plan = w.step()
    assert plan.status.current_batch == 2


def test_pause_annotation_false_does_not_pause() -> None:
    w = started(World(spec()))
    w.annotations[PAUSE_ANNOTATION] = "false"
    assert w.step().status.phase == "Progressing"


def test_progress_deadline_fails_the_release_and_rolls_back() -> None:
    w = World(spec(trafficRouting=SERVICE, progressDeadlineSeconds=60), pods_get_ready=False)
    plan = w.step()
    assert plan.requeue_after is not None and plan.requeue_after <= 60
    w.advance(61)
    plan = w.step()
    assert plan.actions[0] == SetWeight(0)
    assert plan.status.phase == "RollingBack"
    assert any(e.reason == R.PROGRESS_DEADLINE for e in plan.events)
    w.pods_get_ready = True
    w.run(until={"Failed"})
    assert w.canary is None and w.stable is not None and w.stable.replicas == 10 and w.stable.image == "app:v1"
    assert "0/2 canary pods ready after 60s" in w.status.message
    assert not w.narrowed


ANALYSIS = {
    "prometheus": {"address": "http://prometheus:9090"},
    "interval": "10s",
    "metrics": [{"name": "error-rate", "query": "q", "thresholdRange": {"max": 0.05}, "failureLimit": 1}],
}


def _check(value: float | None = None, error: str = "") -> tuple[Check, ...]:
    return (Check("error-rate", Sample(value=value, error=error)),)


def test_metric_checks_are_folded_into_status_and_gate_the_batch() -> None:
    w = started(World(spec(trafficRouting=SERVICE, pause="5s", analysis=ANALYSIS)))
    plan = hold(w)
    assert plan.requeue_after == 5  # the pause ends before the first check is due
    w.advance(5)
    plan = w.step()
    # Pause over, but no check yet: the batch waits for the first check, due 10 s after it went live.
    assert plan.status.current_batch == 1 and "waiting for the analysis" in plan.status.message
    assert plan.requeue_after == pytest.approx(5)
    w.advance(5)
    plan = decide(w.spec, w.status, replace(w.observed(), checks=_check(0.01)), w.now)
    m = plan.status.metrics[0]
    # The value stays visible; the count starts again, as only checks of the new batch count for it.
    assert (m.name, m.value, m.verdict, m.successes) == ("error-rate", 0.01, "Pass", 0)
    assert plan.status.current_batch == 2
    assert plan.status.history[0].result == "passed"


@pytest.mark.parametrize("pause", ["60s", "manual"])
def test_a_live_batch_is_first_checked_one_interval_after_it_went_live_whatever_its_pause(pause: str) -> None:
    w = started(World(spec(trafficRouting=SERVICE, pause=pause, analysis=ANALYSIS)))
    plan = hold(w)
    assert plan.requeue_after == pytest.approx(10)  # the interval, not the pause's end (or never)
    w.advance(10)
    plan = decide(w.spec, w.status, replace(w.observed(), checks=_check(0.2)), w.now)
    assert plan.status.metrics[0].failures == 1 and plan.status.phase == "Progressing"  # failureLimit 1
    assert plan.requeue_after == pytest.approx(10)


def test_failed_checks_past_the_failure_limit_roll_back_naming_metric_and_value() -> None:
    w = started(World(spec(trafficRouting=SERVICE, pause="60s", analysis=ANALYSIS)))
    hold(w)
    w.advance(10)
    plan = decide(w.spec, w.status, replace(w.observed(), checks=_check(0.09)), w.now)
    assert plan.status.phase == "Progressing" and plan.status.metrics[0].failures == 1  # tolerated
    assert any(e.reason == R.METRIC_CHECK_FAILED and "0.09 > max 0.05" in e.message for e in plan.events)
    w.status = plan.status
    w.advance(10)
    plan = decide(w.spec, w.status, replace(w.observed(), checks=_check(0.07)), w.now)
    assert plan.actions[0] == SetWeight(0)
    assert plan.status.phase == "RollingBack"
    assert "metric error-rate: 0.07 > max 0.05" in plan.status.message


def test_query_errors_never_pass_and_fail_at_the_consecutive_limit() -> None:
    w = started(World(spec(pause="1s", analysis=ANALYSIS)))
    hold(w)
    for i in range(4):
        w.advance(10)
        plan = decide(w.spec, w.status, replace(w.observed(), checks=_check(error="connection refused")), w.now)
        w.status = plan.status
        if i < 3:
            assert plan.status.phase == "Progressing" and plan.status.current_batch == 1
    assert plan.status.phase == "RollingBack" and "4 query errors in a row" in plan.status.message


def test_no_data_waits_until_the_progress_deadline() -> None:
    w = started(World(spec(pause="1s", analysis=ANALYSIS, progressDeadlineSeconds=30)))
    hold(w)
    for _ in range(3):
        w.advance(10)
        plan = decide(w.spec, w.status, replace(w.observed(), checks=_check(None)), w.now)
        w.status = plan.status
        assert plan.status.current_batch == 1
    w.advance(10)
    plan = decide(w.spec, w.status, replace(w.observed(), checks=_check(None)), w.now)
    assert plan.status.phase == "RollingBack" and "progressDeadlineSeconds" in plan.status.message


# --- abort ------------------------------------------------------------------------------------------


def _to_phase(phase: str) -> World:
    w = World(spec(trafficRouting=SERVICE, pause="manual"))
    if phase == "Initializing":
        assert w.stable is not None
        w.stable = replace(w.stable, template_hash="")
        w.step()
        assert w.status.phase == "Initializing"
        w.stable = replace(w.stable, template_hash="stablehash")
        return w
    w.step()
    hold(w)
    if phase == "Paused":
        w.annotations[PAUSE_ANNOTATION] = "true"
        w.step()
    if phase == "Promoting":
        w.annotations[PROMOTE_ANNOTATION] = "full"
        w.step()
        w.pods_get_ready = False
        w.step()  # the stable is rolling to the target
        w.pods_get_ready = True
    assert w.status.phase == phase
    return w


@pytest.mark.parametrize("phase", ["Initializing", "Progressing", "Paused", "Promoting"])
def test_abort_in_every_phase_cuts_traffic_first_and_ends_aborted(phase: str) -> None:
    w = _to_phase(phase)
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.actions[0] == SetWeight(0)
    assert plan.status.phase == "RollingBack" and plan.status.canary_weight == 0
    assert any(e.reason == R.ABORTED and e.type == "Warning" for e in plan.events)
    w.run(until={"Aborted"})
    assert w.canary is None
    assert w.stable is not None and w.stable.image == "app:v1" and w.stable.replicas == 10
    assert not w.narrowed
    # Sticky: nothing moves while the annotation stays.
    plan = w.step()
    assert plan.status.phase == "Aborted" and plan.actions == ()


def test_abort_before_start_changes_nothing() -> None:
    w = World(spec(), annotations={ABORT_ANNOTATION: "true"})
    plan = w.step()
    assert plan.status.phase == "Aborted" and plan.actions == ()


def test_rollback_keeps_canary_until_stable_is_ready() -> None:
    w = started(World(spec(trafficRouting=SERVICE, pause="30s")))
    hold(w)  # batch 1 ready: stable 8, canary 2
    w.annotations[ABORT_ANNOTATION] = "true"
    w.pods_get_ready = False
    plan = w.step()
    # The deciding pass cuts the traffic and records it, nothing else; the next one restores capacity.
    assert plan.actions == (SetWeight(0),) and plan.requeue_after == 0
    assert plan.status.phase == "RollingBack" and plan.status.canary_weight == 0
    plan = w.step()
    assert SetStableImage("app:v1", 10) in plan.actions
    assert DeleteCanary() not in plan.actions
    assert w.canary is not None
    w.pods_get_ready = True
    assert w.stable is not None
    w.stable = replace(w.stable, ready=10, updated=10, available=10, total=10)
    plan = w.step()
    assert DeleteCanary() in plan.actions


def test_retry_restarts_an_aborted_release_and_consumes_the_abort() -> None:
    w = _to_phase("Progressing")
    w.annotations[ABORT_ANNOTATION] = "true"
    w.run(until={"Aborted"})
    w.annotations[RETRY_ANNOTATION] = "1"
    plan = w.step()
    assert RemoveAnnotations((ABORT_ANNOTATION, RETRY_ANNOTATION)) in plan.actions
    assert plan.status.phase == "Progressing" and plan.status.current_batch == 1
    assert R.RETRIED in [e.reason for e in plan.events]
    assert ABORT_ANNOTATION not in w.annotations


def test_new_version_after_abort_starts_a_new_release() -> None:
    w = _to_phase("Progressing")
    w.annotations[ABORT_ANNOTATION] = "true"
    w.run(until={"Aborted"})
    w.spec = w.spec.model_copy(update={"target_version": "v3"})
    plan = w.step()
    assert plan.status.phase == "Progressing" and plan.status.target_version == "v3"
    assert ABORT_ANNOTATION not in w.annotations


# --- new target version mid-release ----------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Progressing", "Paused", "Promoting"])
def test_new_target_version_mid_release_restarts_from_batch_one(phase: str) -> None:
    w = _to_phase(phase)
    w.annotations.pop(PAUSE_ANNOTATION, None)
    w.spec = w.spec.model_copy(update={"target_version": "v3"})
    plan = w.step()
    assert plan.actions[0] == SetWeight(0)
    if phase == "Promoting":
        assert RestoreStableSelector() in plan.actions and SetStableImage("app:v1", 10) in plan.actions
    assert R.RESTARTED in [e.reason for e in plan.events]
    plan = w.step()
    assert plan.status.current_batch == 1 and plan.status.target_version == "v3"
    assert plan.status.history[-1].batch == 1
    w.step()
    assert w.canary is not None and w.canary.image == "app:v3"
    assert w.status.restore.image == "app:v1"


# --- promotion --------------------------------------------------------------------------------------


def test_promotion_waits_for_the_stable_rollout_then_removes_the_canary() -> None:
    w = World(spec(trafficRouting=NGINX, batchSize=10, canaryWeight=100))
    w.step()  # the one batch's canary, ready at once here
    w.pods_get_ready = False
    plan = w.step()
    # The last batch has no pause: the pass that finds it ready moves the weight and starts promoting.
    assert plan.status.phase == "Promoting"
    assert plan.actions == (SetWeight(100, None), RestoreStableSelector(), SetStableImage("app:v2", 10))
    plan = w.step()
    assert "waiting for 10 stable pods ready on v2" in plan.status.message and w.canary is not None
    assert w.stable is not None
    w.stable = replace(w.stable, ready=10, updated=10, available=10, total=10)
    plan = w.step()
    assert plan.actions == (SetWeight(0), DeleteCanary())
    plan = w.step()
    assert plan.actions == (ResetRouting(),) and plan.status.phase == "Succeeded"


def test_service_mode_promotion_never_narrows_to_the_old_hash() -> None:
    w = World(spec(trafficRouting=SERVICE, batchSize=10, canaryWeight=100))
    w.run(until={"Succeeded"})
    promoting = [p for p in w.plans if p.status.phase in ("Promoting", "Succeeded")]
    assert all(SetWeight(0) not in p.actions for p in promoting)


def test_promotion_deadline_rolls_back_to_the_original_image() -> None:
    w = World(spec(batchSize=10, canaryWeight=100, progressDeadlineSeconds=30))
    w.step()
    w.pods_get_ready = False
    assert w.step().status.phase == "Promoting"
    w.advance(31)
    plan = w.step()
    assert plan.status.phase == "RollingBack" and plan.actions[-1] == SetWeight(0)
    plan = w.step()
    assert SetStableImage("app:v1", 10) in plan.actions
    w.pods_get_ready = True
    assert w.stable is not None
    w.stable = replace(w.stable, ready=0)
    w.run(until={"Failed"})
    assert w.stable is not None and w.stable.image == "app:v1"


# --- target or canary deleted -----------------------------------------------------------------------


def test_target_deleted_mid_release_fails_and_removes_the_canary() -> None:
    w = started(World(spec(trafficRouting=SERVICE, pause="30s")))
    hold(w)
    w.stable = None
    w.run(until={"Failed"})
    assert w.canary is None
    assert "is gone" in w.status.message


def test_canary_deleted_mid_release_is_recreated_at_once_not_at_the_next_batch() -> None:
    w = started(World(spec(pause="60s", trafficRouting=SERVICE)))
    hold(w)
    w.advance(30)  # half way through batch 1's pause
    w.canary = None
    plan = w.step()
    # Traffic back to before the batch, the canary asked for again, the stable back to full size until
    # the new canary is ready; batch 1 is not live any more.
    assert plan.actions[0] == SetWeight(0)
    assert EnsureCanary(replicas=2, image="app:v2", version="v2") in plan.actions
    assert ScaleStable(10) in plan.actions
    st = plan.status
    assert (st.phase, st.current_batch, st.batch_times.ready_at, st.canary_weight) == ("Progressing", 1, None, 0)
    assert R.CANARY_LOST in [e.reason for e in plan.events]
    plan = w.step()  # ready again: live with a full pause, the same history record
    assert plan.status.batch_times.ready_at is not None and plan.status.current_batch == 1
    assert plan.status.batch_times.next_check_at is not None
    assert fmt_time(plan.status.batch_times.next_check_at) == "2026-01-01T12:01:30.000Z"
    assert [h.batch for h in plan.status.history] == [1]
    assert w.canary is not None and w.stable is not None and w.stable.replicas == 8
    w.run(until={"Succeeded"})
    assert [h.batch for h in w.status.history] == [1, 2, 3, 4, 5]


def test_canary_deleted_in_batch_two_goes_back_to_batch_one_weight() -> None:
    w = started(World(spec(pause="60s", trafficRouting=NGINX)))
    hold(w)
    w.advance(61)
    w.step()
    hold(w)
    assert w.status.current_batch == 2 and w.weight == 40
    w.canary = None
    plan = w.step()
    assert plan.actions[0] == SetWeight(20) and plan.status.canary_weight == 20
    assert EnsureCanary(replicas=4, image="app:v2", version="v2") in plan.actions
    hold(w)
    assert w.weight == 40 and w.status.current_batch == 2


# --- deletion ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Progressing", "Paused", "Promoting"])
def test_deletion_mid_release_restores_the_app(phase: str) -> None:
    w = _to_phase(phase)
    w.deleting = True
    for _ in range(10):
        plan = w.step()
        if plan.done:
            break
    assert plan.done
    assert w.canary is None and not w.narrowed
    assert w.stable is not None and w.stable.image == "app:v1" and w.stable.replicas == 10


def test_deletion_of_a_finished_release_is_immediate() -> None:
    w = World(spec(batchSize=10, canaryWeight=100))
    w.run(until={"Succeeded"})
    w.deleting = True
    plan = w.step()
    assert plan.done and plan.actions == ()


# --- restarts: the same status and the same world give the same plan --------------------------------


def _snapshots() -> list[tuple[str, World]]:
    out = []
    w = World(spec(trafficRouting=SERVICE, pause="20s"))
    for i in range(60):
        out.append((f"{i:02d}-{w.status.phase}-{w.status.current_batch}", World(**{**w.__dict__, "plans": []})))
        plan = w.step()
        if plan.status.phase == "Succeeded":
            break
        w.advance(plan.requeue_after if plan.requeue_after else 1)
    return out


@pytest.mark.parametrize(("label", "world"), _snapshots(), ids=[s[0] for s in _snapshots()])
def test_resume_after_restart_never_skips_or_repeats_a_batch(label: str, world: World) -> None:
    """A controller killed after acting but before recording plans the same step again: replaying a
    step from the old status is harmless, and the batches still run 1..N once each."""
    before = world.status
    first = decide(world.spec, before, world.observed(), world.now)
    for action in first.actions:
        world.apply(action)
    # The status write was lost: plan again from the old status against the changed world.
    world.status = before
    world.run(until={"Succeeded"}, tick=20)
    started_batches = [r.batch for r in world.status.history]
    assert started_batches == sorted(set(started_batches))
    assert started_batches[-1] == 5
    assert world.stable is not None and world.stable.image == "app:v2" and world.canary is None


@pytest.mark.parametrize("lost", [2, 3])
@pytest.mark.parametrize(("label", "world"), _snapshots()[:8], ids=[s[0] for s in _snapshots()[:8]])
def test_status_writes_lost_in_a_row_never_lose_the_stable_s_size(label: str, world: World, lost: int) -> None:
    """Killed again and again after acting but before recording (a burst of passes after a restart is
    where kills land): the stable's size before the release is not taken from a stable the release had
    already shrunk, so the promotion gives it back its full size."""
    before = world.status
    for _ in range(lost):
        plan = decide(world.spec, before, world.observed(), world.now)
        for action in plan.actions:
            world.apply(action)
    world.status = before
    world.run(until={"Succeeded"}, tick=20)
    assert world.stable is not None and world.stable.image == "app:v2"
    assert world.stable.replicas == 10 and world.status.stable_replicas == 10


def test_decide_is_pure() -> None:
    w = started(World(spec(trafficRouting=SERVICE)))
    a = decide(w.spec, w.status, w.observed(), w.now)
    b = decide(w.spec, w.status, w.observed(), w.now)
    assert a == b
    assert UID  # the world's release uid is what owns the canary


# --- the state machine itself -----------------------------------------------------------------------


def test_every_state_has_exactly_one_handler() -> None:
    for phase in [None, *Phase]:
        for state in STATES_OF[phase]:
            assert (phase, state) in HANDLERS, (phase, state)
        assert all(state is None for state in STATES_OF[phase]) or phase in BATCH_PHASES
    assert len(HANDLERS) == sum(len(states) for states in STATES_OF.values())


def test_batch_states_through_a_release_and_the_paused_condition_follows_them() -> None:
    batches = [{"replicas": 2, "pause": "manual"}, {"replicas": 4, "pause": "30s"}, {"replicas": 10}]
    w = World(spec(trafficRouting=SERVICE, batches=batches, batchSize=None, canaryWeight=None), pods_get_ready=False)
    seen = []

    def step() -> None:
        plan = w.step()
        paused = {c.type: c.status for c in plan.status.conditions}[R.COND_PAUSED]
        seen.append((plan.status.phase, plan.status.current_batch, plan.status.batch_state, paused))

    step()  # batch 1's canary asked for
    w.pods_get_ready = True
    assert w.canary is not None
    w.canary = replace(w.canary, ready=2, updated=2, available=2, total=2)
    step()  # live, waiting for approval
    w.annotations[PAUSE_ANNOTATION] = "true"
    step()
    del w.annotations[PAUSE_ANNOTATION]
    step()  # resumed: verified again in the next pass
    step()
    w.annotations[PROMOTE_ANNOTATION] = "next"
    step()  # batch 2's canary asked for (and ready at once in this world)
    step()
    assert seen == [
        (Phase.PROGRESSING, 1, BatchState.UPSCALING, "False"),
        (Phase.PROGRESSING, 1, BatchState.WAITING_FOR_APPROVAL, "True"),
        (Phase.PAUSED, 1, BatchState.VERIFYING, "True"),
        (Phase.PROGRESSING, 1, BatchState.VERIFYING, "False"),
        (Phase.PROGRESSING, 1, BatchState.WAITING_FOR_APPROVAL, "True"),
        (Phase.PROGRESSING, 2, BatchState.UPSCALING, "False"),
        (Phase.PROGRESSING, 2, BatchState.VERIFYING, "False"),
    ]
    w.run(until={"Succeeded"})
    assert w.status.batch_state is None


def test_the_paused_condition_comes_from_the_state_not_the_message() -> None:
    w = started(World(spec(trafficRouting=SERVICE, pause="30s")))
    hold(w)
    w.status = w.status.model_copy(update={"message": "batch 1/5: waiting for approval (said nobody)"})
    plan = w.step()
    assert plan.status.batch_state == BatchState.VERIFYING
    assert {c.type: c.status for c in plan.status.conditions}[R.COND_PAUSED] == "False"


def test_a_later_state_sees_the_world_as_the_earlier_actions_leave_it() -> None:
    world = World(spec()).observed()
    stable = world.target
    assert stable is not None and stable.rolled_out(10, "app:v1") and not stable.settling()
    scaled = project(world, ScaleStable(8)).target
    assert scaled is not None and scaled.replicas == 8 and scaled.settling() and not scaled.rolled_out(8, "app:v1")
    assert project(world, ScaleStable(10)) == world  # nothing changes: nothing to wait for
    rolled = project(world, SetStableImage("app:v2", 10)).target
    assert rolled is not None and rolled.image == "app:v2" and rolled.generation == stable.generation + 1
    canary = project(world, EnsureCanary(replicas=2, image="app:v2", version="v2")).own_canary
    assert canary is not None and (canary.replicas, canary.ready) == (2, 0) and not canary.rolled_out(2, "app:v2")
    gone = project(project(world, EnsureCanary(2, "app:v2", "v2")), DeleteCanary()).canary
    assert gone is not None and gone.deleting
    annotated = replace(world, annotations={PROMOTE_ANNOTATION: "next", PAUSE_ANNOTATION: "true"})
    assert project(annotated, RemoveAnnotations((PROMOTE_ANNOTATION,))).annotations == {PAUSE_ANNOTATION: "true"}
    assert project(world, SetWeight(50)) is world
