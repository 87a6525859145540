"""Faults injected into the in-memory API server: the controller killed before one of its writes, requests
answered with an error, and a controller's store a watch event behind."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import PatchBody, Ref


class Crash(Exception):
    """The controller killed at this point."""


def crash_before_write(kube: MemoryKube, at: int) -> MemoryKube:
    """Kill the controller (raise :class:`Crash`) before its ``at``-th write (0-based) to ``kube``, once;
    the restarted controller runs on. Returns ``kube``."""
    count = 0

    def before(verb: str, p: Ref) -> None:
        nonlocal count, at
        if verb in MemoryKube.WRITE_VERBS:
            if count == at:
                at = -1
                raise Crash
            count += 1

    kube.before = before
    return kube


def refuse(
    kube: MemoryKube,
    error: Callable[[], Exception],
    *,
    verb: str | None = None,
    path: Ref | None = None,
    skip: int = 0,
    times: int | None = None,
) -> list[Ref]:
    """From now on, answer the requests to ``kube`` that match (``verb`` and ``path``; any, when None) with
    ``error()``: the first ``skip`` that match are served, then ``times`` of them (all, when None) refused.
    The paths of the requests that matched, served or refused, are appended to the list returned."""
    matched: list[Ref] = []

    def before(v: str, p: Ref) -> None:
        if (verb is None or v == verb) and (path is None or p == path):
            matched.append(p)
            if len(matched) > skip and (times is None or len(matched) <= skip + times):
                raise error()

    kube.before = before
    return matched


class Lagging:
    """The controller's view of the cluster with its store behind: reads of the Deployments and Services
    come from ``snapshot`` (a watch event or more behind) while ``lag`` is set; writes go through."""

    LAGGING = ("deployments", "services")

    def __init__(self, inner: MemoryKube) -> None:
        self.inner = inner
        self.snapshot: dict[Ref, Obj] = {}
        self.lag = False

    def freeze(self) -> None:
        self.snapshot = {MemoryKube.path_of(o): copy.deepcopy(o) for o in self.inner.objects()}

    def _stale(self, ref: Ref) -> bool:
        return self.lag and ref.resource in self.LAGGING

    def get(self, ref: Ref) -> Obj | None:
        if self._stale(ref):
            found = self.snapshot.get(ref)
            return copy.deepcopy(found) if found is not None else None
        return self.inner.get(ref)

    def list(self, ref: Ref, *, label_selector: str | None = None) -> list[Obj]:
        if self._stale(ref):
            found = sorted(self.snapshot.items(), key=lambda item: item[0].path)
            return [copy.deepcopy(o) for k, o in found if k.collection == ref]
        return self.inner.list(ref, label_selector=label_selector)

    def create(self, ref: Ref, body: Obj) -> Obj:
        return self.inner.create(ref, body)

    # The keyword arguments of the writes (patch_type, field_manager, propagation) are passed on as they come.
    def patch(self, ref: Ref, body: PatchBody, **kw: Any) -> Obj:
        return self.inner.patch(ref, body, **kw)

    def replace(self, ref: Ref, body: Obj) -> Obj:
        return self.inner.replace(ref, body)

    def delete(self, ref: Ref, **kw: Any) -> Obj | None:
        return self.inner.delete(ref, **kw)
