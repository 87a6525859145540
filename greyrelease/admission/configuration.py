"""The MutatingWebhookConfiguration that sends holds to :func:`greyrelease.admission.hold.admit`. Pure.

One definition for both ways it is registered: ``config/webhook/mutating.yaml`` (a Service in front of
every replica; tests/admission checks that the file is this definition) and ``greyrelease run
--webhook-port`` from a terminal (a ``url`` on 127.0.0.1).

The API server calls the webhook only when it has to (the CEL ``matchConditions``), so with
``failurePolicy: Fail`` an outage refuses only what would otherwise leak: a new template of an enrolled
Deployment, or the lifting of a hold. Scaling (``deployments/scale``, the HPA's way in), status writes,
label and annotation edits, pod deletions and every Deployment that is not enrolled never reach it.
"""

from __future__ import annotations

import base64
from typing import Any

from greyrelease.admission.hold import BYPASS_ANNOTATION, HELD_ANNOTATION
from greyrelease.api.release import RELEASE_LABEL, TRACK_LABEL

Obj = dict[str, Any]

CONFIGURATION_NAME = "greyrelease-hold"
WEBHOOK_NAME = "hold.deployments.greyrelease.io"
PATH = "/hold"
SERVICE_NAME = "greyrelease-webhook"
SERVICE_NAMESPACE = "greyrelease-system"
TIMEOUT_SECONDS = 5

_ANNOTATIONS = "object.metadata.annotations"
_OLD_ANNOTATIONS = "oldObject.metadata.annotations"

#: Evaluated by the API server before it calls the webhook; all must be true. Every map access is guarded:
#: an evaluation error would count as a failed call.
MATCH_CONDITIONS: list[dict[str, str]] = [
    {
        # An emergency hotfix goes through even while the webhook is down.
        "name": "not-bypassed",
        "expression": (
            f"!(has({_ANNOTATIONS}) && '{BYPASS_ANNOTATION}' in {_ANNOTATIONS} && "
            f"{_ANNOTATIONS}['{BYPASS_ANNOTATION}'] == 'true')"
        ),
    },
    {
        # Nothing runs: nothing to canary.
        "name": "not-scaled-to-zero",
        "expression": "!(has(object.spec.replicas) && object.spec.replicas == 0)",
    },
    {
        # A new template, or a held Deployment that this request unpauses or whose held annotation it
        # drops or changes. Equality here is exact (an empty list differs from an absent one), so it may
        # call for a change the webhook then finds equal; it never skips a real one.
        "name": "template-changed-or-hold-lifted",
        "expression": (
            "object.spec.template != oldObject.spec.template || "
            "(has(oldObject.spec.paused) && oldObject.spec.paused && "
            f"has({_OLD_ANNOTATIONS}) && '{HELD_ANNOTATION}' in {_OLD_ANNOTATIONS} && "
            "!(has(object.spec.paused) && object.spec.paused && "
            f"has({_ANNOTATIONS}) && '{HELD_ANNOTATION}' in {_ANNOTATIONS} && "
            f"{_ANNOTATIONS}['{HELD_ANNOTATION}'] == {_OLD_ANNOTATIONS}['{HELD_ANNOTATION}']))"
        ),
    },
]


def service_client_config(
    name: str = SERVICE_NAME, namespace: str = SERVICE_NAMESPACE, port: int = 443, ca_bundle: bytes | None = None
) -> Obj:
    config: Obj = {"service": {"name": name, "namespace": namespace, "path": PATH, "port": port}}
    if ca_bundle:
        config["caBundle"] = base64.b64encode(ca_bundle).decode()
    return config


def url_client_config(url: str, ca_bundle: bytes) -> Obj:
    """``url`` is the server's base (``https://127.0.0.1:9443``); ``ca_bundle`` PEM."""
    return {"url": url.rstrip("/") + PATH, "caBundle": base64.b64encode(ca_bundle).decode()}


def webhook(client_config: Obj) -> Obj:
    return {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client_config,
        "rules": [
            {
                "apiGroups": ["apps"],
                "apiVersions": ["v1"],
                "resources": ["deployments"],  # not deployments/scale nor deployments/status
                "operations": ["UPDATE"],
                "scope": "Namespaced",
            }
        ],
        # Enrolled Deployments; the canary carries the release label too, and the track label.
        "objectSelector": {
            "matchExpressions": [
                {"key": RELEASE_LABEL, "operator": "Exists"},
                {"key": TRACK_LABEL, "operator": "DoesNotExist"},
            ]
        },
        "matchConditions": [dict(c) for c in MATCH_CONDITIONS],
        "failurePolicy": "Fail",
        "sideEffects": "None",  # dry-runs (Argo CD's server-side diff, Flux's drift check) are answered too
        "timeoutSeconds": TIMEOUT_SECONDS,
        "reinvocationPolicy": "IfNeeded",  # called again after another webhook edits the template
    }


def configuration(client_config: Obj) -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": {"app.kubernetes.io/name": "greyrelease"}},
        "webhooks": [webhook(client_config)],
    }
