"""The arithmetic of `python -m bench.standing` (a big cluster at rest, then a burst) and of the audit log's
reading by window; the measuring itself runs on the local cluster (`make bench-standing N=300`)."""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bench.run import transition_lags
from bench.standing import (
    Rest,
    burst_figures,
    by_verb,
    lags_by_window,
    layout,
    peak_pods,
    requests_figures,
    rest_rows,
    settled,
    shortened,
    summarise_rest,
    waits_between,
)

from bench import audit


def test_the_apps_are_dealt_over_the_namespaces_so_that_any_first_ones_are_spread() -> None:
    apps = layout(10, ["a", "b", "c"])
    assert apps[:4] == [("a", "app-00000"), ("b", "app-00001"), ("c", "app-00002"), ("a", "app-00003")]
    assert Counter(ns for ns, _ in apps[:6]) == {"a": 2, "b": 2, "c": 2}
    assert peak_pods(10_000, 1_000) == 23_000


def test_the_requests_at_rest_are_counted_by_verb_with_dry_runs_and_leases_apart() -> None:
    split = {
        "reads": Counter(
            {"watch greyreleases": 2, "watch deployments": 1, "list deployments": 1, "dryrun patch deployments": 2}
        ),
        "writes": Counter(),
        "lease_reads": Counter({"get leases": 30}),
        "lease_writes": Counter({"update leases": 30}),
    }
    figures = requests_figures(split)
    assert figures["reads_by_verb"] == {"list": 1, "watch": 3}
    assert figures["dry_runs"] == {"dryrun patch deployments": 2}
    assert figures["writes"] == 0 and figures["lease_writes"] == 30 and figures["lease_reads"] == 30
    assert by_verb({"get services": 2, "get deployments": 1, "patch deployments/status": 4}) == {"get": 3, "patch": 4}


def rest(requests: dict[str, Any]) -> Rest:
    # Two replicas over 3 minutes: CPU seconds at the start and after each minute; 4,000 passes in all.
    return Rest(
        seconds=180.0,
        cpu=[[10.0, 11.0, 13.0, 13.5], [2.0, 2.0, 2.5, 2.5]],
        rss=[300 * 2**20, 100 * 2**20],
        peak_rss=[310 * 2**20, 101 * 2**20],
        passes=4000,
        requests=requests,
    )


def test_a_window_at_rest_in_figures() -> None:
    quiet = requests_figures({"reads": Counter({"watch deployments": 3})})
    s = summarise_rest(rest(quiet))
    assert s["minutes"] == 3.0
    assert s["cpu_s_per_min"] == [1.17, 0.17]
    assert s["cpu_s_busiest_min"] == [2.0, 0.5]
    assert s["rss_mib"] == [300.0, 100.0] and s["peak_rss_mib"] == [310.0, 101.0]
    assert s["passes_per_min"] == 1333.3
    assert s["cpu_ms_per_pass"] == 1.0  # 4 s of CPU over 4,000 passes
    assert s["unchanged_per_min"] == 0.0 and s["cpu_ms_per_resync"] == 1.0
    assert s["quiet"]


def test_resyncs_without_a_pass_are_counted_and_share_the_cpu_with_the_passes() -> None:
    window = rest(requests_figures({"reads": Counter({"watch deployments": 3})}))
    window.unchanged = 36_000
    s = summarise_rest(window)
    assert s["passes_per_min"] == 1333.3 and s["unchanged_per_min"] == 12000.0
    assert s["cpu_ms_per_resync"] == 0.1  # 4 s of CPU over 4,000 passes and 36,000 looks
    assert any("12000.0 resyncs a minute without a pass" in row for row in rest_rows("at rest", s))


@pytest.mark.parametrize(
    "split",
    [
        {"reads": Counter({"watch deployments": 3}), "writes": Counter({"patch greyreleases/status": 1})},
        {"reads": Counter({"watch deployments": 3, "get deployments": 1})},
    ],
)
def test_a_write_or_a_get_at_rest_is_not_quiet(split: dict[str, Counter[str]]) -> None:
    assert not summarise_rest(rest(requests_figures(split)))["quiet"]


def history(ready: str, finished: str) -> dict[str, str]:
    return {"readyAt": f"2026-01-01T00:00:{ready}Z", "finishedAt": f"2026-01-01T00:00:{finished}Z"}


def test_the_burst_lag_counts_the_released_ones_and_the_aborts_are_apart() -> None:
    statuses = {
        ("a", "x"): {
            "phase": "Succeeded",
            "phaseStartedAt": "2026-01-01T00:00:30Z",
            "history": [history("01", "03.5"), history("04", "04")],
        },
        ("a", "y"): {
            "phase": "Succeeded",
            "phaseStartedAt": "2026-01-01T00:00:40Z",
            "history": [history("02", "04"), history("05", "06")],
        },
        ("b", "z"): {"phase": "Aborted", "phaseStartedAt": "2026-01-01T00:00:20Z", "history": [history("01", "09")]},
    }
    started = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    b = burst_figures(statuses, [("b", "z")], [0.2, 0.4], started)
    assert b["phases"] == {"Succeeded": 2, "Aborted": 1}
    assert b["duration_s"] == 40.0
    assert b["lag_p50_s"] == 0.5 and b["lag_p99_s"] == 1.0 and b["timed_lag_p99_s"] == 0.5
    assert b["abort_n"] == 2 and b["abort_p99_s"] == 0.4
    lags, timed = transition_lags([statuses[("a", "x")]], (2.0, 0.0))
    assert lags == [0.5, 0.0] and timed == [0.5]


def test_the_burst_lag_is_split_by_the_aborts_window_held_or_due_within_it_inside() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    statuses = [
        # batch 1 due at 03 (ready 01 + the 2 s pause), ended 07: waiting when the window (05-10) began
        {"history": [history("01", "07"), history("08", "08.2")]},
        # due at 02, ended 02.5, both before the window; batch 2 due at 12, after it
        {"history": [history("00", "02.5"), history("12", "12.1")]},
    ]
    inside, outside = lags_by_window(statuses, (t + 5, t + 10))
    assert inside == [4.0, 0.2] and outside == [0.5, 0.1]
    statuses_by_key = {("a", str(i)): {"phase": "Succeeded", **s} for i, s in enumerate(statuses)}
    b = burst_figures(statuses_by_key, [], [], t, (t + 5, t + 10))
    assert b["abort_window_s"] == 5.0 and b["lag_in_abort_window_n"] == 2 and b["lag_outside_n"] == 2
    assert b["lag_in_abort_window_p99_s"] == 4.0 and b["lag_outside_p99_s"] == 0.5
    assert "lag_outside_n" not in burst_figures(statuses_by_key, [], [], t)


def test_the_controller_waits_over_the_burst_are_what_the_histograms_gained() -> None:
    before = {"wait:routine": ({0.1: 10.0, 1.0: 10.0, 5.0: 10.0}, 0.5, 10.0)}
    after = {
        "wait:routine": ({0.1: 15.0, 1.0: 40.0, 5.0: 110.0}, 160.5, 110.0),
        "wait:urgent": ({0.1: 3.0, 1.0: 3.0, 5.0: 3.0}, 0.03, 3.0),
        "pass": ({0.1: 0.0, 1.0: 0.0, 5.0: 0.0}, 0.0, 0.0),
    }
    w = waits_between(before, after)
    assert w["wait:routine"] == {"n": 100.0, "mean_s": 1.6, "p99_le_s": 5.0}
    assert w["wait:urgent"] == {"n": 3.0, "mean_s": 0.01, "p99_le_s": 0.1}
    assert w["pass"] == {"n": 0.0, "mean_s": None, "p99_le_s": None}


def test_a_paused_deployment_holding_a_template_is_settled_with_its_old_pods() -> None:
    def deployment(paused: bool, updated: int, ready: int = 2) -> dict[str, Any]:
        return {
            "metadata": {"generation": 3},
            "spec": {"replicas": 2, "paused": paused},
            "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": ready, "updatedReplicas": updated},
        }

    assert settled(deployment(paused=True, updated=0))
    assert not settled(deployment(paused=False, updated=0))
    assert settled(deployment(paused=False, updated=2))
    assert not settled(deployment(paused=False, updated=2, ready=1))


def event(audit_id: str, verb: str, second: int, stage: str = "ResponseComplete", agent: str = "greyrelease") -> str:
    return (
        json.dumps(
            {
                "auditID": audit_id,
                "stage": stage,
                "verb": verb,
                "userAgent": agent,
                "requestReceivedTimestamp": f"2026-01-01T00:00:{second:02d}.000000Z",
                "objectRef": {"resource": "deployments", "namespace": "ns"},
            }
        )
        + "\n"
    )


def test_each_request_is_counted_once_in_each_window_it_was_received_in(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(
        event("w1", "watch", 5, "ResponseStarted")  # a watch: when it starts, and again when it ends
        + event("l1", "list", 6)
        + event("b1", "get", 7, agent="bench")  # not the controller's
        + event("w2", "watch", 15, "ResponseStarted")  # still open when the log is read
        + event("w1", "watch", 5)
    )
    at = [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 10, 20)]
    counted = audit.requests_by_window(log, ("greyrelease",), {"first": (at[0], at[1]), "all": (at[0], None)})
    assert counted["first"] == {("watch", "deployments", "ns"): 1, ("list", "deployments", "ns"): 1}
    assert counted["all"] == {("watch", "deployments", "ns"): 2, ("list", "deployments", "ns"): 1}
    assert math.isclose(sum(counted["all"].values()), 3)


def test_a_write_at_rest_is_listed_with_its_object_and_body_and_leases_are_left_out(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"

    def write(audit_id: str, second: int, resource: str, body: dict[str, Any], agent: str = "greyrelease") -> str:
        ev = json.loads(event(audit_id, "patch", second, agent=agent))
        ev["objectRef"] = {"resource": resource, "namespace": "ns", "name": "app", "subresource": "status"}
        ev["requestObject"] = body
        ev["responseStatus"] = {"code": 200}
        return json.dumps(ev) + "\n"

    log.write_text(
        write("a", 5, "greyreleases", {"status": {"message": "x|y"}})
        + write("b", 6, "leases", {"spec": {}})  # leader election: not a write of the releases
        + write("c", 7, "greyreleases", {"status": {}}, agent="kubectl")
        + write("d", 25, "greyreleases", {"status": {}})  # after the window
        + event("e", "get", 8)
    )
    at = [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 20)]
    seen = audit.write_lines(log, ("greyrelease",), at[0], at[1])
    assert seen == ['00:00:05.000000 patch greyreleases/status ns/app -> 200: {"status":{"message":"x|y"}}']
    assert shortened(seen[0], width=12) == '00:00:05.000000 patch greyreleases/status ns/app -> 200: {"status":{"'
    row = rest_rows(
        "again at rest",
        {
            "minutes": 2.0,
            "rss_mib": [1.0],
            "peak_rss_mib": [1.0],
            "cpu_s_per_min": [0.1],
            "cpu_s_busiest_min": [0.2],
            "passes_per_min": 0.0,
            "quiet": False,
            "requests": {
                "lease_reads": 0,
                "lease_writes": 0,
                "writes_by_request": {"patch greyreleases/status": 1},
                "reads_by_verb": {},
                "reads": {},
                "dry_runs": {},
                "writes_seen": seen,
            },
        },
    )[-1]
    assert row.startswith("| again at rest: a write | `00:00:05") and "x\\|y" in row and row.count(" | ") == 1
