"""`kubectl gr dashboard`: what the page shows of a release, as pure functions of the objects and the time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from greyrelease.cli.dashboard.views import History, actions, batches, detail, governance, summary
from greyrelease.planner.governance import Rules

NOW = datetime(2026, 12, 7, 10, 0, 0, tzinfo=UTC)  # a Monday


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def release(status: dict[str, Any] | None = None, *, uid: str = "u1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web", "namespace": "shop", "uid": uid, "generation": 1, "annotations": {}},
        "spec": {
            "targetRef": {"name": "web"},
            "targetVersion": "v2",
            "batches": [{"replicas": 1, "pause": "30s"}, {"replicas": 2, "pause": "manual"}, {"replicas": 4}],
            "trafficRouting": {"service": {"name": "web"}},
            **spec,
        },
        "status": {"observedGeneration": 1, **(status or {})},
    }


BATCH_2 = {
    "phase": "Progressing",
    "batchState": "WaitingForApproval",
    "currentBatch": 2,
    "totalBatches": 3,
    "canaryWeight": 50,
    "canaryReplicas": 2,
    "stableReplicas": 2,
    "stableVersion": "v1",
    "targetVersion": "v2",
    "message": "batch 2/3: weight 50%, waiting for approval",
    "history": [
        {
            "batch": 1,
            "canaryReplicas": 1,
            "weight": 25,
            "startedAt": ts(100),
            "readyAt": ts(95),
            "finishedAt": ts(60),
            "result": "passed",
        },
        {"batch": 2, "canaryReplicas": 2, "weight": 50, "startedAt": ts(60), "readyAt": ts(55)},
    ],
}


def test_a_list_row_has_name_namespace_phase_batch_weight_and_mode() -> None:
    row = summary(release(BATCH_2))
    assert {k: row[k] for k in ("name", "namespace", "phase", "batch", "batches", "weight", "mode", "routing")} == {
        "name": "web",
        "namespace": "shop",
        "phase": "Progressing",
        "batch": 2,
        "batches": 3,
        "weight": 50,
        "mode": "pinned",
        "routing": "service",
    }
    follow = summary(release({"phase": "Idle"}, targetVersion=None, trafficRouting={"gatewayAPI": {"httpRoute": "w"}}))
    assert (follow["phase"], follow["mode"], follow["routing"]) == ("Idle", "follow", "gatewayAPI")
    assert summary({"metadata": {"name": "new", "namespace": "shop"}, "spec": {}})["phase"] == "Pending"


def test_batches_join_the_plan_and_the_records_and_say_where_each_stands() -> None:
    rows = batches(release(BATCH_2))
    assert [(r["batch"], r["canary"], r["weight"], r["pause"], r["state"]) for r in rows] == [
        (1, 1, 25, "30s", "done"),
        (2, 2, 50, "manual", "live"),
        (3, 4, 100, "-", "next"),
    ]
    assert rows[0]["result"] == "passed" and rows[0]["readyAt"] == ts(95) and rows[2]["startedAt"] == ""
    aborted = batches(release({**BATCH_2, "phase": "Aborted", "canaryWeight": 0}))
    assert [r["state"] for r in aborted] == ["done", "rolled back", "pending"]


def test_the_traffic_history_starts_from_the_status_records_and_grows_with_each_change() -> None:
    history = History()
    history.observe(release(BATCH_2), NOW)
    key = ("shop", "web")
    # Seen mid-release: the batches the status recorded, then what is seen now.
    assert [(w, b) for _, w, b in history.traffic(key)] == [(25, 1), (50, 2)]
    history.observe(release(BATCH_2), NOW + timedelta(seconds=1))  # nothing moved: no point
    history.observe(release({**BATCH_2, "currentBatch": 3, "canaryWeight": 100}), NOW + timedelta(seconds=2))
    history.observe(release({**BATCH_2, "phase": "Aborted", "canaryWeight": 0}), NOW + timedelta(seconds=3))
    points = history.traffic(key)
    assert [(w, b) for _, w, b in points] == [(25, 1), (50, 2), (100, 3), (0, 2)]
    assert [t for t, _, _ in points] == sorted(t for t, _, _ in points)
    # The same name with a new uid is another release: its history starts afresh.
    history.observe(release({"phase": "Initializing"}, uid="u2"), NOW + timedelta(seconds=4))
    assert [(w, b) for _, w, b in history.traffic(key)] == [(0, 0)]
    history.forget(release())
    assert history.traffic(key) == []


def analysis(**metric: Any) -> dict[str, Any]:
    return {
        "prometheus": {"address": "http://prometheus:9090"},
        "metrics": [{"name": "error-rate", "query": "q", **metric}],
    }


def checked(value: float, stable: float | None, seconds_ago: float, verdict: str = "Pass") -> dict[str, Any]:
    return {
        **BATCH_2,
        "metrics": [
            {
                "name": "error-rate",
                "value": value,
                "stableValue": stable,
                "verdict": verdict,
                "checkedAt": ts(seconds_ago),
            }
        ],
    }


def test_each_check_of_a_gate_is_kept_with_the_bounds_it_was_held_to() -> None:
    history = History()
    spec: dict[str, Any] = {
        "analysis": analysis(thresholdRange={"min": 0.001, "max": 0.05}, compare={"maxIncrease": 0.5, "floor": 0.01})
    }
    for status in (
        checked(0.02, 0.02, 3),
        checked(0.02, 0.02, 3),
        checked(0.04, 0.002, 2),
        checked(0.07, 0.06, 1, "Fail"),
    ):
        history.observe(release(status, **spec), NOW)
    gate = detail(release(checked(0.07, 0.06, 1, "Fail"), **spec), [], history, Rules(), NOW)["gates"][0]
    assert gate["values"] == [0.02, 0.04, 0.07]  # the same checkedAt twice is one check
    assert gate["stable"] == [0.02, 0.002, 0.06]
    # The highest passing value: the range's max, or the stable's (at least the floor) x 1.5 when lower.
    assert gate["upper"] == pytest.approx([0.03, 0.015, 0.05])
    assert gate["lower"] == [0.001, 0.001, 0.001]
    assert gate["verdict"] == "Fail" and gate["compared"] is True
    assert gate["threshold"] == "at least 0.001, at most 0.05, at most the stable's x 1.5"


def test_governance_says_whether_a_batch_may_start_and_what_the_release_waits_for() -> None:
    frozen: dict[str, Any] = {"freezes": [{"from": ts(3600), "to": "2026-12-08T00:00:00Z", "reason": "board"}]}
    waiting = release({"phase": "Waiting", "message": "batch 1/3 is waiting for the end of freeze 'board'"}, **frozen)
    g = detail(waiting, [], History(), Rules(), NOW)["governance"]
    assert g["window"]["state"] == "closed" and "freeze 'board'" in g["window"]["text"]
    assert g["window"]["until"] == "2026-12-08T00:00:00Z"
    assert g["waitingFor"] == "batch 1/3 is waiting for the end of freeze 'board'"
    assert g["sources"] == ["the release's own spec"]
    windowed: dict[str, Any] = {"windows": [{"days": ["Mon-Fri"], "start": "09:00", "end": "17:00"}]}
    assert detail(release(BATCH_2, **windowed), [], History(), Rules(), NOW)["governance"]["window"]["state"] == "open"
    queued = governance(release({"phase": "Queued", "queuePosition": 2, "message": "position 2"}), Rules(), NOW)
    assert (queued["queuePosition"], queued["waitingFor"], queued["window"]["state"]) == (2, "position 2", "none")
    approval = governance(release({**BATCH_2, "batchTimes": {"approvalExpiresAt": ts(-600)}}), Rules(), NOW)
    assert approval["waitingFor"] == BATCH_2["message"] and approval["approvalExpiresAt"] == ts(-600)
    paused = release({**BATCH_2, "phase": "Paused", "batchState": "Verifying", "message": "batch 2/3: paused"})
    paused["metadata"]["annotations"] = {"greyrelease.io/pause": "true"}
    held = governance(paused, Rules(), NOW)
    assert (held["requested"], held["waitingFor"]) == (["greyrelease.io/pause=true"], "batch 2/3: paused")
    assert governance(release({**BATCH_2, "batchState": "Verifying"}), Rules(), NOW)["waitingFor"] == ""


@pytest.mark.parametrize(
    ("phase", "paused", "enabled"),
    [
        ("Progressing", False, {"abort", "pause", "promote", "promote-full"}),
        ("Progressing", True, {"abort", "resume", "promote", "promote-full"}),
        ("Queued", False, {"abort", "pause"}),
        ("RollingBack", False, set()),
        ("Aborted", False, {"retry"}),
        ("Failed", False, {"retry"}),
        ("Succeeded", False, set()),
    ],
)
def test_the_buttons_that_apply_in_each_phase(phase: str, paused: bool, enabled: set[str]) -> None:
    r = release({"phase": phase})
    if paused:
        r["metadata"]["annotations"] = {"greyrelease.io/pause": "true"}
    assert {name for name, on in actions(r).items() if on} == enabled


def test_the_events_are_the_releases_own_the_newest_first() -> None:
    def event(reason: str, seconds_ago: float, uid: str = "u1") -> dict[str, Any]:
        return {
            "metadata": {"name": f"web.{reason}"},
            "involvedObject": {"kind": "GreyRelease", "name": "web", "uid": uid},
            "reason": reason,
            "type": "Normal",
            "message": reason.lower(),
            "lastTimestamp": ts(seconds_ago),
        }

    found = [event("Started", 30), event("BatchReady", 10), event("Old", 5, uid="earlier"), event("Paused", 20)]
    shown = detail(release(BATCH_2), found, History(), Rules(), NOW)["events"]
    assert [e["reason"] for e in shown] == ["BatchReady", "Paused", "Started"]
