"""Requests that cut across the states, looked at before the state's own handler: a new targetVersion
(mid-release: traffic back to the stable, then batch 1 of it; after the end: a fresh release), a retry
(``greyrelease.io/retry`` after Aborted or Failed) and an abort (``greyrelease.io/abort``: a rollback,
or the end before anything was changed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from greyrelease.api.release import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    BatchTimes,
    Outcome,
    Phase,
    Restore,
    fmt_time,
)
from greyrelease.planner import follow
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import RemoveAnnotations, RestoreStableSelector, SetStableImage
from greyrelease.planner.passes import GO_ON, WAIT, Pass, Then, started
from greyrelease.planner.rest import fresh
from greyrelease.planner.rollback import roll_back
from greyrelease.planner.start import start

TRUTHY = {"true", "yes", "1", "y", "on"}

#: The phases an abort (or a new targetVersion) rolls back from.
ABORTABLE = frozenset(
    {Phase.INITIALIZING, Phase.WAITING, Phase.QUEUED, Phase.PROGRESSING, Phase.PAUSED, Phase.PROMOTING}
)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in TRUTHY


def aborting(annotations: Mapping[str, str], phase: str | None) -> bool:
    """Whether the next pass of a release in this phase, with these annotations, rolls it back for an
    abort (and so cuts its traffic)."""
    return phase in ABORTABLE and _truthy(annotations.get(ABORT_ANNOTATION))


def request(p: Pass) -> Callable[[Pass], Then] | None:
    """What a request that cuts across the states (a new version, a retry, an abort) does first; None
    when there is none and the state's own handler runs."""
    if p.follow:
        return _following(p)
    st, ann = p.status, p.world.annotations
    phase = st.phase
    if st.restore.template is not None and phase in ABORTABLE:
        return _unfollow
    new_version = phase is not None and st.target_version not in ("", p.version)
    if phase in (Phase.SUCCEEDED, Phase.ABORTED, Phase.FAILED) and (
        new_version or (phase != Phase.SUCCEEDED and RETRY_ANNOTATION in ann)
    ):
        return _start_over
    if phase in (None, Phase.WAITING, Phase.QUEUED) and not started(st) and p.world.canary is None:
        # Nothing changed yet: an abort ends it as it is; a new version is just what it will start with.
        return _abort_before_start if _truthy(ann.get(ABORT_ANNOTATION)) else None
    if new_version and phase in ABORTABLE:
        return _restart
    if aborting(ann, phase):
        return _abort
    return None


def _start_over(p: Pass) -> Then:
    """A new version, or a retry, starts a fresh release; the sticky abort is consumed with it."""
    retry = p.status.target_version in ("", p.version)
    p.act(RemoveAnnotations((ABORT_ANNOTATION, RETRY_ANNOTATION)))
    if retry:
        p.event(R.RETRIED, f"retrying the release of {p.version}")
    p.set(
        restore=Restore(),
        stable_pod_template_hash="",
        current_batch=0,
        total_batches=0,
        history=[],
        metrics=[],
        batch_times=BatchTimes(),
        last_promotion="",
        end_phase=None,
    )
    return start(p)


def _restart(p: Pass) -> Then:
    """A new targetVersion mid-release: traffic back to stable, then batch 1 of the new version."""
    old = p.status.target_version
    target, restore = p.world.target, p.status.restore
    p.set_weight(0)
    if target is not None and restore.image and restore.replicas is not None and target.image != restore.image:
        p.act(RestoreStableSelector(), SetStableImage(restore.image, restore.replicas))
    p.event(R.RESTARTED, f"targetVersion changed from {old} to {p.version}: restarting at batch 1")
    p.set(history=[], metrics=[])
    p.phase(Phase.INITIALIZING, f"restarting for {p.version}")
    p.set(target_version=p.version)
    p.again(0)
    return WAIT


def _abort_before_start(p: Pass) -> Then:
    p.set(target_version=p.version)
    why = "aborted before it started; nothing was changed"
    p.ended(Outcome.ABORTED, why)
    p.phase(Phase.ABORTED, follow.stuck(p, p.world.target, why) if p.follow else why)
    p.event(R.ABORTED, "aborted before the release started", warning=True)
    return WAIT


def _abort(p: Pass) -> Then:
    return roll_back(p, Phase.ABORTED, R.ABORTED, "aborted by annotation")


def _unfollow(p: Pass) -> Then:
    """targetVersion set while a follow-mode release was under way: that release rolls back first."""
    return roll_back(p, Phase.ABORTED, R.ABORTED, "spec.targetVersion set during a follow-mode release: rolled back")


# --- follow mode ------------------------------------------------------------------------------------


def _following(p: Pass) -> Callable[[Pass], Then] | None:
    """Follow mode: what the Deployment's template and the annotations ask for before the state's own
    handler. A revert (the template held is the one that runs) ends a release as Reverted; a new template
    mid-release supersedes it; after an abort or a failure, a retry releases the held template again and
    ``promote=full`` accepts it without a canary; an abort rolls back, except once the promotion has
    released the hold (too late: the Deployment controller is rolling it)."""
    st, ann, target = p.status, p.world.annotations, p.world.target
    phase = st.phase
    if st.restore.replicas is not None and phase in ABORTABLE:
        return _unpin
    if target is not None and phase in ABORTABLE:
        if not target.enrolled:
            follow.enrol(p, target)
        if follow.reverted(target) and (started(st) or st.held is not None):
            return _revert
        if started(st) and target.is_held and target.digest != st.restore.template:
            return _supersede
    if phase in (Phase.ABORTED, Phase.FAILED):
        if RETRY_ANNOTATION in ann:
            return _retry
        if target is not None and follow.reverted(target):
            return _revert
        promote = ann.get(PROMOTE_ANNOTATION, "").strip().lower()
        if promote == "full" and target is not None and follow.pending(target):
            return _accept
    if phase in (None, Phase.WAITING, Phase.QUEUED) and not started(st) and p.world.canary is None:
        return _abort_before_start if _truthy(ann.get(ABORT_ANNOTATION)) else None
    if aborting(ann, phase):
        return _too_late if phase == Phase.PROMOTING else _abort
    return None


def _unpin(p: Pass) -> Then:
    """targetVersion removed while a pinned release was under way: it rolls back (putting the stable
    back as it was) before the Deployment is followed."""
    return roll_back(
        p, Phase.ABORTED, R.ABORTED, "spec.targetVersion removed during a pinned release: rolled back before following"
    )


def _revert(p: Pass) -> Then:
    """The Deployment holds the very template it runs (a revert in Git): the release ends as Reverted, the
    hold released (no pod restarts: the Deployment controller finds that template's ReplicaSet)."""
    target = p.world.target
    assert target is not None
    why = f"Deployment {target.name} was reverted to the template it runs ({follow.what_runs(target)})"
    if started(p.status):  # routing prepared, a canary perhaps: cut, then removed (RollingBack)
        return roll_back(p, Phase.IDLE, R.REVERTED, why, warning=False)
    follow.release_hold(p, target)
    p.ended(Outcome.REVERTED, why)
    p.set(held=None, restore=Restore(), end_phase=None)
    p.phase(Phase.IDLE, follow.at_rest(target))
    p.event(R.REVERTED, f"{why}: hold released")
    return WAIT


def _supersede(p: Pass) -> Then:
    """A new template held mid-release: traffic back to the stable, then batch 1 of the new template (as a
    new targetVersion in pinned mode). Once the promotion has released the hold, the Deployment controller
    has started rolling the old one: there is no traffic to take back from the stable then."""
    st, target = p.status, p.world.target
    assert target is not None
    why = f"{follow.what_is_held(target)} superseded template {st.restore.template}"
    if st.phase == Phase.PROMOTING:
        p.set(stable_pod_template_hash="")
    else:
        p.set_weight(0)
    p.ended(Outcome.SUPERSEDED, why)
    p.event(R.SUPERSEDED, f"{why}: restarting at batch 1")
    # The release is of the new template from now on (its canary and routing are this release's to remove).
    p.set(history=[], metrics=[], canary_weight=0, restore=Restore(template=target.digest))
    p.phase(Phase.INITIALIZING, f"restarting for template {target.digest}")
    p.again(0)
    return WAIT


def _retry(p: Pass) -> Then:
    """Retry after Aborted or Failed: the held template released again from batch 1."""
    p.act(RemoveAnnotations(tuple(k for k in (ABORT_ANNOTATION, RETRY_ANNOTATION) if k in p.world.annotations)))
    held = p.status.held
    p.event(R.RETRIED, f"retrying the release of template {held.digest if held else '(none held)'}")
    fresh(p)
    p.set(restore=Restore())
    return start(p)


def _accept(p: Pass) -> Then:
    """``promote=full`` after Aborted or Failed: the held template accepted without a canary (the hold
    released; the Deployment controller rolls it)."""
    target, phase = p.world.target, p.status.phase
    assert target is not None and phase is not None
    keys = (PROMOTE_ANNOTATION, ABORT_ANNOTATION, RETRY_ANNOTATION)
    p.act(RemoveAnnotations(tuple(k for k in keys if k in p.world.annotations)))
    fresh(p)
    p.set(restore=Restore(template=target.digest), last_promotion=f"full after {phase.value} {fmt_time(p.now)}")
    follow.record_held(p, target)
    p.event(R.PROMOTED, f"promote=full after {phase.value}: {follow.what_is_held(target)} released without a canary")
    p.phase(Phase.PROMOTING, f"releasing the hold of template {target.digest}: no canary")
    return GO_ON


def _too_late(p: Pass) -> Then:
    """An abort during a follow-mode promotion: the hold is released and the Deployment controller rolls the
    template; nothing takes it back but a revert of the template."""
    p.act(RemoveAnnotations((ABORT_ANNOTATION,)))
    p.event(
        R.ABORTED,
        f"abort ignored: the hold of template {p.status.restore.template} is released and the Deployment "
        "controller is rolling it; revert the template to go back",
        warning=True,
    )
    return GO_ON
