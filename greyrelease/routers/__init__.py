"""Traffic routers: one small interface, one module per way of splitting traffic.

A router is built for one reconcile of one release and answers six calls:

- ``problem()``: why it cannot work with the cluster as it is ("" when it can); read-only.
- ``prepare()``: routing objects exist with the canary at weight 0, before any canary pod does.
- ``set_weight(w, header_match)``: the canary gets ``w`` percent; 0 is the abort, and it comes first.
- ``restore_stable_selector()``: the stable Service selects as the user wrote it (before the stable rolls).
- ``reset()``: everything the router added is gone and the user's objects are as they were.
- ``canary_endpoints()``: how many canary pods the proxy can send to (the ready endpoints of the canary
  Service), or None in the modes that route through no Service of their own; read-only.

Modules: ``replicas`` (no routing), ``service`` (one Service, weight = replica share), ``nginx`` (a canary
Ingress for ingress-nginx), ``gateway`` (weights on a Gateway API HTTPRoute); ``selector`` and
``canary_service`` hold what the last two share.

Every call is idempotent: it builds the desired state, compares, and writes only what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus, Obj
from greyrelease.kube.protocol import Kube

#: The release's status as the router should act on it: read when a call needs it, so a router built
#: before the pass's plan acts on what the plan records (e.g. the stable ReplicaSet's hash, recorded in
#: the very pass that prepares the routing).
StatusSource = Callable[[], GreyReleaseStatus]


class Router(Protocol):
    def problem(self) -> str: ...

    def prepare(self) -> None: ...

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None) -> None: ...

    def restore_stable_selector(self) -> None: ...

    def reset(self) -> None: ...

    def canary_endpoints(self) -> int | None: ...


def router_for(
    kube: Kube,
    *,
    namespace: str,
    release: Obj,
    spec: GreyReleaseSpec,
    status: GreyReleaseStatus | StatusSource,
) -> Router:
    """The router of the release's traffic routing mode. ``status`` is the status to act on, or a
    function giving it at the time of each call."""
    from greyrelease.kube.workload import owner_reference
    from greyrelease.routers.gateway import GatewayRouter
    from greyrelease.routers.nginx import NginxRouter
    from greyrelease.routers.replicas import ReplicaRouter
    from greyrelease.routers.service import ServiceRouter

    current: StatusSource = status if callable(status) else (lambda: status)
    routing = spec.traffic_routing
    if routing is None:
        return ReplicaRouter(kube, namespace=namespace, release_uid=release["metadata"]["uid"], status=current)
    if routing.service is not None:
        return ServiceRouter(kube, namespace=namespace, service=routing.service.name, status=current)
    owner = owner_reference(release)

    def stable_hash() -> str:
        return current().stable_pod_template_hash

    if routing.nginx is not None:
        return NginxRouter(
            kube, namespace=namespace, routing=routing.nginx, spec=spec, owner=owner, stable_hash=stable_hash
        )
    assert routing.gateway_api is not None  # the models allow exactly one mode
    return GatewayRouter(kube, namespace=namespace, routing=routing.gateway_api, owner=owner, stable_hash=stable_hash)
