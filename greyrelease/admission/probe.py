"""The hold's self-test, its pure part: the change it tries and how it reads the answer. Pure.

The controller checks that the API server would hold a new template by sending one as a server-side dry
run (``dryRun=All``): a merge patch of an enrolled Deployment that sets the annotation
``greyrelease.io/selftest`` in ``spec.template.metadata`` to a value never used before (:func:`patch`).
The API server runs the mutating webhooks on a dry run as on a real request (the hold declares
``sideEffects: None``) and answers with the object it would have stored, storing nothing: no new
resourceVersion, no watch event, no rollout. That answer is held (:func:`held`) when it is paused and its
``greyrelease.io/held`` is the digest of the template it carries, the one with the new value: exactly what
the webhook makes of a real commit. When it is not, :func:`why_not_held` says what the configuration the
API server has (``greyrelease-hold``) lacks, when that can be told from it.
"""

from __future__ import annotations

from typing import Any

from greyrelease.admission.configuration import CONFIGURATION_NAME, WEBHOOK_NAME, configuration
from greyrelease.admission.hold import HELD_ANNOTATION, template_digest
from greyrelease.api.release import ANNOTATION_PREFIX, RELEASE_LABEL, TRACK_LABEL

Obj = dict[str, Any]

#: The annotation of the pod template a self-test changes (in a dry run only: it is never stored).
SELFTEST_ANNOTATION = ANNOTATION_PREFIX + "selftest"

#: What the self-test compares of the webhook the API server has with the controller's own definition:
#: what decides whether the API server calls it for a Deployment's new template, and what it does when the
#: call fails. (The API server fills in others, such as ``matchPolicy``, with their defaults.)
_COMPARED = ("rules", "objectSelector", "matchConditions", "failurePolicy")


def patch(nonce: str) -> Obj:
    """The merge patch that changes a pod template: ``greyrelease.io/selftest: <nonce>`` on it."""
    return {"spec": {"template": {"metadata": {"annotations": {SELFTEST_ANNOTATION: nonce}}}}}


def would_hold(deployment: Obj) -> bool:
    """Whether the webhook would hold a new template of ``deployment``: enrolled (the label), not a canary,
    not bypassed, not scaled to zero, not being deleted."""
    meta = deployment.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    spec = deployment.get("spec") or {}
    return (
        bool(labels.get(RELEASE_LABEL))
        and TRACK_LABEL not in labels
        and annotations.get(ANNOTATION_PREFIX + "bypass") != "true"
        and spec.get("replicas") != 0
        and not meta.get("deletionTimestamp")
    )


def held(answer: Obj, nonce: str) -> str:
    """Why the dry run's ``answer`` is not the template with ``nonce`` held ("" when it is)."""
    spec = answer.get("spec") or {}
    template = spec.get("template") or {}
    annotations = ((answer.get("metadata") or {}).get("annotations")) or {}
    if ((template.get("metadata") or {}).get("annotations") or {}).get(SELFTEST_ANNOTATION) != nonce:
        return "its answer does not carry the template change"
    if spec.get("paused") is not True:
        return "it came back not paused"
    found = annotations.get(HELD_ANNOTATION)
    if not found:
        return f"it came back paused but without {HELD_ANNOTATION}"
    if found != template_digest(template):
        return f"it came back paused with {HELD_ANNOTATION} naming another template than the new one"
    return ""


def why_not_held(stored: Obj | None) -> str:
    """What the MutatingWebhookConfiguration the API server has (``stored``; None when there is none)
    lacks for the hold, in a sentence; "" when its webhook is as the controller defines it."""
    if stored is None:
        return (
            f"there is no MutatingWebhookConfiguration {CONFIGURATION_NAME} (install config/webhook, part of "
            "config/default, or run the controller with --webhook-port)"
        )
    hooks = [h for h in stored.get("webhooks") or [] if isinstance(h, dict) and h.get("name") == WEBHOOK_NAME]
    if not hooks:
        return f"MutatingWebhookConfiguration {CONFIGURATION_NAME} has no webhook {WEBHOOK_NAME}"
    hook = hooks[0]
    wanted = configuration({})["webhooks"][0]
    differ = [key for key in _COMPARED if hook.get(key) != wanted.get(key)]
    if hook.get("namespaceSelector"):
        differ.append("namespaceSelector")
    if differ:
        return (
            f"the webhook {WEBHOOK_NAME} of MutatingWebhookConfiguration {CONFIGURATION_NAME} differs from this "
            f"controller's in {', '.join(differ)}"
        )
    return ""
