"""The slots of a concurrency limit, kept in a Lease: who holds one, and taking and giving one back.

One Lease per queue (``coordination.k8s.io/v1``) lists the releases that hold a slot in its
``greyrelease.io/holders`` annotation. Every change is a PUT with the ``resourceVersion`` that was read,
so the API server arbitrates between two passes (or two controller replicas) that race for the last slot:
one write wins, the other gets 409 and its pass, retried, finds the slots taken. Nothing about slots is
kept in memory, so a restarted controller knows who holds what.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from greyrelease.api.release import Obj, fmt_time
from greyrelease.kube.protocol import Conflict, Kube, Ref, path

HOLDERS_ANNOTATION = "greyrelease.io/holders"
MANAGED_BY = {"app.kubernetes.io/managed-by": "greyrelease"}


@dataclass(frozen=True)
class Holder:
    uid: str
    namespace: str
    name: str
    since: str  # RFC 3339: when the slot was taken

    def to_json(self) -> dict[str, str]:
        return {"uid": self.uid, "namespace": self.namespace, "name": self.name, "since": self.since}


def lease_path(ref: str) -> Ref:
    """The reference of the Lease ``namespace/name``."""
    namespace, name = ref.split("/", 1)
    return path("coordination.k8s.io", "v1", "leases", namespace, name)


def holders_of(lease: Obj | None) -> list[Holder]:
    """The holders a Lease lists (none when it does not exist or its annotation is unreadable)."""
    if lease is None:
        return []
    text = ((lease.get("metadata") or {}).get("annotations") or {}).get(HOLDERS_ANNOTATION) or "[]"
    try:
        raw = json.loads(text)
        return [Holder(str(h["uid"]), str(h["namespace"]), str(h["name"]), str(h.get("since", ""))) for h in raw]
    except (ValueError, KeyError, TypeError):
        return []


def _write(kube: Kube, ref: str, lease: Obj | None, holders: list[Holder]) -> None:
    annotations = {HOLDERS_ANNOTATION: json.dumps([h.to_json() for h in holders], separators=(",", ":"))}
    if lease is None:
        namespace, name = ref.split("/", 1)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "labels": MANAGED_BY, "annotations": annotations},
            "spec": {},
        }
        kube.create(path("coordination.k8s.io", "v1", "leases", namespace), body)  # 409 when another made it
        return
    body = {
        **lease,
        "metadata": {
            **lease["metadata"],
            "annotations": {**(lease["metadata"].get("annotations") or {}), **annotations},
        },
    }
    kube.replace(lease_path(ref), body)  # the resourceVersion read is the precondition


#: Attempts of a slot change that lost a race (another write came between the read and the write).
ATTEMPTS = 3


def take(kube: Kube, ref: str, *, limit: int, release: Obj, stale: tuple[str, ...], since: datetime) -> None:
    """Hold a slot for ``release``. :class:`Conflict` when all ``limit`` are held (by others than the
    ``stale`` holders, which are dropped in the same write): the pass stops there, and the next one finds
    the release Queued. A write that lost a race is read and tried again."""
    meta = release["metadata"]
    me = Holder(meta["uid"], meta["namespace"], meta["name"], fmt_time(since))
    for attempt in range(ATTEMPTS):
        lease = kube.get(lease_path(ref))
        holders = holders_of(lease)
        if any(h.uid == me.uid for h in holders):
            return
        live = [h for h in holders if h.uid not in stale]
        if len(live) >= limit:
            raise Conflict(409, "Conflict", f"all {limit} slots of {ref} are held")
        try:
            _write(kube, ref, lease, [*live, me])
            return
        except Conflict:
            if attempt == ATTEMPTS - 1:
                raise


def free(kube: Kube, ref: str, *, uid: str) -> None:
    """Give back the slot ``uid`` holds (nothing when it holds none)."""
    for attempt in range(ATTEMPTS):
        lease = kube.get(lease_path(ref))
        holders = holders_of(lease)
        if lease is None or not any(h.uid == uid for h in holders):
            return
        try:
            _write(kube, ref, lease, [h for h in holders if h.uid != uid])
            return
        except Conflict:
            if attempt == ATTEMPTS - 1:
                raise
