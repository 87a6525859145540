"""The workload adapter: the release's Deployments (the user's stable one and the canary) written
through a :class:`~greyrelease.kube.protocol.Kube`, as the routers write the traffic objects.

It is built for one pass from the Deployments that pass read, and keeps the answer of each of its writes,
so a later action of the same pass starts from what the API server stored. Every call converges on the
desired state and writes only what differs; what the objects should look like is computed by the pure
functions of :mod:`greyrelease.kube.workload`.

In follow mode the target is written three ways only, all under the field manager ``greyrelease``: its
enrolment label put on and taken off (merge patches of ``metadata.labels``), and its hold released (the
JSON patch :func:`~greyrelease.admission.release_patch`, which the admission webhook lets through). Its
replicas and template are never written.
"""

from __future__ import annotations

import logging

from greyrelease.admission.hold import FIELD_MANAGER, release_patch, template_digest
from greyrelease.api.release import Obj
from greyrelease.kube.protocol import JSON_PATCH, STRATEGIC, Kube, Ref, path
from greyrelease.kube.workload import (
    build_canary,
    build_template_canary,
    canary_patch,
    controller_uid,
    enrol_patch,
    holds,
    stable_image_patch,
    unenrol_patch,
)

log = logging.getLogger("greyrelease")


def deployments_path(namespace: str, name: str | None = None) -> Ref:
    return path("apps", "v1", "deployments", namespace, name)


class Deployments:
    """The target (stable) Deployment and its canary, for one release in one pass."""

    def __init__(
        self, kube: Kube, *, release: Obj, container: str | None, target: Obj | None, canary: Obj | None
    ) -> None:
        self.kube = kube
        self.release = release
        self.namespace: str = release["metadata"]["namespace"]
        self.uid: str = release["metadata"]["uid"]
        self.container = container
        self.target = target
        self.canary = canary

    def ensure_canary(self, *, replicas: int, image: str, version: str, template: str = "") -> None:
        """The canary exists with ``replicas``, built from the stable's template with ``image``, or (follow
        mode) from the target's template as written when that is still ``template`` (when it is another by
        now, nothing is done: the next pass plans from what the Deployment holds)."""
        if self.target is None:
            raise RuntimeError("no target Deployment to build the canary from")
        if template:
            now = template_digest(self.target["spec"].get("template"))
            if now != template:
                log.info(f"canary of template {template} not built: Deployment now has template {now}")
                return
            desired = build_template_canary(self.target, self.release, digest=template, replicas=replicas)
        else:
            desired = build_canary(
                self.target, self.release, image=image, version=version, replicas=replicas, container=self.container
            )
        if self.canary is None:
            self.canary = self.kube.create(deployments_path(self.namespace), desired)
        elif controller_uid(self.canary) != self.uid:
            raise RuntimeError(f"refusing to change Deployment {self.canary['metadata']['name']}: not ours")
        elif (patch := canary_patch(self.canary, desired)) is not None:
            self.canary = self.kube.patch(deployments_path(self.namespace, desired["metadata"]["name"]), patch)

    def scale_stable(self, replicas: int) -> None:
        if self.target is not None and self.target["spec"].get("replicas") != replicas:
            self.target = self.kube.patch(self._target_path(), {"spec": {"replicas": replicas}})

    def set_stable_image(self, *, image: str, replicas: int) -> None:
        if self.target is None:
            return
        patch = stable_image_patch(self.target, image=image, replicas=replicas, container=self.container)
        if patch is not None:
            self.target = self.kube.patch(self._target_path(), patch, patch_type=STRATEGIC)

    def enrol(self, release: str) -> None:
        """Follow mode: the target carries ``greyrelease.io/release: <release>``."""
        if self.target is not None and (patch := enrol_patch(self.target, release)) is not None:
            self.target = self.kube.patch(self._target_path(), patch, field_manager=FIELD_MANAGER)

    def unenrol(self, release: str) -> None:
        """Follow mode: the target no longer carries ``greyrelease.io/release: <release>``."""
        if self.target is not None and (patch := unenrol_patch(self.target, release)) is not None:
            self.target = self.kube.patch(self._target_path(), patch, field_manager=FIELD_MANAGER)

    def release_hold(self, digest: str) -> None:
        """Follow mode: the target's hold of template ``digest`` lifted, in one JSON patch under the field
        manager ``greyrelease`` (the webhook lets exactly that through). Nothing when it does not hold that
        template; the patch's ``test`` refuses it (422) when another was held in between."""
        if self.target is not None and holds(self.target, digest):
            self.target = self.kube.patch(
                self._target_path(), release_patch(digest), patch_type=JSON_PATCH, field_manager=FIELD_MANAGER
            )

    def delete_canary(self) -> None:
        """Deleted in the foreground: the Deployment goes only after its pods, so "canary gone" means gone.
        Never one this release does not own, and not again while a deletion is under way."""
        canary = self.canary
        if canary is None or controller_uid(canary) != self.uid or canary["metadata"].get("deletionTimestamp"):
            return
        self.kube.delete(deployments_path(self.namespace, canary["metadata"]["name"]), propagation="Foreground")

    def _target_path(self) -> Ref:
        assert self.target is not None
        return deployments_path(self.namespace, self.target["metadata"]["name"])
