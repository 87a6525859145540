"""The self-test's change and how its answer is read: held only when paused with the digest of the new
template; what a configuration lacks for the hold, in words."""

from __future__ import annotations

import copy

from greyrelease.admission.configuration import CONFIGURATION_NAME, WEBHOOK_NAME, configuration, url_client_config
from greyrelease.admission.hold import HELD_ANNOTATION, template_digest
from greyrelease.admission.probe import SELFTEST_ANNOTATION, held, patch, why_not_held, would_hold
from greyrelease.api.release import RELEASE_LABEL, TRACK_LABEL, Obj
from greyrelease.kube.memory import merge_patch


def deployment(**spec: object) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "labels": {RELEASE_LABEL: "web"}},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "web"}}}, **spec},
    }


def answered(nonce: str, *, paused: bool = True, digest: str | None = None) -> Obj:
    """The dry run's answer: the change applied and, as the webhook answers, paused with the digest."""
    out: Obj = merge_patch(deployment(), patch(nonce))
    if paused:
        out["spec"]["paused"] = True
    if digest is not None:
        out["metadata"]["annotations"] = {HELD_ANNOTATION: digest}
    return out


def test_the_change_is_an_annotation_of_the_pod_template_with_the_nonce() -> None:
    changed = merge_patch(deployment(), patch("n1"))
    assert changed["spec"]["template"]["metadata"]["annotations"] == {SELFTEST_ANNOTATION: "n1"}
    assert template_digest(changed["spec"]["template"]) != template_digest(deployment()["spec"]["template"])


def test_an_answer_is_held_only_paused_with_the_digest_of_the_new_template() -> None:
    new_template = answered("n1")["spec"]["template"]
    assert held(answered("n1", digest=template_digest(new_template)), "n1") == ""
    assert held(answered("n1", paused=False), "n1") == "it came back not paused"
    assert "without greyrelease.io/held" in held(answered("n1"), "n1")
    # Paused with the digest of the template held before (a Deployment already held, the webhook not called).
    old = template_digest(deployment()["spec"]["template"])
    assert "naming another template" in held(answered("n1", digest=old), "n1")
    # An answer without the change (the nonce of another test) says nothing of this one.
    assert held(answered("n0", digest=template_digest(new_template)), "n1") == (
        "its answer does not carry the template change"
    )


def test_only_a_deployment_whose_new_template_would_be_held_is_tested_on() -> None:
    assert would_hold(deployment())
    assert not would_hold(deployment(replicas=0))
    unlabelled = deployment()
    unlabelled["metadata"]["labels"] = {}
    canary = deployment()
    canary["metadata"]["labels"][TRACK_LABEL] = "canary"
    bypassed = deployment()
    bypassed["metadata"]["annotations"] = {"greyrelease.io/bypass": "true"}
    going = deployment()
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not any(would_hold(d) for d in (unlabelled, canary, bypassed, going))


def test_what_a_configuration_lacks_for_the_hold() -> None:
    ours = configuration(url_client_config("https://127.0.0.1:9443", b"ca"))
    assert why_not_held(ours) == ""
    assert f"no MutatingWebhookConfiguration {CONFIGURATION_NAME}" in why_not_held(None)
    renamed = copy.deepcopy(ours)
    renamed["webhooks"][0]["name"] = "other.example.com"
    assert why_not_held(renamed) == f"MutatingWebhookConfiguration {CONFIGURATION_NAME} has no webhook {WEBHOOK_NAME}"
    edited = copy.deepcopy(ours)
    edited["webhooks"][0]["failurePolicy"] = "Ignore"
    edited["webhooks"][0]["objectSelector"] = {"matchLabels": {"team": "a"}}
    edited["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": "other"}}
    assert why_not_held(edited).endswith(
        "differs from this controller's in objectSelector, failurePolicy, namespaceSelector"
    )
    # The API server's defaults (an empty namespaceSelector, matchPolicy) are no difference.
    defaulted = copy.deepcopy(ours)
    defaulted["webhooks"][0].update(namespaceSelector={}, matchPolicy="Equivalent")
    assert why_not_held(defaulted) == ""
