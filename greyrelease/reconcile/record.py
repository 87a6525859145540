"""What a pass records on the GreyRelease itself: its Events (and those it posts about its Deployment),
its status, the one-shot annotations it consumed. Each write is idempotent, so a pass repeated after a
crash records nothing twice.

Exactly one Event per transition. A pass applies its actions, then posts its Events, then writes its
status; a controller killed after the Events and before the status plans the same transition again on its
next pass, and that pass must post nothing new. Each Event's name is its identity (the API server refuses a
second one with 409), so the name must be the same for every pass that plans the transition, and differ
from the names of every other transition. Here it is made of the release's uid, the number of the
transition (``status.transitions`` as recorded, plus one: a plan with Events records that number with its
status, see :func:`numbered`), the Event's reason and its place among the plan's Events of that reason.

Why not of what the pass read: names were once a digest of the status, the user's annotations and the
generation as read. A pass killed after posting ``ReleaseStarted`` was repeated, after an abort annotation
had landed in between, by a pass that read the same status, planned the same start (the half-started
release had a canary already, so the abort was taken on the pass after), and got another name for it:
the Event was posted twice (the end-to-end crash test, a kill 0.4-2.5 s after each start, saw it for
one of its 30 releases). Anything a person or another controller may write between two passes (an annotation
asking nothing, a spec edit that moves no batch, kopf's bookkeeping) did the same. Only what the
controller itself records when a transition is done tells one transition from the next; a counter does it
and nothing else. Nor the message: a repeated pass may word the same transition differently (a metric's
value read again), and it is still the same transition.

An Event about another object (follow mode: the target Deployment, ``Event.about``) is named the same
way, with that object's kind in the key (so it never takes the name of the release's own Event of the
same reason in the same transition) and its name in front; its ``involvedObject`` is that object, so
``kubectl describe deployment`` lists it. The release's own Events keep the key they always had: a
controller upgraded between a post and its status write names the repeat as before.

What a repeat cannot undo: a transition planned, posted and then not taken at all (the world changed
before the repeat, say the abort was taken at once) keeps its Events; none is posted twice.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from greyrelease.api.release import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    GreyReleaseStatus,
    Obj,
)
from greyrelease.kube.protocol import MERGE, ApiError, Conflict, Kube, Ref, path
from greyrelease.planner.actions import Event, Plan

log = logging.getLogger("greyrelease")


def release_path(namespace: str, name: str, sub: str | None = None) -> Ref:
    return path(GROUP, VERSION, PLURAL, namespace, name, sub)


# --- Events ------------------------------------------------------------------------------------------


def numbered(plan: Plan, read: GreyReleaseStatus) -> Plan:
    """``plan`` with its transition's number in the status it records: the number after the one read when
    the plan has Events (they are named after it), else the one read."""
    if not plan.events:
        return plan
    return replace(plan, status=plan.status.model_copy(update={"transitions": (read.transitions or 0) + 1}))


def event_names(release: Obj, transition: int, events: tuple[Event, ...]) -> list[str]:
    """The name of each Event of the plan of transition number ``transition`` (see the module's docstring):
    the same for every pass that plans that transition, whatever else it read."""
    meta = release["metadata"]
    seen: Counter[tuple[str, str]] = Counter()
    names = []
    for ev in events:
        kind = ev.about.kind if ev.about is not None else ""
        seen[kind, ev.reason] += 1
        n = seen[kind, ev.reason]
        if ev.about is None:
            key, name = f"{meta.get('uid')}|{transition}|{ev.reason}|{n}", meta["name"]
        else:
            key, name = f"{meta.get('uid')}|{transition}|{kind}|{ev.reason}|{n}", ev.about.name
        names.append(f"{name[:200]}.{hashlib.sha256(key.encode()).hexdigest()[:16]}")
    return names


def involved(release: Obj, ev: Event) -> Obj:
    """The ``involvedObject`` of an Event: the release, or the object it is about."""
    meta = release["metadata"]
    if ev.about is not None:
        return {
            "apiVersion": ev.about.api_version,
            "kind": ev.about.kind,
            "name": ev.about.name,
            "namespace": meta["namespace"],
            "uid": ev.about.uid,
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta.get("uid", ""),
    }


def post_events(kube: Kube, release: Obj, plan: Plan, now: datetime) -> list[tuple[str, Event]]:
    """Post a plan's Events after its actions and before its status: exactly once per transition (see the
    module's docstring). ``plan`` is :func:`numbered`. An Event the API server refuses for another reason is
    logged and skipped. Returns the Events this call created, with their names: not those refused with 409
    (an earlier pass of the same transition created them), so what follows an Event's creation (its
    notifications) happens once too."""
    events = plan.events
    created: list[tuple[str, Event]] = []
    if not events:
        return created
    meta = release["metadata"]
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, ev in zip(event_names(release, plan.status.transitions or 0, events), events, strict=True):
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": involved(release, ev),
            "type": ev.type,
            "reason": ev.reason,
            "message": ev.message[:1024],
            "source": {"component": "greyrelease"},
            "reportingComponent": "greyrelease",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            kube.create(path("", "v1", "events", meta["namespace"]), body)
            created.append((name, ev))
        except Conflict:
            pass  # posted by the pass that planned the same transition and died before its status write
        except ApiError as err:
            log.warning(f"event {ev.reason} not posted: {err}")
    return created


# --- status ------------------------------------------------------------------------------------------


def stored(value: Any) -> Any:
    """``value`` without its null fields, at any depth (how the API server stores a status)."""
    if isinstance(value, dict):
        return {k: stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [stored(v) for v in value]
    return value


_EMPTY = GreyReleaseStatus().model_dump(by_alias=True, mode="json")
#: The top-level fields of the status, as stored (their aliases).
_FIELDS = tuple(_EMPTY)
#: The stored form of each field that may be None, when it is: absent (None here) for all but
#: ``endPhase``, whose None is written ``""``.
_NONE_FORMS = {str(f.alias): _EMPTY[str(f.alias)] for f in GreyReleaseStatus.model_fields.values() if f.default is None}
#: A field whose None has no known stored form: never equal, the comparison field by field decides.
_UNKNOWN = object()


def status_patch(release: Obj, status: GreyReleaseStatus) -> Obj | None:
    """The status merge patch that records ``status``, or None when the object has it already.

    Compared as stored: the API server keeps no null field (a merge patch's null removes the key, and the
    CRD's schema drops a null in a list item), so a null in the model is a missing key.
    """
    old = release.get("status") or {}
    # Most passes write nothing, so this comparison runs on every pass: the status serialised once, by
    # pydantic without its nulls (exclude_none), and compared with what is stored as it is, a field whose
    # None is stored otherwise (endPhase, "") in that form (bench/README.md, "The status compared as
    # pydantic serialises it"). Equal here is equal as stored.
    kept = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    for k in _FIELDS:
        if old.get(k) != (kept[k] if k in kept else _NONE_FORMS.get(k, _UNKNOWN)):
            break
    else:
        return None
    # A field differs at first sight (or the object holds a null): the status with its nulls, the patch if
    # one is written (a null removes a key the object has, at any depth), decides field by field.
    # exclude_none drops a field whose None is written as something else (endPhase, ""): such a field is
    # taken from ``new``. stored() walks only the keys that differ.
    new = status.model_dump(by_alias=True, mode="json")
    for k, v in new.items():
        held = old.get(k)
        if held != kept.get(k, v) and stored(held) != stored(v):
            return {"status": new}
    return None


def write_status(kube: Kube, release: Obj, status: GreyReleaseStatus) -> bool:
    """Write ``status`` when it differs from what the object has; True when written. A write refused
    with 409 fails the pass: the next one plans again from a fresh read."""
    patch = status_patch(release, status)
    if patch is None:
        return False
    meta = release["metadata"]
    kube.patch(release_path(meta["namespace"], meta["name"], "status"), patch, patch_type=MERGE)
    return True


# --- annotations -------------------------------------------------------------------------------------


def remove_annotations(kube: Kube, release: Obj, keys: tuple[str, ...]) -> None:
    """The release no longer carries ``keys`` (one-shot requests it consumed)."""
    meta = release["metadata"]
    present = [k for k in keys if k in (meta.get("annotations") or {})]
    if present:
        kube.patch(release_path(meta["namespace"], meta["name"]), {"metadata": {"annotations": dict.fromkeys(present)}})
