"""``kubectl gr``: what it shows for a release (a pure function of the object, its events and now)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from greyrelease.cli import plugin
from greyrelease.cli.plugin import _parser, age, fingerprint, is_finished, progress_bar, render_status

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/<package>/test_*.py


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def event(reason: str, seconds_ago: float, message: str = "", type: str = "Normal", count: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": f"web.{reason}.{seconds_ago}"},
        "type": type,
        "reason": reason,
        "message": message or reason.lower(),
        "count": count,
        "lastTimestamp": ts(seconds_ago),
        "involvedObject": {"uid": "u1"},
    }


def release(
    status: dict[str, Any] | None = None, *, generation: int = 1, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "u1",
            "generation": generation,
            "resourceVersion": "10",
            "annotations": annotations or {},
        },
        "spec": {"targetVersion": "v2", **spec},
        "status": status or {},
    }


PROGRESSING = {
    "phase": "Progressing",
    "phaseStartedAt": ts(75),
    "currentBatch": 2,
    "totalBatches": 5,
    "canaryWeight": 40,
    "canaryReplicas": 4,
    "stableReplicas": 6,
    "stableVersion": "v1",
    "targetVersion": "v2",
    "message": "batch 2/5: pausing 30s",
    "observedGeneration": 1,
    "batchTimes": {"nextCheckAt": (NOW + timedelta(seconds=8)).isoformat()},
    "metrics": [
        {"name": "error-rate", "value": 0.012345, "stableValue": 0.01, "verdict": "Pass", "checkedAt": ts(3)},
        {"name": "latency-p99", "value": None, "verdict": "NoData", "message": "no samples"},
    ],
}


@pytest.mark.parametrize(
    ("current", "total", "expected"),
    [
        (0, 0, "[----------] 0/?"),
        (0, 4, "[----------] 0/4"),
        (2, 5, "[####------] 2/5"),
        (1, 3, "[###-------] 1/3"),
        (5, 5, "[##########] 5/5"),
        (7, 5, "[##########] 7/5"),
    ],
    ids=["not-planned", "none-yet", "two-of-five", "rounds", "all", "never-overflows"],
)
def test_progress_bar(current: int, total: int, expected: str) -> None:
    assert progress_bar(current, total) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, "0s"), (59, "59s"), (119, "119s"), (190, "3m10s"), (3600, "60m"), (5 * 3600, "5h"), (3 * 86400, "3d")],
    ids=["now", "seconds", "under-two-minutes", "minutes-seconds", "minutes", "hours", "days"],
)
def test_age_is_kubectl_style(seconds: int, expected: str) -> None:
    assert age(ts(seconds), NOW) == expected


def test_age_unknown() -> None:
    assert age(None, NOW) == "-" and age("not a time", NOW) == "-"


def test_progressing_release_shows_everything_a_user_asks_about() -> None:
    events = [
        event("Started", 300),
        event("BatchReady", 200, "batch 1/5: 2 canary pods ready"),
        event("Promoted", 100),
        event("BatchStarted", 90, count=3),
        event("BatchReady", 60),
        event("MetricPassed", 30),
        event("Paused", 10, type="Warning"),
    ]
    annotations = {"greyrelease.io/pause": "true", "other/x": "y"}
    text = render_status(release(PROGRESSING, annotations=annotations), events, NOW)
    lines = text.splitlines()
    assert lines[:7] == [
        "Name:        web",
        "Namespace:   shop",
        "Phase:       Progressing (for 75s)",
        "Batch:       [####------] 2/5",
        "Weight:      40% to the canary",
        "Replicas:    canary 4, stable 6",
        "Versions:    stable v1 -> target v2",
    ]
    assert "Message:     batch 2/5: pausing 30s" in lines
    assert "Next check:  in 8s" in lines
    assert "Requested:   greyrelease.io/pause=true" in lines
    metrics = lines[lines.index("Metrics:") + 1 : lines.index("Events:")]
    assert [m.split() for m in metrics] == [
        ["NAME", "VALUE", "STABLE", "VERDICT", "CHECKED", "MESSAGE"],
        ["error-rate", "0.01235", "0.01", "Pass", "3s"],
        ["latency-p99", "-", "-", "NoData", "-", "no", "samples"],
    ]
    shown = lines[lines.index("Events:") + 2 :]
    # The last five, oldest first; a repeated event shows its count.
    assert [line.split()[2] for line in shown] == ["Promoted", "BatchStarted", "BatchReady", "MetricPassed", "Paused"]
    assert shown[1].split()[:2] == ["90s", "Normal"] and shown[1].endswith("batchstarted (x3)")
    assert shown[-1].split()[:2] == ["10s", "Warning"]


def test_events_of_one_second_are_ordered_by_their_microseconds() -> None:
    second = ts(5)
    later = {**event("BatchReady", 5), "eventTime": second.replace("Z", ".500000Z")}
    earlier = {**event("Promoted", 5), "eventTime": second.replace("Z", ".100000Z")}
    text = render_status(release(PROGRESSING), [later, earlier], NOW)
    assert text.index("Promoted") < text.index("BatchReady")


def test_release_the_controller_has_not_seen_yet() -> None:
    text = render_status(release(), [], NOW)
    assert "Phase:       Pending\n" in text
    assert "Batch:       [----------] 0/?" in text
    assert "Versions:    stable - -> target v2" in text
    assert "Metrics:" not in text and "Events:" not in text and "Message:" not in text


def test_finished_release_has_no_next_check_and_flags_a_newer_spec() -> None:
    st = {**PROGRESSING, "phase": "Succeeded", "currentBatch": 5, "canaryWeight": 0, "metrics": []}
    text = render_status(release(st, generation=2, paused=True), [], NOW)
    assert "Batch:       [##########] 5/5" in text
    assert "Next check" not in text
    assert "has not seen the latest spec yet" in text
    assert "Requested:   spec.paused=true" in text


@pytest.mark.parametrize(
    ("phase", "observed", "generation", "expected"),
    [
        ("Succeeded", 1, 1, True),
        ("Aborted", 3, 3, True),
        ("Failed", 1, 1, True),
        ("InvalidSpec", 1, 1, True),
        ("Progressing", 1, 1, False),
        ("Succeeded", 1, 2, False),
        (None, 0, 1, False),
    ],
    ids=["succeeded", "aborted", "failed", "invalid", "running", "new-spec-not-seen", "new"],
)
def test_is_finished(phase: str | None, observed: int, generation: int, expected: bool) -> None:
    assert is_finished(release({"phase": phase, "observedGeneration": observed}, generation=generation)) is expected


def test_fingerprint_changes_with_the_object_or_its_events_not_with_time() -> None:
    r = release(PROGRESSING)
    base = fingerprint(r, [event("Started", 10)])
    assert fingerprint(r, [event("Started", 10)]) == base
    assert fingerprint({**r, "metadata": {**r["metadata"], "resourceVersion": "11"}}, [event("Started", 10)]) != base
    assert fingerprint(r, [event("Started", 10, count=2)]) != base
    assert fingerprint(r, [event("Started", 10), event("BatchReady", 5)]) != base


@pytest.mark.parametrize(
    "argv",
    [["-n", "shop", "status", "web"], ["status", "web", "-n", "shop"], ["status", "-n", "shop", "web", "-w"]],
    ids=["flag-first", "flag-last", "flag-between"],
)
def test_namespace_flag_anywhere(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert (args.command, args.name, args.namespace) == ("status", "web", "shop")


def test_namespace_defaults_to_none_so_the_context_decides() -> None:
    args = _parser().parse_args(["promote", "web", "--full"])
    assert args.namespace is None and args.full


def test_plan_with_replicas_needs_no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    out = io.StringIO()
    sample = ROOT / "config" / "samples" / "greyrelease.io_v1_greyrelease.yaml"
    assert plugin.main(["plan", "-f", str(sample), "--replicas", "10"], out=out) == 0
    assert out.getvalue().splitlines()[2].split() == ["1", "2", "8", "20%", "10s", "-"]


def test_no_credentials_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert plugin.main(["status", "web"]) == 1
    assert "no usable Kubernetes credentials" in capsys.readouterr().err


def test_the_plugins_requests_name_it_not_the_controller_in_the_audit_log(tmp_path: Path) -> None:
    # The audit log tells the controller's writes by their User-Agent ("greyrelease"); a person's
    # `kubectl gr promote` must not be counted among them.
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "shop"}}],
                "current-context": "x",
            }
        )
    )
    client, namespace = plugin.connect(str(kubeconfig), None)
    assert namespace == "shop"
    assert client.user_agent == plugin.USER_AGENT == "kubectl-gr"
    assert not client.user_agent.startswith("greyrelease")


def test_status_shows_the_time_left_for_an_approval_and_the_place_in_the_queue() -> None:
    waiting = {
        **PROGRESSING,
        "batchState": "WaitingForApproval",
        "batchTimes": {"approvalExpiresAt": (NOW + timedelta(hours=3, minutes=59, seconds=12)).isoformat()},
    }
    text = render_status(release(waiting), [], NOW)
    assert "Approval:    3h59m12s left (until " in text, text
    queued = {"phase": "Queued", "queuePosition": 2, "message": "position 2 in the queue of namespace shop"}
    text = render_status(release(queued), [], NOW)
    assert "Queue:       position 2" in text and "Approval:" not in text, text
    ended = {**waiting, "phase": "Aborted"}
    assert "Approval:" not in render_status(release(ended), [], NOW)


def test_plan_from_a_start_time_follows_the_windows_and_freezes(tmp_path: Path) -> None:
    doc = {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web"},
        "spec": {
            "targetRef": {"name": "web"},
            "targetVersion": "v2",
            "batches": [{"replicas": 1, "pause": "2h"}, {"replicas": 5, "pause": "30m"}, {"replicas": 10}],
            "windows": [{"days": ["Mon-Fri"], "start": "09:00", "end": "17:00", "timeZone": "Europe/Berlin"}],
            "freezes": [{"from": "2026-12-07T00:00:00Z", "to": "2026-12-08T00:00:00Z", "reason": "board"}],
        },
    }
    path = tmp_path / "web.yaml"
    path.write_text(json.dumps(doc))
    out = io.StringIO()
    argv = ["plan", "-f", str(path), "--replicas", "10", "--start", "2026-12-04T15:30:00+01:00"]
    assert plugin.main(argv, out=out) == 0
    lines = out.getvalue().splitlines()
    # Friday 15:30 in Berlin: batch 1 at once; its 2 h pause ends after 17:00, Monday is frozen: Tuesday 09:00.
    assert [line.split()[5] for line in lines[2:5]] == [
        "2026-12-04T15:30:00+01:00",
        "2026-12-08T09:00:00+01:00",
        "2026-12-08T09:30:00+01:00",
    ], lines
    assert lines[-1].startswith("earliest finish: 2026-12-08T09:30:00+01:00 (90h from the start"), lines


def test_plan_refuses_an_unreadable_start(tmp_path: Path) -> None:
    sample = ROOT / "config" / "samples" / "greyrelease.io_v1_greyrelease.yaml"
    with pytest.raises(SystemExit, match="--start: 'monday' is not an RFC 3339 time"):
        plugin.main(["plan", "-f", str(sample), "--replicas", "10", "--start", "monday"], out=io.StringIO())


def test_status_shows_each_webhooks_last_answer_and_the_confirm_waited_for() -> None:
    held = {
        **PROGRESSING,
        "awaitingConfirmation": "change-board",
        "webhooks": [
            {
                "name": "smoke",
                "at": "pre-traffic",
                "verdict": "Pass",
                "code": 200,
                "value": "true",
                "message": "result.ok = true",
                "checkedAt": ts(30),
            },
            {"name": "change-board", "at": "live", "kind": "confirm", "verdict": "Fail", "code": 403},
        ],
    }
    text = render_status(release(held), [], NOW)
    assert "Confirm:     waiting for a yes from webhook change-board" in text, text
    lines = text.splitlines()
    header = lines.index("Webhooks:") + 1
    assert lines[header].split() == ["NAME", "AT", "CODE", "VALUE", "VERDICT", "CALLED", "MESSAGE"]
    assert lines[header + 1].split()[:5] == ["smoke", "pre-traffic", "200", "true", "Pass"]
    assert lines[header + 1].rstrip().endswith("result.ok = true")
    assert lines[header + 2].split()[:5] == ["change-board", "live", "403", "-", "Fail"]
    assert "Confirm:" not in render_status(release({**held, "phase": "Aborted"}), [], NOW)
