"""Deployments: reading them into the planner's terms, and building the canary. Pure (no I/O)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from greyrelease.api.release import GROUP, KIND, RELEASE_LABEL, TRACK_LABEL, VERSION, VERSION_LABEL, Obj
from greyrelease.planner.images import label_value
from greyrelease.planner.machine import Workload

TEMPLATE_HASH_ANNOTATION = "greyrelease.io/template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
CANARY_SUFFIX = "-canary"


def canary_name(stable_name: str) -> str:
    return stable_name + CANARY_SUFFIX


def pick_container(template_spec: Obj, container: str | None) -> Obj | None:
    containers: list[Obj] = template_spec.get("containers") or []
    if not containers:
        return None
    if container is None:
        return containers[0]
    return next((c for c in containers if c.get("name") == container), None)


def controller_uid(obj: Obj) -> str:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid", ""))
    return ""


def workload_of(obj: Obj, container: str | None = None, template_hash: str = "") -> Workload:
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    pod_spec = spec.get("template", {}).get("spec", {})
    chosen = pick_container(pod_spec, container) or {}
    return Workload(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation", 1)),
        observed_generation=int(status.get("observedGeneration", 0)),
        replicas=int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1),
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        available=int(status.get("availableReplicas", 0)),
        total=int(status.get("replicas", 0)),
        image=str(chosen.get("image", "")),
        container=str(chosen.get("name", "")),
        containers=tuple(str(c.get("name", "")) for c in pod_spec.get("containers") or []),
        template_hash=template_hash,
        owner_uid=controller_uid(obj),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def current_template_hash(deployment: Obj, replicasets: list[Obj]) -> str:
    """The ``pod-template-hash`` of the Deployment's current ReplicaSet (same revision, owned by it)."""
    meta = deployment.get("metadata", {})
    revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    for rs in replicasets:
        rs_meta = rs.get("metadata", {})
        if controller_uid(rs) != meta.get("uid"):
            continue
        if revision is not None and (rs_meta.get("annotations") or {}).get(REVISION_ANNOTATION) != revision:
            continue
        value = (rs_meta.get("labels") or {}).get("pod-template-hash")
        if value:
            return str(value)
    return ""


def owner_reference(release: Obj) -> Obj:
    meta = release["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def build_canary(stable: Obj, release: Obj, *, image: str, version: str, replicas: int, container: str | None) -> Obj:
    """The canary Deployment: the stable's pod template with ``image``, plus track and version labels.

    Its selector is the stable's plus ``greyrelease.io/track: canary``, so it never selects a stable
    pod. The stable's selector does match the canary pods (they copy its labels), but the Deployment and
    ReplicaSet controllers only adopt orphans, and the canary's ReplicaSets and pods are owned by the
    canary Deployment, which the GreyRelease owns.
    """
    meta, spec = stable["metadata"], stable["spec"]
    release_name = release["metadata"]["name"]
    template = copy.deepcopy(spec["template"])
    tmeta = template.setdefault("metadata", {})
    labels = dict(tmeta.get("labels") or {})
    labels.pop("pod-template-hash", None)
    labels[TRACK_LABEL] = "canary"
    labels[VERSION_LABEL] = label_value(version) or "unknown"
    tmeta["labels"] = labels
    chosen = pick_container(template["spec"], container)
    if chosen is None:
        raise ValueError(f"container {container!r} not found in Deployment {meta['name']!r}")
    chosen["image"] = image

    selector = copy.deepcopy(spec.get("selector") or {})
    selector.setdefault("matchLabels", {})[TRACK_LABEL] = "canary"

    body_spec: Obj = {
        "replicas": replicas,
        "selector": selector,
        "template": template,
        "revisionHistoryLimit": 1,
    }
    for key in ("minReadySeconds", "strategy", "progressDeadlineSeconds"):
        if key in spec:
            body_spec[key] = copy.deepcopy(spec[key])
    obj_labels = dict(meta.get("labels") or {})
    obj_labels.update({RELEASE_LABEL: label_value(release_name) or "release", TRACK_LABEL: "canary"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": canary_name(meta["name"]),
            "namespace": meta.get("namespace"),
            "labels": obj_labels,
            "annotations": {TEMPLATE_HASH_ANNOTATION: _digest([selector, template])},
            "ownerReferences": [owner_reference(release)],
        },
        "spec": body_spec,
    }


def canary_patch(existing: Obj, desired: Obj) -> Obj | None:
    """The merge patch that makes ``existing`` the ``desired`` canary, or None when nothing differs.

    The API server adds defaults to a pod template, so templates are compared by the digest we stamp
    on the object, not field by field.
    """
    want_hash = desired["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
    have_hash = (existing.get("metadata", {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
    patch: Obj = {}
    if want_hash != have_hash:
        patch = {
            "metadata": {"annotations": {TEMPLATE_HASH_ANNOTATION: want_hash}},
            "spec": {"template": desired["spec"]["template"]},
        }
    if existing.get("spec", {}).get("replicas") != desired["spec"]["replicas"]:
        patch.setdefault("spec", {})["replicas"] = desired["spec"]["replicas"]
    return patch or None


def stable_image_patch(stable: Obj, *, image: str, replicas: int, container: str | None) -> Obj | None:
    """A strategic merge patch setting the stable's image and replicas, or None when already so."""
    spec = stable["spec"]
    chosen = pick_container(spec["template"]["spec"], container)
    if chosen is None:
        raise ValueError(f"container {container!r} not found in Deployment {stable['metadata']['name']!r}")
    patch: Obj = {}
    if chosen.get("image") != image:
        patch = {"spec": {"template": {"spec": {"containers": [{"name": chosen["name"], "image": image}]}}}}
    if spec.get("replicas") != replicas:
        patch.setdefault("spec", {})["replicas"] = replicas
    return patch or None
