"""No traffic routing: the canary's share of the pods is its share of the traffic, and nothing else
moves it. An abort can only take the canary's pods away, so weight 0 scales the canary to zero."""

from __future__ import annotations

from ..api import GreyReleaseStatus
from ..kubeclient import KubeClient, path
from ..workload import canary_name, controller_uid


class ReplicaRouter:
    def __init__(self, kube: KubeClient, *, namespace: str, release_uid: str, status: GreyReleaseStatus) -> None:
        self.kube = kube
        self.release_uid = release_uid
        self.canary_path = (
            path("apps", "v1", "deployments", namespace, canary_name(status.target_name))
            if status.target_name
            else ""
        )

    def problem(self) -> str:
        return ""

    def prepare(self) -> None:
        """Nothing to create."""

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None) -> None:
        if weight != 0 or not self.canary_path:
            return
        canary = self.kube.get(self.canary_path)
        if canary is None or controller_uid(canary) != self.release_uid:
            return  # never touch a Deployment this release does not own
        if canary.get("spec", {}).get("replicas") != 0:
            self.kube.patch(self.canary_path, {"spec": {"replicas": 0}})

    def restore_stable_selector(self) -> None:
        """No selector was changed."""

    def reset(self) -> None:
        """Nothing was added."""
