"""At rest: Succeeded, Aborted, Failed, Idle. Pinned mode waits there until the spec or an annotation
changes (those are requests, :mod:`.requests`). In follow mode a release at rest goes on following its
Deployment: the enrolment label put back when it went, ``status.stable`` kept to the ReplicaSet the pods
run, a hold of the very template that runs released (no pod restarts), and a new template held started as
a release (:func:`~greyrelease.planner.start.start`: governance first, then batch 1)."""

from __future__ import annotations

from greyrelease.api.release import BatchTimes, Phase
from greyrelease.planner import follow
from greyrelease.planner import reasons as R
from greyrelease.planner.passes import WAIT, Pass, Then
from greyrelease.planner.start import start


def finished(p: Pass) -> Then:
    """Succeeded, Aborted, Failed (pinned: nothing to do until the spec or an annotation changes), Idle."""
    if not p.follow:
        return WAIT
    target = p.world.target
    if target is None or follow.foreign(p, target):
        return start(p)  # InvalidSpec, naming what is wrong
    follow.enrol(p, target)
    follow.record_stable(p, target)
    phase, held = p.status.phase, p.status.held
    if follow.pending(target):
        # Aborted or failed, the template stays held until someone acts; a new one is a new release.
        stuck = phase in (Phase.ABORTED, Phase.FAILED) and held is not None and held.digest == target.digest
        if not stuck:
            return begin(p)
    if follow.reverted(target):
        follow.release_hold(p, target)
        p.event(R.HOLD_RELEASED, f"{follow.what_is_held(target)} is the one {target.name} runs: hold released")
    if phase in (Phase.ABORTED, Phase.FAILED) and not target.is_held and not follow.rolling(target):
        # Nothing is held any more (a revert, or someone lifted the hold) and the Deployment runs its
        # template on every pod (a stalled rollout completed after all): nothing is stuck either.
        p.set(held=None)
        p.phase(Phase.IDLE, follow.at_rest(target))
    elif phase == Phase.IDLE and p.status.message != follow.at_rest(target):
        p.phase(Phase.IDLE, follow.at_rest(target))
    return WAIT


def begin(p: Pass) -> Then:
    """Follow mode: a new template is held: a fresh release of it. An abort or a retry left on the object
    was for the release before (:mod:`.requests`): it stays, and does nothing to this one."""
    fresh(p)
    return start(p)


def fresh(p: Pass) -> None:
    """The status of a release that starts afresh: nothing of the one before but what it ended as."""
    p.set(
        stable_pod_template_hash="",
        current_batch=0,
        total_batches=0,
        history=[],
        metrics=[],
        webhooks=[],
        batch_times=BatchTimes(),
        last_promotion="",
        approvals=[],
        end_phase=None,
    )
