"""Webhook checks, pure: an answer's verdict as a table, the counts folded per point, the webhooks of a
point judged together, and which webhooks a pass calls."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from greyrelease.analysis.webhooks import (
    Answer,
    due,
    fold,
    gate,
    judge,
    lookup,
    stage,
)
from greyrelease.api.release import (
    Analysis,
    BatchState,
    BatchTimes,
    CheckVerdict,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Phase,
    Webhook,
    WebhookStatus,
)

from tests.support.builders import T0


def hook(**fields: Any) -> Webhook:
    base: dict[str, Any] = {"name": "smoke", "at": "pre-traffic", "url": "http://checks/run"}
    return Webhook.model_validate({**base, **fields})


OK_FIELD = {"field": "result.ok", "equals": "true"}
SCORE = {"field": "score", "min": 0.9}

# (condition, code, body, error) -> (verdict, value, words in the message)
VERDICTS: list[tuple[str, dict[str, Any] | None, Answer, CheckVerdict, str | None, str]] = [
    ("2xx", None, Answer("smoke", 200), CheckVerdict.PASS, None, "answered 200"),
    ("204", None, Answer("smoke", 204), CheckVerdict.PASS, None, "answered 204"),
    ("5xx", None, Answer("smoke", 503), CheckVerdict.ERROR, None, "answered 503"),
    ("429", None, Answer("smoke", 429), CheckVerdict.ERROR, None, "answered 429"),
    ("4xx is a no", None, Answer("smoke", 403), CheckVerdict.FAIL, None, "answered 403"),
    ("redirect", None, Answer("smoke", 302), CheckVerdict.ERROR, None, "redirects are not followed"),
    ("timeout", None, Answer("smoke", error="no answer within 1s"), CheckVerdict.ERROR, None, "no answer within 1s"),
    ("met", OK_FIELD, Answer("smoke", 200, '{"result": {"ok": true}}'), CheckVerdict.PASS, "true", "result.ok = true"),
    (
        "not met",
        OK_FIELD,
        Answer("smoke", 200, '{"result": {"ok": false}}'),
        CheckVerdict.FAIL,
        "false",
        "result.ok = false, not true",
    ),
    ("missing field", OK_FIELD, Answer("smoke", 200, '{"result": {}}'), CheckVerdict.ERROR, None, "without the field"),
    ("not JSON", OK_FIELD, Answer("smoke", 200, "<html>ok</html>"), CheckVerdict.ERROR, None, "without JSON"),
    ("condition on a 5xx", OK_FIELD, Answer("smoke", 500, '{"result": {"ok": true}}'), CheckVerdict.ERROR, None, "500"),
    ("min met", SCORE, Answer("smoke", 200, '{"score": 0.93}'), CheckVerdict.PASS, "0.93", "score = 0.93 ok"),
    ("min not met", SCORE, Answer("smoke", 200, '{"score": 0.5}'), CheckVerdict.FAIL, "0.5", "0.5 < min 0.9"),
    ("numeric text", SCORE, Answer("smoke", 200, '{"score": "0.95"}'), CheckVerdict.PASS, '"0.95"', "ok"),
    ("not a number", SCORE, Answer("smoke", 200, '{"score": "high"}'), CheckVerdict.ERROR, '"high"', "not a number"),
    ("true is no number", SCORE, Answer("smoke", 200, '{"score": true}'), CheckVerdict.ERROR, "true", "not a number"),
    (
        "max",
        {"field": "errors.0.rate", "max": 0.05},
        Answer("smoke", 200, '{"errors": [{"rate": 0.2}]}'),
        CheckVerdict.FAIL,
        "0.2",
        "> max 0.05",
    ),
    (
        "equals text",
        {"field": "state", "equals": "green"},
        Answer("smoke", 200, '{"state": "green"}'),
        CheckVerdict.PASS,
        '"green"',
        "state",
    ),
    (
        "equals number",
        {"field": "n", "equals": "42"},
        Answer("smoke", 200, '{"n": 42.0}'),
        CheckVerdict.PASS,
        "42.0",
        "n = 42.0",
    ),
]


@pytest.mark.parametrize(
    ("condition", "answer", "verdict", "value", "words"),
    [v[1:] for v in VERDICTS],
    ids=[v[0] for v in VERDICTS],
)
def test_an_answers_verdict(
    condition: dict[str, Any] | None, answer: Answer, verdict: CheckVerdict, value: str | None, words: str
) -> None:
    got, shown, why = judge(hook(condition=condition), answer)
    assert (got, shown) == (verdict, value)
    assert words in why


def test_a_long_value_is_cut_in_the_status() -> None:
    _, shown, _ = judge(
        hook(condition={"field": "s", "equals": "x"}), Answer("smoke", 200, '{"s": "' + "y" * 500 + '"}')
    )
    assert shown is not None and len(shown) == 64 and shown.endswith("…")


@pytest.mark.parametrize(
    ("doc", "path", "found"),
    [
        ({"a": {"b": 1}}, "a.b", (True, 1)),
        ({"a": [{"b": 2}]}, "a.0.b", (True, 2)),
        ({"a": [1]}, "a.1", (False, None)),
        ({"a": 1}, "a.b", (False, None)),
        ({"a": None}, "a", (True, None)),
    ],
)
def test_a_field_path(doc: Any, path: str, found: tuple[bool, Any]) -> None:
    assert lookup(doc, path) == found


def test_counts_are_per_point_and_errors_in_a_row() -> None:
    w = hook(failureLimit=1)
    first = fold(w, None, Answer("smoke", 403), T0, T0)
    assert (first.failures, first.successes, first.consecutive_errors, first.code) == (1, 0, 0, 403)
    second = fold(w, first, Answer("smoke", error="no answer within 5s"), T0, T0 + timedelta(seconds=10))
    assert (second.failures, second.consecutive_errors, second.code) == (1, 1, None)
    third = fold(w, second, Answer("smoke", 200), T0, T0 + timedelta(seconds=20))
    assert (third.successes, third.consecutive_errors) == (1, 0)
    # A new point (a later batch): the counts start again, the last answer stays visible until then.
    later = T0 + timedelta(minutes=5)
    fresh = fold(w, third, Answer("smoke", 403), later, later)
    assert (fresh.failures, fresh.successes) == (1, 0)


def _analysis(*hooks: dict[str, Any]) -> Analysis:
    return Analysis.model_validate({"webhooks": list(hooks)})


def _entry(name: str, **fields: Any) -> WebhookStatus:
    return WebhookStatus(name=name, checked_at=T0, **fields)


def test_a_point_fails_passes_or_waits() -> None:
    a = _analysis(
        {"name": "smoke", "at": "pre-traffic", "url": "http://a", "failureLimit": 1},
        {"name": "cm", "at": "pre-traffic", "url": "http://b", "kind": "confirm"},
    )
    now = T0 + timedelta(seconds=1)
    waiting = gate(a, [], "pre-traffic", T0, now)
    assert not waiting.passed and not waiting.failed and waiting.confirming is not None
    assert "smoke: not called yet" in waiting.message
    no = gate(a, [_entry("smoke", successes=1), _entry("cm", failures=3)], "pre-traffic", T0, now)
    assert not no.failed and no.checks_passed and no.confirming is not None and no.confirming.name == "cm"
    yes = gate(a, [_entry("smoke", successes=1), _entry("cm", successes=1)], "pre-traffic", T0, now)
    assert yes.passed
    failed = gate(a, [_entry("smoke", failures=2, message="answered 403")], "pre-traffic", T0, now)
    assert failed.failed and "webhook smoke: answered 403 (2 failed answers > failureLimit 1)" in failed.message
    errors = gate(a, [_entry("cm", consecutive_errors=4, message="answered 500")], "pre-traffic", T0, now)
    assert errors.failed and "webhook cm: 4 errors in a row (consecutiveErrorLimit 4)" in errors.message
    # Answers of an earlier point do not count.
    stale = gate(a, [_entry("smoke", successes=1), _entry("cm", successes=1)], "pre-traffic", now, now)
    assert not stale.passed


def test_a_confirms_wait_expires_after_its_approval_timeout() -> None:
    a = _analysis(
        {"name": "cm", "at": "live", "url": "http://b", "kind": "confirm", "approval": {"timeout": "1m"}},
    )
    assert gate(a, [], "live", T0, T0 + timedelta(seconds=59)).expired is None
    expired = gate(a, [], "live", T0, T0 + timedelta(seconds=60)).expired
    assert expired is not None and expired.name == "cm"


HOOKS = [
    {"name": "pre", "at": "pre-traffic", "url": "http://a"},
    {"name": "live", "at": "live", "url": "http://b"},
    {"name": "yes", "at": "live", "url": "http://c", "kind": "confirm"},
    {"name": "promo", "at": "pre-promotion", "url": "http://d"},
    {"name": "after", "at": "post-rollback", "url": "http://e"},
]
SPEC = GreyReleaseSpec.model_validate(
    {
        "targetRef": {"name": "web"},
        "targetVersion": "v2",
        "batchSize": 1,
        "canaryWeight": 50,
        "trafficRouting": {"nginx": {"ingress": "web", "stableService": "web"}},
        "analysis": {"interval": "10s", "webhooks": HOOKS},
    }
)
S = timedelta(seconds=1)


def _status(phase: Phase, state: BatchState | None = None, **times: Any) -> GreyReleaseStatus:
    return GreyReleaseStatus(phase=phase, batch_state=state, batch_times=BatchTimes(**times), phase_started_at=T0)


DUE: list[tuple[str, GreyReleaseStatus, list[WebhookStatus], timedelta, list[str]]] = [
    ("upscaling, canary not ready", _status(Phase.PROGRESSING, BatchState.UPSCALING), [], 0 * S, []),
    ("pre-traffic at once", _status(Phase.PROGRESSING, BatchState.UPSCALING, checks_since=T0), [], 0 * S, ["pre"]),
    (
        "pre-traffic again an interval after a no",
        _status(Phase.PROGRESSING, BatchState.UPSCALING, checks_since=T0),
        [_entry("pre", failures=1)],
        9 * S,
        [],
    ),
    (
        "pre-traffic again",
        _status(Phase.PROGRESSING, BatchState.UPSCALING, checks_since=T0),
        [_entry("pre", failures=1)],
        10 * S,
        ["pre"],
    ),
    (
        "pre-traffic passed: not again",
        _status(Phase.PROGRESSING, BatchState.UPSCALING, checks_since=T0),
        [_entry("pre", successes=1)],
        60 * S,
        [],
    ),
    ("live: one interval after live", _status(Phase.PROGRESSING, BatchState.VERIFYING, ready_at=T0), [], 9 * S, []),
    (
        "live",
        _status(Phase.PROGRESSING, BatchState.VERIFYING, ready_at=T0),
        [],
        10 * S,
        ["live", "yes"],
    ),
    (
        "live: a check goes on, a confirm that said yes does not",
        _status(Phase.PROGRESSING, BatchState.WAITING_FOR_APPROVAL, ready_at=T0),
        [_entry("live", successes=1), _entry("yes", successes=1)],
        10 * S,
        ["live"],
    ),
    (
        "pre-promotion",
        _status(Phase.PROGRESSING, BatchState.VERIFYING, ready_at=T0 - 60 * S, checks_since=T0),
        [],
        0 * S,
        ["promo"],
    ),
    ("paused: none", _status(Phase.PAUSED, BatchState.VERIFYING, ready_at=T0), [], 60 * S, []),
    ("post-rollback once", _status(Phase.ABORTED), [], 0 * S, ["after"]),
    ("post-rollback called", _status(Phase.FAILED), [_entry("after", failures=1)], 0 * S, []),
    ("post-rollback long ago", _status(Phase.ABORTED), [], 601 * S, []),
    ("succeeded: none", _status(Phase.SUCCEEDED), [], 0 * S, []),
]


@pytest.mark.parametrize(("status", "entries", "after", "called"), [d[1:] for d in DUE], ids=[d[0] for d in DUE])
def test_which_webhooks_a_pass_calls(
    status: GreyReleaseStatus, entries: list[WebhookStatus], after: timedelta, called: list[str]
) -> None:
    status = status.model_copy(update={"webhooks": entries})
    assert [w.name for w in due(SPEC, status, T0 + after)] == called


def test_the_point_a_release_is_at() -> None:
    assert stage(SPEC, _status(Phase.PROGRESSING, BatchState.UPSCALING, checks_since=T0), T0) == ("pre-traffic", T0)
    assert stage(SPEC, _status(Phase.PROGRESSING, BatchState.DONE, ready_at=T0), T0) is None
    assert stage(SPEC, _status(Phase.ROLLING_BACK), T0) is None
