"""Requests that cut across the states, looked at before the state's own handler: a new targetVersion
(mid-release: traffic back to the stable, then batch 1 of it; after the end: a fresh release), a retry
(``greyrelease.io/retry`` after Aborted or Failed) and an abort (``greyrelease.io/abort``: a rollback,
or the end before anything was changed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from greyrelease.api.release import ABORT_ANNOTATION, RETRY_ANNOTATION, BatchTimes, Phase, Restore
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import RemoveAnnotations, RestoreStableSelector, SetStableImage
from greyrelease.planner.passes import WAIT, Pass, Then, started
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
    st, ann = p.status, p.world.annotations
    phase = st.phase
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
    p.phase(Phase.ABORTED, "aborted before it started; nothing was changed")
    p.event(R.ABORTED, "aborted before the release started", warning=True)
    return WAIT


def _abort(p: Pass) -> Then:
    return roll_back(p, Phase.ABORTED, R.ABORTED, "aborted by annotation")
