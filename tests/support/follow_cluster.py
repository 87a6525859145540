"""A followed Deployment on the in-memory API server: the admission webhook's hold in front of every update
of a Deployment (:class:`HeldKube`, running :func:`greyrelease.admission.hold.decide` on each), a GitOps sync
and an HPA as other clients (:func:`commit`, :func:`scale`), and the Deployment controller between passes,
paused Deployments included (:func:`roll_out`): it makes a ReplicaSet per template with revisions, makes
none while paused, scales the current one, and adopts an existing ReplicaSet for a template it had."""

from __future__ import annotations

import copy
from typing import Any

from greyrelease.admission.hold import decide, normal_template, template_digest
from greyrelease.api.release import RELEASE_LABEL, TRACK_LABEL, Obj
from greyrelease.kube.memory import MemoryKube, json_patch
from greyrelease.kube.protocol import MERGE, PatchBody, Ref, path
from greyrelease.kube.workload import REVISION_ANNOTATION

from tests.support.builders import NS, UID

WEB = path("apps", "v1", "deployments", NS, "web")
CANARY = path("apps", "v1", "deployments", NS, "web-canary")
RELEASE = path("greyrelease.io", "v1", "greyreleases", NS, "web")
REPLICASETS = path("apps", "v1", "replicasets", NS)


def container(image: str, *, flag: str = "on") -> Obj:
    return {
        "name": "app",
        "image": image,
        "env": [{"name": "FLAG", "value": flag}],
        "envFrom": [{"configMapRef": {"name": "web-config"}}],
    }


def deployment(replicas: int = 4, image: str = "app:v1", *, enrolled: bool = True) -> Obj:
    """``web`` as Git has it: labelled for GreyRelease ``web`` (as recommended), tracked by Argo CD."""
    labels = {"app": "web", "app.kubernetes.io/instance": "shop-web"}
    if enrolled:
        labels[RELEASE_LABEL] = "web"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": NS,
            "uid": "web-uid",
            "labels": labels,
            "annotations": {"argocd.argoproj.io/tracking-id": "shop:apps/Deployment:shop/web"},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container(image)]},
            },
        },
    }


def service() -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }


def release(**spec: Any) -> Obj:
    """The GreyRelease ``web`` in follow mode: 25 % paused 30 s, 50 % paused 30 s, 100 %, unless said."""
    return {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web", "namespace": NS, "uid": UID},
        "spec": {
            "targetRef": {"name": "web"},
            "batches": [{"replicas": "25%", "pause": "30s"}, {"replicas": "50%", "pause": "30s"}, {"replicas": "100%"}],
            **spec,
        },
    }


class HeldKube(MemoryKube):
    """The in-memory API server with the hold webhook in front of every update of a Deployment, given the
    field manager of the request (as the API server gives it in the review's options). ``writes_to``
    keeps each PATCH of a Deployment as sent: (name, patch type, body, field manager)."""

    def __init__(self, *objects: Obj) -> None:
        super().__init__(*objects)
        self._updating: tuple[Obj, str | None] | None = None
        self.admit = self._hold
        self.decisions: list[str] = []
        self.writes_to: list[tuple[str, str, PatchBody, str | None]] = []

    def patch(
        self,
        ref: Ref,
        body: PatchBody,
        *,
        patch_type: str = MERGE,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        if ref.resource != "deployments" or ref.subresource is not None:
            return super().patch(ref, body, patch_type=patch_type, field_manager=field_manager, dry_run=dry_run)
        if not dry_run:
            self.writes_to.append((ref.name or "", patch_type, copy.deepcopy(body), field_manager))
        self._updating = (self._stored(ref), field_manager)
        try:
            return super().patch(ref, body, patch_type=patch_type, field_manager=field_manager, dry_run=dry_run)
        finally:
            self._updating = None

    def update_as(self, obj: Obj, field_manager: str) -> Obj:
        """An update by another client (a GitOps sync, the HPA), through the webhook, without going through
        the request log (a controller crash counts only the controller's own writes)."""
        ref = self.path_of(obj)
        self._updating = (self._stored(ref), field_manager)
        try:
            old = self._stored(ref)
            new = copy.deepcopy(obj)
            generation = int(old["metadata"].get("generation", 1))
            if new.get("spec") != old.get("spec"):
                generation += 1
            new["metadata"]["generation"] = generation
            new["status"] = copy.deepcopy(old.get("status"))
            return self.put(new)
        finally:
            self._updating = None

    def _stored(self, ref: Ref) -> Obj:
        with self._lock:
            return copy.deepcopy(self._objects.get(self._key(ref)) or {})

    def _hold(self, obj: Obj) -> Obj:
        if self._updating is None or obj.get("kind") != "Deployment":
            return obj
        old, manager = self._updating
        request = {
            "uid": "review",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "operation": "UPDATE",
            "object": obj,
            "oldObject": old,
            "options": {"fieldManager": manager} if manager else {},
        }
        decision, operations, _ = decide(request)
        self.decisions.append(decision)
        return json_patch(obj, operations) if operations else obj


def cluster(replicas: int = 4, *, enrolled: bool = True, **spec: Any) -> HeldKube:
    kube = HeldKube(deployment(replicas, enrolled=enrolled), service(), release(**spec))
    roll_out(kube)
    return kube


def commit(kube: HeldKube, image: str, *, flag: str = "on") -> str:
    """A GitOps sync of a new template (its image and an env var): held when enrolled. Its digest."""
    web = kube.get(WEB) or {}
    web["spec"]["template"]["spec"]["containers"] = [container(image, flag=flag)]
    kube.update_as(web, "argocd-controller")
    return template_digest(web["spec"]["template"])


def scale(kube: HeldKube, replicas: int) -> None:
    """The HPA, through the scale subresource (the webhook is not called for it)."""
    web = kube.get(WEB) or {}
    web["spec"]["replicas"] = replicas
    web["metadata"]["generation"] = int(web["metadata"].get("generation", 1)) + 1
    kube.put(web)


def _hash(template: Obj) -> str:
    return template_digest(template)[:10]


def replicasets(kube: MemoryKube, owner: str = "web-uid") -> list[Obj]:
    found = kube.objects(REPLICASETS)
    return [rs for rs in found if rs["metadata"]["ownerReferences"][0]["uid"] == owner]


def roll_out(kube: MemoryKube, *, hold_rollouts: bool = False) -> None:
    """The Deployment controller, all at once: foreground deletions finish; every Deployment that is not
    paused runs its template on all its replicas (a ReplicaSet for it, a new revision; an existing one
    adopted for a template it had); a paused one makes no ReplicaSet and keeps its pods, scaled. With
    ``hold_rollouts``, a Deployment whose template has no ReplicaSet yet is left half-way: observed, none
    of its pods updated."""
    kube.collect()
    for d in kube.objects(path("apps", "v1", "deployments", NS)):
        meta, spec = d["metadata"], d["spec"]
        replicas = spec.get("replicas", 1)
        uid = meta["uid"]
        template = spec["template"]
        own = replicasets(kube, uid)
        wanted = normal_template(template)
        matching = next((rs for rs in own if normal_template(rs["spec"]["template"]) == wanted), None)
        revision = max([int(rs["metadata"]["annotations"][REVISION_ANNOTATION]) for rs in own] or [0])
        current_revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
        on_template = (
            matching is not None and matching["metadata"]["annotations"][REVISION_ANNOTATION] == current_revision
        )
        if not spec.get("paused") and not on_template and not hold_rollouts:
            if matching is None:
                matching = _replicaset(d, template, revision + 1)
            else:
                matching["metadata"]["annotations"][REVISION_ANNOTATION] = str(revision + 1)
            kube.put(matching)
            new_revision = matching["metadata"]["annotations"][REVISION_ANNOTATION]
            d["metadata"].setdefault("annotations", {})[REVISION_ANNOTATION] = new_revision
            d = kube.put(d)
            on_template = True
        updated = replicas if on_template else 0
        status = {
            "observedGeneration": d["metadata"]["generation"],
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": updated,
            "availableReplicas": replicas,
        }
        if d.get("status") != status:
            kube.put({**d, "status": status})


def _replicaset(d: Obj, template: Obj, revision: int) -> Obj:
    meta = d["metadata"]
    template = copy.deepcopy(template)
    pod_hash = _hash(template)
    template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = pod_hash
    labels = dict(template["metadata"]["labels"])
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{meta['name']}-{pod_hash}",
            "namespace": NS,
            "labels": labels,
            "annotations": {REVISION_ANNOTATION: str(revision)},
            "ownerReferences": [{"uid": meta["uid"], "controller": True}],
        },
        "spec": {"replicas": d["spec"].get("replicas", 1), "template": template},
    }


def is_canary(obj: Obj) -> bool:
    return TRACK_LABEL in (obj["metadata"].get("labels") or {})
