"""The canary Service shared by the nginx and Gateway API routers, and the ownership rule for the
objects a router creates.

Both modes need a Service that selects only the canary pods: ``<stableService>-canary``, with the stable
Service's ports and the selector the user wrote plus ``greyrelease.io/track: canary`` (the label every
canary pod carries, see :func:`greyrelease.kube.workload.build_canary`). The builders are pure; the class
below reads, compares and writes only what differs.
"""

from __future__ import annotations

import copy
import json

from greyrelease.api.release import RELEASE_LABEL, TRACK_LABEL, Obj
from greyrelease.kube.protocol import Kube, path
from greyrelease.kube.workload import CANARY_SUFFIX
from greyrelease.planner.images import label_value
from greyrelease.routers.selector import ORIGINAL_SELECTOR_ANNOTATION


def canary_service_name(stable_service: str) -> str:
    return stable_service + CANARY_SUFFIX


def owned_by(obj: Obj, release_uid: str) -> bool:
    """True when ``obj`` names the release among its owners: the one proof that we made it."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == release_uid for ref in refs)


def foreign(kind: str, obj: Obj | None, release_uid: str) -> str:
    """A message when ``obj`` exists and is not ours ("" when it is absent or ours)."""
    if obj is None or owned_by(obj, release_uid):
        return ""
    name = obj.get("metadata", {}).get("name", "")
    return f"{kind} {name!r} exists and is not owned by this release; rename or delete it"


def stable_hash_or_raise(stable_hash: str, service: str) -> str:
    """The stable ReplicaSet's hash to narrow ``service`` to. Without it the stable Service would keep
    selecting the canary pods (they copy its labels), so preparing fails and is retried instead."""
    if not stable_hash:
        raise RuntimeError(f"cannot narrow Service {service!r}: the stable ReplicaSet is not known yet")
    return stable_hash


def user_selector(service: Obj) -> dict[str, str]:
    """The selector the user wrote: the saved one while the Service is narrowed to the stable."""
    saved = (service.get("metadata", {}).get("annotations") or {}).get(ORIGINAL_SELECTOR_ANNOTATION)
    if saved is not None:
        return dict(json.loads(saved))
    return dict(service.get("spec", {}).get("selector") or {})


def _ports(stable: Obj) -> list[Obj]:
    # nodePort is allocated per Service: copying it would collide with the stable's own.
    ports = copy.deepcopy(stable.get("spec", {}).get("ports") or [])
    for port in ports:
        port.pop("nodePort", None)
    return ports


def build_canary_service(stable: Obj, *, owner: Obj) -> Obj:
    """The canary Service for ``stable``: same ports, the user's selector plus the canary track.

    No clusterIP, type or session affinity is copied: the API server allocates its own address, and
    only the Ingress controller or Gateway talks to it.
    """
    meta = stable["metadata"]
    selector = user_selector(stable)
    selector[TRACK_LABEL] = "canary"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": canary_service_name(meta["name"]),
            "namespace": meta.get("namespace"),
            "labels": {RELEASE_LABEL: label_value(owner["name"]) or "release", TRACK_LABEL: "canary"},
            "ownerReferences": [owner],
        },
        "spec": {"selector": selector, "ports": _ports(stable)},
    }


def service_patch(existing: Obj, desired: Obj) -> Obj | None:
    """The merge patch that gives ``existing`` the desired selector and ports; None when equal."""
    have, want = existing.get("spec", {}), desired["spec"]
    patch: Obj = {}
    if (have.get("selector") or {}) != want["selector"]:
        # Merge patch on a map: keys we no longer want are removed with null.
        selector: Obj = {k: None for k in have.get("selector") or {} if k not in want["selector"]}
        selector.update(want["selector"])
        patch["selector"] = selector
    if _without_node_ports(have.get("ports") or []) != want["ports"]:
        patch["ports"] = want["ports"]  # a list: a merge patch replaces it whole
    return {"spec": patch} if patch else None


#: The label the EndpointSlice controller puts on the slices of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def ready_endpoints(slices: list[Obj]) -> int:
    """How many pods ``slices`` list as ready. A dual-stack Service has one slice per address family,
    so a pod is counted once (by its uid, else its name, else its addresses); an endpoint without a
    ``ready`` condition is ready (the API's rule for a nil value)."""
    pods: set[object] = set()
    for piece in slices:
        for endpoint in piece.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            ref = endpoint.get("targetRef") or {}
            pods.add(ref.get("uid") or ref.get("name") or tuple(endpoint.get("addresses") or ()))
    return len(pods)


def _without_node_ports(ports: list[Obj]) -> list[Obj]:
    return [{k: v for k, v in p.items() if k != "nodePort"} for p in ports]


class CanaryService:
    """Create, converge and delete ``<stableService>-canary``; never touch one we do not own."""

    def __init__(self, kube: Kube, *, namespace: str, stable_service: str, owner: Obj) -> None:
        self.kube = kube
        self.owner = owner
        self.name = canary_service_name(stable_service)
        self.path = path("", "v1", "services", namespace, self.name)
        self.collection = path("", "v1", "services", namespace)
        self.slices = path("discovery.k8s.io", "v1", "endpointslices", namespace)

    def get(self) -> Obj | None:
        return self.kube.get(self.path)

    def problem(self) -> str:
        return foreign("Service", self.get(), self.owner["uid"])

    def ensure(self, stable: Obj) -> None:
        desired = build_canary_service(stable, owner=self.owner)
        existing = self.get()
        if existing is None:
            self.kube.create(self.collection, desired)
            return
        if refusal := foreign("Service", existing, self.owner["uid"]):
            raise RuntimeError(refusal)
        if (patch := service_patch(existing, desired)) is not None:
            self.kube.patch(self.path, patch)

    def delete(self) -> None:
        existing = self.get()
        if existing is not None and owned_by(existing, self.owner["uid"]):
            self.kube.delete(self.path)

    def ready_endpoints(self) -> int:
        """The canary pods the Service's EndpointSlices list as ready: the pods an Ingress controller or
        a Gateway can send to. A Deployment counts a pod ready before the EndpointSlice controller
        lists it, and a weight given to a Service with no endpoint is answered 503 by the proxy."""
        return ready_endpoints(self.kube.list(self.slices, label_selector=f"{SERVICE_NAME_LABEL}={self.name}"))
