"""The shipped ignore rules (config/gitops/) leave out of the comparison exactly what a release writes on the
Service and the HTTPRoute you own: with them, the live objects as the routers leave them mid-release compare
equal to Git's, and a change of anything else still shows.

Argo CD's ``jqPathExpressions`` are run as Argo CD runs them, each as ``del(EXPRESSION)`` in turn, with jq
(Argo CD embeds gojq); JSON pointers are removed as RFC 6901 says. The live objects are made by the
controller's own code (greyrelease/routers/). Not covered: Argo CD's and Flux's sync with these rules, which
needs them running.
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
import yaml
from greyrelease.routers.gateway import weighted_rules
from greyrelease.routers.selector import narrowing_patch, restoring_patch

from tests.gitops.conftest import GITOPS
from tests.gitops.test_argocd_health import PHASES

Obj = dict[str, Any]


def documents(path: str) -> Obj:
    loaded: Obj = yaml.safe_load((GITOPS / path).read_text())
    return loaded


def argocd_rule(app: Obj, kind: str) -> Obj:
    (rule,) = [r for r in app["spec"]["ignoreDifferences"] if r["kind"] == kind]
    return dict(rule)


def flux_rule(ks: Obj, kind: str) -> Obj:
    (rule,) = [r for r in ks["spec"]["driftIgnoreRules"] if r["target"]["kind"] == kind]
    return dict(rule)


def merge(obj: Obj, patch: Obj) -> Obj:
    """RFC 7386: ``patch`` applied to a copy of ``obj``."""
    out = copy.deepcopy(obj)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def without(obj: Obj, pointer: str) -> Obj:
    """``obj`` without the member at the JSON pointer (RFC 6901), if there."""
    out = copy.deepcopy(obj)
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    node: Any = out
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return out
    if isinstance(node, dict):
        node.pop(parts[-1], None)
    return out


def jq_deleted(obj: Obj, expressions: list[str], jq: str) -> Obj:
    """``obj`` with each expression's paths deleted in turn, as Argo CD's jq normalizer does."""
    for expression in expressions:
        proc = subprocess.run(
            [jq, "-c", f"del({expression})"], input=json.dumps(obj), capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 0, f"jq del({expression}): {proc.stderr}"
        obj = json.loads(proc.stdout)
    return obj


# --- the objects ------------------------------------------------------------------------------------------

SERVICE: Obj = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
}

ROUTE: Obj = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {
        "parentRefs": [{"name": "web", "namespace": "traefik"}],
        "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": "web", "port": 80}]},
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                "backendRefs": [{"name": "web", "port": 80, "weight": 3}, {"name": "legacy", "port": 80, "weight": 1}],
            },
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/static"}}],
                "backendRefs": [{"name": "cdn", "port": 80}],
            },
        ],
    },
}


def live_route(weight: int, headers: dict[str, str] | None = None) -> Obj:
    out = copy.deepcopy(ROUTE)
    out["spec"]["rules"] = weighted_rules(
        ROUTE["spec"]["rules"], service="web", namespace="shop", weight=weight, header_match=headers
    )
    return out


# --- Argo CD ----------------------------------------------------------------------------------------------


def test_both_applications_keep_the_ignored_fields_on_sync() -> None:
    for name in ("application.yaml", "application-managed-fields.yaml"):
        app = documents(f"argocd/{name}")
        assert "RespectIgnoreDifferences=true" in app["spec"]["syncPolicy"]["syncOptions"], name
        kinds = {(r["group"], r["kind"], r["name"]) for r in app["spec"]["ignoreDifferences"]}
        assert kinds == {("", "Service", "web"), ("gateway.networking.k8s.io", "HTTPRoute", "web")}, name
    short = documents("argocd/application-managed-fields.yaml")
    assert all(r["managedFieldsManagers"] == ["greyrelease"] for r in short["spec"]["ignoreDifferences"])


def test_argocd_ignores_the_narrowed_service_selector_and_nothing_else() -> None:
    (pointer,) = argocd_rule(documents("argocd/application.yaml"), "Service")["jsonPointers"]
    patch = narrowing_patch(SERVICE, "5d8f6c")
    assert patch is not None
    narrowed = merge(SERVICE, patch)
    assert narrowed["spec"]["selector"] == {"app": "web", "pod-template-hash": "5d8f6c"}
    assert without(narrowed, pointer)["spec"] == without(SERVICE, pointer)["spec"]
    restored = merge(narrowed, restoring_patch(narrowed) or {})
    assert restored["spec"] == SERVICE["spec"]
    edited = merge(narrowed, {"spec": {"selector": {"app": "web2"}}})  # a change in Git, mid-release
    assert without(edited, pointer)["spec"] != without(SERVICE, pointer)["spec"]


@pytest.mark.parametrize(
    ("weight", "headers"), [(0, None), (10, None), (30, {"x-canary": "yes"}), (100, {"x-canary": "yes", "x-b": "1"})]
)
def test_argocd_ignores_what_a_release_does_to_the_route(
    weight: int, headers: dict[str, str] | None, commands: dict[str, str]
) -> None:
    expressions = argocd_rule(documents("argocd/application.yaml"), "HTTPRoute")["jqPathExpressions"]
    live = live_route(weight, headers)
    assert live["spec"] != ROUTE["spec"]
    assert jq_deleted(live, expressions, commands["jq"]) == jq_deleted(ROUTE, expressions, commands["jq"])


def test_argocd_still_sees_other_changes_of_the_route(commands: dict[str, str]) -> None:
    expressions = argocd_rule(documents("argocd/application.yaml"), "HTTPRoute")["jqPathExpressions"]
    edited = copy.deepcopy(ROUTE)
    edited["spec"]["rules"][2]["matches"][0]["path"]["value"] = "/assets"
    live = live_route(30, {"x-canary": "yes"})
    assert jq_deleted(live, expressions, commands["jq"]) != jq_deleted(edited, expressions, commands["jq"])


# --- Flux -------------------------------------------------------------------------------------------------


def test_flux_ignores_the_narrowed_service_selector_and_the_routes_rules() -> None:
    ks = documents("flux/kustomization-web.yaml")
    service = flux_rule(ks, "Service")
    assert service["target"]["name"] == "web"
    (pointer,) = service["paths"]
    patch = narrowing_patch(SERVICE, "5d8f6c")
    assert patch is not None
    assert without(merge(SERVICE, patch), pointer)["spec"] == without(SERVICE, pointer)["spec"]
    route = flux_rule(ks, "HTTPRoute")
    assert (route["target"]["group"], route["target"]["name"], route["paths"]) == (
        "gateway.networking.k8s.io",
        "web",
        ["/spec/rules"],
    )
    assert without(live_route(30, {"x-canary": "yes"}), "/spec/rules") == without(ROUTE, "/spec/rules")


def test_flux_health_checks_the_greyrelease_with_every_phase_named() -> None:
    ks = documents("flux/kustomization-web.yaml")
    assert [(c["apiVersion"], c["kind"]) for c in ks["spec"]["healthChecks"]] == [("greyrelease.io/v1", "GreyRelease")]
    (exprs,) = ks["spec"]["healthCheckExprs"]
    named = " ".join(exprs[k] for k in ("inProgress", "failed", "current"))
    for phase in PHASES:
        assert f"'{phase}'" in named, f"{phase} is in none of the Flux health expressions"
