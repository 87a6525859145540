"""The metric gate: samples in, verdicts out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from greyrelease.analysis.verdicts import Check, Sample, due, fold, judge, render_query, verdict
from greyrelease.api.release import Analysis, Metric, MetricStatus


def metric(**fields: Any) -> Metric:
    return Metric.model_validate({"name": "m", "query": "q", **fields})


@pytest.mark.parametrize(
    ("fields", "canary", "stable", "expected"),
    [
        ({"thresholdRange": {"max": 0.05}}, Sample(0.01), None, "Pass"),
        ({"thresholdRange": {"max": 0.05}}, Sample(0.2), None, "Fail"),
        ({"thresholdRange": {"min": 0.99}}, Sample(0.95), None, "Fail"),
        ({"thresholdRange": {"max": 1}, "onNoData": "wait"}, Sample(None), None, "NoData"),
        ({"thresholdRange": {"max": 1}, "onNoData": "fail"}, Sample(None), None, "Fail"),
        ({"thresholdRange": {"max": 1}, "onNoData": "pass"}, Sample(None), None, "Pass"),
        ({"thresholdRange": {"max": 1}}, Sample(float("nan")), None, "NoData"),
        ({"thresholdRange": {"max": 1}}, Sample(error="timeout"), None, "Error"),
        ({"compare": {"maxIncrease": 0.2}}, Sample(0.12), Sample(0.10), "Pass"),
        ({"compare": {"maxIncrease": 0.2}}, Sample(0.15), Sample(0.10), "Fail"),
        ({"compare": {"maxIncrease": 0.2, "floor": 0.01}}, Sample(0.011), Sample(0.0), "Pass"),
        ({"compare": {"maxIncrease": 0.2, "floor": 0.01}}, Sample(0.02), Sample(0.0), "Fail"),
        ({"compare": {"maxIncrease": 0.2}}, Sample(0.1), Sample(error="down"), "Error"),
        # The same absolute threshold would pass a canary 50% worse than stable; comparison does not.
        ({"thresholdRange": {"max": 0.5}, "compare": {"maxIncrease": 0.2}}, Sample(0.3), Sample(0.2), "Fail"),
    ],
    ids=[
        "in-range",
        "over-max",
        "under-min",
        "no-data-wait",
        "no-data-fail",
        "no-data-pass",
        "nan-is-no-data",
        "error",
        "compare-within",
        "compare-worse",
        "compare-floor-within",
        "compare-floor-worse",
        "compare-stable-error",
        "compare-catches-what-threshold-misses",
    ],
)
def test_judge(fields: dict[str, Any], canary: Sample, stable: Sample | None, expected: str) -> None:
    assert judge(metric(**fields), Check("m", canary, stable))[0] == expected


def test_fold_counts_and_resets_consecutive_errors() -> None:
    m = metric(thresholdRange={"max": 1})
    t1, t2, t3, t4 = (datetime(2026, 1, 1, 12, 0, s, tzinfo=UTC) for s in (1, 2, 3, 4))
    st = fold(m, None, Check("m", Sample(error="x")), t1)
    st = fold(m, st, Check("m", Sample(error="x")), t2)
    assert (st.consecutive_errors, st.successes, st.failures, st.verdict) == (2, 0, 0, "Error")
    st = fold(m, st, Check("m", Sample(0.5)), t3)
    assert (st.consecutive_errors, st.successes, st.value, st.checked_at) == (0, 1, 0.5, t3)
    st = fold(m, st, Check("m", Sample(2.0)), t4)
    assert (st.failures, st.verdict, st.message) == (1, "Fail", "2 > max 1")


def test_verdict_needs_every_metric() -> None:
    analysis = Analysis.model_validate(
        {
            "prometheus": {"address": "http://p:9090"},
            "metrics": [{"name": "a", "query": "q", "successesRequired": 2}, {"name": "b", "query": "q"}],
        }
    )
    assert not verdict(analysis, []).passed
    a1 = MetricStatus(name="a", successes=1)
    b1 = MetricStatus(name="b", successes=1)
    v = verdict(analysis, [a1, b1])
    assert not v.passed and not v.failed and "a: 1/2" in v.message
    assert verdict(analysis, [a1.model_copy(update={"successes": 2}), b1]).passed
    assert verdict(analysis, [a1, b1.model_copy(update={"failures": 1})]).failed


def test_due_only_for_a_live_progressing_batch() -> None:
    analysis = Analysis.model_validate(
        {"prometheus": {"address": "http://p:9090"}, "interval": "10s", "metrics": [{"name": "a", "query": "q"}]}
    )
    t = datetime(2026, 1, 1, 12, 0, 10, tzinfo=UTC)
    live = t - timedelta(seconds=10)
    assert due(analysis, phase="Progressing", batch_ready_at=live, statuses=[], now=t)
    assert not due(analysis, phase="Paused", batch_ready_at=live, statuses=[], now=t)
    assert not due(analysis, phase="Progressing", batch_ready_at=None, statuses=[], now=t)
    recent = [MetricStatus.model_validate({"name": "a", "checkedAt": "2026-01-01T12:00:05.000Z"})]
    assert not due(analysis, phase="Progressing", batch_ready_at=live, statuses=recent, now=t)
    assert not due(None, phase="Progressing", batch_ready_at=live, statuses=[], now=t)


def test_render_query() -> None:
    q = 'sum(rate(errors{namespace="{{namespace}}",app="{{app}}",track="{{ track }}"}[1m]))'
    rendered = render_query(q, namespace="shop", app="web", track="canary")
    assert rendered == 'sum(rate(errors{namespace="shop",app="web",track="canary"}[1m]))'
