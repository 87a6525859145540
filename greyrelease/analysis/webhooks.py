"""Webhook checks, pure: an answer judged, folded into the status, the webhooks of a point judged together,
and which webhooks are due in a pass. The calls themselves are made by :mod:`greyrelease.reconcile.webhooks`.

A release reaches four points where webhooks are called (``spec.analysis.webhooks[].at``). Each point has
a start, recorded in the status, from which its calls are counted:

==============  ========================================================  ====================================
point           when                                                      counted from
==============  ========================================================  ====================================
pre-traffic     Progressing, Upscaling: the canary is ready, its traffic   ``batchTimes.checksSince``
                not yet given
live            Progressing, Verifying or WaitingForApproval               ``batchTimes.readyAt``
pre-promotion   the last batch passed (pause, metrics, live webhooks),     ``batchTimes.checksSince``
                the stable not yet promoted
post-rollback   Aborted or Failed, within progressDeadlineSeconds          ``phaseStartedAt``
==============  ========================================================  ====================================

An answer's verdict (:func:`judge`):

=========================================  ========  ===============================================
answer                                     verdict   why
=========================================  ========  ===============================================
2xx, no ``condition``                      Pass
2xx, the condition's field meets it        Pass
2xx, the field does not meet it            Fail      (a confirm's no)
2xx, the field missing, or not JSON        Error     the endpoint did not answer what was asked
4xx (but 408, 429)                         Fail      the endpoint said no (a confirm's no)
3xx                                        Error     redirects are never followed
5xx, 408, 429                              Error     the endpoint could not judge
no answer (timeout, refused), no Secret    Error
=========================================  ========  ===============================================

An error is never a pass. A ``check`` fails the release past ``failureLimit`` failed answers or at
``consecutiveErrorLimit`` errors in a row, and passes its point with ``successesRequired`` passing
answers. A ``confirm`` holds the batch while it says no (its failures are counted, never held against it),
passes at its first yes, and fails the release only at ``consecutiveErrorLimit`` errors in a row; with an
``approval`` its wait ends at ``approval.timeout`` after the point began (``onTimeout: abort | promote``).

Calls at pre-traffic, pre-promotion and post-rollback start as soon as the point begins; live ones one
``analysis.interval`` after the batch went live, as metric checks do. A webhook that has not passed its
point yet is called again every interval. A live ``check`` goes on being called while the batch is live
(a later failure still counts); a ``confirm`` is not called again after its yes; a post-rollback webhook
is called once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from greyrelease.api.release import (
    Analysis,
    BatchState,
    CheckVerdict,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Phase,
    Webhook,
    WebhookStatus,
    parse_duration,
)

PRE_TRAFFIC, LIVE, PRE_PROMOTION, POST_ROLLBACK = "pre-traffic", "live", "pre-promotion", "post-rollback"
#: The longest text of a field's value kept in the status.
VALUE_MAX = 64


@dataclass(frozen=True)
class Answer:
    """What one call of a webhook got: an HTTP status and the answer's text, or why there was none."""

    webhook: str
    code: int | None = None
    body: str = ""
    error: str = ""


@dataclass(frozen=True)
class Hold:
    """The webhooks of one point, judged together."""

    failed: bool  # one is past its failure or error limit
    message: str = ""  # why it failed, or what the point waits for
    checks_passed: bool = True  # every check of the point passed
    #: The first confirm whose yes is still awaited.
    confirming: Webhook | None = None
    #: The first confirm whose ``approval.timeout`` has run out without a yes.
    expired: Webhook | None = None

    @property
    def passed(self) -> bool:
        """Every webhook of the point passed (a confirm said yes)."""
        return not self.failed and self.checks_passed and self.confirming is None


def interval(analysis: Analysis) -> timedelta:
    return timedelta(seconds=max(parse_duration(analysis.interval), 0.1))


def stage(spec: GreyReleaseSpec, status: GreyReleaseStatus, now: datetime) -> tuple[str, datetime] | None:
    """The point the release is at, and since when; None when at none."""
    times = status.batch_times
    if status.phase == Phase.PROGRESSING:
        if status.batch_state == BatchState.UPSCALING:
            return (PRE_TRAFFIC, times.checks_since) if times.checks_since else None
        if status.batch_state in (BatchState.VERIFYING, BatchState.WAITING_FOR_APPROVAL) and times.ready_at:
            return (PRE_PROMOTION, times.checks_since) if times.checks_since else (LIVE, times.ready_at)
        return None
    ended = status.phase_started_at
    if status.phase not in (Phase.ABORTED, Phase.FAILED) or ended is None:
        return None
    # A rollback that ended long ago (a controller down that long, a webhook added since) is not told.
    return (POST_ROLLBACK, ended) if now < ended + timedelta(seconds=spec.progress_deadline_seconds) else None


def checked_since(entry: WebhookStatus | None, since: datetime) -> WebhookStatus | None:
    """The entry when it holds an answer of the point that began at ``since``, else None."""
    if entry is None or entry.checked_at is None or entry.checked_at < since:
        return None
    return entry


def next_call(webhook: Webhook, entry: WebhookStatus | None, since: datetime, every: timedelta) -> datetime | None:
    """When ``webhook`` is called next at the point that began at ``since``; None when no more."""
    got = checked_since(entry, since)
    if got is None:
        return since + every if webhook.at == LIVE else since
    assert got.checked_at is not None
    if webhook.at == POST_ROLLBACK:
        return None
    if webhook.kind == "confirm" and got.successes >= 1:
        return None
    if webhook.at != LIVE and webhook.kind == "check" and got.successes >= webhook.successes_required:
        return None
    return got.checked_at + every


def _entries(status: GreyReleaseStatus) -> dict[str, WebhookStatus]:
    return {w.name: w for w in status.webhooks}


def due(spec: GreyReleaseSpec, status: GreyReleaseStatus, now: datetime) -> tuple[Webhook, ...]:
    """The webhooks to call in this pass: those of the point the release is at whose time has come."""
    analysis = spec.analysis
    if analysis is None or not analysis.webhooks:
        return ()
    at = stage(spec, status, now)
    if at is None:
        return ()
    point, since = at
    entries, every = _entries(status), interval(analysis)
    out = []
    for webhook in analysis.webhooks_at(point):
        when = next_call(webhook, entries.get(webhook.name), since, every)
        if when is not None and now >= when:
            out.append(webhook)
    return tuple(out)


def next_due(analysis: Analysis, statuses: list[WebhookStatus], point: str, since: datetime) -> datetime | None:
    """When the next webhook of ``point`` is to be called; None when none is."""
    entries, every = {w.name: w for w in statuses}, interval(analysis)
    times = [next_call(w, entries.get(w.name), since, every) for w in analysis.webhooks_at(point)]
    return min((t for t in times if t is not None), default=None)


# --- one answer --------------------------------------------------------------------------------------


def lookup(doc: Any, path: str) -> tuple[bool, Any]:
    """The value at ``path`` (keys joined by dots, a number for a list's item); (False, None) if absent."""
    node = doc
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _shown(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= VALUE_MAX else text[: VALUE_MAX - 1] + "…"


def _equal(value: Any, expected: str) -> bool:
    if isinstance(value, bool):
        return expected.strip().lower() == ("true" if value else "false")
    if value is None:
        return expected.strip() == "null"
    if isinstance(value, int | float):
        try:
            return float(expected) == float(value)
        except ValueError:
            return False
    return isinstance(value, str) and value == expected


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return None if math.isnan(number) else number


def judge(webhook: Webhook, answer: Answer) -> tuple[CheckVerdict, str | None, str]:
    """The verdict of one answer, the condition's field as found (JSON text), and why."""
    if answer.error:
        return CheckVerdict.ERROR, None, answer.error
    code = answer.code or 0
    if 300 <= code < 400:
        return CheckVerdict.ERROR, None, f"answered {code}: redirects are not followed"
    if code >= 500 or code in (408, 429):
        return CheckVerdict.ERROR, None, f"answered {code}"
    if not 200 <= code < 300:
        return CheckVerdict.FAIL, None, f"answered {code}"
    cond = webhook.condition
    if cond is None:
        return CheckVerdict.PASS, None, f"answered {code}"
    try:
        doc = json.loads(answer.body)
    except ValueError:
        return CheckVerdict.ERROR, None, f"answered {code} without JSON (condition on {cond.field})"
    found, value = lookup(doc, cond.field)
    if not found:
        return CheckVerdict.ERROR, None, f"answered {code} without the field {cond.field}"
    shown = _shown(value)
    if cond.equals is not None:
        if _equal(value, cond.equals):
            return CheckVerdict.PASS, shown, f"{cond.field} = {shown}"
        return CheckVerdict.FAIL, shown, f"{cond.field} = {shown}, not {cond.equals}"
    number = _number(value)
    if number is None:
        return CheckVerdict.ERROR, shown, f"{cond.field} = {shown}, not a number"
    if cond.min is not None and number < cond.min:
        return CheckVerdict.FAIL, shown, f"{cond.field} = {shown} < min {cond.min:g}"
    if cond.max is not None and number > cond.max:
        return CheckVerdict.FAIL, shown, f"{cond.field} = {shown} > max {cond.max:g}"
    return CheckVerdict.PASS, shown, f"{cond.field} = {shown} ok"


def fold(
    webhook: Webhook, entry: WebhookStatus | None, answer: Answer, since: datetime, now: datetime
) -> WebhookStatus:
    """The webhook's status after one more answer at the point that began at ``since`` (the counts of an
    earlier point start again from zero)."""
    verdict, value, why = judge(webhook, answer)
    old = checked_since(entry, since)
    return WebhookStatus(
        name=webhook.name,
        at=webhook.at,
        kind=webhook.kind,
        verdict=verdict,
        code=answer.code if not answer.error else None,
        value=value,
        message=why,
        checked_at=now,
        successes=(old.successes if old else 0) + (verdict == CheckVerdict.PASS),
        failures=(old.failures if old else 0) + (verdict == CheckVerdict.FAIL),
        consecutive_errors=(old.consecutive_errors if old else 0) + 1 if verdict == CheckVerdict.ERROR else 0,
    )


# --- the webhooks of a point, together ---------------------------------------------------------------


def confirm_deadline(webhook: Webhook, since: datetime) -> datetime | None:
    """When a confirm's wait ends (``approval.timeout`` after its point began); None: it waits for ever."""
    if webhook.approval is None:
        return None
    return since + timedelta(seconds=parse_duration(webhook.approval.timeout))


def gate(analysis: Analysis, statuses: list[WebhookStatus], point: str, since: datetime, now: datetime) -> Hold:
    """Whether the webhooks of ``point`` let the release go on, hold it, or fail it."""
    entries = {w.name: w for w in statuses}
    waiting: list[str] = []
    checks_passed = True
    confirming: Webhook | None = None
    expired: Webhook | None = None
    for webhook in analysis.webhooks_at(point):
        got = checked_since(entries.get(webhook.name), since)
        if got is not None and got.consecutive_errors >= webhook.consecutive_error_limit:
            return Hold(
                True,
                f"webhook {webhook.name}: {got.consecutive_errors} errors in a row (consecutiveErrorLimit "
                f"{webhook.consecutive_error_limit}): {got.message}",
            )
        if webhook.kind == "check":
            if got is not None and got.failures > webhook.failure_limit:
                return Hold(
                    True,
                    f"webhook {webhook.name}: {got.message} ({got.failures} failed answers > failureLimit "
                    f"{webhook.failure_limit})",
                )
            if got is None:
                waiting.append(f"webhook {webhook.name}: not called yet")
                checks_passed = False
            elif got.successes < webhook.successes_required:
                waiting.append(
                    f"webhook {webhook.name}: {got.successes}/{webhook.successes_required} passing answers "
                    f"({got.message})"
                )
                checks_passed = False
            continue
        if got is not None and got.successes >= 1:
            continue  # the confirm said yes
        waiting.append(f"webhook {webhook.name}: waiting for a yes ({got.message if got else 'not called yet'})")
        confirming = confirming or webhook
        deadline = confirm_deadline(webhook, since)
        if expired is None and deadline is not None and now >= deadline:
            expired = webhook
    return Hold(False, "; ".join(waiting), checks_passed, confirming, expired)
