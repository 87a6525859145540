"""A batch under way, state by state: Upscaling (the canary grows to the batch's size, then the batch goes
live: the stable takes its size and the canary its traffic), Verifying and WaitingForApproval (its pause,
its analysis, an approval), Done (passed, the next batch waits for a release window), and Paused in any of
them. The batch arithmetic (which sizes and weights) is :mod:`.batches`."""

from __future__ import annotations

from datetime import datetime, timedelta

from greyrelease.analysis.verdicts import Verdict, fold, next_check_at
from greyrelease.analysis.verdicts import interval as analysis_interval
from greyrelease.analysis.verdicts import verdict as judge_metrics
from greyrelease.api.release import (
    PROMOTE_ANNOTATION,
    WAITING_TEXT,
    BatchState,
    CheckVerdict,
    Phase,
    fmt_time,
)
from greyrelease.planner import asks, hooks
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import RemoveAnnotations, ScaleStable
from greyrelease.planner.asks import word
from greyrelease.planner.batches import MANUAL, Approval
from greyrelease.planner.passes import CONVERGE_POLL, ENDPOINTS_POLL, GO_ON, WAIT, Batch, Pass, Then, paused
from greyrelease.planner.promotion import start_promotion
from greyrelease.planner.rollback import deadline_passed, roll_back
from greyrelease.planner.waits import hold_between, rules


def upscale(p: Pass, b: Batch) -> Then:
    """Upscaling: grow the canary to the batch's size; once it is ready, move the traffic (live)."""
    st, step, target = p.status, b.step, b.target
    k = step.number
    canary = p.world.canary
    if canary is None or canary.deleting or not (b.built(canary) and canary.converged(step.canary_replicas)):
        have = 0 if canary is None or not b.built(canary) else min(canary.ready, canary.updated)
        deadline = p.deadline(st.batch_times.started_at)
        if p.now >= deadline:
            return deadline_passed(p, f"{b.label}: {have}/{step.canary_replicas} canary pods ready")
        p.act(b.ensure_canary(step.canary_replicas, p.version))
        if not p.follow:
            # Until the new canary pods are ready the stable keeps the size of the batch before, so ready
            # pods never fall below what the user asked for. (Follow mode never scales the stable.)
            stable_before = b.steps[k - 2].stable_replicas if k > 1 else st.restore.replicas or step.stable_replicas
            if target.replicas != stable_before:
                p.act(ScaleStable(stable_before))
        # The message does not count ready pods: it would cost a status write per pod.
        p.set(message=f"{b.label}: waiting for {step.canary_replicas} canary pods to be ready")
        p.at(deadline)
        p.poll(CONVERGE_POLL)
        return WAIT
    serving = p.world.canary_endpoints
    if serving is not None and serving < step.canary_replicas and (step.weight or step.header_match):
        # Ready pods are not yet endpoints: the EndpointSlice controller lists them a moment later, and
        # a proxy answers 503 for the share it sends to a Service with none.
        deadline = p.deadline(st.batch_times.started_at)
        if p.now >= deadline:
            return deadline_passed(p, f"{b.label}: the canary Service lists {serving}/{step.canary_replicas} pods")
        p.set(message=f"{b.label}: waiting for the canary Service to list {step.canary_replicas} ready pods")
        p.at(min(deadline, p.now + timedelta(seconds=ENDPOINTS_POLL)))
        return WAIT
    held = hooks.before_traffic(p, b)
    if held is not None:
        return held
    return _go_live(p, b)


def _go_live(p: Pass, b: Batch) -> Then:
    """The canary is ready: the stable takes the batch's size and the canary the batch's traffic."""
    step, target = b.step, b.target
    if not p.follow:
        if target.replicas > step.stable_replicas and p.recorded.restore.replicas is None:
            # The stable's size before the release is known only from the status once that is written. A
            # controller killed after shrinking the stable but before the write would, on resuming, take the
            # shrunk size for the original and promote to it: the first shrink waits for the next pass.
            p.again(0)
            return WAIT
        if target.replicas != step.stable_replicas:
            p.act(ScaleStable(step.stable_replicas))
    p.set_weight(step.weight, step.header_match)
    pause = float(step.pause) if isinstance(step.pause, (int, float)) else None
    next_check = p.now + timedelta(seconds=pause) if pause is not None else None
    manual = step.pause == MANUAL
    expires = p.now + timedelta(seconds=step.approval.timeout) if manual and step.approval else None
    p.times(ready_at=p.now, next_check_at=next_check, approval_expires_at=expires, checks_since=None)
    p.set(
        batch_state=BatchState.WAITING_FOR_APPROVAL if manual else BatchState.VERIFYING,
        canary_weight=step.weight,
        canary_replicas=step.canary_replicas,
        stable_replicas=step.stable_replicas,
    )
    p.history(step.number, canary_replicas=step.canary_replicas, weight=step.weight, ready_at=p.now)
    p.event(R.BATCH_READY, f"{b.label}: {step.canary_replicas} canary pods ready, weight {step.weight}%")
    p.set(message=_hold_message(b, next_check, expires, follow=p.follow))
    if expires is not None:
        p.at(expires)
    if p.spec.analysis is not None:
        # The first check is due one interval after the batch went live, also within a long or manual pause:
        # waking only at the pause's end would let a bad canary serve, unjudged, for the whole pause.
        p.again(analysis_interval(p.spec.analysis))
    if manual:
        p.event(R.WAITING_FOR_APPROVAL, f"{b.label} waits for greyrelease.io/promote={_asked(p, b)}")
        return WAIT
    if pause is not None:
        p.again(pause)
        return WAIT
    if p.spec.analysis is None:
        return GO_ON  # neither pause nor analysis: the batch is done the moment it is live
    p.again(0)
    return WAIT


def _asked(p: Pass, b: Batch) -> str:
    """The approval a batch waits for: ``next`` in pinned mode, its number (quoted) in follow mode."""
    return f'"{b.step.number}"' if p.follow else "next"


def _hold_message(
    b: Batch, next_check: datetime | None, expires: datetime | None = None, *, follow: bool = False
) -> str:
    step = b.step
    if step.pause == MANUAL:
        until = ""
        if expires is not None and step.approval is not None:
            until = f" until {fmt_time(expires)}, then {step.approval.on_timeout}"
        asked = f'"{step.number}"' if follow else "next"
        return f"{b.label}: weight {step.weight}%, {WAITING_TEXT}{until} (annotate greyrelease.io/promote={asked})"
    if next_check:
        return f"{b.label}: weight {step.weight}%, pausing until {fmt_time(next_check)}"
    return f"{b.label}: weight {step.weight}%"


def verify(p: Pass, b: Batch) -> Then:
    """Verifying (or WaitingForApproval): the batch is live; wait for its pause, its gate or an
    approval, then move on."""
    step = b.step
    k, n = step.number, len(b.steps)
    gate = _gate(p, b)
    if gate is not None and gate.failed:
        return roll_back(p, Phase.FAILED, R.ANALYSIS_FAILED, f"{b.label}: {gate.message}")

    approved = _follow_approval(p, b) if p.follow else _pinned_approval(p, b)
    if approved is not None:
        kind, shown = approved
        p.set(last_promotion=f"{shown} at {b.label} {fmt_time(p.now)}")
        p.event(R.PROMOTED, f"promote={shown} at {b.label}")
        if kind == "full":
            p.history(k, finished_at=p.now, result="promoted (full)")
            return start_promotion(p, n)
        return _next_batch(p, b, result="promoted")
    ended = hooks.promotion_waits(p, b)
    if ended is not None:
        return _next_batch(p, b, result=ended)  # the pre-promotion webhooks hold the last batch

    times = p.status.batch_times
    if step.pause == MANUAL:
        expires = None
        if step.approval is not None:
            # Recorded when the batch went live; a timeout added to the spec meanwhile counts from then too.
            timeout = timedelta(seconds=step.approval.timeout)
            expires = times.approval_expires_at or (times.ready_at or p.now) + timeout
            if p.now >= expires:
                return _approval_expired(p, b, step.approval)
            p.at(expires)
        p.times(approval_expires_at=expires)
        p.set(batch_state=BatchState.WAITING_FOR_APPROVAL, message=_hold_message(b, None, expires, follow=p.follow))
        return WAIT
    if times.next_check_at is not None and p.now < times.next_check_at:
        p.at(times.next_check_at)
        return WAIT
    confirming = hooks.live_confirm(p, b)
    if confirming is not None:
        return confirming
    if gate is not None and not gate.passed:
        # No verdict yet (no data, or too few passing checks): wait, but not past the progress deadline.
        deadline = p.deadline(times.next_check_at or times.ready_at)
        if p.now >= deadline:
            return roll_back(
                p,
                Phase.FAILED,
                R.ANALYSIS_FAILED,
                f"{b.label}: no passing analysis within {p.spec.progress_deadline_seconds}s "
                f"(progressDeadlineSeconds): {gate.message}",
            )
        p.set(message=f"{b.label}: weight {step.weight}%, waiting for the analysis: {gate.message}")
        p.at(deadline)
        return WAIT
    return _next_batch(p, b, result="passed")


def _pinned_approval(p: Pass, b: Batch) -> tuple[str, str] | None:
    """Pinned mode: ``promote=next``, ``promote=<this batch>`` or ``promote=full`` approves the live batch
    (``next`` or ``full``, and the word as written). Consumed once: the annotation is removed before the
    step it approved is recorded, so a controller that dies in between drops the approval rather than
    applying it twice. Any other value is removed with a Warning."""
    value = p.world.annotations.get(PROMOTE_ANNOTATION)
    if value is None:
        return None
    what = word(value)
    p.act(RemoveAnnotations((PROMOTE_ANNOTATION,)))
    if what in ("next", "full") or what == str(b.step.number):
        return ("full" if what == "full" else "next", what)
    if what.isdigit():
        p.event(R.INVALID_SPEC, f"ignored greyrelease.io/promote={value!r}: the release is at {b.label}", warning=True)
    else:
        p.event(R.INVALID_SPEC, f"ignored greyrelease.io/promote={what!r}: use next or full", warning=True)
    return None


def _follow_approval(p: Pass, b: Batch) -> tuple[str, str] | None:
    """Follow mode: the approval waiting for the release under way, when it is of this batch (or ``full``):
    honoured, and recorded (``status.requests``, ``status.approvals``); the annotation stays (see
    :mod:`.requests`)."""
    rec = asks.waiting(p, PROMOTE_ANNOTATION)
    if rec is None:
        return None
    k = b.step.number
    if word(rec.value) == "full":
        asks.approve(p, rec, k, f"promoted in full at {b.label}")
        return ("full", "full")
    if rec.batch == k:
        asks.approve(p, rec, k, f"approved {b.label}")
        return ("next", str(k))
    return None


def _approval_expired(p: Pass, b: Batch, approval: Approval) -> Then:
    """Nobody approved the batch within ``approval.timeout``: abort, or go on as if approved."""
    waited = f"{b.label}: no approval within {approval.timeout:g}s (approval.timeout)"
    if approval.on_timeout == "abort":
        return roll_back(p, Phase.ABORTED, R.APPROVAL_EXPIRED, f"{waited}: aborted")
    p.event(R.APPROVAL_EXPIRED, f"{waited}: going on (onTimeout: promote)")
    return _next_batch(p, b, result="approval expired, promoted")


def _gate(p: Pass, b: Batch) -> Verdict | None:
    """Fold this pass's metric checks into the status and judge the batch; None without analysis."""
    analysis = p.spec.analysis
    if analysis is None:
        return None
    metrics = {m.name: m for m in p.status.metrics}
    by_name = {m.name: m for m in analysis.metrics}
    for check in p.world.checks:
        metric = by_name.get(check.metric)
        if metric is None:
            continue
        folded = fold(metric, metrics.get(metric.name), check, p.now)
        metrics[metric.name] = folded
        if folded.verdict in (CheckVerdict.FAIL, CheckVerdict.ERROR):
            p.event(R.METRIC_CHECK_FAILED, f"{b.label}: metric {metric.name}: {folded.message}", warning=True)
    ordered = [metrics[m.name] for m in analysis.metrics if m.name in metrics]
    p.set(metrics=ordered)
    if analysis.metrics:
        p.at(next_check_at(analysis, ordered, p.status.batch_times.ready_at or p.now))
    return hooks.live_checks(p, judge_metrics(analysis, ordered))


def _next_batch(p: Pass, b: Batch, *, result: str) -> Then:
    """The batch is done: on to the next one (Upscaling) once a release window lets it start, or to the
    promotion after the last (never held: the last batch already runs every replica on all the traffic)."""
    k, n = b.step.number, len(b.steps)
    if k >= n:
        held = hooks.before_promotion(p, b, result)
        if held is not None:
            return held
    p.history(k, finished_at=p.now, result=result)
    if k >= n:
        return start_promotion(p, n)
    hold = rules(p).hold(p.now)
    if hold is not None:
        return hold_between(p, b, hold)
    return _advance(p, b)


def _advance(p: Pass, b: Batch) -> Then:
    """Batch k+1 starts: the canary grows to its size (Upscaling)."""
    k, n = b.step.number, len(b.steps)
    result = next((r.result for r in reversed(p.status.history) if r.batch == k), "passed") or "passed"
    p.begin_batch(k + 1)
    p.history(k + 1, started_at=p.now)
    p.phase(Phase.PROGRESSING, f"batch {k + 1}/{n}: growing the canary")
    p.event(R.BATCH_PASSED, f"batch {k}/{n} {result}; starting batch {k + 1}/{n}")
    return GO_ON


def between(p: Pass, b: Batch) -> Then:
    """Done (Waiting, or Progressing after a pause): the batch passed; start the next one once a window
    is open. ``promote=full`` is never held; ``promote=next`` is the approval the batch already had (pinned
    mode removes it with a Warning; follow mode refused it when it first saw it, see :mod:`.requests`)."""
    if p.follow:
        rec = asks.waiting(p, PROMOTE_ANNOTATION)
        if rec is not None and word(rec.value) == "full":
            asks.approve(p, rec, b.step.number, f"promoted in full at {b.label}")
            p.set(last_promotion=f"full at {b.label} {fmt_time(p.now)}")
            p.event(R.PROMOTED, f"promote=full at {b.label}")
            return start_promotion(p, len(b.steps))
    elif PROMOTE_ANNOTATION in p.world.annotations:
        promote = word(p.world.annotations[PROMOTE_ANNOTATION])
        p.act(RemoveAnnotations((PROMOTE_ANNOTATION,)))
        if promote == "full":
            p.set(last_promotion=f"full at {b.label} {fmt_time(p.now)}")
            p.event(R.PROMOTED, f"promote=full at {b.label}")
            return start_promotion(p, len(b.steps))
        p.event(
            R.WAITING,
            f"ignored greyrelease.io/promote={promote!r}: {b.label} passed already; the next "
            "batch waits for its release window (promote=full goes on at once)",
            warning=True,
        )
    hold = rules(p).hold(p.now)
    if hold is not None:
        return hold_between(p, b, hold)
    return _advance(p, b)


def pause(p: Pass, b: Batch) -> Then:
    """A pause asked for (``spec.paused``, ``greyrelease.io/pause``) while the batch may move: Paused, the
    batch as it is."""
    if p.status.batch_state == BatchState.WAITING_FOR_APPROVAL:
        # Paused, it waits for the resume first; the wait for approval is announced again after it.
        p.set(batch_state=BatchState.VERIFYING)
    p.phase(Phase.PAUSED, f"{b.label}: paused")
    p.event(R.PAUSED, f"paused at {b.label}")
    return WAIT


def on_pause(p: Pass, b: Batch) -> Then:
    """Paused: nothing moves until the pause is lifted; then the batch goes on from where it was."""
    if paused(p.spec, p.world):
        return WAIT
    p.phase(Phase.PROGRESSING, f"{b.label}: resumed")
    p.event(R.RESUMED, f"resumed at {b.label}")
    if p.status.batch_state == BatchState.UPSCALING:
        # The deadline measures progress, and nothing was asked to progress while paused.
        p.times(started_at=p.now)
    p.again(0)
    return WAIT


def follow_size(p: Pass, b: Batch) -> None:
    """Follow mode, a batch whose canary exists: the canary is the batch's share of the stable's size now,
    up and down (an HPA's or Git's change of the stable's replicas, read every pass), and the status says
    so. (While Upscaling, :func:`upscale` asks for that size itself.)"""
    canary, step, st = p.world.canary, b.step, p.status
    if canary is None or canary.deleting:
        return
    if canary.replicas != step.canary_replicas:
        p.act(b.ensure_canary(step.canary_replicas, p.version))
    if st.batch_times.ready_at is None:
        return  # not live yet: the sizes recorded are the batch's once it is
    if (st.canary_replicas, st.stable_replicas, st.canary_weight) != (
        step.canary_replicas,
        step.stable_replicas,
        step.weight,
    ):
        p.set(canary_replicas=step.canary_replicas, stable_replicas=step.stable_replicas, canary_weight=step.weight)


def canary_lost(p: Pass, b: Batch) -> Then:
    """The canary of a live batch was deleted (by someone else): the batch is not live any more.

    Traffic goes back to what it was before this batch, and the batch is grown again at once (the stable
    keeps the previous batch's size meanwhile, see :func:`upscale`) rather than at the next batch, so
    the app never runs short of pods while a pause runs. Once the new canary is ready the batch goes live
    again with a full pause and a fresh gate; its history record is the same one. A batch that had passed
    and waited for the next one's release window (Waiting, Done) is Progressing again while it grows: the
    table has no Waiting state for a batch under way but the one between batches.
    """
    k = b.step.number
    if p.status.phase == Phase.WAITING:
        p.phase(Phase.PROGRESSING, f"{b.label}: the canary Deployment was deleted; recreating it")
    before = b.steps[k - 2] if k > 1 else None
    p.set_weight(before.weight if before else 0, before.header_match if before else None)
    p.begin_batch(k)
    p.set(canary_weight=before.weight if before else 0)
    p.event(R.CANARY_LOST, f"{b.label}: the canary Deployment was deleted; recreating it", warning=True)
    return GO_ON
