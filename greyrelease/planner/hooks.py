"""Webhook checks in the state machine: the answers of a pass folded into ``status.webhooks``, and the holds
of the points (:mod:`greyrelease.analysis.webhooks` judges; here the release waits, goes on or rolls back).

- **pre-traffic**: a batch whose canary is ready records ``batchTimes.checksSince`` and waits; the next
  passes call the webhooks; once they pass, the batch goes live (its weight set). A failed check rolls
  the release back before the canary got any of this batch's traffic.
- **live**: a live batch's checks count with its metrics (a failure rolls back; too few passing answers
  hold the batch, within ``progressDeadlineSeconds`` after its pause); a confirm holds it until its yes.
- **pre-promotion**: the last batch passed (or was approved): ``checksSince`` is recorded, and the
  promotion waits for the webhooks. ``promote=full`` goes on without them, as it goes on without the
  batches left.
- **post-rollback**: folded and told (a failed call posts a Warning), nothing else.

A confirm that holds the batch names itself in ``status.awaitingConfirmation`` (the Paused condition is
True meanwhile) and posts ``WaitingForConfirmation`` when the wait begins, ``Confirmed`` at its yes. Its
``approval.timeout`` counts from when its point began; at the timeout the release aborts
(``onTimeout: abort``, ``ApprovalExpired``) or goes on as if it had said yes (``onTimeout: promote``).
"""

from __future__ import annotations

from datetime import datetime

from greyrelease.analysis.verdicts import Verdict
from greyrelease.analysis.webhooks import (
    LIVE,
    POST_ROLLBACK,
    PRE_PROMOTION,
    PRE_TRAFFIC,
    Hold,
    confirm_deadline,
    fold,
    gate,
    next_due,
    stage,
)
from greyrelease.api.release import BatchState, CheckVerdict, Phase, Webhook, WebhookStatus, fmt_time
from greyrelease.planner import reasons as R
from greyrelease.planner.passes import WAIT, Batch, Pass, Then
from greyrelease.planner.rollback import roll_back

_WHAT = {
    PRE_TRAFFIC: "before it gets traffic",
    LIVE: "while it is live",
    PRE_PROMOTION: "before the promotion",
}


def fold_answers(p: Pass) -> None:
    """The webhook answers of this pass into ``status.webhooks``, counted at the point the release was
    at when they were asked for (the status as recorded). A failed or erred answer posts a Warning
    ``WebhookCheckFailed`` (a confirm's no does not: it is a wait, not a failure). A confirm that held
    the batch is held again by this pass's handlers or not at all (:func:`_hold_for`)."""
    if p.status.awaiting_confirmation:
        p.set(awaiting_confirmation="")
    analysis = p.spec.analysis
    if analysis is None or not p.world.answers:
        return
    at = stage(p.spec, p.status, p.now)
    if at is None:
        return
    point, since = at
    by_name = {w.name: w for w in analysis.webhooks if w.at == point}
    entries = {w.name: w for w in p.status.webhooks}
    st = p.status
    label = f"batch {st.current_batch}/{st.total_batches}: " if point != POST_ROLLBACK and st.total_batches else ""
    for answer in p.world.answers:
        webhook = by_name.get(answer.webhook)
        if webhook is None:
            continue
        folded = fold(webhook, entries.get(webhook.name), answer, since, p.now)
        entries[webhook.name] = folded
        told = folded.verdict == CheckVerdict.ERROR or (folded.verdict == CheckVerdict.FAIL and webhook.kind == "check")
        if told:
            p.event(R.WEBHOOK_CHECK_FAILED, f"{label}webhook {webhook.name} ({point}): {folded.message}", warning=True)
    p.set(webhooks=[entries[w.name] for w in analysis.webhooks if w.name in entries])


def before_traffic(p: Pass, b: Batch) -> Then | None:
    """The canary of batch ``b`` is ready: its pre-traffic webhooks first. None when they let it go live."""
    analysis = p.spec.analysis
    if analysis is None or not analysis.webhooks_at(PRE_TRAFFIC):
        return None
    since = p.status.batch_times.checks_since
    if since is None:
        # The calls are made by the next pass (a pass calls only what its recorded status makes due).
        p.times(checks_since=p.now)
        p.set(message=f"{b.label}: canary ready; calling its pre-traffic webhooks before it gets traffic")
        p.again(0)
        return WAIT
    return _settle(p, b, PRE_TRAFFIC, since)


def before_promotion(p: Pass, b: Batch, result: str) -> Then | None:
    """The last batch is done (``result``: passed, promoted...): its pre-promotion webhooks first. None when
    they let the promotion start."""
    analysis = p.spec.analysis
    if analysis is None or not analysis.webhooks_at(PRE_PROMOTION):
        return None
    since = p.status.batch_times.checks_since
    if since is None:
        p.times(checks_since=p.now)
        p.history(b.step.number, result=result)  # how the batch ended, kept for when the promotion starts
        # Approved or passed, the batch waits for no person any more.
        p.set(batch_state=BatchState.VERIFYING, message=f"{b.label} {result}; calling the pre-promotion webhooks")
        p.again(0)
        return WAIT
    return _settle(p, b, PRE_PROMOTION, since)


def promotion_waits(p: Pass, b: Batch) -> str | None:
    """While the pre-promotion webhooks hold the last batch: how that batch ended (its history's result)."""
    k = b.step.number
    if p.status.batch_times.checks_since is None or k < len(b.steps):
        return None
    return next((r.result for r in reversed(p.status.history) if r.batch == k and r.result), "passed")


def live_checks(p: Pass, metrics: Verdict) -> Verdict:
    """The metrics' verdict of a live batch with its live checks (not its confirms) judged in: a failed
    check fails it, a check not yet passed holds it as a metric does."""
    analysis = p.spec.analysis
    ready = p.status.batch_times.ready_at
    if analysis is None or ready is None or not analysis.webhooks_at(LIVE):
        return metrics
    hold = gate(analysis, p.status.webhooks, LIVE, ready, p.now)
    if p.status.batch_times.checks_since is None:
        upcoming = next_due(analysis, p.status.webhooks, LIVE, ready)
        if upcoming is not None:
            p.at(upcoming)
    if metrics.failed:
        return metrics
    if hold.failed:
        return Verdict(False, True, hold.message)
    waiting = "; ".join(m for m in (metrics.message if not metrics.passed else "", hold.message) if m)
    passed = metrics.passed and hold.checks_passed
    return Verdict(passed, False, waiting if not passed else "all metrics and webhooks pass")


def live_confirm(p: Pass, b: Batch) -> Then | None:
    """A live batch whose pause and checks are done: a live confirm that has not said yes holds it."""
    analysis = p.spec.analysis
    ready = p.status.batch_times.ready_at
    if analysis is None or ready is None or not any(w.kind == "confirm" for w in analysis.webhooks_at(LIVE)):
        return None
    hold = gate(analysis, p.status.webhooks, LIVE, ready, p.now)
    if hold.confirming is None:
        if p.recorded.awaiting_confirmation and not hold.failed:
            p.event(R.CONFIRMED, f"{b.label}: webhook {p.recorded.awaiting_confirmation} said yes")
        return None
    return _settle(p, b, LIVE, ready, hold)


def _settle(p: Pass, b: Batch, point: str, since: datetime, hold: Hold | None = None) -> Then | None:
    """Go on (None), wait, or roll back, by the webhooks of ``point``."""
    analysis = p.spec.analysis
    assert analysis is not None
    hold = hold or gate(analysis, p.status.webhooks, point, since, p.now)
    expired_now = False
    while not hold.failed and hold.expired is not None:
        expired = hold.expired
        assert expired.approval is not None
        waited = f"{b.label}: no yes from webhook {expired.name} within {expired.approval.timeout} (approval.timeout)"
        if expired.approval.on_timeout == "abort":
            return roll_back(p, Phase.ABORTED, R.APPROVAL_EXPIRED, f"{waited}: aborted")
        p.event(R.APPROVAL_EXPIRED, f"{waited}: going on (onTimeout: promote)")
        _taken_as_yes(p, expired)  # so it is not expired again: the loop ends
        expired_now = True
        hold = gate(analysis, p.status.webhooks, point, since, p.now)
    if hold.failed:
        return roll_back(p, Phase.FAILED, R.ANALYSIS_FAILED, f"{b.label}: {hold.message}")
    if hold.passed:
        if p.recorded.awaiting_confirmation and not expired_now:
            p.event(R.CONFIRMED, f"{b.label}: webhook {p.recorded.awaiting_confirmation} said yes")
        return None
    if hold.confirming is not None:
        _hold_for(p, b, hold.confirming, point, since)
    p.set(message=f"{b.label}: waiting for the webhooks {_WHAT[point]}: {hold.message}")
    upcoming = next_due(analysis, p.status.webhooks, point, since)
    if upcoming is not None:
        p.at(upcoming)
    for webhook in analysis.webhooks_at(point):
        deadline = confirm_deadline(webhook, since) if webhook.kind == "confirm" else None
        if deadline is not None and deadline > p.now:  # one past is the yes taken, or an abort, above
            p.at(deadline)
    return WAIT


def _hold_for(p: Pass, b: Batch, webhook: Webhook, point: str, since: datetime) -> None:
    p.set(awaiting_confirmation=webhook.name)
    if p.recorded.awaiting_confirmation != webhook.name:
        deadline = confirm_deadline(webhook, since)
        until = ""
        if deadline is not None and webhook.approval is not None:
            until = f" until {fmt_time(deadline)}, then {webhook.approval.on_timeout}"
        p.event(R.WAITING_FOR_CONFIRMATION, f"{b.label} waits for a yes from webhook {webhook.name} ({point}){until}")


def _taken_as_yes(p: Pass, webhook: Webhook) -> None:
    """A confirm whose wait expired with ``onTimeout: promote`` counts as having said yes."""
    entries = [e for e in p.status.webhooks if e.name != webhook.name]
    old = next((e for e in p.status.webhooks if e.name == webhook.name), None)
    yes = WebhookStatus(
        name=webhook.name,
        at=webhook.at,
        kind=webhook.kind,
        verdict=old.verdict if old else CheckVerdict.PENDING,
        code=old.code if old else None,
        value=old.value if old else None,
        message="no yes within approval.timeout: taken as yes (onTimeout: promote)",
        checked_at=p.now,
        successes=1,
        failures=old.failures if old and old.checked_at else 0,
        consecutive_errors=0,
    )
    order = [w.name for w in p.spec.analysis.webhooks] if p.spec.analysis else []
    entries.append(yes)
    entries.sort(key=lambda e: order.index(e.name) if e.name in order else len(order))
    p.set(webhooks=entries)
