"""The metric gate of a batch: samples in, verdict out. Pure.

Every ``analysis.interval`` while a batch is live, each metric's query is run for the canary (and, with
``compare``, for the stable track too). One run is a *check*:

=========  ==============================================================================
Pass       the value is inside ``thresholdRange`` (and, with ``compare``, canary <= stable x (1 + maxIncrease))
Fail       it is not; or there is no data and ``onNoData: fail``
NoData     the query returned nothing (or NaN) and ``onNoData: wait``: neither pass nor fail, and
           the batch waits, against the progress deadline
Error      the query failed (after brief retries); never a success
=========  ==============================================================================

A batch passes once its pause has elapsed and every metric has ``successesRequired`` passing checks since
the batch went live. It fails when a metric has more failed checks than ``failureLimit``, or
``consecutiveErrorLimit`` errors in a row. ``onNoData: pass`` counts no data as a pass, for metrics
whose silence is good news (an error counter that was never incremented).

Worked example (``thresholdRange: {max: 0.05}``, ``failureLimit: 1``): checks 0.01 Pass, 0.09 Fail
(1 failure, tolerated), 0.02 Pass, 0.07 Fail (2 failures > 1) -> the release rolls back, and its message
names the metric and the value 0.07.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from greyrelease.api.release import Analysis, CheckVerdict, Compare, Metric, MetricStatus, Phase, parse_duration


@dataclass(frozen=True)
class Sample:
    """One query's answer: a value, no data (``value is None``), or an error."""

    value: float | None = None
    error: str = ""


@dataclass(frozen=True)
class Check:
    """The samples of one metric taken in one pass (``stable`` only with ``compare``)."""

    metric: str
    canary: Sample
    stable: Sample | None = None


@dataclass(frozen=True)
class Verdict:
    passed: bool  # every metric has enough passing checks
    failed: bool  # a metric is past its failure or error limit
    message: str = ""


def render_query(template: str, **values: str | int) -> str:
    """Fill ``{{namespace}}``, ``{{name}}``, ``{{track}}``, ``{{version}}``, ``{{batch}}``, ``{{app}}``."""
    out = template
    for key, value in values.items():
        out = out.replace("{{" + key + "}}", str(value)).replace("{{ " + key + " }}", str(value))
    return out


def _fmt(value: float | None) -> str:
    return "no data" if value is None else f"{value:.4g}"


def compare_limit(compare: Compare, stable: float | None) -> float:
    """The highest passing canary value against a stable value (None or NaN: no data, the floor counts)."""
    base = compare.floor if stable is None or math.isnan(stable) else max(stable, compare.floor)
    return base * (1 + compare.max_increase)


def judge(metric: Metric, check: Check) -> tuple[CheckVerdict, str]:
    """The verdict of one check and why."""
    canary = check.canary
    if canary.error:
        return CheckVerdict.ERROR, f"query failed: {canary.error}"
    if canary.value is None or math.isnan(canary.value):
        if metric.on_no_data == "fail":
            return CheckVerdict.FAIL, "no data (onNoData: fail)"
        if metric.on_no_data == "pass":
            return CheckVerdict.PASS, "no data (onNoData: pass)"
        return CheckVerdict.NO_DATA, "no data yet (onNoData: wait)"
    value = canary.value
    rng = metric.threshold_range
    if rng is not None:
        if rng.min is not None and value < rng.min:
            return CheckVerdict.FAIL, f"{_fmt(value)} < min {rng.min:g}"
        if rng.max is not None and value > rng.max:
            return CheckVerdict.FAIL, f"{_fmt(value)} > max {rng.max:g}"
    if metric.compare is not None:
        stable = check.stable
        if stable is None or stable.error:
            return CheckVerdict.ERROR, f"stable query failed: {stable.error if stable else 'not run'}"
        limit = compare_limit(metric.compare, stable.value)
        if value > limit:
            return CheckVerdict.FAIL, (
                f"{_fmt(value)} > stable {_fmt(stable.value)} x {1 + metric.compare.max_increase:g} = {limit:.4g}"
            )
    return CheckVerdict.PASS, f"{_fmt(value)} ok"


def fold(metric: Metric, status: MetricStatus | None, check: Check, now: datetime) -> MetricStatus:
    """The metric's status after one more check."""
    verdict, why = judge(metric, check)
    old = status or MetricStatus(name=metric.name)
    return MetricStatus(
        name=metric.name,
        value=check.canary.value if not check.canary.error else old.value,
        stable_value=check.stable.value if check.stable and not check.stable.error else old.stable_value,
        verdict=verdict,
        message=why,
        checked_at=now,
        successes=old.successes + (verdict == CheckVerdict.PASS),
        failures=old.failures + (verdict == CheckVerdict.FAIL),
        consecutive_errors=old.consecutive_errors + 1 if verdict == CheckVerdict.ERROR else 0,
    )


def verdict(analysis: Analysis, statuses: list[MetricStatus]) -> Verdict:
    by_name = {s.name: s for s in statuses}
    waiting: list[str] = []
    for metric in analysis.metrics:
        st = by_name.get(metric.name)
        if st is None:
            waiting.append(f"{metric.name}: not checked yet")
            continue
        if st.failures > metric.failure_limit:
            return Verdict(
                False,
                True,
                f"metric {metric.name}: {st.message} ({st.failures} failed checks > failureLimit "
                f"{metric.failure_limit})",
            )
        if st.consecutive_errors >= metric.consecutive_error_limit:
            return Verdict(
                False,
                True,
                f"metric {metric.name}: {st.consecutive_errors} query errors in a row "
                f"(consecutiveErrorLimit {metric.consecutive_error_limit}): {st.message}",
            )
        if st.successes < metric.successes_required:
            waiting.append(f"{metric.name}: {st.successes}/{metric.successes_required} passing checks ({st.message})")
    if waiting:
        return Verdict(False, False, "; ".join(waiting))
    return Verdict(True, False, "all metrics pass")


def interval(analysis: Analysis) -> float:
    return max(parse_duration(analysis.interval), 0.1)


def next_check_at(analysis: Analysis, statuses: list[MetricStatus], live_since: datetime) -> datetime:
    """When the metrics are checked next: one interval after the last check, or after the batch went live."""
    base = max([*(s.checked_at for s in statuses if s.checked_at), live_since])
    return base + timedelta(seconds=interval(analysis))


def due(
    analysis: Analysis | None,
    *,
    phase: str | None,
    batch_ready_at: datetime | None,
    statuses: list[MetricStatus],
    now: datetime,
) -> bool:
    """Whether the metrics should be queried in this pass: a live batch whose next check time has come."""
    if analysis is None or phase != Phase.PROGRESSING or batch_ready_at is None:
        return False
    return now >= next_check_at(analysis, statuses, batch_ready_at)
