"""Traffic routers: one small interface, one module per way of splitting traffic.

A router is built for one reconcile of one release and answers five calls:

- ``problem()``: why it cannot work with the cluster as it is ("" when it can); read-only.
- ``prepare()``: routing objects exist with the canary at weight 0, before any canary pod does.
- ``set_weight(w, header_match)``: the canary gets ``w`` percent; 0 is the abort, and it comes first.
- ``restore_stable_selector()``: the stable Service selects as the user wrote it (before the stable rolls).
- ``reset()``: everything the router added is gone and the user's objects are as they were.

Every call is idempotent: it builds the desired state, compares, and writes only what differs.
"""

from __future__ import annotations

from typing import Protocol

from ..api import GreyReleaseSpec, GreyReleaseStatus
from ..kubeclient import KubeClient


class Router(Protocol):
    def problem(self) -> str: ...

    def prepare(self) -> None: ...

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None) -> None: ...

    def restore_stable_selector(self) -> None: ...

    def reset(self) -> None: ...


def router_for(
    kube: KubeClient,
    *,
    namespace: str,
    release: dict,
    spec: GreyReleaseSpec,
    status: GreyReleaseStatus,
) -> Router:
    from .replicas import ReplicaRouter
    from .service import ServiceRouter

    routing = spec.traffic_routing
    if routing is None:
        return ReplicaRouter(kube, namespace=namespace, release_uid=release["metadata"]["uid"], status=status)
    if routing.service is not None:
        return ServiceRouter(kube, namespace=namespace, service=routing.service.name, status=status)
    mode = "nginx" if routing.nginx is not None else "gatewayAPI"
    return UnsupportedRouter(f"spec.trafficRouting.{mode}: not supported by this controller version")


class UnsupportedRouter:
    """A routing mode this controller cannot drive: the release is marked InvalidSpec before anything
    is touched (``problem`` is checked before the first action), and every write refuses."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def problem(self) -> str:
        return self.reason

    def _refuse(self, *_: object) -> None:
        raise RuntimeError(self.reason)

    prepare = restore_stable_selector = reset = _refuse

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None) -> None:
        self._refuse()
