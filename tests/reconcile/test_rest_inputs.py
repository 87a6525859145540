"""What a pass that writes nothing reads, and what it says it read: the runtime's resync (or poll) leaves such
a release out when none of it changed (greyrelease.runtime.controller.Runtime.unchanged), which is right only
while the pass reads nothing else. These tests hold that: for every router, in follow mode, paused by hand,
waiting for a batch's canary pods and for a promotion to roll, the pass reads the release, its Deployment and
the canary's name, and the policies, and its outcome names their versions; a pass with a timer of its own, a
write (an action's too) or any other read names none."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus, Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.reconcile.observe import observe
from greyrelease.reconcile.reconciler import Inputs, Outcome, ReadLog, Reconciler, inputs_of

from tests.support import builders, follow_cluster
from tests.support.builders import NS, RELEASE, T0

INGRESS, ROUTE = builders.ingress(), builders.http_route()
# (The in-memory server has no EndpointSlices: with the nginx and Gateway API routers the canary never shows
# ready behind its Service, and the release ends Failed at its deadline, its traffic back on the stable.)
ROUTERS = [
    pytest.param(None, None, "Succeeded", id="replicas"),
    pytest.param({"service": {"name": "web"}}, None, "Succeeded", id="service"),
    pytest.param({"nginx": {"ingress": "web", "stableService": "web"}}, INGRESS, "Failed", id="nginx"),
    pytest.param({"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}, ROUTE, "Failed", id="gateway"),
]
AT_REST_READS = [
    ("GET", RELEASE),
    ("GET", path("apps", "v1", "deployments", NS, "web")),
    ("GET", path("apps", "v1", "deployments", NS, "web-canary")),
    ("LIST", path("greyrelease.io", "v1", "greyreleasepolicies")),
]


def until_at_rest(kube: MemoryKube, roll_out: Any, phase: str) -> tuple[Reconciler, Outcome]:
    """Passes a minute apart, the control plane converging between them, until one finds the release in
    ``phase`` with nothing to do and no timer; the reconciler and that pass's outcome."""
    reconciler, now = Reconciler(kube), T0
    for _ in range(60):
        outcome = reconciler.reconcile(NS, "web", now=now)
        assert outcome is not None
        plan = outcome.plan
        if plan.status.phase == phase and not plan.actions and plan.requeue_after is None:
            return reconciler, outcome
        roll_out(kube)
        now += timedelta(minutes=1)
    raise AssertionError(f"never at rest in {phase}: {builders.status_of(kube)}")


def version(kube: MemoryKube, name: str) -> str:
    found = kube.get(path("apps", "v1", "deployments", NS, name))
    assert found is not None
    return str(found["metadata"]["resourceVersion"])


@pytest.mark.parametrize(("routing", "extra", "phase"), ROUTERS)
def test_a_finished_release_s_pass_reads_its_release_deployments_and_policies_only_and_names_their_versions(
    routing: Obj | None, extra: Obj | None, phase: str
) -> None:
    kube = builders.cluster(**({"trafficRouting": routing} if routing else {}))
    if extra is not None:
        kube.put(extra)
    reconciler, _ = until_at_rest(kube, builders.roll_out, phase)
    kube.requests.clear()
    outcome = reconciler.reconcile(NS, "web", now=T0 + timedelta(hours=2))
    assert outcome is not None and kube.writes == []
    assert kube.requests == AT_REST_READS
    release = kube.get(RELEASE)
    assert release is not None
    assert outcome.resting == Inputs(
        str(release["metadata"]["resourceVersion"]), (("web", version(kube, "web")), ("web-canary", None))
    )


def test_a_followed_deployment_at_rest_reads_the_same_and_names_their_versions() -> None:
    kube = follow_cluster.cluster(trafficRouting={"service": {"name": "web"}})
    reconciler, _ = until_at_rest(kube, follow_cluster.roll_out, "Idle")
    kube.requests.clear()
    outcome = reconciler.reconcile(NS, "web")
    assert outcome is not None and kube.writes == []
    assert kube.requests == AT_REST_READS
    assert outcome.resting is not None
    assert outcome.resting.deployments == (("web", version(kube, "web")), ("web-canary", None))


def test_a_pass_with_a_timer_names_none() -> None:
    """Paused for an hour in batch 2, writing nothing: the plan has a timer (the pause's end), so its pass is
    not at rest."""
    kube = builders.cluster(batches=[{"replicas": 1}, {"replicas": 2, "pause": "1h"}, {"replicas": 4}])
    reconciler, now = Reconciler(kube), T0
    for _ in range(20):
        outcome = reconciler.reconcile(NS, "web", now=now)
        assert outcome is not None
        status = builders.status_of(kube)
        if status.get("currentBatch") == 2 and (status.get("batchTimes") or {}).get("readyAt"):
            break
        builders.roll_out(kube)
        now += timedelta(seconds=10)
    kube.requests.clear()
    paused = reconciler.reconcile(NS, "web", now=now + timedelta(seconds=10))
    assert paused is not None and kube.writes == []
    assert paused.plan.requeue_after is not None and paused.resting is None


def test_a_release_paused_by_hand_reads_the_same_and_names_its_canary_s_version_too() -> None:
    kube = builders.cluster(
        batches=[{"replicas": 1, "pause": "manual"}, {"replicas": 2}], trafficRouting={"service": {"name": "web"}}
    )
    reconciler, now = Reconciler(kube), T0
    for _ in range(20):
        reconciler.reconcile(NS, "web", now=now)
        if builders.status_of(kube).get("batchState") == "WaitingForApproval":
            break
        builders.roll_out(kube)
        now += timedelta(seconds=10)
    kube.patch(RELEASE, {"metadata": {"annotations": {"greyrelease.io/pause": "true"}}})
    reconciler, _ = until_at_rest(kube, builders.roll_out, "Paused")
    kube.requests.clear()
    outcome = reconciler.reconcile(NS, "web", now=T0 + timedelta(hours=2))
    assert outcome is not None and kube.writes == []
    assert kube.requests == AT_REST_READS
    assert outcome.resting is not None
    assert outcome.resting.deployments == (("web", version(kube, "web")), ("web-canary", version(kube, "web-canary")))


def test_a_release_waiting_for_another_names_none() -> None:
    """Waiting to start after ``api``: its passes read the releases it comes after, which no version of its own
    inputs shows."""
    api = builders.release()
    api["metadata"] |= {"name": "api", "uid": "api-uid"}
    kube = builders.cluster(after=[{"name": "api"}])
    kube.put(api)
    reconciler = Reconciler(kube)
    for seconds in range(0, 40, 10):
        outcome = reconciler.reconcile(NS, "web", now=T0 + timedelta(seconds=seconds))
        assert outcome is not None and outcome.plan.status.phase == "Waiting" and outcome.resting is None


def test_a_promotion_waiting_for_the_stable_to_roll_names_its_inputs_its_poll_and_its_deadline() -> None:
    kube = builders.cluster()
    reconciler, now = Reconciler(kube), T0
    for _ in range(20):
        outcome = reconciler.reconcile(NS, "web", now=now)
        assert outcome is not None
        if outcome.plan.status.phase == "Promoting":
            break
        builders.roll_out(kube)
        now += timedelta(seconds=30)
    # The stable's old pods settle (the last batch scaled it down), then it is given the new image; it has
    # not rolled when the next pass comes.
    builders.roll_out(kube)
    now += timedelta(seconds=30)
    given = reconciler.reconcile(NS, "web", now=now)
    assert given is not None and given.plan.actions
    kube.requests.clear()
    now += timedelta(seconds=30)
    waiting = reconciler.reconcile(NS, "web", now=now)
    assert waiting is not None and kube.writes == [] and not waiting.plan.actions
    assert waiting.plan.polled and waiting.plan.requeue_after == 30.0
    started = datetime.fromisoformat(builders.status_of(kube)["phaseStartedAt"])
    # The deadline: 600 s (progressDeadlineSeconds) from the promotion's start.
    assert waiting.plan.timer_after == 600 - (now - started).total_seconds() == 540
    release = kube.get(RELEASE)
    assert release is not None
    assert waiting.resting == Inputs(
        str(release["metadata"]["resourceVersion"]),
        (("web", version(kube, "web")), ("web-canary", version(kube, "web-canary"))),
    )


def waiting_for_canary_pods(kube: MemoryKube) -> tuple[Reconciler, datetime]:
    """Passes 10 s apart, the canary's pods never ready, until one writes nothing: batch 1 waiting for them.
    The reconciler and the time of the next pass."""
    reconciler, now = Reconciler(kube), T0
    for _ in range(10):
        kube.requests.clear()
        assert reconciler.reconcile(NS, "web", now=now) is not None
        now += timedelta(seconds=10)
        if not kube.writes:
            return reconciler, now
    raise AssertionError(f"still writing: {builders.status_of(kube)}")


@pytest.mark.parametrize(("routing", "extra", "phase"), ROUTERS)
def test_a_batch_waiting_for_its_canary_pods_names_its_inputs_its_poll_and_its_deadline(
    routing: Obj | None, extra: Obj | None, phase: str
) -> None:
    """The pass plans the canary at its size again, which finds it so and writes nothing: at rest until a
    Deployment changes (a pod ready), its poll's time or its deadline."""
    kube = builders.cluster(**({"trafficRouting": routing} if routing else {}))
    if extra is not None:
        kube.put(extra)
    reconciler, now = waiting_for_canary_pods(kube)
    kube.requests.clear()
    waiting = reconciler.reconcile(NS, "web", now=now)
    assert waiting is not None and kube.requests == AT_REST_READS and waiting.plan.actions
    assert builders.status_of(kube)["batchState"] == "Upscaling"
    assert waiting.plan.polled and waiting.plan.requeue_after == 30.0
    started = datetime.fromisoformat(builders.status_of(kube)["batchTimes"]["startedAt"])
    assert waiting.plan.timer_after == 600 - (now - started).total_seconds()
    release = kube.get(RELEASE)
    assert release is not None
    assert waiting.resting == Inputs(
        str(release["metadata"]["resourceVersion"]),
        (("web", version(kube, "web")), ("web-canary", version(kube, "web-canary"))),
    )


def test_a_pass_whose_action_writes_names_none_though_its_status_is_unchanged() -> None:
    """Someone scaled the waiting canary to 0: the pass scales it back (its only write; the status stays)."""
    kube = builders.cluster()
    reconciler, now = waiting_for_canary_pods(kube)
    kube.patch(path("apps", "v1", "deployments", NS, "web-canary"), {"spec": {"replicas": 0}})
    kube.requests.clear()
    outcome = reconciler.reconcile(NS, "web", now=now)
    assert outcome is not None and [verb for verb, _ in kube.writes] == ["PATCH"]
    canary = kube.get(path("apps", "v1", "deployments", NS, "web-canary"))
    assert canary is not None and canary["spec"]["replicas"] == 1
    assert outcome.resting is None


def test_a_pass_that_read_anything_else_names_none() -> None:
    kube = builders.cluster()
    until_at_rest(kube, builders.roll_out, "Succeeded")
    release = kube.get(RELEASE)
    assert release is not None
    spec = GreyReleaseSpec.model_validate(release["spec"])
    log = ReadLog(kube)
    scene = observe(log, release, spec, GreyReleaseStatus.model_validate(release["status"]))
    assert inputs_of(release, scene, log.reads) is not None
    slices = path("discovery.k8s.io", "v1", "endpointslices", NS)
    assert inputs_of(release, scene, [*log.reads, ("LIST", slices)]) is None
    assert inputs_of(release, scene, [*log.reads, ("GET", path("apps", "v1", "deployments", NS, "api"))]) is None


def test_a_pass_that_writes_names_none() -> None:
    kube = builders.cluster()
    outcome = Reconciler(kube).reconcile(NS, "web", now=T0)  # the first pass: it starts the release
    assert outcome is not None and kube.writes and outcome.resting is None


def test_a_release_whose_deployment_is_found_by_its_labels_names_none() -> None:
    """Found by ``appName``: a Deployment labelled later would be a new input no version read shows."""
    release = builders.release()
    del release["spec"]["targetRef"]
    release["spec"]["appName"] = "web"
    kube = MemoryKube(builders.stable(), builders.service(), release)
    builders.roll_out(kube)
    _, outcome = until_at_rest(kube, builders.roll_out, "Succeeded")
    assert outcome.resting is None
