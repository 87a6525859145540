"""Notifications: which of a pass's Events go to which receiver, and what is sent (pure, but for
:func:`deliveries`, which reads the policies as the pass does, from memory).

A notification is an entry of ``notifications`` on a GreyReleasePolicy (the platform team's, for every
release it governs; its URL in a Secret of the controller's namespace) or on the GreyRelease itself (the
app team's; its URL in a Secret of the release's namespace). Each Event a pass *created* (not one the API
server refused with 409: an earlier pass of the same transition created it, and its notifications were
handed on then) becomes one :class:`Delivery` per notification whose ``on`` names its reason or its type.
The deliveries are handed to the sender (:mod:`greyrelease.runtime.notifier`), which posts them off the
pass's thread; the pass never waits for a receiver.

Two formats. ``generic``: a JSON document of the Event and of the release as it stands after the
transition the Event belongs to; its ``id`` is the Event's name, the same for every pass that plans the
transition, so a receiver can drop a duplicate. ``slack``: an incoming-webhook message, ``text`` and one
attachment with fields, which Slack, Mattermost and Rocket.Chat all render (Slack's blocks are not used:
Mattermost ignores them), as does Discord's Slack-compatible endpoint (``<webhook URL>/slack``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError

from greyrelease.api.release import (
    GROUP,
    KIND,
    VERSION,
    GreyReleasePolicy,
    GreyReleaseStatus,
    MetricStatus,
    Notification,
    Obj,
    fmt_time,
)
from greyrelease.kube.protocol import Kube
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Event
from greyrelease.reconcile.policies import governing, read_policies

log = logging.getLogger("greyrelease")

#: The Warning Event posted on a release when one of its notifications could not be sent. Never itself
#: notified: a receiver that is down would otherwise be told so through itself, or fail again.
NOTIFICATION_FAILED = "NotificationFailed"
#: Where a release's own notifications are declared (``status.notifications[].source``).
RELEASE_SOURCE = KIND
#: The Events that are about one metric: their message names it (``metric <name>: ...``).
METRIC_REASONS = frozenset({R.METRIC_CHECK_FAILED, R.ANALYSIS_FAILED})
_METRIC_IN_MESSAGE = re.compile(r"\bmetric ([A-Za-z0-9_.-]+):")
_NOTIFICATIONS = TypeAdapter(list[Notification])


@dataclass(frozen=True)
class MetricValue:
    name: str
    value: float | None
    verdict: str


@dataclass(frozen=True)
class Occurrence:
    """One Event and the release as it stands after the transition the Event belongs to: all a payload
    is made of."""

    id: str
    type: str
    reason: str
    message: str
    time: datetime
    namespace: str
    name: str
    uid: str
    generation: int
    phase: str
    current_batch: int
    total_batches: int
    weight: int
    stable_version: str
    target_version: str
    metric: MetricValue | None = None


def metric_of(event: Event, *statuses: GreyReleaseStatus) -> MetricValue | None:
    """The metric an Event is about (its reason is one of :data:`METRIC_REASONS` and its message names
    it), with its value and verdict from the first status that has it: the plan's, then the one read (a
    rollback's plan may have cleared them)."""
    if event.reason not in METRIC_REASONS:
        return None
    found = _METRIC_IN_MESSAGE.search(event.message)
    if found is None:
        return None
    name = found.group(1)
    for status in statuses:
        for m in status.metrics:
            if m.name == name:
                return _value(m)
    return MetricValue(name, None, "")


def _value(m: MetricStatus) -> MetricValue:
    return MetricValue(m.name, m.value, m.verdict.value)


def occurrence(
    event_id: str, event: Event, release: Obj, status: GreyReleaseStatus, read: GreyReleaseStatus, now: datetime
) -> Occurrence:
    """The Event ``event_id`` of a pass over ``release``, whose plan records ``status`` (``read``: the
    status the pass started from)."""
    meta = release.get("metadata") or {}
    return Occurrence(
        id=event_id,
        type=event.type,
        reason=event.reason,
        message=event.message,
        time=now,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        phase=status.phase.value if status.phase else "",
        current_batch=status.current_batch,
        total_batches=status.total_batches,
        weight=status.canary_weight,
        stable_version=status.stable_version,
        target_version=status.target_version,
        metric=metric_of(event, status, read),
    )


# --- payloads ----------------------------------------------------------------------------------------


def generic(o: Occurrence) -> dict[str, Any]:
    """The ``generic`` format: the Event, and the release's state after it."""
    out: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GreyReleaseEvent",
        "id": o.id,
        "reason": o.reason,
        "type": o.type,
        "message": o.message,
        "time": fmt_time(o.time),
        "release": {"namespace": o.namespace, "name": o.name, "uid": o.uid, "generation": o.generation},
        "phase": o.phase,
        "batch": {"current": o.current_batch, "total": o.total_batches},
        "weight": o.weight,
        "versions": {"stable": o.stable_version, "target": o.target_version},
    }
    if o.metric is not None:
        out["metric"] = {"name": o.metric.name, "value": o.metric.value, "verdict": o.metric.verdict}
    return out


#: Attachment colours (hex: Mattermost takes no colour names): a Warning, a success, a wait for a person,
#: anything else.
DANGER, GOOD, ATTENTION, INFO = "#D00000", "#2EB67D", "#ECB22E", "#439FE0"


def _color(o: Occurrence) -> str:
    if o.type == "Warning":
        return DANGER
    if o.reason == R.SUCCEEDED:
        return GOOD
    if o.reason == R.WAITING_FOR_APPROVAL:
        return ATTENTION
    return INFO


def _escape(text: str) -> str:
    """Text as Slack's message formatting needs it: ``&``, ``<`` and ``>`` are control characters there
    (``<url|label>`` links, ``<!channel>`` mentions); a message quoting them must not become either."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _number(value: float | None) -> str:
    return "no value" if value is None else f"{value:g}"


def slack(o: Occurrence) -> dict[str, Any]:
    """The ``slack`` format: an incoming-webhook message with one attachment."""
    release = f"{o.namespace}/{o.name}"
    fields = [{"title": "Phase", "value": o.phase or "-", "short": True}]
    if o.total_batches:
        fields.append({"title": "Batch", "value": f"{o.current_batch}/{o.total_batches}", "short": True})
    fields.append({"title": "Weight", "value": f"{o.weight}%", "short": True})
    if o.stable_version or o.target_version:
        versions = f"{o.stable_version or '?'} → {o.target_version or '?'}"
        fields.append({"title": "Versions", "value": _escape(versions), "short": True})
    if o.metric is not None:
        value = f"{o.metric.name} = {_number(o.metric.value)}" + (f" ({o.metric.verdict})" if o.metric.verdict else "")
        fields.append({"title": "Metric", "value": _escape(value), "short": False})
    headline = f"GreyRelease {release}: {o.reason}"
    return {
        "text": _escape(headline),
        "attachments": [
            {
                "fallback": _escape(f"{headline}: {o.message}"),
                "color": _color(o),
                "author_name": _escape(release),
                "title": _escape(o.reason),
                "text": _escape(o.message),
                "fields": fields,
                "footer": _escape(f"greyrelease · {o.id}"),
                "ts": int(o.time.timestamp()),
            }
        ],
    }


PAYLOADS = {"generic": generic, "slack": slack}


def payload(fmt: str, o: Occurrence) -> bytes:
    """The body of a notification in format ``fmt``: UTF-8 JSON."""
    return json.dumps(PAYLOADS[fmt](o), ensure_ascii=False, separators=(",", ":")).encode()


# --- routing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A notification and where it is declared: the Secret holding its URL lives in ``namespace``."""

    notification: Notification
    source: str
    namespace: str


@dataclass(frozen=True)
class Delivery:
    """One notification of one Event, ready to send: everything the sender needs, nothing it must read
    but the URL."""

    notification: str
    format: str
    source: str
    #: The Secret holding the URL: namespace, name, key.
    secret: tuple[str, str, str]
    #: The release the Event is about (its status gets the result, its Events the failure).
    namespace: str
    release: str
    uid: str
    event: str
    reason: str
    body: bytes

    @property
    def lane(self) -> tuple[str, str, str]:
        """Deliveries to one URL are sent one after another, in order; each URL has a lane of its own, so a
        receiver that hangs delays only its own."""
        return self.secret

    @property
    def failure_name(self) -> str:
        """The name of the NotificationFailed Event of this delivery: one per Event and notification, so
        a failure is told once, however often it is looked at."""
        key = f"{self.event}|{self.source}|{self.notification}"
        return f"{self.event[:200]}.nf{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def targets(
    policies: Iterable[GreyReleasePolicy], own: Iterable[Notification], namespace: str, home: str
) -> list[Target]:
    """The notifications of a release: its policies' (by policy name, URLs in ``home``, the controller's
    namespace), then its own (URLs in its ``namespace``)."""
    out = []
    for p in policies:
        for n in p.spec.notifications or ():
            out.append(Target(n, f"GreyReleasePolicy/{p.metadata.get('name', '')}", home))
    out += [Target(n, RELEASE_SOURCE, namespace) for n in own]
    return out


def route(
    targets: list[Target],
    created: list[tuple[str, Event]],
    release: Obj,
    status: GreyReleaseStatus,
    read: GreyReleaseStatus,
    now: datetime,
) -> list[Delivery]:
    """One delivery per created Event and notification that wants it, in the Events' order."""
    meta = release.get("metadata") or {}
    out = []
    for event_id, event in created:
        if event.reason == NOTIFICATION_FAILED or event.about is not None:
            # An Event on the Deployment (follow mode: why it stays paused, that it was handed back) repeats
            # the release's own Event of the same pass, which is the one sent.
            continue
        wanted = [t for t in targets if t.notification.wants(event.type, event.reason)]
        if not wanted:
            continue
        o = occurrence(event_id, event, release, status, read, now)
        bodies: dict[str, bytes] = {}
        for t in wanted:
            n = t.notification
            if n.format not in bodies:
                bodies[n.format] = payload(n.format, o)
            out.append(
                Delivery(
                    notification=n.name,
                    format=n.format,
                    source=t.source,
                    secret=(t.namespace, n.url_secret_ref.name, n.url_secret_ref.key),
                    namespace=str(meta.get("namespace", "")),
                    release=str(meta.get("name", "")),
                    uid=str(meta.get("uid", "")),
                    event=event_id,
                    reason=event.reason,
                    body=bodies[n.format],
                )
            )
    return out


def own_notifications(release: Obj) -> list[Notification]:
    """The release's own ``spec.notifications``, read on their own: a spec refused for another field
    (InvalidSpec, itself a Warning worth hearing of) still has them. None that the models refuse."""
    raw = (release.get("spec") or {}).get("notifications")
    if not raw:
        return []
    try:
        return _NOTIFICATIONS.validate_python(raw)
    except ValidationError:
        return []


def deliveries(
    kube: Kube,
    release: Obj,
    created: list[tuple[str, Event]],
    status: GreyReleaseStatus,
    read: GreyReleaseStatus,
    now: datetime,
    home: str,
) -> list[Delivery]:
    """The deliveries of the Events a pass created: nothing is read when it created none."""
    if not created:
        return []
    meta = release.get("metadata") or {}
    found = targets(
        governing(read_policies(kube), release), own_notifications(release), meta.get("namespace", ""), home
    )
    return route(found, created, release, status, read, now) if found else []
