"""What a pass records on the GreyRelease itself: its Events, its status, the one-shot annotations it
consumed. Each write is idempotent, so a pass repeated after a crash records nothing twice."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from .actions import Event
from .api import (
    ABORT_ANNOTATION,
    GROUP,
    KIND,
    PAUSE_ANNOTATION,
    PLURAL,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    VERSION,
    GreyReleaseStatus,
    Obj,
)
from .kube import MERGE, ApiError, Conflict, Kube, path

log = logging.getLogger("greyrelease")

#: The annotations people write; the only ones that go into an Event's name (see :func:`event_names`).
USER_ANNOTATIONS = (ABORT_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION)


def release_path(namespace: str, name: str, sub: str | None = None) -> str:
    return path(GROUP, VERSION, PLURAL, namespace, name, sub)


# --- Events ------------------------------------------------------------------------------------------


def event_names(release: Obj, events: tuple[Event, ...]) -> list[str]:
    """The name of each Event of a plan: after the state it was planned from (the release's uid,
    generation, the annotations people write, the status as read) and its place in the plan.

    A controller killed before the status write plans the same transition from the same state again and
    gets the same names, which the API server refuses (409): nothing is lost and nothing posted twice.
    kopf's own annotations (finalizer bookkeeping) may be written between a pass and its repetition, so
    they are left out.
    """
    meta = release["metadata"]
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k in USER_ANNOTATIONS}
    state = json.dumps([meta.get("uid"), meta.get("generation"), ours, release.get("status") or {}], sort_keys=True)
    return [
        f"{meta['name'][:200]}.{hashlib.sha256(f'{state}|{i}|{ev.reason}|{ev.message}'.encode()).hexdigest()[:16]}"
        for i, ev in enumerate(events)
    ]


def post_events(kube: Kube, release: Obj, events: tuple[Event, ...], now: datetime) -> None:
    """Post a plan's Events after its actions and before its status: exactly once per transition (see
    :func:`event_names`). An Event the API server refuses for another reason is logged and skipped."""
    if not events:
        return
    meta = release["metadata"]
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, ev in zip(event_names(release, events), events, strict=True):
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
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
        except Conflict:
            pass  # posted by the pass that planned the same transition and died before its status write
        except ApiError as err:
            log.warning(f"event {ev.reason} not posted: {err}")


# --- status ------------------------------------------------------------------------------------------


def stored(value: Any) -> Any:
    """``value`` without its null fields, at any depth (how the API server stores a status)."""
    if isinstance(value, dict):
        return {k: stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [stored(v) for v in value]
    return value


def status_patch(release: Obj, status: GreyReleaseStatus) -> Obj | None:
    """The status merge patch that records ``status``, or None when the object has it already.

    Compared as stored: the API server keeps no null field (a merge patch's null removes the key, and the
    CRD's schema drops a null in a list item), so a null in the model is a missing key.
    """
    old = release.get("status") or {}
    new = status.model_dump(by_alias=True, mode="json")
    # Most passes write nothing, so this comparison runs on every pass: pydantic drops the nulls while
    # serialising (exclude_none) rather than stored() walking both sides, which was 8 % of the
    # controller's CPU at N = 500 (py-spy, bench/README.md "The lag regression found"). exclude_none
    # also drops a field whose None is written as something else (endPhase, ""): such a field is taken
    # from ``new``. Equal here is equal as stored; stored() decides only the keys that differ.
    kept = status.model_dump(by_alias=True, mode="json", exclude_none=True)
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
