"""`kubectl gr status` of a release in follow mode: what the Deployment holds, what serves as the stable,
whether the API server holds new templates (the self-test's Held condition) and how the last release ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from greyrelease.api.release import ABORT_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION
from greyrelease.cli.plugin import render_status, request_changes
from greyrelease.planner.asks import word

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def followed(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "generation": 1},
        "spec": {"targetRef": {"name": "web"}, **spec},
        "status": {"observedGeneration": 1, **status},
    }


def lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{name}:")]


def test_a_held_template_the_stable_and_the_last_release_are_shown() -> None:
    status = {
        "phase": "Progressing",
        "held": {
            "digest": "7c9f5d21a0b3e4f1",
            "images": [{"name": "app", "image": "web:v2"}, {"name": "proxy", "image": "envoy:1.30"}],
            "heldSince": "2025-06-01T11:58:00Z",
        },
        "stable": {"name": "web-5d8f6c", "images": [{"name": "app", "image": "web:v1"}]},
        "lastRelease": {"outcome": "Aborted", "endedAt": "2025-06-01T10:00:00Z", "message": "gate error-rate"},
    }
    text = render_status(followed(status), [], NOW)
    assert lines(text, "Mode") == ["Mode:        follow (every new pod template of the Deployment is released)"]
    assert lines(text, "Held") == ["Held:        7c9f5d21a0b3e4f1 (app=web:v2, proxy=envoy:1.30), held for 2m0s"]
    assert lines(text, "Stable") == ["Stable:      web-5d8f6c (app=web:v1)"]
    assert lines(text, "Last") == ["Last:        Aborted 120m ago: gate error-rate"]


def test_the_versions_are_the_templates_named_by_their_images_as_the_messages_name_them() -> None:
    stable = {"name": "web-5d8f6c", "digest": "5d8f6c0a11223344", "images": [{"name": "app", "image": "web:v1"}]}
    held = {"digest": "7c9f5d21a0b3e4f1", "images": [{"name": "app", "image": "web:v2"}]}
    text = render_status(followed({"phase": "Progressing", "stable": stable, "held": held}), [], NOW)
    assert lines(text, "Versions") == [
        "Versions:    stable web:v1 (template 5d8f6c0a) -> held web:v2 (template 7c9f5d21)"
    ]
    restarted = {"digest": "9a8b7c6d55667788", "images": [{"name": "app", "image": "web:v1"}]}
    text = render_status(followed({"phase": "Progressing", "stable": stable, "held": restarted}), [], NOW)
    assert lines(text, "Versions") == [
        "Versions:    stable web:v1 (template 5d8f6c0a) -> held template 9a8b7c6d (web:v1, images unchanged)"
    ]
    idle = render_status(followed({"phase": "Idle", "stable": stable}), [], NOW)
    assert lines(idle, "Versions") == ["Versions:    stable web:v1 (template 5d8f6c0a) -> held -"]
    pinned = render_status(followed({"stableVersion": "v1", "targetVersion": "v2"}, targetVersion="v2"), [], NOW)
    assert lines(pinned, "Versions") == ["Versions:    stable v1 -> target v2"]


def test_nothing_held_shows_only_the_mode_and_pinned_mode_shows_none_of_it() -> None:
    idle = render_status(followed({"phase": "Idle"}), [], NOW)
    assert lines(idle, "Mode") and not lines(idle, "Held") and not lines(idle, "Last")
    pinned = render_status(followed({"phase": "Progressing", "held": {"digest": "x"}}, targetVersion="v2"), [], NOW)
    assert not lines(pinned, "Mode") and not lines(pinned, "Held")


def test_the_self_test_of_the_hold_is_shown_as_its_condition_says() -> None:
    refused = {
        "type": "Held",
        "status": "False",
        "reason": "WebhookRefused",
        "message": "the API server refuses a template change of Deployment shop/web: no endpoints",
        "lastTransitionTime": "2025-06-01T11:55:00Z",
    }
    text = render_status(followed({"phase": "Idle", "conditions": [refused]}), [], NOW)
    assert lines(text, "Hold test") == [
        "Hold test:   Held=False (WebhookRefused) for 5m0s: the API server refuses a template change of "
        "Deployment shop/web: no endpoints"
    ]
    assert not lines(render_status(followed({"phase": "Idle"}), [], NOW), "Hold test")


# --- the requests it writes ---------------------------------------------------------------------------


def test_promote_writes_the_current_batch_and_a_time_so_each_promote_is_a_new_value() -> None:
    waiting = followed({"phase": "Progressing", "batchState": "WaitingForApproval", "currentBatch": 2})
    first = request_changes("promote", waiting, NOW)
    again = request_changes("promote", waiting, NOW + timedelta(seconds=1))
    assert first == {PROMOTE_ANNOTATION: "2@2025-06-01T12:00:00Z"}
    assert again == {PROMOTE_ANNOTATION: "2@2025-06-01T12:00:01Z"} and again != first
    assert request_changes("promote", followed({}), NOW) == {PROMOTE_ANNOTATION: "1@2025-06-01T12:00:00Z"}
    assert request_changes("promote", waiting, NOW, full=True) == {PROMOTE_ANNOTATION: "full@2025-06-01T12:00:00Z"}


def test_abort_and_retry_write_new_values_and_resume_removes_the_pause() -> None:
    running = followed({"phase": "Progressing", "currentBatch": 1})
    abort = request_changes("abort", running, NOW)
    assert abort == {ABORT_ANNOTATION: "true@2025-06-01T12:00:00Z"} and word(abort[ABORT_ANNOTATION]) == "true"
    assert request_changes("retry", running, NOW) == {RETRY_ANNOTATION: "2025-06-01T12:00:00Z"}
    assert request_changes("resume", running, NOW) == {PAUSE_ANNOTATION: None}
