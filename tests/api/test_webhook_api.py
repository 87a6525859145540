"""The webhook checks' API: what is refused, naming the field, and the CEL rules that refuse it at
``kubectl apply`` carried in the CRD with the same words."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from greyrelease.api.crd import schema_of
from greyrelease.api.release import GreyReleaseSpec
from greyrelease.cli.main import print_plan
from pydantic import ValidationError

GATEWAY = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}
HOOK = {"name": "smoke", "at": "live", "url": "http://checks/run"}


def spec(*hooks: dict[str, Any], routing: dict[str, Any] | None = None, **analysis: Any) -> dict[str, Any]:
    return {
        "targetRef": {"name": "web"},
        "targetVersion": "v2",
        "batchSize": 1,
        "canaryWeight": 50,
        "trafficRouting": routing or GATEWAY,
        "analysis": {"webhooks": list(hooks), **analysis},
    }


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("no metrics nor webhooks", spec(), "analysis needs metrics or webhooks"),
    (
        "metrics without prometheus",
        spec(HOOK, metrics=[{"name": "m", "query": "q"}]),
        "metrics need prometheus",
    ),
    ("unknown point", spec({**HOOK, "at": "sometime"}), "webhooks.0.at"),
    ("timeout over 30s", spec({**HOOK, "timeout": "31s"}), "timeout must be at most 30s"),
    ("approval on a check", spec({**HOOK, "approval": {"timeout": "1h"}}), "approval goes with kind: confirm"),
    (
        "a post-rollback confirm",
        spec({**HOOK, "at": "post-rollback", "kind": "confirm"}),
        "a post-rollback webhook is informative",
    ),
    ("a condition without a test", spec({**HOOK, "condition": {"field": "ok"}}), "a condition has equals"),
    (
        "equals and min",
        spec({**HOOK, "condition": {"field": "ok", "equals": "true", "min": 1}}),
        "a condition has equals",
    ),
    ("a field path with spaces", spec({**HOOK, "condition": {"field": "a b", "equals": "x"}}), "condition.field"),
    ("not http", spec({**HOOK, "url": "ftp://checks/run"}), "webhooks.0.url"),
    ("twice the same name", spec(HOOK, HOOK), "webhook names must be unique: smoke"),
    (
        "pre-traffic in Service mode",
        spec({**HOOK, "at": "pre-traffic"}, routing={"service": {"name": "web"}}),
        "pre-traffic webhooks need trafficRouting nginx or gatewayAPI",
    ),
]


@pytest.mark.parametrize(("body", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_webhook_is_refused_naming_what_is_wrong(body: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as err:
        GreyReleaseSpec.model_validate(body)
    assert words in str(err.value)


def test_what_a_webhook_may_be() -> None:
    ok = GreyReleaseSpec.model_validate(
        spec(
            {**HOOK, "at": "pre-traffic", "condition": {"field": "result.checks.0.ok", "equals": "true"}},
            {**HOOK, "name": "cab", "kind": "confirm", "approval": {"timeout": "4h", "onTimeout": "promote"}},
            {**HOOK, "name": "tell", "at": "post-rollback", "method": "GET", "timeout": "30s"},
        )
    )
    assert ok.analysis is not None and ok.analysis.prometheus is None and ok.analysis.metrics == []
    assert [w.at for w in ok.analysis.webhooks] == ["pre-traffic", "live", "post-rollback"]
    first = ok.analysis.webhooks[0]
    assert (first.kind, first.method, first.timeout, first.failure_limit, first.consecutive_error_limit) == (
        "check",
        "POST",
        "5s",
        0,
        4,
    )


def test_the_crd_refuses_the_same_at_kubectl_apply() -> None:
    rules = json.dumps(schema_of(GreyReleaseSpec))
    for words in (
        "analysis needs metrics or webhooks",
        "metrics need prometheus",
        "timeout must be at most 30s",
        "approval goes with kind: confirm",
        "a post-rollback webhook is informative: it cannot be a confirm",
        "a condition has equals, or min and/or max",
        "webhook names must be unique",
        "pre-traffic webhooks need trafficRouting nginx or gatewayAPI",
    ):
        assert words in rules, words


def test_the_plan_names_the_webhooks_with_their_point() -> None:
    body = spec({**HOOK, "at": "pre-traffic"}, {**HOOK, "name": "cab", "at": "pre-promotion", "kind": "confirm"})
    out = io.StringIO()
    assert print_plan({"spec": body}, 4, out) == 0
    rows = out.getvalue().splitlines()[2:4]
    assert [row.split()[-2:] for row in rows] == [["smoke@pre-traffic,", "cab@pre-promotion"]] * 2
