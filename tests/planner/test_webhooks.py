"""Webhook checks in the pure state machine: a pre-traffic check holds a batch before any weight is set, a
confirm holds the release until its yes and times out as an approval does, errors count towards
consecutiveErrorLimit, the pre-promotion and post-rollback points, and a pass planned again after a crash
counting nothing twice. The answers are given as the reconciler gives them: for the webhooks
:func:`~greyrelease.analysis.webhooks.due` names from the recorded status."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from greyrelease.analysis.webhooks import Answer, due
from greyrelease.api.release import PROMOTE_ANNOTATION, Phase, Webhook
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Plan, SetWeight
from greyrelease.planner.machine import decide

from tests.support.world import World, spec

NGINX = {"nginx": {"ingress": "web", "stableService": "web"}}
BATCHES = [{"replicas": 2, "weight": 20}, {"replicas": 10, "weight": 100}]
Respond = Callable[[Webhook], Answer]


def world(*hooks: dict[str, Any], batches: list[dict[str, Any]] | None = None, **fields: Any) -> World:
    analysis = {"interval": "10s", "webhooks": list(hooks)}
    return World(
        spec(
            trafficRouting=NGINX,
            batches=batches or BATCHES,
            batchSize=None,
            canaryWeight=None,
            analysis=analysis,
            **fields,
        )
    )


class Driver:
    """Steps a world as the reconciler would: the webhooks due are called (``respond`` answers them), then
    the plan is made and applied; time moves on by the plan's wake-up."""

    def __init__(self, w: World, respond: Respond) -> None:
        self.w = w
        self.respond = respond
        self.calls: list[tuple[str, float]] = []  # (webhook, seconds since the start)
        self.start = w.now

    def step(self) -> Plan:
        w = self.w
        answers = tuple(self.respond(h) for h in due(w.spec, w.status, w.now))
        self.calls += [(a.webhook, (w.now - self.start).total_seconds()) for a in answers]
        plan = decide(w.spec, w.status, replace(w.observed(), answers=answers), w.now)
        w.acting = plan.status
        for action in plan.actions:
            w.apply(action)
        w.status = plan.status
        w.plans.append(plan)
        return plan

    def run(self, until: Callable[[Plan], bool], steps: int = 80) -> Plan:
        for _ in range(steps):
            plan = self.step()
            if until(plan):
                return plan
            wait = plan.requeue_after
            if wait is None or wait > 0:
                self.w.advance(1.0 if wait is None else min(wait, 3600))
        raise AssertionError(f"never got there: {self.w.status.phase} {self.w.status.message}")


def answering(code: int = 200, error: str = "") -> Respond:
    return lambda h: Answer(h.name, code=None if error else code, error=error)


def weights(w: World) -> list[int]:
    return [a.weight for p in w.plans for a in p.actions if isinstance(a, SetWeight)]


def events(w: World) -> list[tuple[str, str, str]]:
    return [(e.reason, e.type, e.message) for p in w.plans for e in p.events]


def reasons(w: World) -> list[str]:
    return [e[0] for e in events(w)]


def condition(plan: Plan, kind: str) -> str:
    return next(c.status for c in plan.status.conditions if c.type == kind)


SMOKE = {"name": "smoke", "at": "pre-traffic", "url": "http://checks/smoke"}
CONFIRM = {"name": "cab", "at": "pre-traffic", "kind": "confirm", "url": "http://checks/cab"}


def test_pre_traffic_webhooks_need_a_router_that_sets_weights() -> None:
    with pytest.raises(ValueError, match="pre-traffic webhooks need trafficRouting nginx or gatewayAPI"):
        spec(trafficRouting={"service": {"name": "web"}}, analysis={"webhooks": [SMOKE]})


def test_a_failing_pre_traffic_check_blocks_the_batch_before_any_weight_is_set() -> None:
    w = world(SMOKE)
    d = Driver(w, answering(403))
    plan = d.run(lambda p: p.status.phase == Phase.FAILED)
    assert d.calls == [("smoke", d.calls[0][1])]  # called once: failureLimit 0
    assert all(weight == 0 for weight in weights(w))  # never a weight for the canary
    assert any(weight == 0 for weight in weights(w))  # the rollback set it to 0 explicitly
    assert "batch 1/2: webhook smoke: answered 403 (1 failed answers > failureLimit 0)" in plan.status.message
    assert (R.WEBHOOK_CHECK_FAILED, "Warning") in [(r, t) for r, t, _ in events(w)]
    assert R.ANALYSIS_FAILED in reasons(w) and R.BATCH_READY not in reasons(w)
    assert w.status.webhooks[0].code == 403 and w.status.webhooks[0].verdict == "Fail"


def test_the_pre_traffic_call_comes_when_the_canary_is_ready_and_a_pass_lets_it_go_live() -> None:
    w = world(SMOKE)
    d = Driver(w, answering(200))
    plan = d.run(lambda p: p.status.batch_times.ready_at is not None)
    # The pass that found the canary ready recorded the point; the next one called and set the weight.
    ready = next(p for p in w.plans if p.status.batch_times.checks_since is not None)
    assert not [a for a in ready.actions if isinstance(a, SetWeight) and a.weight > 0]
    assert SetWeight(20) in plan.actions and len(d.calls) == 1
    assert plan.status.batch_times.checks_since is None
    d.run(lambda p: p.status.phase == Phase.SUCCEEDED)
    assert [c[0] for c in d.calls] == ["smoke", "smoke"]  # once per batch
    assert weights(w)[:2] == [20, 100]


def test_pre_traffic_errors_hold_the_batch_and_fail_it_at_the_consecutive_error_limit() -> None:
    w = world({**SMOKE, "consecutiveErrorLimit": 3})
    d = Driver(w, answering(error="no answer within 5s"))
    plan = d.run(lambda p: p.status.phase == Phase.FAILED)
    assert [t - d.calls[0][1] for _, t in d.calls] == [0, 10, 20]  # every interval
    assert all(weight == 0 for weight in weights(w))
    assert "webhook smoke: 3 errors in a row (consecutiveErrorLimit 3): no answer within 5s" in plan.status.message


def test_errors_then_a_pass_let_the_batch_go_live() -> None:
    answers = iter([Answer("smoke", 503), Answer("smoke", error="could not connect"), Answer("smoke", 200)])
    w = world(SMOKE)
    plan = Driver(w, lambda h: next(answers)).run(lambda p: p.status.batch_times.ready_at is not None)
    assert SetWeight(20) in plan.actions
    entry = plan.status.webhooks[0]
    assert (entry.successes, entry.consecutive_errors, entry.code) == (1, 0, 200)
    assert reasons(w).count(R.WEBHOOK_CHECK_FAILED) == 2


def test_a_confirm_holds_the_release_paused_until_it_says_yes() -> None:
    said = {"yes": False}
    w = world(CONFIRM)
    d = Driver(w, lambda h: Answer(h.name, 200 if said["yes"] else 403))
    plan = d.run(lambda p: len(d.calls) == 3)
    assert plan.status.phase == Phase.PROGRESSING and plan.status.awaiting_confirmation == "cab"
    assert condition(plan, "Paused") == "True"
    assert "waiting for a yes (answered 403)" in plan.status.message
    assert all(weight == 0 for weight in weights(w))
    assert reasons(w).count(R.WAITING_FOR_CONFIRMATION) == 1 and R.WEBHOOK_CHECK_FAILED not in reasons(w)
    said["yes"] = True
    plan = d.run(lambda p: p.status.batch_times.ready_at is not None)
    assert SetWeight(20) in plan.actions and plan.status.awaiting_confirmation == ""
    assert condition(plan, "Paused") == "False"
    assert R.CONFIRMED in reasons(w)


@pytest.mark.parametrize("on_timeout", ["abort", "promote"])
def test_a_confirm_that_never_says_yes_times_out_as_an_approval_does(on_timeout: str) -> None:
    w = world({**CONFIRM, "approval": {"timeout": "60s", "onTimeout": on_timeout}})
    d = Driver(w, answering(403))
    plan = d.run(lambda p: any(e.reason == R.APPROVAL_EXPIRED for e in p.events))
    since = next(p for p in w.plans if p.status.batch_times.checks_since).status.batch_times.checks_since
    assert since is not None and w.now - since == timedelta(seconds=60)
    if on_timeout == "abort":
        assert plan.status.phase == Phase.ROLLING_BACK and plan.status.end_phase == Phase.ABORTED
        assert all(weight == 0 for weight in weights(w))
        assert "no yes from webhook cab within 60s (approval.timeout): aborted" in plan.status.message
    else:
        assert SetWeight(20) in plan.actions and plan.status.phase == Phase.PROGRESSING
        assert "taken as yes" in plan.status.webhooks[0].message
    assert [t - d.calls[0][1] for _, t in d.calls] == [0, 10, 20, 30, 40, 50, 60]  # a no every interval


def test_a_confirms_errors_count_towards_its_consecutive_error_limit() -> None:
    w = world({**CONFIRM, "consecutiveErrorLimit": 2})
    plan = Driver(w, answering(500)).run(lambda p: p.status.phase == Phase.ROLLING_BACK)
    assert plan.status.end_phase == Phase.FAILED
    assert "webhook cab: 2 errors in a row (consecutiveErrorLimit 2): answered 500" in plan.status.message


def test_a_live_check_fails_the_batch_and_one_not_yet_passed_holds_it() -> None:
    live = {"name": "load", "at": "live", "url": "http://checks/load", "successesRequired": 2}
    answers = iter([Answer("load", 200), Answer("load", 403)])
    w = world(live, batches=[{"replicas": 2, "weight": 20, "pause": "5s"}, {"replicas": 10, "weight": 100}])
    d = Driver(w, lambda h: next(answers))
    plan = d.run(lambda p: len(d.calls) == 1)
    assert plan.status.phase == Phase.PROGRESSING and "webhook load: 1/2 passing answers" in plan.status.message
    plan = d.run(lambda p: p.status.phase == Phase.ROLLING_BACK)
    assert "webhook load: answered 403 (1 failed answers > failureLimit 0)" in plan.status.message
    first, second = (t for _, t in d.calls)
    assert second - first == 10


def test_a_live_confirm_is_approved_by_its_yes_or_by_a_person() -> None:
    live = {"name": "cab", "at": "live", "kind": "confirm", "url": "http://checks/cab"}
    w = world(live)
    d = Driver(w, answering(403))
    plan = d.run(lambda p: len(d.calls) == 2)
    assert plan.status.awaiting_confirmation == "cab" and plan.status.current_batch == 1
    w.annotations[PROMOTE_ANNOTATION] = "next"
    plan = d.run(lambda p: p.status.current_batch == 2)
    assert plan.status.awaiting_confirmation == ""


def test_the_promotion_waits_for_the_pre_promotion_webhooks_and_promote_full_does_not() -> None:
    promo = {"name": "release-board", "at": "pre-promotion", "kind": "confirm", "url": "http://checks/board"}
    w = world(promo)
    d = Driver(w, answering(403))
    plan = d.run(lambda p: len(d.calls) == 2)
    assert (plan.status.phase, plan.status.current_batch) == (Phase.PROGRESSING, 2)
    assert plan.status.awaiting_confirmation == "release-board"
    assert "waiting for the webhooks before the promotion" in plan.status.message
    d.respond = answering(200)
    plan = d.run(lambda p: p.status.phase == Phase.PROMOTING)
    assert plan.status.history[-1].result == "passed" and R.CONFIRMED in reasons(w)

    w2 = world(promo)
    d2 = Driver(w2, answering(403))
    d2.run(lambda p: len(d2.calls) == 1)
    w2.annotations[PROMOTE_ANNOTATION] = "full"
    plan = d2.run(lambda p: p.status.phase == Phase.PROMOTING)
    assert len(d2.calls) == 1 and plan.status.awaiting_confirmation == ""


def test_a_rollback_calls_its_post_rollback_webhook_once_and_nothing_waits_for_it() -> None:
    hook = {"name": "tell", "at": "post-rollback", "url": "http://checks/tell"}
    w = world(SMOKE, hook)
    d = Driver(w, answering(403))
    ended = d.run(lambda p: p.status.phase == Phase.FAILED)
    assert ended.requeue_after == 0  # the next pass calls it
    assert [c[0] for c in d.calls] == ["smoke"]
    for _ in range(3):
        d.step()
        w.advance(5)
    assert [c[0] for c in d.calls] == ["smoke", "tell"]
    entry = next(e for e in w.status.webhooks if e.name == "tell")
    assert (entry.at, entry.verdict, entry.code) == ("post-rollback", "Fail", 403)
    assert w.status.phase == Phase.FAILED
    assert sum(1 for r, _, m in events(w) if r == R.WEBHOOK_CHECK_FAILED and "(post-rollback)" in m) == 1


def test_a_pass_planned_again_after_a_crash_counts_its_answer_once() -> None:
    w = world({**SMOKE, "failureLimit": 1})
    d = Driver(w, answering(403))
    d.run(lambda p: p.status.batch_times.checks_since is not None)
    recorded = w.status
    observed = replace(w.observed(), answers=(Answer("smoke", 403),))
    first = decide(w.spec, recorded, observed, w.now)
    assert first.status.webhooks[0].failures == 1
    # The controller died before writing that status: the next pass plans from the recorded one again,
    # with the answer of a second call.
    again = decide(w.spec, recorded, observed, w.now)
    assert again == first
    assert again.status.webhooks[0].failures == 1 and [e.reason for e in again.events] == [R.WEBHOOK_CHECK_FAILED]
    # Recorded, the next answer counts on top of it.
    w.advance(10)
    after = decide(w.spec, first.status, replace(observed, answers=(Answer("smoke", 403),)), w.now)
    assert after.status.phase == Phase.ROLLING_BACK and after.status.webhooks[0].failures == 2


def test_a_release_without_webhooks_plans_as_before() -> None:
    w = World(spec(trafficRouting=NGINX, batches=BATCHES, batchSize=None, canaryWeight=None))
    w.run(until={"Succeeded"})
    assert w.status.webhooks == [] and w.status.awaiting_confirmation == ""
    assert all(p.status.batch_times.checks_since is None for p in w.plans)
