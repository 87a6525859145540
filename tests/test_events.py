"""Events are posted once per transition, even by a controller killed between posting and the status write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from greyrelease.actions import Event
from greyrelease.api import GreyReleaseStatus, Phase
from greyrelease.kubeclient import ApiError, Conflict
from greyrelease.reconciler import Reconciler, _stored

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


class EventSink:
    """Accepts Event creations as the API server does: a name taken is a 409."""

    def __init__(self, fail: int | None = None) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.fail = fail

    def create(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail is not None:
            raise ApiError(self.fail, "Forbidden", "no")
        name = body["metadata"]["name"]
        if name in self.events:
            raise Conflict(409, "AlreadyExists", name)
        self.events[name] = body
        return body


def release(status: dict[str, Any], **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": "shop", "uid": "u1", "generation": 1,
                         "annotations": annotations}, "status": status}  # fmt: skip


READY = (Event("Normal", "BatchReady", "batch 1/3: 2 canary pods ready, weight 20%"),)


def test_a_transition_planned_again_from_the_same_state_posts_nothing_new() -> None:
    sink = EventSink()
    r = Reconciler(sink)  # type: ignore[arg-type]
    before = release({"phase": "Progressing", "currentBatch": 1})
    r.post_events(before, READY, NOW)
    r.post_events(before, READY, NOW)  # killed before the status write: the same pass again
    assert len(sink.events) == 1
    (ev,) = sink.events.values()
    assert ev["reason"] == "BatchReady" and ev["involvedObject"]["kind"] == "GreyRelease"
    assert ev["involvedObject"]["uid"] == "u1" and ev["metadata"]["namespace"] == "shop"


def test_kopfs_own_annotations_written_in_between_do_not_change_the_names() -> None:
    sink = EventSink()
    r = Reconciler(sink)  # type: ignore[arg-type]
    r.post_events(release({}), READY, NOW)
    r.post_events(release({}, **{"greyrelease.io/last-handled-configuration": "{}"}), READY, NOW)
    assert len(sink.events) == 1


def test_the_same_event_from_another_state_is_posted_again() -> None:
    sink = EventSink()
    r = Reconciler(sink)  # type: ignore[arg-type]
    r.post_events(release({"phase": "Progressing", "currentBatch": 1}), READY, NOW)
    r.post_events(release({"phase": "Progressing", "currentBatch": 1, "batchReadyAt": "x"}), READY, NOW)
    r.post_events(release({"phase": "Progressing", "currentBatch": 1}, **{"greyrelease.io/pause": "true"}), READY, NOW)
    assert len(sink.events) == 3


def test_an_event_the_api_server_refuses_does_not_stop_the_pass() -> None:
    r = Reconciler(EventSink(fail=403))  # type: ignore[arg-type]
    r.post_events(release({}), READY, NOW)


# --- the status is written only when it changes ---------------------------------------------------


class StatusSink:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch(self, p: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.patches.append(body)
        return body


def test_a_status_with_null_fields_equal_to_the_stored_one_is_not_written_again() -> None:
    status = GreyReleaseStatus.model_validate({
        "phase": "Paused", "currentBatch": 1, "totalBatches": 2, "restore": {"replicas": 2, "image": "app:v1"},
        "history": [{"batch": 1, "startedAt": "2026-01-01T12:00:00.000Z"}],
    })  # fmt: skip
    sink = StatusSink()
    r = Reconciler(sink)  # type: ignore[arg-type]
    assert r.write_status(release({}), status)
    # What the API server keeps of that patch: no null anywhere (history[0].finishedAt, ...).
    stored = _stored(sink.patches[0]["status"])
    assert "finishedAt" not in stored["history"][0]
    assert not r.write_status(release(stored), status)
    assert r.write_status(release(stored), status.model_copy(update={"phase": Phase.PROGRESSING}))
    assert len(sink.patches) == 2
