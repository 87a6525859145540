"""Requests that cut across the states, looked at before the state's own handler: a new targetVersion
(mid-release: traffic back to the stable, then batch 1 of it; after the end: a fresh release), a retry
(``greyrelease.io/retry`` after Aborted or Failed) and an abort (``greyrelease.io/abort``: a rollback,
or the end before anything was changed).

**Pinned mode** (``targetVersion`` set) consumes its requests: an abort, a retry or a promote honoured is
removed from the object before what it did is recorded, so a controller that dies in between drops the
request rather than applying it twice. That is the behaviour releases pinned to a version always had, and
it stays: such a GreyRelease is edited by a person or a pipeline, and its annotations are theirs to write
once.

**Follow mode** (no ``targetVersion``) releases what Git applies to a Deployment, and Git (Argo CD with
selfHeal, Flux) often manages the GreyRelease too: whatever annotation the controller removed, a sync puts
back if Git declares it, and a removal is a write to a field another owner declares. A consumed
``promote=next`` put back by a sync would approve the next batch too, and the one after. So in follow mode
the controller removes no annotation, ever, and instead records every request it saw in the status
(``status.requests``, :mod:`.asks`). The rules:

1. **A request is a value.** Each request annotation has one record: the value last seen, the release it is
   for, what it did. A value that differs from the record is a new request; the same value, re-applied by
   every sync, is the same request, and what it did is done. (Removing the annotation drops its record, so
   writing it again later is new.) Whatever follows an ``@`` in a value only makes it new:
   ``true@2026-03-01T10:00:00Z`` asks what ``true`` asks. ``kubectl gr`` writes such values (the batch, a
   time), so each of its commands is a new request even when the annotation had the same word.
2. **A request is for the release it was first seen with**: the template under way, or held and waiting
   (to start, or after an abort or failure), when its value was first seen; it never acts on another. A
   left-over ``abort=true`` of an aborted release does not abort the next template's release; an approval
   of batch 2 of one template does not approve batch 2 of the template that supersedes it. A retry starts
   a new attempt: what waited for the attempt before is dropped, and so is what waited for a release that
   rolls back or ends.
3. **Honoured once, recorded in the same status write as its effect.** A pass killed before its status
   write recorded nothing, so the next pass sees the same value as new and plans the same thing again
   (its actions idempotent, its Events named after the transition): nothing is dropped, nothing done twice.
4. **An abort acts at once** (the pass that first sees it cuts the traffic, as in pinned mode), or is
   recorded as doing nothing: before the release changed anything it ends it as Aborted, during the
   promotion it is refused as too late, at rest there is nothing to abort.
5. **An approval names its batch**: ``promote: "N"`` lets batch N of the release go on, once it is live
   (its canary ready and its traffic set): its pause ends there, manual or timed, and batch N+1 begins (or
   the promotion, after the last). A failed gate still rolls back first. N is the batch ``kubectl get gr``
   shows as current while it waits, and what ``kubectl gr promote`` writes. An approval of a batch the
   release has not reached yet **waits** for it, recorded as waiting (Git can approve ahead); one of a batch
   passed already, or beyond the last, is refused with a Warning. ``promote: next`` is the batch current
   when it is first seen; ``promote: full`` waits until a batch is live (then the promotion starts at once)
   or, after an abort or a failure, accepts the held template without a canary. Each honoured approval is
   in ``status.approvals`` (batch, template, value, time), kept for the release under way.
6. **A retry** after Aborted or Failed releases the held template again from batch 1; one seen while the
   release rolls back waits for it to end; one seen otherwise does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from greyrelease.api.release import (
    ABORT_ANNOTATION,
    BATCH_PHASES,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    BatchState,
    BatchTimes,
    Outcome,
    Phase,
    Restore,
    fmt_time,
)
from greyrelease.planner import asks, follow
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import RemoveAnnotations, RestoreStableSelector, SetStableImage
from greyrelease.planner.asks import Ask, word
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
    return word(value) in TRUTHY


def aborting(annotations: Mapping[str, str], phase: str | None, seen: Mapping[str, str] | None = None) -> bool:
    """Whether the next pass of a release in this phase, with these annotations, rolls it back for an
    abort (and so cuts its traffic). ``seen``: follow mode, the value of each request annotation the status
    records (``status.requests``); an abort whose value is recorded there was acted on already."""
    value = annotations.get(ABORT_ANNOTATION)
    if seen is not None and value is not None and seen.get(ABORT_ANNOTATION) == value:
        return False
    return phase in ABORTABLE and _truthy(value)


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
    mid-release supersedes it; then the requests, as the module's docstring says: a new abort rolls back
    (refused once the promotion has released the hold: too late, the Deployment controller is rolling it),
    a new promote or retry is recorded (it may wait); after an abort or a failure, a retry waiting for the
    release releases the held template again, and ``promote=full`` accepts it without a canary."""
    asks.tidy(p)
    st, target = p.status, p.world.target
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
    abort = asks.read(p, ABORT_ANNOTATION)
    if abort is not None and abort.new:
        then = _abort_asked(p, abort)
        if then is not None:
            return then
    promote = asks.read(p, PROMOTE_ANNOTATION)
    if promote is not None and promote.new:
        _promote_seen(p, promote)
    retry = asks.read(p, RETRY_ANNOTATION)
    if retry is not None and retry.new:
        _retry_seen(p, retry)
    if p.status.phase in (Phase.ABORTED, Phase.FAILED):
        if asks.waiting(p, RETRY_ANNOTATION) is not None:
            return _retry
        if target is not None and follow.reverted(target):
            return _revert
        full = asks.waiting(p, PROMOTE_ANNOTATION)
        if full is not None and word(full.value) == "full" and target is not None and follow.pending(target):
            return _accept
    return None


def _abort_asked(p: Pass, abort: Ask) -> Callable[[Pass], Then] | None:
    """A new abort: what it does now (it never waits)."""
    st, phase = p.status, p.status.phase
    if not _truthy(abort.value):
        asks.note(p, abort.record, "nothing asked (not true)")
        return None
    if phase in (None, Phase.WAITING, Phase.QUEUED) and not started(st) and p.world.canary is None:
        if not abort.record.template:
            asks.note(p, abort.record, "ignored: no release under way")
            return None
        asks.note(p, abort.record, "aborted before the release started")
        return _abort_before_start
    if phase == Phase.PROMOTING:
        asks.note(p, abort.record, "refused: the hold was released, too late to abort")
        return _too_late
    if phase in ABORTABLE:
        asks.note(p, abort.record, f"aborted at batch {st.current_batch}" if st.current_batch else "aborted")
        return _abort
    asks.note(p, abort.record, f"ignored: nothing to abort ({phase.value if phase else 'not started'})")
    return None


def _promote_seen(p: Pass, promote: Ask) -> None:
    """A new promote, first seen: bound to the release under way, recorded as waiting (for its batch, or
    for a batch to be live) or refused with a Warning."""
    st, rec, what = p.status, promote.record, promote.word
    at_batch = st.phase in BATCH_PHASES and st.current_batch >= 1
    refused = ""
    if not rec.template:
        refused = "no release under way"
    elif what == "full":
        if st.phase in (Phase.PROMOTING, Phase.SUCCEEDED, Phase.IDLE):
            refused = "the release is promoting already"
        else:
            asks.note(p, rec, "waits for a live batch to promote in full", done=False)
            return
    elif what == "next" or what.isdigit():
        n = int(what) if what.isdigit() else st.current_batch
        passed = n < st.current_batch or (n == st.current_batch and st.batch_state == BatchState.DONE)
        if what == "next" and not at_batch:
            refused = "next names the batch under way, and none is: write the batch number"
        elif n < 1 or (st.total_batches and n > st.total_batches):
            refused = f"there is no batch {n} (the release has {st.total_batches or 'its'} batches)"
        elif passed and at_batch:
            refused = f"batch {n} passed already (the release is at batch {st.current_batch})"
        elif st.phase in (Phase.PROMOTING, Phase.ROLLING_BACK) or st.phase in (Phase.ABORTED, Phase.FAILED):
            refused = f"the release is {st.phase.value}"
        else:
            asks.note(p, rec, f"waits for batch {n} to be live", done=False, batch=n)
            return
    else:
        refused = "use the batch number, next or full"
    asks.note(p, rec, f"refused: {refused}")
    p.event(R.INVALID_SPEC, f"ignored greyrelease.io/promote={promote.value!r}: {refused}", warning=True)


def _retry_seen(p: Pass, retry: Ask) -> None:
    """A new retry, first seen: it waits for the release to be Aborted or Failed (honoured in this pass
    when it is, or once the rollback under way ends); otherwise it does nothing."""
    phase = p.status.phase
    if retry.record.template and phase in (Phase.ABORTED, Phase.FAILED, Phase.ROLLING_BACK):
        asks.note(p, retry.record, "waits for the release to be Aborted or Failed", done=False)
        return
    why = f"a retry restarts an Aborted or Failed release; this one is {phase.value if phase else 'not started'}"
    asks.note(p, retry.record, f"ignored: {why}")
    p.event(R.INVALID_SPEC, f"ignored greyrelease.io/retry={retry.value!r}: {why}", warning=True)


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
    why = f"{follow.what_is_held(target)} superseded {follow.named(p, st.restore.template or '')}"
    if st.phase == Phase.PROMOTING:
        p.set(stable_pod_template_hash="")
    else:
        p.set_weight(0)
    p.ended(Outcome.SUPERSEDED, why)
    p.event(R.SUPERSEDED, f"{why}: restarting at batch 1")
    # The release is of the new template from now on (its canary and routing are this release's to remove;
    # the approvals were the old one's).
    p.set(history=[], metrics=[], approvals=[], canary_weight=0, restore=Restore(template=target.digest))
    p.phase(Phase.INITIALIZING, f"restarting for {follow.what_is_held(target)}")
    p.again(0)
    return WAIT


def _retry(p: Pass) -> Then:
    """Retry after Aborted or Failed: the held template released again from batch 1, a new attempt (an
    approval that waited for the attempt before is dropped)."""
    retry = asks.waiting(p, RETRY_ANNOTATION)
    assert retry is not None
    asks.drop_waiting(p, PROMOTE_ANNOTATION, "the release was retried")
    held = p.status.held
    p.event(R.RETRIED, f"retrying the release of {follow.named(p, held.digest) if held else '(no template held)'}")
    asks.note(p, retry, "retried from batch 1")
    fresh(p)
    p.set(restore=Restore())
    return start(p)


def _accept(p: Pass) -> Then:
    """``promote=full`` after Aborted or Failed: the held template accepted without a canary (the hold
    released; the Deployment controller rolls it)."""
    target, phase = p.world.target, p.status.phase
    full = asks.waiting(p, PROMOTE_ANNOTATION)
    assert target is not None and phase is not None and full is not None
    asks.note(p, full, f"accepted without a canary after {phase.value}")
    fresh(p)
    p.set(restore=Restore(template=target.digest), last_promotion=f"full after {phase.value} {fmt_time(p.now)}")
    follow.record_held(p, target)
    p.event(R.PROMOTED, f"promote=full after {phase.value}: {follow.what_is_held(target)} released without a canary")
    p.phase(Phase.PROMOTING, f"releasing the hold of {follow.what_is_held(target)}: no canary")
    return GO_ON


def _too_late(p: Pass) -> Then:
    """An abort during a follow-mode promotion: the hold is released and the Deployment controller rolls the
    template; nothing takes it back but a revert of the template."""
    p.event(
        R.ABORTED,
        f"abort ignored: the hold of {follow.named(p, p.status.restore.template or '')} is released and the Deployment "
        "controller is rolling it; revert the template to go back",
        warning=True,
    )
    return GO_ON
