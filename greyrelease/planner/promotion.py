"""Promotion: once every batch passed (or ``promote=full``), the stable Deployment rolls to the target
version, then the canary goes and the routing is reset.

In follow mode the promotion is the hold released: the Deployment controller rolls the template Git already
holds, at its own pace and to whatever size an HPA gives it, while the canary keeps its traffic; once no
pod of the old ReplicaSet is left, the traffic goes back to the (now new) stable, the canary goes and the
routing is reset. The Deployment is then what was applied to it. A rollout that does not complete (the
Deployment controller reports ProgressDeadlineExceeded) fails the release, its canary removed."""

from __future__ import annotations

from greyrelease.api.release import GreyReleaseSpec, Outcome, Phase, Restore
from greyrelease.planner import follow
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import (
    DeleteCanary,
    EnsureCanary,
    ReleaseHold,
    ResetRouting,
    RestoreStableSelector,
    SetStableImage,
)
from greyrelease.planner.batches import PlanError
from greyrelease.planner.images import target_image, version_of
from greyrelease.planner.observed import Workload
from greyrelease.planner.passes import CONVERGE_POLL, GO_ON, WAIT, Pass, Then
from greyrelease.planner.rollback import deadline_passed, roll_back


def _weighted(spec: GreyReleaseSpec) -> bool:
    """True when a router sets the weight explicitly (nginx, Gateway API) rather than by replicas."""
    routing = spec.traffic_routing
    return routing is not None and routing.service is None


def start_promotion(p: Pass, n: int) -> Then:
    p.end_batch()
    if p.follow:
        p.phase(
            Phase.PROMOTING,
            f"releasing the hold: the Deployment rolls {follow.named(p, p.status.restore.template or '')}",
        )
    else:
        p.phase(Phase.PROMOTING, "rolling the stable Deployment to the target version")
    p.event(R.PROMOTING, f"all {n} batches passed; promoting the stable Deployment")
    return GO_ON


def promote(p: Pass, target: Workload) -> Then:
    """Promoting: the stable Deployment rolls to the target version, then the canary goes."""
    if p.follow:
        return _promote_following(p, target)
    st = p.status
    assert st.restore.replicas is not None and st.restore.image is not None
    replicas = st.restore.replicas
    image = target_image(st.restore.image, p.version)
    waiting = f"promoting: waiting for {replicas} stable pods ready on {version_of(image)}"
    if not target.rolled_out(replicas, image):
        if target.image != image and target.settling():
            # The last batch scaled the stable down (Service mode: to nothing, all traffic on the
            # canary). Its old pods go before the new image comes: given both at once, the Deployment
            # would keep old pods serving while it rolls.
            # (The message is the one the next step shows too: no status write just for this wait.)
            p.set(message=waiting)
            p.poll(CONVERGE_POLL)
            return WAIT
        if target.image != image or target.replicas != replicas:
            # The narrowing of the stable Service goes first: the stable's new pods must get traffic.
            p.act(RestoreStableSelector(), SetStableImage(image, replicas))
        deadline = p.deadline(st.phase_started_at)
        if p.now >= deadline:
            return deadline_passed(p, f"promotion: {target.ready}/{replicas} stable pods ready on {image}")
        p.set(message=waiting)
        p.at(deadline)
        p.poll(CONVERGE_POLL)
        return WAIT
    if _remove_canary(p) is WAIT:
        return WAIT
    p.ended(Outcome.SUCCEEDED, f"{st.target_name} runs {image}")
    p.set(
        stable_version=version_of(image),
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=replicas,
        restore=Restore(),
    )
    p.phase(Phase.SUCCEEDED, f"{st.target_name} runs {image} on {replicas} replicas")
    p.event(R.SUCCEEDED, f"released {image} to {st.target_name}")
    return WAIT


def _remove_canary(p: Pass) -> Then:
    """The stable carries the release: traffic back to it, then the canary goes; the routing is reset only
    once the canary's pods are gone (GO_ON then). In Service mode there is no weight to move: weight 0
    would narrow the Service to the old stable ReplicaSet, which no longer has pods."""
    if p.world.canary is not None:
        if _weighted(p.spec):
            p.set_weight(0)
        p.act(DeleteCanary())
        p.set(message="promoted: removing the canary", canary_weight=0)
        p.poll(CONVERGE_POLL)
        return WAIT
    p.act(ResetRouting())
    return GO_ON


def _keep_share(p: Pass, target: Workload, digest: str) -> None:
    """While the Deployment controller rolls, the canary keeps its traffic, so it keeps its share of the
    stable's replicas now, as during the batches: an HPA that scales the Deployment mid-rollout (it counts
    the canary's pods too, which carry the stable's labels) resizes the canary with it. Left as it is, a
    canary that carries all the traffic (a last batch at 100 % in the nginx and Gateway API modes) would
    stay at the size of the load before. The share is that of the batch the promotion started from (the
    last, or the one promote=full was given at); nothing without a canary (promote=full after an abort)."""
    st, canary = p.status, p.world.canary
    if canary is None or canary.deleting or p.world.own_canary is None or st.current_batch < 1:
        return
    try:
        steps = p.steps(target.replicas)
    except PlanError:
        return  # (scaled to 0: the canary keeps its size rather than being planned from nothing)
    step = steps[min(st.current_batch, len(steps)) - 1]
    if canary.replicas != step.canary_replicas:
        p.act(EnsureCanary(replicas=step.canary_replicas, template=digest))
    sizes = (step.canary_replicas, step.stable_replicas, step.weight)
    if (st.canary_replicas, st.stable_replicas, st.canary_weight) != sizes:
        p.set(canary_replicas=step.canary_replicas, stable_replicas=step.stable_replicas, canary_weight=step.weight)


def _promote_following(p: Pass, target: Workload) -> Then:
    """Follow mode: the hold released, the native rollout waited for with the canary keeping its traffic
    (and its share of the stable's replicas, :func:`_keep_share`), then the canary removed and the routing
    reset. A rollout that does not complete fails the release (:func:`_rollout_stalled`)."""
    st = p.status
    digest = st.restore.template or target.digest
    if target.is_held and target.digest == digest:
        # The stable Service's narrowing goes first (nginx, Gateway API): the stable's new pods must get
        # traffic once the canary's is taken back.
        p.act(RestoreStableSelector(), ReleaseHold(target.held))
    target = p.world.target or target
    if not target.rolled_out_template(digest):
        stalled = _stalled(p, target, digest)
        if stalled:
            return _rollout_stalled(p, stalled)
        _keep_share(p, target, digest)
        # (The message counts no pods: it would cost a status write per pod.)
        p.set(
            message=f"promoting: waiting for Deployment {target.name} to roll {follow.named(p, digest)} to all its pods"
        )
        if target.reports_timeouts():
            p.poll(CONVERGE_POLL)  # the Deployment controller says when it gives up; its condition wakes us
        else:
            p.at(p.deadline(st.phase_started_at))
            p.poll(CONVERGE_POLL)
        return WAIT
    if _remove_canary(p) is WAIT:
        return WAIT
    follow.record_stable(p, target)
    text = follow.named(p, digest)
    p.ended(Outcome.SUCCEEDED, f"{target.name} runs {text}")
    p.set(canary_weight=0, canary_replicas=0, stable_replicas=target.replicas, restore=Restore(), held=None)
    p.phase(Phase.SUCCEEDED, f"{target.name} runs {text} ({follow.what_runs(target)}) on {target.replicas} replicas")
    p.event(R.SUCCEEDED, f"released {text} to {target.name}")
    return WAIT


def _stalled(p: Pass, target: Workload, digest: str) -> str:
    """Why the rollout of ``digest`` is given up on ("" while it may still complete): the Deployment
    controller reports ProgressDeadlineExceeded (its own progressDeadlineSeconds passed without progress),
    or, for a Deployment without one it reports, the release's progressDeadlineSeconds passed since the
    hold was released."""
    rolled = f"{target.updated}/{target.replicas} pods updated"
    if reported := target.rollout_timed_out(digest):
        after = f" after its progressDeadlineSeconds, {target.progress_deadline}s" if target.progress_deadline else ""
        return (
            f"Deployment {target.name} did not roll {follow.named(p, digest)} to all its pods: {reported} "
            f"(ProgressDeadlineExceeded{after}; {rolled})"
        )
    if not target.reports_timeouts() and p.now >= p.deadline(p.status.phase_started_at):
        return (
            f"Deployment {target.name} did not roll {follow.named(p, digest)} to all its pods within the "
            f"release's progressDeadlineSeconds, {p.spec.progress_deadline_seconds}s ({rolled})"
        )
    return ""


def _rollout_stalled(p: Pass, why: str) -> Then:
    """The native rollout did not complete: the release fails (Failed, Stalled).

    What the traffic does then. The hold is released and the Deployment is half-rolled: its new ReplicaSet
    has some pods (not all ready: that is usually why it stalled), its old one the rest; the canary, built
    from the same template and judged by every batch, still has its share. Nothing of the Deployment can be
    put back (its template is Git's, and a paused or rolled-back spec is not ours to write), so the release
    ends as a rollback does in follow mode: the canary's traffic goes back to the Deployment's own pods
    (the stable Service selects all of them again since the promotion began: its narrowing to the old
    ReplicaSet, which the rollout is scaling away, is not planned again), the canary is removed and the
    routing reset. The ready pods of both templates then serve, as the Deployment controller would have them
    serve without a release, and it goes on rolling; keeping the canary instead would leave an object Git
    does not know carrying traffic for as long as the rollout stays stuck. The release stays Failed until
    the rollout completes (then Idle) or a new template is held (a new release); the Deployment gets a
    Warning saying so."""
    p.set(stable_pod_template_hash="")
    return roll_back(p, Phase.FAILED, R.PROGRESS_DEADLINE, f"promotion: {why}")
