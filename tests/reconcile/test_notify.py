"""Notifications: the payloads of both formats (tables: an Event and a status in, the JSON out), which
notification an Event goes to, and that a pass hands on the notifications of the Events it created only:
none for an Event refused with 409, however a controller is killed between its writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from greyrelease.api.release import (
    NOTIFY_DEFAULT_ON,
    GreyReleasePolicy,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Notification,
    Obj,
)
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import Conflict, path
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Event, Regarding
from greyrelease.reconcile.notify import (
    ATTENTION,
    DANGER,
    GOOD,
    INFO,
    NOTIFICATION_FAILED,
    Delivery,
    generic,
    occurrence,
    route,
    slack,
    targets,
)
from greyrelease.reconcile.reconciler import Reconciler
from pydantic import ValidationError

from tests.support.builders import EVENTS, NS, T0, cluster, release, roll_out, stable, status_of
from tests.support.faults import Crash, crash_before_write

NOW = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)
RELEASE: Obj = {"metadata": {"name": "web", "namespace": "shop", "uid": "u1", "generation": 3}}
SECRET = {"name": "hooks", "key": "url"}

PROGRESSING = {
    "phase": "Progressing",
    "currentBatch": 1,
    "totalBatches": 3,
    "canaryWeight": 20,
    "stableVersion": "v1",
    "targetVersion": "v2",
}
FAILED_METRIC = {"name": "error-rate", "value": 0.12, "verdict": "Fail", "message": "0.12 > max 0.05"}
ROLLING_BACK = {**PROGRESSING, "phase": "RollingBack", "currentBatch": 2, "canaryWeight": 0}


def status(**fields: Any) -> GreyReleaseStatus:
    return GreyReleaseStatus.model_validate(fields)


def body(event: Event, after: dict[str, Any], read: dict[str, Any] | None = None) -> dict[str, Any]:
    o = occurrence("web.0123456789abcdef", event, RELEASE, status(**after), status(**(read or {})), NOW)
    return generic(o)


BASE = {
    "apiVersion": "greyrelease.io/v1",
    "kind": "GreyReleaseEvent",
    "id": "web.0123456789abcdef",
    "time": "2026-01-01T12:00:00.250Z",
    "release": {"namespace": "shop", "name": "web", "uid": "u1", "generation": 3},
}

GENERIC = [
    pytest.param(
        Event("Normal", R.BATCH_READY, "batch 1/3: 1 canary pods ready, weight 20%"),
        PROGRESSING,
        None,
        {
            **BASE,
            "reason": "BatchReady",
            "type": "Normal",
            "message": "batch 1/3: 1 canary pods ready, weight 20%",
            "phase": "Progressing",
            "batch": {"current": 1, "total": 3},
            "weight": 20,
            "versions": {"stable": "v1", "target": "v2"},
        },
        id="batch-ready",
    ),
    pytest.param(
        Event("Warning", R.ANALYSIS_FAILED, "batch 2/3: metric error-rate: 0.12 > max 0.05 (1 failed checks > 0)"),
        {**ROLLING_BACK, "metrics": [FAILED_METRIC]},
        None,
        {
            **BASE,
            "reason": "AnalysisFailed",
            "type": "Warning",
            "message": "batch 2/3: metric error-rate: 0.12 > max 0.05 (1 failed checks > 0)",
            "phase": "RollingBack",
            "batch": {"current": 2, "total": 3},
            "weight": 0,
            "versions": {"stable": "v1", "target": "v2"},
            "metric": {"name": "error-rate", "value": 0.12, "verdict": "Fail"},
        },
        id="analysis-failed-with-the-value",
    ),
    pytest.param(
        Event("Warning", R.METRIC_CHECK_FAILED, "batch 2/3: metric latency.p99: query failed: timeout"),
        ROLLING_BACK,  # the plan's status has no metrics: the value is the one read
        {"metrics": [{"name": "latency.p99", "value": 0.3, "verdict": "Error"}]},
        {
            **BASE,
            "reason": "MetricCheckFailed",
            "type": "Warning",
            "message": "batch 2/3: metric latency.p99: query failed: timeout",
            "phase": "RollingBack",
            "batch": {"current": 2, "total": 3},
            "weight": 0,
            "versions": {"stable": "v1", "target": "v2"},
            "metric": {"name": "latency.p99", "value": 0.3, "verdict": "Error"},
        },
        id="metric-from-the-status-read",
    ),
    pytest.param(
        Event("Warning", R.ANALYSIS_FAILED, "batch 1/3: metric gone: no data"),
        PROGRESSING,
        None,
        {
            **BASE,
            "reason": "AnalysisFailed",
            "type": "Warning",
            "message": "batch 1/3: metric gone: no data",
            "phase": "Progressing",
            "batch": {"current": 1, "total": 3},
            "weight": 20,
            "versions": {"stable": "v1", "target": "v2"},
            "metric": {"name": "gone", "value": None, "verdict": ""},
        },
        id="metric-without-a-status",
    ),
    pytest.param(
        Event("Warning", R.PROGRESS_DEADLINE, "batch 1/3: metric-free text"),
        {**ROLLING_BACK, "metrics": [FAILED_METRIC]},
        None,
        {
            **BASE,
            "reason": "ProgressDeadlineExceeded",
            "type": "Warning",
            "message": "batch 1/3: metric-free text",
            "phase": "RollingBack",
            "batch": {"current": 2, "total": 3},
            "weight": 0,
            "versions": {"stable": "v1", "target": "v2"},
        },
        id="not-about-a-metric",
    ),
    pytest.param(
        Event("Normal", R.SUCCEEDED, "released v2"),
        {"phase": "Succeeded", "currentBatch": 3, "totalBatches": 3, "canaryWeight": 0, "stableVersion": "v2"},
        None,
        {
            **BASE,
            "reason": "Succeeded",
            "type": "Normal",
            "message": "released v2",
            "phase": "Succeeded",
            "batch": {"current": 3, "total": 3},
            "weight": 0,
            "versions": {"stable": "v2", "target": ""},
        },
        id="succeeded",
    ),
]


@pytest.mark.parametrize(("event", "after", "read", "expected"), GENERIC)
def test_the_generic_payload(
    event: Event, after: dict[str, Any], read: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    assert body(event, after, read) == expected


SLACK = [
    pytest.param(
        Event("Warning", R.ANALYSIS_FAILED, "batch 2/3: metric error-rate: 0.12 > max 0.05"),
        {**ROLLING_BACK, "metrics": [FAILED_METRIC]},
        DANGER,
        [
            ("Phase", "RollingBack"),
            ("Batch", "2/3"),
            ("Weight", "0%"),
            ("Versions", "v1 → v2"),
            ("Metric", "error-rate = 0.12 (Fail)"),
        ],
        "batch 2/3: metric error-rate: 0.12 &gt; max 0.05",
        id="failed",
    ),
    pytest.param(
        Event("Normal", R.WAITING_FOR_APPROVAL, "batch 1/3: weight 20%, waiting for approval"),
        PROGRESSING,
        ATTENTION,
        [("Phase", "Progressing"), ("Batch", "1/3"), ("Weight", "20%"), ("Versions", "v1 → v2")],
        "batch 1/3: weight 20%, waiting for approval",
        id="approval",
    ),
    pytest.param(
        Event("Normal", R.SUCCEEDED, "released <v2> & done"),
        {"phase": "Succeeded", "stableVersion": "v2"},
        GOOD,
        [("Phase", "Succeeded"), ("Weight", "0%"), ("Versions", "v2 → ?")],
        "released &lt;v2&gt; &amp; done",
        id="succeeded-escaped-no-batches",
    ),
    pytest.param(
        Event("Normal", R.BATCH_READY, "batch 1/3 ready"),
        {},
        INFO,
        [("Phase", "-"), ("Weight", "0%")],
        "batch 1/3 ready",
        id="nothing-known",
    ),
]


@pytest.mark.parametrize(("event", "after", "color", "fields", "text"), SLACK)
def test_the_slack_payload(
    event: Event, after: dict[str, Any], color: str, fields: list[tuple[str, str]], text: str
) -> None:
    o = occurrence("web.0123456789abcdef", event, RELEASE, status(**after), status(), NOW)
    message = slack(o)
    assert set(message) == {"text", "attachments"}
    assert message["text"] == f"GreyRelease shop/web: {event.reason}"
    (attachment,) = message["attachments"]
    assert attachment["color"] == color
    assert attachment["title"] == event.reason and attachment["author_name"] == "shop/web"
    assert attachment["text"] == text
    assert attachment["fallback"] == f"GreyRelease shop/web: {event.reason}: {text}"
    assert [(f["title"], f["value"]) for f in attachment["fields"]] == fields
    assert all(isinstance(f["short"], bool) for f in attachment["fields"])
    assert attachment["footer"] == "greyrelease · web.0123456789abcdef"
    assert attachment["ts"] == int(NOW.timestamp())
    json.dumps(message)  # plain JSON, as a webhook takes it


# --- which notification an Event goes to -------------------------------------------------------------


def notification(name: str = "oncall", **fields: Any) -> Notification:
    return Notification.model_validate({"name": name, "urlSecretRef": SECRET, **fields})


@pytest.mark.parametrize(
    ("type", "reason", "sent"),
    [
        ("Warning", R.ANALYSIS_FAILED, True),
        ("Warning", R.ROUTING_ERROR, True),
        ("Normal", R.WAITING_FOR_APPROVAL, True),
        ("Warning", R.APPROVAL_EXPIRED, True),  # an approval that expired and aborted
        ("Normal", R.APPROVAL_EXPIRED, True),  # ... and one that went on (onTimeout: promote)
        ("Normal", R.SUCCEEDED, True),
        ("Normal", R.BATCH_READY, False),
        ("Normal", R.RELEASE_STARTED, False),
    ],
)
def test_the_default_on_is_every_warning_an_approval_wait_or_expiry_and_success(
    type: str, reason: str, sent: bool
) -> None:
    assert notification().wants(type, reason) is sent


def test_the_default_names_real_reasons_and_types() -> None:
    known = {v for k, v in vars(R).items() if k.isupper() and not k.startswith("COND_")}
    assert set(NOTIFY_DEFAULT_ON) - {"Warning"} <= known
    assert notification().on == list(NOTIFY_DEFAULT_ON)


def test_an_on_list_of_reasons_and_a_type() -> None:
    n = notification(on=["BatchReady", "Normal"])
    assert n.wants("Normal", R.RELEASE_STARTED) and n.wants("Normal", R.BATCH_READY)
    assert not n.wants("Warning", R.ANALYSIS_FAILED)


@pytest.mark.parametrize(
    ("notifications", "field", "text"),
    [
        ([{"name": "a", "urlSecretRef": SECRET}, {"name": "a", "urlSecretRef": SECRET}], "notifications", "unique"),
        ([{"name": "a", "format": "teams", "urlSecretRef": SECRET}], "notifications.0.format", "'generic'"),
        ([{"name": "a", "urlSecretRef": SECRET, "on": []}], "notifications.0.on", "at least 1"),
        ([{"name": "a", "urlSecretRef": SECRET, "on": ["batch-ready"]}], "notifications.0.on.0", "pattern"),
        ([{"name": "A_b", "urlSecretRef": SECRET}], "notifications.0.name", "pattern"),
        ([{"name": "a", "urlSecretRef": {"name": "hooks"}}], "notifications.0.urlSecretRef.key", "required"),
        ([{"name": "a"}], "notifications.0.urlSecretRef", "required"),
    ],
)
def test_a_bad_notification_is_refused_naming_its_field(notifications: list[Any], field: str, text: str) -> None:
    spec = {"targetRef": {"name": "web"}, "batchSize": 1, "canaryWeight": 10, "notifications": notifications}
    for model, doc in ((GreyReleaseSpec, spec), (GreyReleasePolicy, {"spec": {"notifications": notifications}})):
        with pytest.raises(ValidationError) as err:
            model.model_validate(doc)
        (first,) = err.value.errors()
        loc = ".".join(str(p) for p in first["loc"])
        assert loc.endswith(field.replace("urlSecretRef", "url_secret_ref")) or loc.endswith(field), loc
        assert text in first["msg"], first["msg"]


def policy(name: str, *notifications: Notification, namespaces: list[str] | None = None) -> GreyReleasePolicy:
    return GreyReleasePolicy.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "namespaces": namespaces,
                "notifications": [n.model_dump(by_alias=True) for n in notifications],
            },
        }
    )


def test_a_policys_notifications_read_their_secret_in_the_controllers_namespace_a_releases_in_its_own() -> None:
    found = targets(
        [policy("platform", notification("chat", format="slack"))], [notification("team")], "shop", "greyrelease-system"
    )
    assert [(t.source, t.notification.name, t.namespace) for t in found] == [
        ("GreyReleasePolicy/platform", "chat", "greyrelease-system"),
        ("GreyRelease", "team", "shop"),
    ]
    created = [
        ("web.aaaa", Event("Normal", R.BATCH_READY, "ready")),
        ("web.bbbb", Event("Warning", R.ANALYSIS_FAILED, "batch 1/3: metric m: bad")),
        ("web.cccc", Event("Warning", NOTIFICATION_FAILED, "notification team: Secret shop/hooks not found")),
    ]
    out = route(found, created, RELEASE, status(**PROGRESSING), status(), NOW)
    # The Deployment's copy of an Event (follow mode) is not sent: the release's own of the same pass is.
    on_target = ("web.dddd", Event("Warning", R.RELEASE_ABORTED, "paused by GreyRelease web", Regarding("web", "d1")))
    assert route(found, [on_target], RELEASE, status(**PROGRESSING), status(), NOW) == []
    assert [(d.event, d.notification, d.format, d.secret) for d in out] == [
        ("web.bbbb", "chat", "slack", ("greyrelease-system", "hooks", "url")),
        ("web.bbbb", "team", "generic", ("shop", "hooks", "url")),
    ]
    assert json.loads(out[1].body)["id"] == "web.bbbb"
    assert "attachments" in json.loads(out[0].body)
    assert all((d.namespace, d.release, d.uid) == ("shop", "web", "u1") for d in out)


# --- a pass hands on the notifications of the Events it created, and only those --------------------


EVERYTHING = [{"name": "all", "urlSecretRef": SECRET, "on": ["Normal", "Warning"]}]


def event_names(kube: MemoryKube) -> list[str]:
    ordered = sorted(kube.objects(EVENTS), key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e["metadata"]["name"] for e in ordered]


def release_run(kube: MemoryKube, sent: list[Delivery], *, until: str = "Succeeded") -> None:
    """Passes until the phase is ``until``; a pass killed by a fault is run again by a new controller."""
    reconciler, now = Reconciler(kube, notify=sent.extend), T0
    for _ in range(80):
        try:
            outcome = reconciler.reconcile(NS, "web", now=now)
        except (Crash, Conflict):
            reconciler = Reconciler(kube, notify=sent.extend)
            continue
        assert outcome is not None
        if status_of(kube).get("phase") == until:
            return
        roll_out(kube)
        wait = outcome.plan.requeue_after
        now += timedelta(seconds=1.0 if wait is None else min(wait, 3600.0))
    raise AssertionError(f"never reached {until}: {status_of(kube)}")


def test_every_event_of_a_release_is_handed_on_once_in_order() -> None:
    kube, sent = cluster(notifications=EVERYTHING), list[Delivery]()
    release_run(kube, sent)
    assert [d.event for d in sent] == event_names(kube)
    assert len(sent) >= 8 and {d.notification for d in sent} == {"all"}


def test_a_pass_repeated_after_its_status_write_was_lost_hands_on_nothing() -> None:
    kube, sent = cluster(notifications=EVERYTHING), list[Delivery]()
    first = Reconciler(kube, notify=sent.extend).reconcile(NS, "web", now=T0)
    assert first is not None and first.plan.events and len(sent) == len(first.plan.events)
    # The status as it was before that pass: the next pass plans the same transition, and its Events are
    # refused with 409.
    kube.put({**(kube.get(path("greyrelease.io", "v1", "greyreleases", NS, "web")) or {}), "status": {}})
    again = Reconciler(kube, notify=sent.extend).reconcile(NS, "web", now=T0)
    assert again is not None and [e.reason for e in again.plan.events] == [e.reason for e in first.plan.events]
    assert len(sent) == len(first.plan.events) and len(event_names(kube)) == len(sent)


def test_a_controller_killed_before_any_write_hands_on_no_event_twice_nor_one_it_did_not_create() -> None:
    clean, clean_sent = cluster(notifications=EVERYTHING), list[Delivery]()
    clean.requests.clear()
    release_run(clean, clean_sent)
    writes = len(clean.writes)
    assert writes >= 15
    events_killed = 0
    for at in range(writes):
        kube, sent = cluster(notifications=EVERYTHING), list[Delivery]()
        kube.requests.clear()
        crash_before_write(kube, at)
        release_run(kube, sent)
        names, handed = event_names(kube), [d.event for d in sent]
        killed = [r for r in kube.requests if r[0] in MemoryKube.WRITE_VERBS][at]
        assert len(set(handed)) == len(handed), f"killed before write {at}: an Event handed on twice"
        if killed[1].resource != "events":
            # Killed before an action or the status write: the repeat's Events were refused with 409 and
            # handed on by nobody; those of the pass killed had been handed on already.
            assert handed == names, f"killed before write {at}"
        else:
            # Killed while posting a pass's Events: those it had created before are lost with the process
            # that held them (at most once), and no other.
            events_killed += 1
            lost = [n for n in names if n not in handed]
            assert handed == [n for n in names if n in handed] and len(lost) <= 2, f"killed before write {at}"
    assert events_killed >= 5


def test_policies_that_govern_the_release_add_their_notifications() -> None:
    kube = MemoryKube(stable(), release(notifications=[{"name": "team", "urlSecretRef": SECRET}]))
    for name, namespaces in (("platform", ["shop"]), ("elsewhere", ["other"])):
        kube.put(
            {
                "apiVersion": "greyrelease.io/v1",
                "kind": "GreyReleasePolicy",
                "metadata": {"name": name},
                "spec": {"namespaces": namespaces, "notifications": [{"name": name, "urlSecretRef": SECRET}]},
            }
        )
    # A spec the models refuse (InvalidSpec, a Warning): its notifications are read on their own.
    kube.put(release(notifications=[{"name": "team", "urlSecretRef": SECRET}], batches=[{"replicas": 0}]))
    sent: list[Delivery] = []
    Reconciler(kube, notify=sent.extend).reconcile(NS, "web", now=T0)
    assert status_of(kube)["phase"] == "InvalidSpec"
    assert [(d.reason, d.source, d.notification, d.secret[0]) for d in sent] == [
        ("InvalidSpec", "GreyReleasePolicy/platform", "platform", "greyrelease-system"),
        ("InvalidSpec", "GreyRelease", "team", NS),
    ]


def test_a_failing_router_of_notifications_does_not_fail_the_pass() -> None:
    kube = cluster(notifications=EVERYTHING)

    def broken(_: list[Delivery]) -> None:
        raise RuntimeError("queue gone")

    outcome = Reconciler(kube, notify=broken).reconcile(NS, "web", now=T0)
    assert outcome is not None and outcome.plan.events and status_of(kube).get("phase")


def test_the_readme_names_every_reason_an_on_list_may_name() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("\n## Notifications\n") :]
    section = section[: section.index("\n## ", 1)]
    reasons = {v for k, v in vars(R).items() if k.isupper() and not k.startswith("COND_")}
    missing = sorted(r for r in reasons if f"`{r}`" not in section)
    assert not missing, f"README's Notifications section does not list: {missing}"


def test_the_passes_never_write_status_notifications_which_the_sender_owns() -> None:
    kube = cluster(notifications=EVERYTHING)
    entry = {"name": "all", "source": "GreyRelease", "result": "Failed", "message": "Secret shop/hooks not found"}
    ref = path("greyrelease.io", "v1", "greyreleases", NS, "web", "status")
    kube.patch(ref, {"status": {"notifications": [entry]}})
    sent = list[Delivery]()
    release_run(kube, sent)
    status = status_of(kube)
    assert status["phase"] == "Succeeded" and status["notifications"] == [entry]
    written = [r for r in kube.requests if r[0] == "PATCH" and r[1] == ref]
    assert len(written) >= 5  # every one of those status writes left the entry alone
    assert GreyReleaseStatus.model_validate(status).notifications[0].result == "Failed"
