"""Narrowing a Service's selector to the stable ReplicaSet, and undoing it exactly.

The Deployment controller labels every pod with its ReplicaSet's ``pod-template-hash``. Adding that label
with the stable ReplicaSet's value to a Service selector drops the canary pods from the Service's
endpoints at once, without restarting a single pod. The user's selector is kept in an annotation on the
Service itself, so it is restored exactly even by a controller that restarted in between.
"""

from __future__ import annotations

import json
from typing import Any

from greyrelease.api.release import POD_TEMPLATE_HASH_LABEL
from greyrelease.kube.protocol import Kube, path

ORIGINAL_SELECTOR_ANNOTATION = "greyrelease.io/original-selector"


def narrowing_patch(service: dict[str, Any], stable_hash: str) -> dict[str, Any] | None:
    """The merge patch that narrows ``service`` to pods of ``stable_hash``; None if already narrowed."""
    meta = service.get("metadata", {})
    selector = dict(service.get("spec", {}).get("selector") or {})
    annotations = meta.get("annotations") or {}
    patch: dict[str, Any] = {}
    if ORIGINAL_SELECTOR_ANNOTATION not in annotations:
        patch["metadata"] = {"annotations": {ORIGINAL_SELECTOR_ANNOTATION: json.dumps(selector, sort_keys=True)}}
    if selector.get(POD_TEMPLATE_HASH_LABEL) != stable_hash:
        patch["spec"] = {"selector": {POD_TEMPLATE_HASH_LABEL: stable_hash}}
    return patch or None


def restoring_patch(service: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that gives ``service`` back the selector the user wrote; None if nothing to do."""
    annotations = service.get("metadata", {}).get("annotations") or {}
    saved = annotations.get(ORIGINAL_SELECTOR_ANNOTATION)
    if saved is None:
        return None
    original: dict[str, str] = json.loads(saved)
    current = dict(service.get("spec", {}).get("selector") or {})
    # Merge patch: a key set to null is removed; the rest are set to the user's values.
    selector: dict[str, Any] = {k: None for k in current if k not in original}
    selector.update({k: v for k, v in original.items() if current.get(k) != v})
    patch: dict[str, Any] = {"metadata": {"annotations": {ORIGINAL_SELECTOR_ANNOTATION: None}}}
    if selector:
        patch["spec"] = {"selector": selector}
    return patch


class ServiceSelector:
    """Narrow / restore one Service."""

    def __init__(self, kube: Kube, *, namespace: str, name: str) -> None:
        self.kube = kube
        self.path = path("", "v1", "services", namespace, name)
        self.name = name

    def get(self) -> dict[str, Any] | None:
        return self.kube.get(self.path)

    def narrow(self, stable_hash: str) -> None:
        service = self.get()
        if service is None or not stable_hash:
            return
        patch = narrowing_patch(service, stable_hash)
        if patch:
            self.kube.patch(self.path, patch)

    def restore(self) -> None:
        service = self.get()
        if service is None:
            return
        patch = restoring_patch(service)
        if patch:
            self.kube.patch(self.path, patch)
