"""Traffic routers: one small interface, one module per way of splitting traffic.

A router is built for one reconcile of one release and answers six calls:

- ``problem()``: why it cannot work with the cluster as it is ("" when it can); read-only.
- ``prepare(stable_hash)``: routing objects exist with the canary at weight 0, before any canary pod does,
  and a stable Service of the mode's own selects only the stable ReplicaSet's pods (``stable_hash``).
- ``set_weight(w, header_match, stable_hash=...)``: the canary gets ``w`` percent; 0 is the abort, and it
  comes first (in Service mode it narrows the Service to the stable ReplicaSet's pods).
- ``restore_stable_selector()``: the stable Service selects as the user wrote it (before the stable rolls).
- ``reset()``: everything the router added is gone and the user's objects are as they were.
- ``canary_endpoints()``: how many canary pods the proxy can send to (the ready endpoints of the canary
  Service), or None in the modes that route through no Service of their own; read-only.

Modules: ``replicas`` (no routing), ``service`` (one Service, weight = replica share), ``nginx`` (a canary
Ingress for ingress-nginx), ``gateway`` (weights on a Gateway API HTTPRoute); ``selector`` and
``canary_service`` hold what the last two share.

Every call is idempotent: it builds the desired state, compares, and writes only what differs. A router
reads nothing of the release's status: what a call needs comes with it, from the action the planner
planned (:mod:`greyrelease.planner.actions`).
"""

from __future__ import annotations

from typing import Protocol

from greyrelease.api.release import GreyReleaseSpec, Obj
from greyrelease.kube.protocol import Kube


class Router(Protocol):
    def problem(self) -> str: ...

    def prepare(self, stable_hash: str) -> None: ...

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None, *, stable_hash: str = "") -> None: ...

    def restore_stable_selector(self) -> None: ...

    def reset(self) -> None: ...

    def canary_endpoints(self) -> int | None: ...


def router_for(kube: Kube, *, namespace: str, release: Obj, spec: GreyReleaseSpec, canary: str) -> Router:
    """The router of the release's traffic routing mode. ``canary`` names the canary Deployment ("" when
    there is no target to name it after): without traffic routing, the abort scales it to nothing."""
    from greyrelease.kube.workload import owner_reference
    from greyrelease.routers.gateway import GatewayRouter
    from greyrelease.routers.nginx import NginxRouter
    from greyrelease.routers.replicas import ReplicaRouter
    from greyrelease.routers.service import ServiceRouter

    routing = spec.traffic_routing
    if routing is None:
        return ReplicaRouter(kube, namespace=namespace, release_uid=release["metadata"]["uid"], canary=canary)
    if routing.service is not None:
        return ServiceRouter(kube, namespace=namespace, service=routing.service.name)
    owner = owner_reference(release)
    if routing.nginx is not None:
        return NginxRouter(kube, namespace=namespace, routing=routing.nginx, spec=spec, owner=owner)
    assert routing.gateway_api is not None  # the models allow exactly one mode
    return GatewayRouter(kube, namespace=namespace, routing=routing.gateway_api, owner=owner)
