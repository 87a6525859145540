"""Rolling back, and deletion: the traffic back to the stable at once, then the app put back as it was
before the release (the stable's image and size, the canary removed, the routing reset)."""

from __future__ import annotations

from datetime import datetime, timedelta

from greyrelease.api.release import Phase, Restore
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import DeleteCanary, ResetRouting, SetStableImage
from greyrelease.planner.passes import CONVERGE_POLL, WAIT, Pass, Then


def deadline_passed(p: Pass, what: str) -> Then:
    """``progressDeadlineSeconds`` passed before ``what`` got better: the release fails."""
    seconds = p.spec.progress_deadline_seconds
    return roll_back(p, Phase.FAILED, R.PROGRESS_DEADLINE, f"{what} after {seconds}s (progressDeadlineSeconds)")


def roll_back(p: Pass, end: Phase, reason: str, message: str) -> Then:
    """Traffic to stable at once: the pass that decides it writes the weight, its Event and the status,
    nothing else. Putting the stable back and removing the canary follow in the next pass, which is not
    urgent: when many releases roll back at once (a burst of aborts), every one of them has its traffic
    cut before the API server is kept busy restoring capacity."""
    p.set_weight(0)
    p.set(canary_weight=0, end_phase=end)
    p.phase(Phase.ROLLING_BACK, message)
    p.event(reason, message, warning=True)
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
        p.at(min(deadline, p.now + timedelta(seconds=CONVERGE_POLL)))
        return False
    if world.own_canary is not None:
        p.act(DeleteCanary())
        p.again(CONVERGE_POLL)
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
    p.set(
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=st.restore.replicas or (target.replicas if target else 0),
        restore=Restore(),
        end_phase=None,
    )
    p.phase(st.end_phase or Phase.FAILED, f"{st.message}; stable {st.stable_version} serves all traffic")
    p.event(R.ROLLED_BACK, f"rolled back: all traffic on the stable version {st.stable_version}")
    return WAIT


def delete(p: Pass) -> None:
    """The GreyRelease is being deleted: leave the app as it was before the release began."""
    if p.status.restore.replicas is None and p.world.canary is None:
        p.done = True  # nothing was changed
        return
    if _restore(p, p.world.deletion_started or p.now):
        p.event(R.CLEANED_UP, "release deleted: stable restored, canary removed")
        p.set(restore=Restore())
        p.done = True
