"""Rolling back, and deletion: the traffic back to the stable at once, then the app put back as it was
before the release (the stable's image and size, the canary removed, the routing reset).

In follow mode nothing of the Deployment is put back (it was never written): the canary goes, the routing
is reset, and the template stays held (Aborted, Failed: Stalled, the message naming the ways out), unless
it is the one that runs (a revert: the hold released, Idle). A deletion hands the Deployment back: the hold
released (the Deployment controller then rolls the template as it is), the enrolment label removed."""

from __future__ import annotations

from datetime import datetime

from greyrelease.api.release import PROMOTE_ANNOTATION, Outcome, Phase, Restore
from greyrelease.planner import asks, follow
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import DeleteCanary, ResetRouting, SetStableImage, Unenrol
from greyrelease.planner.passes import CONVERGE_POLL, WAIT, Pass, Then, started

#: The outcome of a rollback that ends in this phase.
OUTCOMES = {Phase.ABORTED: Outcome.ABORTED, Phase.FAILED: Outcome.FAILED, Phase.IDLE: Outcome.REVERTED}


def deadline_passed(p: Pass, what: str) -> Then:
    """``progressDeadlineSeconds`` passed before ``what`` got better: the release fails."""
    seconds = p.spec.progress_deadline_seconds
    return roll_back(p, Phase.FAILED, R.PROGRESS_DEADLINE, f"{what} after {seconds}s (progressDeadlineSeconds)")


def roll_back(p: Pass, end: Phase, reason: str, message: str, *, warning: bool = True) -> Then:
    """Traffic to stable at once: the pass that decides it writes the weight, its Event and the status,
    nothing else. Putting the stable back and removing the canary follow in the next pass, which is not
    urgent: when many releases roll back at once (a burst of aborts), every one of them has its traffic
    cut before the API server is kept busy restoring capacity. In follow mode an approval that waited for
    the release is dropped with it (``promote=full`` must not accept a template whose release failed)."""
    if p.follow:
        asks.drop_waiting(p, PROMOTE_ANNOTATION, "the release rolled back")
    p.set_weight(0)
    p.set(canary_weight=0, end_phase=end)
    p.phase(Phase.ROLLING_BACK, message)
    p.event(reason, message, warning=warning)
    p.again(0)
    return WAIT


def _restore(p: Pass, since: datetime) -> bool:
    """Put the app back as it was before the release: no traffic to the canary, the stable's image and
    size, then (once the stable is ready, or ``progressDeadlineSeconds`` after ``since``) the canary
    removed, then the routing reset. True once all is back."""
    st, world = p.status, p.world
    p.set_weight(0)
    target, restore = world.target, st.restore
    stable_ready = True
    if target is not None and restore.image and restore.replicas is not None:
        if target.image != restore.image or target.replicas != restore.replicas:
            p.act(SetStableImage(restore.image, restore.replicas))
        stable_ready = target.rolled_out(restore.replicas, restore.image)
    deadline = p.deadline(since)
    if not stable_ready and p.now < deadline:
        # Keep the canary's pods until the stable can carry the load again; they get no traffic.
        p.at(deadline)
        p.poll(CONVERGE_POLL)
        return False
    if world.own_canary is not None:
        p.act(DeleteCanary())
        p.poll(CONVERGE_POLL)
        return False
    p.act(ResetRouting())
    return True


def rolling_back(p: Pass) -> Then:
    """RollingBack: the app restored, then the phase the rollback was for (Aborted or Failed)."""
    st = p.status
    target = p.world.target
    if not _restore(p, st.phase_started_at or p.now):
        return WAIT
    p.end_batch()
    end = st.end_phase or Phase.FAILED
    if p.follow:
        return _rolled_back_following(p, end)
    p.ended(OUTCOMES.get(end, Outcome.FAILED), st.message)
    p.set(
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=st.restore.replicas or (target.replicas if target else 0),
        restore=Restore(),
        end_phase=None,
    )
    p.phase(end, f"{st.message}; stable {st.stable_version} serves all traffic")
    p.event(R.ROLLED_BACK, f"rolled back: all traffic on the stable version {st.stable_version}")
    _tell_webhooks(p)
    return WAIT


def _tell_webhooks(p: Pass) -> None:
    """The rollback is done: its post-rollback webhooks are called by the next pass (a pass calls only
    what its recorded status makes due)."""
    if p.spec.analysis is not None and p.spec.analysis.webhooks_at("post-rollback"):
        p.again(0)


def _rolled_back_following(p: Pass, end: Phase) -> Then:
    """Follow mode, the canary gone and the routing reset: the template stays held (Aborted, Failed), or,
    when it is the one that runs by now (a revert), the hold is released (Idle)."""
    st, target = p.status, p.world.target
    why = st.message
    if target is not None and follow.reverted(target):
        end = Phase.IDLE
        if st.end_phase != Phase.IDLE:
            why = f"{why}; then Deployment {target.name} was reverted to the template it runs"
        follow.release_hold(p, target)
    elif end == Phase.IDLE:
        end = Phase.FAILED if target is None else Phase.ABORTED
    p.ended(OUTCOMES[end], why)
    p.set(
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=target.replicas if target else 0,
        restore=Restore(),
        end_phase=None,
    )
    if end == Phase.IDLE:
        assert target is not None
        p.set(held=None)
        p.phase(Phase.IDLE, follow.at_rest(target))
        p.event(R.REVERTED, f"{why}: canary removed, hold released")
        return WAIT
    p.phase(end, follow.stuck(p, target, why))
    _tell_webhooks(p)
    if target is not None and follow.rolling(target):
        # A promotion whose rollout stalled: the hold is released already.
        p.event(R.ROLLED_BACK, f"canary removed: all traffic on Deployment {target.name}'s own pods, still rolling")
        return WAIT
    p.event(R.ROLLED_BACK, f"rolled back: all traffic on {follow.what_runs(target)}; the template stays held")
    return WAIT


def delete(p: Pass) -> None:
    """The GreyRelease is being deleted: leave the app as it was before the release began."""
    if p.follow:
        _hand_back(p)
        return
    if p.status.restore.replicas is None and p.world.canary is None:
        p.done = True  # nothing was changed
        return
    if _restore(p, p.world.deletion_started or p.now):
        p.event(R.CLEANED_UP, "release deleted: stable restored, canary removed")
        p.set(restore=Restore())
        p.done = True


def _hand_back(p: Pass) -> None:
    """Follow mode, the GreyRelease deleted: the Deployment handed back to Kubernetes and its owners. The
    canary's traffic cut and the canary removed first; then the routing reset, the hold released (the
    Deployment controller rolls the template it holds, without a canary: a Warning on the release and one
    on the Deployment say so) and the enrolment label removed."""
    world, target = p.world, p.world.target
    if world.own_canary is not None:
        p.set_weight(0)
        p.act(DeleteCanary())
        p.poll(CONVERGE_POLL)
        return
    if started(p.status) or world.canary is not None:
        p.act(ResetRouting())
    if target is None:
        p.event(R.HANDED_BACK, "release deleted: canary removed; the Deployment is gone", warning=True)
        p.done = True
        return
    if follow.foreign(p, target):
        p.done = True  # another release follows it: its label and hold are that release's
        return
    held = f"hold of {follow.what_is_held(target)} released: it rolls now, without a canary" if target.is_held else ""
    follow.release_hold(p, target)
    if target.enrolled == p.label:
        p.act(Unenrol(p.label))
    p.event(
        R.HANDED_BACK,
        f"release deleted: Deployment {target.name} is no longer followed (label greyrelease.io/release removed"
        + (f"; {held})" if held else "; nothing was held)"),
        warning=True,
    )
    # The same on the Deployment, where it outlives the GreyRelease: its next templates are no longer held.
    p.event(
        R.HANDED_BACK,
        f"GreyRelease {p.world.name} was deleted: this Deployment is no longer followed (label "
        "greyrelease.io/release removed), its new templates roll without a canary"
        + (f"; {held}" if held else "; nothing was held"),
        warning=True,
        about=target,
    )
    p.set(restore=Restore())
    p.done = True
