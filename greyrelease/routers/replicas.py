"""No traffic routing: the canary's share of the pods is its share of the traffic, and nothing else
moves it. An abort can only take the canary's pods away, so weight 0 scales the canary to zero."""

from __future__ import annotations

from greyrelease.kube.protocol import Kube, Ref, path
from greyrelease.kube.workload import controller_uid


class ReplicaRouter:
    """``canary``: the name of the canary Deployment ("" when there is none to name yet)."""

    def __init__(self, kube: Kube, *, namespace: str, release_uid: str, canary: str) -> None:
        self.kube = kube
        self.release_uid = release_uid
        self.canary_path: Ref | None = path("apps", "v1", "deployments", namespace, canary) if canary else None

    def problem(self) -> str:
        return ""

    def prepare(self, stable_hash: str) -> None:
        """Nothing to create."""

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None, *, stable_hash: str = "") -> None:
        canary_path = self.canary_path
        if weight != 0 or not canary_path:
            return
        canary = self.kube.get(canary_path)
        if canary is None or controller_uid(canary) != self.release_uid:
            return  # never touch a Deployment this release does not own
        if canary.get("spec", {}).get("replicas") != 0:
            self.kube.patch(canary_path, {"spec": {"replicas": 0}})

    def restore_stable_selector(self) -> None:
        """No selector was changed."""

    def reset(self) -> None:
        """Nothing was added."""

    def canary_endpoints(self) -> None:
        """No Service: the canary's pods serve as soon as they are ready."""
        return None
