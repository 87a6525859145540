"""The shipped MutatingWebhookConfiguration (config/webhook/mutating.yaml) is the one the controller
registers from a terminal (greyrelease/admission/configuration.py), and it says what the README says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from greyrelease.admission import (
    CONFIGURATION_NAME,
    WEBHOOK_NAME,
    configuration,
    service_client_config,
    url_client_config,
)

ROOT = Path(__file__).resolve().parents[2]


def shipped() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "config" / "webhook" / "mutating.yaml").read_text())
    return loaded


def test_the_shipped_file_is_the_definition() -> None:
    assert shipped() == configuration(service_client_config()), (
        "config/webhook/mutating.yaml and greyrelease/admission/configuration.py differ: change both"
    )


def test_what_the_webhook_promises() -> None:
    [hook] = shipped()["webhooks"]
    assert shipped()["metadata"]["name"] == CONFIGURATION_NAME and hook["name"] == WEBHOOK_NAME
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 5 and hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {
            "apiGroups": ["apps"],
            "apiVersions": ["v1"],
            "resources": ["deployments"],
            "operations": ["UPDATE"],
            "scope": "Namespaced",
        }
    ]
    assert {"key": "greyrelease.io/release", "operator": "Exists"} in hook["objectSelector"]["matchExpressions"]
    assert [c["name"] for c in hook["matchConditions"]] == [
        "not-bypassed",
        "not-scaled-to-zero",
        "template-changed-or-hold-lifted",
    ]


def test_the_url_form_differs_only_in_its_client_config() -> None:
    local = configuration(url_client_config("https://127.0.0.1:9443/", b"PEM"))
    [hook] = local["webhooks"]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/hold", "caBundle": "UEVN"}
    hook["clientConfig"] = shipped()["webhooks"][0]["clientConfig"]
    assert local == shipped()


def test_the_component_patches_the_manager() -> None:
    kustomization = yaml.safe_load((ROOT / "config" / "webhook" / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    patch = yaml.safe_load((ROOT / "config" / "webhook" / "manager_patch.yaml").read_text())
    values = [op["value"] for op in patch]
    assert "--webhook-port=9443" in values and "--webhook-service=greyrelease-webhook" in values
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in values
    default = yaml.safe_load((ROOT / "config" / "default" / "kustomization.yaml").read_text())
    assert "../webhook" in default["components"]
