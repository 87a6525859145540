"""No traffic routing: the canary's share of the pods is its share of the traffic, and nothing else
moves it. An abort can only take the canary's pods away, so weight 0 scales the canary to zero."""

from __future__ import annotations

from collections.abc import Callable

from greyrelease.api.release import GreyReleaseStatus
from greyrelease.kube.protocol import Kube, Ref, path
from greyrelease.kube.workload import canary_name, controller_uid


class ReplicaRouter:
    def __init__(
        self, kube: Kube, *, namespace: str, release_uid: str, status: Callable[[], GreyReleaseStatus]
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.release_uid = release_uid
        self.status = status

    @property
    def canary_path(self) -> Ref | None:
        target = self.status().target_name
        return path("apps", "v1", "deployments", self.namespace, canary_name(target)) if target else None

    def problem(self) -> str:
        return ""

    def prepare(self) -> None:
        """Nothing to create."""

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None) -> None:
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
