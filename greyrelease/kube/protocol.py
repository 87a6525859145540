"""The I/O seam: the few calls the controller makes to the Kubernetes API.

Everything that reads or writes cluster objects (the reconciler, the workload and traffic adapters, the
read cache, the leader's Lease) talks to a :class:`Kube`: GET, LIST, CREATE, PATCH, PUT and DELETE on
references to collections and objects (:class:`Ref`, built by :func:`path`), with plain dicts in and out
(the JSON the API server speaks) and typed errors. A status write is a PATCH of the ``status``
subresource, an Event a CREATE in the ``events`` collection. A reference is built from its parts and
turned into a REST path only where a request is sent; nothing takes a path string back apart.

Two implementations: :class:`greyrelease.kube.client.KubeClient` speaks to a real API server, and
:class:`greyrelease.kube.memory.MemoryKube` is a small API server in memory for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol
from urllib.parse import quote

from greyrelease.api.release import Obj

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
#: RFC 6902: a list of operations (``add``, ``remove``, ``replace``, ``move``, ``copy``, ``test``), applied in
#: order, all or none; a ``test`` that does not hold refuses the whole patch (422).
JSON_PATCH = "application/json-patch+json"

#: A patch body: an object for a merge or strategic merge patch, a list of operations for a JSON patch.
PatchBody = Obj | list[Obj]


class ApiError(Exception):
    """An answer of the API server other than success: its HTTP status, reason and message, and the seconds
    it asked the client to wait before trying again (``Retry-After``), when it did."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


@dataclass(frozen=True, slots=True)
class Ref:
    """Where a collection, an object or an object's subresource is served: what every :class:`Kube` call
    takes, built by :func:`path` (``path("apps", "v1", "deployments", "shop", "web")``) and never taken
    back apart from a string. ``group`` is ``""`` for the core API; ``namespace`` is None for a
    cluster-scoped kind or a collection across namespaces; ``name`` is None for a collection.
    ``str(ref)`` is its REST path, as the API server serves it."""

    group: str
    version: str
    resource: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    @property
    def api(self) -> str:
        """``/api/<version>`` for the core API, ``/apis/<group>/<version>`` for the others."""
        return f"/api/{self.version}" if self.group == "" else f"/apis/{self.group}/{self.version}"

    @property
    def path(self) -> str:
        """The REST path: ``/apis/apps/v1/namespaces/shop/deployments/web``."""
        base = self.api
        if self.namespace is not None:
            base += f"/namespaces/{quote(self.namespace)}"
        base += f"/{self.resource}"
        if self.name is not None:
            base += f"/{quote(self.name)}"
        if self.subresource is not None:
            base += f"/{self.subresource}"
        return base

    @property
    def gvr(self) -> tuple[str, str, str]:
        """The kind's group, version and resource, whatever the namespace and name."""
        return self.group, self.version, self.resource

    @property
    def collection(self) -> Ref:
        """The collection the object is in (the same namespace)."""
        return replace(self, name=None, subresource=None)

    def named(self, name: str) -> Ref:
        """The object ``name`` of this collection."""
        return replace(self, name=name, subresource=None)

    def sub(self, subresource: str) -> Ref:
        """A subresource of this object (``status``)."""
        if self.name is None:
            raise ValueError(f"{self}: a collection has no subresource {subresource!r}")
        return replace(self, subresource=subresource)

    def __str__(self) -> str:
        return self.path


def path(
    group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None, sub: str | None = None
) -> Ref:
    """The reference of a collection or object: ``path("apps", "v1", "deployments", "ns", "web")``."""
    return Ref(group, version, plural, namespace, name, sub)


class Kube(Protocol):
    """The API calls the controller makes, on references built by :func:`path`."""

    def get(self, ref: Ref) -> Obj | None:
        """The object, or None when there is none (404)."""
        ...

    def list(self, ref: Ref, *, label_selector: str | None = None) -> list[Obj]: ...

    def create(self, ref: Ref, body: Obj) -> Obj:
        """POST ``body`` to the collection ``ref``; :class:`Conflict` when the name is taken."""
        ...

    def patch(
        self,
        ref: Ref,
        body: PatchBody,
        *,
        patch_type: str = MERGE,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """A merge, strategic merge or JSON patch (``patch_type``); in the first two a
        ``metadata.resourceVersion`` is a precondition, in a JSON patch a ``test`` operation is. With
        ``field_manager``, sent as the ``fieldManager`` query parameter: the API server records the fields
        under that manager, and admission webhooks see it in the request's options. With ``dry_run``, sent
        as ``dryRun=All``: the API server runs admission (the mutating webhooks too, which see the request's
        ``dryRun``) and validation, and answers with the object as it would have stored it, storing nothing
        (no new resourceVersion, no watch event)."""
        ...

    def replace(self, ref: Ref, body: Obj) -> Obj:
        """PUT; the body's ``metadata.resourceVersion`` is a precondition (409 when it is not current)."""
        ...

    def delete(self, ref: Ref, *, propagation: str = "Background") -> Obj | None:
        """Delete; the API server's answer (the object as deleted, or marked for deletion while finalizers
        hold it), None when it was already gone."""
        ...


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
