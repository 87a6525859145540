"""The I/O seam: the few calls the controller makes to the Kubernetes API.

Everything that reads or writes cluster objects (the reconciler, the workload and traffic adapters, the
read cache, the leader's Lease) talks to a :class:`Kube`: GET, LIST, CREATE, PATCH, PUT and DELETE on API
paths, with plain dicts in and out (the JSON the API server speaks) and typed errors. A status write is a
PATCH of the ``/status`` subresource, an Event a CREATE in the ``events`` collection.

Two implementations: :class:`greyrelease.kube.client.KubeClient` speaks to a real API server, and
:class:`greyrelease.kube.memory.MemoryKube` is a small API server in memory for tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, unquote

from greyrelease.api.release import Obj

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class Kube(Protocol):
    """The API calls the controller makes. Paths are REST paths as built by :func:`path`."""

    def get(self, path: str) -> Obj | None:
        """The object, or None when there is none (404)."""
        ...

    def list(self, path: str, *, label_selector: str | None = None) -> list[Obj]: ...

    def create(self, path: str, body: Obj) -> Obj:
        """POST ``body`` to the collection ``path``; :class:`Conflict` when the name is taken."""
        ...

    def patch(self, path: str, body: Obj, *, patch_type: str = MERGE) -> Obj:
        """A merge (or strategic merge) patch; a ``metadata.resourceVersion`` in it is a precondition."""
        ...

    def replace(self, path: str, body: Obj) -> Obj:
        """PUT; the body's ``metadata.resourceVersion`` is a precondition (409 when it is not current)."""
        ...

    def delete(self, path: str, *, propagation: str = "Background") -> Obj | None:
        """Delete; the API server's answer (the object as deleted, or marked for deletion while finalizers
        hold it), None when it was already gone."""
        ...


def path(
    group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None, sub: str | None = None
) -> str:
    """The REST path of a collection or object: ``path("apps", "v1", "deployments", "ns", "web")``."""
    base = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{quote(name)}"
    if sub is not None:
        base += f"/{sub}"
    return base


_PATH = re.compile(
    r"^(?P<api>/api/[^/]+|/apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


@dataclass(frozen=True)
class Location:
    """A REST path taken apart: ``api`` is ``/api/v1`` or ``/apis/<group>/<version>``."""

    api: str
    plural: str
    namespace: str = ""
    name: str = ""
    sub: str = ""

    @property
    def collection(self) -> tuple[str, str]:
        return self.api, self.plural


def parse(p: str) -> Location | None:
    """The parts of a path built by :func:`path`; None for anything else."""
    m = _PATH.match(p.split("?", 1)[0])
    if m is None:
        return None
    return Location(
        api=m["api"],
        plural=m["plural"],
        namespace=unquote(m["ns"] or ""),
        name=unquote(m["name"] or ""),
        sub=m["sub"] or "",
    )


# --- label selectors ---------------------------------------------------------------------------------


def selects(selector: str | None, labels: dict[str, str]) -> bool:
    """Whether a label selector in its string form (``a=b,c!=d,!e,f``) matches ``labels``."""
    for term in (selector or "").split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


#: Moved to :mod:`greyrelease.kube.memory`; still found here until every import names their new home.
_MOVED = frozenset({"MERGE_KEYS", "MemoryKube", "merge_patch", "strategic_merge_patch", "without_nulls"})


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from greyrelease.kube import memory

        return getattr(memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
