"""Service mode: one Service selects both tracks, so traffic follows the replica ratio.

The weight of a batch is the canary's share of the pods; the router's only lever is the abort: weight 0
narrows the Service to the stable ReplicaSet (see :mod:`.selector`), any other weight restores it.
"""

from __future__ import annotations

from greyrelease.kube.protocol import Kube
from greyrelease.routers.selector import ServiceSelector


class ServiceRouter:
    def __init__(self, kube: Kube, *, namespace: str, service: str) -> None:
        self.selector = ServiceSelector(kube, namespace=namespace, name=service)

    def problem(self) -> str:
        if self.selector.get() is None:
            return f"spec.trafficRouting.service.name: Service {self.selector.name!r} not found"
        return ""

    def prepare(self, stable_hash: str) -> None:
        """Nothing to create: the user's Service already selects both tracks."""

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None, *, stable_hash: str = "") -> None:
        if weight == 0:
            self.selector.narrow(stable_hash)
        else:
            self.selector.restore()

    def restore_stable_selector(self) -> None:
        self.selector.restore()

    def reset(self) -> None:
        self.selector.restore()

    def canary_endpoints(self) -> None:
        """The user's Service selects the canary pods as they become ready: none waits for another."""
        return None
