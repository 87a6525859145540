"""Events are posted once per transition, even by a controller killed between posting and the status write;
the status is written only when it changes."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest
from greyrelease.api.release import GreyReleaseStatus, Phase
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import ApiError, path
from greyrelease.planner.actions import Event, Plan, Regarding
from greyrelease.reconcile.record import event_names, numbered, post_events, stored, write_status

from tests.support.faults import refuse

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
EVENTS = path("", "v1", "events", "shop")


def release(status: dict[str, Any], **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "generation": 1, "annotations": annotations},
        "status": status,
    }


READY = (Event("Normal", "BatchReady", "batch 1/3: 2 canary pods ready, weight 20%"),)


def plan(*events: Event, read: int | None = None) -> Plan:
    """The plan of the transition after ``read`` (the status's ``transitions`` as read)."""
    return numbered(Plan(status=GreyReleaseStatus(), events=events), GreyReleaseStatus(transitions=read))


def test_a_transition_planned_again_from_the_same_state_posts_nothing_new() -> None:
    kube = MemoryKube()
    before = release({"phase": "Progressing", "currentBatch": 1})
    post_events(kube, before, plan(*READY), NOW)
    post_events(kube, before, plan(*READY), NOW)  # killed before the status write: the same pass again
    events = kube.objects(EVENTS)
    assert len(events) == 1
    (ev,) = events
    assert ev["reason"] == "BatchReady" and ev["involvedObject"]["kind"] == "GreyRelease"
    assert ev["involvedObject"]["uid"] == "u1" and ev["metadata"]["namespace"] == "shop"


@pytest.mark.parametrize(
    "other",
    [
        release({}, **{"greyrelease.io/last-handled-configuration": "{}"}),  # kopf's bookkeeping
        release({}, **{"greyrelease.io/abort": "true"}),  # a person's request, landed in between
        # A status written in between.
        release({"phase": "Progressing", "currentBatch": 1, "batchTimes": {"readyAt": "x"}}),
        {**release({}), "metadata": {**release({})["metadata"], "generation": 2}},  # a spec edit
    ],
    ids=["kopf-annotation", "user-annotation", "status", "generation"],
)
def test_whatever_else_the_repeat_reads_the_same_transition_gets_the_same_names(other: dict[str, Any]) -> None:
    kube = MemoryKube()
    post_events(kube, release({}), plan(*READY, read=3), NOW)
    reworded = Event("Normal", "BatchReady", "batch 1/3: 2 canary pods ready, weight 21%")
    post_events(kube, other, plan(reworded, read=3), NOW)
    assert [e["message"] for e in kube.objects(EVENTS)] == [READY[0].message]


def test_the_next_transition_and_a_second_event_of_a_reason_get_names_of_their_own() -> None:
    kube = MemoryKube()
    post_events(kube, release({}), plan(*READY), NOW)
    post_events(kube, release({}), plan(*READY, read=1), NOW)
    post_events(kube, release({}), plan(*READY, READY[0], read=2), NOW)
    assert len(kube.objects(EVENTS)) == 4
    other_release = {**release({}), "metadata": {**release({})["metadata"], "uid": "u2"}}
    post_events(kube, other_release, plan(*READY), NOW)  # deleted and made again: another object
    assert len(kube.objects(EVENTS)) == 5


def test_an_event_about_the_deployment_is_posted_on_it_once_under_a_name_of_its_own() -> None:
    kube = MemoryKube()
    web = Regarding("web", "d1")
    both = (Event("Warning", "HandedBack", "on the release"), Event("Warning", "HandedBack", "on web", web))
    post_events(kube, release({}), plan(*both, read=4), NOW)
    post_events(kube, release({}), plan(*both, read=4), NOW)  # killed before the status write: again
    events = {e["involvedObject"]["kind"]: e for e in kube.objects(EVENTS)}
    assert len(kube.objects(EVENTS)) == 2 and sorted(events) == ["Deployment", "GreyRelease"]
    deployment = events["Deployment"]
    assert deployment["involvedObject"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "web",
        "namespace": "shop",
        "uid": "d1",
    }
    assert deployment["message"] == "on web" and deployment["type"] == "Warning"
    # The release's own Event keeps the name it had before Events could be about another object.
    (name,) = event_names(release({}), 5, both[:1])
    assert events["GreyRelease"]["metadata"]["name"] == name
    assert name == f"web.{hashlib.sha256(b'u1|5|HandedBack|1').hexdigest()[:16]}"
    assert (
        event_names(release({}), 5, both)[1]
        == f"web.{hashlib.sha256(b'u1|5|Deployment|HandedBack|1').hexdigest()[:16]}"
    )


def test_a_plan_with_events_records_the_next_number_and_one_without_keeps_it() -> None:
    assert plan(*READY).status.transitions == 1
    assert plan(*READY, read=7).status.transitions == 8
    assert plan(read=7).status.transitions is None  # the plan's own status, untouched


def test_an_event_the_api_server_refuses_does_not_stop_the_pass() -> None:
    kube = MemoryKube()

    refuse(kube, lambda: ApiError(403, "Forbidden", "no"))
    post_events(kube, release({}), plan(*READY), NOW)
    assert kube.requests == [("POST", EVENTS)]


# --- the status is written only when it changes ---------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {},
        # endPhase's None is written as "" (not dropped like other nulls); conditions and metrics, lists of objects.
        {
            "phase": "RollingBack",
            "endPhase": "Aborted",
            "metrics": [{"name": "errors", "successes": 1}],
            "conditions": [
                {
                    "type": "Healthy",
                    "status": "False",
                    "reason": "RollingBack",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T12:00:00.000Z",
                }
            ],
        },
    ],
)
def test_a_status_with_null_fields_equal_to_the_stored_one_is_not_written_again(extra: dict[str, Any]) -> None:
    status = GreyReleaseStatus.model_validate(
        {
            "phase": "Paused",
            "currentBatch": 1,
            "totalBatches": 2,
            "restore": {"replicas": 2, "image": "app:v1"},
            "history": [{"batch": 1, "startedAt": "2026-01-01T12:00:00.000Z"}],
            **extra,
        }
    )
    kube = MemoryKube(release({}))
    assert write_status(kube, release({}), status)
    # What the API server keeps of that patch: no null anywhere (history[0].finishedAt, ...).
    written = (kube.get(path("greyrelease.io", "v1", "greyreleases", "shop", "web")) or {})["status"]
    assert "finishedAt" not in written["history"][0] and written == stored(written)
    assert not write_status(kube, release(written), status)
    assert write_status(kube, release(written), status.model_copy(update={"phase": Phase.PROGRESSING}))
    assert [verb for verb, _ in kube.requests if verb != "GET"] == ["PATCH", "PATCH"]
