"""Deployments: reading them into the planner's terms, and building the canary. Pure (no I/O).

Follow mode reads more of the target (:func:`workload_of` with ``follow``): whether it is paused and holds a
template, the digest of its template as the admission webhook counts it
(:func:`greyrelease.admission.template_digest`), its images, the enrolment label; and of the ReplicaSet of
its current revision (:func:`replicaset_of`), whose pods are the stable. Its canary is built from the
held template as written (:func:`build_template_canary`), and the only writes to the target itself are the
enrolment label and the hold's release (:func:`enrol_patch`, :func:`unenrol_patch`,
:func:`greyrelease.admission.release_patch`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from greyrelease.admission.hold import HELD_ANNOTATION, template_digest
from greyrelease.api.release import GROUP, KIND, RELEASE_LABEL, TRACK_LABEL, VERSION, VERSION_LABEL, Obj
from greyrelease.planner.images import label_value
from greyrelease.planner.machine import Workload
from greyrelease.planner.observed import Images, ReplicaSet

TEMPLATE_HASH_ANNOTATION = "greyrelease.io/template-hash"
#: On a canary built in follow mode: the digest of the Deployment's template it was built from.
SOURCE_ANNOTATION = "greyrelease.io/source-template"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
CANARY_SUFFIX = "-canary"
#: GitOps tools' tracking metadata: a canary carrying it on its own metadata would look like an object of
#: the app in Git (Argo CD's tracking annotation and, in its label tracking, app.kubernetes.io/instance;
#: Flux's kustomize and helm labels). Left on the pod template, where selectors may use them.
GITOPS_ANNOTATION_PREFIXES = ("argocd.argoproj.io/",)
GITOPS_LABEL_PREFIXES = ("kustomize.toolkit.fluxcd.io/", "helm.toolkit.fluxcd.io/")
GITOPS_LABELS = ("app.kubernetes.io/instance", "argocd.argoproj.io/instance")


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


def images_of(template: Obj | None) -> Images:
    """(container, image) of each container of a pod template."""
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    return tuple((str(c.get("name", "")), str(c.get("image", ""))) for c in containers)


def workload_of(
    obj: Obj,
    container: str | None = None,
    template_hash: str = "",
    *,
    follow: bool = False,
    stable: ReplicaSet | None = None,
) -> Workload:
    """A Deployment in the planner's terms; with ``follow``, what follow mode reads of its target too (its
    template's digest is computed only then), and ``stable``, the ReplicaSet its pods run."""
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    pod_spec = spec.get("template", {}).get("spec", {})
    chosen = pick_container(pod_spec, container) or {}
    annotations = meta.get("annotations") or {}
    extra: dict[str, Any] = {}
    if follow:
        extra = {
            "paused": spec.get("paused") is True,
            "held": str(annotations.get(HELD_ANNOTATION, "")),
            "digest": template_digest(spec.get("template")),
            "images": images_of(spec.get("template")),
            "enrolled": str((meta.get("labels") or {}).get(RELEASE_LABEL, "")),
            "stable": stable,
            "progress_deadline": int(spec.get("progressDeadlineSeconds") or 0),
            "timed_out": timed_out(status),
        }
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
        source=str(annotations.get(SOURCE_ANNOTATION, "")),
        **extra,
    )


#: The reason of a Deployment's Progressing condition once its progressDeadlineSeconds passed without progress.
TIMED_OUT_REASON = "ProgressDeadlineExceeded"


def timed_out(status: Obj) -> str:
    """The message of a Deployment's Progressing condition when the Deployment controller reports its rollout
    timed out (``ProgressDeadlineExceeded``; the message itself when it has none), else ""."""
    for cond in status.get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("Progressing", "False", TIMED_OUT_REASON):
            return str(cond.get("message") or TIMED_OUT_REASON)
    return ""


def revision_of(obj: Obj) -> str:
    """``deployment.kubernetes.io/revision`` of a Deployment or ReplicaSet ("" when it has none yet)."""
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION, ""))


def current_replicaset(deployment: Obj, replicasets: list[Obj]) -> Obj | None:
    """The Deployment's current ReplicaSet: owned by it, of its revision, labelled with a hash."""
    meta = deployment.get("metadata", {})
    revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    for rs in replicasets:
        rs_meta = rs.get("metadata", {})
        if controller_uid(rs) != meta.get("uid"):
            continue
        if revision is not None and (rs_meta.get("annotations") or {}).get(REVISION_ANNOTATION) != revision:
            continue
        if (rs_meta.get("labels") or {}).get("pod-template-hash"):
            return rs
    return None


def current_template_hash(deployment: Obj, replicasets: list[Obj]) -> str:
    """The ``pod-template-hash`` of the Deployment's current ReplicaSet (same revision, owned by it)."""
    rs = current_replicaset(deployment, replicasets)
    return str(rs["metadata"]["labels"]["pod-template-hash"]) if rs is not None else ""


def replicaset_of(rs: Obj) -> ReplicaSet:
    """A ReplicaSet in the planner's terms: its name, hash, its template's digest (as the webhook counts
    it: the ``pod-template-hash`` label left out) and images, its revision."""
    meta = rs.get("metadata") or {}
    template = (rs.get("spec") or {}).get("template")
    return ReplicaSet(
        name=str(meta.get("name", "")),
        template_hash=str((meta.get("labels") or {}).get("pod-template-hash", "")),
        digest=template_digest(template),
        images=images_of(template),
        revision=revision_of(rs),
    )


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


def build_canary(
    stable: Obj, release: Obj, *, image: str | None, version: str, replicas: int, container: str | None
) -> Obj:
    """The canary Deployment: the stable's pod template with ``image`` (None: as it is), plus track and
    version labels.

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
    if image is not None:
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


def _gitops_tracking(key: str, prefixes: tuple[str, ...], names: tuple[str, ...] = ()) -> bool:
    return key in names or key.startswith(prefixes)


def build_template_canary(stable: Obj, release: Obj, *, digest: str, replicas: int) -> Obj:
    """Follow mode: the canary Deployment built from the Deployment's ``spec.template`` as written (every
    container, env and config reference: the held template whose digest is ``digest``), plus the track
    label and the version label (the digest). Its own metadata leaves out GitOps tracking labels and
    annotations, and says which template it was built from (``greyrelease.io/source-template``)."""
    desired = build_canary(stable, release, image=None, version=digest, replicas=replicas, container=None)
    meta = desired["metadata"]
    meta["labels"] = {
        k: v for k, v in meta["labels"].items() if not _gitops_tracking(k, GITOPS_LABEL_PREFIXES, GITOPS_LABELS)
    }
    meta["annotations"][SOURCE_ANNOTATION] = digest
    return desired


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
            "metadata": {"annotations": dict(desired["metadata"]["annotations"])},
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


def enrol_patch(deployment: Obj, release: str) -> Obj | None:
    """The merge patch that labels the Deployment ``greyrelease.io/release: <release>``; None when it is."""
    if (deployment.get("metadata", {}).get("labels") or {}).get(RELEASE_LABEL) == release:
        return None
    return {"metadata": {"labels": {RELEASE_LABEL: release}}}


def unenrol_patch(deployment: Obj, release: str) -> Obj | None:
    """The merge patch that removes ``greyrelease.io/release: <release>``; None when the label is not
    there or names another release."""
    if (deployment.get("metadata", {}).get("labels") or {}).get(RELEASE_LABEL) != release:
        return None
    return {"metadata": {"labels": {RELEASE_LABEL: None}}}


def holds(deployment: Obj, digest: str) -> bool:
    """Whether the Deployment is held (paused) with template ``digest``."""
    annotations = deployment.get("metadata", {}).get("annotations") or {}
    return deployment.get("spec", {}).get("paused") is True and annotations.get(HELD_ANNOTATION) == digest
