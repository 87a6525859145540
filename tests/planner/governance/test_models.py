"""The governance fields of the models: bad windows, freezes, approvals and predecessors are refused
naming the field; a window's defaults; the policy model."""

from __future__ import annotations

from typing import Any

import pytest
from greyrelease.api.release import GreyReleasePolicy, Window
from pydantic import ValidationError

from tests.support.builders import NS
from tests.support.governance import OFFICE, OFFICE_JSON
from tests.support.world import spec


def refused(**fields: Any) -> list[tuple[tuple[int | str, ...], str]]:
    with pytest.raises(ValidationError) as err:
        spec(**fields)
    return [(tuple(e["loc"]), e["msg"]) for e in err.value.errors()]


MANUAL_ONLY = {"batchSize": None, "canaryWeight": None}
MANUAL_BATCH = {"replicas": 1, "pause": "manual"}


@pytest.mark.parametrize(
    ("fields", "loc", "text"),
    [
        ({"windows": [{**OFFICE_JSON, "timeZone": "Mars/Olympus"}]}, ("windows", 0, "timeZone"), "unknown time zone"),
        ({"windows": [{**OFFICE_JSON, "end": "09:00"}]}, ("windows", 0), "end must differ from start"),
        ({"windows": [{**OFFICE_JSON, "days": []}]}, ("windows", 0, "days"), "at least 1 item"),
        ({"windows": [{**OFFICE_JSON, "days": ["Monday"]}]}, ("windows", 0, "days", 0), "pattern"),
        ({"windows": [{**OFFICE_JSON, "days": ["Mon-Fre"]}]}, ("windows", 0, "days", 0), "pattern"),
        ({"windows": [{**OFFICE_JSON, "start": "24:00"}]}, ("windows", 0, "start"), "pattern"),
        (
            {"freezes": [{"from": "2026-12-20T00:00:00Z", "to": "2026-12-19T00:00:00Z"}]},
            ("freezes", 0),
            "to must be after from",
        ),
        (
            {"freezes": [{"from": "2026-12-20T00:00:00Z", "to": "2026-12-20T00:00:00Z"}]},
            ("freezes", 0),
            "to must be after from",
        ),
        (
            {"freezes": [{"from": "2026-12-20T00:00:00", "to": "2026-12-21T00:00:00Z"}]},
            ("freezes", 0, "from"),
            "timezone",
        ),
        (
            {**MANUAL_ONLY, "batches": [{**MANUAL_BATCH, "approval": {"timeout": "4h", "onTimeout": "skip"}}]},
            ("batches", 0, "approval", "onTimeout"),
            "'abort' or 'promote'",
        ),
        ({"approval": {"timeout": "4h", "onTimeout": "wait"}}, ("approval", "onTimeout"), "'abort' or 'promote'"),
        (
            {**MANUAL_ONLY, "batches": [{"replicas": 1, "pause": "30s", "approval": {"timeout": "4h"}}]},
            ("batches", 0),
            "approval goes with pause: manual",
        ),
        (
            {**MANUAL_ONLY, "batches": [{"replicas": 1, "approval": {"timeout": "4h"}}]},
            ("batches", 0),
            "approval goes with pause: manual",
        ),
        (
            {**MANUAL_ONLY, "batches": [{**MANUAL_BATCH, "approval": {"onTimeout": "abort"}}]},
            ("batches", 0, "approval", "timeout"),
            "Field required",
        ),
        (
            {**MANUAL_ONLY, "batches": [{**MANUAL_BATCH, "approval": {"timeout": "soon"}}]},
            ("batches", 0, "approval", "timeout"),
            "pattern",
        ),
        (
            {**MANUAL_ONLY, "batches": [{"replicas": 1, "pause": {"manual": True, "timeout": "4h"}}]},
            ("batches", 0, "pause"),
            "valid string",
        ),
        ({"after": [{"name": "Not A Name"}]}, ("after", 0, "name"), "pattern"),
    ],
    ids=[
        "unknown-zone",
        "start-equals-end",
        "empty-days",
        "bad-day-name",
        "bad-day-range",
        "bad-clock",
        "freeze-ends-before-it-starts",
        "freeze-of-no-time",
        "freeze-without-zone",
        "on-timeout-not-abort-or-promote",
        "release-on-timeout-not-abort-or-promote",
        "approval-with-a-timed-pause",
        "approval-without-a-pause",
        "approval-without-timeout",
        "approval-bad-timeout",
        "pause-object-refused",
        "after-bad-name",
    ],
)
def test_bad_governance_input_is_refused_naming_the_field(
    fields: dict[str, Any], loc: tuple[int | str, ...], text: str
) -> None:
    errors = refused(**fields)
    assert any(e_loc == loc and text in msg for e_loc, msg in errors), errors


def test_a_window_may_cross_midnight_and_defaults_to_utc() -> None:
    w = Window.model_validate({"days": ["Fri"], "start": "22:00", "end": "02:00"})
    assert (w.time_zone, w.weekdays) == ("UTC", frozenset({4}))
    assert spec(windows=[OFFICE_JSON]).windows == [OFFICE]


def test_the_policy_model_takes_windows_freezes_and_a_limit() -> None:
    p = GreyReleasePolicy.model_validate(
        {
            "metadata": {"name": "platform"},
            "spec": {
                "windows": [OFFICE_JSON],
                "freezes": [{"from": "2026-12-20T00:00:00Z", "to": "2027-01-02T00:00:00Z"}],
                "concurrency": {"maxProgressing": 2, "per": "Group"},
                "namespaces": [NS],
            },
        }
    )
    assert p.spec.windows == [OFFICE] and p.spec.concurrency is not None and p.spec.concurrency.per == "Group"
    assert p.spec.governs(NS, {}) and not p.spec.governs("other", {})
    with pytest.raises(ValidationError, match="maxProgressing"):
        GreyReleasePolicy.model_validate({"spec": {"concurrency": {"maxProgressing": 0}}})
