"""The hold: what the admission webhook answers for an UPDATE of an enrolled Deployment. Pure.

:func:`admit` takes an AdmissionReview (``admission.k8s.io/v1``) and returns the AdmissionReview to answer
with. It reads nothing but the review (no clock, no cluster, no file), so a dry-run request gets exactly
the answer of the real one, and any replica may answer any request.

**Enrolled** is a Deployment labelled ``greyrelease.io/release`` (the GreyRelease's name), on the new
object or on the old one: a request that drops the label together with a new template (``kubectl
replace`` of a manifest without it) is still held, and the label is put back so the next request is
sent here too. A label-only edit that removes it, which the API server never sends here, un-enrols. The
canary Deployment carries the label too, and ``greyrelease.io/track``: it is never held.

**Held** is a Deployment with ``spec.paused: true`` and the annotation ``greyrelease.io/held`` (the digest
of the held template, :func:`template_digest`). A paused Deployment creates no new ReplicaSet but still
scales, so an HPA keeps working while a new template waits.

The answer, in order:

1. not an UPDATE of an ``apps/v1`` Deployment, not enrolled, a canary, ``greyrelease.io/bypass: "true"``
   on the new object (an emergency hotfix), or ``spec.replicas: 0`` (nothing runs, nothing to canary):
   allowed as it is;
2. the controller releasing its hold (below): allowed as it is;
3. a new ``spec.template``, or a held Deployment that this request unpauses or whose annotation it
   drops or changes (``kubectl rollout resume``, a patch removing ``paused``, ``kubectl replace`` without
   the annotation, Argo CD's resume action): allowed with a JSONPatch that sets ``spec.paused: true``,
   ``greyrelease.io/held`` to the digest of the template the request leaves, and the enrolment label when
   the request dropped it; nothing when the object already is so (a reinvocation);
4. anything else: allowed as it is.

**What counts as a new template.** The API server defaults the incoming object before mutating webhooks
run, and ``oldObject`` is the stored, defaulted object, so a manifest that leaves out
``imagePullPolicy`` or ``terminationMessagePath`` is compared defaulted against defaulted: the two
templates are compared as they are, except for what the API server itself does not count as a change
(``Semantic.DeepEqual``, which the Deployment controller's ``EqualIgnoreHash`` builds on): an empty list
or map equals an absent one, and the ``pod-template-hash`` label is ignored. Quantities reach us in their
canonical form. Anything else (an image, an env var, ``kubectl rollout restart``'s ``restartedAt``
annotation) is a new template, as it is a new ReplicaSet for the Deployment controller.

**The controller's own release is not held again.** The planner ends a release by lifting the hold in
one PATCH sent with ``?fieldManager=greyrelease`` that removes both ``spec.paused`` and
``greyrelease.io/held`` and leaves the template alone (:func:`release_patch`; its ``test`` operation makes
it fail with 422 when a newer template was held in between). All three together are the token:
``kubectl rollout resume`` and Argo CD's resume action keep the annotation and use their own manager,
``kubectl replace`` and GitOps syncs use theirs. This is a protocol against accidents, not an access
control (whoever may update the Deployment may also set the bypass annotation). It was chosen over a
``matchCondition`` on the controller's ServiceAccount because that has to name the install's namespace and
account (a renamed install would re-hold its own releases for ever), and because a controller run from a
terminal shares its user with ``kubectl``, so it would let every ``kubectl rollout resume`` through.

**Warnings** (``kubectl`` prints them; GitOps tools log them): a hold names the GreyRelease and the
digest; a manifest that declares ``spec.paused`` (in ``kubectl.kubernetes.io/last-applied-configuration``,
or in the fields of a server-side apply manager other than ``greyrelease``) would fight the hold on every
self-healing sync and is told so.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from greyrelease.api.release import ANNOTATION_PREFIX, POD_TEMPLATE_HASH_LABEL, RELEASE_LABEL, TRACK_LABEL

Obj = dict[str, Any]

HELD_ANNOTATION = ANNOTATION_PREFIX + "held"
BYPASS_ANNOTATION = ANNOTATION_PREFIX + "bypass"
#: The field manager of the controller's writes; a release of the hold sent with it is let through.
FIELD_MANAGER = "greyrelease"
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"

HOLD = "hold"  # a new template held
REHOLD = "rehold"  # a held Deployment unpaused or its annotation dropped: put back
RELEASE = "release"  # the controller lifting its hold
ALLOW = "allow"  # nothing to do


def _pointer(key: str) -> str:
    """A map key as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _normal(value: Any) -> Any:
    """``value`` without nulls, empty lists and empty maps, recursively: what ``Semantic.DeepEqual``
    treats as equal to absent."""
    if isinstance(value, dict):
        out = {k: _normal(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def normal_template(template: Obj | None) -> Obj:
    """A pod template as the Deployment controller compares it: :func:`_normal`, without the
    ``pod-template-hash`` label."""
    normal = _normal(template or {})
    if not isinstance(normal, dict):
        return {}
    # Digested on every pass of a followed release: _normal's maps are new at every level, so the label
    # is taken out of them rather than out of a copy made first (bench/README.md, "What an idle pass
    # repeats"), and what it leaves empty goes as _normal would have dropped it.
    meta = normal.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if isinstance(meta, dict) and isinstance(labels, dict) and POD_TEMPLATE_HASH_LABEL in labels:
        del labels[POD_TEMPLATE_HASH_LABEL]
        if not labels:
            del meta["labels"]
            if not meta:
                del normal["metadata"]
    return normal


def template_digest(template: Obj | None) -> str:
    """The value of ``greyrelease.io/held``: 16 hex digits of the SHA-256 of the normalized template's
    canonical JSON. Equal templates (as the API server sees them) have equal digests."""
    canonical = json.dumps(normal_template(template), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _meta(obj: Obj | None, key: str) -> dict[str, str]:
    found = ((obj or {}).get("metadata") or {}).get(key)
    return found if isinstance(found, dict) else {}


def _spec(obj: Obj | None) -> Obj:
    found = (obj or {}).get("spec")
    return found if isinstance(found, dict) else {}


def _paused(obj: Obj | None) -> bool:
    return _spec(obj).get("paused") is True


def is_held(obj: Obj | None) -> bool:
    """Paused, and carrying the annotation ``greyrelease.io/held``."""
    return _paused(obj) and HELD_ANNOTATION in _meta(obj, "annotations")


def _declares_paused(obj: Obj) -> str | None:
    """Who declares ``spec.paused`` in the manifest behind ``obj``: the client-side apply annotation, or a
    server-side apply manager other than ours; None when nobody does."""
    last = _meta(obj, "annotations").get(LAST_APPLIED_ANNOTATION)
    if last:
        try:
            applied = json.loads(last)
        except ValueError:
            applied = None
        if isinstance(applied, dict) and "paused" in (applied.get("spec") or {}):
            return "kubectl.kubernetes.io/last-applied-configuration"
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if entry.get("operation") != "Apply" or entry.get("manager") == FIELD_MANAGER:
            continue
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:paused" in fields:
            return f"field manager {entry.get('manager')!r}"
    return None


def _response(uid: str, *, patch: list[Obj] | None = None, warnings: list[str], decision: str) -> Obj:
    response: Obj = {"uid": uid, "allowed": True, "auditAnnotations": {"decision": decision}}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _set(obj: Obj, section: str, key: str, value: str) -> list[Obj]:
    """JSONPatch operations that set ``metadata.<section>[key]`` (creating the map when absent)."""
    existing = (obj.get("metadata") or {}).get(section)
    if not isinstance(existing, dict):
        return [{"op": "add", "path": f"/metadata/{section}", "value": {key: value}}]
    if existing.get(key) == value:
        return []
    return [{"op": "add", "path": f"/metadata/{section}/{_pointer(key)}", "value": value}]


def decide(request: Obj) -> tuple[str, list[Obj], list[str]]:
    """The decision on one AdmissionRequest: (one of HOLD, REHOLD, RELEASE, ALLOW; the JSONPatch;
    the warnings)."""
    kind = request.get("kind") or {}
    if (
        request.get("operation") != "UPDATE"
        or kind.get("group") != "apps"
        or kind.get("kind") != "Deployment"
        or request.get("subResource")
    ):
        return ALLOW, [], []
    new, old = request.get("object") or {}, request.get("oldObject") or {}
    new_labels, old_labels = _meta(new, "labels"), _meta(old, "labels")
    release = new_labels.get(RELEASE_LABEL) or old_labels.get(RELEASE_LABEL)
    if not release or TRACK_LABEL in new_labels or TRACK_LABEL in old_labels:
        return ALLOW, [], []
    if _meta(new, "annotations").get(BYPASS_ANNOTATION) == "true":
        return ALLOW, [], []
    if _spec(new).get("replicas") == 0:
        return ALLOW, [], []

    changed = normal_template(_spec(new).get("template")) != normal_template(_spec(old).get("template"))
    was_held = is_held(old)
    new_annotations = _meta(new, "annotations")
    if (
        was_held
        and not changed
        and not _paused(new)
        and HELD_ANNOTATION not in new_annotations
        and (request.get("options") or {}).get("fieldManager") == FIELD_MANAGER
    ):
        return RELEASE, [], []
    if not changed and not was_held:
        return ALLOW, [], []

    digest = template_digest(_spec(new).get("template"))
    patch: list[Obj] = []
    if not _paused(new):
        patch.append({"op": "add", "path": "/spec/paused", "value": True})
    patch += _set(new, "annotations", HELD_ANNOTATION, digest)
    warnings: list[str] = []
    if changed:
        decision = HOLD
        warnings.append(f"greyrelease: new pod template {digest} held (spec.paused) for GreyRelease {release}")
    elif patch:
        decision = REHOLD
        warnings.append(
            f"greyrelease: held for GreyRelease {release}: spec.paused and {HELD_ANNOTATION} put back "
            f"({BYPASS_ANNOTATION}=true lets a change through)"
        )
    else:
        decision = ALLOW
    if RELEASE_LABEL not in new_labels:
        patch += _set(new, "labels", RELEASE_LABEL, release)
        warnings.append(f"greyrelease: the label {RELEASE_LABEL} was dropped and is put back: declare it")
        decision = REHOLD if decision == ALLOW else decision
    declared = _declares_paused(new)
    if declared:
        warnings.append(
            f"greyrelease: the manifest declares spec.paused ({declared}): remove it, GreyRelease sets it "
            "to hold the template and every sync would fight the hold"
        )
    return decision, patch, warnings


def admit(review: Obj) -> Obj:
    """The AdmissionReview to answer ``review`` with. Raises ValueError when it is not an
    ``admission.k8s.io/v1`` AdmissionReview with a request and its uid."""
    if not isinstance(review, dict) or review.get("apiVersion") != "admission.k8s.io/v1":
        raise ValueError("not an admission.k8s.io/v1 AdmissionReview")
    request = review.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        raise ValueError("an AdmissionReview without a request uid")
    decision, patch, warnings = decide(request)
    return _response(str(request["uid"]), patch=patch, warnings=warnings, decision=decision)


def release_patch(digest: str) -> list[Obj]:
    """The JSONPatch with which the controller lifts the hold of template ``digest``, sent with
    ``?fieldManager=greyrelease``: it fails (422) when the held template is no longer ``digest``."""
    held = f"/metadata/annotations/{_pointer(HELD_ANNOTATION)}"
    return [
        {"op": "test", "path": held, "value": digest},
        {"op": "remove", "path": held},
        {"op": "remove", "path": "/spec/paused"},
    ]
